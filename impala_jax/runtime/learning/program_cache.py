"""Traced programs kept on disk across processes, beside the persistent compilation cache.

JAX's compilation cache skips XLA's compilation, but every new process still traces the
learner step in Python and lowers it to StableHLO before it can look the program up: most of
a warm start, all of it holding the GIL that the runner and the main thread need at the same
time (benchmarks/README.md, "Start-up and exit"). Here the traced program is exported once
(``jax.export``: StableHLO with its shapes and shardings) and a later process deserializes it
and compiles it (a compilation-cache hit) without tracing.

A stored program must never stand in for a different one, so its file name is a digest of
everything the trace depends on: the caller's description (the config, the learner's specs),
the shapes, dtypes, shardings and tree structures of the arguments, impala_jax's own source
files, the versions of JAX, jaxlib, Flax, optax, chex, NumPy and ml_dtypes, JAX's settings,
``XLA_FLAGS`` and the devices. The cache is on only where the persistent compilation cache is
(the command line, Ray Tune trials; ``--compile-cache none`` turns both off), in one process
(several processes keep the step compiled ahead of time as before), and for configs without
callables in their model config (user code the digest cannot see). A file that fails to load
is traced and written again; a program that cannot be exported runs as a plain ``jax.jit``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from impala_jax.runtime.process.atomic import write_atomic

logger = logging.getLogger(__name__)

SUBDIRECTORY = "impala_jax_programs"
SUFFIX = ".jaxexport"
# The whole package, found from this module's dotted name, so a move of this file cannot leave
# part of it out (parent.parent once meant runtime/ alone: an edit to core/ reused old programs).
_PACKAGE = Path(__file__).resolve().parents[len(__name__.split(".")) - 2]
_source_digest: str | None = None


def directory() -> Path | None:
    """Where programs are kept: a folder inside JAX's persistent compilation cache, None when
    that cache is off (then nothing is stored)."""
    cache = jax.config.values.get("jax_compilation_cache_dir")
    if not cache:
        return None
    return Path(cache) / SUBDIRECTORY


def source_digest(package: Path = _PACKAGE) -> str:
    """A digest of every Python file of the package (the code a trace runs)."""
    global _source_digest
    if package == _PACKAGE and _source_digest is not None:
        return _source_digest
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    if package == _PACKAGE:
        _source_digest = digest.hexdigest()
    return digest.hexdigest()


def environment() -> list:
    """What the trace depends on besides the caller's description and the arguments."""
    import chex
    import flax
    import jaxlib
    import ml_dtypes
    import numpy as np
    import optax

    versions = [m.__version__ for m in (jax, jaxlib, flax, optax, chex, np, ml_dtypes)]
    devices = [(d.platform, d.device_kind, d.id, d.process_index) for d in jax.devices()]
    settings = sorted((k, repr(v)) for k, v in jax.config.values.items())
    return [versions, devices, settings, os.environ.get("XLA_FLAGS", ""), source_digest()]


def _describe(arg) -> list:
    leaves, treedef = jax.tree.flatten(arg)
    return [
        str(treedef),
        [(x.shape, str(x.dtype), str(getattr(x, "sharding", None)), _weak(x)) for x in leaves],
    ]


def _weak(x) -> bool:
    return bool(getattr(getattr(x, "aval", None), "weak_type", False))


