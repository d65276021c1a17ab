"""Evaluation: ``evaluation_duration`` episodes or timesteps with the current params."""

from __future__ import annotations

from collections.abc import Callable

from impala_jax.env_runner import EnvRunner, ParamStore
from impala_jax.metrics import EpisodeStats

# Offset of the evaluation envs' seeds from the run's seed: far from every training runner's.
EVAL_SEED_OFFSET = 1_000_003


class Evaluator:
    """Runs in the caller's thread on its own envs, built on first use, with
    ``evaluation_config`` applied; it acts greedily unless that config sets ``explore=True``.
    """

    def __init__(
        self, config, act: Callable, act_greedy: Callable, param_store: ParamStore, seed: int
    ):
        self.config = config
        self._act, self._act_greedy = act, act_greedy
        self._param_store = param_store
        self._seed = seed
        self._runner: EnvRunner | None = None

    def _make_runner(self) -> EnvRunner:
        cfg = self.config
        eval_cfg = cfg.copy(copy_frozen=False)
        overrides = dict(cfg.evaluation_config or {})
        overrides.setdefault("explore", False)
        eval_cfg.update_from_dict(overrides)
        num_envs = max(1, cfg.evaluation_num_env_runners) * eval_cfg.num_envs_per_env_runner
        eval_cfg.env_runners(num_envs_per_env_runner=num_envs)
        return EnvRunner(
            eval_cfg,
            -1,
            self._act,
            self._act_greedy,
            self._param_store,
            seed=self._seed + EVAL_SEED_OFFSET,
            explore=eval_cfg.explore,
        )

    def evaluate(self) -> dict:
        """RLlib's ``evaluation`` result: ``{"env_runners": {episode_return_mean, ...}}``."""
        if self._runner is None:
            self._runner = self._make_runner()
        runner = self._runner
        runner.episodes.drain()
        episodes: list = []
        steps0 = runner.env_steps
        unit, duration = self.config.evaluation_duration_unit, self.config.evaluation_duration
        while True:
            runner.sample()
            episodes.extend(runner.episodes.drain())
            if unit == "episodes" and len(episodes) >= duration:
                break
            if unit == "timesteps" and runner.env_steps - steps0 >= duration:
                break
        stats = EpisodeStats(max(1, len(episodes)))
        stats.add(episodes)
        return {"env_runners": stats.result(len(episodes), runner.env_steps - steps0)}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
