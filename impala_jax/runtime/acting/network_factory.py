"""Which network factory a value names (Brax's ``network_factory``; RLlib's ``rl_module_spec``).

One resolution for the config's check, which runs without JAX, and for the runners and the
learner, which build the networks: None (impala_jax's own networks), a callable
``factory(model_config, observation_space, action_space) -> Networks``, or its import path
(``"pkg.mod:fn"`` as checkpoints store callables, or RLlib's ``"pkg.mod.fn"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from impala_jax.runtime.process.import_path import import_object, split_import_path

# impala_jax's own factory by path; matched by name, so naming it imports no JAX.
OWN_FACTORY = "impala_jax.core.networks.make_networks"
_OWN_PATHS = (OWN_FACTORY, "impala_jax.core.networks:make_networks")


def is_own_factory(factory: Any) -> bool:
    """True for impala_jax's own networks: None, or ``make_networks`` itself or by path."""
    if factory is None or (isinstance(factory, str) and factory in _OWN_PATHS):
        return True
    module = getattr(factory, "__module__", None)
    return module == "impala_jax.core.networks" and getattr(factory, "__qualname__", "") == (
        "make_networks"
    )


def resolve_factory(factory: Any) -> Callable | None:
    """The user's network factory that ``factory`` names (a path is imported); None for
    impala_jax's own networks. Raises ValueError saying why ``factory`` names no callable."""
    if is_own_factory(factory):
        return None
    obj = factory
    if isinstance(factory, str):
        parts = split_import_path(factory)
        if parts is None:
            raise ValueError(
                f"network factory {factory!r} is not an importable path 'pkg.mod:fn' (a lambda "
                "or a local function has none); define the factory at module level"
            )
        module, qualname = parts
        try:
            obj = import_object(module, qualname)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"network factory {factory!r} cannot be imported: cannot import {qualname!r} "
                f"from {module!r} ({type(err).__name__}: {err})"
            ) from err
        if is_own_factory(obj):
            return None
    if not callable(obj):
        named = "" if obj is factory else f" names {obj!r}, which"
        raise ValueError(
            f"network factory {factory!r}{named} is not callable; give "
            "factory(model_config, observation_space, action_space) -> Networks, or its path"
        )
    return obj
