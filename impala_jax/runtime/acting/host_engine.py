"""The host engine: envs stepped on the host, batches handed to the Learner.

The runners (runtime/acting/env_runner_group.py: threads, or the main thread in lockstep) fill train
batches; each ``next_update`` takes the next one, through RLlib's minibatch buffer where it
reuses batches, and dispatches the learner's step on it. The debug samplers are options here:
``fake_sampler`` trains on the first batch again and again, ``sample_only`` samples and never
trains (``_env_runners_only`` / ``_skip_learners``). Over several processes
``AgreedHostEngine`` takes each batch only once every process has its own.
"""

from __future__ import annotations

import numpy as np

from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from impala_jax.runtime.engine import HostEngineSpec, Report, Update
from impala_jax.runtime.learning.buffers import MinibatchBuffer
from impala_jax.runtime.metrics import Timers
from impala_jax.runtime.process import agreement, collectives


class HostEngine:
    """Runners on the host feeding the ``Learner``; see the module docstring."""

    members = 1

    def __init__(self, spec: HostEngineSpec, group: EnvRunnerGroup, learner):
        self.spec = spec
        self.group = group
        self.learner = learner
        self.param_store = group.param_store
        self.timers = Timers()  # the learner's dispatch, timed here
        self._fake_batch = None
        self._source = self._batch_source()

    def _batch_source(self):
        size, epochs = self.spec.minibatch_buffer_size, self.spec.num_epochs
        if size > 1 and epochs > 1:
            return MinibatchBuffer(size, epochs, self.group.next_batch)
        return self.group

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self.group.num_env_steps_sampled_lifetime

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        self.group.set_num_env_steps_sampled_lifetime(value)

    def start(self) -> None:
        self.group.start(self.learner.put_batch)

    def next_update(self) -> Update | None:
        if self._fake_batch is not None:
            batch, versions = self._fake_batch
        else:
            batch, versions = self._next_batch()
            if self.spec.fake_sampler:
                self._fake_batch = (batch, versions)
        if self.spec.sample_only:
            return None
        with self.timers.time("learner_dispatch"):
            metrics = self.learner.update(batch, self.num_env_steps_sampled_lifetime)
        lag = self.param_store.version - versions
        return Update(metrics, lag, self.spec.env_steps_trained_per_update)

    def _next_batch(self):
        return self._source.next_batch()

    def publish(self) -> None:
        self.group.publish(self.learner.state.params)

    def begin_iteration(self) -> None:
        self.group.begin_iteration()

    def end_iteration(self) -> None:
        self.group.end_iteration()

    def drain(self) -> Report:
        episodes, episode_metrics = self.group.drain_episodes_and_metrics()
        return Report(
            episodes=[self._all_episodes(episodes)],
            episode_metrics=episode_metrics,
            timers=[self.timers.drain(), *self.group.drain_timers()],
            queue_size=self.group.queue_size(),
            fault_tolerance=self.group.fault_tolerance_metrics(),
        )

    def _all_episodes(self, episodes: list) -> list:
        return episodes

    def restart_for_restore(self) -> None:
        """Fresh runners (fragments in flight dropped) and a fresh minibatch buffer."""
        self.group.restart_for_restore()
        self._source = self._batch_source()

    def stop(self) -> None:
        self.group.stop()


class AgreedHostEngine(HostEngine):
    """The host engine of one of several processes: a batch is taken only once every process
    has its own (one collective, which also sums every process's env steps, so the learner's
    schedules agree), and the episodes of every process make each result."""

    def __init__(self, spec: HostEngineSpec, group: EnvRunnerGroup, learner):
        super().__init__(spec, group, learner)
        self._sampled_base = 0  # the restored env steps of all processes
        self._global_sampled = 0  # every process's env steps, as of the last agreement

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Every process's env steps as of the last update: the count all of them agreed on."""
        return self._global_sampled

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        """The restored total of all processes, to which what each samples from now adds."""
        self._sampled_base = self._global_sampled = value
        self.group.set_num_env_steps_sampled_lifetime(0)

    def _next_batch(self):
        def agreed(total: int) -> None:
            self._global_sampled = self._sampled_base + total

        return agreement.agreed_next_batch(
            self._source.next_batch,
            lambda: self.group.num_env_steps_sampled_lifetime,
            agreed,
            EnvRunnerFailure,
        )

    def _all_episodes(self, episodes: list) -> list:
        """Every process's episodes, in process order: the same window everywhere."""
        rows = np.asarray(episodes, np.float64).reshape(-1, 2)
        rows = collectives.allgather_rows(rows, "the iteration's episodes")
        return [(float(r), int(n)) for r, n in rows]
