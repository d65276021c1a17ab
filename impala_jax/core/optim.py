"""The learner's optimizer: gradient clipping, Adam or RMSProp, an env-step lr schedule, a skip on
non-finite gradients and an optional separate value-function optimizer.

`make_optimizer(spec)` returns an optax `GradientTransformationExtraArgs` whose update is called as
`update(grads, state, params, env_steps=...)`. `env_steps` is the traced env-step counter
(RLlib's `num_env_steps_sampled_lifetime`) as `env_steps_operand` packs it: two float32 whose
sum is the count, exact up to 2^48 (int32 would overflow at 2.1 G env steps, and one float32
rounds to 256 steps there). The learning rate is read from it inside the compiled learner step,
so a schedule never causes a retrace.

Chain (per parameter group when the vf optimizer is separate):

    clip (grad_clip_by) -> scale_by_{adam, rms} -> x(-lr(env_steps)) [-> momentum trace]

all inside a non-finite guard (`optax.apply_if_finite`'s, choosing by select), so a NaN or inf
gradient leaves the params and every optimizer moment untouched and is counted
(`non_finite_count`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from impala_jax.core.optim_rules import GRAD_CLIP_BY, OPT_TYPES, Schedule, as_schedule

VF_PREFIX = "vf"


def _split(x: float) -> tuple[np.float32, np.float32]:
    """``x`` as float32 ``hi + lo`` (a double-float): exact for integers below 2^48."""
    hi = np.float32(x)
    return hi, np.float32(x - float(hi))


def env_steps_operand(env_steps: int) -> np.ndarray:
    """The env-step counter as the learner step takes it: float32 ``[hi, lo]``, sum exact."""
    if not 0 <= env_steps < 2**48:
        raise OverflowError(f"env_steps={env_steps!r} is outside [0, 2^48).")
    return np.array(_split(int(env_steps)), np.float32)


def piecewise_linear(spec: Any, name: str = "schedule") -> Callable[[jax.Array], jax.Array]:
    """Schedule as a traceable function of the env-step counter.

    `spec` is a float (constant) or `[[timestep, value], ...]` by `optim_rules.schedule_problem`'s
    rule; a ValueError names `name`, the field the value came from. Between points the value is
    interpolated linearly in the env-step counter; past the last point it is held at the last
    value, as RLlib's `Scheduler` does (a `PiecewiseSchedule` whose `outside_value` is the last
    value). Returns float32. ``schedule(env_steps, values)`` takes the values from ``values``
    instead (a scalar, or ``[K]`` for K points): traced hyperparameters (core/hyperparams.py),
    the timesteps staying the spec's.

    The counter is a scalar or `env_steps_operand`'s ``[hi, lo]`` pair. The value is a sum of
    clamped ramps, ``y0 + sum_k (y_{k+1} - y_k) clip((t - x_k) / (x_{k+1} - x_k), 0, 1)``, with
    ``t - x_k`` taken as ``(hi - x_k_hi) + (lo - x_k_lo)``: near a breakpoint, where it matters,
    the difference is exact however large the counter (no float32 rounding of 3e9 to 256 steps).
    """
    spec = as_schedule(name, spec)
    if isinstance(spec, float):
        value = spec

        def constant(env_steps, values=None):
            if values is not None:
                return jnp.asarray(values, jnp.float32)
            return jnp.full((), value, jnp.float32)

        return constant
    y0 = float(spec[0][1])
    starts = [_split(t) for t, _ in spec[:-1]]
    x_hi = jnp.asarray([h for h, _ in starts], jnp.float32)
    x_lo = jnp.asarray([lo for _, lo in starts], jnp.float32)
    pairs = list(zip(spec, spec[1:], strict=False))
    widths = np.asarray([float(b) - float(a) for (a, _), (b, _) in pairs], np.float32)
    rises = np.asarray([float(b) - float(a) for (_, a), (_, b) in pairs], np.float32)

    def schedule(env_steps, values=None):
        steps = jnp.asarray(env_steps)
        if steps.shape == (2,):
            hi, lo = steps[0].astype(jnp.float32), steps[1].astype(jnp.float32)
        else:
            hi, lo = steps.astype(jnp.float32), jnp.zeros((), jnp.float32)
        since = (hi - x_hi) + (lo - x_lo)  # t - x_k per segment
        fraction = jnp.clip(since / widths, 0.0, 1.0)
        if values is None:
            return (y0 + jnp.sum(rises * fraction)).astype(jnp.float32)
        ys = jnp.asarray(values, jnp.float32)  # traced values at the same timesteps
        return ys[0] + jnp.sum((ys[1:] - ys[:-1]) * fraction)

    return schedule


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """What the learner's optimizer needs from the config; names follow RLlib's IMPALAConfig.

    `lr` is a float or a schedule `((timestep, value), ...)` (lists are accepted and normalised
    to tuples so the spec stays hashable). `decay`, `momentum` and `epsilon` are used by RMSProp
    only: RLlib's old stack passed them only to RMSProp and built Adam with library defaults.
    """

    opt_type: str = "adam"
    lr: Schedule = 0.0005
    grad_clip: float | None = 40.0
    grad_clip_by: str = "global_norm"
    decay: float = 0.99
    momentum: float = 0.0
    epsilon: float = 0.1
    rmsprop_initial_scale: float = 1.0
    separate_vf_optimizer: bool = False
    lr_vf: float = 0.0005
    max_consecutive_non_finite: int = 10

    def __post_init__(self):
        object.__setattr__(self, "lr", as_schedule("lr", self.lr))
        if self.opt_type not in OPT_TYPES:
            raise ValueError(f"opt_type={self.opt_type!r}: expected one of {OPT_TYPES}.")
        if self.grad_clip_by not in GRAD_CLIP_BY:
            raise ValueError(f"grad_clip_by={self.grad_clip_by!r}: expected one of {GRAD_CLIP_BY}.")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip={self.grad_clip!r}: expected a positive number or None.")


def _clip_each_by_norm(max_norm: float) -> optax.GradientTransformation:
    """Clips every tensor to L2 norm `max_norm` on its own (RLlib's grad_clip_by="norm").

    RLlib's torch learner calls `clip_grad_norm_` once per parameter tensor for this mode. Torch
    adds 1e-6 to the norm before dividing; we do not, so a clipped tensor has norm exactly
    `max_norm`.
    """

    def clip(g):
        norm = jnp.sqrt(jnp.sum(jnp.square(g)))
        return g * (max_norm / jnp.maximum(norm, max_norm)).astype(g.dtype)

    def update(updates, state, params=None):
        del params
        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _clip(grad_clip: float | None, grad_clip_by: str) -> optax.GradientTransformation:
    if grad_clip is None:
        return optax.identity()
    if grad_clip_by == "global_norm":
        # g * c / ||g||_global when ||g||_global > c (the norm over all tensors of the group).
        return optax.clip_by_global_norm(grad_clip)
    if grad_clip_by == "norm":
        return _clip_each_by_norm(grad_clip)
    return optax.clip(grad_clip)


def _scale_by_neg_lr(
    lr_fn: Callable[[jax.Array], jax.Array],
) -> optax.GradientTransformationExtraArgs:
    """Multiplies by -lr(env_steps); `env_steps` arrives as an extra argument of `update`."""

    def update(updates, state, params=None, *, env_steps, **extra_args):
        del params, extra_args
        lr = lr_fn(env_steps)
        return jax.tree.map(lambda g: -lr.astype(g.dtype) * g, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def _knobs(spec: OptimizerSpec, values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The optimizer's numbers: the spec's, or the traced ``values`` given
    (core/hyperparams.py checks which may be); ``lr`` and ``lr_vf`` None: the spec's."""
    knobs = {k: getattr(spec, k) for k in ("grad_clip", "decay", "epsilon", "momentum")}
    return knobs | {"lr": None, "lr_vf": None} | dict(values or {})


def _single(
    spec: OptimizerSpec, lr: Schedule, knobs: Mapping[str, Any] | None = None, lr_values=None
) -> optax.GradientTransformationExtraArgs:
    """clip -> optimizer -> lr, for one parameter group; ``knobs``: ``_knobs``'s numbers (None:
    the spec's); ``lr_values``: the schedule's values as traced numbers (None: ``lr``'s own)."""
    knobs = _knobs(spec, None) if knobs is None else knobs
    schedule = piecewise_linear(lr, "lr")
    lr_fn = schedule if lr_values is None else (lambda t: schedule(t, lr_values))
    clip = _clip(knobs["grad_clip"], spec.grad_clip_by)
    if spec.opt_type == "adam":
        # Adam with optax's defaults (b1=0.9, b2=0.999, eps=1e-8 added outside the bias-corrected
        # sqrt, as torch does), matching RLlib's old stack, which built the framework's default
        # Adam with only the lr set.
        return optax.chain(
            clip, optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8), _scale_by_neg_lr(lr_fn)
        )
    # RMSProp as TensorFlow 1's tf.train.RMSPropOptimizer, which the IMPALA paper used
    # (arXiv:1802.01561, sec. 5 and table G.1: decay 0.99, eps 0.1, momentum 0):
    #   ms  = decay * ms + (1 - decay) * g^2          (ms starts at 1.0, not 0: see below)
    #   mom = momentum * mom + lr * g / sqrt(ms + eps) (eps inside the sqrt; lr before momentum)
    #   w  -= mom
    # RLlib's old TF stack built exactly this optimizer. Torch's RMSprop differs (ms starts at 0,
    # eps outside the sqrt), and RLlib's torch stack also passed `decay` as `weight_decay` — a
    # known quirk we do not reproduce. Taking the TF1 form keeps the paper's eps = 0.1 meaningful.
    # The lr is applied before the momentum trace so a scheduled lr weights each gradient by the
    # lr of its own step, as TF does.
    # `rmsprop_initial_scale` is the mean square at step 0: TF1's 1.0 by default. With a mean
    # loss the gradients are far below 1, and decaying that 1.0 away takes about
    # ln(g^2 + eps) / ln(decay) updates (about 1,100 at decay 0.99, eps 1e-5, g ~ 1e-4), during
    # which every step is a small fraction of what it becomes (issue 17); 0.0 starts at the
    # gradients' own scale, as torch and optax do.
    parts = [
        clip,
        optax.scale_by_rms(
            decay=knobs["decay"],
            eps=knobs["epsilon"],
            initial_scale=spec.rmsprop_initial_scale,
            eps_in_sqrt=True,
        ),
        _scale_by_neg_lr(lr_fn),
    ]
    if spec.momentum:  # the config's: whether the trace (and its state) exists at all
        parts.append(optax.trace(decay=knobs["momentum"], nesterov=False))
    return optax.chain(*parts)


