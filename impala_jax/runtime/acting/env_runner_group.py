"""EnvRunnerGroup: the runners of one algorithm and everything about their lives.

Lockstep (``num_env_runners=0``): one runner sampled in the caller's thread, deterministic for a
fixed seed. Threaded: one RunnerThread per runner feeds the bounded LearnerQueue, and loader
threads turn its fragments into device batches. Either way the group answers ``next_batch()``;
while the learner waits, the group checks its runners' health and, as ``fault_tolerance()``
says, restarts a failed or hung runner after its delay, ignores it, or raises. A runner that
leaves keeps its env steps, env restarts and finished episodes in the group's counts. RLlib's
EnvRunnerGroup plays the same part across Ray actors.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import logging
import threading
import time
from collections.abc import Callable

import jax
import numpy as np

from impala_jax.core.policy import initial_carry
from impala_jax.runtime.acting.env_runner import (
    IDENTICAL_FAILURES_TO_STOP,
    EnvOutputError,
    EnvRunner,
    ParamStore,
    RepeatTracker,
    RunnerSpec,
    RunnerThread,
    actor_key,
    failure_signature,
)
from impala_jax.runtime.acting.user_code import UserCodeError
from impala_jax.runtime.learning.buffers import (
    Batcher,
    LearnerQueue,
    LearnerQueueTimeout,
    Loader,
    LoaderSpec,
    stack,
)
from impala_jax.runtime.metrics import Timers

logger = logging.getLogger(__name__)

# While no runner samples, the learner's wait reports why at most this often (seconds).
DOWN_REPORT_EVERY_S = 10.0
TOLERANCE_KNOBS = (
    "fault_tolerance(delay_between_env_runner_restarts_s=..., max_num_env_runner_restarts=..., "
    "num_consecutive_env_runner_failures_tolerance=..., ignore_env_runner_failures=...)"
)


def release_free_heap() -> None:
    """Returns the C heap's free pages to the OS (glibc's malloc_trim; elsewhere nothing).

    glibc keeps the freed pages of an exited thread's malloc arena, so without a trim every
    runner restart grows the resident memory (benchmarks/soak.py). Called, after a
    gc.collect(), once a replaced runner's thread has exited."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def _hopeless(count: int) -> str:
    return (
        f"{count} times in a row with the same error at the same env step after each rebuild "
        "of its envs: a bug in the env or its config, not bad luck, so it is not rebuilt again"
    )


@dataclasses.dataclass(frozen=True)
class FaultToleranceSpec:
    """What the group does with a failed or hung runner: ``fault_tolerance()`` and
    ``env_runners(sample_timeout_s)``, each field named as the config field it comes from
    (rllib/specs.py builds it)."""

    restart_failed_env_runners: bool
    ignore_env_runner_failures: bool
    max_num_env_runner_restarts: int
    delay_between_env_runner_restarts_s: float
    num_consecutive_env_runner_failures_tolerance: int
    restart_failed_sub_environments: bool  # rebuild a runner's envs in place first
    sample_timeout_s: float  # a runner that produces nothing this long is hung


class EnvRunnerFailure(RuntimeError):
    """A runner failed and ``fault_tolerance()`` does not recover it; the group has stopped."""


