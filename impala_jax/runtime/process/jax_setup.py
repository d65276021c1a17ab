"""Process-wide JAX settings for a command line or a trial: forced CPU devices, the
persistent compilation cache. Set by the caller that owns the process, never at library import.
"""

from __future__ import annotations

import os
import re
import sys

# The persistent compilation cache of the command line and of Ray Tune trials.
DEFAULT_COMPILE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "impala_jax", "xla")


def force_host_devices(devices: int) -> None:
    """`devices` CPU devices (XLA reads XLA_FLAGS when its CPU backend starts)."""
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
    )
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()


def jax_started() -> bool:
    """Whether JAX has picked its backends in this process (then its settings are fixed)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


# The folder of the persistent compilation cache for build(), the command line's and Tune's
# trials; one of COMPILE_CACHE_OFF turns it off.
COMPILE_CACHE_ENV = "IMPALA_JAX_COMPILE_CACHE"
COMPILE_CACHE_OFF = ("", "none", "off")


def enable_compile_cache(directory: str) -> None:
    """Caches every compiled program on disk (the actor's act, the learner step) in
    `directory`; one of COMPILE_CACHE_OFF (any case) leaves it off."""
    if directory.strip().lower() in COMPILE_CACHE_OFF:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    # The default thresholds skip programs that compile in under a second: cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def use_compile_cache() -> None:
    """Keeps compiled programs on disk for the next process, as the command line does: in
    ``IMPALA_JAX_COMPILE_CACHE``'s folder (default ``~/.cache/impala_jax/xla``), off when that
    is ``none``, ``off`` or empty. A cache configured in JAX itself is left as it is."""
    import jax

    if not jax.config.values.get("jax_compilation_cache_dir"):
        enable_compile_cache(os.environ.get(COMPILE_CACHE_ENV, DEFAULT_COMPILE_CACHE))


def initialize_lapack() -> None:
    """Readies jaxlib's CPU LAPACK without running scipy's package ``__init__``s.

    Lowering a QR for the CPU (Flax's orthogonal initializer, in the learner state's program)
    makes jaxlib initialise its LAPACK, which takes BLAS and LAPACK function pointers from
    ``scipy.linalg.cython_blas`` and ``scipy.linalg.cython_lapack``. Importing those runs
    ``scipy/__init__`` and ``scipy/linalg/__init__`` first (scipy.linalg's Python API, its
    array-API layer, numpy.f2py: about 150 modules) for two extension modules that need none
    of it. Bare packages stand in for ``scipy`` and ``scipy.linalg`` while the two load, as
    ``envs.import_envpool`` does for envpool's families; afterwards the stand-ins and the
    modules loaded under them leave sys.modules, so a later ``import scipy.linalg`` is the real
    package (a Cython extension imported again returns its one module object). Where scipy is
    already imported, or anything is unexpected, jaxlib's own initialisation runs.
    """
    import importlib.util
    from pathlib import Path

    from impala_jax.runtime.process.import_path import bare_package

    try:
        from jaxlib.cpu import _lapack
    except ImportError:  # another jaxlib layout: JAX initialises LAPACK itself when it lowers
        return
    stand_ins = {}
    if not any(name in sys.modules for name in ("scipy", "scipy.linalg")):
        spec = importlib.util.find_spec("scipy")
        if spec is not None and spec.origin is not None:
            root = Path(spec.origin).parent
            stand_ins = {
                "scipy": bare_package("scipy", root),
                "scipy.linalg": bare_package("scipy.linalg", root / "linalg"),
            }
    before = set(sys.modules)
    sys.modules.update(stand_ins)
    try:
        if stand_ins:
            import scipy.linalg.cython_blas  # noqa: F401
            import scipy.linalg.cython_lapack  # noqa: F401
        _lapack.initialize()
    except Exception:  # start over plainly: jaxlib imports what it needs itself
        _forget(set(sys.modules) - before)
        _lapack.initialize()
    else:
        if stand_ins:
            _forget(set(sys.modules) - before)


def _forget(names) -> None:
    """Takes modules out of sys.modules (the scipy ones loaded under initialize_lapack's
    stand-ins), so that a later import finds the real packages."""
    for name in names:
        if name == "scipy" or name.startswith("scipy."):
            sys.modules.pop(name, None)
