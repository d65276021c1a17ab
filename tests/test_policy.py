"""core/policy.py: the one ``act`` and the callers built on it draw their keys as documented
(the actor's key stream, one key per env in the rollout) and act greedily without sampling."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core.distributions import make_distribution
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG
from impala_jax.core.networks import make_networks
from impala_jax.core.policy import RecurrentActor, act, initial_carry, make_act_fns
from impala_jax.core.recurrent import make_recurrent_networks
from impala_jax.core.rollout import make_policy_fn
from impala_jax.rllib.module import Module
from impala_jax.runtime.acting.host_actor import HostActor

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SPACES = {"discrete": gym.spaces.Discrete(5), "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
B = 64


def _same_sample(got, expected):
    """Equal, up to the rounding of a fused multiply-add: a jitted Gaussian sample against an
    eager one (a sample drawn with another key is off by O(1))."""
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _policy(action_space, **model):
    config = {**DEFAULT_MODEL_CONFIG, "fcnet_hiddens": [8], **model}
    nets = make_networks(config, OBS, action_space)
    params = nets.init(jax.random.key(0))
    obs = np.random.default_rng(0).uniform(-1, 1, (B, 3)).astype(np.float32)
    return nets, make_distribution(action_space, config), params, obs


class _Store:
    def __init__(self, params):
        self.params = params

    def get(self):
        return self.params, 0


@pytest.mark.parametrize("space", sorted(SPACES))
def test_greedy_takes_the_mode_and_explore_samples(space):
    nets, dist, params, obs = _policy(SPACES[space])
    dist_inputs, _ = nets.apply(params, obs)
    mode = dist.mode(dist_inputs)
    greedy, got_inputs, state = act(nets, dist, params, obs, None, explore=False)
    np.testing.assert_array_equal(greedy, mode)
    np.testing.assert_array_equal(got_inputs, dist_inputs)
    assert state is None
    # At init the policy is near uniform: a sample differs from the mode in some env.
    sample, _, _ = act(nets, dist, params, obs, jax.random.key(1), explore=True)
    assert sample.dtype == mode.dtype and sample.shape == mode.shape
    assert not np.array_equal(sample, mode)
    _, jit_greedy = make_act_fns(nets, dist)
    np.testing.assert_array_equal(jit_greedy(params, obs)[0], mode)


@pytest.mark.parametrize("space", sorted(SPACES))
def test_the_actor_samples_with_a_key_split_off_its_stream(space):
    nets, dist, params, obs = _policy(SPACES[space])
    sample, _ = make_act_fns(nets, dist)
    key = jax.random.key(3)
    action, _, next_key = sample(params, obs, key)
    keep, used = jax.random.split(key)
    np.testing.assert_array_equal(jax.random.key_data(next_key), jax.random.key_data(keep))
    dist_inputs, _ = nets.apply(params, obs)
    _same_sample(action, dist.sample(used, dist_inputs))


@pytest.mark.parametrize("space", sorted(SPACES))
def test_the_rollout_samples_env_i_with_key_i(space):
    """Env ``i``'s action is a function of its own observation and key alone: the same for any
    split of the envs (over devices), and not the batch's one key."""
    nets, dist, params, obs = _policy(SPACES[space])
    policy = make_policy_fn(nets, dist, explore=True)
    keys = jax.random.split(jax.random.key(4), B)
    action, _, _ = policy(params, obs, keys)
    halves = [policy(params, obs[s], keys[s])[0] for s in (slice(0, B // 2), slice(B // 2, B))]
    np.testing.assert_array_equal(action, jnp.concatenate(halves))
    dist_inputs, _ = nets.apply(params, obs)
    for i in (0, 7, B - 1):
        _same_sample(action[i], dist.sample(keys[i], dist_inputs[i : i + 1])[0])
    greedy, _, _ = make_policy_fn(nets, dist, explore=False)(params, obs, keys)
    np.testing.assert_array_equal(greedy, dist.mode(dist_inputs))


def test_the_recurrent_actor_is_act_with_a_carry():
    space = SPACES["discrete"]
    config = {**DEFAULT_MODEL_CONFIG, "fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4}
    nets = make_recurrent_networks(config, OBS, space)
    dist = make_distribution(space, config)
    params = nets.init(jax.random.key(0))
    actor = RecurrentActor(nets, dist, nets.max_seq_len)
    obs = np.random.default_rng(1).uniform(-1, 1, (B, 3)).astype(np.float32)
    carry = initial_carry(actor, B, space)
    key = jax.random.key(5)
    action, dist_inputs, next_key, state = actor(params, obs, key, carry)
    keep, used = jax.random.split(key)
    want = act(nets, dist, params, obs, used, explore=True, carry=carry)
    np.testing.assert_array_equal(jax.random.key_data(next_key), jax.random.key_data(keep))
    for got, expected in zip((action, dist_inputs, state), want, strict=True):
        jax.tree.map(np.testing.assert_array_equal, got, expected)
    greedy, _, _ = actor.greedy(params, obs, carry)
    np.testing.assert_array_equal(greedy, dist.mode(dist_inputs))


@pytest.mark.parametrize("space", sorted(SPACES))
def test_the_module_samples_with_its_seed_and_otherwise_takes_the_mode(space):
    nets, dist, params, obs = _policy(SPACES[space])
    module = Module(nets, dist, _Store(params))
    dist_inputs, _ = nets.apply(params, obs)
    np.testing.assert_array_equal(module.compute_actions({"obs": obs}), dist.mode(dist_inputs))
    sampled = module.compute_actions({"obs": obs}, explore=True, seed=2)
    _same_sample(sampled, dist.sample(jax.random.key(2), dist_inputs))


@pytest.mark.parametrize("space", sorted(SPACES))
def test_the_numpy_backend_keeps_the_contract(space):
    nets, dist, params, obs = _policy(SPACES[space])
    config = {**DEFAULT_MODEL_CONFIG, "fcnet_hiddens": [8]}
    host = HostActor(config, OBS, dist, make_act_fns(nets, dist)[0])
    greedy, dist_inputs, state = host.act(params, obs, None, explore=False)
    assert state is None
    np.testing.assert_array_equal(greedy, host.greedy(params, obs)[0])
    np.testing.assert_allclose(dist_inputs, nets.apply(params, obs)[0], rtol=2e-5, atol=2e-5)
    sample, _, _ = host.act(params, obs, host.key(0))
    np.testing.assert_array_equal(sample, host(params, obs, host.key(0))[0])
    assert sample.dtype == greedy.dtype and not np.array_equal(sample, greedy)
