"""Envs written in JAX (gymnax's ``Environment`` interface) and their adapter, ``GymnaxEnv``.

An env written in JAX is an instance or a subclass of gymnax's
``gymnax.environments.environment.Environment`` (the protocol: ``PROTOCOL_HELP``), given as
``environment("gymnax:<id>")`` (gymnax's registry: ``gymnax.make(<id>)``), as the class or an
instance, as ``"pkg.module:Class"``, or made by a creator (``register_env``);
``env_registry.choose_env`` resolves them all. It is recognised by its base class, looked up in
``sys.modules`` only: an env can subclass gymnax's ``Environment`` only once its module is
imported, so the question never imports gymnax. The ``gymnax:`` prefix is read before
gymnasium's ``"module:<id>"`` form, for this one module: gymnasium would import ``gymnax`` and
look for a gymnasium id there. ``env_config`` sets fields of the env's ``EnvParams``
(``{"max_steps_in_episode": 200}``), except for a creator, which receives it and returns the env
(or gymnax.make's ``(env, params)``). Another family of JAX envs (Brax, Jumanji, Craftax) needs
one adapter like ``GymnaxEnv``: pure ``reset(key)`` and ``step(key, state, action)`` without
autoreset, and gymnasium spaces.
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
GYMNAX_BASE = "gymnax.environments.environment"  # the module of gymnax's ``Environment``
# What an env defines; gymnax's Environment gives the rest (is_truncated: state.time >=
# params.max_steps_in_episode).
PROTOCOL = ("reset_env", "step_env", "observation_space", "action_space")
PROTOCOL_HELP = (
    "An env written in JAX subclasses gymnax.environments.environment.Environment and defines "
    "default_params (a flax.struct.dataclass, the fields env_config sets), reset_env(key, "
    "params) -> (obs, state), step_env(key, state, action, params) -> (obs, state, reward, "
    "terminated, info) for one env without autoreset, observation_space(params) and "
    "action_space(params) (gymnax's Box or Discrete), and either a state with a time field "
    "and params with max_steps_in_episode, or is_truncated(state, params) "
    "(docs/config.md, 'Envs written in JAX')."
)


def gymnax_base() -> type | None:
    """gymnax's ``Environment`` once its module is imported, else None (see the docstring)."""
    return getattr(sys.modules.get(GYMNAX_BASE), "Environment", None)


def is_gymnax_env(obj: Any) -> bool:
    """Whether ``obj`` is a subclass or an instance of gymnax's ``Environment``."""
    base = gymnax_base()
    if base is None:
        return False
    return issubclass(obj, base) if isinstance(obj, type) else isinstance(obj, base)


def check_not_lookalike(obj: Any, name: str) -> None:
    """Raises for a class or object with gymnax's ``reset_env`` and ``step_env`` that does not
    subclass its ``Environment``: it would go down the host path and fail there, obscurely."""
    if is_gymnax_env(obj) or not all(
        callable(getattr(obj, m, None)) for m in ("reset_env", "step_env")
    ):
        return
    cls = obj if isinstance(obj, type) else type(obj)
    install = (
        ""
        if importlib.util.find_spec("gymnax")
        else " gymnax is not installed: pip install -e '.[gymnax]'."
    )
    raise ValueError(
        f"environment(env={name!r}): {cls.__qualname__} has gymnax's reset_env and step_env but "
        f"does not subclass gymnax.environments.environment.Environment, by which an env "
        f"written in JAX is recognised (and trains on device); write class "
        f"{cls.__qualname__}(Environment).{install} {PROTOCOL_HELP}"
    )


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


