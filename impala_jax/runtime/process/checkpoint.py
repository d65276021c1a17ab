"""Checkpoints: arrays as one uncompressed ``.npz``, config and counters as JSON; nothing pickled.

A checkpoint is a directory ``arrays.npz`` + ``state.json``, and with
``checkpointing(export_native_model_files=True)`` also ``params.msgpack``: the policy's params
as a flax msgpack file that loads without impala_jax (``flax.serialization.msgpack_restore``).
It is written into a temporary sibling directory and renamed into place at the end, so a
process killed during a save leaves the previous checkpoint (or none), never a half-written one.
``manifest.json``, written last, holds every file's size and sha256: a load checks them, so a
truncated array file, an edited ``state.json`` or a missing file is refused with its name.

The arrays are host numpy arrays by the time they are saved (over several processes process 0
writes alone), so the file is numpy's own format, read back with ``allow_pickle=False``.
Format 1 kept them in an orbax directory ``arrays/``; such checkpoints still load (through
orbax). Orbax was dropped for writing because every save kept memory inside orbax/tensorstore
for the life of the process (benchmarks/README.md, "Soak"); an npz save keeps nothing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "impala_jax/2"
READABLE_FORMATS = ("impala_jax/1", FORMAT)  # 1: arrays in an orbax directory ARRAYS_DIR
STATE_FILE = "state.json"
ARRAYS_FILE = "arrays.npz"
ARRAYS_DIR = "arrays"
NATIVE_PARAMS_FILE = "params.msgpack"
MANIFEST_FILE = "manifest.json"


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files are not the ones save() wrote (the message names the file)."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under ``root`` but the manifest."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_FILE:
            files[rel] = [path.stat().st_size, _digest(path)]
    return files


def _array_specs(path: Path) -> dict[str, list] | None:
    """{key: [shape, dtype name]} as save() recorded them in the manifest, or None."""
    try:
        return json.loads((path / MANIFEST_FILE).read_text())["arrays"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _restore_target(path: Path) -> dict[str, np.ndarray] | None:
    """Zero arrays of the shapes and dtypes save() recorded in the manifest, or None."""
    specs = _array_specs(path)
    if specs is None:
        return None
    try:
        return {k: np.zeros(tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in specs.items()}
    except (ValueError, TypeError):
        return None


def verify(path: str | os.PathLike) -> None:
    """Raises CorruptCheckpoint naming the first file that differs from what save() wrote.
    Checkpoints written before manifests existed pass unchecked."""
    path = Path(path)
    manifest = path / MANIFEST_FILE
    if not manifest.is_file():
        return
    try:
        expected = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpoint(
            f"{manifest} is corrupt ({err}): the checkpoint cannot be checked"
        ) from err
    for rel, (size, digest) in expected.items():
        file = path / rel
        if not file.is_file():
            raise CorruptCheckpoint(f"{file} is missing (the checkpoint listed it when written)")
        actual = file.stat().st_size
        if actual != size:
            raise CorruptCheckpoint(f"{file} has {actual} bytes, {size} were written: truncated")
        if _digest(file) != digest:
            raise CorruptCheckpoint(f"{file} differs from what was written (sha256 mismatch)")


def native_params(params) -> bytes:
    """The params pytree as flax msgpack bytes (``export_native_model_files``)."""
    from flax import serialization

    return serialization.msgpack_serialize(
        serialization.to_state_dict(jax_to_numpy(params)), in_place=True
    )


def load_native_params(path: str | os.PathLike, target=None):
    """The params of ``path/params.msgpack`` (a checkpoint directory or the file itself): a
    nested dict of numpy arrays, or ``target``'s structure filled in when given."""
    from flax import serialization

    path = Path(path)
    if path.is_dir():
        path = path / NATIVE_PARAMS_FILE
    data = path.read_bytes()
    if target is None:
        return serialization.msgpack_restore(data)
    return serialization.from_bytes(target, data)


def jax_to_numpy(tree):
    import jax

    return jax.tree.map(np.asarray, jax.device_get(tree))


def _write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for key, value in arrays.items():
        if value.dtype.hasobject:  # np.savez would pickle it
            raise TypeError(f"checkpoint array {key!r} has dtype {value.dtype}: not saveable")
    with open(path, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())


