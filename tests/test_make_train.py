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


def _final_params(config, updates: int, hparams=None):
    train = make_train(config, updates * 640)
    final, metrics = jax.jit(train)(jax.random.key(3), hparams)
    return jax.device_get(final.state.params), jax.device_get(metrics)


def _assert_same(a, b, rtol=0.0, atol=0.0):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


TRACED_ADAM = {
    "lr": 0.003,
    "entropy_coeff": 0.02,
    "vf_loss_coeff": 0.25,
    "gamma": 0.95,
    "vtrace_clip_rho_threshold": 0.9,
    "vtrace_clip_pg_rho_threshold": 1.5,
    "grad_clip": 0.5,
}


def test_traced_hyperparameters_make_the_updates_of_the_same_values_given_statically():
    static = _small(lag=2).training(**TRACED_ADAM)
    expected, expected_metrics = _final_params(static, 3)
    # Other values in the config: the traced ones must win everywhere they are read.
    others = _small(lag=2).training(
        lr=0.01,
        entropy_coeff=0.0,
        vf_loss_coeff=1.0,
        gamma=0.99,
        vtrace_clip_rho_threshold=1.0,
        vtrace_clip_pg_rho_threshold=1.0,
        grad_clip=40.0,
    )
    hparams = {k: np.float32(v) for k, v in TRACED_ADAM.items()}
    got, metrics = _final_params(others, 3, hparams)
    _assert_same(got, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(metrics["curr_lr"], expected_metrics["curr_lr"])
    np.testing.assert_allclose(
        metrics["curr_entropy_coeff"], expected_metrics["curr_entropy_coeff"]
    )


def test_traced_rmsprop_knobs_and_schedule_values():
    schedule = [[0, 0.01], [1280, 0.002]]
    static = _small().training(
        opt_type="rmsprop",
        lr=schedule,
        decay=0.9,
        epsilon=1e-3,
        momentum=0.5,
        entropy_coeff=[[0, 0.05], [640, 0.01]],
    )
    expected, expected_metrics = _final_params(static, 3)
    others = _small().training(
        opt_type="rmsprop",
        lr=[[0, 0.1], [1280, 0.1]],
        decay=0.99,
        epsilon=0.1,
        momentum=0.9,
        entropy_coeff=[[0, 0.0], [640, 0.0]],
    )
    hparams = {
        "lr": np.float32([0.01, 0.002]),
        "decay": np.float32(0.9),
        "epsilon": np.float32(1e-3),
        "momentum": np.float32(0.5),
        "entropy_coeff": np.float32([0.05, 0.01]),
    }
    got, metrics = _final_params(others, 3, hparams)
    _assert_same(got, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(metrics["curr_lr"], expected_metrics["curr_lr"], rtol=1e-6)


def test_a_traced_policy_lag_acts_as_that_lag_given_statically():
    expected, expected_metrics = _final_params(_small(lag=1), 4)
    got, metrics = _final_params(_small(lag=3), 4, {"policy_lag": np.float32(1)})
    _assert_same(got, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(metrics["mean_rho"], expected_metrics["mean_rho"], rtol=1e-6)
    at_zero, _ = _final_params(_small(), 4)
    got, _ = _final_params(_small(lag=3), 4, {"policy_lag": np.float32(0)})
    _assert_same(got, at_zero, rtol=1e-6, atol=1e-7)


def test_members_vmapped_over_hyperparameters_are_each_value_alone():
    train = make_train(_small(), 2 * 640)
    keys = jax.random.split(jax.random.key(5), 2)
    lrs = np.float32([0.001, 0.03])
    group, _ = jax.jit(jax.vmap(train))(keys, {"lr": lrs})
    for i in range(2):
        alone, _ = jax.jit(train)(keys[i], {"lr": lrs[i]})
        leaves = (jax.tree.leaves(c.state.params) for c in (group, alone))
        for x, y in zip(*leaves, strict=True):
            np.testing.assert_allclose(x[i], y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"train_batch_size_per_learner": 1.0}, "decides the compiled program's shapes"),
        ({"lr_typo": 1.0}, "not a hyperparameter that can be traced"),
        ({"decay": 0.9}, "only RMSProp reads decay"),
        ({"lr": np.float32([0.1, 0.2])}, r"expected a scalar"),
        ({"policy_lag": 1.0}, r"env_runners\(policy_lag=K\)"),
    ],
)
def test_what_cannot_be_traced_is_named(hparams, match):
    train = make_train(_small(), 640)
    with pytest.raises(ValueError, match=match):
        jax.jit(train)(jax.random.key(0), hparams)


def test_a_clip_the_config_leaves_out_cannot_be_traced():
    train = make_train(_small().training(grad_clip=None), 640)
    with pytest.raises(ValueError, match="grad_clip=None compiles no clipping"):
        jax.jit(train)(jax.random.key(0), {"grad_clip": 1.0})
