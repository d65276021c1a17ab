"""One vectorised-env interface over envpool and gymnasium.vector.

Both backends give next-step autoreset (see types.py): the step that ends an episode returns
the final observation, the next step ignores its action and returns the reset observation.
The interface is envpool's asynchronous one, used strictly in alternation::

    env.async_reset()                  # exactly once
    obs, reward, terminated, truncated = env.recv()
    env.send(action)                   # then recv, send, recv, ...

Every env in a VecEnv is stepped by every send; ``recv`` returns all ``num_envs`` rows in env-id
order. Actions are checked before they are sent, because envpool silently accepts out-of-range
actions (and a C++ env given a NaN torque just integrates it).

``choose_env`` decides what ``environment(env=...)`` names, as RLlib does (a name given to
``register_env`` first, then ids and import paths), and uses envpool for a gymnasium id only
where envpool's env is the same env (``ENVPOOL_SAME_AS_GYMNASIUM``, checked by the tests).
"""

from __future__ import annotations

import abc
import contextlib
import difflib
import functools
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np


def import_envpool():
    """envpool, imported without running its env families' package ``__init__``s.

    ``import envpool`` registers every family (envpool/entry.py) by importing
    ``envpool.<family>.registration``, and Python runs the family's package ``__init__`` first:
    it loads the family's C++ extension and builds Python classes for each of its envs (152
    ``py_env`` classes in envpool 1.2.5), and jumanji's imports its renderer and with it
    matplotlib.pyplot. A CartPole run makes one family's envs. The registration modules need
    nothing from those ``__init__``s: they name ``"envpool.<family>"`` as an import path that
    ``envpool.make`` imports when it makes an env. So bare packages stand in for the families
    while envpool imports, and are taken out again afterwards: making an env then imports its
    real family package as usual. Measured with JAX already imported: ``import envpool`` 0.29-0.43
    s -> 0.02-0.03 s, the first CartPole make 0.001 -> 0.04-0.08 s (2 busy cores). Anything
    unexpected (another envpool layout) falls back to the plain import.
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
        _take_out(stand_ins)
    return envpool


def bare_package(name: str, path: Path) -> types.ModuleType:
    """An empty package ``name`` whose submodules are found in ``path``: it stands in for a
    package while some of its submodules import, without running its ``__init__``."""
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    package.__spec__.submodule_search_locations = [str(path)]
    return package


def _take_out(stand_ins: dict) -> None:
    """Removes import_envpool's stand-in packages from sys.modules and from their parents."""
    for name, package in stand_ins.items():
        if sys.modules.get(name) is package:
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is package:
            delattr(sys.modules[parent], child)


class VecEnv(abc.ABC):
    """``num_envs`` copies of one env with next-step autoreset behind recv/send."""

    num_envs: int
    observation_space: gym.Space  # of one env
    action_space: gym.Space  # of one env
    name: str

    @abc.abstractmethod
    def async_reset(self) -> None:
        """Resets every env; called exactly once, before the first recv."""

    @abc.abstractmethod
    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(obs, reward, terminated, truncated) of every env, in env-id order."""

    @abc.abstractmethod
    def send(self, action: np.ndarray) -> None:
        """Steps every env with its row of ``action`` (already checked)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the envs."""


@contextlib.contextmanager
def _quiet_box_casts():
    """envpool builds its Box spaces from float64 bounds, and gymnasium warns about each."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting")
        yield


class _Binding(NamedTuple):
    recv: tuple[int, ...]  # positions of env_id, obs, reward, done, trunc in _recv()'s list
    action_dtype: np.dtype


