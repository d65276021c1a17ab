"""The runtime end to end: runners, buffers, learner and IMPALA together."""

from __future__ import annotations

import gc
import threading

import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core.vtrace import vtrace
from impala_jax.runtime.learning.buffers import LearnerQueueTimeout
from tests.fake_envs import GAMMA, SlowEnv, make_return_env


def small_config(env="CartPole-v1", **env_runners):
    runners = dict(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
    runners.update(env_runners)
    return (
        IMPALAConfig()
        .environment(env)
        .env_runners(**runners)
        .training(train_batch_size_per_learner=64, lr=1e-3)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_time_s_per_iteration=0)
        .debugging(seed=1)
    )


def return_env_config(num_env_runners, num_envs):
    return (
        small_config(
            make_return_env,
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=5,
        )
        .environment(env_config={"max_steps": 7, "max_len": 12})
        .training(gamma=GAMMA, train_batch_size_per_learner=5 * num_envs)
    )


@pytest.fixture
def two_env_groups(monkeypatch):
    """Forces the two alternating env groups per runner even on a 2-core machine."""
    from impala_jax.runtime.acting.env_runner import EnvRunner

    monkeypatch.setattr(EnvRunner, "split_min_cpus", 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_env_runners,num_envs", [(0, 3), (0, 8), (1, 8)])
def test_time_alignment_end_to_end(num_env_runners, num_envs, two_env_groups):
    """Values read from the observations are the true values: V-trace must reproduce them.

    Covers terminations, truncations (bootstrapping from the final observation), the reset
    rows of next-step autoreset, and fragment boundaries (T=5 < episode lengths up to 12).
    """
    with return_env_config(num_env_runners, num_envs).build() as algo:
        assert len(algo.env_runner_group.runners[0].groups) == (2 if num_envs == 8 else 1)
        seen_term = seen_trunc = seen_reset = 0
        for _ in range(12):
            batch, _ = algo.env_runner_group.next_batch()
            obs = np.asarray(batch.obs)
            v = obs[..., 0]
            valid = np.asarray(batch.valid)
            out = vtrace(
                v[:-1],
                v[1:],
                np.asarray(batch.reward),
                GAMMA * (1.0 - np.asarray(batch.terminated, np.float32)),
                valid,  # on-policy: rho = 1 on real rows, 0 on reset rows
            )
            real = valid > 0
            np.testing.assert_allclose(np.asarray(out.vs)[real], v[:-1][real], atol=2e-5)
            np.testing.assert_allclose(np.asarray(out.pg_advantages)[real], 0.0, atol=2e-5)
            seen_term += np.asarray(batch.terminated).sum()
            seen_trunc += np.asarray(batch.truncated).sum()
            seen_reset += (~real).sum()
        assert seen_term and seen_trunc and seen_reset


@pytest.mark.timeout(120)
def test_reset_rows_are_masked_and_carried_across_fragments():
    with return_env_config(0, 3).build() as algo:
        runner = algo.env_runner_group.local_runner
        prev_done = np.zeros(3, bool)
        for _ in range(10):
            (traj,) = runner.sample()
            done = traj.terminated | traj.truncated
            expected = ~np.concatenate([prev_done[None], done[:-1]])
            np.testing.assert_array_equal(traj.valid > 0, expected)
            np.testing.assert_array_equal(traj.reward[~expected], 0.0)
            # A reset row's observation is a fresh episode's first: steps-taken counter 0.
            np.testing.assert_array_equal(traj.obs[1:][done][:, 1] > 0, True)
            prev_done = done[-1]


@pytest.mark.timeout(180)
def test_the_seed_fixes_a_lockstep_run_and_another_changes_it():
    # (Bit-identical builds in one process, fresh processes and caches: test_lockstep_builds.)
    def run(seed):
        with small_config().debugging(seed=seed).build() as algo:
            results = [algo.train() for _ in range(2)]
            params = jax.device_get(algo.learner.state.params)
        losses = [r["learners"]["default_policy"]["total_loss"] for r in results]
        returns = [r["env_runners"]["episode_return_mean"] for r in results]
        return losses, returns, params

    first, again, other = run(1), run(1), run(2)
    assert first[:2] == again[:2]
    jax.tree.map(np.testing.assert_array_equal, first[2], again[2])
    assert first[0] != other[0], "another seed, the same losses"
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(first[2]), jax.tree.leaves(other[2]), strict=True)
    ), "another seed, the same params"


@pytest.mark.timeout(120)
def test_learner_step_and_act_compile_once_and_result_keys():
    with small_config().env_runners(inference_backend="jax").build() as algo:
        for _ in range(3):
            result = algo.train()
        assert algo.learner._step._cache_size() == 0  # compiled ahead of time only (warm_up)
        assert algo.learner._compiled is not None
        # The runner's first key is placed where act puts the keys it returns: a fresh
        # (uncommitted) key compiled act a second time on its second call.
        assert algo._act._cache_size() == 1
    learner = result["learners"]["default_policy"]
    for key in (
        "total_loss",
        "pi_loss",
        "vf_loss",
        "entropy",
        "curr_lr",
        "curr_entropy_coeff",
        "gradients_default_optimizer_global_norm",
        "mean_rho",
        "num_non_finite_updates",
    ):
        assert np.isfinite(learner[key]), key
    for key in ("episode_return_mean", "episode_len_mean", "num_episodes", "num_env_steps_sampled"):
        assert key in result["env_runners"]
    assert result["training_iteration"] == 3
    assert result["num_env_steps_sampled_lifetime"] == 3 * 64
    assert result["num_env_steps_trained_lifetime"] == 3 * 64
    assert {"env_recv_s", "inference_s", "transfer_s"} <= set(result["timers"])


