"""Fault injection, mirroring RLlib's env-runner failure tests, in impala_jax's threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure
from impala_jax.runtime.learning.learner import Learner
from tests.fake_envs import FlakyCartPole, NaNRewardEnv, SeededFault
from tests.test_algorithm import small_config
from tests.test_learner import make_learner, random_batch


def fault_config(env, num_env_runners=2, **env_config):
    return (
        small_config(env, num_env_runners=num_env_runners, num_envs_per_env_runner=2)
        .environment(env_config=env_config)
        .training(train_batch_size_per_learner=16, learner_queue_timeout=20)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0)
    )


@pytest.mark.timeout(180)
def test_flaky_envs_are_restarted_and_training_goes_on():
    config = fault_config(FlakyCartPole, p=0.01).fault_tolerance(
        restart_failed_sub_environments=True
    )
    with config.build() as algo:
        # Failures are random (p per step): train until one happened (a loaded machine
        # samples fewer steps per iteration), then two iterations more.
        iterations = 0
        for _ in range(100):
            result = algo.train()
            iterations += 1
            if result["fault_tolerance"]["num_env_restarts"] > 0:
                break
        for _ in range(2):
            result = algo.train()
            iterations += 1
    ft = result["fault_tolerance"]
    assert ft["num_healthy_workers"] == 2
    assert ft["num_env_restarts"] > 0
    assert ft["num_remote_worker_restarts"] == 0
    assert result["num_env_steps_trained_lifetime"] == iterations * 16


@pytest.mark.timeout(180)
def test_one_always_failing_runner_is_ignored():
    # Runner 1's envs get seeds 1 + 2 = 3 and 4: only they fail.
    config = fault_config(SeededFault, from_seed=3).fault_tolerance(
        restart_failed_env_runners=False, ignore_env_runner_failures=True
    )
    with config.build() as algo:
        for _ in range(4):
            result = algo.train()
    assert result["fault_tolerance"]["num_healthy_workers"] == 1
    assert result["fault_tolerance"]["num_env_runner_failures"] == 1
    assert result["num_env_steps_trained_lifetime"] == 4 * 16


@pytest.mark.timeout(180)
def test_failed_runner_is_replaced_until_restarts_run_out():
    # A different message each time (the env's seed): not the same failure repeating.
    config = fault_config(SeededFault, from_seed=3, vary=True).fault_tolerance(
        max_num_env_runner_restarts=3
    )
    algo = config.build()
    trained = 0
    with pytest.raises(RuntimeError, match="does not recover") as info:
        for _ in range(200):
            result = algo.train()
            trained = result["num_env_steps_trained_lifetime"]
            restarts = result["fault_tolerance"]["num_remote_worker_restarts"]
    assert restarts >= 2 and algo.env_runner_group.num_restarts == 3
    assert trained > 0  # the healthy runner kept training going meanwhile
    assert "injected runner failure" in str(info.value)
    algo.stop()


@pytest.mark.timeout(180)
def test_a_replaced_runners_exited_thread_gives_its_heap_back(monkeypatch):
    # glibc keeps an exited thread's freed pages: each restart kept ~1.3 MiB resident (soak).
    # The real release_free_heap runs; a spy on glibc's malloc_trim records each call, with the
    # failures counted when it came and whether glibc gave pages back (its return value).
    from impala_jax.runtime.acting import env_runner_group

    malloc_trim = env_runner_group._malloc_trim()
    assert malloc_trim is not None  # glibc here: the trim is real
    trims = []

    def spy(pad):
        trims.append((pad, algo.env_runner_group.num_failures, malloc_trim(pad)))
        return trims[-1][2]

    monkeypatch.setattr(env_runner_group, "_malloc_trim", lambda: spy)
    config = fault_config(SeededFault, from_seed=3, vary=True).fault_tolerance(
        max_num_env_runner_restarts=100
    )
    with config.build() as algo:
        deadline = time.monotonic() + 60
        while not trims and time.monotonic() < deadline:
            algo.train()
        group = algo.env_runner_group
        assert trims, "no trim after a replaced runner's thread exited"
        assert group.num_failures >= 1
    # Each trim came after a runner had failed, asked glibc to keep no pad, and glibc answered.
    assert all(pad == 0 and failures >= 1 and given in (0, 1) for pad, failures, given in trims)


@pytest.mark.timeout(180)
def test_all_runners_failing_raise_with_the_original_traceback():
    config = fault_config(SeededFault, from_seed=0).fault_tolerance(
        restart_failed_env_runners=False
    )
    algo = config.build()
    with pytest.raises(RuntimeError, match="EnvRunner") as info:
        for _ in range(5):
            algo.train()
    assert "injected runner failure" in str(info.value)
    assert "Traceback" in str(info.value)
    algo.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_env_runners", [0, 2])
def test_a_hopeless_env_ends_the_run_in_seconds_with_its_error(num_env_runners):
    # Every env fails at its 4th step after every rebuild: a bug, not bad luck. RLlib's
    # tolerances (100 rebuilds in a row, a delay before each runner restart, a learner timeout)
    # would take many minutes to give up; here the delay and the timeout are an hour, so a run
    # that waited for either would hang past the test's timeout.
    config = (
        fault_config(SeededFault, num_env_runners=num_env_runners, from_seed=0)
        .training(learner_queue_timeout=3600)
        .fault_tolerance(
            restart_failed_sub_environments=True, delay_between_env_runner_restarts_s=3600.0
        )
    )
    algo = config.build()
    try:
        with pytest.raises(EnvRunnerFailure) as info:
            algo.train()
    finally:
        algo.stop()
    message = str(info.value)
    assert "3 times in a row with the same error at the same env step" in message, message
    assert "injected runner failure" in message and "a bug in the env" in message
    if num_env_runners:
        assert "Traceback" in message and "fake_envs.py" in message
        assert algo.env_runner_group.num_restarts == 0  # not rebuilt again, not restarted
    assert algo.env_runner_group.runners[0].num_env_restarts == 2 or num_env_runners


@pytest.mark.timeout(120)
def test_while_every_runner_waits_for_its_restart_the_wait_says_why(monkeypatch):
    # First-generation runners (env seeds 0-3) fail; their replacements (seeds 6 on) work. The
    # restart delay is an hour of a clock that moves on only when the learner reports its wait,
    # so a restart can only follow a report; the learner timeout (30 s, far shorter than the
    # delay) must not end the wait: waiting for a restart is not "slow envs".
    real_monotonic, offset = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + offset[0])
    config = (
        fault_config(SeededFault, from_seed=0, until_seed=4)
        .training(learner_queue_timeout=30.0)
        .fault_tolerance(delay_between_env_runner_restarts_s=3600.0)
    )
    with config.build() as algo:
        reports = []

        def on_down(report):
            reports.append((report, algo.env_runner_group.num_restarts))
            offset[0] += 3600.0

        algo.env_runner_group.on_down = on_down
        result = algo.train()
        # Both failed before the wait; the first replacement's batch can end the iteration
        # before the second one's restart is due (it failed later on a loaded machine).
        assert result["fault_tolerance"]["num_env_runner_failures"] == 2
        assert result["num_env_steps_trained_lifetime"] > 0
        for _ in range(100):  # a bound on a hang only
            if result["fault_tolerance"]["num_remote_worker_restarts"] >= 2:
                break
            result = algo.train()
        assert result["fault_tolerance"]["num_remote_worker_restarts"] == 2
    assert reports, "the wait said nothing"
    # The first report came while no runner had been restarted yet.
    report, restarts_then = reports[0]
    assert restarts_then == 0
    assert report.startswith("No EnvRunner is sampling"), report
    for needed in (
        "EnvRunner 0 failed at",
        "EnvRunner 1 failed at",
        "injected runner failure",
        "its restart is due in",
        "Traceback",
        "delay_between_env_runner_restarts_s",
    ):
        assert needed in report, (needed, report)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hung_runner_is_replaced_and_training_progresses():
    config = (
        fault_config(SeededFault, from_seed=3, mode="hang", hang_s=6.0)
        .env_runners(sample_timeout_s=2.0)
        .fault_tolerance(max_num_env_runner_restarts=2)
    )
    with config.build() as algo:
        trained = []
        deadline = time.monotonic() + 60
        while algo.env_runner_group.num_restarts < 1 and time.monotonic() < deadline:
            trained.append(algo.train()["num_env_steps_trained_lifetime"])
        result = algo.train()
    assert result["fault_tolerance"]["num_remote_worker_restarts"] >= 1
    assert result["fault_tolerance"]["num_env_runner_failures"] >= 1
    assert result["num_env_steps_trained_lifetime"] > trained[0]


@pytest.mark.timeout(120)
def test_nan_reward_is_caught_at_the_runner():
    with pytest.raises(ValueError, match="non-finite reward"):
        with small_config(NaNRewardEnv).build() as algo:
            algo.train()
    config = fault_config(NaNRewardEnv)  # threaded: fatal, not restarted 1000 times
    algo = config.build()
    with pytest.raises(RuntimeError, match="non-finite reward"):
        for _ in range(5):
            algo.train()
    algo.stop()


@pytest.mark.timeout(120)
def test_nan_batch_leaves_params_unchanged_and_is_counted():
    learner: Learner = make_learner(1)
    before = jax.device_get(learner.state.params)
    batch = random_batch(0)
    batch.reward[1, 2] = np.nan
    metrics = jax.device_get(learner.update(learner.put_batch(batch), env_steps=0))
    after = jax.device_get(learner.state.params)
    jax.tree.map(np.testing.assert_array_equal, before, after)
    assert metrics["num_non_finite_updates"] == 1
    metrics = jax.device_get(learner.update(learner.put_batch(random_batch(1)), env_steps=0))
    assert metrics["num_non_finite_updates"] == 1
    assert metrics["num_consecutive_non_finite_updates"] == 0
    changed = jax.tree.map(
        lambda a, b: bool(np.any(a != b)), before, jax.device_get(learner.state.params)
    )
    assert any(jax.tree.leaves(changed))


@pytest.mark.timeout(180)
def test_nan_updates_in_a_row_stop_training(tmp_path):
    config = small_config(NaNRewardEnv).environment(disable_env_checking=True)
    with config.build() as algo:
        with pytest.raises(FloatingPointError, match="non-finite"):
            for _ in range(12):
                algo.train()
        params = jax.device_get(algo.learner.state.params)
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


SAVER = textwrap.dedent(
    """
    import sys
    from tests.test_algorithm import small_config
    algo = small_config().build()
    algo.train()
    algo.save(sys.argv[1])
    print("saved", flush=True)
    while True:
        algo.train()
        algo.save(sys.argv[1])
    """
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_during_save_never_leaves_a_half_written_checkpoint(tmp_path):
    from impala_jax.rllib.algorithm import IMPALA

    path = tmp_path / "ckpt"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for delay in (0.05, 0.6):
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path)],
            stdout=subprocess.PIPE,
            cwd=os.path.dirname(os.path.dirname(__file__)),
            env=env,
        )
        assert proc.stdout.readline().strip() == b"saved"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        algo = IMPALA.from_checkpoint(path)
        assert algo.get_state()["counters"]["training_iteration"] >= 1
        algo.stop()


@pytest.mark.timeout(240)
def test_restore_onto_two_learner_devices(tmp_path):
    with small_config().build() as algo:
        algo.train()
        state = algo.get_state()
        path = algo.save(tmp_path / "one_device")
    with small_config().learners(num_learners=2).build() as two:
        two.restore(path)
        again = two.get_state()
        for a, b in zip(state["learner"], again["learner"], strict=True):
            np.testing.assert_array_equal(a, b)
        assert two.train()["training_iteration"] == 2


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_long_lockstep_run_leaves_no_thread_behind():
    # Memory over a long run is the soak's to measure (make soak): RSS in the shared pytest
    # process moves with whatever else the session did.
    threads_before = threading.active_count()
    with small_config().build() as algo:
        for _ in range(10):
            algo.train()
        # Thread objects, not a count: a thread left by an earlier test of the session (an
        # abandoned hung env, a library's worker) may end meanwhile; none may be added.
        threads0 = set(threading.enumerate())
        for _ in range(150):
            algo.train()
        threads1 = set(threading.enumerate())
    assert not threads1 - threads0, threads1 - threads0
    assert threading.active_count() <= threads_before + 1


def _on_train_result(algorithm, result, **kwargs):
    if result["training_iteration"] == 2:
        raise KeyError("no_such_metric")


def _on_episode_end(episode, **kwargs):
    raise ZeroDivisionError("the user's episode metric divided by zero")


def _custom_evaluation(algorithm, eval_workers):
    raise ValueError("the user's evaluation could not load its reference scores")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "where,num_env_runners",
    [("on_train_result", 0), ("on_episode_end", 0), ("on_episode_end", 2), ("evaluation", 0)],
)
def test_user_code_that_raises_stops_the_run_naming_it(tmp_path, where, num_env_runners):
    config = small_config(num_env_runners=num_env_runners).fault_tolerance(
        restart_failed_sub_environments=True, delay_between_env_runner_restarts_s=0.0
    )
    if where == "on_train_result":
        config.callbacks(on_train_result=_on_train_result)
        named = "on_train_result callback tests.test_fault_tolerance._on_train"
        original = "KeyError"
    elif where == "on_episode_end":
        config.callbacks(on_episode_end=_on_episode_end)
        named, original = (
            "on_episode_end callback tests.test_fault_tolerance._on_episode_end",
            ("ZeroDivisionError"),
        )
    else:
        config.evaluation(evaluation_interval=2, custom_evaluation_function=_custom_evaluation)
        named, original = (
            "custom_evaluation_function=tests.test_fault_tolerance._custom_",
            ("ValueError"),
        )
    before = set(threading.enumerate())  # an earlier test's abandoned (hung) threads stay
    algo = config.build()
    saved = None
    with pytest.raises(RuntimeError) as info:
        for _ in range(20):
            algo.train()
            if saved is None:
                saved = algo.save(tmp_path / "checkpoint")
    message = str(info.value)
    assert named in message and f"raised {original}" in message, message
    assert "original traceback" in message and "test_fault_tolerance.py" in message
    assert algo._stopped  # every thread ended
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith("EnvRunner-")]
    assert not left, left
    if num_env_runners:
        # Not taken for an env failure: the runner was not restarted, its envs not rebuilt.
        assert algo.env_runner_group.num_restarts == 0
        assert algo.env_runner_group.fault_tolerance_metrics()["num_env_restarts"] == 0
    if saved is not None:
        with small_config().build() as again:
            again.restore(saved)  # the last checkpoint is intact
