"""Issue 44's Python-API items: one experiment on two processes, a Discrete observation's batch,
RLlib's explore=None, build()'s compilation cache, a Tune trial's quiet end, model_config typos."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.rllib import algorithm
from impala_jax.runtime.process import jax_setup
from tests.test_distributed import REPO, _env, _free_port, _kill, _start, _wait


def _small(env="CartPole-v1", **env_runners) -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment(env)
        .env_runners(
            num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=10, **env_runners
        )
        .training(train_batch_size_per_learner=40)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .debugging(seed=0)
    )


# --- item 2: one experiment, unchanged, on two processes ------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cartpole_experiment_runs_unchanged_on_two_processes(tmp_path):
    """num_learners=0 over two processes: one device of each; both exit 0, one run directory."""
    logdir, coordinator = tmp_path / "runs", f"127.0.0.1:{_free_port()}"
    commands = [
        [sys.executable, "-m", "impala_jax.run", str(REPO / "experiments" / "cartpole.py")]
        + ["--logdir", str(logdir), "--stop", "training_iteration=2", "--compile-cache", "none"]
        + ["--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]
        for i in range(2)
    ]
    procs = _start(commands, _env(), tmp_path / "logs")
    try:
        _wait(procs, tmp_path / "logs", timeout_s=300)
    finally:
        _kill(procs)
    (run_dir,) = logdir.iterdir()
    assert (run_dir / "result.json").read_text().count("\n") == 2


_ONE_BAD_PROCESS = """
import sys, time
from impala_jax.runtime.process import distributed
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]), collective_timeout_s=60)
from impala_jax import IMPALAConfig
config = (
    IMPALAConfig().environment("CartPole-v1")
    .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=10)
    .rl_module(model_config={"fcnet_hiddens": [8]})
)
if sys.argv[2] == "1":  # a config error on this process alone
    config.training(minibatch_size=7)
start = time.monotonic()
try:
    config.build()
except ValueError as err:
    print("ERROR", " ".join(str(err).split()), flush=True)
    print(f"AFTER {time.monotonic() - start:.1f}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_config_error_on_one_process_stops_both_at_once_with_the_same_message(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    commands = [[sys.executable, "-c", _ONE_BAD_PROCESS, coordinator, str(i)] for i in range(2)]
    procs = _start(commands, _env(), tmp_path / "logs")
    try:
        outputs = _wait(procs, tmp_path / "logs", timeout_s=120)
    finally:
        _kill(procs)
    errors = [[ln for ln in out.splitlines() if ln.startswith("ERROR ")] for out in outputs]
    assert all(len(e) == 1 for e in errors), outputs
    assert errors[0] == errors[1], errors  # the same message on both
    assert "process 1 of 2" in errors[0][0] and "minibatch_size" in errors[0][0], errors
    waited = [float(ln.split()[1]) for out in outputs for ln in out.splitlines() if "AFTER" in ln]
    assert max(waited) < 30, waited  # at once: not after the 60 s collective timeout


def test_num_learners_zero_is_one_device_per_process():
    from impala_jax.runtime.learning import parallel

    assert parallel.learner_device_count(0) == 1 and parallel.learner_device_count(3) == 3
    devices, local = parallel.learner_devices(0)
    assert devices == local == jax.devices()[:1]


# --- item 6: a Discrete observation space -----------------------------------------------------


def test_a_discrete_observation_batch_is_the_one_the_learner_compiled_for(caplog):
    with caplog.at_level(logging.WARNING, logger="impala_jax"):
        config = _small("Taxi-v3").reporting(min_time_s_per_iteration=0)
        with config.build() as algo:
            assert isinstance(algo.observation_space, gym.spaces.Discrete)
            algo.train()
            algo.train()
            example = algo.policy.example_batch(algo._T, 4, algo.action_dtype)
            real, _ = algo.env_runner_group.next_batch()

            def layout(batch):
                leaves = jax.tree.leaves(batch._replace(param_version=None))
                return [(x.shape, np.dtype(x.dtype)) for x in leaves]

            assert layout(real) == layout(example)
    assert "compiling it again" not in caplog.text, caplog.text


# --- item 7: explore=None follows the config, as in RLlib -------------------------------------


def test_compute_actions_explore_none_follows_the_config_as_rllib():
    from ray.rllib.algorithms.algorithm import Algorithm

    for name in ("compute_single_action", "compute_actions"):
        ours = inspect.signature(getattr(algorithm.IMPALA, name)).parameters
        rllib = inspect.signature(getattr(Algorithm, name)).parameters
        for p in ours.values():
            assert p.name in rllib, (name, p.name)
            assert (p.kind, p.default) == (rllib[p.name].kind, rllib[p.name].default), p
    obs = np.zeros(4, np.float32)
    with _small().build() as algo:  # explore=True by default: sampled actions
        assert {int(algo.compute_single_action(obs)) for _ in range(60)} == {0, 1}
        assert len({int(algo.compute_single_action(obs, explore=False)) for _ in range(5)}) == 1
        assert len(set(algo.compute_actions(np.zeros((60, 4), np.float32)).tolist())) == 2
    with _small(explore=False).build() as algo:
        assert len({int(algo.compute_single_action(obs)) for _ in range(20)}) == 1


# --- item 8: build() keeps compiled programs on disk, as the CLI does -------------------------


@pytest.fixture
def jax_cache_settings():
    """JAX's compilation-cache settings restored after the test, its cache closed."""
    from jax._src import compilation_cache

    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    before = {n: jax.config.values[n] for n in names}
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_build_keeps_compiled_programs_in_the_cache_folder(
    tmp_path, monkeypatch, jax_cache_settings
):
    monkeypatch.setenv(jax_setup.COMPILE_CACHE_ENV, str(tmp_path / "xla"))
    jax.config.update("jax_compilation_cache_dir", None)
    with _small().build():
        pass
    assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "xla")
    assert any((tmp_path / "xla").iterdir())


