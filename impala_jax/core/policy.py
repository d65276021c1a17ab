"""Observation to action, written once: ``act``, and the actors' compile boundaries built on it.

``act(networks, distribution, params, obs, key, explore, carry)`` runs the policy network on
one row of observations and samples from its action distribution (``explore``) or takes its
mode. Its callers differ only in arguments:

- the runners' jitted actor (``make_act_fns``) keeps a stream of keys, splitting one off per
  call, and samples the whole batch with it;
- the recurrent actor (``RecurrentActor``) does the same and passes the state it carries per env;
- the on-device rollout (``core/rollout.py``) passes one key per env (``per_env_keys``), so an
  env's actions do not depend on how the envs are split over devices;
- ``Module.compute_actions`` (``rllib/module.py``) samples with the key it is given.

The NumPy actor (``runtime/acting/host_actor.py``) is a second backend of the same contract for
small MLP policies: its ``act(params, obs, rng, explore)`` returns the same triple, and its
``__call__``/``greedy`` have the jitted actor's signatures.
"""

from __future__ import annotations

import jax
import numpy as np

from impala_jax.core.recurrent import RecurrentNetworks


def act(
    networks,
    distribution,
    params,
    obs: jax.Array,
    key: jax.Array | None,
    explore: bool = True,
    carry=None,
    per_env_keys: bool = False,
):
    """One row of ``B`` observations to actions.

    ``networks``: a feedforward policy's (``apply(params, obs)``) or, with ``carry``, a
    recurrent one's (``step``, core/recurrent.py). ``obs``: [B, ...]. ``key``: the PRNG key the
    whole batch samples with, or [B] keys with ``per_env_keys`` (env ``i`` samples with
    ``key[i]``); unused, and may be None, when not ``explore``. ``carry``: a recurrent policy's
    ``(state, prev_action [B, ...], prev_reward [B], reset [B])``, None for a feedforward one.

    Returns ``(action [B, ...], dist_inputs [B, P], state)``: a sample (``explore``) or the
    distribution's mode, the distribution's inputs, and the recurrent state after this row
    (None for a feedforward policy).
    """
    if carry is None:
        dist_inputs, _ = networks.apply(params, obs)
        state = None
    else:
        state, prev_action, prev_reward, reset = carry
        dist_inputs, _, state = networks.step(params, state, obs, prev_action, prev_reward, reset)
    if not explore:
        action = distribution.mode(dist_inputs)
    elif per_env_keys:
        one = lambda k, d: distribution.sample(k, d[None])[0]  # noqa: E731
        action = jax.vmap(one)(key, dist_inputs)
    else:
        action = distribution.sample(key, dist_inputs)
    return action, dist_inputs, state


def make_act_fns(networks, distribution):
    """The actor's compile boundary, ``act`` with a stream of keys:
    ``sample(params, obs, key[, carry]) -> (action, dist_inputs, key[, state])``, which splits
    the key it returns from the one it samples with, and
    ``greedy(params, obs[, carry]) -> (action, dist_inputs[, state])`` (``explore=False``).
    The state comes back when a recurrent ``carry`` is passed."""

    def sample(params, obs, key, carry=None):
        key, sample_key = jax.random.split(key)
        action, dist_inputs, state = act(
            networks, distribution, params, obs, sample_key, True, carry
        )
        return (action, dist_inputs, key) if carry is None else (action, dist_inputs, key, state)

    def greedy(params, obs, carry=None):
        action, dist_inputs, state = act(networks, distribution, params, obs, None, False, carry)
        return (action, dist_inputs) if carry is None else (action, dist_inputs, state)

    return jax.jit(sample), jax.jit(greedy)


class RecurrentActor:
    """The actors' compiled recurrent policy, called as ``act(params, obs, key, carry)``.

    ``carry`` is what a runner keeps per env between rows: ``(state, prev_action,
    prev_reward, reset)``; the call returns ``(action, dist_inputs, key, state)``. ``greedy``
    is the same without sampling: ``(action, dist_inputs, state)`` (both from
    ``make_act_fns``). `initial_state(n)` and `max_seq_len` are what runners need to start envs
    and to store states for the learner.
    """

    def __init__(self, nets: RecurrentNetworks, distribution, max_seq_len: int):
        self._act, self.greedy = make_act_fns(nets, distribution)
        self.max_seq_len = max_seq_len
        self._initial_state = jax.jit(nets.initial_state, static_argnums=0)

    def __call__(self, params, obs, key, carry):
        return self._act(params, obs, key, carry)

    def initial_state(self, n: int):
        """Zeros for ``n`` envs, as host arrays."""
        return jax.tree.map(np.asarray, self._initial_state(n))


def initial_carry(actor, n: int, action_space):
    """A recurrent policy's carry for ``n`` fresh envs: zero state, every row a reset row.
    ``actor``: anything with ``initial_state(n)``: a ``RecurrentActor`` (host arrays, for the
    runners) or the ``RecurrentNetworks`` (traced arrays, for the on-device rollout)."""
    discrete = not getattr(action_space, "shape", ())
    prev_action = (
        np.zeros(n, np.int32) if discrete else np.zeros((n, *action_space.shape), np.float32)
    )
    return actor.initial_state(n), prev_action, np.zeros(n, np.float32), np.ones(n, bool)


def next_carry(state, action, reward, obs_was_final):
    """The carry the next row is acted from, after a row acted with ``action`` to ``state``
    earned ``reward``: an observation that was final (``obs_was_final``, next-step autoreset:
    the step ignores the action and resets) makes the next row a reset row, whose state,
    previous action and previous reward the networks zero (core/recurrent.py). The host
    runners (env_runner.py) and the on-device rollout (core/rollout.py) both carry this."""
    return state, action, reward, obs_was_final
