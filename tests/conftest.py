"""Test-wide settings: two forced CPU devices, strict rank promotion, fixed seeds."""

import atexit
import os
import shutil
import tempfile

# Must happen before JAX initialises its backends: gives two CPU devices for the 1-vs-2-device
# tests. Collectives across forced CPU devices can deadlock on a loaded machine, so those tests
# carry a hard timeout.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# build() keeps compiled programs in ~/.cache unless told otherwise. The tests' builds share a
# folder of their own, removed at the end of the run: a program many tests build alike (the
# same small config, the same learner step) is compiled once per run instead of once per test.
# Tests of the cache point it at their tmp_path. An in-process CLI run (run.main) without
# --compile-cache moves the process to the CLI's default folder, as it does for a user.
if "IMPALA_JAX_COMPILE_CACHE" not in os.environ:
    _compile_cache = tempfile.mkdtemp(prefix="impala_jax_tests_xla_")
    atexit.register(shutil.rmtree, _compile_cache, ignore_errors=True)
    os.environ["IMPALA_JAX_COMPILE_CACHE"] = _compile_cache

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
