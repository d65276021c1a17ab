"""Validation of ``model_config``: its setter (`merge_model_config`) and each key's rule, with
the key, the value and what it takes.

``checks`` reports what ``model_config_problems`` finds as ``model_config['key']`` problems of
``validate()``. The defaults and names are in ``core/model_config.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from impala_jax.core.model_config import (
    ACTIVATIONS,
    BIAS_INITIALIZERS,
    DEFAULT_MODEL_CONFIG,
    ENCODERS,
    INITIALIZER_KWARGS,
    INITIALIZER_PREFIXES,
    canonical_initializer,
)
from impala_jax.rllib.values import find_search_space, is_int, is_real, is_search_space


def _suggest(unknown: list) -> str:
    """The "did you mean" of each unknown key; every valid key only when none of them
    is close to a valid one (a list of all of them hides the one meant)."""
    close = {
        k: difflib.get_close_matches(str(k), DEFAULT_MODEL_CONFIG, n=3, cutoff=0.6) for k in unknown
    }
    if not any(close.values()):
        return f"valid keys: {sorted(DEFAULT_MODEL_CONFIG)}."
    return "; ".join(
        f"{k!r}: did you mean {' or '.join(map(repr, m))}?" if m else f"{k!r}: no key is close."
        for k, m in close.items()
    )


def merge_model_config(value: Any) -> Any:
    """`value` merged over DEFAULT_MODEL_CONFIG (a search space is kept as it is).

    The setter of ``model_config`` and its setter-time check: a non-dict or an unknown key raises.
    """
    if is_search_space(value):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"model_config={value!r}: expected a dict with keys from "
            f"{sorted(DEFAULT_MODEL_CONFIG)}."
        )
    unknown = [k for k in value if k not in DEFAULT_MODEL_CONFIG]
    if unknown:
        raise ValueError(f"model_config has unknown key(s) {unknown}; {_suggest(unknown)}")
    merged = copy.deepcopy(dict(DEFAULT_MODEL_CONFIG))
    merged.update(copy.deepcopy(dict(value)))
    return merged


def _ints(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(is_int(x) and x > 0 for x in v)


def _size(v: Any) -> bool:
    return (is_int(v) and v > 0) or (
        isinstance(v, list | tuple) and len(v) == 2 and all(is_int(x) and x > 0 for x in v)
    )


def _conv_filter(f: Any) -> bool:
    return (
        isinstance(f, list | tuple)
        and len(f) in (3, 4)
        and is_int(f[0])
        and f[0] > 0
        and _size(f[1])
        and _size(f[2])
        and (len(f) == 3 or str(f[3]).lower() in ("same", "valid"))
    )


def _filters(v: Any) -> bool:
    return v is None or (
        isinstance(v, list | tuple) and len(v) > 0 and all(_conv_filter(f) for f in v)
    )


def model_config_problems(mc: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(field, what it expects, value) for every key of ``mc`` that breaks its rule; keys still
    holding a Tune search space are skipped (a trial resolves them)."""
    problems: list[tuple[str, str, Any]] = []

    def key(k: str, predicate: Any, expected: str) -> None:
        v = mc.get(k, DEFAULT_MODEL_CONFIG[k])
        if find_search_space(v):
            return
        try:
            good = bool(predicate(v))
        except Exception:
            good = False
        if not good:
            problems.append((f"model_config['{k}']", f"expected {expected}", v))

    def initializer(bias: bool) -> Any:
        names = BIAS_INITIALIZERS if bias else tuple(INITIALIZER_KWARGS)
        return lambda v: v is None or callable(v) or canonical_initializer(v) in names

    for prefix in INITIALIZER_PREFIXES:
        for part in ("kernel", "bias"):
            k = f"{prefix}_{part}_initializer"
            key(
                k,
                initializer(part == "bias"),
                "None (impala_jax's init), a JAX initializer init(key, shape, dtype) or one "
                f"of {list(BIAS_INITIALIZERS if part == 'bias' else INITIALIZER_KWARGS)} "
                "(torch's trailing '_' and tf's CamelCase also work)",
            )
            problems.extend(_initializer_kwargs(mc, k))
    fusion = [k for k in DEFAULT_MODEL_CONFIG if k.startswith("fusionnet_")]
    for k in fusion:
        key(
            k,
            lambda v, k=k: v == DEFAULT_MODEL_CONFIG[k],
            f"the default {DEFAULT_MODEL_CONFIG[k]!r}: fusionnet_* configure RLlib's network "
            "that fuses the encoders of multi-part observations, which impala_jax does not "
            "have",
        )

    key("fcnet_hiddens", _ints, "a list of positive ints")
    key("head_fcnet_hiddens", _ints, "a list of positive ints (may be empty)")
    key(
        "post_fcnet_hiddens",
        lambda v: v is None or _ints(v),
        "None (a CNN encoder's own dense layer) or a list of positive ints (may be empty)",
    )
    key("impala_cnn_channels", lambda v: _ints(v) and len(v) > 0, "a non-empty list of ints > 0")
    for k in (
        "fcnet_activation",
        "conv_activation",
        "head_fcnet_activation",
        "post_fcnet_activation",
    ):
        key(
            k,
            lambda v: (v.lower() if isinstance(v, str) else v) in ACTIVATIONS,
            f"one of {ACTIVATIONS} (None = linear)",
        )
    key(
        "conv_filters",
        _filters,
        "None or a list of [out_channels, kernel, stride] or [out_channels, kernel, stride, "
        "'same'|'valid'] (kernel and stride an int > 0 or [h, w])",
    )
    key("encoder", lambda v: v in ENCODERS, f"one of {ENCODERS}")
    flags = ("fcnet_use_layernorm", "head_fcnet_use_layernorm", "free_log_std")
    for k in (*flags, "vf_share_layers"):
        key(k, lambda v: isinstance(v, bool), "True or False")
    for k in ("lstm_use_prev_action", "lstm_use_prev_reward"):
        key(k, lambda v: isinstance(v, bool), "True or False")
    key("log_std_clip_param", lambda v: is_real(v) and v > 0, "a number > 0")
    key("use_lstm", lambda v: isinstance(v, bool), "True or False")
    key("max_seq_len", lambda v: is_int(v) and v > 0, "an int > 0")
    key("lstm_cell_size", lambda v: is_int(v) and v > 0, "an int > 0")
    return problems


def _initializer_kwargs(mc: Mapping[str, Any], name: str) -> list[tuple]:
    """`<name>_kwargs`: None or a dict of the keywords the named initializer takes."""
    kwargs, init = mc.get(f"{name}_kwargs"), mc.get(name)
    if kwargs is None or find_search_space(kwargs) or find_search_space(init):
        return []
    field = f"model_config['{name}_kwargs']"
    if not isinstance(kwargs, Mapping):
        return [(field, "expected None or a dict of the initializer's keywords", kwargs)]
    elif init is None or callable(init):
        if kwargs:
            return [(field, f"only a named initializer takes kwargs ({name}={init!r})", kwargs)]
    elif canonical_initializer(init) is not None:
        allowed = INITIALIZER_KWARGS[canonical_initializer(init)]
        unknown = sorted(set(kwargs) - set(allowed))
        if unknown:
            return [(field, f"{init!r} takes {list(allowed)}, not {unknown}", kwargs)]
    return []
