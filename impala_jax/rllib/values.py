"""What a config value is: a Tune search space, an int, a real, a schedule.

The small predicates the config, its checks and the model_config checks share (what makes a
schedule valid is `core/optim_rules.py`'s rule, which the optimizer applies too). No JAX and no
ray here: the config imports this module.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def is_search_space(value: Any) -> bool:
    """A Ray Tune value a trial has not resolved yet (what ``tune.grid_search`` etc. return), or
    a population's search space (``core.pbt.Domain``)."""
    if isinstance(value, dict):
        return len(value) == 1 and "grid_search" in value
    # A class is never one, even when its metaclass is from ray.tune (RLlib's RLlibCallback).
    if isinstance(value, type):
        return False
    kind = type(value)
    # Or a population's own (rllib/pbt_spec.py's loguniform, ...: core.pbt.Domain, no ray).
    return kind.__module__.startswith("ray.tune") or (
        kind.__module__ == "impala_jax.core.pbt" and kind.__name__ == "Domain"
    )


def find_search_space(value: Any) -> bool:
    """True when `value` is, or holds at any depth, a search space."""
    if is_search_space(value):
        return True
    if isinstance(value, Mapping):
        return any(find_search_space(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(find_search_space(v) for v in value)
    return False


def is_int(x: Any) -> bool:
    """An integer, but not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    """A real number, but not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_schedule(x: Any) -> bool:
    """A value given as a schedule [[timestep, value], ...] rather than one number."""
    return isinstance(x, list | tuple)
