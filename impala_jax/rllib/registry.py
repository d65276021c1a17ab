"""``register_env``, Ray Tune's ``ray.tune.registry.register_env`` without ray (public as
``impala_jax.register_env``), and the ``EnvContext`` a creator gets.

runtime/envs/env_registry.py holds the registry it writes to, reads it when it resolves
``environment(env=...)``, and makes each creator's ``EnvContext``.
"""

from __future__ import annotations

from collections.abc import Callable

from impala_jax.runtime.envs import env_registry
from impala_jax.runtime.envs.env_registry import EnvContext

__all__ = ["EnvContext", "register_env"]


def register_env(name: str, env_creator: Callable) -> None:
    """Registers ``env_creator(env_context) -> gymnasium.Env`` under ``name``, as
    ``ray.tune.register_env`` does: ``environment(name)`` then builds envs with it.

    The creator gets an ``EnvContext`` (env_config plus ``worker_index``, ``num_workers``,
    ``vector_index``). A registered name wins over a gymnasium or envpool id of the same
    spelling, as in RLlib. A Ray Tune trial of a config naming it finds it too: the driver
    copies it into Tune's registry, which Ray ships to every trial's process and node.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_env: name must be a non-empty string, got {name!r}.")
    if not callable(env_creator):
        raise TypeError(
            f"register_env({name!r}, ...): env_creator must be callable "
            f"(env_config -> gymnasium.Env), got {env_creator!r}."
        )
    env_registry.REGISTERED[name] = env_creator