def _vf_labels(params: Mapping[str, Any]) -> dict[str, str]:
    """Labels each top-level entry "vf" if its key starts with "vf", else "default".

    The convention is networks.py's: "vf" (value head) and "vf_encoder" (value encoder when
    `vf_share_layers=False`). The labels form a prefix tree of the params, which optax's
    partition accepts.
    """
    if not isinstance(params, Mapping):
        raise ValueError(
            "separate_vf_optimizer needs params to be a dict keyed by module name, got "
            f"{type(params).__name__}."
        )
    return {key: "vf" if key.startswith(VF_PREFIX) else "default" for key in params}


def make_optimizer(spec: OptimizerSpec) -> optax.GradientTransformationExtraArgs:
    """Builds the optimizer; call its update as `update(grads, state, params, env_steps=...)`.

    With `separate_vf_optimizer`, value-function params (top-level key starting with "vf") get
    their own optimizer of the same type with the constant `lr_vf`, and the rest use `lr`. Each
    group is clipped on its own (global norm over the group), as RLlib's old stack clipped each
    optimizer's parameters separately.

    Everything sits inside `optax.apply_if_finite`'s guard (`_apply_if_finite`): an update
    whose gradient holds a NaN or inf is skipped (zero update, inner state unchanged) and
    counted, unless more than `max_consecutive_non_finite` such updates come in a row, after
    which it is applied.

    `update(..., hparams=values)`: the optimizer's numbers from ``values`` (a dict of traced
    values by core/hyperparams.py's names: lr, lr_vf, grad_clip, decay, epsilon, momentum),
    the spec's for the rest.
    """

    def build(values: Mapping[str, Any] | None) -> optax.GradientTransformationExtraArgs:
        knobs = _knobs(spec, values)
        inner = _single(spec, spec.lr, knobs, knobs["lr"])
        if spec.separate_vf_optimizer:
            vf = _single(spec, float(spec.lr_vf), knobs, knobs["lr_vf"])
            inner = optax.partition({"default": inner, "vf": vf}, _vf_labels)
        return _apply_if_finite(inner, spec.max_consecutive_non_finite)

    static = build(None)

    def update(updates, state, params=None, *, hparams=None, **extra_args):
        # The chain's state does not depend on its numbers: one init serves every value.
        optimizer = build(hparams) if hparams else static
        return optimizer.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(static.init, update)


