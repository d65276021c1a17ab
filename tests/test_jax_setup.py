"""Process-wide JAX settings: they must be set before JAX starts."""

from __future__ import annotations

import os
import sys

import pytest

from impala_jax.experiment import RunError
from impala_jax.jax_setup import set_jax_environment


def test_devices_sets_xla_flags_before_jax(monkeypatch):
    with pytest.raises(RunError, match="before JAX is imported"):
        set_jax_environment(2)  # this process imported JAX long ago
    monkeypatch.delitem(sys.modules, "jax")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --other")
    monkeypatch.setenv("JAX_PLATFORMS", "")
    set_jax_environment(4)
    assert os.environ["XLA_FLAGS"].split() == [
        "--other",
        "--xla_force_host_platform_device_count=4",
    ]
    assert os.environ["JAX_PLATFORMS"] == "cpu"