def _binding_layout(env) -> _Binding | None:
    """Where envpool's binding puts what recv returns, for the one layout the fast path
    knows (one observation array, one action array, one player per env); None otherwise, and
    recv and send go through envpool's Python API."""
    try:
        keys = list(env._state_keys)
        action_keys = list(env._spec._action_keys)
        action_dtype = np.dtype(env._spec._action_spec[-1][0])
        players = env.config.get("max_num_players", 1)
    except (AttributeError, IndexError, TypeError):  # another envpool: its Python API only
        return None
    if not (callable(getattr(env, "_recv", None)) and callable(getattr(env, "_send", None))):
        return None
    wanted = ("info:env_id", "obs", "reward", "done", "trunc")
    if action_keys != ["env_id", "players.env_id", "action"] or players != 1:
        return None
    if any(keys.count(k) != 1 for k in wanted) or any(k.startswith("obs:") for k in keys):
        return None
    return _Binding(tuple(keys.index(k) for k in wanted), action_dtype)


class EnvpoolVecEnv(VecEnv):
    """envpool in its async API with ``batch_size == num_envs``: one recv returns every env."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        env_config: Mapping[str, Any],
        num_threads: int = 1,
    ):
        envpool = import_envpool()

        self.name = env_id
        self.num_envs = num_envs
        options = dict(env_config)
        # env_runners(num_cpus_per_env_runner=N) sizes envpool's worker thread pool; an
        # explicit env_config["num_threads"] wins (envpool's own option).
        options.setdefault("num_threads", num_threads)
        try:
            with _quiet_box_casts():
                self._env = envpool.make(
                    env_id,
                    env_type="gymnasium",
                    num_envs=num_envs,
                    batch_size=num_envs,
                    seed=seed,
                    **options,
                )
        except TypeError as err:
            raise ValueError(
                f"environment(env_config=...) for envpool env {env_id!r} has an option envpool "
                f"does not know: {err}. Valid options are the fields of "
                f"envpool.make_spec({env_id!r}).config."
            ) from err
        with _quiet_box_casts():
            self.observation_space = self._env.single_observation_space
            self.action_space = self._env.single_action_space
        self._env_ids = np.arange(num_envs, dtype=np.int32)
        self._binding = _binding_layout(self._env)
        self._sent = False  # the first send goes through envpool's own (its one action check)

    def async_reset(self) -> None:
        self._env.async_reset()

    def recv(self):
        if self._binding is not None:
            # envpool's C++ binding, not its Python recv and send, which build a gymnasium
            # step and info dict thrown away here and re-check every action: ~9 us of Python
            # per step in isolation, but CartPole training (256 envs, 2 cores) sampled 1.06x
            # and 1.11x as fast without them (medians of 10 and 8 paired runs), the runner
            # thread's Python being what it waits on most (the GIL; benchmarks/README.md).
            state = self._env._recv()
            env_id, obs, reward, done, trunc = (state[i] for i in self._binding.recv)
            terminated = done & ~trunc  # what envpool's gymnasium API returns
        else:
            obs, reward, terminated, trunc, info = self._env.recv()
            env_id = info["env_id"]
        # With batch_size == num_envs envpool returns every env, but not always in id order.
        if np.any(env_id != self._env_ids):
            order = np.argsort(env_id)
            obs, reward = obs[order], reward[order]
            terminated, trunc = terminated[order], trunc[order]
        return obs, reward.astype(np.float32), terminated, trunc

    def send(self, action: np.ndarray) -> None:
        if self._binding is not None and self._sent:
            ids = self._env_ids.copy()  # fresh arrays, as envpool's own send gives it
            self._env._send([ids, ids, action.astype(self._binding.action_dtype, order="C")])
        else:
            self._env.send(action, self._env_ids)
            self._sent = True

    def close(self) -> None:
        self._env.close()


class GymnasiumVecEnv(VecEnv):
    """gymnasium.vector (sync or async) for gymnasium ids and creators.

    A creator is called once per env with an ``EnvContext`` (``env_config`` plus where the
    env runs); a gymnasium id is made with ``env_config`` as ``gymnasium.make`` kwargs.
    """

    def __init__(
        self,
        env: str | Callable,
        num_envs: int,
        seed: int,
        env_config: Mapping[str, Any],
        vectorize_mode: str = "sync",
        name: str | None = None,
        worker_index: int = 0,
        num_workers: int = 0,
        first_vector_index: int = 0,
    ):
        if isinstance(env, str):
            self.name = name or env
            fns = [functools.partial(gym.make, env, **dict(env_config))] * num_envs
        else:
            self.name = name or getattr(env, "__qualname__", repr(env))
            fns = [
                functools.partial(
                    _call_creator,
                    env,
                    EnvContext(env_config, worker_index, first_vector_index + i, num_workers),
                )
                for i in range(num_envs)
            ]
        _probe(fns[0], self.name)
        mode = gym.vector.AutoresetMode.NEXT_STEP
        if vectorize_mode.lower() == "async":
            self._env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
        else:
            self._env = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
        self.num_envs = num_envs
        self.observation_space = self._env.single_observation_space
        self.action_space = self._env.single_action_space
        self._seed = seed
        self._result = None

    def async_reset(self) -> None:
        obs, _ = self._env.reset(seed=[self._seed + i for i in range(self.num_envs)])
        zeros = np.zeros(self.num_envs, bool)
        self._result = (obs, np.zeros(self.num_envs, np.float32), zeros, zeros)

    def recv(self):
        return self._result

    def send(self, action: np.ndarray) -> None:
        obs, reward, terminated, truncated, _ = self._env.step(action)
        self._result = (obs, np.asarray(reward, np.float32), terminated, truncated)

    def close(self) -> None:
        self._env.close()


def _probe(make_one: Callable, name: str) -> None:
    """Builds one env, resets and steps it once: a broken env fails here, clearly named."""
    try:
        env = make_one()
    except Exception as err:
        raise ValueError(
            f"env {name!r} raised in its constructor: {type(err).__name__}: {err}. Fix the env "
            "or its environment(env_config=...)."
        ) from err
    try:
        space = env.observation_space
        obs, _ = env.reset(seed=0)
        _check_obs(obs, space, name, "reset()")
        obs = env.step(env.action_space.sample())[0]
        _check_obs(obs, space, name, "step()")
    finally:
        env.close()


def _check_obs(obs, space: gym.Space, name: str, where: str) -> None:
    obs = np.asarray(obs)
    if isinstance(space, gym.spaces.Box) and (
        obs.shape != space.shape or obs.dtype.kind not in "biuf"
    ):
        raise ValueError(
            f"env {name!r}: {where} returned an observation of shape {obs.shape} and dtype "
            f"{obs.dtype}, but its observation_space is {space}; make them agree."
        )


@functools.cache
def _envpool_ids() -> frozenset[str]:
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
    if env_id not in _envpool_ids():
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
_ENVPOOL_BATCH_OPTIONS = frozenset(
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

    backend: str  # "envpool" or "gymnasium"
    target: str | Callable  # an envpool or gymnasium id, or a creator fn(env_context)
    name: str  # the user's spelling, for messages


REGISTERED: dict[str, Callable] = {}


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
    REGISTERED[name] = env_creator


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


def _call_creator(creator: Callable, env_context: EnvContext) -> gym.Env:
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
    3. ``"pkg.module:Name"``: the class or function ``Name`` of that module, or gymnasium's
       ``"module:<id>"`` (import the module, which registers ``<id>``: ``"ale_py:ALE/Pong-v5"``);
    4. a gymnasium id (``ALE/`` ids import ale_py first): gymnasium's env, or envpool's where
       it is the same env (``ENVPOOL_SAME_AS_GYMNASIUM``) and every ``env_config`` key is an
       envpool option (``is_slippery=False`` for FrozenLake-v1 is gymnasium's alone);
    5. an id only envpool has (``"Pong-v5"``);
    6. a class or function: called per env with an ``EnvContext``.
    """
    env_config = env_config or {}
    if callable(env) and not isinstance(env, str):
        return EnvChoice("gymnasium", env, getattr(env, "__qualname__", repr(env)))
    if not isinstance(env, str):
        raise ValueError(
            f"environment(env={env!r}): expected an env id string or a creator callable/class."
        )
    creator = registered_creator(env)
    if creator is not None:
        return EnvChoice("gymnasium", creator, env)
    if env.startswith(ENVPOOL_PREFIX):
        env_id = env[len(ENVPOOL_PREFIX) :]
        if env_id not in _envpool_ids():
            raise _unknown_env(env, sorted(_envpool_ids()), "envpool has no env of that id.")
        return EnvChoice("envpool", env_id, env)
    if ":" in env and env not in gym.registry:
        module, _, attr = env.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"environment(env={env!r}): cannot import module {module!r} ({err})."
            ) from err
        if hasattr(found, attr):
            return EnvChoice("gymnasium", getattr(found, attr), env)
        if attr not in gym.registry:
            raise ValueError(
                f"environment(env={env!r}): module {module!r} has no attribute {attr!r}, and "
                f"importing it registered no gymnasium id {attr!r}."
            )
        return EnvChoice("gymnasium", attr, env)
    if env.startswith("ALE/") and env not in gym.registry:
        _register_ale(env)
    if env in gym.registry:
        same = env in ENVPOOL_SAME_AS_GYMNASIUM and env in _envpool_ids()
        if same and set(env_config) <= envpool_options(env):
            return EnvChoice("envpool", env, env)
        return EnvChoice("gymnasium", env, env)
    if env in _envpool_ids():
        return EnvChoice("envpool", env, env)
    raise _unknown_env(
        env,
        sorted(_envpool_ids() | set(gym.registry) | set(REGISTERED)),
        "no env is registered under that name (impala_jax.register_env or "
        "ray.tune.register_env), and neither envpool nor gymnasium has that id.",
    )


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