def _apply_if_finite(
    inner: optax.GradientTransformation, max_consecutive_errors: int
) -> optax.GradientTransformationExtraArgs:
    """`optax.apply_if_finite`, same state and semantics, choosing by `jnp.where`, not
    `lax.cond`.

    The inner update always runs and its result is kept or dropped per element. Under a
    `lax.cond` XLA compiles the whole optimizer as a separate branch, outside the step's
    fusions: longer compilation and one more kernel launch per minibatch update. A non-finite
    gradient's NaNs stay in the branch not taken.
    """
    inner = optax.with_extra_args_support(inner)
    init = optax.apply_if_finite(inner, max_consecutive_errors).init  # the same state

    def update(updates, state, params=None, **extra_args):
        isfinite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates)]))
        notfinite_count = jnp.where(
            isfinite, jnp.zeros([], jnp.int32), optax.safe_increment(state.notfinite_count)
        )
        apply = jnp.logical_or(isfinite, notfinite_count > max_consecutive_errors)
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        keep = lambda new, old: jnp.where(apply, new, old)  # noqa: E731
        return jax.tree.map(lambda u: jnp.where(apply, u, 0), new_updates), (
            optax.ApplyIfFiniteState(
                notfinite_count=notfinite_count,
                last_finite=isfinite,
                total_notfinite=jnp.where(
                    isfinite, state.total_notfinite, optax.safe_increment(state.total_notfinite)
                ),
                inner_state=jax.tree.map(keep, new_inner, state.inner_state),
            )
        )

    return optax.GradientTransformationExtraArgs(init, update)


def current_lr(spec: OptimizerSpec, env_steps: jax.Array, hparams=None) -> jax.Array:
    """The (non-vf) learning rate at `env_steps`, float32; reported as `curr_lr`; from
    ``hparams["lr"]`` where traced."""
    return piecewise_linear(spec.lr, "lr")(env_steps, (hparams or {}).get("lr"))


def consecutive_non_finite(opt_state: optax.ApplyIfFiniteState) -> jax.Array:
    """Non-finite updates in a row, up to and including the latest (0 after a finite one)."""
    return opt_state.notfinite_count


def non_finite_count(opt_state: optax.ApplyIfFiniteState) -> jax.Array:
    """Total updates skipped (or forced through) because their gradient was not finite."""
    return opt_state.total_notfinite
