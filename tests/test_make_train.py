"""``make_train``: an on-device run as one pure function of a key, equal to ``train()``'s
updates, jittable and vmappable over keys."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig, make_train


def _small(lag=None, replay=0.0, seed=3) -> IMPALAConfig:
    """16 envs x 20 steps, two minibatch updates of 320 rows per update."""
    return (
        IMPALAConfig()
        .environment("gymnax:CartPole-v1")
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=16,
            rollout_fragment_length=20,
            policy_lag=lag,
        )
        .training(
            train_batch_size_per_learner=640,
            minibatch_size=320,
            lr=0.01,
            replay_proportion=replay,
            replay_buffer_num_slots=64 if replay else 0,
        )
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
        .debugging(seed=seed)
    )


def _trained(config, updates: int):
    with config.build() as algo:
        results = [algo.train() for _ in range(updates)]
        return jax.device_get(algo.learner.state.params), results


@pytest.mark.parametrize("lag, replay", [(None, 0.0), (2, 0.0), (None, 1.0)])
def test_the_function_makes_train_s_updates(lag, replay):
    config = _small(lag=lag, replay=replay)
    expected, results = _trained(config, 3)
    assert results[-1]["num_env_steps_sampled_lifetime"] == 3 * 640
    train = make_train(_small(lag=lag, replay=replay), 3 * 640)
    final, metrics = jax.jit(train)(jax.random.key(3))
    got = jax.device_get(final.state.params)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(metrics["num_env_steps_sampled_lifetime"], [640, 1280, 1920])
    reported = [r["learners"]["default_policy"]["mean_rho"] for r in results]
    np.testing.assert_allclose(metrics["mean_rho"], reported, rtol=1e-5)


def test_vmapped_over_keys_each_member_is_its_key_alone():
    train = make_train(_small(), 2 * 640)
    keys = jax.random.split(jax.random.key(0), 2)
    group, metrics = jax.jit(jax.vmap(train))(keys)
    assert metrics["num_episodes"].shape == (2, 2)
    for i in range(2):
        alone, _ = jax.jit(train)(keys[i])
        group_leaves, alone_leaves = (jax.tree.leaves(c.state.params) for c in (group, alone))
        for x, y in zip(group_leaves, alone_leaves, strict=True):
            np.testing.assert_allclose(x[i], y, rtol=1e-5, atol=1e-6)


def test_episodes_are_counted_per_update():
    _, metrics = jax.jit(make_train(_small(), 4 * 640))(jax.random.key(1))
    returns, episodes = (
        np.asarray(metrics["episode_return_sum"]),
        np.asarray(metrics["num_episodes"]),
    )
    assert episodes.sum() > 0 and returns.sum() >= episodes.sum()  # CartPole pays 1 per step


def test_host_envs_and_bad_budgets_are_errors():
    host = _small().environment("CartPole-v1")
    with pytest.raises(ValueError, match="not an env written in JAX"):
        make_train(host, 640)
    with pytest.raises(ValueError, match="num_env_steps=0"):
        make_train(_small(), 0)
