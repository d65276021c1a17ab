"""The command line's runtime dependencies: a Python without them gets one line naming the
missing package and the fix, not an import traceback. Standard library only, so this module
loads in any Python."""

from __future__ import annotations

import importlib.util
import sys

# The top-level packages the CLI imports to train (setup.cfg's install_requires).
RUNTIME_PACKAGES = (
    "numpy",
    "jax",
    "flax",
    "optax",
    "chex",
    "gymnasium",
    "envpool",
    "rich",
    "matplotlib",
    "threadpoolctl",
)


def is_runtime_package(name: str | None) -> bool:
    """Whether the module ``name`` (as a ModuleNotFoundError names it) is one of ours."""
    return (name or "").partition(".")[0] in RUNTIME_PACKAGES


def missing_package() -> str | None:
    """The first runtime package this Python cannot import, or None."""
    for name in RUNTIME_PACKAGES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a finder that refuses it, a broken half-import
            return name
    return None


def missing_message(name: str) -> str:
    """One line: what is missing, in which Python, and the fix."""
    return (
        f"no module named {name!r} in this Python ({sys.executable}): impala_jax's dependencies "
        "are not installed in it; run the venv's Python, `.venv/bin/python -m impala_jax.run "
        "...` (`make install` in the repository creates .venv)"
    )
