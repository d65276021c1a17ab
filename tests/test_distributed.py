"""Two JAX processes on 127.0.0.1 (gloo collectives): a psum across them, and one learner update
over both with half the batch each equal to the one-process update on the whole batch."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.test_learner import make_learner, random_batch

REPO = Path(__file__).resolve().parents[1]
PROCESS_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        PYTHONPATH=str(REPO),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        # gRPC must talk to the coordinator directly, never through a proxy.
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def _start(commands: list[list[str]], env: dict, logs: Path) -> list[subprocess.Popen]:
    """One process per command, output to logs/process_I.log."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, cmd in enumerate(commands):
        with open(logs / f"process_{i}.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
                )
            )
    return procs


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait(procs, logs: Path, timeout_s: float = PROCESS_TIMEOUT_S) -> list[str]:
    """Waits for every process (hard timeout); their outputs. Fails on a non-zero exit."""
    outputs = []
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"process {i} did not finish in {timeout_s} s")
        output = (logs / f"process_{i}.log").read_text()
        assert proc.returncode == 0, f"process {i}:\n{output[-4000:]}"
        outputs.append(output)
    return outputs


def _worker(mode: str, n: int, coordinator: str, out: Path) -> list[list[str]]:
    base = [sys.executable, "-m", "tests.distributed_worker", mode, coordinator, str(n)]
    return [base + [str(i), str(out / f"out_{i}.npz")] for i in range(n)]


def _run_processes(mode: str, tmp_path: Path, n: int = 2) -> list[Path]:
    """Runs `n` workers to the end (hard timeout, every one killed in the end); their outputs."""
    commands = _worker(mode, n, f"127.0.0.1:{_free_port()}", tmp_path)
    procs = _start(commands, _env(), tmp_path / "logs")
    try:
        _wait(procs, tmp_path / "logs")
    finally:
        _kill(procs)
    return [tmp_path / f"out_{i}.npz" for i in range(n)]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_psum_across_two_processes(tmp_path):
    for out in _run_processes("psum", tmp_path):
        with np.load(out) as got:
            np.testing.assert_array_equal(got["total"], [3.0])  # 1 + 2, on each process
            big = [[3_000_000_000, -(2**40)], [3_000_000_001, -(2**40)]]
            np.testing.assert_array_equal(got["counts"], big)
            assert got["counts"].dtype == np.int64


def test_int64_travels_as_exact_int32_words():
    from impala_jax.runtime.process import collectives

    values = np.array([0, 1, 2**31 - 1, 2**31, 3_000_000_123, 2**61 + 5, -7, -(2**40)], np.int64)
    words = collectives.to_int32_words(values)
    assert words.dtype == np.int32 and words.shape == (8, 2)
    np.testing.assert_array_equal(collectives.from_int32_words(words), values)
    with pytest.raises(OverflowError):
        collectives.to_int32_words(np.array([2**62]))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_learner_update_over_two_processes_equals_one_process(tmp_path):
    outs = _run_processes("update", tmp_path)
    reference = make_learner(1)
    for seed in range(2):
        metrics = reference.update(reference.put_batch(random_batch(seed)), env_steps=0)
    expected = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(reference.state.params))]
    for out in outs:
        with np.load(out) as got:
            leaves = [got[f"arr_{i}"] for i in range(len(expected))]
            for a, b in zip(leaves, expected, strict=True):
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
            np.testing.assert_allclose(got["total_loss"], metrics["total_loss"], rtol=1e-5)
            # Adam hardly reacts to a gradient N times too large; the gradient's norm does.
            name = "gradients_default_optimizer_global_norm"
            np.testing.assert_allclose(got["grad_norm"], metrics[name], rtol=1e-5)


