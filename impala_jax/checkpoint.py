"""Checkpoints: arrays through orbax, config and counters as JSON; nothing pickled.

A checkpoint is a directory ``arrays/`` (orbax) + ``state.json``. It is written into a
temporary sibling directory and renamed into place at the end, so a process killed during a
save leaves the previous checkpoint (or none), never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "impala_jax/1"
STATE_FILE = "state.json"
ARRAYS_DIR = "arrays"


def save(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; a checkpoint is an ordinary directory
    try:
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp / ARRAYS_DIR, arrays)
            ckptr.wait_until_finished()
        with open(tmp / STATE_FILE, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    if not path.exists():
        # A kill between the two renames of save() leaves the previous checkpoint here.
        previous = sorted(path.parent.glob(f".{path.name}.old-*"))
        if previous:
            path = previous[-1]
    if not (path / STATE_FILE).is_file() or not (path / ARRAYS_DIR).is_dir():
        raise FileNotFoundError(
            f"{path} is not an impala_jax checkpoint (expected {STATE_FILE} and {ARRAYS_DIR}/ "
            "inside it); give the directory that save() returned."
        )
    try:
        with open(path / STATE_FILE) as f:
            meta = json.load(f)
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
        with ocp.StandardCheckpointer() as ckptr:
            arrays = ckptr.restore(path / ARRAYS_DIR)
    except Exception as err:
        raise ValueError(
            f"{path} is not a readable impala_jax checkpoint ({type(err).__name__}: {err}); "
            "it is corrupt or was written by another program. Restore an older checkpoint."
        ) from err
    return {k: np.asarray(v) for k, v in arrays.items()}, meta


def jsonable(value: Any):
    """A config dict as JSON: a class or function env is stored by its import path."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if callable(value):
        return f"{value.__module__}:{value.__qualname__}"
    return value
