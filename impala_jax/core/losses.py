"""The IMPALA loss (Espeholt et al. 2018, arXiv:1802.01561, section 4.2).

Pure functions of one time-major batch; the learner differentiates ``impala_loss`` with
``has_aux=True`` and averages the metrics over devices. Its settings are declared in
``loss_spec.py`` (JAX-free, for the config), and its keywords are named as those: the learner
passes ``LossSpec.loss_keywords()``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from impala_jax.core.distributions import Distribution
from impala_jax.core.loss_spec import LossSpec

# Imported under another name: impala_loss's keyword `vtrace` is the config field's name.
from impala_jax.core.vtrace import vtrace as vtrace_targets

__all__ = ["LossSpec", "clip_reward", "impala_loss"]


def clip_reward(r_t: jax.Array, clip_rewards: bool | float | None) -> jax.Array:
    """RLlib's ``clip_rewards``: None/False leave ``r_t`` alone, True takes its sign
    (Atari-style clipping to {-1, 0, 1}), a positive number c clips to ``[-c, c]``."""
    # bool is checked first: True is also an int, but means sign, not "clip to [-1, 1]".
    if clip_rewards is None or clip_rewards is False:
        return r_t
    if clip_rewards is True:
        return jnp.sign(r_t)
    if isinstance(clip_rewards, int | float) and clip_rewards > 0:
        return jnp.clip(r_t, -clip_rewards, clip_rewards)
    raise ValueError(
        f"clip_rewards must be None, a bool or a positive number, got {clip_rewards!r}."
    )


def _masked_mean(x: jax.Array, mask: jax.Array, count: jax.Array) -> jax.Array:
    # jnp.where, not only x * mask: a non-finite value on a masked row must not turn the
    # reported mean into NaN.
    return jnp.sum(jnp.where(mask > 0, mask * x, 0.0)) / count


def impala_loss(
    logits_t: jax.Array,
    values: jax.Array,
    behaviour_logits: jax.Array,
    action: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    mask: jax.Array,
    *,
    distribution: Distribution,
    vf_loss_coeff: float,
    entropy_coeff: chex.Numeric,
    vtrace_clip_rho_threshold: float | None = 1.0,
    vtrace_clip_pg_rho_threshold: float | None = 1.0,
    lambda_: chex.Numeric = 1.0,
    clip_rewards: bool | float | None = None,
    vtrace: chex.Numeric = True,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """IMPALA's actor-critic loss with V-trace targets (arXiv:1802.01561, section 4.2).

    ``total = pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy`` where, averaged over
    valid rows,
    ``pi_loss = -mean(log pi(a_s|x_s) * A_s)`` with the V-trace advantage
    ``A_s = min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s))``,
    ``vf_loss = 0.5 * mean((v_s - V(x_s))^2)`` and ``entropy = mean(H[pi(.|x_s)])``.
    Targets ``v_s`` and ``A_s`` carry no gradient, so ``V`` is trained only through
    ``V(x_s)``, never through its own bootstrap.

    Args:
      logits_t: float [T, B, P], target-policy distribution inputs at ``obs[0..T-1]``.
      values: float [T+1, B], V(obs[0..T]); row T is the bootstrap value.
      behaviour_logits: float [T, B, P], the distribution inputs ``action`` was sampled from.
      action: [T, B] (Discrete) or [T, B, A] (Box), ``action[t]`` taken at ``obs[t]``.
      r_t: float [T, B], raw reward received after ``action[t]``; clipped here.
      discount_t: float [T, B], ``gamma * (1 - terminated[t])``.
      mask: float [T, B], 1 on real transitions, 0 on reset rows (``obs[t]`` is a final
        observation, see ``types.py``); those rows get rho = 0 in V-trace and are left out of
        every loss term and metric.
      distribution: a ``Categorical`` or ``DiagGaussian`` from ``distributions.py``.
      vf_loss_coeff: weight of the value loss.
      entropy_coeff: weight of the entropy bonus; may be a traced scalar (a schedule).
      vtrace_clip_rho_threshold, vtrace_clip_pg_rho_threshold: ``vtrace.vtrace``'s
        ``clip_rho_threshold`` and ``clip_pg_rho_threshold``.
      lambda_: as in ``vtrace.vtrace``.
      clip_rewards: as in ``clip_reward``.
      vtrace: True: V-trace; False (or a traced 0.0): every weight taken as 1, the paper's
        "no-correction" baseline (sec. 5.2.1). The rho metrics report the true weights.

    Returns:
      ``(total_loss, metrics)``; metrics are scalar arrays, fetched when the caller decides.
    """
    chex.assert_rank(
        [logits_t, behaviour_logits, values, r_t, discount_t, mask], [3, 3, 2, 2, 2, 2]
    )
    chex.assert_equal_shape([logits_t, behaviour_logits])
    chex.assert_equal_shape([r_t, discount_t, mask])
    chex.assert_equal_shape_prefix([logits_t, action, r_t], 2)
    chex.assert_shape(values, (r_t.shape[0] + 1, r_t.shape[1]))

    valid = mask > 0
    count = jnp.maximum(jnp.sum(mask), 1.0)
    r_t = clip_reward(r_t, clip_rewards)

    target_log_prob = distribution.log_prob(logits_t, action)
    behaviour_log_prob = distribution.log_prob(behaviour_logits, action)
    # The ratio is a constant weight: gradients reach the policy only through log pi(a|x).
    log_rho = jax.lax.stop_gradient(target_log_prob - behaviour_log_prob)
    # Inner where: a huge log_rho on a reset row must not overflow to inf and then meet 0.
    rho_tm1 = jnp.where(valid, jnp.exp(jnp.where(valid, log_rho, 0.0)), 0.0) * mask

    v_tm1 = values[:-1]
    targets = vtrace_targets(
        v_tm1=jax.lax.stop_gradient(v_tm1),
        v_t=jax.lax.stop_gradient(values[1:]),
        r_t=r_t,
        discount_t=discount_t,
        rho_tm1=_correction_weights(rho_tm1, mask, vtrace),
        lambda_=lambda_,
        clip_rho_threshold=vtrace_clip_rho_threshold,
        clip_pg_rho_threshold=vtrace_clip_pg_rho_threshold,
    )

    pi_loss = -_masked_mean(target_log_prob * targets.pg_advantages, mask, count)
    vf_error = targets.vs - v_tm1
    vf_loss = 0.5 * _masked_mean(jnp.square(vf_error), mask, count)
    entropy = _masked_mean(distribution.entropy(logits_t), mask, count)
    total_loss = pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy

    metrics = dict(
        total_loss=total_loss,
        pi_loss=pi_loss,
        vf_loss=vf_loss,
        entropy=entropy,
        mean_kl=_masked_mean(distribution.kl(behaviour_logits, logits_t), mask, count),
        mean_vs=_masked_mean(targets.vs, mask, count),
        vf_explained_var=_explained_variance(targets.vs, v_tm1, mask, count),
        **_rho_metrics(rho_tm1, valid, count, vtrace_clip_rho_threshold),
    )
    return total_loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def _correction_weights(rho_tm1: jax.Array, mask: jax.Array, vtrace: chex.Numeric) -> jax.Array:
    """The weights the targets use: ``rho_tm1`` (V-trace), or with ``vtrace`` False (or a traced
    0.0) 1 on every valid row: no off-policy correction."""
    if vtrace is True:
        return rho_tm1
    return jnp.where(jnp.asarray(vtrace, bool), rho_tm1, mask)


# clipped_rho_fraction counts a weight as clipped only above threshold * (1 + this). On-policy
# rows have rho 1 only up to rounding: the actor's and the learner's forward passes of the same
# params run other kernels (another batch size, another device), and float32 matmuls run at
# reduced precision by default on accelerators (TF32 on NVIDIA GPUs since Ampere, 2^-11
# relative rounding per operand; bfloat16 on TPUs, 2^-9). On CPU on-policy rho is within a few
# ulps of 1 (1.2e-7 each); issue 56 saw max_rho 1.001 on a GPU at policy lag 0, counted as
# clipped on 35-47 % of the rows. 1 % is ten times that, and clipping a weight by less than 1 %
# moves its V-trace terms by less than 1 %: nothing a reader of the fraction needs counted.
CLIPPED_RHO_TOLERANCE = 1e-2


def _rho_metrics(
    rho_tm1: jax.Array, valid: jax.Array, count: jax.Array, clip_rho_threshold: float | None
) -> dict[str, jax.Array]:
    """Importance-weight statistics over valid rows, before clipping; a weight counts as
    clipped above ``clip_rho_threshold * (1 + CLIPPED_RHO_TOLERANCE)`` (rounding is not
    clipping)."""
    if clip_rho_threshold is None:
        clipped_fraction = jnp.zeros((), rho_tm1.dtype)
    else:
        above = rho_tm1 > clip_rho_threshold * (1.0 + CLIPPED_RHO_TOLERANCE)
        clipped_fraction = jnp.sum(valid & above) / count
    return dict(
        mean_rho=jnp.sum(rho_tm1) / count,
        clipped_rho_fraction=clipped_fraction,
        max_rho=jnp.max(rho_tm1),
    )


def _explained_variance(
    target: jax.Array, prediction: jax.Array, mask: jax.Array, count: jax.Array
) -> jax.Array:
    """``1 - Var[target - prediction] / Var[target]`` over valid rows, floored at -1 (RLlib)."""

    def masked_var(x):
        mean = _masked_mean(x, mask, count)
        return _masked_mean(jnp.square(x - mean), mask, count)

    var_target = masked_var(target)
    # The tiny epsilon (as RLlib's explained_variance) keeps a constant target finite.
    ratio = masked_var(target - prediction) / (var_target + 1e-8)
    return jnp.maximum(-1.0, 1.0 - ratio)
