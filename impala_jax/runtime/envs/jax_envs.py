"""Envs written in JAX: ``environment("gymnax:<id>")`` and its adapter to ``core.rollout.JaxEnv``.

The prefix names gymnax's registry (``gymnax.make(<id>)``: classic control, MinAtar, bsuite,
misc). It is read before gymnasium's ``"module:<id>"`` form, for this one module: gymnasium
would import ``gymnax`` and look for a gymnasium id there. ``env_config`` sets fields of the
env's ``EnvParams`` (``{"max_steps_in_episode": 200}``). Another family of JAX envs (Brax,
Jumanji, Craftax) needs one adapter like ``GymnaxEnv``: pure ``reset(key)`` and
``step(key, state, action)`` without autoreset, and gymnasium spaces.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from impala_jax.runtime.process.import_path import bare_package, take_out

# jax is imported where an env is made, not with this module: env_registry imports the prefix,
# and the command line reads it before it starts JAX.

GYMNAX_PREFIX = "gymnax:"


def is_jax_env(env: Any) -> bool:
    """Whether ``environment(env=...)`` names an env that steps on device."""
    return isinstance(env, str) and env.startswith(GYMNAX_PREFIX)


def _missing(err: Exception) -> ValueError:
    return ValueError(
        f"environment('{GYMNAX_PREFIX}<id>') needs the gymnax package ({err}); install "
        "the gymnax extra: pip install -e '.[gymnax]' (make test installs it)."
    )


@functools.cache
def _builtin_envs() -> dict[str, tuple[str, str]]:
    """``id -> (module, class)`` of gymnax's own envs, read from its registration module's
    source without running it: ``import gymnax`` imports every env family, and with them
    matplotlib, seaborn and scipy.stats, for the one env a run makes. Empty when the source
    is not laid out as expected (``make_gymnax_env`` then imports gymnax plainly)."""
    spec = importlib.util.find_spec("gymnax")
    if spec is None or spec.origin is None:
        return {}
    try:
        tree = ast.parse(Path(spec.origin).with_name("registration.py").read_text())
    except (OSError, SyntaxError):
        return {}
    modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gymnax."):
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    table = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            named = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if named and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                if value.value.id in modules:
                    table[key.value] = (modules[value.value.id], value.attr)
    return table


def _full_registry():
    """gymnax's own registration module (every family imported), or a clear error."""
    try:
        return importlib.import_module("gymnax.registration")
    except ImportError as err:
        raise _missing(err) from err


def gymnax_ids() -> list[str]:
    """The ids ``"gymnax:<id>"`` can name: gymnax's own, and those registered at run time once
    the user has imported gymnax."""
    if "gymnax.registration" in sys.modules or not _builtin_envs():
        return list(_full_registry().registered_envs)
    return list(_builtin_envs())


def make_gymnax_env(env_id: str):
    """``(env, default params)`` of one gymnax id, importing only its module where it can."""
    where = _builtin_envs().get(env_id)
    if where is None or "gymnax.registration" in sys.modules:
        return _full_registry().make(env_id)
    module, cls = where
    root = Path(importlib.util.find_spec("gymnax").origin).parent
    parts = module.split(".")[1:-1]  # the packages between gymnax and the env's module
    stand_ins = {}
    for depth in range(len(parts) + 1):
        name = ".".join(("gymnax", *parts[:depth]))
        if name not in sys.modules:
            stand_ins[name] = bare_package(name, root.joinpath(*parts[:depth]))
    sys.modules.update(stand_ins)
    try:
        env = getattr(importlib.import_module(module), cls)()
    except Exception:  # a module that needs its package after all: the plain import
        take_out(stand_ins)
        for name in [n for n in sys.modules if n == module]:
            del sys.modules[name]
        return _full_registry().make(env_id)
    finally:
        take_out(stand_ins)
    return env, env.default_params


def _to_gymnasium(space, what: str, name: str) -> gym.Space:
    kind = type(space).__name__
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "Box":
        shape = tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
        return gym.spaces.Box(low, high, shape, np.float32)
    raise ValueError(
        f"environment({name!r}): its {what} space is a gymnax {kind}; impala_jax takes Box and "
        "Discrete spaces."
    )


class GymnaxEnv:
    """One gymnax env with its params as a ``core.rollout.JaxEnv``, and its gymnasium spaces."""

    def __init__(self, env: str, env_config: Mapping[str, Any] | None = None):
        env_id, ids = env[len(GYMNAX_PREFIX) :], gymnax_ids()
        if env_id not in ids:
            close = difflib.get_close_matches(env_id, ids)
            hint = f" Did you mean {', '.join(GYMNAX_PREFIX + c for c in close)}?" if close else ""
            raise ValueError(
                f"environment(env={env!r}): gymnax has no env {env_id!r}.{hint} Its envs: "
                f"{', '.join(ids)}."
            )
        self.name = env
        self.version = importlib.metadata.version("gymnax")  # a stored program's key
        self._env, params = make_gymnax_env(env_id)
        fields = [f.name for f in dataclasses.fields(params)]
        unknown = sorted(set(env_config or {}) - set(fields))
        if unknown:
            raise ValueError(
                f"environment(env={env!r}, env_config=...): {unknown} are not fields of "
                f"{type(params).__name__}; its fields: {fields}."
            )
        self.params = params.replace(**dict(env_config or {}))
        self.observation_space = _to_gymnasium(
            self._env.observation_space(self.params), "observation", env
        )
        self.action_space = _to_gymnasium(self._env.action_space(self.params), "action", env)

    def reset(self, key):
        import jax.numpy as jnp

        obs, state = self._env.reset_env(key, self.params)
        return obs.astype(jnp.float32), state

    def step(self, key, state, action):
        import jax.numpy as jnp

        obs, state, reward, terminated, _ = self._env.step_env(key, state, action, self.params)
        truncated = self._env.is_truncated(state, self.params)
        return obs.astype(jnp.float32), state, reward, terminated, truncated


def make_jax_env(env: str, env_config: Mapping[str, Any] | None = None) -> GymnaxEnv:
    return GymnaxEnv(env, env_config)


def action_map(space: gym.Space, normalize_actions: bool, clip_actions: bool) -> Callable:
    """The policy's action -> the env's, inside a compiled program (``ActionAdapter``'s rules:
    a bounded Box is scaled from [-1, 1] with ``normalize_actions``, else clipped with
    ``clip_actions``). A bounded Box with neither cannot be checked on device:
    ``check_device_actions`` rejects it."""
    import jax.numpy as jnp

    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return (lambda a: a + start) if start else (lambda a: a)
    low, high = space.low.astype(np.float32), space.high.astype(np.float32)
    bounded = bool(np.all(np.isfinite(low)) and np.all(np.isfinite(high)))
    low, high = low[None], high[None]  # against a batch of actions, [B, *shape]
    if bounded and normalize_actions:
        return lambda a: jnp.clip(low + (a + 1.0) * 0.5 * (high - low), low, high)
    if bounded and clip_actions:
        return lambda a: jnp.clip(a, low, high)
    return lambda a: a


def check_device_actions(space: gym.Space, normalize_actions: bool, clip_actions: bool, env):
    """Raises when the policy's actions could leave the env's bounds unnoticed on device."""
    if not isinstance(space, gym.spaces.Box):
        return
    bounded = bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
    if bounded and not (normalize_actions or clip_actions):
        raise ValueError(
            f"environment(env={env!r}, normalize_actions=False, clip_actions=False): on device "
            "an action outside the bounds of the action space cannot be caught and reported; "
            "set normalize_actions=True (the default) or clip_actions=True."
        )
