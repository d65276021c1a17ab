"""The run directory: checkpoint listing and rotation."""

from __future__ import annotations

from pathlib import Path

from impala_jax.cli import run_dir


def test_checkpoint_pruning(tmp_path):
    class FakeAlgo:
        def save(self, path):
            Path(path).mkdir()
            (Path(path) / "state.json").write_text("{}")
            return str(path)

    for i in (2, 4, 6, 8):
        run_dir.save_checkpoint(FakeAlgo(), tmp_path, i, keep=3)
    (tmp_path / ".checkpoint_000010.tmp-x").mkdir()  # a save cut short: never listed
    assert [i for i, _ in run_dir.checkpoints(tmp_path)] == [4, 6, 8]
