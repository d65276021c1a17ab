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
"""

from __future__ import annotations

import abc
import contextlib
import difflib
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np


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


class EnvpoolVecEnv(VecEnv):
    """envpool in its async API with ``batch_size == num_envs``: one recv returns every env."""

    def __init__(self, env_id: str, num_envs: int, seed: int, env_config: Mapping[str, Any]):
        import envpool

        self.name = env_id
        self.num_envs = num_envs
        try:
            with _quiet_box_casts():
                self._env = envpool.make(
                    env_id,
                    env_type="gymnasium",
                    num_envs=num_envs,
                    batch_size=num_envs,
                    seed=seed,
                    **dict(env_config),
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

    def async_reset(self) -> None:
        self._env.async_reset()

    def recv(self):
        obs, reward, terminated, truncated, info = self._env.recv()
        env_id = info["env_id"]
        # With batch_size == num_envs envpool returns every env, but not always in id order.
        if np.any(env_id != self._env_ids):
            order = np.argsort(env_id)
            obs, reward = obs[order], reward[order]
            terminated, truncated = terminated[order], truncated[order]
        return obs, reward.astype(np.float32), terminated, truncated

    def send(self, action: np.ndarray) -> None:
        self._env.send(action, self._env_ids)

    def close(self) -> None:
        self._env.close()


class GymnasiumVecEnv(VecEnv):
    """gymnasium.vector (sync or async) for envs envpool does not have."""

    def __init__(
        self,
        env: str | Callable,
        num_envs: int,
        seed: int,
        env_config: Mapping[str, Any],
        vectorize_mode: str = "sync",
    ):
        if isinstance(env, str):
            self.name = env
            make_one = lambda: gym.make(env, **dict(env_config))
        else:
            self.name = getattr(env, "__qualname__", repr(env))
            make_one = lambda: env(dict(env_config))
        _probe(make_one, self.name)
        fns = [make_one] * num_envs
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


def _envpool_ids() -> set[str]:
    try:
        import envpool
    except ImportError:  # envpool has no wheel for this platform: gymnasium only
        return set()
    return set(envpool.list_all_envs())


def resolve_env(env: Any) -> str | Callable:
    """An env id, a callable/class, or an import path ``"package.module:Name"``."""
    if isinstance(env, str) and ":" in env and env not in gym.registry:
        module, _, attr = env.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"environment(env={env!r}): cannot import {attr!r} from {module!r} ({err})."
            ) from err
    return env


def make_vec_env(
    env: Any,
    num_envs: int,
    seed: int,
    env_config: Mapping[str, Any] | None = None,
    vectorize_mode: str = "sync",
) -> VecEnv:
    """envpool when it has ``env``, else gymnasium.vector; a clear error when neither does."""
    env = resolve_env(env)
    env_config = env_config or {}
    if isinstance(env, str):
        if env in _envpool_ids():
            vec = EnvpoolVecEnv(env, num_envs, seed, env_config)
        elif env in gym.registry:
            vec = GymnasiumVecEnv(env, num_envs, seed, env_config, vectorize_mode)
        else:
            close = difflib.get_close_matches(env, sorted(_envpool_ids() | set(gym.registry)))
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"environment(env={env!r}): no such env in envpool or in the gymnasium registry."
                f"{hint} Give a registered id (e.g. 'CartPole-v1'), a creator callable/class "
                "taking env_config, or an import path 'package.module:EnvClass'."
            )
    elif callable(env):
        vec = GymnasiumVecEnv(env, num_envs, seed, env_config, vectorize_mode)
    else:
        raise ValueError(
            f"environment(env={env!r}): expected an env id string or a creator callable/class."
        )
    check_spaces(vec)
    return vec


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