def _read_arrays(path: Path, specs: dict | None) -> dict[str, np.ndarray]:
    """The arrays of an ``arrays.npz``; a dtype numpy's format cannot name (bfloat16 and the
    other ml_dtypes come back as raw bytes) takes the dtype the manifest recorded."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for key, (_, dtype) in (specs or {}).items():
        if key in arrays and arrays[key].dtype.name != dtype:
            arrays[key] = arrays[key].view(np.dtype(dtype))
    return arrays


def _read_orbax_arrays(path: Path) -> dict[str, np.ndarray]:
    """Format 1's ``arrays/`` directory."""
    target = _restore_target(path)
    with _local_checkpointer() as ckptr:
        # With a target of the saved shapes orbax reads no tree metadata, which each restore
        # would otherwise keep in memory. Checkpoints written before the manifest recorded
        # shapes have none.
        arrays = ckptr.restore(path / ARRAYS_DIR, target)
    return {k: np.asarray(v) for k, v in arrays.items()}


def _local_checkpointer():
    """orbax's checkpointer (format 1's reader) for this process alone: over several processes
    (distributed.py) process 0 reads checkpoints by itself, with no barrier on the others."""
    import jax
    import orbax.checkpoint as ocp

    me = jax.process_index()
    options = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    return ocp.StandardCheckpointer(multiprocessing_options=options)


def save(
    path: str | os.PathLike,
    arrays: dict[str, np.ndarray],
    meta: dict,
    files: dict[str, bytes] | None = None,
) -> Path:
    """Writes a checkpoint atomically; ``files`` are extra files (name -> bytes) inside it."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; a checkpoint is an ordinary directory
    try:
        _write_arrays(tmp / ARRAYS_FILE, arrays)
        with open(tmp / STATE_FILE, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        for name, data in (files or {}).items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        specs = {k: [list(np.shape(v)), np.asarray(v).dtype.name] for k, v in arrays.items()}
        with open(tmp / MANIFEST_FILE, "w") as f:
            json.dump({"format": FORMAT, "files": _manifest(tmp), "arrays": specs}, f, indent=1)
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
    path = Path(path).absolute()
    if not path.exists():
        # A kill between the two renames of save() leaves the previous checkpoint here.
        previous = sorted(path.parent.glob(f".{path.name}.old-*"))
        if previous:
            path = previous[-1]
    npz, orbax = path / ARRAYS_FILE, path / ARRAYS_DIR
    not_one = FileNotFoundError(
        f"{path} is not an impala_jax checkpoint (expected {STATE_FILE} and {ARRAYS_FILE} "
        "inside it); give the directory that save() returned."
    )
    if not (path / STATE_FILE).is_file():
        raise not_one
    verify(path)  # names a listed file that is missing
    if not (npz.is_file() or orbax.is_dir()):
        raise not_one
    try:
        with open(path / STATE_FILE) as f:
            meta = json.load(f)
        if meta.get("format") not in READABLE_FORMATS:
            raise ValueError(
                f"format {meta.get('format')!r}, expected one of {list(READABLE_FORMATS)}"
            )
        if npz.is_file():
            arrays = _read_arrays(npz, _array_specs(path))
        else:
            arrays = _read_orbax_arrays(path)
    except Exception as err:
        raise ValueError(
            f"{path} is not a readable impala_jax checkpoint ({type(err).__name__}: {err}); "
            "it is corrupt or was written by another program. Restore an older checkpoint."
        ) from err
    return arrays, _current_paths(meta)


# Where runtime/'s modules went when it was split into rooms (envs, acting, learning, ondevice,
# process); a checkpoint written before names a class by the old path.
_RUNTIME_ROOMS = {
    **{m: f"runtime.envs.{m}" for m in "vec_env env_registry jax_envs".split()},
    **{
        m: f"runtime.acting.{m}"
        for m in "env_runner env_runner_group evaluation host_actor network_factory".split()
    },
    "acting": "runtime.acting.policy",
    **{m: f"runtime.learning.{m}" for m in "learner buffers parallel program_cache".split()},
    "device_runner": "runtime.ondevice.device_engine",
    **{m: f"runtime.process.{m}" for m in "distributed jax_setup checkpoint import_path".split()},
}


def _runtime(m: str) -> str:
    return _RUNTIME_ROOMS.get(m, f"runtime.{m}")


# RLlib's surface that runtime/ held until its runners called episode hooks through a protocol
# (the callbacks classes, the MetricsLogger, the result dict), and what stayed in runtime/.
_RUNTIME_TO_RLLIB = {
    "callbacks": ("rllib.callbacks", "runtime.acting.user_code", "runtime.acting.episode_hooks"),
    "metrics_logger": ("rllib.metrics_logger", "runtime.metrics"),
    "metrics": ("runtime.metrics", "rllib.results"),
}


# impala_jax's modules before they were grouped into core/, runtime/, rllib/ and cli/, and where
# their names are now; a checkpoint written then names a class (a callbacks class) by the old path.
_MOVED_MODULES = {
    **{m: (f"core.{m}",) for m in "types vtrace losses distributions optim model_config".split()},
    **{
        m: (_runtime(m),)
        for m in "env_runner_group evaluation host_actor buffers distributed program_cache "
        "jax_setup checkpoint".split()
    },
    **_RUNTIME_TO_RLLIB,
    **{
        m: (f"rllib.{m}",) for m in "config model_config_checks specs checkpointable module".split()
    },
    **{m: (f"rllib.{m}",) for m in "ray_tune tune_hook".split()},
    **{m: (f"cli.{m}",) for m in "experiment sweep run_dir loggers display curve tfevents".split()},
    "networks": ("core.networks", "core.initializers"),
    "recurrent": ("core.recurrent", "core.policy"),
    "learner": (_runtime("learner"), "core.update", "core.losses"),
    "parallel": (_runtime("parallel"), "core.update"),
    "env_runner": (_runtime("env_runner"), "core.policy"),
    "envs": (_runtime("env_registry"), _runtime("vec_env")),
    "algorithm": ("rllib.algorithm", "rllib.diagnostics"),
    "config_checks": ("rllib.checks", "rllib.values", "rllib.model_config_checks", "rllib.specs"),
    "rllib_compat": ("rllib.compat", "rllib.compat_tables"),
    **{f"runtime.{m}": (new,) for m, new in _RUNTIME_ROOMS.items()},
    **{f"runtime.{m}": new for m, new in _RUNTIME_TO_RLLIB.items()},
}


def _current_paths(value: Any) -> Any:
    """`value` with every "impala_jax.<module>:<name>" of an earlier layout at its current path."""
    if isinstance(value, dict):
        return {k: _current_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_current_paths(v) for v in value]
    if isinstance(value, str) and value.startswith("impala_jax.") and ":" in value:
        module, _, name = value.partition(":")
        for new in _MOVED_MODULES.get(module[len("impala_jax.") :], ()):
            found = importlib.util.find_spec(f"impala_jax.{new}")
            if found is not None and hasattr(
                importlib.import_module(f"impala_jax.{new}"), name.split(".")[0]
            ):
                return f"impala_jax.{new}:{name}"
    return value


def jsonable(value: Any):
    """A config dict as JSON: a class or function env is stored by its import path."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if callable(value):
        module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if module and name:
            return f"{module}:{name}"
        # A functools.partial or a callable object has no import path: kept as its repr,
        # which from_checkpoint reports as a value it cannot import.
        return repr(value)
    return value


