"""Process-wide JAX settings: they must be set before JAX starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from impala_jax.cli.errors import RunError
from impala_jax.cli.process import set_jax_environment


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


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


_QR_AGAINST_NUMPY = """
import numpy as np
import jax, jax.numpy as jnp
a = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
q, r = jax.jit(jnp.linalg.qr)(a)
q_np, r_np = np.linalg.qr(a)
signs = np.sign(np.diag(r)) * np.sign(np.diag(r_np))
np.testing.assert_allclose(np.asarray(q) * signs, q_np, atol=1e-5)
"""


@pytest.mark.timeout(150)
def test_initialize_lapack_skips_scipys_package_inits_and_leaves_the_real_scipy_importable():
    # jaxlib takes LAPACK's function pointers from scipy.linalg.cython_blas/cython_lapack; the
    # packages' __init__s (0.2 s of start-up) must not run, and a later import must be real.
    code = (
        """
import sys
import jax
from impala_jax.runtime.process.jax_setup import initialize_lapack
initialize_lapack()
assert not [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")], sorted(sys.modules)
"""
        + _QR_AGAINST_NUMPY
        + """
assert not [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")]
import scipy.linalg
assert scipy.linalg.__file__.endswith("__init__.py")
assert "dgeqrf" in scipy.linalg.cython_lapack.__pyx_capi__
np.testing.assert_allclose(np.abs(scipy.linalg.qr(a, mode="economic")[0]), np.abs(q_np), atol=1e-5)
"""
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.timeout(150)
def test_initialize_lapack_falls_back_to_jaxlibs_own_import():
    # scipy already imported: nothing to skip. A scipy the stand-ins cannot load from (here a
    # wrong path): jaxlib's own initialisation, and no stand-in left behind.
    already = (
        "import scipy.linalg\nfrom impala_jax.runtime.process.jax_setup import initialize_lapack\n"
    )
    proc = _python(already + "initialize_lapack()\n" + _QR_AGAINST_NUMPY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    broken = (
        """
import importlib.util, sys
from impala_jax.runtime.process.jax_setup import initialize_lapack
real = importlib.util.find_spec
def find_spec(name, *args):
    spec = real(name, *args)
    if name == "scipy":
        spec.origin = "/nonexistent/scipy/__init__.py"
    return spec
importlib.util.find_spec = find_spec
initialize_lapack()
importlib.util.find_spec = real
import scipy.linalg
assert scipy.linalg.__file__.endswith("__init__.py") and scipy.linalg.qr
"""
        + _QR_AGAINST_NUMPY
    )
    proc = _python(broken)
    assert proc.returncode == 0, proc.stderr[-3000:]
