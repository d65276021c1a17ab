"""Craftax (Matthews et al. 2024, arXiv 2402.16801) on device: ``environment("craftax:<id>")``.

``CraftaxEnv`` is a ``core.rollout.JaxEnv`` of one of Craftax's envs made without autoreset
(``craftax.craftax_env.make_craftax_env_from_name(id, auto_reset=False)``: our rollout resets),
with gymnasium spaces, as ``jax_envs.GymnaxEnv`` is for gymnax. Craftax's interface is
gymnax's, but its base classes are its own (``craftax.environment_base``), so its envs are
named by their prefix rather than recognised by their class. ``env_config`` sets fields of
the env's ``EnvParams`` (``{"max_timesteps": 1000}``).

Craftax's ``done`` includes its time limit (``state.timestep >= params.max_timesteps``); here
that is a truncation, so V-trace bootstraps there, and ``terminated`` is death (or, in
Craftax, the beaten boss).

The score, as the Craftax and Crafter papers report it, from each ended episode's final state:

- ``achievements/<name>``: the success rate in percent, the share of episodes in which the
  achievement was unlocked (Hafner 2021, arXiv 2109.06780, section 3: "success rates").
- ``crafter_score``: Crafter's score, ``exp(mean_i ln(1 + s_i)) - 1`` over the success rates
  ``s_i`` in percent (Hafner 2021, eq. 1): a geometric mean, which rewards unlocking more
  achievements over raising the rates of easy ones.
- ``episode_return_pct_of_max``: the mean episode return as a percentage of the most an episode
  can earn, the sum of the achievements' rewards (226 in Craftax, 22 in Craftax-Classic). This
  is what the Craftax paper and its scoreboard report ("Reward (% max)", the Craftax repo's
  README), e.g. PPO-RNN's 2.3 % on Craftax-1M.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Mapping
from typing import Any

from impala_jax.runtime.envs.jax_envs import GymnaxEnv, to_gymnasium, with_config

CRAFTAX_PREFIX = "craftax:"
# The ids make_craftax_env_from_name makes without autoreset.
CRAFTAX_IDS = (
    "Craftax-Symbolic-v1",
    "Craftax-Pixels-v1",
    "Craftax-Classic-Symbolic-v1",
    "Craftax-Classic-Pixels-v1",
)


def crafter_score(success_rates: list[float]) -> float:
    """Crafter's score of success rates in percent (Hafner 2021, eq. 1): ``exp(mean(ln(1 +
    s))) - 1``, in percent too; 0 when nothing is ever unlocked, 100 when everything always
    is."""
    if not success_rates:
        return float("nan")
    return math.exp(sum(math.log1p(s) for s in success_rates) / len(success_rates)) - 1.0


def _achievements(classic: bool) -> tuple[list[str], float]:
    """The names of the achievements (index order) and the most an episode can earn."""
    if classic:
        from craftax.craftax_classic.constants import Achievement

        return [a.name.lower() for a in sorted(Achievement, key=lambda a: a.value)], float(
            len(Achievement)
        )
    from craftax.craftax.constants import ACHIEVEMENT_REWARD_MAP, Achievement

    names = [a.name.lower() for a in sorted(Achievement, key=lambda a: a.value)]
    return names, float(ACHIEVEMENT_REWARD_MAP.sum())


class CraftaxEnv(GymnaxEnv):
    """One Craftax env, without autoreset, with its params (see the module docstring)."""

    def __init__(self, env_id: str, env_config: Mapping[str, Any] | None = None):
        name = CRAFTAX_PREFIX + env_id
        try:
            from craftax.craftax_env import make_craftax_env_from_name
        except ImportError as err:
            raise ValueError(
                f"environment({name!r}) needs the craftax package ({err}); install the "
                "craftax extra: pip install -e '.[craftax]' (make test installs it)."
            ) from err
        env = make_craftax_env_from_name(env_id, auto_reset=False)
        self.name, self.version = name, importlib.metadata.version("craftax")
        self._env = env
        self.params = with_config(env.default_params, env_config or {}, name)
        self.observation_space = to_gymnasium(
            env.observation_space(self.params), "observation", name
        )
        self.action_space = to_gymnasium(env.action_space(self.params), "action", name)
        self.achievements, self.max_episode_return = _achievements("Classic" in env_id)
        self._check_traces()

    def step(self, key, state, action):
        import jax.numpy as jnp

        obs, state, reward, done, _ = self._env.step_env(key, state, action, self.params)
        # Whether the episode would end without its time limit: death (or the beaten boss).
        terminated = self._env.is_terminal(state.replace(timestep=0), self.params)
        truncated = done & ~terminated
        return obs.astype(jnp.float32), state, reward.astype(jnp.float32), terminated, truncated

    def episode_metrics(self, state) -> dict:
        """``achievements/<name>``: 100 where the episode that ended in ``state`` unlocked it."""
        import jax.numpy as jnp

        unlocked = state.achievements.astype(jnp.float32) * 100.0
        return {f"achievements/{n}": unlocked[i] for i, n in enumerate(self.achievements)}

    def summarize_episodes(self, means: Mapping[str, float]) -> dict[str, float]:
        """``crafter_score`` of the success rates and ``episode_return_pct_of_max``, from the
        means of ``episode_metrics`` and ``episode_return_mean``."""
        rates = [means[f"achievements/{n}"] for n in self.achievements]
        return {
            "crafter_score": crafter_score(rates),
            "episode_return_pct_of_max": 100.0
            * means["episode_return_mean"]
            / self.max_episode_return,
        }