def test_initialize_checks_its_arguments_and_defaults_to_one_process():
    code = """
import json
import os
import signal
from impala_jax.runtime.process import distributed, roles
for args, needle in [
    (("nohost", 2, 0), "HOST:PORT"),
    (("127.0.0.1:1234", 2, 5), "process_id=5 must be in [0, 2)"),
    (("127.0.0.1:1234", 0, 0), "num_processes=0 must be >= 1"),
    (("127.0.0.1:1234", None, 0), "needs all of"),
]:
    try:
        distributed.initialize(*args)
    except ValueError as err:
        assert needle in str(err), (args, err)
    else:
        raise AssertionError(args)
try:
    distributed.initialize("127.0.0.1:1234", 2, 0, collective_timeout_s=0)
except ValueError as err:
    assert "collective_timeout_s=0 must be > 0" in str(err), err
else:
    raise AssertionError("collective_timeout_s=0")
os.environ["IMPALA_JAX_NUM_PROCESSES"] = "two"
try:
    distributed.initialize()
except ValueError as err:
    assert "IMPALA_JAX_NUM_PROCESSES='two'" in str(err), err
del os.environ["IMPALA_JAX_NUM_PROCESSES"]
assert distributed.initialize() == 1  # no cluster found: one process
import jax
assert jax.process_count() == 1 and roles.is_primary()
assert distributed.initialize() == 1  # nothing to join: a JAX program calling the CLI's main
try:
    distributed.initialize("127.0.0.1:1234", 2, 0)
except RuntimeError as err:
    assert "before anything uses JAX" in str(err)
else:
    raise AssertionError("initialize after JAX started")
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI", "PMI"))}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["lockstep", "threads"])
@pytest.mark.slow
def test_training_over_two_processes_keeps_them_identical_and_counts_both(tmp_path, mode):
    a, b = (np.load(out) for out in _run_processes(mode, tmp_path))
    with a, b:
        # Process 1 alone would end each iteration after one update (min_time 0): it ran as
        # many as process 0 decided.
        np.testing.assert_array_equal(a["updates"], b["updates"])
        assert a["updates"][1] - a["updates"][0] > 1  # the second iteration, compiled
        params = sorted(k for k in a.files if k.startswith("arr_"))
        assert params
        for name in params:
            np.testing.assert_array_equal(a[name], b[name])
            # The checkpoint process 0 wrote, restored on both after one more iteration.
            np.testing.assert_array_equal(a[name], a[name.replace("arr_", "saved_")])
        # Both restored process 0's checkpoint (its time_total_s, too).
        np.testing.assert_array_equal(a["restored_counters"], a["saved_counters"])
        np.testing.assert_array_equal(b["restored_counters"], a["saved_counters"])
        # Global counts: the same on both processes, summed over both.
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["num_episodes_lifetime"][-1] > 0
        if mode == "threads":  # process 0 evaluated; process 1 reports the same
            np.testing.assert_array_equal(a["evaluation_returns"], b["evaluation_returns"])
            assert a["evaluation_returns"][1] == 3
        if mode == "lockstep":  # each update: 2 learners x 32 env steps, half per process
            np.testing.assert_array_equal(a["num_env_steps_sampled_lifetime"], a["updates"] * 64)
    # Process 0 wrote the checkpoint, once.
    assert (tmp_path / "checkpoint" / "state.json").is_file()
    assert not list(tmp_path.glob(".checkpoint*"))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_runner_failure_in_one_process_stops_both_with_its_error(tmp_path):
    a, b = (np.load(out) for out in _run_processes("runner_failure", tmp_path))
    with a, b:
        assert "injected runner failure" in str(b["message"])  # process 1's own error
        # Process 0 was not left waiting in a collective: it stopped at the same update.
        message = str(a["message"])
        assert "process 1 of 2 could not produce its train batch" in message, message
        assert "injected runner failure" in message
        assert a["iteration"] == b["iteration"]


def _start_loop(tmp_path: Path, **env) -> list[subprocess.Popen]:
    """Two lockstep trainers that run until killed; returns once both finished 2 iterations."""
    commands = _worker("loop", 2, f"127.0.0.1:{_free_port()}", tmp_path)
    procs = _start(commands, _env() | env, tmp_path / "logs")
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    outs = [tmp_path / f"out_{i}.npz" for i in range(2)]
    while not all(out.exists() and len(out.read_text().split()) >= 2 for out in outs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = [(tmp_path / "logs" / f"process_{i}.log").read_text()[-2000:] for i in (0, 1)]
            _kill(procs)
            pytest.fail(f"the two trainers did not get going: {logs}")
        time.sleep(0.2)
    return procs


def _survivor_exit(proc: subprocess.Popen, log: Path, bound_s: float) -> tuple[int, float, str]:
    started = time.monotonic()
    try:
        proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the surviving process still runs {bound_s} s after its peer was lost")
    return proc.returncode, time.monotonic() - started, log.read_text()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [1, 0])
@pytest.mark.slow
def test_a_killed_process_ends_the_other_at_once_naming_it(tmp_path, victim):
    # A collective timeout of an hour: the survivor ends because it saw its peer go (the
    # messages below name that cause), not because a collective timed out; the bound on its
    # exit only bounds a hang.
    procs = _start_loop(tmp_path, COLLECTIVE_TIMEOUT_S="3600")
    try:
        procs[victim].send_signal(signal.SIGKILL)
        survivor = 1 - victim
        log = tmp_path / "logs" / f"process_{survivor}.log"
        rc, waited, output = _survivor_exit(procs[survivor], log, PROCESS_TIMEOUT_S)
        assert rc != 0, output[-3000:]
        if victim == 1:  # process 0 names it (PeerLost); the coordinator lives on in it
            assert "PeerLost" in output and "process 1 of 2 is gone" in output, output[-3000:]
            assert "--resume" in output
        else:  # the coordinator is gone: ours or JAX's own fatal error says so
            assert (
                "process 0 (the coordinator) cannot be reached" in output
                or "leader task was preempted/died" in output
            ), output[-3000:]
    finally:
        _kill(procs)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_hung_process_ends_the_other_through_the_watchdog_naming_it(tmp_path):
    # SIGSTOP: process 1 keeps its connections but never joins the next collective.
    procs = _start_loop(tmp_path, COLLECTIVE_TIMEOUT_S="4", HEARTBEAT_TIMEOUT_S="120")
    try:
        procs[1].send_signal(signal.SIGSTOP)
        rc, waited, output = _survivor_exit(procs[0], tmp_path / "logs" / "process_0.log", 60)
        assert rc == 1, output[-3000:]
        assert waited >= 3, waited  # not before its bound (4 s, from the wait's start)
        assert "process 1 (at collective" in output and "did not join for" in output, output
        assert "collective_timeout_s=4" in output
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        _kill(procs)


class _Progress:
    """The coordinator's key-value store as ``watchdog._behind`` reads it: process 1 at
    collective 7, its post number frozen (``live=False``) or advancing with every read."""

    def __init__(self, live: bool):
        self.live, self.posts = live, 40

    def key_value_try_get(self, key: str) -> str:
        assert key.endswith("/1"), key
        self.posts += self.live
        return f"7 {self.posts}"


@pytest.mark.parametrize("live", [False, True])
def test_a_process_stopped_inside_the_same_collective_is_named(monkeypatch, live):
    # SIGSTOP can land while the victim waits inside the very collective this process times
    # out in: its count equals ours, and only its silence tells it apart.
    from types import SimpleNamespace

    from impala_jax.runtime.process import roles, watchdog

    monkeypatch.setattr(roles, "client", lambda: _Progress(live))
    monkeypatch.setattr(roles, "process_count", lambda: 2)
    monkeypatch.setattr(roles, "process_index", lambda: 0)
    monkeypatch.setattr(watchdog.Run, "watchdog", SimpleNamespace(count=7))
    monkeypatch.setattr(watchdog, "_SILENT_S", 0.01)
    named = watchdog._behind()
    if live:
        assert named == "some process"
    else:
        assert named.startswith("process 1 (at collective 7, this one at 7; no progress"), named


class _SlowPosts:
    """A client whose key_value_set takes 0.3 s; records whether a post overlapped shutdown."""

    def __init__(self):
        self.in_flight = 0
        self.after_stop = 0
        self.stopped = False

    def key_value_set(self, key: str, value: str, allow_overwrite: bool) -> None:
        self.in_flight += 1
        self.after_stop += self.stopped
        time.sleep(0.3)
        self.in_flight -= 1


def test_the_exit_stops_the_watchdog_before_jax_shuts_its_client(monkeypatch):
    # A post still in flight when JAX's shutdown frees the client aborted process 0 from C++
    # ('terminate called after throwing', about 1 run in 13 on a loaded machine).
    from impala_jax.runtime.process import distributed, roles
    from impala_jax.runtime.process.watchdog import Run, Watchdog

    client = _SlowPosts()
    monkeypatch.setattr(roles, "client", lambda: client)
    monkeypatch.setattr(roles, "process_index", lambda: 0)
    watchdog = Watchdog()
    monkeypatch.setattr(Run, "watchdog", watchdog)
    monkeypatch.setattr(Run, "peer_lost", True)  # the barrier itself is skipped
    deadline = time.monotonic() + 5
    while client.in_flight == 0 and time.monotonic() < deadline:  # stop during a post
        time.sleep(0.01)
    distributed._exit_barrier()
    assert not watchdog._thread.is_alive() and client.in_flight == 0
    client.stopped = True
    time.sleep(1.2)  # two posting periods
    assert client.after_stop == 0


def _cli(tmp_path: Path, coordinator: str, *args: str) -> list[list[str]]:
    small = [
        "learners.num_learners=2",
        "env_runners.num_envs_per_env_runner=16",
        "training.train_batch_size_per_learner=160",
        "training.minibatch_size=160",
    ]
    return [
        [sys.executable, "-m", "impala_jax.run", *args, *small, "--coordinator", coordinator]
        + ["--num-processes", "2", "--process-id", str(i), "--compile-cache", "none"]
        for i in range(2)
    ]


def _results(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_cli_over_two_processes_killed_and_resumed(tmp_path):
    """Process 0 alone writes the run directory and prints; a killed process ends the other
    with its name; --resume on both goes on from the newest checkpoint."""
    logdir = tmp_path / "runs"
    experiment = str(REPO / "experiments" / "cartpole.py")
    first = _cli(tmp_path, f"127.0.0.1:{_free_port()}", experiment, "--logdir", str(logdir))
    first = [cmd + ["--stop", "training_iteration=1000", "--checkpoint-freq", "1"] for cmd in first]
    procs = _start(first, _env(), tmp_path / "logs")
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while not list(logdir.glob("*/checkpoint_000002")):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail((tmp_path / "logs" / "process_0.log").read_text()[-3000:])
            time.sleep(0.2)
        procs[1].kill()
        # The message names the lost peer: the survivor did not wait for a timeout.
        log = tmp_path / "logs" / "process_0.log"
        rc, _, output = _survivor_exit(procs[0], log, PROCESS_TIMEOUT_S)
        assert rc == 1 and "process 1 of 2 is gone" in output, output[-3000:]
    finally:
        _kill(procs)
    (run_dir,) = logdir.iterdir()  # one run directory, process 0's
    silent = (tmp_path / "logs" / "process_1.log").read_text()
    assert "iter " not in silent and "run directory" not in silent, silent
    newest = max(int(p.name.split("_")[1]) for p in run_dir.glob("checkpoint_*"))
    with open(run_dir / f"checkpoint_{newest:06d}" / "state.json") as f:
        saved = json.load(f)["counters"]

    second = _cli(tmp_path, f"127.0.0.1:{_free_port()}", "--resume", str(run_dir))
    second = [cmd + ["--stop", f"training_iteration={newest + 2}"] for cmd in second]
    procs = _start(second, _env(), tmp_path / "logs_resumed")
    try:
        outputs = _wait(procs, tmp_path / "logs_resumed")
    finally:
        _kill(procs)
    assert f"resumed from {run_dir / f'checkpoint_{newest:06d}'}" in outputs[0]
    assert "iter " not in outputs[1]
    results = _results(run_dir)
    iterations = [r["training_iteration"] for r in results]
    assert iterations == list(range(1, newest + 3)), iterations  # no duplicate, none lost
    resumed = results[newest:]
    assert resumed[0]["num_env_steps_sampled_lifetime"] > saved["num_env_steps_sampled_lifetime"]
    assert resumed[0]["num_episodes_lifetime"] >= saved["num_episodes_lifetime"]
    assert list(logdir.iterdir()) == [run_dir]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_processes_that_built_different_configs_refuse_to_start(tmp_path):
    for out in _run_processes("mismatch", tmp_path):
        with np.load(out) as got:
            message = str(got["error"])
        assert "built different configs" in message and "lr: process 0: 0.001" in message
        assert "process 1: 0.0003" in message and "min_time_s_per_iteration" not in message