def make_vec_env(
    env: Any,
    num_envs: int,
    seed: int,
    env_config: Mapping[str, Any] | None = None,
    vectorize_mode: str = "sync",
    num_cpus: float = 1,
    *,
    worker_index: int = 0,
    num_workers: int = 0,
    first_vector_index: int = 0,
) -> VecEnv:
    """The backend ``choose_env`` picks, with a clear error when nothing has ``env``.

    ``num_cpus`` (``num_cpus_per_env_runner``) is envpool's ``num_threads``: ceil(num_cpus),
    at least 1 (a fraction of a CPU still needs a thread). gymnasium.vector has no such pool,
    so more than 1 for an env envpool does not have is an error. ``worker_index``,
    ``num_workers`` and ``first_vector_index`` fill a creator's ``EnvContext``.
    """
    env_config = env_config or {}
    choice = choose_env(env, env_config)
    if choice.backend == "envpool":
        vec = EnvpoolVecEnv(choice.target, num_envs, seed, env_config, max(1, math.ceil(num_cpus)))
        check_spaces(vec)
        return vec
    _check_no_thread_pool(choice.name, num_cpus)
    try:
        vec = GymnasiumVecEnv(
            choice.target,
            num_envs,
            seed,
            env_config,
            vectorize_mode,
            name=choice.name,
            worker_index=worker_index,
            num_workers=num_workers,
            first_vector_index=first_vector_index,
        )
        check_spaces(vec)
    except ValueError as err:
        target = choice.target
        if not isinstance(target, str) or target not in _envpool_ids():
            raise
        if target in ENVPOOL_SAME_AS_GYMNASIUM:
            others = sorted(set(env_config) - envpool_options(target))
            hint = (
                f"gymnasium's {target!r} was used because env_config has {others}, which "
                f"envpool's (the same env) does not take; envpool's options: "
                f"{sorted(envpool_options(target) - _ENVPOOL_BATCH_OPTIONS)}."
            )
        else:
            hint = (
                f"envpool has its own {target!r}, not checked to be the same env as "
                f"gymnasium's: environment('{ENVPOOL_PREFIX}{target}') uses it."
            )
        raise ValueError(f"{err} {hint}") from err
    return vec


