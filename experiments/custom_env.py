"""Bring your own env: a gymnasium.Env class defined right here, configured through env_config.

``environment(env=CorridorEnv, env_config={...})`` takes the class itself (a creator function
or an import path "package.module:CorridorEnv" work too). impala_jax calls
``CorridorEnv(env_config)`` once per env and steps the copies under ``gymnasium.vector`` with
next-step autoreset, exactly like envpool's envs. Keep the class importable (module level, not
inside a function): checkpoints store it by its import path. Run from the repository root,
that path is ``experiments.custom_env:CorridorEnv``, so ``--resume`` and
``IMPALA.from_checkpoint(path)`` in a Python started in the repository root find it again
(elsewhere: put the repository root on PYTHONPATH).

The env: walk right along a corridor of ``length`` cells to the goal (+1), each step costing
``step_cost``; episodes are cut at ``max_steps``. Optimal return: 1 - (length - 1) * step_cost.

Goal: a return of 0.85 within 0.5 M env steps (the stop below); not measured here.
"""

import gymnasium as gym
import numpy as np

from impala_jax import IMPALAConfig


class CorridorEnv(gym.Env):
    """Observation: [position / length, 1]; actions: 0 = left, 1 = right."""

    def __init__(self, env_config: dict | None = None):
        env_config = env_config or {}
        self.length = int(env_config.get("length", 10))
        self.step_cost = float(env_config.get("step_cost", 0.01))
        self.max_steps = int(env_config.get("max_steps", 100))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / self.length, 1.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        self.steps += 1
        terminated = self.pos >= self.length - 1
        reward = 1.0 if terminated else -self.step_cost
        truncated = not terminated and self.steps >= self.max_steps
        return self._obs(), reward, terminated, truncated, {}


config = (
    IMPALAConfig()
    .environment(CorridorEnv, env_config={"length": 10, "step_cost": 0.01, "max_steps": 100})
    .env_runners(num_env_runners=1, num_envs_per_env_runner=16, rollout_fragment_length=20)
    .training(lr=3e-3, train_batch_size_per_learner=320, entropy_coeff=0.01)
    .learners(num_learners=0)
    .rl_module(model_config={"fcnet_hiddens": [32]})
    .reporting(min_time_s_per_iteration=1.0)
    .debugging(seed=0)
)

# The optimum is 1 - 9 * 0.01 = 0.91.
stop = {"env_runners/episode_return_mean": 0.85, "num_env_steps_sampled_lifetime": 500_000}
