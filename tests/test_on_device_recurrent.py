"""Recurrent policies on device (``use_lstm=True`` with an env written in JAX): the rollout
carries each env's core state as the host runners do, so a device fragment equals the host
runner's fragment of the same envs row for row (state, previous action and reward, reset
flags, logits), the learner's loss on both is the same, and the state restarts at episode
starts inside a fragment."""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core import losses
from impala_jax.core.distributions import make_distribution
from impala_jax.core.policy import RecurrentActor
from impala_jax.core.recurrent import make_recurrent_networks, num_chunks
from impala_jax.core.rollout import make_policy_fn, make_rollout, reset_envs
from impala_jax.rllib import specs
from impala_jax.runtime.acting.env_runner import EnvRunner, ParamStore
from impala_jax.runtime.envs.env_registry import make_jax_env
from tests.test_on_device import _small

ENV = "gymnax:CartPole-v1"
MODEL = {
    "use_lstm": True,
    "lstm_cell_size": 16,
    "fcnet_hiddens": [16],
    "max_seq_len": 10,
    "lstm_use_prev_action": True,
    "lstm_use_prev_reward": True,
}


def _nets_and_params(observation_space, action_space, model=MODEL, seed=0):
    nets = make_recurrent_networks(model, observation_space, action_space)
    return nets, make_distribution(action_space, model), nets.init(jax.random.key(seed))


def _loss(nets, distribution, params, batch):
    """The learner's loss (core/update.py's, without the device weighting) on ``batch``."""
    dist_inputs, values = nets.unroll(
        params,
        batch.core_state,
        batch.obs,
        batch.prev_action,
        batch.prev_reward,
        batch.reset,
        nets.max_seq_len,
    )
    discount = 0.99 * (1.0 - jnp.asarray(batch.terminated, jnp.float32))
    loss, _ = losses.impala_loss(
        dist_inputs[:-1],
        values,
        jnp.asarray(batch.behaviour_logits),
        jnp.asarray(batch.action),
        jnp.asarray(batch.reward),
        discount,
        jnp.asarray(batch.valid),
        distribution=distribution,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
    )
    return dist_inputs, loss


def test_host_and_device_lstm_give_the_same_fragments_logits_and_loss():
    """The same gymnax envs (same keys), the same LSTM params, greedy actions: the host
    runner's fragments and the compiled rollout's agree in every field, the stored core
    states included, over fragments that carry the state from one to the next and episodes
    that end inside them; the learner's unroll reproduces both fragments' behaviour logits
    (rho = 1) and the loss on either is the same, to 1e-6."""
    T, n, seed = 25, 6, 5
    config = IMPALAConfig().environment(ENV).rl_module(model_config=MODEL)
    config = config.env_runners(
        num_env_runners=0, num_envs_per_env_runner=n, rollout_fragment_length=T, explore=False
    )
    env = make_jax_env(ENV)
    nets, distribution, params = _nets_and_params(env.observation_space, env.action_space)
    actor = RecurrentActor(nets, distribution, nets.max_seq_len)
    runner = EnvRunner(
        specs.runner_spec(config),
        0,
        actor,
        actor.greedy,
        ParamStore(params, jax.devices()[0]),
        seed=seed,
    )
    policy = make_policy_fn(nets, distribution, explore=False)
    rollout = jax.jit(make_rollout(env, policy, lambda a: a, T, max_seq_len=nets.max_seq_len))
    carry = reset_envs(env, jax.random.key(seed), n, nets)
    resets = 0
    try:
        for _ in range(3):
            (host,) = runner.sample()
            carry, device, _ = rollout(params, carry)
            for field in ("obs", "action", "reward", "terminated", "truncated", "valid"):
                np.testing.assert_array_equal(getattr(host, field), getattr(device, field), field)
            for field in ("prev_action", "reset"):
                np.testing.assert_array_equal(getattr(host, field), getattr(device, field), field)
            np.testing.assert_allclose(host.prev_reward, device.prev_reward, atol=1e-6)
            np.testing.assert_allclose(host.behaviour_logits, device.behaviour_logits, atol=1e-6)
            assert jax.tree.leaves(device.core_state)[0].shape[0] == num_chunks(T, 10)
            for h, d in zip(
                jax.tree.leaves(host.core_state), jax.tree.leaves(device.core_state), strict=True
            ):
                np.testing.assert_allclose(h, d, atol=1e-6)
            host_logits, host_loss = _loss(nets, distribution, params, host)
            device_logits, device_loss = _loss(nets, distribution, params, device)
            np.testing.assert_allclose(host_logits, device_logits, atol=1e-6)
            np.testing.assert_allclose(device_logits[:-1], device.behaviour_logits, atol=1e-5)
            np.testing.assert_allclose(host_loss, device_loss, atol=1e-6)
            resets += int(np.asarray(device.reset)[1:].sum())
        assert resets >= 3  # episodes ended and restarted inside the fragments
    finally:
        runner.close()


class _Clock(NamedTuple):
    t: jax.Array


