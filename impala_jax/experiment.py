"""The experiment as the CLI takes it: the file, its ``section.field=value`` overrides, its stop."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from impala_jax.metrics import flatten, lookup


class RunError(Exception):
    """A usage or config problem: reported as one line, exit status 2."""


def one_line(err: BaseException | str) -> str:
    """A multi-line message (config validation lists every bad field) on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} " + "; ".join(lines[1:])
    return "; ".join(lines)


def load_experiment(path: str | Path) -> tuple[Any, dict]:
    """Runs the experiment file; returns its ``config`` (a copy) and ``stop``.

    The module is registered in sys.modules under ``experiment_<name>``, so an env class it
    defines is stored in checkpoints as ``experiment_<name>:Class`` and found again on resume.
    """
    from impala_jax import IMPALAConfig

    path = Path(path)
    if not path.is_file():
        raise RunError(f"experiment file {path} does not exist")
    name = "experiment_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise RunError(
            f"experiment file {path} failed to load: {type(err).__name__}: {err}{where}"
        ) from err
    config = getattr(module, "config", None)
    if not isinstance(config, IMPALAConfig):
        raise RunError(
            f"experiment file {path} must define a module-level `config` (an IMPALAConfig); "
            f"found {type(config).__name__}"
        )
    stop = getattr(module, "stop", None) or {}
    if not isinstance(stop, dict):
        raise RunError(f"experiment file {path}: `stop` must be a dict, not {type(stop).__name__}")
    return config.copy(copy_frozen=False), check_stop(stop)


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
    from impala_jax import NotProvided

    out = {}
    for name in dir(config):
        method = getattr(config, name, None)
        if name.startswith("_") or not callable(method):
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):
            continue
        params = signature.parameters.values()
        if params and all(p.default is NotProvided for p in params):
            out[name] = signature
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


def check_stop(stop: dict) -> dict:
    out = {}
    for key, value in stop.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise RunError(f"stop criterion {key!r}: {value!r} is not a number")
        out[key] = value
    return out


def parse_stop(items: list[str]) -> dict:
    stop = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise RunError(f"--stop {item!r} is not of the form KEY=VALUE")
        try:
            stop[key.strip()] = parse_value(text.strip())
        except RunError as err:
            raise RunError(f"--stop {item!r}: {err}") from None
    return check_stop(stop)


def stop_reached(result: dict, stop: dict) -> str | None:
    """The first criterion met (Tune's rule: value >= threshold), as text; None if none is."""
    for key, threshold in stop.items():
        value = lookup(result, key)
        if value is not None and value >= threshold:  # NaN never stops a run
            return f"{key}={value:g} >= {threshold:g}"
    return None


def missing_stop_keys(result: dict, stop: dict) -> list[str]:
    """Stop keys absent from a result: typos that would never stop the run.

    ``evaluation/...`` keys are exempt: they appear only in iterations that evaluate.
    """
    return [k for k in stop if not k.startswith("evaluation/") and lookup(result, k, None) is None]


def missing_stop_message(result: dict, stop: dict) -> str | None:
    """The error for stop keys absent from a result, each with the closest result key as a hint."""
    missing = missing_stop_keys(result, stop)
    if not missing:
        return None
    keys = list(flatten(result))
    hints = [
        f"{k} (did you mean {close[0]}?)" if close else k
        for k in missing
        for close in [difflib.get_close_matches(k, keys, n=1)]
    ]
    return f"stop key(s) not in the results: {', '.join(hints)}"
