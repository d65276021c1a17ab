"""Ray Tune finds impala_jax once both are imported, in either order; this module imports no ray.

``import impala_jax`` calls `install()`. If ``ray.tune`` is imported already, impala_jax's
Trainable is registered at once (``impala_jax.rllib.ray_tune.register``); otherwise a finder on
``sys.meta_path`` waits for ``ray.tune``'s import to finish and registers then. So the RLlib
habit ``tune.Tuner("IMPALA", param_space=config)`` works with only the import line swapped, and
a program that never imports ray never pays for it.

Python has no post-import hook, hence the finder: it answers only for the names it waits for,
lets the other finders locate the module, and wraps the loader so that registration runs right
after the module's own code.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable

_LOG = logging.getLogger("impala_jax")


def _register_with_tune() -> None:
    module = sys.modules.get("impala_jax.rllib.ray_tune")
    if module is not None and not hasattr(module, "register"):
        return  # ray_tune's own `from ray import tune` got here; it registers when it ends
    from impala_jax.rllib import ray_tune

    ray_tune.register()


def _guard_rllib_registry() -> None:
    from impala_jax.rllib import ray_tune

    ray_tune.guard_rllib_registry()


# Module name -> what to run once it has been imported.
_AFTER_IMPORT: dict[str, Callable[[], None]] = {
    "ray.tune": _register_with_tune,
    "ray.rllib": _guard_rllib_registry,
}


def _run(name: str) -> None:
    hook = _AFTER_IMPORT[name]
    try:
        hook()
    except Exception as err:  # a hook must never break the user's import of ray
        _LOG.warning("impala_jax could not hook into %s: %s: %s", name, type(err).__name__, err)


class _LoaderThenHook:
    """The module's own loader, then the hook (every other attribute is the loader's)."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _run(self._name)

    def __getattr__(self, attr: str):
        return getattr(self._loader, attr)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoaderThenHook(spec.loader, fullname)
        return spec


_FINDER = _AfterImportFinder()


def install() -> None:
    """Registers with whatever of ray is imported already and waits for the rest."""
    for name in _AFTER_IMPORT:
        if name in sys.modules:
            _run(name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
