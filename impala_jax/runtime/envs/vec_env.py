"""One vectorised-env interface over envpool and gymnasium.vector.

Both backends give next-step autoreset (see types.py): the step that ends an episode returns
the final observation, the next step ignores its action and returns the reset observation.
The interface is envpool's asynchronous one, used strictly in alternation::

    env.async_reset()                  # exactly once
    obs, reward, terminated, truncated = env.recv()
    env.send(action)                   # then recv, send, recv, ...

Every env in a VecEnv is stepped by every send; ``recv`` returns all ``num_envs`` rows in env-id
order. Actions are checked before they are sent (``ActionAdapter``), because envpool silently
accepts out-of-range actions (and a C++ env given a NaN torque just integrates it).
``make_vec_env`` builds the backend that ``env_registry.choose_env`` picks.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from impala_jax.runtime.envs.craftax_envs import CRAFTAX_PREFIX, CraftaxEnv
from impala_jax.runtime.envs.env_registry import (
    ENVPOOL_BATCH_OPTIONS,
    ENVPOOL_PREFIX,
    ENVPOOL_SAME_AS_GYMNASIUM,
    EnvContext,
    call_creator,
    choose_env,
    envpool_ids,
    envpool_options,
    import_envpool,
)
from impala_jax.runtime.envs.jax_envs import adapt_jax_env


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
            # step and info dict thrown away here and re-check every action: the runner
            # thread's Python is what sampling waits on most (benchmarks/README.md, "The
            # runner thread and the GIL").
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
                    call_creator,
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


class JaxVecEnv(VecEnv):
    """An env written in JAX (core.rollout.JaxEnv) stepped from the host: evaluation's envs, and
    any host runner's, for an env that trains on device. Each step is one compiled call of the
    on-device rollout's own ``step_envs``, so both paths see the same envs for the same keys."""

    def __init__(self, env, num_envs: int, seed: int):
        import jax

        from impala_jax.core import rollout

        self.name, self.num_envs = env.name, num_envs
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self._key = jax.random.key(seed)
        self._reset = jax.jit(rollout.reset_envs, static_argnums=(0, 2))

        def step(carry, action):
            carry, keys = rollout.step_keys(carry)
            return rollout.step_envs(env, carry, action, keys)[:4]

        self._step = jax.jit(step)
        self._env = env
        self._carry = None
        self._result = None

    def async_reset(self) -> None:
        self._carry = self._reset(self._env, self._key, self.num_envs)
        n = self.num_envs
        self._result = (
            self._carry.obs,
            np.zeros(n, np.float32),
            np.zeros(n, bool),
            np.zeros(n, bool),
        )

    def recv(self):
        return tuple(np.asarray(x) for x in self._result)

    def send(self, action: np.ndarray) -> None:
        self._carry, reward, terminated, truncated = self._step(self._carry, action)
        self._result = (self._carry.obs, reward, terminated, truncated)

    def close(self) -> None:
        self._carry = self._result = None


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
    if choice.backend in ("gymnax", "craftax"):
        _check_no_thread_pool(choice.name, num_cpus)
        if choice.backend == "craftax":
            jax_env = CraftaxEnv(choice.target[len(CRAFTAX_PREFIX) :], env_config)
        else:
            jax_env = adapt_jax_env(choice.target, env_config, choice.name)
        return JaxVecEnv(jax_env, num_envs, seed)
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
        if not isinstance(target, str) or target not in envpool_ids():
            raise
        if target in ENVPOOL_SAME_AS_GYMNASIUM:
            others = sorted(set(env_config) - envpool_options(target))
            hint = (
                f"gymnasium's {target!r} was used because env_config has {others}, which "
                f"envpool's (the same env) does not take; envpool's options: "
                f"{sorted(envpool_options(target) - ENVPOOL_BATCH_OPTIONS)}."
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


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The envs a runner steps and how it makes them; each field named as the config field it
    comes from (rllib/specs.py builds it, for training and for evaluation)."""

    env: Any  # a gymnasium or envpool id, an env class or a creator
    env_config: Mapping[str, Any]
    gym_env_vectorize_mode: str
    num_envs_per_env_runner: int
    num_cpus_per_env_runner: float
    normalize_actions: bool
    clip_actions: bool
    # The runner count a creator's EnvContext reports: num_env_runners for training,
    # evaluation_num_env_runners for evaluation.
    num_workers: int


def make_runner_envs(
    spec: EnvSpec, num_envs: int, seed: int, worker_index: int, first_vector_index: int = 0
) -> tuple[VecEnv, ActionAdapter]:
    """``num_envs`` envs of ``spec`` seeded from ``seed``, and the adapter their actions pass."""
    env = make_vec_env(
        spec.env,
        num_envs,
        seed,
        spec.env_config,
        spec.gym_env_vectorize_mode,
        num_cpus=spec.num_cpus_per_env_runner,
        worker_index=worker_index,
        num_workers=spec.num_workers,
        first_vector_index=first_vector_index,
    )
    adapter = ActionAdapter(env.action_space, spec.normalize_actions, spec.clip_actions, env.name)
    return env, adapter
