"""Checkpoints on a bad disk: a save that fails half way leaves the previous checkpoint, a
damaged checkpoint is refused naming the file, and the CLI's --resume skips it (issue 15)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from impala_jax import run
from impala_jax.cli import run_dir as cli_run_dir
from impala_jax.cli.run_dir import checkpoints
from impala_jax.runtime.process import checkpoint
from impala_jax.runtime.process.checkpoint import CorruptCheckpoint
from tests.test_algorithm import small_config
from tests.test_run import CARTPOLE, TINY, results


def _truncate(path: Path) -> Path:
    target = path / checkpoint.ARRAYS_FILE
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


def _edit_state(path: Path) -> Path:
    target = path / checkpoint.STATE_FILE
    state = json.loads(target.read_text())
    state["counters"]["num_env_steps_sampled_lifetime"] += 1000  # still valid JSON
    target.write_text(json.dumps(state))
    return target


def _remove(path: Path) -> Path:
    target = path / checkpoint.ARRAYS_FILE
    target.unlink()
    return target


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    with small_config().build() as algo:
        algo.train()
        path = Path(algo.save(root / "checkpoint"))
        state = algo.get_state()
    return path, state


@pytest.mark.parametrize("damage", [_truncate, _edit_state, _remove])
def test_a_damaged_checkpoint_is_refused_naming_the_file(saved, tmp_path, damage):
    path, _ = saved
    copy = tmp_path / "checkpoint"
    os.system(f"cp -r {path} {copy}")
    checkpoint.verify(copy)  # the copy is intact
    target = damage(copy)
    with pytest.raises(CorruptCheckpoint) as info:
        checkpoint.load(copy)
    assert str(target) in str(info.value), info.value
    if damage is _truncate:  # and through the algorithm's restore (once: a build costs)
        with small_config().build() as algo, pytest.raises(ValueError, match=str(target.name)):
            algo.restore(copy)


def _fail_fsync(fd):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_savez(file, *args, **kwargs):
    file.write(b"PK\x03\x04 half an npz")  # half written, then the disk fails
    raise OSError(errno.EIO, "Input/output error")


def _inject(patch, fault: str, where: Path) -> None:
    if fault == "no_space":
        patch.setattr(checkpoint.os, "fsync", _fail_fsync)
    elif fault == "permission":

        def denied(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(where))

        patch.setattr(tempfile, "mkdtemp", denied)
    else:
        patch.setattr(checkpoint.np, "savez", _fail_savez)


def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    with small_config().build() as algo:
        algo.train()
        path = Path(algo.save(tmp_path / "checkpoint"))
        before = algo.get_state()
        for fault in ("no_space", "permission", "io_error"):
            algo.train()
            with monkeypatch.context() as patch:
                _inject(patch, fault, tmp_path)
                with pytest.raises(OSError):
                    algo.save(path)
            # The previous checkpoint is intact and loads; nothing is left beside it.
            checkpoint.verify(path)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"], fault
            algo.restore(path)
            after = algo.get_state()
            assert after["counters"] == before["counters"], fault
            for a, b in zip(before["learner"], after["learner"], strict=True):
                np.testing.assert_array_equal(a, b)


def _cli(tmp_path, *extra):
    return [CARTPOLE, *TINY, "--logdir", str(tmp_path), "--quiet", *extra]


@pytest.mark.timeout(300)
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, capsys):
    argv = _cli(tmp_path, "--stop", "training_iteration=3", "--checkpoint-freq", "1")
    assert run.main(argv) == 0
    (run_dir,) = tmp_path.iterdir()
    newest = checkpoints(run_dir)[-1][1]
    assert newest.name == "checkpoint_000003"
    damaged = _truncate(newest)
    capsys.readouterr()
    assert run.main(["--resume", str(run_dir), "--stop", "training_iteration=5", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "skipped a damaged checkpoint" in err and str(damaged) in err, err
    iterations = [r["training_iteration"] for r in results(run_dir)]
    assert iterations == [1, 2, 3, 4, 5]  # resumed from 2; the first life's 3 was dropped


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_a_checkpoint_that_cannot_be_written_warns_or_stops(tmp_path, monkeypatch, capsys, policy):
    calls = []
    real = cli_run_dir.save_checkpoint

    def flaky(algo, run_dir, iteration, keep):
        calls.append(iteration)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(algo, run_dir, iteration, keep)

    monkeypatch.setattr(cli_run_dir, "save_checkpoint", flaky)
    argv = _cli(tmp_path, "--stop", "training_iteration=4", "--checkpoint-freq", "1")
    code = run.main([*argv, "--on-checkpoint-error", policy])
    err = capsys.readouterr().err
    (run_dir,) = tmp_path.iterdir()
    assert "checkpoint_000002 could not be written (OSError: [Errno 28] No space left" in err
    assert "the newest intact one is" in err and "checkpoint_000001" in err, err
    if policy == "warn":
        assert code == 0 and "Training goes on" in err
        assert [i for i, _ in checkpoints(run_dir)] == [1, 3, 4]
    else:
        assert code == 1 and "the run stopped; resume with" in err
        assert [i for i, _ in checkpoints(run_dir)] == [1]


def _as_format_1(path: Path) -> None:
    """Rewrites a checkpoint as format 1 wrote it: the arrays in an orbax directory."""
    import orbax.checkpoint as ocp

    arrays, _ = checkpoint.load(path)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path / checkpoint.ARRAYS_DIR, arrays)
        ckptr.wait_until_finished()
    (path / checkpoint.ARRAYS_FILE).unlink()
    state = json.loads((path / checkpoint.STATE_FILE).read_text())
    (path / checkpoint.STATE_FILE).write_text(json.dumps(dict(state, format="impala_jax/1")))
    manifest = json.loads((path / checkpoint.MANIFEST_FILE).read_text())
    manifest.update(format="impala_jax/1", files=checkpoint._manifest(path))
    (path / checkpoint.MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_format_1_orbax_checkpoint_still_restores(saved, tmp_path):
    path, state = saved
    old = tmp_path / "checkpoint"
    os.system(f"cp -r {path} {old}")
    _as_format_1(old)
    assert (old / checkpoint.ARRAYS_DIR).is_dir() and not (old / checkpoint.ARRAYS_FILE).exists()
    with small_config().build() as algo:
        algo.restore(old)
        again = algo.get_state()
    assert again["counters"] == state["counters"]
    for a, b in zip(state["learner"], again["learner"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_arrays_are_one_npz_that_loads_without_pickle_and_keeps_every_dtype(tmp_path):
    import ml_dtypes

    arrays = {
        "learner_00000": np.arange(6, dtype=np.float32).reshape(2, 3),
        "learner_00001": np.array([1.5, -2.25], ml_dtypes.bfloat16),  # npy stores raw bytes
        "learner_00002": np.array([2**40, 7], np.int64),
        "learner_00003": np.array(3, np.uint32),
        "replay_00000": np.zeros((0, 4), np.uint8),
    }
    path = checkpoint.save(tmp_path / "ck", arrays, {"format": checkpoint.FORMAT})
    assert sorted(p.name for p in path.iterdir()) == [
        checkpoint.ARRAYS_FILE,
        checkpoint.MANIFEST_FILE,
        checkpoint.STATE_FILE,
    ]
    with np.load(path / checkpoint.ARRAYS_FILE, allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(arrays)
    loaded, meta = checkpoint.load(path)
    assert meta["format"] == checkpoint.FORMAT
    for key, value in arrays.items():
        assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape, key
        np.testing.assert_array_equal(loaded[key], value)
    with pytest.raises(TypeError, match="'learner_00000' has dtype object"):
        checkpoint.save(tmp_path / "bad", {"learner_00000": np.array([None])}, {})
    assert not (tmp_path / "bad").exists()


def test_saving_and_loading_keeps_no_file_or_thread(tmp_path):
    """Format 1's orbax save kept 15-30 KiB per save for good: the process's resident memory
    is measured by the soak (make soak), over a long run in a process of its own. Here: 100
    saves and loads leave no open file, no thread and nothing but the checkpoint on disk."""
    import threading

    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    rng = np.random.default_rng(0)
    arrays = {f"learner_{i:05d}": rng.standard_normal((64, 64), np.float32) for i in range(24)}
    meta = {"format": checkpoint.FORMAT, "counters": {}}
    checkpoint.load(checkpoint.save(tmp_path / "ck", arrays, meta))
    files, threads = open_files(), set(threading.enumerate())
    for _ in range(100):
        loaded, _ = checkpoint.load(checkpoint.save(tmp_path / "ck", arrays, meta))
    # Another test's leftover thread may end meanwhile; none may be added.
    assert not set(threading.enumerate()) - threads
    assert open_files() - files < 10  # a leak would leave one per save
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]
    assert sorted(loaded) == sorted(arrays)
