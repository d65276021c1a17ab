"""Hyperparameters as traced values: the names a training function takes as inputs.

The learner step (core/update.py) and the device engine's program read the config's numbers as
constants of the compiled program; given ``hparams``, a dict from some of the names below to
JAX values, they read those instead, so one program serves every value, and ``jax.vmap`` over a
member axis trains members with different values side by side (rllib/make_train.py, population
training). Each value has the shape of the config's: a scalar, or for a scheduled ``lr`` or
``entropy_coeff`` the schedule's values ``[K]`` (its timesteps stay the config's).

What cannot be traced decides a shape or the program's structure (network sizes, batch sizes,
the optimizer type, whether a clip or a momentum term exists at all): a ValueError names the
field. A field the config sets to None (``grad_clip=None``: no clipping is compiled) or to 0
where 0 removes a term (``momentum``) must be set in the config to be traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# Read by the loss (core/losses.py keywords; gamma becomes the discount).
LOSS = (
    "gamma",
    "vf_loss_coeff",
    "entropy_coeff",
    "vtrace_clip_rho_threshold",
    "vtrace_clip_pg_rho_threshold",
    "vtrace",  # 1.0: V-trace, 0.0: no correction (core/losses.py)
)
# Read by the optimizer (core/optim.py); decay, epsilon and momentum are RMSProp's.
OPTIMIZER = ("lr", "lr_vf", "grad_clip", "decay", "epsilon", "momentum")
# Read by the device engine: the acting params' age, an index into the ring of acting params.
ENGINE = ("policy_lag",)
TRACEABLE = LOSS + OPTIMIZER + ENGINE

# Fields a user may try that decide shapes or structure: named in the error.
_STATIC_HINT = (
    "it decides the compiled program's shapes or structure; vary it across separate programs "
    "(Ray Tune, rllib/ray_tune.py)"
)


def _schedule_points(value: Any) -> int:
    """1 for a number, the number of points of a ``((t, v), ...)`` schedule."""
    return 1 if isinstance(value, int | float) else len(value)


def check(hparams: Mapping[str, Any], opt_spec, loss_spec, max_policy_lag: int | None) -> None:
    """Raises a ValueError naming the field where ``hparams`` cannot be traced with these
    specs; ``max_policy_lag`` None: the caller has no ring of acting params (a host run)."""
    for name, value in hparams.items():
        if name not in TRACEABLE:
            raise ValueError(
                f"hparams[{name!r}]: not a hyperparameter that can be traced; those are "
                f"{', '.join(TRACEABLE)}. If {name!r} is a config field, {_STATIC_HINT}."
            )
        problem = _static_problem(name, opt_spec, loss_spec, max_policy_lag)
        if problem:
            raise ValueError(f"hparams[{name!r}]: {problem}")
        shape = np.shape(value)
        source = getattr(opt_spec if name in OPTIMIZER else loss_spec, name, None)
        points = _schedule_points(source) if name in ("lr", "entropy_coeff") else 1
        expected = () if points == 1 else (points,)
        if shape != expected:
            what = f"the schedule's {points} values, shape {expected}"
            what = "a scalar" if points == 1 else what
            raise ValueError(
                f"hparams[{name!r}] has shape {shape}; expected {what} (the config's "
                f"{name}={source!r}; under jax.vmap the member axis is not counted)."
            )


def _static_problem(name: str, opt_spec, loss_spec, max_policy_lag) -> str | None:
    """Why the config's value of ``name`` leaves nothing to trace, or None."""
    rmsprop = opt_spec.opt_type == "rmsprop"
    if name in ("decay", "epsilon") and not rmsprop:
        return f"only RMSProp reads {name}; the config's opt_type is {opt_spec.opt_type!r}."
    if name == "momentum" and not (rmsprop and opt_spec.momentum):
        return (
            "RMSProp's momentum term is compiled only where the config sets "
            "training(opt_type='rmsprop', momentum=m) with m > 0."
        )
    if name == "grad_clip" and opt_spec.grad_clip is None:
        return "the config's grad_clip=None compiles no clipping; set training(grad_clip=40.0)."
    if name == "lr_vf" and not opt_spec.separate_vf_optimizer:
        return "lr_vf is read only with training(_separate_vf_optimizer=True)."
    if name.startswith("vtrace_clip") and getattr(loss_spec, name) is None:
        return f"the config's {name}=None compiles no clipping; set a number to trace it."
    if name == "policy_lag":
        return policy_lag_problem(max_policy_lag)
    return None


def policy_lag_problem(max_policy_lag: int | None) -> str | None:
    """Why ``policy_lag`` cannot be traced where the ring holds ``max_policy_lag`` params."""
    if max_policy_lag:
        return None
    return (
        "the ring of acting params is sized by the config: set env_runners(policy_lag=K) to "
        "the largest lag to trace (an env written in JAX, on device); a traced lag k in [0, K] "
        "acts with the params of k updates before."
    )


def split(hparams: Mapping[str, Any] | None) -> tuple[dict, dict]:
    """``(loss values, optimizer values)`` of ``hparams`` (either may be empty)."""
    hparams = hparams or {}
    loss = {k: v for k, v in hparams.items() if k in LOSS}
    opt = {k: v for k, v in hparams.items() if k in OPTIMIZER}
    return loss, opt
