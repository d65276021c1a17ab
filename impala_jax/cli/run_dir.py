"""The run directory: creating it, params.json and run.json, checkpoints and their rotation,
resuming."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from impala_jax.cli import loggers
from impala_jax.cli.errors import RunError, one_line
from impala_jax.runtime.process.atomic import write_atomic

RUN_FILE = "run.json"
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")


def new_run_dir(logdir: str, name: str) -> Path:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = Path(logdir) / f"{name}_{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}_{n}"), n + 1
    run_dir.mkdir(parents=True)
    return run_dir


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(loggers.json_safe(value), indent=1) + "\n")


def write_run_files(run_dir: Path, config, record: dict) -> None:
    """params.json (the resolved config) and run.json (how the run was started)."""
    write_json(run_dir / loggers.PARAMS_FILE, config.to_dict())
    write_json(run_dir / RUN_FILE, record)


def checkpoint_path(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / f"checkpoint_{iteration:06d}"


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run directory, oldest first."""
    from impala_jax.runtime.process.checkpoint import STATE_FILE

    found = []
    for path in Path(run_dir).iterdir() if Path(run_dir).is_dir() else ():
        match = CHECKPOINT_RE.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(algo, run_dir: Path, iteration: int, keep: int) -> Path:
    """Saves ``checkpoint_NNNNNN`` and deletes all but the newest ``keep`` checkpoints."""
    path = Path(algo.save(checkpoint_path(run_dir, iteration)))
    for _, old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


class CheckpointFailed(RuntimeError):
    """A checkpoint could not be written and --on-checkpoint-error says stop."""


def checkpoint_or_warn(
    algo,
    run_dir: Path,
    iteration: int,
    keep: int,
    on_error: str,
    warn: Callable[[str], None],
    final: bool = False,
) -> Path | None:
    """Saves checkpoint ``iteration`` (``save_checkpoint``); on a failure (the previous
    checkpoint stays intact, as checkpoint.save writes beside it and renames) calls ``warn`` and
    returns None, or raises CheckpointFailed, as ``on_error`` ("warn" or "stop",
    --on-checkpoint-error) says. The ``final`` save always raises."""
    try:
        return save_checkpoint(algo, run_dir, iteration, keep)
    except Exception as err:  # OSError (ENOSPC, EACCES, EIO), numpy's errors, ...
        found = checkpoints(run_dir)
        previous = f"the newest intact one is {found[-1][1]}" if found else "there is none yet"
        what = (
            f"checkpoint {checkpoint_path(run_dir, iteration)} could not be written "
            f"({type(err).__name__}: {err}); {previous}"
        )
        if final or on_error == "stop":
            resume = f"; resume with: python -m impala_jax.run --resume {run_dir}" if found else ""
            raise CheckpointFailed(f"{what}; the run stopped{resume}") from err
        warn(
            f"warning: {what}. Training goes on and the next save tries again "
            "(--on-checkpoint-error stop stops the run instead)."
        )
        return None


def intact(checkpoint: Path) -> str | None:
    """None when ``checkpoint`` reads back as written, else why not (naming the file)."""
    from impala_jax.runtime.process.checkpoint import STATE_FILE, CorruptCheckpoint, verify

    try:
        verify(checkpoint)
        json.loads((checkpoint / STATE_FILE).read_text())["config"]
    except CorruptCheckpoint as err:
        return str(err)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{checkpoint / STATE_FILE} does not read ({type(err).__name__}: {err})"
    return None


def resume_point(run_dir: Path) -> tuple[dict, Path]:
    """The run record of ``run_dir`` and its newest intact checkpoint, for ``--resume``;
    a newer one that is damaged is skipped with a note on stderr saying why."""
    if not (run_dir / RUN_FILE).is_file():
        raise RunError(f"--resume {run_dir}: not a run directory (no {RUN_FILE})")
    record = json.loads((run_dir / RUN_FILE).read_text())
    found = checkpoints(run_dir)
    if not found:
        raise RunError(f"--resume {run_dir}: no checkpoint to resume from")
    problems = []
    for _, path in reversed(found):
        problem = intact(path)
        if problem is None:
            for note in problems:
                print(f"impala_jax.run: skipped a damaged checkpoint: {note}", file=sys.stderr)
            return record, path
        problems.append(problem)
    raise RunError(
        f"--resume {run_dir}: no intact checkpoint to resume from; " + "; ".join(problems)
    )


def checkpoint_config(checkpoint: Path):
    """The IMPALAConfig a checkpoint was saved with."""
    from impala_jax.rllib.config import IMPALAConfig
    from impala_jax.runtime.process.checkpoint import STATE_FILE

    meta = json.loads((checkpoint / STATE_FILE).read_text())
    try:
        return IMPALAConfig.from_dict(meta["config"])
    except (ValueError, TypeError) as err:
        raise RunError(f"checkpoint {checkpoint}: config does not load: {one_line(err)}") from err


def checkpoint_steps(checkpoint: Path | None) -> int | None:
    """The env steps sampled that ``checkpoint`` holds (None without a readable one)."""
    from impala_jax.runtime.process.checkpoint import STATE_FILE

    try:
        meta = json.loads((Path(checkpoint) / STATE_FILE).read_text())
        return int(meta["counters"]["num_env_steps_sampled_lifetime"])
    except (TypeError, OSError, ValueError, KeyError):
        return None
