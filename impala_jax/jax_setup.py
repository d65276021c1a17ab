"""Process-wide JAX settings for a command line or a trial: forced CPU devices, the
persistent compilation cache. Set by the caller that owns the process, never at library import.
"""

from __future__ import annotations

import os
import re
import sys

from impala_jax.experiment import RunError

# The persistent compilation cache of the command line and of Ray Tune trials.
DEFAULT_COMPILE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "impala_jax", "xla")


def set_jax_environment(devices: int | None) -> None:
    """Environment variables that JAX reads once, at import: set here, never by the library."""
    if devices is None:
        return
    if "jax" in sys.modules:
        raise RunError("--devices must be set before JAX is imported (run it as a fresh process)")
    force_host_devices(devices)
    os.environ["JAX_PLATFORMS"] = "cpu"


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


def enable_compile_cache(directory: str) -> None:
    """Caches every compiled program on disk (the actor's act, the learner step)."""
    if directory.lower() == "none":
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    # The default thresholds skip programs that compile in under a second: cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