class Checkpoint:
    """A checkpoint directory, as RLlib's ``save()`` result names it (``.path``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"


class SaveResult:
    """What ``IMPALA.save()`` returns: RLlib's ``.checkpoint`` and ``.metrics``; also usable
    wherever a path is (``restore(result)``, ``Path(result)``, ``str(result)``)."""

    def __init__(self, checkpoint: Checkpoint, metrics: dict):
        self.checkpoint = checkpoint
        self.metrics = metrics

    def __fspath__(self) -> str:
        return self.checkpoint.path

    def __str__(self) -> str:
        return self.checkpoint.path

    def __repr__(self) -> str:
        return f"SaveResult(checkpoint={self.checkpoint!r})"


def path_of(checkpoint: Any) -> str:
    """The directory of a path, a ``Checkpoint`` (impala_jax's or Ray Tune's: ``.path``; a
    Ray checkpoint in remote storage is downloaded first) or a ``save()`` result
    (``.checkpoint``)."""
    if hasattr(checkpoint, "checkpoint") and hasattr(checkpoint.checkpoint, "path"):
        return path_of(checkpoint.checkpoint)
    if hasattr(checkpoint, "to_directory") and hasattr(checkpoint, "filesystem"):
        # Ray's Checkpoint (a Tune result's): its path on local disk, else a local copy of it.
        if type(checkpoint.filesystem).__name__ == "LocalFileSystem":
            return str(checkpoint.path)
        return checkpoint.to_directory()
    if not isinstance(checkpoint, str | os.PathLike) and hasattr(checkpoint, "path"):
        return str(checkpoint.path)
    return os.fspath(checkpoint)