class CachedProgram:
    """``fn`` (a jitted function) behind a stored export: on the first call the program for the
    arguments' shapes is loaded from disk, or traced, exported and stored; every call then runs
    one jit around ``exported.call`` (which takes the arguments' leaves).

    ``outputs_like``: for each output (``fn`` returns a tuple), the index of the argument whose
    tree structure it has, a tree structure (``jax.tree.structure``) given by the caller, or
    None for an output whose structure the export keeps itself (nested dicts, lists and tuples
    of arrays). ``description``: plain data that, with the arguments and the environment,
    decides the trace. ``out_shardings``: as jax.jit's, one entry per output (by default the
    argument's shardings for an output like an argument). ``compiler_options``: XLA options
    of the one compilation (then every call must have the first call's shapes).
    """

    def __init__(
        self,
        fn: Callable,
        name: str,
        description: Any,
        outputs_like: Sequence[Any],
        donate_argnums: tuple[int, ...] = (),
        folder: Path | None = None,
        out_shardings: tuple | None = None,
        compiler_options: dict | None = None,
    ):
        self._fn = fn
        self.name = name
        self._description = description
        self._outputs_like = tuple(outputs_like)
        self._donate = donate_argnums
        self._folder = folder
        self._out_shardings = out_shardings
        self._compiler_options = compiler_options
        self._call: Callable | None = None
        # Per program, so that two programs resolve at once (the learner's initial state on
        # the main thread, its step in the warm-up thread).
        self._lock = threading.Lock()
        self.source: str | None = None  # "loaded", "exported" or "jit" once resolved

    def __call__(self, *args):
        return self._resolved(args)(*args)

    def compile(self, *args):
        """The program for ``args`` (arrays, or jax.ShapeDtypeStruct with the arrays'
        shardings) compiled ahead of time: loaded or exported as at a first call, then
        ``lower(*args).compile()``. Its calls take arrays of exactly those shapes and
        shardings (host arrays are placed by it)."""
        call = self._resolved(args)
        return call.lower(*args).compile() if hasattr(call, "lower") else call

    def _resolved(self, args) -> Callable:
        if self._call is None:
            with self._lock:
                if self._call is None:
                    self._resolve(args)
        return self._call

    def _cache_size(self) -> int:
        """Shapes compiled so far (jax.jit's count): tests check that nothing retraces."""
        return self._call._cache_size() if self._call is not None else 0

    def path_for(self, args) -> Path | None:
        folder = self._folder or directory()
        if folder is None:
            return None
        key = repr([self.name, self._description, [_describe(a) for a in args], environment()])
        return folder / f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:40]}{SUFFIX}"

    def _resolve(self, args) -> None:
        from jax import export

        in_treedefs = [jax.tree.structure(a) for a in args]
        out_treedefs = [
            in_treedefs[like] if isinstance(like, int) else like for like in self._outputs_like
        ]
        path = self.path_for(args)
        exported = None
        if path is not None and path.exists():
            try:
                exported = export.deserialize(bytearray(path.read_bytes()))
                self.source = "loaded"
            except Exception as err:  # a damaged or foreign file: traced and written again
                logger.info("program cache: %s could not be loaded (%s); tracing it", path, err)
        if exported is None:
            try:
                exported = self._export(args, in_treedefs, out_treedefs)
            except Exception as err:  # a primitive or output export cannot carry
                logger.info("program cache: %s runs as plain jit (%s)", self.name, err)
                self._call, self.source = self._fn, "jit"
                if self._compiler_options is not None:
                    self._call = self._fn.lower(*args).compile(self._compiler_options)
                return
            self.source = "exported"
            if path is not None:
                data = exported.serialize()
                try:
                    write_atomic(path, data)
                except OSError as err:  # a read-only or full cache: the next start traces again
                    logger.info("program cache: %s not written (%s)", path, err)
        out_shardings = self._out_shardings
        if out_shardings is None:
            # Outputs fed back as arguments keep the arguments' shardings, spelled the same
            # way: the export's own spelling (replicated for P('learner') on one device) is the
            # same layout but another jit cache key, and would compile the step a second time.
            out_shardings = tuple(
                jax.tree.map(lambda x: x.sharding, args[like]) if isinstance(like, int) else None
                for like in self._outputs_like
            )

        def run(*args):  # the arguments' own trees: jit flattens them, not Python per call
            out = exported.call(*(jax.tree.leaves(a) for a in args))
            return tuple(
                jax.tree.unflatten(t, o) if t is not None else o
                for t, o in zip(out_treedefs, out, strict=True)
            )

        call = jax.jit(run, donate_argnums=self._donate, out_shardings=out_shardings)
        if self._compiler_options is not None:
            call = call.lower(*args).compile(self._compiler_options)
        self._call = call

    def _export(self, args, in_treedefs, out_treedefs):
        from jax import export

        fn, kept = self._fn, [t is None for t in out_treedefs]

        def flat_fn(*flat):
            out = fn(*(jax.tree.unflatten(t, f) for t, f in zip(in_treedefs, flat, strict=True)))
            return tuple(
                o if keep else jax.tree.leaves(o) for keep, o in zip(kept, out, strict=True)
            )

        flat = [[_abstract(x) for x in jax.tree.leaves(a)] for a in args]
        exported = export.export(jax.jit(flat_fn))(*flat)
        exported.serialize()  # fails here, not at the next start, if an output cannot be stored
        return exported


def _abstract(x) -> jax.ShapeDtypeStruct:
    # An uncommitted array (jnp.zeros(...) on the default device) or a host array goes
    # wherever the program runs, as under jax.jit; only committed ones pin the export's input
    # sharding.
    sharding = getattr(x, "sharding", None) if getattr(x, "committed", True) else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=_weak(x))


def model_description(model_config, observation_space, action_space) -> list | None:
    """The part of a config that decides the networks and the action distribution, as plain
    data; None when ``model_config`` holds a callable (user code the digest cannot see)."""

    def plain(value):
        if callable(value):
            raise TypeError
        if isinstance(value, dict):
            return sorted((str(k), plain(v)) for k, v in value.items())
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return repr(value)

    try:
        model = plain(dict(model_config))
    except TypeError:
        return None
    return [model, _space(observation_space), _space(action_space)]


def _space(space) -> list:
    """A gymnasium space as plain data, array bounds included (a repr abbreviates them)."""
    import numpy as np

    out = [type(space).__name__, repr(space)]
    for name in ("low", "high", "nvec", "n", "start"):
        value = getattr(space, name, None)
        if value is not None:
            array = np.asarray(value)
            out.append(
                (name, str(array.dtype), array.shape, hashlib.sha256(array.tobytes()).hexdigest())
            )
    inner = getattr(space, "spaces", None)
    if isinstance(inner, dict):
        out.append([(k, _space(v)) for k, v in inner.items()])
    elif isinstance(inner, list | tuple):
        out.append([_space(v) for v in inner])
    return out
