"""Evaluation of a multi-agent run (RLlib's ``Algorithm.evaluate``): the current policies on
envs of their own, in a thread of their own.

The semantics are the single-agent evaluator's (runtime/acting/evaluation.py): every
evaluation starts from freshly reset envs; ``"episodes"`` counts the first
``evaluation_duration`` episodes to end, ``"timesteps"`` steps at least that many env steps,
``"auto"`` steps until the parallel training step has finished; ``evaluation_sample_timeout_s``
bounds it, returning what ended so far with a warning. The envs are
``max(1, evaluation_num_env_runners) x num_envs_per_env_runner`` multi-agent envs stepped
together by one sampler (sampler.py), acting greedily unless ``evaluation_config`` sets
``explore=True``. The result adds RLlib's per-module and per-agent episode means.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from impala_jax.runtime.acting.env_runner import ParamStore
from impala_jax.runtime.metrics import EpisodeStats
from impala_jax.runtime.multiagent.sampler import MultiAgentSampler

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MultiAgentEvaluationSpec:
    """The ``evaluation()`` fields a multi-agent evaluation reads (rllib/multi_agent.py)."""

    evaluation_duration: Any  # int, or "auto"
    evaluation_duration_unit: str  # "episodes" or "timesteps"
    evaluation_sample_timeout_s: float
    window: int  # metrics_num_episodes_for_smoothing


class MultiAgentEvaluator:
    """``make_sampler()`` builds the evaluation's envs and greedy (or exploring) sampler; the
    policies' params are read from ``param_store`` at every step."""

    def __init__(
        self,
        spec: MultiAgentEvaluationSpec,
        make_sampler: Callable[[], MultiAgentSampler],
        param_store: ParamStore,
        module_names: list[str],
    ):
        self.spec, self._make_sampler = spec, make_sampler
        self._store, self._modules = param_store, module_names
        self._stats = EpisodeStats(spec.window)
        self._env_steps_lifetime = 0

    def evaluate(self, algorithm=None, training_done: Callable[[], bool] | None = None) -> dict:
        """One evaluation, in its own thread, waited for at most the timeout."""
        stop = threading.Event()
        box: dict[str, Any] = {"episodes": [], "env_steps": 0}
        thread = threading.Thread(
            target=self._run, args=(box, stop, training_done), name="ma-evaluation", daemon=True
        )
        thread.start()
        thread.join(self.spec.evaluation_sample_timeout_s)
        if thread.is_alive():
            stop.set()
            thread.join(5.0)
            logger.warning(
                "evaluation stopped after evaluation_sample_timeout_s=%g s with %d episodes; "
                "the results cover only those.",
                self.spec.evaluation_sample_timeout_s,
                len(box["episodes"]),
            )
        if "error" in box:
            raise box["error"]
        return self._result(box["episodes"], box["env_steps"])

    def _run(self, box: dict, stop: threading.Event, training_done) -> None:
        spec = self.spec
        unit, wanted = spec.evaluation_duration_unit, spec.evaluation_duration
        sampler = self._make_sampler()
        try:
            while not stop.is_set():
                if wanted == "auto":
                    if box["env_steps"] > 0 and (training_done is None or training_done()):
                        break
                elif unit == "episodes" and len(box["episodes"]) >= wanted:
                    break
                elif unit == "timesteps" and box["env_steps"] >= wanted:
                    break
                output = sampler.step(*self._store.get())
                box["env_steps"] += output.env_steps
                box["episodes"].extend(output.episodes)
        except Exception as err:  # raised by evaluate() in the caller's thread
            box["error"] = err
        finally:
            sampler.close()
        if unit == "episodes" and wanted != "auto":
            del box["episodes"][wanted:]  # the first ones to end, as RLlib counts

    def _result(self, episodes: list, env_steps: int) -> dict:
        self._stats.add([(float(e.env_return), int(e.length)) for e in episodes])
        runners = self._stats.result(len(episodes), env_steps)
        self._env_steps_lifetime += env_steps
        runners["num_env_steps_sampled_lifetime"] = self._env_steps_lifetime
        modules: dict[str, list[float]] = {}
        agents: dict[str, list[float]] = {}
        for episode in episodes:
            for policy, value in episode.module_returns.items():
                modules.setdefault(self._modules[policy], []).append(float(value))
            for agent, value in episode.agent_returns.items():
                agents.setdefault(str(agent), []).append(float(value))
        if episodes:
            runners["module_episode_returns_mean"] = {
                k: float(np.mean(v)) for k, v in sorted(modules.items())
            }
            runners["agent_episode_returns_mean"] = {
                k: float(np.mean(v)) for k, v in sorted(agents.items())
            }
        return {"env_runners": runners}

    def close(self) -> None:
        pass
