"""V-trace off-policy targets (Espeholt et al. 2018, arXiv:1802.01561, section 4.1, eq. 1).

Time-major ``[T, B]`` throughout. With the row layout of ``types.py`` a reset row (``obs[t]`` is a
final observation) gets ``rho_tm1[t] = 0``: its TD error and trace coefficient vanish, so the
backward recursion restarts there and per-episode V-trace is reproduced exactly
(docs/semantics.md, "Next-step autoreset").
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class VTraceOutput(NamedTuple):
    """V-trace targets, both float ``[T, B]`` and both under ``stop_gradient``.

    ``vs``: value targets v_s of eq. 1, regressed on by the value function.
    ``pg_advantages``: the policy-gradient advantage of section 4.2,
    ``min(pg_rho_bar, rho_s) * (r_s + gamma_s * v_{s+1} - V(x_s))``.
    """

    vs: jax.Array
    pg_advantages: jax.Array


def _clip(rho: jax.Array, threshold: float | None) -> jax.Array:
    # None means "no truncation", as RLlib's clip_rho_threshold=None.
    return rho if threshold is None else jnp.minimum(threshold, rho)


def vtrace(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    rho_tm1: jax.Array,
    *,
    lambda_: chex.Numeric = 1.0,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceOutput:
    """V-trace value targets and policy-gradient advantages (arXiv:1802.01561, eq. 1).

    ``vs_t = V(x_t) + sum_{s>=t} (prod_{i=t}^{s-1} gamma_i c_i) delta_s V`` with
    ``delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s))``, ``rho_s = min(rho_bar, pi/mu)``
    and ``c_i = lambda_i * min(1, pi/mu)`` (c-bar = 1, as in the paper's experiments and rlax).
    It is computed by the equivalent backward recursion of section 4.1
    ``vs_t - V(x_t) = delta_t V + gamma_t c_t (vs_{t+1} - V(x_{t+1}))``, with
    ``vs_T - V(x_T) = 0``, i.e. ``v_t[T-1]`` is the bootstrap value.

    Args:
      v_tm1: float [T, B], V(x_t), the value of ``obs[t]``.
      v_t: float [T, B], V(x_{t+1}), the value of the observation after ``action[t]``.
      r_t: float [T, B], reward received after ``action[t]``.
      discount_t: float [T, B], ``gamma * (1 - terminated[t])``.
      rho_tm1: float [T, B], importance ratios pi(a_t|x_t) / mu(a_t|x_t) (not their logs);
        0 on rows that are not transitions.
      lambda_: scalar or float [T, B], the extra discounting parameter of section 4.1
        (``c_i = lambda * min(c_bar, rho_i)``, as in Retrace(lambda)).
      clip_rho_threshold: rho-bar of eq. 1, or None for no clipping.
      clip_pg_rho_threshold: rho-bar of the policy-gradient advantage, or None for no clipping.

    Returns:
      ``VTraceOutput(vs, pg_advantages)``, both float [T, B] under ``stop_gradient``: they are
      targets, so no gradient flows into the value inputs through them.
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1], 2)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1])
    chex.assert_type([v_tm1, v_t, r_t, discount_t, rho_tm1], float)
    lambda_ = jnp.asarray(lambda_, dtype=v_tm1.dtype)
    chex.assert_rank(lambda_, {0, 2})
    lambda_ = jnp.broadcast_to(lambda_, v_tm1.shape)

    clipped_rho_tm1 = _clip(rho_tm1, clip_rho_threshold)
    c_tm1 = lambda_ * jnp.minimum(1.0, rho_tm1)
    delta_tm1 = clipped_rho_tm1 * (r_t + discount_t * v_t - v_tm1)

    def backward_step(acc, xs):
        # acc = vs_{t+1} - V(x_{t+1}); returns vs_t - V(x_t).
        delta, discount, c = xs
        acc = delta + discount * c * acc
        return acc, acc

    _, vs_minus_v = jax.lax.scan(
        backward_step, jnp.zeros_like(v_tm1[0]), (delta_tm1, discount_t, c_tm1), reverse=True
    )
    vs = v_tm1 + vs_minus_v

    # Section 4.2: the advantage bootstraps from v_{s+1}; past the fragment's end that is V(x_T).
    vs_tp1 = jnp.concatenate([vs[1:], v_t[-1:]], axis=0)
    pg_advantages = _clip(rho_tm1, clip_pg_rho_threshold) * (r_t + discount_t * vs_tp1 - v_tm1)
    return VTraceOutput(
        vs=jax.lax.stop_gradient(vs), pg_advantages=jax.lax.stop_gradient(pg_advantages)
    )
