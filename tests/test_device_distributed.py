"""The on-device engine over two JAX processes on 127.0.0.1 (gloo collectives, one CPU device
each): the same updates and episodes as one process with two devices, a checkpoint restored on
both, and an unchanged gymnax experiment through the command line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.device_distributed_worker import ITERATIONS, KEYS
from tests.test_distributed import REPO, _env, _free_port, _kill, _start, _wait

WORKER = [sys.executable, "-m", "tests.device_distributed_worker"]


def _leaves(got) -> list[np.ndarray]:
    names = sorted((k for k in got.files if k.startswith("arr_")), key=lambda k: int(k[4:]))
    return [got[k] for k in names]


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_two_processes_on_device_equal_one_process_with_two_devices(tmp_path):
    """Two processes of one device each (env i made by the process whose device holds it,
    episodes gathered from both) against one process of two devices, run side by side: the
    same params after the updates (policy lag 1 and mixin replay included) and the same
    episodes each iteration, on both processes."""
    coordinator = f"127.0.0.1:{_free_port()}"
    commands = [WORKER + [str(tmp_path / f"out_{i}.npz"), coordinator, "2", str(i)] for i in (0, 1)]
    procs = _start(commands, _env(), tmp_path / "logs")
    one_env = _env() | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs += _start([WORKER + [str(tmp_path / "one.npz")]], one_env, tmp_path / "logs_one")
    try:
        _wait(procs[:2], tmp_path / "logs")
        _wait(procs[2:], tmp_path / "logs_one")
    finally:
        _kill(procs)
    with np.load(tmp_path / "one.npz") as one:
        expected, params = {k: one[k] for k in one.files}, _leaves(one)
    assert len(expected["num_episodes"]) == ITERATIONS and expected["num_episodes"].sum() > 0
    for i in (0, 1):
        with np.load(tmp_path / f"out_{i}.npz") as got:
            for a, b in zip(_leaves(got), params, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
            for key in (*KEYS, "num_env_steps_sampled_lifetime", "evaluation"):
                np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
            # The checkpoint process 0 wrote, restored on both after one more iteration; an
            # iteration after the restore (fresh envs over both processes) ran.
            restored = [got[f"restored_{j}"] for j in range(len(params))]
            for a, b in zip(_leaves(got), restored, strict=True):
                np.testing.assert_array_equal(a, b)
            assert got["after_restore"] > got["num_episodes"].sum()
    assert (tmp_path / "checkpoint" / "state.json").is_file()


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_an_unchanged_gymnax_experiment_runs_on_two_processes_from_the_command_line(tmp_path):
    """experiments/cartpole_gymnax.py as it is (num_learners=0: one device per process), on two
    processes for a short budget; process 0 writes the run directory."""
    coordinator = f"127.0.0.1:{_free_port()}"
    logdir = tmp_path / "runs"
    experiment = str(REPO / "experiments" / "cartpole_gymnax.py")
    commands = [
        [sys.executable, "-m", "impala_jax.run", experiment, "--logdir", str(logdir)]
        + ["--stop", "num_env_steps_sampled_lifetime=20000", "--compile-cache", "none"]
        + ["--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]
        for i in (0, 1)
    ]
    procs = _start(commands, _env(), tmp_path / "logs")
    try:
        _wait(procs, tmp_path / "logs")
    finally:
        _kill(procs)
    (run_dir,) = logdir.iterdir()
    results = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    last = results[-1]
    assert last["num_env_steps_sampled_lifetime"] >= 20000
    # One update: 256 envs split over the two processes' devices, two fragments of T=10 each.
    assert last["num_env_steps_sampled_lifetime"] % 5120 == 0
    assert last["num_episodes_lifetime"] > 0