def to_gymnasium(space, what: str, name: str) -> gym.Space:
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
    """One gymnax ``Environment`` with its params as a ``core.rollout.JaxEnv``, and its
    gymnasium spaces. ``version``: gymnax's, for an env of its registry (a stored program's
    key); None for a user's env, whose code no key covers (its programs are not kept on disk)."""

    def __init__(self, env, params, name: str, version: str | None = None):
        check_protocol(env, name)
        self.name, self.version = name, version
        self._env, self.params = env, params
        self.observation_space = to_gymnasium(env.observation_space(params), "observation", name)
        self.action_space = to_gymnasium(env.action_space(params), "action", name)
        self._check_traces()

    def reset(self, key):
        import jax.numpy as jnp

        obs, state = self._env.reset_env(key, self.params)
        return obs.astype(jnp.float32), state

    def step(self, key, state, action):
        import jax.numpy as jnp

        obs, state, reward, terminated, _ = self._env.step_env(key, state, action, self.params)
        truncated = self._env.is_truncated(state, self.params)
        return obs.astype(jnp.float32), state, reward, terminated, truncated

    def _check_traces(self) -> None:
        """Traces one reset and one step (shapes only, nothing runs): a broken env fails here,
        with the method named, not deep inside the compiled rollout."""
        import jax
        import jax.numpy as jnp

        key = jax.random.key(0)
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        action = jax.ShapeDtypeStruct(
            self.action_space.shape, jnp.int32 if discrete else jnp.float32
        )
        try:
            obs, state = jax.eval_shape(self.reset, key)
        except Exception as err:
            raise self._untraceable("reset_env(key, params)", err) from err
        try:
            out = jax.eval_shape(self.step, key, state, action)
        except Exception as err:
            what = "step_env(key, state, action, params) or is_truncated(state, params)"
            raise self._untraceable(what, err) from err
        shapes = {"observation": obs.shape, "next observation": out[0].shape}
        shapes.update(
            zip(("reward", "terminated", "truncated"), [x.shape for x in out[2:]], strict=True)
        )
        wanted = {k: self.observation_space.shape if "observation" in k else () for k in shapes}
        wrong = [
            f"{k} {shapes[k]} (expected {wanted[k]})" for k in shapes if shapes[k] != wanted[k]
        ]
        if wrong:
            raise ValueError(
                f"environment(env={self.name!r}): one env's {', '.join(wrong)}; an env "
                "returns one env's values (impala_jax vmaps it), the observation of its "
                "observation_space's shape and scalar reward, terminated and truncated."
            )

    def _untraceable(self, what: str, err: Exception) -> ValueError:
        return ValueError(
            f"environment(env={self.name!r}): its {what} cannot be traced "
            f"({type(err).__name__}: {err}). {PROTOCOL_HELP}"
        )


def check_protocol(env, name: str) -> None:
    """Raises, naming them, when ``env``'s class leaves methods of the protocol to gymnax's
    ``Environment``, which only raises NotImplementedError there."""
    base = gymnax_base()
    missing = [m for m in PROTOCOL if getattr(type(env), m, None) is getattr(base, m, None)]
    if missing:
        raise ValueError(
            f"environment(env={name!r}): {type(env).__qualname__} does not define "
            f"{', '.join(missing)}. {PROTOCOL_HELP}"
        )


def with_config(params, env_config: Mapping[str, Any], name: str):
    """``params`` with the fields ``env_config`` sets (gymnax's ``EnvParams``)."""
    if not env_config:
        return params
    if not dataclasses.is_dataclass(params):
        raise ValueError(
            f"environment(env={name!r}, env_config={dict(env_config)!r}): env_config sets "
            f"fields of the env's default_params, and this one is a {type(params).__name__}, not "
            "a dataclass; make default_params a flax.struct.dataclass (as gymnax's EnvParams)."
        )
    fields = [f.name for f in dataclasses.fields(params)]
    unknown = sorted(set(env_config) - set(fields))
    if unknown:
        raise ValueError(
            f"environment(env={name!r}, env_config=...): {unknown} are not fields of "
            f"{type(params).__name__}; its fields: {fields}."
        )
    return dataclasses.replace(params, **dict(env_config))


def _registry_env(env: str):
    """``(env, default params)`` of ``"gymnax:<id>"``, or a ValueError naming close ids."""
    env_id, ids = env[len(GYMNAX_PREFIX) :], gymnax_ids()
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids)
        hint = f" Did you mean {', '.join(GYMNAX_PREFIX + c for c in close)}?" if close else ""
        raise ValueError(
            f"environment(env={env!r}): gymnax has no env {env_id!r}.{hint} Its envs: "
            f"{', '.join(ids)}."
        )
    return make_gymnax_env(env_id)


def _construct(cls: type, name: str):
    try:
        return cls()
    except TypeError as err:
        raise ValueError(
            f"environment(env={name!r}): {cls.__qualname__}() needs arguments ({err}). A class "
            "is made with none, as gymnax.make makes its envs, and env_config sets fields of its "
            "default_params; give an instance, environment(env="
            f"{cls.__qualname__}(...)), or register a creator: register_env(name, lambda "
            f"env_config: {cls.__qualname__}(...))."
        ) from err


def adapt_jax_env(target, env_config: Mapping[str, Any] | None, name: str) -> GymnaxEnv:
    """The ``GymnaxEnv`` of what ``env_registry.choose_env`` resolved: ``"gymnax:<id>"``, a
    gymnax ``Environment`` class (made with no arguments) or instance, whose ``default_params``
    ``env_config`` sets fields of; or ``(env, params)`` that a creator made from
    ``env_config``, taken as they are."""
    if isinstance(target, tuple):
        return GymnaxEnv(*target, name)
    if isinstance(target, str):
        env, params = _registry_env(target)
        version = importlib.metadata.version("gymnax")
    else:
        env = _construct(target, name) if isinstance(target, type) else target
        params, version = env.default_params, None
    return GymnaxEnv(env, with_config(params, env_config or {}, name), name, version)


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