@pytest.mark.parametrize("off", ["none", "off", "", "OFF"])
def test_the_compile_cache_variable_turns_it_off(off, monkeypatch, jax_cache_settings):
    monkeypatch.setenv(jax_setup.COMPILE_CACHE_ENV, off)
    jax.config.update("jax_compilation_cache_dir", None)
    jax_setup.use_compile_cache()
    assert jax.config.values["jax_compilation_cache_dir"] is None


def test_a_cache_configured_in_jax_is_left_alone(tmp_path, monkeypatch, jax_cache_settings):
    monkeypatch.setenv(jax_setup.COMPILE_CACHE_ENV, str(tmp_path / "ours"))
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
    jax_setup.use_compile_cache()
    assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "theirs")


# --- item 10: a signal inside the finalizer (a Tune trial's end) ------------------------------


def test_a_signal_inside_the_finalizer_is_passed_on_not_printed():
    """Ray's SIGTERM handler raises SystemExit(1) wherever the main thread is; when that is
    IMPALA.__del__, the exit must reach the main thread instead of an 'Exception ignored'."""
    calls = []

    def ray_sigterm_handler(signum, frame):  # as ray's worker main loop sets it
        calls.append(signum)
        raise SystemExit(1)

    previous = signal.signal(signal.SIGTERM, ray_sigterm_handler)
    algo = _small().build()
    group_stop = algo.env_runner_group.stop
    algo.env_runner_group.stop = lambda: os.kill(os.getpid(), signal.SIGTERM)
    returned = False
    try:
        algo.__del__()  # what the garbage collector calls
        returned = True
        for _ in range(200):
            time.sleep(0.01)  # the handler runs again here, in the main thread
    except SystemExit:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        group_stop()
    assert returned, "SystemExit escaped IMPALA.__del__"
    assert calls == [signal.SIGTERM, signal.SIGTERM], calls


def test_a_finalizer_of_a_stopped_algorithm_in_a_terminated_process_prints_nothing():
    code = textwrap.dedent(
        """
        import os, signal, sys
        from tests.test_first_hour_rllib import _small
        def handler(signum, frame):
            raise SystemExit(1)
        signal.signal(signal.SIGTERM, handler)
        algo = _small().build()
        algo.env_runner_group.stop = lambda: os.kill(os.getpid(), signal.SIGTERM)
        del algo
        import time
        time.sleep(2)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


# --- item 12: a model_config typo -------------------------------------------------------------


def test_a_model_config_typo_says_did_you_mean():
    with pytest.raises(ValueError) as err:
        IMPALAConfig().rl_module(model_config={"fcnet_hidden": [8]})
    message = str(err.value)
    assert "did you mean 'fcnet_hiddens'" in message and "valid keys" not in message, message
    with pytest.raises(ValueError, match="valid keys: .*'use_lstm'"):
        IMPALAConfig().rl_module(model_config={"zzzz": 1})
