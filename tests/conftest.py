"""Test-wide settings: two forced CPU devices, strict rank promotion, fixed seeds."""

import os

# Must happen before JAX initialises its backends: gives two CPU devices for the 1-vs-2-device
# tests. Collectives across forced CPU devices can deadlock on a loaded machine, so those tests
# carry a hard timeout.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# build() keeps compiled programs in ~/.cache unless told otherwise: tests write nothing there
# (a test of the cache points it at its tmp_path).
os.environ.setdefault("IMPALA_JAX_COMPILE_CACHE", "none")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
