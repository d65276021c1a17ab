"""The actor's compile boundary: ``act(params, obs, key)`` of a feed-forward policy, and
``RecurrentActor`` for an LSTM policy, which also takes and returns the state carried per env.

Both sample from the policy's action distribution (``act``) or take its mode (``greedy``,
``explore=False``). The NumPy actor (``runtime/host_actor.py``) has the same signature.
"""

from __future__ import annotations

import jax
import numpy as np

from impala_jax.core.recurrent import RecurrentNetworks


def make_act_fns(networks, distribution):
    """The actor's compile boundary: ``act(params, obs, key) -> (action, dist_inputs, key)``
    and ``act_greedy(params, obs) -> (action, dist_inputs)``."""

    def act(params, obs, key):
        key, sample_key = jax.random.split(key)
        dist_inputs, _ = networks.apply(params, obs)
        return distribution.sample(sample_key, dist_inputs), dist_inputs, key

    def act_greedy(params, obs):
        dist_inputs, _ = networks.apply(params, obs)
        return distribution.mode(dist_inputs), dist_inputs

    return jax.jit(act), jax.jit(act_greedy)


class RecurrentActor:
    """The actors' compiled recurrent policy, called as ``act(params, obs, key, carry)``.

    ``carry`` is what a runner keeps per env between rows: ``(state, prev_action,
    prev_reward, reset)``; the call returns ``(action, dist_inputs, key, state)``. ``greedy``
    is the same without sampling: ``(action, dist_inputs, state)``. `initial_state(n)` and
    `max_seq_len` are what runners need to start envs and to store states for the learner.
    """

    def __init__(self, nets: RecurrentNetworks, distribution, max_seq_len: int):
        def act(params, obs, key, carry):
            state, prev_action, prev_reward, reset = carry
            key, sample_key = jax.random.split(key)
            dist_inputs, _, state = nets.step(params, state, obs, prev_action, prev_reward, reset)
            return distribution.sample(sample_key, dist_inputs), dist_inputs, key, state

        def greedy(params, obs, carry):
            state, prev_action, prev_reward, reset = carry
            dist_inputs, _, state = nets.step(params, state, obs, prev_action, prev_reward, reset)
            return distribution.mode(dist_inputs), dist_inputs, state

        self._act = jax.jit(act)
        self.greedy = jax.jit(greedy)
        self.max_seq_len = max_seq_len
        self._initial_state = jax.jit(nets.initial_state, static_argnums=0)

    def __call__(self, params, obs, key, carry):
        return self._act(params, obs, key, carry)

    def initial_state(self, n: int):
        """Zeros for ``n`` envs, as host arrays."""
        return jax.tree.map(np.asarray, self._initial_state(n))


def initial_carry(actor, n: int, action_space):
    """A recurrent actor's carry for ``n`` fresh envs: zero state, every row a reset row."""
    discrete = not getattr(action_space, "shape", ())
    prev_action = (
        np.zeros(n, np.int32) if discrete else np.zeros((n, *action_space.shape), np.float32)
    )
    return actor.initial_state(n), prev_action, np.zeros(n, np.float32), np.ones(n, bool)
