"""Which env ``environment(env=...)`` names, resolved as RLlib resolves it, and envpool's import.

``choose_env`` tries a name given to ``register_env`` first (impala_jax's, or Ray Tune's when ray
is imported), then ids and import paths, and uses envpool for a gymnasium id only where
envpool's env is the same env (``ENVPOOL_SAME_AS_GYMNASIUM``, checked by the tests). A creator
is called per env with an ``EnvContext``. ``vec_env.py`` builds the envs ``choose_env`` picks.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym

from impala_jax.runtime.envs.craftax_envs import CRAFTAX_IDS, CRAFTAX_PREFIX, CraftaxEnv
from impala_jax.runtime.envs.jax_envs import (
    GYMNAX_PREFIX,
    adapt_jax_env,
    check_not_lookalike,
    gymnax_ids,
    is_gymnax_env,
)
from impala_jax.runtime.process.import_path import bare_package, take_out


def import_envpool():
    """envpool, imported without running its env families' package ``__init__``s.

    ``import envpool`` registers every family (envpool/entry.py) by importing
    ``envpool.<family>.registration``, and Python runs the family's package ``__init__`` first:
    it loads the family's C++ extension and builds Python classes for each of its envs, and
    jumanji's imports its renderer and with it matplotlib.pyplot. A CartPole run makes one
    family's envs. The registration modules need nothing from those ``__init__``s: they name
    ``"envpool.<family>"`` as an import path that ``envpool.make`` imports when it makes an env.
    So bare packages stand in for the families while envpool imports, and are taken out again
    afterwards: making an env then imports its real family package as usual, and importing
    envpool costs a fraction of its plain import. Anything unexpected (another envpool layout)
    falls back to the plain import.
    """
    if "envpool" in sys.modules:
        return sys.modules["envpool"]
    spec = importlib.util.find_spec("envpool")
    if spec is None:
        raise ImportError("No module named 'envpool'")
    root = Path(spec.origin).parent
    stand_ins = {}
    for registration in sorted(root.rglob("registration.py")):
        parts = registration.parent.relative_to(root).parts
        for depth in range(1, len(parts) + 1):  # envpool.mujoco before envpool.mujoco.gym
            name = ".".join(("envpool", *parts[:depth]))
            if name in stand_ins or name in sys.modules:
                continue
            stand_ins[name] = bare_package(name, root.joinpath(*parts[:depth]))
    sys.modules.update(stand_ins)
    try:
        import envpool
    except Exception:  # a registration needed its package after all: start over, plainly
        for name in [n for n in sys.modules if n == "envpool" or n.startswith("envpool.")]:
            del sys.modules[name]
        stand_ins = {}
        import envpool
    finally:
        take_out(stand_ins)
    return envpool


@functools.cache
def envpool_ids() -> frozenset[str]:
    try:
        envpool = import_envpool()
    except ImportError:  # envpool has no wheel for this platform: gymnasium only
        return frozenset()
    return frozenset(envpool.list_all_envs())


def is_atari_id(env: Any) -> bool:
    """Whether an env id names an Atari game (RLlib's ``is_atari`` for ids): ``ALE/`` and
    ``ale_py:`` ids, and envpool's Atari ids (``"Pong-v5"``). Creators and classes are not
    inspected (as in RLlib: ``environment(is_atari=True)`` says so for them)."""
    if not isinstance(env, str):
        return False
    if env.startswith(("ALE/", "ale_py:")):
        return True
    if env in gym.registry:  # e.g. ale_py's legacy "PongNoFrameskip-v4"
        return "ale_py" in str(gym.registry[env].entry_point)
    env_id = env.removeprefix(ENVPOOL_PREFIX)
    if env_id not in envpool_ids():
        return False
    from envpool.registration import registry

    return registry.specs[env_id][0] == "envpool.atari"


# Gymnasium ids whose envpool env is the same env: equal spaces, equal dynamics (a state set
# in gymnasium's env steps to envpool's next observation, or for the stochastic ones every
# envpool transition is one of gymnasium's), equal time limits, and one meaning for every
# option both accept. tests/test_envs.py checks each. Ids both have that are not here run
# under gymnasium: Blackjack-v1 (gymnasium's observation is a Tuple, envpool's a Box), the
# MuJoCo ids (float64 actions in envpool; Hopper and InvertedPendulum drift apart within 10
# steps, measured with mujoco 3.3), Taxi-v3 (envpool starts about a quarter of its episodes
# with the passenger already at the destination, gymnasium never), phys2d/ and tabular/
# (other spaces), and Box2D (not compared: gymnasium's needs box2d). "envpool:<id>" picks
# envpool's env anyway.
ENVPOOL_SAME_AS_GYMNASIUM = frozenset(
    {
        "Acrobot-v1",
        "CartPole-v0",
        "CartPole-v1",
        "CliffWalking-v1",
        "CliffWalkingSlippery-v1",
        "FrozenLake-v1",
        "FrozenLake8x8-v1",
        "MountainCar-v0",
        "MountainCarContinuous-v0",
        "Pendulum-v1",
    }
)
ENVPOOL_PREFIX = "envpool:"
# envpool.make options about batching and threads, not about the env itself.
ENVPOOL_BATCH_OPTIONS = frozenset(
    {
        "num_envs",
        "batch_size",
        "num_threads",
        "max_num_players",
        "thread_affinity_offset",
        "base_path",
        "seed",
        "gym_reset_return_info",
    }
)


def envpool_options(env_id: str) -> frozenset[str]:
    """The options ``envpool.make(env_id, ...)`` takes (its spec's config fields)."""
    envpool = import_envpool()

    return frozenset(envpool.make_spec(env_id).config._fields)


class EnvChoice(NamedTuple):
    """Which backend builds ``environment(env=...)``, with what, under which name."""

    # "envpool", "gymnasium", or an env written in JAX, on device: "gymnax" or "craftax".
    backend: str
    # An envpool or gymnasium id, or a creator fn(env_context); for "gymnax": "gymnax:<id>", a
    # gymnax Environment class or instance, or the (env, params) a creator made; for
    # "craftax": "craftax:<id>".
    target: Any
    name: str  # the user's spelling, for messages


# name -> creator, written by rllib/registry.py's register_env (``impala_jax.register_env``).
REGISTERED: dict[str, Callable] = {}


def registered_creator(name: str) -> Callable | None:
    """The creator registered under ``name`` with impala_jax's or Ray Tune's register_env.

    Tune's registry is read only when ray is already imported: ray is then the only way a
    name can have been registered there, and importing it otherwise costs seconds.
    """
    if name in REGISTERED:
        return REGISTERED[name]
    tune_registry = sys.modules.get("ray.tune.registry")
    if tune_registry is not None:
        registry, category = tune_registry._global_registry, tune_registry.ENV_CREATOR
        if registry.contains(category, name):
            return registry.get(category, name)
    return None


class EnvContext(dict):
    """What a creator receives, as RLlib's EnvContext: the ``env_config`` dict, plus where
    the env runs. ``worker_index`` is 0 for envs stepped by the main thread (the build-time
    probe, ``num_env_runners=0``, evaluation) and ``i + 1`` for runner thread ``i``, as RLlib
    numbers its remote runners from 1; ``num_workers`` is ``num_env_runners``;
    ``vector_index`` is the env's index within its runner; ``remote`` is always False
    (envs are never Ray actors here)."""

    def __init__(
        self,
        env_config: Mapping[str, Any],
        worker_index: int = 0,
        vector_index: int = 0,
        num_workers: int = 0,
    ):
        super().__init__(env_config)
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.num_workers = num_workers
        self.remote = False

    def __reduce__(self):  # gymnasium's async mode pickles the creators and their contexts
        return (
            EnvContext,
            (dict(self), self.worker_index, self.vector_index, self.num_workers),
        )


def call_creator(creator: Callable, env_context: EnvContext) -> gym.Env:
    try:
        return creator(env_context)
    except gym.error.NamespaceNotFound as err:
        # gymnasium >= 1.0 knows the ALE/ ids only once ale_py is imported, and RLlib's Atari
        # examples create gym.make("ALE/...") inside the creator without importing it.
        if "ALE" not in str(err) or "ale_py" in sys.modules:
            raise
        if importlib.util.find_spec("ale_py") is None:
            raise ValueError(
                f"env creator {creator!r}: {err} The ALE/ ids need the ale-py package "
                "(pip install ale-py)."
            ) from err
        _register_ale("ALE")
        return creator(env_context)


def _register_ale(env: str) -> None:
    try:
        import ale_py
    except ImportError as err:
        raise ValueError(
            f"environment(env={env!r}): the ALE/ ids need the ale-py package "
            "(pip install ale-py), which registers them with gymnasium. envpool's Atari ids "
            "without the ALE/ prefix (e.g. 'Pong-v5') are another env: 84x84 grayscale, "
            "4 stacked frames, 30 no-op starts, no sticky actions (see docs/config.md)."
        ) from err
    gym.register_envs(ale_py)


def choose_env(env: Any, env_config: Mapping[str, Any] | None = None) -> EnvChoice:
    """Resolves ``environment(env=...)``, in this order (RLlib's, plus envpool):

    1. a name given to ``register_env`` (impala_jax's, or Ray Tune's when ray is imported);
    2. ``"envpool:<id>"``: envpool's env of that id, whatever gymnasium has;
       ``"gymnax:<id>"``: gymnax's env of that id, stepped on device (runtime/envs/jax_envs.py);
       ``"craftax:<id>"``: Craftax's, on device too (runtime/envs/craftax_envs.py);
    3. ``"pkg.module:Name"``: the class, function or object ``Name`` of that module, or
       gymnasium's ``"module:<id>"`` (import the module, which registers ``<id>``:
       ``"ale_py:ALE/Pong-v5"``);
    4. a gymnasium id (``ALE/`` ids import ale_py first): gymnasium's env, or envpool's where
       it is the same env (``ENVPOOL_SAME_AS_GYMNASIUM``) and every ``env_config`` key is an
       envpool option (``is_slippery=False`` for FrozenLake-v1 is gymnasium's alone);
    5. an id only envpool has (``"Pong-v5"``);
    6. a class or function: called per env with an ``EnvContext``.

    An env written in JAX (a subclass or instance of gymnax's ``Environment``, or what a
    registered name or function creates, ``jax_env_made_by``) is ``"gymnax"``: it trains on
    device.
    """
    env_config = env_config or {}
    if is_gymnax_env(env) and not isinstance(env, type):  # an instance
        return EnvChoice("gymnax", env, type(env).__qualname__)
    if callable(env) and not isinstance(env, str):
        return _callable_choice(env, env_config, getattr(env, "__qualname__", repr(env)))
    if not isinstance(env, str):
        check_not_lookalike(env, repr(env))
        raise ValueError(
            f"environment(env={env!r}): expected an env id string, a creator callable/class, "
            "or an instance of a gymnax Environment."
        )
    creator = registered_creator(env)
    if creator is not None:
        return _callable_choice(creator, env_config, env)
    if env.startswith(ENVPOOL_PREFIX):
        env_id = env[len(ENVPOOL_PREFIX) :]
        if env_id not in envpool_ids():
            raise _unknown_env(env, sorted(envpool_ids()), "envpool has no env of that id.")
        return EnvChoice("envpool", env_id, env)
    if env.startswith(GYMNAX_PREFIX):
        if env[len(GYMNAX_PREFIX) :] not in gymnax_ids():
            raise _unknown_env(
                env, [GYMNAX_PREFIX + i for i in gymnax_ids()], "gymnax has no env of that id."
            )
        return EnvChoice("gymnax", env, env)
    if env.startswith(CRAFTAX_PREFIX):
        if env[len(CRAFTAX_PREFIX) :] not in CRAFTAX_IDS:
            raise _unknown_env(
                env, [CRAFTAX_PREFIX + i for i in CRAFTAX_IDS], "Craftax has no env of that id."
            )
        return EnvChoice("craftax", env, env)
    if ":" in env and env not in gym.registry:
        module, _, attr = env.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"environment(env={env!r}): cannot import module {module!r} ({err})."
            ) from err
        if hasattr(found, attr):
            return _callable_choice(getattr(found, attr), env_config, env)
        if attr not in gym.registry:
            raise ValueError(
                f"environment(env={env!r}): module {module!r} has no attribute {attr!r}, and "
                f"importing it registered no gymnasium id {attr!r}."
            )
        return EnvChoice("gymnasium", attr, env)
    if env.startswith("ALE/") and env not in gym.registry:
        _register_ale(env)
    if env in gym.registry:
        same = env in ENVPOOL_SAME_AS_GYMNASIUM and env in envpool_ids()
        if same and set(env_config) <= envpool_options(env):
            return EnvChoice("envpool", env, env)
        return EnvChoice("gymnasium", env, env)
    if env in envpool_ids():
        return EnvChoice("envpool", env, env)
    raise _unknown_env(
        env,
        sorted(envpool_ids() | set(gym.registry) | set(REGISTERED)),
        "no env is registered under that name (impala_jax.register_env or "
        "ray.tune.register_env), and neither envpool nor gymnasium has that id.",
    )


def _callable_choice(target: Any, env_config: Mapping[str, Any], name: str) -> EnvChoice:
    """A class, function or object named by the user: ``"gymnax"`` when it is, or creates, an
    env written in JAX; else a gymnasium creator, called per env."""
    if is_gymnax_env(target):
        return EnvChoice("gymnax", target, name)
    check_not_lookalike(target, name)
    if callable(target) and not isinstance(target, type):
        made = jax_env_made_by(target, env_config, name)
        if made is not None:
            return EnvChoice("gymnax", made, name)
    return EnvChoice("gymnasium", target, name)


# creator -> the env_configs (as repr) it made a host env for: it is not called again to ask.
_HOST_CREATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def jax_env_made_by(creator: Callable, env_config: Mapping[str, Any], name: str) -> tuple | None:
    """``(env, params)`` when ``creator``, given ``env_config``, makes an env written in JAX (a
    gymnax ``Environment``, or gymnax.make's ``(env, params)``; params default to its
    ``default_params``); None when it makes any other env (closed at once) or raises (the host
    path then reports it). A creator returns no type to read beforehand, so it is called to
    find out: once per env_config for a host env, whose answer is remembered."""
    config_key = repr(sorted(dict(env_config).items()))
    try:
        if config_key in _HOST_CREATORS.get(creator, ()):
            return None
    except TypeError:  # a creator that takes no weak reference: asked every time
        pass
    try:
        made = call_creator(creator, EnvContext(env_config))
    except Exception:
        return None
    env = made[0] if isinstance(made, tuple) and len(made) == 2 else made
    if is_gymnax_env(env):
        return (env, made[1]) if env is not made else (env, env.default_params)
    check_not_lookalike(env, name)
    close = getattr(made, "close", None)
    if callable(close):
        close()
    try:
        _HOST_CREATORS.setdefault(creator, set()).add(config_key)
    except TypeError:
        pass
    return None


def is_jax_env(env: Any, env_config: Mapping[str, Any] | None = None) -> bool:
    """Whether ``environment(env=..., env_config=...)`` names an env written in JAX, which
    trains on device. False for an env that does not resolve: building it says why."""
    if isinstance(env, str):
        if env.startswith((GYMNAX_PREFIX, CRAFTAX_PREFIX)):
            return True
        plain_id = ":" not in env or env in gym.registry or env.startswith(ENVPOOL_PREFIX)
        if plain_id and registered_creator(env) is None:
            return False  # an envpool or gymnasium id: nothing to import or call
    try:
        return choose_env(env, env_config).backend in ("gymnax", "craftax")
    except ValueError:
        return False


def make_jax_env(env: Any, env_config: Mapping[str, Any] | None = None):
    """The ``jax_envs.GymnaxEnv`` (or ``craftax_envs.CraftaxEnv``) of an env written in JAX
    (``is_jax_env``)."""
    choice = choose_env(env, env_config)
    if choice.backend == "craftax":
        return CraftaxEnv(choice.target[len(CRAFTAX_PREFIX) :], env_config)
    if choice.backend != "gymnax":
        raise ValueError(f"environment(env={env!r}): not an env written in JAX.")
    return adapt_jax_env(choice.target, env_config, choice.name)


def _unknown_env(env: str, known: list[str], why: str) -> ValueError:
    close = difflib.get_close_matches(env.removeprefix(ENVPOOL_PREFIX), known)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return ValueError(
        f"environment(env={env!r}): {why}{hint} Give a gymnasium or envpool id (e.g. "
        "'CartPole-v1'), a name given to register_env, a creator callable/class taking "
        "env_config, or an import path 'package.module:EnvClass'."
    )


def check_restorable(env: Any, env_config: Mapping[str, Any] | None, where: str) -> None:
    """Raises a ValueError saying how to pass the env back when ``env``, as a checkpoint
    stored it, does not resolve in this process."""
    how = (
        "Pass the creator back: IMPALA.from_checkpoint(path, env=creator); or register it "
        "under a name with impala_jax.register_env(name, creator) (or ray.tune.register_env), "
        "train with environment(name), and register it again before from_checkpoint."
    )
    if isinstance(env, str) and env.startswith("<instance of "):
        raise ValueError(
            f"{where} was trained on an env instance, {env}, which a checkpoint cannot store "
            "(it holds no pickled objects). Pass it back: IMPALA.from_checkpoint(path, "
            "env=MyEnv(...)); or train with the class, its import path 'pkg.module:MyEnv' or a "
            "name given to register_env, which checkpoints store."
        )
    if isinstance(env, str) and ("<lambda>" in env or "<locals>" in env):
        raise ValueError(
            f"{where} was trained on {env!r}, a lambda or local function, which a checkpoint "
            f"cannot store (it holds no pickled code). {how}"
        )
    try:
        choose_env(env, env_config)
    except ValueError as err:
        raise ValueError(
            f"{where} names the env {env!r}, which does not resolve here ({err}). {how}"
        ) from err