class EnvRunnerGroup:
    """Starts, watches, restarts and retires the runners; hands out train batches.

    ``act`` / ``act_greedy`` are the compiled policy and ``params`` the learner's first params,
    which the group's ParamStore keeps on ``actor_device``. ``spec`` says how runners are made,
    ``loader`` how their fragments reach the learner, ``fault_tolerance`` what a failure does.
    Construction compiles ``act``; envs and threads start in ``start()``, so the caller can
    compile the learner in between.
    """

    def __init__(
        self,
        spec: RunnerSpec,
        loader: LoaderSpec,
        fault_tolerance: FaultToleranceSpec,
        act: Callable,
        act_greedy: Callable,
        params,
        actor_device,
        observation_space,
        seed: int,
        batch_columns: int,
        action_space=None,
    ):
        self.spec = spec
        self._loader_spec = loader
        self._fault_spec = fault_tolerance
        self._action_space = action_space
        self._act, self._act_greedy = act, act_greedy
        self._seed = seed
        self.param_store = ParamStore(params, actor_device)
        self.timers = Timers()  # stages of the learner's thread: waiting, lockstep transfer
        # What episode callbacks log (env_runners/... results).
        self.metrics = spec.callbacks.new_metrics()
        self.batcher = Batcher(batch_columns)
        self.runners: list[EnvRunner] = []  # live runners: their steps and episodes count
        self._threads: dict[int, RunnerThread] = {}  # runner slot -> its thread
        self._queue: LearnerQueue | None = None
        self._loader: Loader | None = None
        self._to_device: Callable | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._launched = False
        # What fault_tolerance/... in the results counts, and what retired runners left behind.
        self._pending_restarts: dict[int, float] = {}  # runner slot -> when to restart it
        self._retired_episodes: list = []
        self.num_restarts = 0
        self.num_failures = 0
        self._consecutive_failures = 0
        self._failures_at_iteration_start = 0
        self._env_steps_sampled_base = 0  # steps of runners that left, and of restored runs
        self._num_env_restarts_base = 0
        self._num_dropped_episodes_base = 0
        self._num_dropped_fragments_base = 0
        self._dropped_fragments_base: dict[tuple[int, int], int] = {}  # (runner, env) -> count
        self._last_failure: RunnerThread | None = None
        self._failed: dict[int, RunnerThread] = {}  # runner slot -> its last failed thread
        self._exiting: list[RunnerThread] = []  # abandoned threads not finished yet
        self._repeats: dict[int, RepeatTracker] = {}  # identical failures across restarts
        # Called with a report while no runner samples (the CLI shows it); default: a log line.
        self.on_down: Callable[[str], None] = logger.warning
        self._down_reported: tuple[str | None, float] = (None, 0.0)
        self._warm_up_act(observation_space)

    def _warm_up_act(self, observation_space) -> None:
        """Compiles ``act`` for the runners' batch shapes before any runner thread starts, so
        compilation never counts against ``sample_timeout_s``."""
        params, _ = self.param_store.get()
        size = EnvRunner.group_sizes(self.spec.env.num_envs_per_env_runner)[0]
        obs = np.zeros((size, *observation_space.shape), observation_space.dtype)
        if hasattr(self._act, "initial_state"):  # a RecurrentActor: rows carry its state
            carry = initial_carry(self._act, size, self._action_space)
            out = self._act(params, obs, actor_key(0, params), carry)
            jax.block_until_ready(self._act.greedy(params, obs, carry))
        else:
            out = self._act(params, obs, actor_key(0, params, self._act))
        jax.block_until_ready(out)

    def start(self, to_device: Callable) -> None:
        """Builds the envs and, when threaded, the runner threads and starts the loaders.

        The runner threads begin sampling at the first ``next_batch()``, not here: a restore
        between build and the first ``train()`` then reaches every fragment and episode.
        ``to_device`` places one host batch on the learner devices.
        """
        spec, loader = self.spec, self._loader_spec
        self._to_device = to_device
        if spec.num_env_runners == 0:
            self.runners.append(self._make_runner(0, self._seed))
            return
        self._queue = LearnerQueue(loader.learner_queue_size)
        for i in range(spec.num_env_runners):
            # envpool seeds env i with seed + i: runners are spaced by their env count.
            self._start_runner(i, self._seed + i * spec.env.num_envs_per_env_runner, launch=False)
        self._loader = Loader(
            self._queue,
            self.batcher,
            to_device,
            num_threads=loader.num_gpu_loader_threads,
            num_slots=loader.num_multi_gpu_tower_stacks,
            stop=self._stop,
            num_aggregators=loader.num_aggregator_actors_per_learner,
            aggregator_queue_size=loader.max_requests_in_flight_per_aggregator_actor,
        )

    def _make_runner(self, index: int, seed: int) -> EnvRunner:
        return EnvRunner(
            self.spec,
            index,
            self._act,
            self._act_greedy,
            self.param_store,
            seed=seed,
            metrics_logger=self.metrics,
        )

    def _start_runner(self, index: int, seed: int, launch: bool = True) -> None:
        ft = self._fault_spec
        runner = self._make_runner(index, seed)
        runner.heartbeat = time.monotonic()
        # The thread holds no reference to the group or the algorithm: `del algo` must reach
        # IMPALA.__del__, which stops the threads.
        thread = RunnerThread(
            runner,
            self._queue.put,
            restart_envs=ft.restart_failed_sub_environments,
            tolerance=ft.num_consecutive_env_runner_failures_tolerance,
        )
        self.runners.append(runner)
        self._threads[index] = thread
        if launch:
            thread.start()

    def _launch(self) -> None:
        """Starts the runner threads that ``start()`` built."""
        self._launched = True
        for thread in self._threads.values():
            if thread.ident is None:
                thread.runner.heartbeat = time.monotonic()
                thread.start()

    @property
    def has_sampled(self) -> bool:
        """Whether any runner has produced (or begun producing) a fragment."""
        return self._launched or any(r.env_steps for r in self.runners)

    @property
    def local_runner(self) -> EnvRunner | None:
        """The lockstep runner (``num_env_runners=0``), sampled in the caller's thread."""
        return self.runners[0] if self._queue is None and self.runners else None

    def next_batch(self):
        """(device batch, host param versions): sampled here in lockstep, or from the loader."""
        if self._loader is None:
            ready: list = []
            while not ready:
                for traj in self.sample():
                    ready.extend(self.batcher.add(traj))
            host = stack(ready[0])
            with self.timers.time("transfer"):
                return self._to_device(host), host.param_version
        if not self._launched:
            self._launch()
        timeout = self._loader_spec.learner_queue_timeout
        waited = 0.0
        with self.timers.time("learner_wait"):
            while True:
                self.check_health()
                # Short waits, so failed or hung runners are handled while the learner waits.
                item = self._loader.get(timeout=min(0.5, timeout))
                if item is not None:
                    return item
                down = self.down_report()
                if down is not None:
                    # No runner samples: the wait is for a scheduled restart (bounded by the
                    # restart delay and max_num_env_runner_restarts), not for slow envs.
                    self._report_down(down)
                    continue
                waited += min(0.5, timeout)
                if waited >= timeout:
                    raise LearnerQueueTimeout(
                        f"the learner waited {timeout:g} s for a batch "
                        f"(training(learner_queue_timeout={timeout:g})); the env runners are "
                        "slower than that or stalled: raise learner_queue_timeout for slow envs."
                        + self._failures_so_far()
                    )

    def down_report(self) -> str | None:
        """Why no runner samples, when none does and restarts are pending; else None."""
        if self._threads or not self._pending_restarts:
            return None
        now = time.monotonic()
        lines = ["No EnvRunner is sampling; the learner waits for a restart."]
        for index, due in sorted(self._pending_restarts.items()):
            thread = self._failed.get(index)
            error = f"{type(thread.error).__name__}: {thread.error}" if thread else "unknown"
            when = (
                time.strftime("%H:%M:%S", time.localtime(thread.error_time or 0)) if thread else "?"
            )
            lines.append(
                f"  EnvRunner {index} failed at {when} with {error}; its restart is due in "
                f"{max(0.0, due - now):.0f} s (restart {self.num_restarts + 1} of at most "
                f"{self._fault_spec.max_num_env_runner_restarts})"
            )
        last = self._last_failure
        if last is not None and last.error_traceback:
            lines.append(f"  last traceback (EnvRunner {last.runner.index}):")
            lines.extend("    " + line for line in last.error_traceback.rstrip().splitlines())
        lines.append(f"  To change the tolerance: {TOLERANCE_KNOBS}.")
        return "\n".join(lines)

    def _report_down(self, report: str) -> None:
        key = report.split("\n", 2)[1] if "\n" in report else report
        key = key.split("; its restart is due")[0]  # the same failure, not the countdown
        last_key, last_time = self._down_reported
        now = time.monotonic()
        if key != last_key or now - last_time >= DOWN_REPORT_EVERY_S:
            self._down_reported = (key, now)
            self.on_down(report)

    def _failures_so_far(self) -> str:
        if not self._failed:
            return ""
        parts = [
            f"EnvRunner {i}: {type(t.error).__name__}: {t.error}"
            for i, t in sorted(self._failed.items())
        ]
        return " Runner failures so far: " + "; ".join(parts) + "."

    def sample(self) -> list:
        """One lockstep fragment per env group; env failures restart the envs if configured."""
        ft = self._fault_spec
        runner = self.runners[0]
        tolerance = ft.num_consecutive_env_runner_failures_tolerance
        repeats = RepeatTracker()
        for attempt in range(tolerance + 1):
            try:
                return runner.sample()
            except (EnvOutputError, UserCodeError):
                raise
            except Exception as err:
                same = repeats.add(failure_signature(err, runner))
                if not ft.restart_failed_sub_environments or attempt == tolerance:
                    raise
                if same >= IDENTICAL_FAILURES_TO_STOP:
                    self.stop()
                    raise EnvRunnerFailure(
                        f"the lockstep EnvRunner failed {_hopeless(same)}: "
                        f"{type(err).__name__}: {err}"
                    ) from err
                runner.restart_envs()
        raise AssertionError("unreachable")

    def publish(self, params) -> None:
        """Makes ``params`` the runners' newest policy (a new ParamStore version)."""
        self.param_store.publish(params)

    def check_health(self) -> None:
        """Failed or hung runners: restart, ignore or raise, as ``fault_tolerance`` says."""
        ft, spec = self._fault_spec, self.spec
        now = time.monotonic()
        if any(not t.is_alive() for t in self._exiting):
            self._exiting = [t for t in self._exiting if t.is_alive()]
            gc.collect()  # its runner and buffers sit in reference cycles until a collection
            release_free_heap()
        for index, thread in list(self._threads.items()):
            hung = (
                thread.error is None
                and thread.is_alive()
                and not thread.waiting_on_queue
                and now - thread.runner.heartbeat > ft.sample_timeout_s
            )
            if thread.error is None and not hung:
                continue
            if hung:
                thread.error = TimeoutError(
                    f"EnvRunner {index} produced nothing for {ft.sample_timeout_s:g} s "
                    f"(env_runners(sample_timeout_s={ft.sample_timeout_s:g})): marked unhealthy, "
                    "its late data is dropped."
                )
                thread.error_traceback = repr(thread.error)
            # An abandoned thread drops whatever it still produces and closes its envs.
            thread.stop_event.set()
            self._exiting.append(thread)
            del self._threads[index]
            self._retire(thread.runner)
            self.num_failures += 1
            self._consecutive_failures += 1
            self._last_failure = thread
            self._failed[index] = thread
            fatal = isinstance(thread.error, EnvOutputError | UserCodeError)
            same = self._count_repeats(index, thread)
            hopeless = same >= IDENTICAL_FAILURES_TO_STOP
            if hopeless and not ft.ignore_env_runner_failures:
                self._raise_failure(thread, _hopeless(same))
            if hopeless:
                logger.warning(
                    "EnvRunner %d failed %s; ignore_env_runner_failures=True: the others go on.",
                    index,
                    _hopeless(same),
                )
            elif (
                not fatal
                and ft.restart_failed_env_runners
                and (
                    self.num_restarts + len(self._pending_restarts) < ft.max_num_env_runner_restarts
                )
            ):
                self._pending_restarts[index] = now + ft.delay_between_env_runner_restarts_s
            elif fatal or not ft.ignore_env_runner_failures:
                self._raise_failure(thread, "and fault_tolerance() does not recover it")
            if self._consecutive_failures > ft.num_consecutive_env_runner_failures_tolerance:
                self._raise_failure(
                    thread,
                    f"after {self._consecutive_failures} consecutive failures "
                    "(fault_tolerance(num_consecutive_env_runner_failures_tolerance="
                    f"{ft.num_consecutive_env_runner_failures_tolerance}))",
                )
        for index, due in list(self._pending_restarts.items()):
            if now >= due:
                del self._pending_restarts[index]
                self.num_restarts += 1
                # A fresh seed block per restart, after every first-generation runner's block.
                n = spec.env.num_envs_per_env_runner
                self._start_runner(
                    index, self._seed + (spec.num_env_runners + self.num_restarts) * n
                )
        if not self._threads and not self._pending_restarts:
            self._raise_failure(self._last_failure, "and no healthy EnvRunner is left")

    def _count_repeats(self, index: int, thread: RunnerThread) -> int:
        """Identical failures in a row of runner slot ``index``, over its env rebuilds inside
        the thread and its restarts as a new thread (one that produced a fragment counts
        afresh)."""
        tracker = self._repeats.setdefault(index, RepeatTracker())
        own = thread.repeats
        if thread.fragments or own.signature != tracker.signature:
            tracker.signature, tracker.count = own.signature, own.count
        else:
            tracker.count += own.count
        return tracker.count

    def _retire(self, runner: EnvRunner) -> None:
        """Keeps a runner's counts and finished episodes when it leaves the live set."""
        if runner.episode_callbacks is not None:
            runner.episode_callbacks.detach()  # an abandoned thread's late episodes log nothing
        self.runners.remove(runner)
        self._env_steps_sampled_base += runner.env_steps
        self._num_env_restarts_base += runner.num_env_restarts
        self._num_dropped_episodes_base += runner.num_dropped_episodes + int(
            sum(np.count_nonzero(g.episode_len) for g in runner.groups)
        )
        self._retired_episodes.extend(runner.episodes.drain())
        for env, count in runner.door.by_env.items():
            key = (runner.index, env)
            self._dropped_fragments_base[key] = self._dropped_fragments_base.get(key, 0) + count
        self._num_dropped_fragments_base += runner.door.num_dropped

    def _raise_failure(self, thread: RunnerThread | None, why: str) -> None:
        self.stop()
        if thread is None:
            raise EnvRunnerFailure(f"no EnvRunner is running {why}.")
        raise EnvRunnerFailure(
            f"EnvRunner {thread.runner.index} failed {why}: {thread.error}\n"
            f"original traceback:\n{thread.error_traceback}"
        ) from thread.error

    def begin_iteration(self) -> None:
        self._failures_at_iteration_start = self.num_failures

    def end_iteration(self) -> None:
        """An iteration without a new failure ends a run of consecutive failures."""
        if self.num_failures == self._failures_at_iteration_start:
            self._consecutive_failures = 0

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self._env_steps_sampled_base + sum(r.env_steps for r in self.runners)

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        """After a restore: the live runners' own steps count on top of the restored total."""
        self._env_steps_sampled_base = value - sum(r.env_steps for r in self.runners)

    def drain_episodes_and_metrics(self) -> tuple[list[tuple[float, int]], dict]:
        """`drain_episodes()` and what episode callbacks logged meanwhile, taken together: a
        runner ends an episode's callbacks and records the episode under the same lock."""
        with self.metrics.lock:
            return self.drain_episodes(), self.metrics.reduce()

    def drain_episodes(self) -> list[tuple[float, int]]:
        """(return, length) of every episode finished since the last call, retired runners'
        included."""
        episodes, self._retired_episodes = self._retired_episodes, []
        for runner in self.runners:
            episodes.extend(runner.episodes.drain())
        return episodes

    def drain_timers(self) -> list[dict]:
        """Stage timers of this group's threads since the last call (metrics.merge_timers)."""
        drained = [self.timers.drain()] + [r.timers.drain() for r in self.runners]
        return drained + ([self._loader.timers.drain()] if self._loader else [])

    def queue_size(self) -> int:
        return self._queue.qsize() if self._queue else 0

    def num_dropped_fragments(self) -> int:
        """Fragments the runners' door dropped for a non-finite value, retired runners' too."""
        live = sum(r.door.num_dropped for r in self.runners)
        return self._num_dropped_fragments_base + live

    def dropped_fragments_by_env(self) -> dict:
        """``{"runner_<i>": {"env_<j>": count}}``: in how many dropped fragments each env (its
        column in runner slot i) held a non-finite value."""
        counts = dict(self._dropped_fragments_base)
        for runner in self.runners:
            for env, count in runner.door.by_env.items():
                counts[(runner.index, env)] = counts.get((runner.index, env), 0) + count
        out: dict = {}
        for (runner, env), count in sorted(counts.items()):
            out.setdefault(f"runner_{runner}", {})[f"env_{env}"] = count
        return out

    def fault_tolerance_metrics(self) -> dict:
        return {
            "num_non_finite_fragments_dropped": self.num_dropped_fragments(),
            "non_finite_fragments_by_env": self.dropped_fragments_by_env(),
            "num_healthy_workers": sum(
                t.is_alive() and t.error is None for t in self._threads.values()
            ),
            "num_remote_worker_restarts": self.num_restarts,
            "num_env_runner_failures": self.num_failures,
            "num_env_restarts": self._num_env_restarts_base
            + sum(r.num_env_restarts for r in self.runners),
            "num_dropped_episodes": self._num_dropped_episodes_base
            + sum(r.num_dropped_episodes for r in self.runners),
        }

    def restart_for_restore(self) -> None:
        """Fresh runners, queue and loaders once anything was sampled (a restore mid-run).

        Fragments and episodes in flight belong to the policy before the restore: they are
        dropped, so every result after it comes from the restored params. The counts stay
        (the restore then sets the lifetime step count). Nothing is done before the first
        fragment: the runners built at ``start()`` have not sampled yet.
        """
        if not self.has_sampled:
            return
        self._shut_down()
        for runner in list(self.runners):
            self._retire(runner)  # keeps its counts
        self._threads, self._pending_restarts = {}, {}
        self._retired_episodes = []
        self.metrics.reduce()  # what those episodes' callbacks logged is dropped with them
        self.batcher = Batcher(self.batcher.columns)
        self._stop = threading.Event()
        self._launched = False
        self.start(self._to_device)

    def stop(self) -> None:
        """Ends every runner and loader thread and closes every env; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._shut_down()

    def _shut_down(self) -> None:
        self._stop.set()
        threads = [t for t in self._threads.values() if t.ident is not None]
        for thread in self._threads.values():
            thread.stop_event.set()
            if thread.ident is None:  # built, never started: its envs are closed here
                thread.runner.close()
        for thread in threads:
            thread.join(timeout=10)  # each runner thread closes its own envs on its way out
        if self._loader is not None:
            for thread in self._loader.threads:
                thread.join(timeout=10)
        if not threads:
            for runner in self.runners:
                runner.close()
