"""The optimizer's names and the schedule rule, without JAX.

`optim.py` builds the optimizer and the schedules from these, and the config's checks
(`rllib/checks.py`) validate with the same ones before anything is built, so the two cannot
accept different values. The config imports this module, so it imports neither JAX nor optax.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

# RLlib's spellings; the order is RLlib's docstring's (elementwise, per tensor, all tensors).
OPT_TYPES = ("adam", "rmsprop")
GRAD_CLIP_BY = ("value", "norm", "global_norm")

Schedule = float | tuple[tuple[int | float, float], ...]

SCHEDULE_FORM = (
    "a schedule [[0, v0], [t1, v1], ...] (piecewise linear in env steps: first timestep 0, "
    "timesteps increasing, values >= 0)"
)


def _number(x: Any) -> bool:
    """A real number, not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def schedule_problem(value: Any) -> str | None:
    """Why `value` is not a valid `[[timestep, value], ...]` schedule, or None.

    The rule is RLlib's `Scheduler.validate` (two or more `[timestep, value]` pairs, the first
    at timestep 0), stricter where a value has no meaning: timesteps strictly increasing, and
    every value a number >= 0 (a scheduled lr or entropy coefficient is never negative).
    """
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) < 2:
        return "a schedule needs at least 2 [timestep, value] pairs"
    for point in value:
        if isinstance(point, str) or not isinstance(point, Sequence) or len(point) != 2:
            return f"entry {point!r} is not a [timestep, value] pair"
        if not (_number(point[0]) and point[0] >= 0 and _number(point[1])):
            return f"entry {point!r} needs a timestep >= 0 and a numeric value"
        if not point[1] >= 0:  # NaN too
            return f"entry {point!r} has a value that is not >= 0"
    if value[0][0] != 0:
        return f"the first timestep must be 0, not {value[0][0]!r}"
    steps = [p[0] for p in value]
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        return f"timesteps {steps} must be strictly increasing"
    return None


def as_schedule(name: str, value: Any) -> Schedule:
    """`value` as the optimizer holds it: a number becomes a float, a schedule a tuple of
    `(timestep, value)` pairs (hashable, timesteps kept as ints where whole). Raises ValueError
    naming `name`, the value and the form expected."""
    if _number(value):
        if not value >= 0:  # NaN too
            raise ValueError(f"{name}={value!r}: expected a number >= 0 or {SCHEDULE_FORM}.")
        return float(value)
    problem = schedule_problem(value)
    if problem is not None:
        raise ValueError(f"{name}={value!r}: {problem}; expected a number >= 0 or {SCHEDULE_FORM}.")
    return tuple((int(t) if float(t).is_integer() else float(t), float(v)) for t, v in value)
