"""Evaluation (RLlib's ``Algorithm.evaluate``): the current policy on its own envs.

Every evaluation runs in a thread of its own (so a hung env cannot hang ``train()``), on envs
built with ``evaluation_config`` applied; it acts greedily unless that config sets
``explore=True``. The envs form ``max(1, evaluation_num_env_runners)`` groups of
``num_envs_per_env_runner`` envs each, one group per RLlib evaluation runner, all stepped by the
evaluation thread. RLlib 2.60's semantics (``Algorithm._evaluate_with_fixed_duration`` and
``_evaluate_with_auto_duration``):

- ``"episodes"``: exactly ``evaluation_duration`` episodes. They are split over the groups as
  RLlib splits them over its runners (group i of n gets ``d // n``, one more for the first
  ``d % n``); each group starts from reset envs and counts the first episodes to finish in its
  envs (several finishing on one step: in env order), then stops.
- ``"timesteps"``: the same split of env steps; a group stops once it has stepped its share, so
  the total is at least ``evaluation_duration`` and less than that plus one step of every env.
  Episodes continue across evaluations unless ``evaluation_force_reset_envs_before_iteration``.
- ``"auto"`` (only with ``evaluation_parallel_to_training``): steps until the training step of
  the same iteration has finished.
- ``evaluation_sample_timeout_s`` bounds an evaluation: when it is exceeded the evaluation stops
  and returns the episodes finished so far, with a warning (RLlib drops the runners that time
  out and warns the same way).
- ``custom_evaluation_function(algorithm, eval_workers)`` replaces the default evaluation;
  ``eval_workers`` is this Evaluator (its ``run()`` is the default evaluation).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from impala_jax.runtime.acting.env_runner import EnvGroup, EpisodeLog, ParamStore, actor_key
from impala_jax.runtime.acting.episode_hooks import EpisodeCallbacks, EpisodeHooksFactory
from impala_jax.runtime.acting.user_code import UserCodeError, describe
from impala_jax.runtime.envs.vec_env import EnvSpec, make_runner_envs
from impala_jax.runtime.metrics import EpisodeStats, deep_merge

logger = logging.getLogger(__name__)

# Offset of the evaluation envs' seeds from the run's seed: far from every training runner's.
EVAL_SEED_OFFSET = 1_000_003
# Grace, beyond evaluation_sample_timeout_s, for the evaluation thread to finish its env step.
_JOIN_GRACE_S = 1.0


def split_duration(duration: int, num_groups: int) -> list[int]:
    """RLlib's split of an evaluation over its runners: ``d // n`` each, plus one for the
    first ``d % n``."""
    return [duration // num_groups + (i < duration % num_groups) for i in range(num_groups)]


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    """The ``evaluation()`` fields, each named as the config field it comes from, and what the
    evaluation config (the config with ``evaluation_config`` applied) decides: its envs, its
    ``explore`` and its callbacks. rllib/specs.py resolves that config and builds this."""

    env: EnvSpec  # the evaluation config's; num_workers: its evaluation_num_env_runners
    explore: bool  # the evaluation config's: False unless evaluation_config sets it
    callbacks: EpisodeHooksFactory  # the evaluation config's (rllib's CallbacksSpec)
    evaluation_num_env_runners: int  # env groups: max(1, this)
    evaluation_duration: Any  # int, or "auto"
    evaluation_duration_unit: str
    evaluation_sample_timeout_s: float
    evaluation_force_reset_envs_before_iteration: bool
    custom_evaluation_function: Callable | None


class _Run:
    """One evaluation in flight: what its thread has collected so far, under a lock."""

    def __init__(self, training_done: Callable[[], bool] | None):
        self.lock = threading.Lock()
        self.episodes: list[tuple[float, int]] = []
        self.env_steps = 0
        self.custom: Any = None  # what a custom_evaluation_function returned
        self.error: BaseException | None = None
        self.training_done = training_done  # "auto": evaluate until it returns True
        self.stop = threading.Event()  # set when the caller gives up on this evaluation
        self.timed_out = False
        self.started = time.monotonic()
        self.thread: threading.Thread | None = None
        self.groups: list[EnvGroup] = []  # the envs this evaluation steps
        self.finished = False  # the thread has returned
        self.abandoned = False  # the caller gave up waiting: the thread closes its envs


class Evaluator:
    """The evaluation envs and their counts across evaluations (RLlib's eval EnvRunnerGroup).

    ``act`` / ``act_greedy`` are the compiled policy, ``param_store`` holds the newest params;
    an evaluation uses the params current when it starts.
    """

    def __init__(
        self,
        spec: EvaluationSpec,
        act: Callable,
        act_greedy: Callable,
        param_store: ParamStore,
        seed: int,
    ):
        self.spec = spec
        # What evaluation episodes' callbacks read as ``env_runner.config`` (never read here).
        self.config = spec.callbacks.env_runner_config
        self._act, self._act_greedy = act, act_greedy
        self._param_store = param_store
        self._seed = seed + EVAL_SEED_OFFSET
        self._key = actor_key(self._seed, param_store.get()[0], act)
        self.num_env_runners = max(1, spec.evaluation_num_env_runners)
        self.num_envs = spec.env.num_envs_per_env_runner
        self._groups: list[EnvGroup] | None = None
        self._num_builds = 0
        self._run: _Run | None = None
        self.num_episodes_lifetime = 0
        self.num_env_steps_sampled_lifetime = 0
        # Evaluation episodes' callbacks get this Evaluator as env_runner, and its own logger
        # (evaluation/env_runners/... in the results).
        self.metrics = spec.callbacks.new_metrics()
        self.episode_callbacks = EpisodeCallbacks.make(spec.callbacks, self, self.metrics)

    # -- the envs ----------------------------------------------------------------------------

    def _build_groups(self) -> list[EnvGroup]:
        """Fresh envs, seeded apart from every earlier evaluation's."""
        self._close_groups()
        env_spec, n = self.spec.env, self.num_envs
        groups = []
        try:
            for i in range(self.num_env_runners):
                seed = self._seed + (self._num_builds * self.num_env_runners + i) * n
                env, adapter = make_runner_envs(
                    env_spec,
                    n,
                    seed,
                    # A creator's EnvContext: RLlib numbers evaluation runners from 1.
                    worker_index=i + 1 if env_spec.num_workers else 0,
                )
                group = EnvGroup(env, adapter, self._act, self._act_greedy)
                groups.append(group)
                group.reset()
        except BaseException:
            for g in groups:
                g.env.close()
            raise
        self._num_builds += 1
        self._groups = groups
        return groups

    def _close_groups(self) -> None:
        groups, self._groups = self._groups, None
        for g in groups or ():
            g.env.close()

    def _groups_for(self, unit: str) -> list[EnvGroup]:
        """RLlib resets the envs before every "episodes" evaluation, and before the others
        when ``evaluation_force_reset_envs_before_iteration``."""
        reset = unit == "episodes" or self.spec.evaluation_force_reset_envs_before_iteration
        if self._groups is None or reset:
            return self._build_groups()
        return self._groups

    # -- one evaluation ----------------------------------------------------------------------

    def run(self, duration: Any = None, unit: str | None = None) -> dict:
        """The default evaluation in the calling thread: ``{"env_runners": {...}}``.

        ``duration`` / ``unit`` default to ``evaluation_duration`` / ``_unit``; a custom
        evaluation function may call this with its own.
        """
        run = self._run if self._run is not None else _Run(None)
        episodes0, steps0 = len(run.episodes), run.env_steps
        self._sample(run, duration, unit)
        with run.lock:
            episodes, steps = run.episodes[episodes0:], run.env_steps - steps0
        return {"env_runners": deep_merge(self._summary(episodes, steps), self.metrics.reduce())}

    def _sample(self, run: _Run, duration: Any = None, unit: str | None = None) -> None:
        spec = self.spec
        duration = spec.evaluation_duration if duration is None else duration
        unit = unit or spec.evaluation_duration_unit
        if duration == "auto":
            unit = "auto"
        groups = self._groups_for(unit)
        run.groups = groups
        if self.episode_callbacks is not None:
            self.episode_callbacks.begin(groups)  # new envs start their episodes
        params, _ = self._param_store.get()
        n = len(groups)
        quota = split_duration(duration, n) if unit != "auto" else [0] * n
        done = [0] * n
        deadline = run.started + spec.evaluation_sample_timeout_s
        explore = spec.explore
        log = EpisodeLog()  # the episodes a step ended, those the evaluation counts
        while not run.stop.is_set():
            if unit == "auto":
                if run.env_steps > 0 and (run.training_done is None or run.training_done()):
                    break
            elif all(d >= q for d, q in zip(done, quota, strict=True)):
                break
            if time.monotonic() >= deadline:
                run.timed_out = True
                break
            for i, g in enumerate(groups):
                if unit != "auto" and done[i] >= quota[i]:
                    continue
                action, _, self._key = g.act(params, self._key, explore)
                limit = quota[i] - done[i] if unit == "episodes" else None
                steps = int(g.step(action, self.episode_callbacks, log, limit).sum())
                finished = log.drain()
                if unit == "episodes":
                    done[i] += len(finished)
                elif unit == "timesteps":
                    done[i] += steps
                with run.lock:
                    run.episodes.extend(finished)
                    run.env_steps += steps

    def _summary(self, episodes: list, env_steps: int) -> dict:
        stats = EpisodeStats(max(1, len(episodes)))
        stats.add(episodes)
        out = stats.result(len(episodes), env_steps)
        out["num_episodes_lifetime"] = self.num_episodes_lifetime
        out["num_env_steps_sampled_lifetime"] = self.num_env_steps_sampled_lifetime
        return out

    def _target(self, run: _Run, algorithm) -> None:
        try:
            fn = self.spec.custom_evaluation_function
            if fn is not None:
                run.custom = fn(algorithm, self)
            else:
                self._sample(run)
        except BaseException as err:  # re-raised in the caller's thread by result()
            run.error = err
        finally:
            with run.lock:
                run.finished = True
                abandoned = run.abandoned
            if abandoned:
                for g in run.groups:
                    g.env.close()

    def start(self, algorithm, training_done: Callable[[], bool] | None = None) -> None:
        """Starts one evaluation in its own thread; ``result()`` collects it.

        An ``"auto"`` evaluation runs until ``training_done()`` (the parallel training step has
        finished) is True.
        """
        if self._run is not None:
            raise RuntimeError("an evaluation is already running; collect it with result().")
        run = _Run(training_done)
        run.thread = threading.Thread(
            target=self._target, args=(run, algorithm), name="evaluation", daemon=True
        )
        self._run = run
        run.thread.start()

    def result(self) -> dict:
        """Waits for the evaluation ``start()`` began (at most ``evaluation_sample_timeout_s``
        from its start, unless a custom evaluation function runs) and returns its results."""
        run, self._run = self._run, None
        if run is None:
            raise RuntimeError("no evaluation is running; call start() first.")
        spec = self.spec
        custom = spec.custom_evaluation_function is not None
        if custom:
            run.thread.join()  # RLlib does not time a custom evaluation function out either
        else:
            remaining = run.started + spec.evaluation_sample_timeout_s - time.monotonic()
            run.thread.join(timeout=max(0.0, remaining) + _JOIN_GRACE_S)
        with run.lock:
            if not run.finished:
                # Stuck inside an env step: abandoned; it closes its envs if it ever returns.
                run.abandoned = run.timed_out = True
                run.stop.set()
                self._groups = None
            episodes, steps = list(run.episodes), run.env_steps
        if run.error is not None:
            if custom and not isinstance(run.error, UserCodeError):
                fn = spec.custom_evaluation_function
                raise UserCodeError(
                    f"evaluation(custom_evaluation_function={describe(fn)})", run.error
                ) from run.error
            raise run.error
        self.num_episodes_lifetime += len(episodes)
        if custom:
            metrics, env_steps = self._custom_result(run.custom)
            self.num_env_steps_sampled_lifetime += steps if env_steps is None else env_steps
            return metrics
        self.num_env_steps_sampled_lifetime += steps
        self._warn(run, episodes)
        return {"env_runners": deep_merge(self._summary(episodes, steps), self.metrics.reduce())}

    def evaluate(self, algorithm=None, training_done: Callable[[], bool] | None = None) -> dict:
        """One evaluation now, in its own thread, waited for."""
        self.start(algorithm, training_done)
        return self.result()

    def _warn(self, run: _Run, episodes: list) -> None:
        spec = self.spec
        wanted = spec.evaluation_duration
        if run.timed_out:
            logger.warning(
                "evaluation stopped after evaluation_sample_timeout_s=%g s with %d episodes "
                "(evaluation_duration=%s %s); the results cover only those. Raise "
                "evaluation(evaluation_sample_timeout_s=...) or lower evaluation_duration.",
                spec.evaluation_sample_timeout_s,
                len(episodes),
                wanted,
                spec.evaluation_duration_unit,
            )
        if not episodes:
            logger.warning(
                "this evaluation finished no episode (evaluation_duration=%s %s): its "
                "episode_return_mean is NaN. Evaluate for more timesteps, use "
                "evaluation_duration_unit='episodes', raise evaluation_sample_timeout_s, or set "
                "evaluation_force_reset_envs_before_iteration=False.",
                wanted,
                spec.evaluation_duration_unit,
            )

    def _custom_result(self, value: Any) -> tuple[dict, int | None]:
        """RLlib's new-stack contract ``(metrics dict, env_steps, agent_steps)``; a plain
        metrics dict (the old stack's) is accepted too. Returns (metrics, env_steps or None)."""
        env_steps = None
        if isinstance(value, tuple) and len(value) == 3:
            metrics, env_steps, agent_steps = value
            if not all(isinstance(x, int) for x in (env_steps, agent_steps)):
                raise ValueError(
                    "evaluation(custom_evaluation_function=...) must return (metrics dict, "
                    f"env_steps: int, agent_steps: int); got env_steps={env_steps!r}, "
                    f"agent_steps={agent_steps!r}."
                )
        else:
            metrics = value
        if not isinstance(metrics, dict):
            raise ValueError(
                "evaluation(custom_evaluation_function=...) must return a dict of metrics (or "
                f"RLlib's (metrics, env_steps, agent_steps)); got {type(value).__name__}."
            )
        return metrics, env_steps

    @property
    def running(self) -> bool:
        return self._run is not None

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.stop.set()
            run.thread.join(timeout=10)
            with run.lock:
                if not run.finished:  # stuck in an env step: it closes its envs on return
                    run.abandoned = True
                    self._groups = None
        self._close_groups()
