"""Small gymnasium envs whose observations expose the truth the tests check against."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

GAMMA = 0.9


class ReturnEnv(gym.Env):
    """Observation = (remaining discounted return of the episode, steps taken so far).

    Each episode draws a length in [min_len, max_len] and random rewards; the action is
    ignored. Wrapped in a TimeLimit of ``max_steps`` (< max_len), some episodes are truncated:
    their final observation still carries the return the episode would have gone on to earn,
    which is exactly the bootstrap V-trace must use at a truncation.
    """

    def __init__(self, config=None):
        config = dict(config or {})
        self.min_len = config.get("min_len", 2)
        self.max_len = config.get("max_len", 12)
        self.gamma = config.get("gamma", GAMMA)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._rng = np.random.default_rng(config.get("seed", 0))

    def _obs(self):
        return np.array([self._returns[self._k], self._k], np.float32)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        n = int(self._rng.integers(self.min_len, self.max_len + 1))
        self._rewards = self._rng.uniform(-1, 1, n).astype(np.float64)
        self._returns = np.zeros(n + 1)
        for k in reversed(range(n)):
            self._returns[k] = self._rewards[k] + self.gamma * self._returns[k + 1]
        self._k = 0
        return self._obs(), {}

    def step(self, action):
        r = self._rewards[self._k]
        self._k += 1
        terminated = self._k == len(self._rewards)
        return self._obs(), float(r), terminated, False, {}


def make_return_env(config):
    return gym.wrappers.TimeLimit(ReturnEnv(config), max_episode_steps=config.get("max_steps", 7))


class SlowEnv(gym.Env):
    """Sleeps in every step: an env slower than the learner queue timeout."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.delay = dict(config or {}).get("delay", 1.0)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        return np.zeros(2, np.float32), 0.0, False, False, {}


class FlakyCartPole(gym.Wrapper):
    """CartPole whose ``step`` raises with probability ``p`` (RLlib's fault-injection env).

    The first step of each instance never fails: that is the build-time probe of a fresh env
    (vec_env._probe), which checks the env's output; the faults are for sampling to survive.
    """

    def __init__(self, config=None):
        config = dict(config or {})
        super().__init__(gym.make("CartPole-v1"))
        self.p = config.get("p", 0.001)
        self._rng = np.random.default_rng(config.get("seed", None))
        self._stepped = False

    def step(self, action):
        first, self._stepped = not self._stepped, True
        if not first and self._rng.random() < self.p:
            raise RuntimeError("injected env failure")
        return self.env.step(action)


class SeededFault(gym.Env):
    """Fails (raise or hang) in ``step`` when first reset with a seed in
    ``[from_seed, until_seed)``.

    Runner i gets seeds ``seed + i * num_envs``, so ``from_seed`` picks which runners fail
    (a restarted runner gets seeds after every first-generation runner's: ``until_seed`` can
    spare it). The same error at the same step every time, unless ``vary`` puts the env's
    seed in the message.
    """

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        config = dict(config or {})
        self.from_seed = config.get("from_seed", 0)
        self.until_seed = config.get("until_seed", float("inf"))
        self.vary = config.get("vary", False)
        self.mode = config.get("mode", "raise")
        self.hang_s = config.get("hang_s", 5.0)
        self.faulty = None
        self._t = 0

    def reset(self, *, seed=None, options=None):
        if self.faulty is None:
            self.faulty = seed is not None and self.from_seed <= seed < self.until_seed
            self.seed = seed
        self._t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self._t += 1
        if self.faulty and self._t > 3:
            if self.mode == "hang":
                time.sleep(self.hang_s)
            elif self.vary:
                raise RuntimeError(f"injected runner failure (env seed {self.seed})")
            else:
                raise RuntimeError("injected runner failure")
        return np.zeros(2, np.float32), 1.0, self._t >= 10, False, {}


class NaNRewardEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        pass

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), float("nan"), False, False, {}


class WrongShapeEnv(NaNRewardEnv):
    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


class RaisingConstructorEnv(NaNRewardEnv):
    def __init__(self, config=None):
        raise OSError("simulator license not found")


class DictObsEnv(NaNRewardEnv):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32)})


class MultiDiscreteActionEnv(NaNRewardEnv):
    action_space = gym.spaces.MultiDiscrete([2, 3])


class ContinuousBandit(gym.Env):
    """One-step episodes, reward -(a - target)^2: the Gaussian policy's mean must find target."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, config=None):
        self.target = dict(config or {}).get("target", 0.5)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), float(-((action[0] - self.target) ** 2)), True, False, {}


class ContextEnv(gym.Env):
    """Observes where it was created: (worker_index, vector_index, num_workers) of its
    EnvContext, so tests can read what a creator was given."""

    observation_space = gym.spaces.Box(-1, 100, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config):
        self.where = np.array(
            [config.worker_index, config.vector_index, config.num_workers], np.float32
        )
        self.config = dict(config)

    def reset(self, *, seed=None, options=None):
        return self.where, {}

    def step(self, action):
        return self.where, 1.0, True, False, {}


class CueMemoryEnv(gym.Env):
    """Remember a cue: it is shown only in the first observation, and the action taken ``delay``
    steps later earns 1 if it repeats the cue, else 0 (the episode then ends).

    Observation: [cue one-hot (zero after the first step), query flag (1 on the answer step)].
    Every observation after the first is the same whatever the cue, so a memoryless policy
    scores 1 / num_cues in expectation; a recurrent one can score 1.
    """

    def __init__(self, config=None):
        config = dict(config or {})
        self.delay = config.get("delay", 4)
        self.num_cues = config.get("num_cues", 2)
        self.observation_space = gym.spaces.Box(0, 1, (self.num_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(self.num_cues)
        self._rng = np.random.default_rng(config.get("seed", None))

    def _obs(self):
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        obs[-1] = float(self._t == self.delay)
        return obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._cue = int(self._rng.integers(self.num_cues))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t == self.delay:
            return self._obs(), float(int(action) == self._cue), True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


class ImageCueEnv(gym.Env):
    """A frame-stacked uint8 image, channels first as envpool's Atari frames are, showing a bright
    bar in one of ``num_cues`` columns; the action naming that column earns 1, any other 0.
    A new column every step, ``length`` steps per episode: a uniform policy scores
    ``length / num_cues``, one that reads the image scores ``length``."""

    def __init__(self, config=None):
        config = dict(config or {})
        self.num_cues = config.get("num_cues", 4)
        self.size = config.get("size", 36)
        self.length = config.get("length", 10)
        self.observation_space = gym.spaces.Box(0, 255, (4, self.size, self.size), np.uint8)
        self.action_space = gym.spaces.Discrete(self.num_cues)
        self._rng = np.random.default_rng(config.get("seed", None))

    def _obs(self):
        obs = np.zeros(self.observation_space.shape, np.uint8)
        width, third = self.size // self.num_cues, self.size // 3
        obs[:, third : 2 * third, self._cue * width : (self._cue + 1) * width] = 255
        return obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t, self._cue = 0, int(self._rng.integers(self.num_cues))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self._cue)
        self._t += 1
        self._cue = int(self._rng.integers(self.num_cues))
        return self._obs(), reward, self._t >= self.length, False, {}