class FixedLengthEnv:
    """A JaxEnv (core/rollout.py) whose episodes last ``length`` steps and whose observation
    never changes: only the LSTM's state can make two rows' logits differ."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)
    length = 4

    def reset(self, key):
        return jnp.ones(3, jnp.float32), _Clock(jnp.int32(0))

    def step(self, key, state, action):
        t = state.t + 1
        ended = t >= self.length
        return jnp.ones(3, jnp.float32), _Clock(t), jnp.float32(1.0), ended, jnp.bool_(False)


@pytest.mark.parametrize("max_seq_len", [3, 50])
def test_the_state_restarts_at_episode_starts_inside_a_fragment(max_seq_len):
    """Episodes of 4 steps (rows 0-3 steps, row 4 the final observation, row 5 the next
    episode's first): the reset flag is set at rows 0, 5, 10, ...; there the logits equal the
    first row's (a zero state, no previous action or reward) and the stored state is carried
    in unchanged (the networks zero it); inside an episode they differ, and the learner's
    unroll over the fragment reproduces every row's logits."""
    env = FixedLengthEnv()
    model = {**MODEL, "max_seq_len": max_seq_len}
    nets, distribution, params = _nets_and_params(env.observation_space, env.action_space, model)
    T, n = 22, 2
    policy = make_policy_fn(nets, distribution, explore=True)
    rollout = jax.jit(make_rollout(env, policy, lambda a: a, T, max_seq_len=max_seq_len))
    carry = reset_envs(env, jax.random.key(1), n, nets)
    carry, frag, _ = rollout(params, carry)
    starts = np.arange(0, T + 1, env.length + 1)
    expected = np.zeros(T + 1, bool)
    expected[starts] = True
    np.testing.assert_array_equal(np.asarray(frag.reset), np.stack([expected] * n, axis=1))
    logits = np.asarray(frag.behaviour_logits)
    for t in starts[starts < T]:
        np.testing.assert_allclose(logits[t], logits[0], atol=1e-6)
    inside = [t for t in range(1, T) if not expected[t]]
    assert all(np.abs(logits[t] - logits[0]).max() > 1e-4 for t in inside)
    np.testing.assert_array_equal(np.asarray(frag.prev_reward)[starts], 0.0)
    unrolled, _ = nets.unroll(
        params,
        frag.core_state,
        frag.obs,
        frag.prev_action,
        frag.prev_reward,
        frag.reset,
        max_seq_len,
    )
    np.testing.assert_allclose(unrolled[:-1], logits, atol=1e-5)


def _small_lstm(num_learners=0, lag=None) -> IMPALAConfig:
    """test_on_device's small run with a small LSTM, replay, two minibatches per update and
    evaluation."""
    return (
        _small(lag=lag, num_learners=num_learners)
        .training(minibatch_size=320, replay_proportion=1.0, replay_buffer_num_slots=64)
        .rl_module(model_config={**MODEL, "max_seq_len": 8})
        .evaluation(evaluation_interval=2, evaluation_duration=2)
    )


def _leaves_close(a, b, **tolerance):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **tolerance)


@pytest.mark.timeout(300)
def test_an_lstm_run_on_device_trains_evaluates_acts_restores_and_is_one_function(tmp_path):
    """The surface with use_lstm on device (with replay and a lag): train() and evaluation,
    compute_single_action with a state, a checkpoint that restores the params exactly; the
    same updates from make_train's pure function; and 2 learner devices = 1 (without replay,
    whose slots each device samples with its own key)."""
    from impala_jax import make_train

    config = _small_lstm(lag=1)
    with config.build() as algo:
        results = [algo.train() for _ in range(2)]
        assert results[1]["evaluation"]["env_runners"]["num_episodes"] >= 2
        assert results[1]["learners"]["default_policy"]["mean_rho"] > 0
        state = algo.get_initial_state()
        action, state_out, extra = algo.compute_single_action(np.zeros(4, np.float32), state)
        assert action in (0, 1) and extra["action_dist_inputs"].shape == (2,)
        assert jax.tree.structure(state_out) == jax.tree.structure(state)
        params = jax.device_get(algo.learner.state.params)
        path = algo.save(tmp_path / "ckpt")
        algo.train()
        algo.restore(path)
        _leaves_close(params, jax.device_get(algo.learner.state.params), rtol=0, atol=0)
    final, _ = jax.jit(make_train(_small_lstm(lag=1), 2 * 640))(jax.random.key(3))
    # Adam's normalised step moves a weight whose gradient is near zero by a fraction of lr
    # when the rounding differs (test_on_device.py's one device = two devices).
    _leaves_close(jax.device_get(final.state.params), params, rtol=1e-5, atol=1e-4)

    assert len(jax.devices()) >= 2, "tests/conftest.py forces 2 CPU devices"
    runs = []
    for n in (1, 2):
        config = _small_lstm(num_learners=n).evaluation(evaluation_interval=None)
        config = config.training(replay_proportion=0.0, replay_buffer_num_slots=0)
        with config.build() as algo:
            returns = [algo.train()["env_runners"]["episode_return_mean"] for _ in range(2)]
            runs.append((returns, jax.device_get(algo.learner.state.params)))
    assert runs[0][0] == runs[1][0]  # the same envs and actions: the same episodes
    _leaves_close(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-5)  # measured: 6.8e-7 apart
