"""The multi-agent engine: runners step multi-agent envs, one program updates every policy.

Runners (sampler.py; threads, or the main thread in lockstep with ``num_env_runners=0``) turn
their envs' steps into per-policy columns of ``T`` agent steps. Each ``next_update`` gathers
columns until ``batch_steps`` env steps (or agent steps, ``count_steps_by``) were sampled since
the last one, lays them out as one ``[M, T(+1), C]`` batch (a policy with fewer than ``C``
columns gets all-invalid padding columns, which the loss masks and after which its state is
kept: policy_stack.py) and runs the ``PolicyStackLearner``'s one program on it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from impala_jax.core.types import Trajectory
from impala_jax.runtime.acting.env_runner import ParamStore
from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure, FaultToleranceSpec
from impala_jax.runtime.engine import Report, Update
from impala_jax.runtime.metrics import Timers
from impala_jax.runtime.multiagent.sampler import MultiAgentSampler, StepOutput

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MultiAgentSpec:
    """How the engine samples and batches (rllib/multi_agent.py builds it from the config)."""

    num_env_runners: int  # runner threads; 0: the main thread steps the envs in lockstep
    rollout_fragment_length: int  # T, in each agent's own steps
    columns: int  # C: columns per policy per update (padded with invalid ones when short)
    batch_steps: int  # steps sampled per update, counted by count_steps_by
    count_steps_by: str  # "env_steps" or "agent_steps"
    train: tuple[bool, ...]  # per policy: updated (policies_to_train) or only acting
    window: int  # episodes in the per-module and per-agent return means
    max_queued_columns: int  # per policy; older columns beyond it are dropped (counted)


# Batches' worth of env steps sampled without any complete column before the run stops.
_MAX_BATCHES_WITHOUT_COLUMN = 100


class _Retired(Exception):
    """A failed runner left to itself: ``ignore_env_runner_failures`` and others run on."""


class MultiAgentEngine:
    """See the module docstring. ``make_sampler(index)`` builds runner ``index``'s sampler;
    ``learner`` is a ``PolicyStackLearner``; ``agent_names``/``module_names`` turn agent ids
    and policy indices into result keys."""

    members = 1

    def __init__(
        self,
        spec: MultiAgentSpec,
        fault_spec: FaultToleranceSpec,
        make_sampler: Callable[[int], MultiAgentSampler],
        learner,
        actor_device,
        module_names: list[str],
    ):
        self.spec, self.fault_spec, self.learner = spec, fault_spec, learner
        self.module_names = module_names
        self.param_store = ParamStore(learner.state.params, actor_device)
        self.timers = Timers()
        self._make_sampler = make_sampler
        self._samplers = [make_sampler(i) for i in range(max(1, spec.num_env_runners))]
        self._out: queue.Queue = queue.Queue(maxsize=64)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []  # failures fault_tolerance() does not absorb
        self._restarts = 0
        self._failures = 0  # runner failures since the last step a runner completed
        self._queued: list[collections.deque] = [collections.deque() for _ in module_names]
        self._dropped = 0
        self._sampled = 0  # env steps, lifetime
        self._pending_steps = 0  # counted steps since the last update
        self._episodes: list[tuple[float, int]] = []
        self._module_returns = collections.defaultdict(
            lambda: collections.deque(maxlen=spec.window)
        )
        self._agent_returns = collections.defaultdict(lambda: collections.deque(maxlen=spec.window))

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self._sampled

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        self._sampled = int(value)

    def start(self) -> None:
        if self.spec.num_env_runners == 0:
            return
        for i in range(len(self._samplers)):
            thread = threading.Thread(target=self._run, args=(i,), name=f"ma-runner-{i}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def _step(self, index: int) -> StepOutput | None:
        """Runner ``index``'s next step; after a failure that fault_tolerance() absorbs, None
        (the runner was rebuilt, or retired with ``ignore_env_runner_failures``)."""
        try:
            output = self._samplers[index].step(*self.param_store.get())
        except Exception as err:
            return self._failed(index, err)
        with self._lock:
            self._failures = 0
        return output

    def _failed(self, index: int, err: Exception) -> None:
        """RLlib's fault_tolerance() for a multi-agent runner: rebuilt (its open fragments and
        episodes are lost) up to ``max_num_env_runner_restarts`` times, or retired when
        ``ignore_env_runner_failures`` and another runner is left; otherwise the run stops."""
        fault_spec = self.fault_spec
        with self._lock:
            self._failures += 1
            restart = fault_spec.restart_failed_env_runners and self._restarts < (
                fault_spec.max_num_env_runner_restarts
            )
            restart &= self._failures <= fault_spec.num_consecutive_env_runner_failures_tolerance
            if restart:
                self._restarts += 1
        logger.warning("multi-agent runner %d failed: %s: %s", index, type(err).__name__, err)
        if restart:
            self._samplers[index].close()
            if self._stop.wait(fault_spec.delay_between_env_runner_restarts_s):
                return None
            self._samplers[index] = self._make_sampler(index)
            return None
        alive = sum(t.is_alive() for t in self._threads if t is not threading.current_thread())
        if fault_spec.ignore_env_runner_failures and alive:
            raise _Retired from err
        raise EnvRunnerFailure(
            f"multi-agent runner {index} failed ({type(err).__name__}: {err}) and "
            "fault_tolerance() does not recover it (restart_failed_env_runners, "
            "max_num_env_runner_restarts, ignore_env_runner_failures)"
        ) from err

    def _run(self, index: int) -> None:
        """A runner thread: steps until stopped, handing each step's output to the learner."""
        try:
            while not self._stop.is_set():
                output = self._step(index)
                while output is not None and not self._stop.is_set():
                    try:
                        self._out.put(output, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except _Retired:
            pass
        except BaseException as err:  # handed to the main thread, which raises it
            self._errors.append(err)

    def _next_output(self) -> StepOutput:
        if self.spec.num_env_runners == 0:
            while True:  # lockstep: the main thread's own runner
                output = self._step(0)
                if output is not None:
                    return output
        timeout = self.fault_spec.sample_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            if self._errors:
                raise self._errors[0]
            if not any(t.is_alive() for t in self._threads):
                raise EnvRunnerFailure("every multi-agent runner has failed")
            try:
                return self._out.get(timeout=min(1.0, timeout))
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                raise EnvRunnerFailure(
                    f"no multi-agent runner produced a step for {timeout} s "
                    "(env_runners(sample_timeout_s=...)): an env's reset or step hangs"
                )

    def _take(self, output: StepOutput) -> None:
        self._sampled += output.env_steps
        by_agents = self.spec.count_steps_by == "agent_steps"
        self._pending_steps += output.agent_steps if by_agents else output.env_steps
        for policy, columns in output.columns.items():
            kept = self._queued[policy]
            kept.extend(columns)
            while len(kept) > self.spec.max_queued_columns:
                kept.popleft()
                self._dropped += 1
        for episode in output.episodes:
            self._episodes.append((float(episode.env_return), int(episode.length)))
            for policy, value in episode.module_returns.items():
                self._module_returns[self.module_names[policy]].append(float(value))
            for agent, value in episode.agent_returns.items():
                self._agent_returns[str(agent)].append(float(value))

    def next_update(self) -> Update:
        with self.timers.time("sample_wait"):
            # Until a batch's worth of steps is sampled and some policy has a column: at the
            # start every lane fills its first fragment at once, which can take several
            # batches' worth of steps when the agents are many and T long.
            waited = 0
            while self._pending_steps < self.spec.batch_steps or not any(self._queued):
                output = self._next_output()
                self._take(output)
                waited += output.env_steps
                if waited > _MAX_BATCHES_WITHOUT_COLUMN * self.spec.batch_steps:
                    raise EnvRunnerFailure(
                        f"{waited} env steps were sampled without one complete fragment of "
                        f"{self.spec.rollout_fragment_length} agent steps: no agent acts often "
                        "enough; lower env_runners(rollout_fragment_length=...)"
                    )
        self._pending_steps = max(0, self._pending_steps - self.spec.batch_steps)
        with self.timers.time("batch"):
            batch, versions = self._batch()
        train = np.asarray(self.spec.train, bool)
        with self.timers.time("learner_dispatch"):
            metrics = self.learner.update(self.learner.put_batch(batch), self._sampled, train)
        lag = self.param_store.version - versions[versions >= 0]
        # Each policy's own mean lag over its real columns (0 without any): learners/<id>/.
        per_policy = versions.reshape(len(self._queued), -1)
        real = per_policy >= 0
        lags = np.where(real, self.param_store.version - per_policy, 0).sum(1)
        metrics = dict(metrics, policy_lag_mean=lags / np.maximum(real.sum(1), 1))
        return Update(metrics, lag if lag.size else np.zeros(1, np.int64), self.spec.batch_steps)

    def _batch(self) -> tuple[Trajectory, np.ndarray]:
        """``[M, T(+1), C, ...]`` from the oldest queued columns; padding columns are zeros
        (valid 0). Also every real column's param version (-1 for padding)."""
        C, M = self.spec.columns, len(self._queued)
        example = next(q[0] for q in self._queued if q)

        def zeros(x):
            if x is None:
                return None
            # Leaf by leaf: a recurrent core_state is a pytree of [K, 1, ...] -> [M, K, C, ...].
            return jax.tree.map(lambda a: np.zeros((M, a.shape[0], C, *a.shape[2:]), a.dtype), x)

        batch = Trajectory(*(zeros(x) for x in example))
        versions = np.full((M, C), -1, np.int64)
        for policy, kept in enumerate(self._queued):
            for c in range(min(C, len(kept))):
                column = kept.popleft()
                for name, field in zip(Trajectory._fields, column, strict=True):
                    if field is not None and name != "param_version":
                        out = jax.tree.leaves(getattr(batch, name))
                        for leaf, x in zip(out, jax.tree.leaves(field), strict=True):
                            leaf[policy, :, c] = x[:, 0]
                versions[policy, c] = int(column.param_version[0])
        batch = batch._replace(param_version=np.maximum(versions, 0).astype(np.int32))
        return batch, versions.reshape(-1)

    def publish(self) -> None:
        self.param_store.publish(self.learner.state.params)

    def begin_iteration(self) -> None:
        pass

    def end_iteration(self) -> None:
        pass

    def drain(self) -> Report:
        episodes, self._episodes = self._episodes, []
        metrics: dict[str, Any] = {}
        if self._module_returns:
            metrics["module_episode_returns_mean"] = {
                k: float(np.mean(v)) for k, v in sorted(self._module_returns.items())
            }
            metrics["agent_episode_returns_mean"] = {
                k: float(np.mean(v)) for k, v in sorted(self._agent_returns.items())
            }
        return Report(
            episodes=[episodes],
            episode_metrics=metrics,
            timers=[self.timers.drain()],
            queue_size=self._out.qsize(),
            fault_tolerance={
                "num_healthy_workers": sum(t.is_alive() for t in self._threads),
                "num_remote_worker_restarts": self._restarts,
                "num_dropped_columns": self._dropped,
            },
        )

    def restart_for_restore(self) -> None:
        self.publish()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for sampler in self._samplers:
            sampler.close()
