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

from impala_jax import checkpoint, run
from impala_jax.checkpoint import CorruptCheckpoint
from impala_jax.run_dir import checkpoints
from tests.test_algorithm import small_config
from tests.test_run import CARTPOLE, TINY, results


def _largest_array_file(path: Path) -> Path:
    files = [p for p in (path / checkpoint.ARRAYS_DIR).rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def _truncate(path: Path) -> Path:
    target = _largest_array_file(path)
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
    target = _largest_array_file(path)
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


class _BrokenCheckpointer:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def save(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error (orbax)")


def _inject(patch, fault: str, where: Path) -> None:
    if fault == "no_space":
        patch.setattr(checkpoint.os, "fsync", _fail_fsync)
    elif fault == "permission":

        def denied(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(where))

        patch.setattr(tempfile, "mkdtemp", denied)
    else:
        patch.setattr(checkpoint, "_local_checkpointer", _BrokenCheckpointer)


def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    with small_config().build() as algo:
        algo.train()
        path = Path(algo.save(tmp_path / "checkpoint"))
        before = algo.get_state()
        for fault in ("no_space", "permission", "orbax_io"):
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
    real = run.save_checkpoint

    def flaky(algo, run_dir, iteration, keep):
        calls.append(iteration)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(algo, run_dir, iteration, keep)

    monkeypatch.setattr(run, "save_checkpoint", flaky)
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
