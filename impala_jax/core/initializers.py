"""RLlib's initializer names (torch.nn.init's and tf.keras.initializers') -> JAX initializers.

`make_initializer(name, kwargs, field)` maps a model_config `*_initializer` value with its
`*_initializer_kwargs` onto the same distribution as the framework RLlib would hand it to
(core/model_config.py lists the names and the keyword arguments each takes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from impala_jax.core.model_config import INITIALIZER_KWARGS, canonical_initializer

Initializer = Callable[..., jax.Array]  # init(key, shape, dtype) -> array


# keras' glorot_*, he_* and lecun_* initializers as (scale, mode) of variance scaling.
_KERAS_VARIANCE_SCALING = {
    "glorot": (1.0, "fan_avg"),
    "he": (2.0, "fan_in"),
    "lecun": (1.0, "fan_in"),
}


def _torch_gain(nonlinearity: str, a: float | None) -> float:
    """torch.nn.init.calculate_gain: the std gain torch's kaiming_* use for a nonlinearity."""
    if nonlinearity in ("linear", "sigmoid") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return float(np.sqrt(2.0))
    if nonlinearity == "leaky_relu":
        slope = 0.01 if a is None else a
        return float(np.sqrt(2.0 / (1.0 + slope**2)))
    if nonlinearity == "selu":
        return 0.75
    raise ValueError(f"nonlinearity={nonlinearity!r} is not one torch's calculate_gain knows.")


def _uniform(low: float, high: float) -> Initializer:
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, low, high)

    return init


def _normal(mean: float, std: float) -> Initializer:
    def init(key, shape, dtype=jnp.float32):
        return (mean + std * jax.random.normal(key, shape, dtype)).astype(dtype)

    return init


def _truncated(mean: float, std: float, lower: float, upper: float) -> Initializer:
    """N(mean, std) truncated to [lower, upper] (absolute bounds, as torch's trunc_normal_)."""

    def init(key, shape, dtype=jnp.float32):
        z = jax.random.truncated_normal(key, (lower - mean) / std, (upper - mean) / std, shape)
        return (mean + std * z).astype(dtype)

    return init


def make_initializer(name: Any, kwargs: Mapping[str, Any] | None, field: str) -> Initializer:
    """RLlib's initializer name (torch or tf spelling) plus its kwargs -> a JAX initializer.

    Each maps onto the same distribution as the framework RLlib would hand it to; a callable is
    used as a JAX initializer ``init(key, shape, dtype)`` and takes no kwargs.
    """
    kw = dict(kwargs or {})
    if callable(name):
        if kw:
            raise ValueError(f"{field}_kwargs={kw!r}: a callable initializer takes no kwargs.")
        return name
    canon = canonical_initializer(name)
    if canon is None:
        raise ValueError(
            f"{field}={name!r} is not an initializer impala_jax knows; use one of "
            f"{sorted(INITIALIZER_KWARGS)} (torch's trailing '_' and tf's CamelCase also work) "
            f"or a JAX initializer init(key, shape, dtype)."
        )
    unknown = sorted(set(kw) - set(INITIALIZER_KWARGS[canon]))
    if unknown:
        raise ValueError(
            f"{field}_kwargs has {unknown}, which {name!r} does not take; it takes "
            f"{list(INITIALIZER_KWARGS[canon])}."
        )
    init = nn.initializers
    gain = float(kw.get("gain", 1.0))
    if canon in ("xavier_uniform", "xavier_normal"):
        dist = "uniform" if canon == "xavier_uniform" else "normal"
        return init.variance_scaling(gain**2, "fan_avg", dist)
    if canon in ("kaiming_uniform", "kaiming_normal"):
        a = kw.get("a", 0.0)
        g = _torch_gain(kw.get("nonlinearity", "leaky_relu"), a)
        dist = "uniform" if canon == "kaiming_uniform" else "normal"
        return init.variance_scaling(g**2, kw.get("mode", "fan_in"), dist)
    if canon == "orthogonal":
        return init.orthogonal(gain)
    if canon == "normal":
        return _normal(kw.get("mean", 0.0), kw.get("std", 1.0))
    if canon == "uniform":
        return _uniform(kw.get("a", 0.0), kw.get("b", 1.0))
    if canon == "trunc_normal":
        mean, std = kw.get("mean", 0.0), kw.get("std", 1.0)
        return _truncated(mean, std, kw.get("a", -2.0), kw.get("b", 2.0))
    if canon == "constant":
        return init.constant(kw.get("val", kw.get("value", 0.0)))
    if canon in ("zeros", "ones"):
        return getattr(init, canon)
    family, _, dist = canon.partition("_")
    if family in _KERAS_VARIANCE_SCALING:  # glorot_*, he_*, lecun_*: keras' normal is truncated
        scale, mode = _KERAS_VARIANCE_SCALING[family]
        return init.variance_scaling(scale, mode, "truncated_normal" if dist == "normal" else dist)
    if canon == "random_normal":
        return _normal(kw.get("mean", 0.0), kw.get("stddev", 0.05))
    if canon == "random_uniform":
        return _uniform(kw.get("minval", -0.05), kw.get("maxval", 0.05))
    if canon == "truncated_normal":
        mean, std = kw.get("mean", 0.0), kw.get("stddev", 0.05)
        return _truncated(mean, std, mean - 2 * std, mean + 2 * std)
    # variance_scaling (tf): "untruncated_normal" is flax's "normal".
    dist = kw.get("distribution", "truncated_normal")
    dist = "normal" if dist == "untruncated_normal" else dist
    return init.variance_scaling(float(kw.get("scale", 1.0)), kw.get("mode", "fan_in"), dist)
