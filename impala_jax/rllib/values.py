"""What a config value is: a Tune search space, an int, a real, a schedule.

The small predicates the config, its checks and the model_config checks share. No JAX and no
ray here: the config imports this module.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def is_search_space(value: Any) -> bool:
    """A Ray Tune value a trial has not resolved yet (what ``tune.grid_search`` etc. return)."""
    if isinstance(value, dict):
        return len(value) == 1 and "grid_search" in value
    # A class is never one, even when its metaclass is from ray.tune (RLlib's RLlibCallback).
    return not isinstance(value, type) and type(value).__module__.startswith("ray.tune")


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


def schedule_problem(value: Any) -> str | None:
    """Why `value` is not a valid [[timestep, value], ...] schedule, or None."""
    if not isinstance(value, list | tuple) or len(value) < 2:
        return "a schedule needs at least 2 [timestep, value] pairs"
    for point in value:
        if not isinstance(point, list | tuple) or len(point) != 2:
            return f"entry {point!r} is not a [timestep, value] pair"
        if not (is_real(point[0]) and point[0] >= 0 and is_real(point[1])):
            return f"entry {point!r} needs a timestep >= 0 and a numeric value"
        if point[1] < 0:
            return f"entry {point!r} has a negative value"
    if value[0][0] != 0:
        return f"the first timestep must be 0, not {value[0][0]!r}"
    steps = [p[0] for p in value]
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        return f"timesteps {steps} must be strictly increasing"
    return None
