"""The iteration loop that ``IMPALA`` and ``SeedGroup`` share, whatever engine runs it.

``training_step`` is the paper's loop: the engine samples (or rolls out) a batch and the
learner trains on it, and every ``broadcast_interval`` updates the actors get the new params.
An iteration repeats it until RLlib's per-iteration minimums hold (``min_time_s_per_iteration``,
``min_sample_timesteps_per_iteration``, ``min_train_timesteps_per_iteration``; over several
processes process 0 decides), fetches the learner's metrics once, and makes RLlib's result for
each member of the engine (one run, or each seed of a group).
"""

from __future__ import annotations

import copy
import time

import jax
import numpy as np

from impala_jax.rllib.diagnostics import EARLY_UPDATES
from impala_jax.rllib.module import DEFAULT_MODULE_ID
from impala_jax.rllib.results import train_result, trainable_info
from impala_jax.runtime.engine import Engine
from impala_jax.runtime.metrics import EpisodeStats, SysUsage, Timers, merge_timers
from impala_jax.runtime.process import checkpoint, collectives


class TrainingLoop:
    """The loop and its counters (a base of ``IMPALA`` and ``SeedGroup``)."""

    config: object
    engine: Engine

    def _init_loop(self, engine: Engine, learner) -> None:
        """The counters of a new run whose ``engine`` trains ``learner``."""
        config = self.config
        self.engine, self.learner = engine, learner
        self._T = config.get_rollout_fragment_length()
        self.batch_env_steps = learner.step_spec.columns * learner.num_devices * self._T
        self._sys_usage = SysUsage() if config.log_sys_usage else None
        window = config.metrics_num_episodes_for_smoothing
        # An engine whose env derives scores from its episode metrics (DeviceEngine's).
        summarize = getattr(engine, "summarize_episodes", None)
        self._episodes = [EpisodeStats(window, summarize) for _ in range(engine.members)]
        self._timers = Timers()
        self._iteration = 0
        self._time_total = 0.0
        self._env_steps_trained = 0
        self._num_updates = 0
        self._last_lag: list = []
        self._last_learner_metrics: dict = {}
        # The first EARLY_UPDATES updates' metrics, per member: on the host once fetched, the
        # rest still on device (the divergence check's baseline, diagnostics.py).
        self._early_learners: list[list[dict]] = [[] for _ in range(engine.members)]
        self._early_pending: list = []
        self._iterations_since_restore = 0  # Tune's bookkeeping keys, as RLlib's results have
        self._time_since_restore = 0.0
        self._result_config = checkpoint.jsonable(config.to_dict())
        # RLlib's single-agent `policies` entry, which RLlib's own result checks read.
        self._result_config.setdefault("policies", {DEFAULT_MODULE_ID: (None, None, None, None)})
        params = learner.abstract_state.params
        self._num_parameters = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled so far (of each member; over several processes, by all of them
        as of the last update: the count every process agreed on)."""
        return self.engine.num_env_steps_sampled_lifetime

    def training_step(self) -> None:
        """One update, booked: its policy lag, the env steps trained, the params published."""
        update = self.engine.next_update()
        if update is None:  # an engine that only samples
            return
        self._last_learner_metrics = update.metrics
        if self._num_updates < EARLY_UPDATES:
            self._early_pending.append(update.metrics)
        self._last_lag.append(update.lag)
        self._num_updates += 1
        self._env_steps_trained += update.env_steps_trained
        if self._num_updates % self.config.broadcast_interval == 0:
            with self._timers.time("broadcast"):
                self.engine.publish()

    def _iteration_done(self, started: float, sampled0: int, trained0: int) -> bool:
        cfg = self.config
        done = (
            time.perf_counter() - started >= (cfg.min_time_s_per_iteration or 0)
            and self.num_env_steps_sampled_lifetime - sampled0
            >= (cfg.min_sample_timesteps_per_iteration or 0)
            and self._env_steps_trained - trained0 >= (cfg.min_train_timesteps_per_iteration or 0)
        )
        # Process 0 decides, so every process runs the same number of updates.
        return bool(collectives.broadcast(np.bool_(done), "process 0's end of iteration"))

    def _learner_results(self, fetched: dict) -> list[dict]:
        """Each member's learner metrics as floats, from the fetched ones (a leading member
        axis in a group)."""
        members = self.engine.members
        return [
            {k: float(np.reshape(v, members)[i]) for k, v in fetched.items()}
            for i in range(members)
        ]

    def _check_learner(self, learners: list[dict]) -> None:
        """Called with each member's learner metrics as soon as they are fetched (and
        ``_early_learners`` holds each member's first updates' metrics fetched so far)."""

    def _finish_result(self, result: dict, learner: dict) -> dict:
        """Called with each member's result and the learner metrics it holds."""
        return result

    def _iterate(self) -> list[dict]:
        """One iteration: each member's result."""
        started = time.perf_counter()
        sampled0, trained0 = self.num_env_steps_sampled_lifetime, self._env_steps_trained
        self.engine.begin_iteration()
        num_steps = 0
        while True:
            self.training_step()
            num_steps += 1
            if self._iteration_done(started, sampled0, trained0):
                break
        with self._timers.time("learner_fetch"):
            # The one device->host fetch of the iteration; it also waits for the last step.
            fetched, early = jax.device_get((self._last_learner_metrics, self._early_pending))
        self._early_pending = []
        self.engine.end_iteration()
        learners = self._learner_results(fetched)
        for metrics in early:
            for kept, member in zip(
                self._early_learners, self._learner_results(metrics), strict=True
            ):
                kept.append(member)
        self._check_learner(learners)
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        self._iterations_since_restore += 1
        self._time_since_restore += elapsed
        report = self.engine.drain()
        sampled = self.num_env_steps_sampled_lifetime - sampled0
        timers = merge_timers([self._timers.drain(), *report.timers])
        lag = np.concatenate(self._last_lag) if self._last_lag else np.zeros(1)
        self._last_lag = []
        sys_usage = self._sys_usage.result() if self._sys_usage is not None else {}
        results = []
        values = report.episode_values or [None] * len(report.episodes)
        for episodes, member_values, stats, learner in zip(
            report.episodes, values, self._episodes, learners, strict=True
        ):
            stats.add(episodes, member_values)
            result = train_result(
                env_runners=stats.result(len(episodes), sampled),
                episode_metrics=report.episode_metrics,
                learner=learner,
                timers=timers,
                lag=lag,
                sampled=sampled,
                trained=self._env_steps_trained - trained0,
                elapsed=elapsed,
                num_env_steps_sampled_lifetime=self.num_env_steps_sampled_lifetime,
                num_env_steps_trained_lifetime=self._env_steps_trained,
                num_updates_lifetime=self._num_updates,
                num_episodes_lifetime=stats.num_episodes_lifetime,
                num_trainable_parameters=self._num_parameters,
                num_training_step_calls=num_steps,
                training_iteration=self._iteration,
                time_total_s=self._time_total,
                # train_batch_size_per_learner rounded up to whole fragments (config.py).
                batch_size_per_learner=self.learner.step_spec.columns * self._T,
                total_batch_size=self.batch_env_steps,
                learner_queue_size=report.queue_size,
                sys_usage=sys_usage,
                # Each result its own: the device engine's counts are a module constant.
                fault_tolerance=copy.deepcopy(report.fault_tolerance),
                trainable=trainable_info(
                    self._iterations_since_restore, self._time_since_restore, self._result_config
                ),
            )
            results.append(self._finish_result(result, learner))
        return results

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # IMPALA's, SeedGroup's