@pytest.mark.timeout(120)
def test_queue_timeout_is_a_clear_error():
    config = (
        small_config(SlowEnv, num_env_runners=1, num_envs_per_env_runner=1)
        .environment(env_config={"delay": 0.5})
        .training(learner_queue_timeout=0.3, train_batch_size_per_learner=8)
    )
    with config.build() as algo:
        with pytest.raises(LearnerQueueTimeout, match="learner_queue_timeout"):
            algo.train()


@pytest.mark.timeout(180)
def test_checkpoint_restores_identical_state(tmp_path):
    config = small_config().training(replay_proportion=1.0, replay_buffer_num_slots=16)
    with config.build() as algo:
        algo.train()
        algo.train()
        state = algo.get_state()
        path = algo.save(tmp_path / "ckpt")
    restored = type(algo).from_checkpoint(path)
    try:
        again = restored.get_state()
        assert again["counters"] == state["counters"]
        for a, b in zip(
            state["learner"] + state["replay"], again["learner"] + again["replay"], strict=True
        ):
            np.testing.assert_array_equal(a, b)
        result = restored.train()
        assert result["training_iteration"] == 3
        assert result["num_env_steps_trained_lifetime"] == 3 * 128
    finally:
        restored.stop()


@pytest.mark.timeout(120)
def test_evaluate_and_compute_actions():
    config = small_config().evaluation(evaluation_interval=1, evaluation_duration=3)
    with config.build() as algo:
        result = algo.train()
        assert result["evaluation"]["env_runners"]["num_episodes"] >= 3
        evaluation = algo.evaluate()["env_runners"]
        # CartPole pays 1 per step: every return is its episode's length.
        assert evaluation["num_episodes"] >= 3
        assert evaluation["episode_return_mean"] == pytest.approx(evaluation["episode_len_mean"])
        assert evaluation["episode_return_min"] <= evaluation["episode_return_mean"]
        assert evaluation["episode_return_mean"] <= evaluation["episode_return_max"]
        assert evaluation["num_env_steps_sampled"] >= 3 * evaluation["episode_return_min"]
        obs = np.zeros(4, np.float32)
        assert algo.compute_single_action(obs) in (0, 1)
        assert algo.compute_actions(np.zeros((5, 4), np.float32), explore=True).shape == (5,)


@pytest.mark.timeout(120)
def test_box_actions_train_and_stay_in_bounds():
    with small_config("Pendulum-v1").build() as algo:
        result = algo.train()
        assert np.isfinite(result["learners"]["default_policy"]["total_loss"])
        actions = algo.compute_actions(np.ones((16, 3), np.float32), explore=True)
        assert actions.shape == (16, 1)
        assert np.all(np.abs(actions) <= 2.0)


@pytest.mark.timeout(120)
def test_stop_ends_threads_and_debug_modes():
    config = small_config(num_env_runners=2).debugging(_env_runners_only=True)
    algo = config.build()
    result = algo.train()
    assert result["num_env_steps_trained_lifetime"] == 0
    assert result["num_env_steps_sampled_lifetime"] > 0
    algo.stop()
    assert not any(t.name.startswith(("EnvRunner", "loader")) for t in threading.enumerate())


@pytest.mark.timeout(120)
def test_del_ends_threads():
    algo = small_config(num_env_runners=2).build()
    algo.train()
    del algo
    gc.collect()
    for t in threading.enumerate():
        if t.name.startswith(("EnvRunner", "loader")):
            t.join(timeout=10)
    assert not any(t.name.startswith(("EnvRunner", "loader")) for t in threading.enumerate())


def test_unknown_env_is_a_clear_error():
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        small_config("NoSuchEnv-v0").build()


@pytest.mark.timeout(120)
def test_epochs_with_minibatch_buffer_train_each_batch_num_epochs_times():
    config = small_config().training(num_epochs=2, minibatch_buffer_size=2)
    with config.build() as algo:
        for _ in range(4):
            result = algo.train()
        assert algo.step_spec.num_epochs == 1
    assert result["num_env_steps_trained_lifetime"] == 4 * 64
    assert result["num_env_steps_sampled_lifetime"] == 2 * 64


@pytest.mark.timeout(120)
def test_evaluate_on_a_fresh_algorithm_with_episodes_or_timesteps():
    config = small_config().evaluation(evaluation_duration=40, evaluation_duration_unit="timesteps")
    with config.build() as algo:
        result = algo.evaluate()["env_runners"]
    assert result["num_env_steps_sampled"] >= 40


def test_runner_threads_with_two_learner_devices_keep_their_params():
    # The actors' params are copies: the learner step donates its state on both devices.
    # (A copy by device_put of the replicated params would alias device 0's buffer, and
    # every runner would fail on its next act with a deleted buffer.)
    config = (
        small_config(num_env_runners=2)
        .learners(num_learners=2)
        .fault_tolerance(restart_failed_env_runners=False)
    )
    with config.build() as algo:
        for _ in range(3):
            result = algo.train()
        assert result["fault_tolerance"]["num_env_runner_failures"] == 0
        assert result["fault_tolerance"]["num_healthy_workers"] == 2
        assert algo.param_store.version > 1  # published params were acted on
