"""``section.field=value`` overrides, applied through the config's builder methods."""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from typing import Any

from impala_jax.cli.errors import RunError, one_line


def parse_value(text: str) -> Any:
    """A Python literal (``1e-3``, ``[64, 64]``, ``None``, ``'a'``); a bare word is a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if re.fullmatch(r"[\w\-./:]+", text):
        return text  # e.g. env ids: CartPole-v1, ALE/Pong-v5, package.module:Env
    raise RunError(f"{text!r} is not a Python literal (quote strings with spaces or brackets)")


def builder_sections(config) -> dict[str, inspect.Signature]:
    """The builder methods (``training``, ``env_runners``, ...) and their signatures."""
    from impala_jax.rllib.compat import NotProvided

    out = {}
    for name in dir(config):
        method = getattr(config, name, None)
        if name.startswith("_") or not callable(method):
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):
            continue
        # A builder's fields default to NotProvided; its **rllib_kwargs (RLlib-only keywords,
        # routed by rllib/compat.py) are not fields an override can set.
        params = [
            p
            for p in signature.parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if params and all(p.default is NotProvided for p in params):
            out[name] = signature.replace(parameters=params)
    return out


def apply_overrides(config, overrides: list[str]):
    """``section.field=value`` through ``config.section(field=value)``; mutates and returns."""
    sections = builder_sections(config)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise RunError(f"override {item!r} is not of the form section.field=value")
        section, field, *subkeys = parts
        if section not in sections:
            close = difflib.get_close_matches(section, sections, n=1)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; sections: {', '.join(sections)}"
            )
            raise RunError(f"override {item!r}: no config section {section!r}{hint}")
        fields = sections[section].parameters
        if field not in fields:
            owner = [s for s, sig in sections.items() if field in sig.parameters]
            close = difflib.get_close_matches(field, list(fields), n=1)
            hint = (
                f"; it is set by {owner[0]}.{field}"
                if owner
                else f"; did you mean {section}.{close[0]}?"
                if close
                else ""
            )
            raise RunError(f"override {item!r}: {section}() has no field {field!r}{hint}")
        try:
            value = parse_value(text.strip())
        except RunError as err:
            raise RunError(f"override {item!r}: {err}") from None
        if subkeys:
            value = _with_key(getattr(config, field, None), subkeys, value, item)
        try:
            getattr(config, section)(**{field: value})
        except (ValueError, TypeError) as err:
            raise RunError(f"override {item!r}: {one_line(err)}") from err
    return config


def _with_key(current: Any, keys: list[str], value: Any, item: str) -> dict:
    """A copy of the dict field ``current`` with ``value`` at the nested ``keys``."""
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise RunError(f"override {item!r}: the field is not a dict, give the whole value")
    out = dict(current)
    node = out
    for k in keys[:-1]:
        child = node.get(k)
        node[k] = dict(child) if isinstance(child, dict) else {}
        node = node[k]
    node[keys[-1]] = value
    return out