def _check_no_thread_pool(env: Any, num_cpus: float) -> None:
    if num_cpus > 1:
        raise ValueError(
            f"env_runners(num_cpus_per_env_runner={num_cpus!r}): {env!r} runs under "
            "gymnasium.vector, which steps its envs in the runner's thread (sync) or in one "
            "process per env (async); only envpool envs have a worker thread pool for this to "
            "size. Leave num_cpus_per_env_runner at 1, or use "
            "env_runners(gym_env_vectorize_mode='async') for one process per env."
        )


def check_spaces(vec: VecEnv) -> None:
    obs, act = vec.observation_space, vec.action_space
    if not isinstance(obs, gym.spaces.Box | gym.spaces.Discrete):
        vec.close()
        raise ValueError(
            f"env {vec.name!r}: observation space {obs} is not supported; use a Box or Discrete "
            "observation space (wrap Dict/Tuple observations with a gymnasium FlattenObservation)."
        )
    if not (
        isinstance(act, gym.spaces.Discrete)
        or (isinstance(act, gym.spaces.Box) and len(act.shape) == 1)
    ):
        vec.close()
        raise ValueError(
            f"env {vec.name!r}: action space {act} is not supported; impala_jax handles "
            "Discrete and 1-D Box action spaces."
        )


class ActionAdapter:
    """Turns policy actions into env actions and checks them before they reach the env.

    Box actions follow RLlib: with ``normalize_actions`` the policy acts in [-1, 1] and the
    action is mapped linearly onto the env's bounds (then clipped to them); otherwise, with
    ``clip_actions``, it is clipped to the bounds. Anything still out of range is an error.
    """

    def __init__(self, space: gym.Space, normalize_actions: bool, clip_actions: bool, name: str):
        self.space = space
        self.name = name
        self.discrete = isinstance(space, gym.spaces.Discrete)
        if self.discrete:
            self.low, self.high = int(space.start), int(space.start + space.n - 1)
            self.start = int(space.start)
        else:
            self.low = space.low.astype(np.float32)
            self.high = space.high.astype(np.float32)
            bounded = np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high))
            self.normalize = bool(normalize_actions and bounded)
            self.clip = bool(clip_actions and bounded)

    def __call__(self, action: np.ndarray, num_envs: int) -> np.ndarray:
        if self.discrete:
            if action.shape != (num_envs,) or action.dtype.kind not in "iu":
                raise ValueError(
                    f"env {self.name!r}: expected integer actions of shape ({num_envs},), got "
                    f"{action.dtype} {action.shape}."
                )
            env_action = action.astype(np.int32) + self.start if self.start else action
            lo, hi = env_action.min(), env_action.max()
            if lo < self.low or hi > self.high:
                raise ValueError(
                    f"env {self.name!r}: action {lo if lo < self.low else hi} is outside "
                    f"{self.space}; valid actions are {self.low}..{self.high}."
                )
            return env_action
        if action.shape != (num_envs, *self.space.shape):
            raise ValueError(
                f"env {self.name!r}: expected actions of shape {(num_envs, *self.space.shape)}, "
                f"got {action.shape}."
            )
        if not np.all(np.isfinite(action)):
            raise ValueError(f"env {self.name!r}: non-finite action {action}.")
        action = action.astype(np.float32)
        if self.normalize:
            action = self.low + (action + 1.0) * 0.5 * (self.high - self.low)
            return np.clip(action, self.low, self.high)
        if self.clip:
            return np.clip(action, self.low, self.high)
        if np.any(action < self.low) or np.any(action > self.high):
            raise ValueError(
                f"env {self.name!r}: action {action[(action < self.low) | (action > self.high)][0]}"
                f" is outside {self.space}. Set environment(normalize_actions=True) or "
                "environment(clip_actions=True) to map policy outputs into the bounds."
            )
        return action
