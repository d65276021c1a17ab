"""Action distributions: categorical (Discrete) and diagonal Gaussian (1-D Box).

A distribution object holds only static sizes; every method is a pure function of the flat
distribution inputs ("params", RLlib's ``action_dist_inputs``) that the network emits and the
actors store as ``behaviour_logits``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import chex
import gymnasium
import jax
import jax.numpy as jnp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Categorical:
    """Categorical distribution over ``num_actions`` choices, parameterised by logits.

    ``params``: float [..., num_actions] logits. Masked (illegal) actions are expressed with a
    logit of ``jnp.finfo(dtype).min``, never ``-inf``: every method then stays finite, with
    finite gradients, and a masked action gets probability 0 and a hugely negative log-prob.
    ``action``: int [...] indices in ``[0, num_actions)``.
    """

    def __init__(self, num_actions: int):
        if num_actions < 1:
            raise ValueError(f"Categorical needs num_actions >= 1, got {num_actions}.")
        self.num_actions = int(num_actions)
        self.param_size = self.num_actions
        # The uniform policy's entropy, ln n: the learner reports entropy / max_entropy.
        self.max_entropy = math.log(self.num_actions)

    def __repr__(self) -> str:
        return f"Categorical(num_actions={self.num_actions})"

    def _log_probs(self, params: jax.Array) -> jax.Array:
        chex.assert_axis_dimension(params, -1, self.num_actions)
        log_p = jax.nn.log_softmax(params, axis=-1)
        # A masked logit minus the log-normaliser can round past finfo.min to -inf; clamping
        # keeps 0 * log_p (entropy, KL) at 0 instead of NaN.
        return jnp.maximum(log_p, jnp.finfo(log_p.dtype).min)

    def log_prob(self, params: jax.Array, action: jax.Array) -> jax.Array:
        """log pi(action); float [...]."""
        chex.assert_rank(action, params.ndim - 1)
        chex.assert_equal_shape_prefix([params, action], action.ndim)
        log_p = self._log_probs(params)
        index = action.astype(jnp.int32)[..., None]
        return jnp.take_along_axis(log_p, index, axis=-1)[..., 0]

    def entropy(self, params: jax.Array) -> jax.Array:
        """-sum_a p(a) log p(a); float [...]."""
        log_p = self._log_probs(params)
        return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)

    def sample(self, key: chex.PRNGKey, params: jax.Array) -> jax.Array:
        """A sampled action; int32 [...]."""
        chex.assert_axis_dimension(params, -1, self.num_actions)
        return jax.random.categorical(key, params, axis=-1).astype(jnp.int32)

    def mode(self, params: jax.Array) -> jax.Array:
        """The most likely action (deterministic, explore=False); int32 [...]."""
        chex.assert_axis_dimension(params, -1, self.num_actions)
        return jnp.argmax(params, axis=-1).astype(jnp.int32)

    def kl(self, params_p: jax.Array, params_q: jax.Array) -> jax.Array:
        """KL(p || q) = sum_a p(a) (log p(a) - log q(a)); float [...]."""
        chex.assert_equal_shape([params_p, params_q])
        log_p = self._log_probs(params_p)
        log_q = self._log_probs(params_q)
        return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


class DiagGaussian:
    """Gaussian with diagonal covariance over a 1-D Box of ``action_dim`` components.

    ``params``: float [..., 2 * action_dim], ``concat(mean, log_std)`` on the last axis.
    ``action``: float [..., action_dim]. Densities are over the unsquashed Gaussian, as RLlib's
    ``TorchDiagGaussian``; fitting actions into the Box bounds is the env runner's job.

    This class only consumes ``mean`` and ``log_std``: whether ``log_std`` depends on the state or
    is a free, state-independent parameter (RLlib's ``free_log_std``) is decided by the network.
    ``log_std`` is clipped to ``[-log_std_clip_param, log_std_clip_param]`` before every use, as
    RLlib's ``log_std_clip_param`` (default 20), which keeps ``exp(log_std)`` finite.
    """

    def __init__(self, action_dim: int, log_std_clip_param: float = 20.0):
        if action_dim < 1:
            raise ValueError(f"DiagGaussian needs action_dim >= 1, got {action_dim}.")
        if log_std_clip_param <= 0:
            raise ValueError(
                f"DiagGaussian needs log_std_clip_param > 0, got {log_std_clip_param}."
            )
        self.action_dim = int(action_dim)
        self.log_std_clip_param = float(log_std_clip_param)
        self.param_size = 2 * self.action_dim
        self.max_entropy = None  # a Gaussian's entropy has no maximum

    def __repr__(self) -> str:
        return (
            f"DiagGaussian(action_dim={self.action_dim}, "
            f"log_std_clip_param={self.log_std_clip_param})"
        )

    def _mean_log_std(self, params: jax.Array) -> tuple[jax.Array, jax.Array]:
        chex.assert_axis_dimension(params, -1, self.param_size)
        mean, log_std = jnp.split(params, 2, axis=-1)
        c = self.log_std_clip_param
        return mean, jnp.clip(log_std, -c, c)

    def log_prob(self, params: jax.Array, action: jax.Array) -> jax.Array:
        """sum_i log N(action_i; mean_i, std_i^2); float [...]."""
        mean, log_std = self._mean_log_std(params)
        chex.assert_equal_shape([mean, action])
        z = (action - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI, axis=-1)

    def entropy(self, params: jax.Array) -> jax.Array:
        """sum_i (log std_i + 0.5 log(2 pi e)); float [...]."""
        _, log_std = self._mean_log_std(params)
        return jnp.sum(log_std + _HALF_LOG_2PI + 0.5, axis=-1)

    def sample(self, key: chex.PRNGKey, params: jax.Array) -> jax.Array:
        """mean + std * eps, eps ~ N(0, I); float [..., action_dim]."""
        mean, log_std = self._mean_log_std(params)
        eps = jax.random.normal(key, mean.shape, dtype=mean.dtype)
        return mean + jnp.exp(log_std) * eps

    def mode(self, params: jax.Array) -> jax.Array:
        """The mean (deterministic, explore=False); float [..., action_dim]."""
        mean, _ = self._mean_log_std(params)
        return mean

    def kl(self, params_p: jax.Array, params_q: jax.Array) -> jax.Array:
        """KL(p || q), summed over independent components; float [...]."""
        chex.assert_equal_shape([params_p, params_q])
        mean_p, log_std_p = self._mean_log_std(params_p)
        mean_q, log_std_q = self._mean_log_std(params_q)
        # Per component: log(s_q/s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2.
        var_ratio = jnp.exp(2.0 * (log_std_p - log_std_q))
        mean_term = jnp.square((mean_p - mean_q) * jnp.exp(-log_std_q))
        return jnp.sum(log_std_q - log_std_p + 0.5 * (var_ratio + mean_term - 1.0), axis=-1)


Distribution = Categorical | DiagGaussian


def make_distribution(
    action_space: gymnasium.spaces.Space, model_config: Mapping[str, Any] | None = None
) -> Distribution:
    """The action distribution for ``action_space``.

    ``Discrete(n)`` (with ``start == 0``) gives ``Categorical(n)``; a 1-D ``Box`` of shape
    ``(A,)`` gives ``DiagGaussian(A, model_config["log_std_clip_param"])`` (default 20.0, as
    RLlib). Any other space raises ``ValueError``.
    """
    model_config = {} if model_config is None else model_config
    supported = "supported: gymnasium.spaces.Discrete(n) with start=0, and 1-D gymnasium.spaces.Box"
    if isinstance(action_space, gymnasium.spaces.Discrete):
        if int(action_space.start) != 0:
            # Actions are logit indices; an offset would have to be applied in the env runner.
            raise ValueError(
                f"Unsupported action space {action_space}: Discrete with start="
                f"{action_space.start}; {supported}."
            )
        return Categorical(int(action_space.n))
    if isinstance(action_space, gymnasium.spaces.Box) and len(action_space.shape) == 1:
        return DiagGaussian(
            int(action_space.shape[0]),
            log_std_clip_param=model_config.get("log_std_clip_param", 20.0),
        )
    raise ValueError(f"Unsupported action space {action_space}; {supported}.")
