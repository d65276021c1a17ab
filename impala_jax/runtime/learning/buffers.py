"""Host-side buffering between EnvRunners and the learner.

fragments --(LearnerQueue, bounded)--> Batcher --(loader threads: stack, device_put)--> prefetch
slots --> learner. Replay slots live on the learner devices (see learner.py), so mixin replay
costs no host-device traffic.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable

import jax
import numpy as np

from impala_jax.core import finite
from impala_jax.core.types import Trajectory
from impala_jax.runtime.metrics import Timers

# An env group whose fragments held a non-finite value this many times in a row has a broken
# env, not an unlucky step: its runner stops with an error instead of dropping more.
MAX_DROPPED_IN_A_ROW = 10
# How the door names a non-finite field, in the order it reports them.
_FIELD_NAMES = {"obs": "observation", "reward": "reward", "behaviour_logits": "behaviour output"}


def non_finite_columns(traj: Trajectory) -> dict[str, np.ndarray]:
    """Each field of a fragment that holds a non-finite value -> bool ``[B]``, the columns
    (envs) holding one (`core.finite`'s rule); empty for a fragment the learner can train on."""
    out: dict[str, np.ndarray] = {}
    for name, value in traj._asdict().items():
        for x in jax.tree.leaves(value):
            bad = finite.non_finite_columns(np.asarray(x))
            if bad is not None and bad.any():
                out[name] = out[name] | bad if name in out else bad
    return out


class FragmentDoor:
    """Where a runner's fragments enter: one holding a non-finite observation, reward or
    behaviour output is dropped before any batch is cut or replay slot written, and counted
    with the envs that produced it. The learner's batch then fills from the next fragments, so
    its size (and the compiled step) stay the same."""

    def __init__(self, num_groups: int):
        self.num_dropped = 0
        self.by_env: dict[int, int] = {}  # env (its column in the runner) -> fragments dropped
        self._in_a_row = [0] * num_groups
        self._last: tuple[str, np.ndarray] | None = None  # (field, values) of the last drop

    def admit(self, traj: Trajectory, group: int, offset: int) -> bool:
        """True for a finite fragment of env group ``group``; else counts it against its envs
        (``offset`` + column) and returns False."""
        bad = non_finite_columns(traj)
        if not bad:
            self._in_a_row[group] = 0
            return True
        self.num_dropped += 1
        self._in_a_row[group] += 1
        for column in np.flatnonzero(np.logical_or.reduce(list(bad.values()))):
            env = offset + int(column)
            self.by_env[env] = self.by_env.get(env, 0) + 1
        name = next(n for n in (*_FIELD_NAMES, *bad) if n in bad)
        self._last = (name, getattr(traj, name))
        return False

    def hopeless(self, group: int) -> str | None:
        """What the last MAX_DROPPED_IN_A_ROW dropped fragments of ``group`` held ("reward
        nan"), once there were that many in a row; else None."""
        if self._in_a_row[group] < MAX_DROPPED_IN_A_ROW or self._last is None:
            return None
        name, values = self._last
        what = _FIELD_NAMES.get(name, f"{name} value")
        if name == "reward":
            what += f" {values[~np.isfinite(values)][0]}"
        return what


class LearnerQueueTimeout(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """How runner threads' fragments reach the learner (LearnerQueue, Loader); each field named
    as the config field it comes from (rllib/specs.py builds it)."""

    learner_queue_size: int
    learner_queue_timeout: float  # seconds the learner waits for a batch before it raises
    num_gpu_loader_threads: int
    num_multi_gpu_tower_stacks: int
    num_aggregator_actors_per_learner: int
    max_requests_in_flight_per_aggregator_actor: int


class LearnerQueue:
    """Bounded fragment queue (``learner_queue_size``) between runner threads and loaders.

    Both sides poll with short waits so that a stop request (or an abandoned runner) is seen
    promptly; how long the learner may wait in all is enforced by the algorithm
    (``learner_queue_timeout``).
    """

    def __init__(self, maxsize: int):
        self._q: queue.Queue = queue.Queue(maxsize)

    def put(self, item, stop: threading.Event) -> bool:
        """Blocks while full; False when ``stop`` is set before there is room."""
        while not stop.is_set():
            try:
                self._q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def get(self, stop: threading.Event):
        """The next fragment, or None once ``stop`` is set."""
        while not stop.is_set():
            try:
                return self._q.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def qsize(self) -> int:
        return self._q.qsize()


class Batcher:
    """Cuts fragments into batches of exactly ``columns`` trajectories along B."""

    def __init__(self, columns: int):
        self.columns = columns
        self._parts: list[Trajectory] = []
        self._have = 0

    def add(self, traj: Trajectory) -> list[list[Trajectory]]:
        """Adds a fragment; returns the complete batches (as lists of column slices)."""
        out = []
        while traj is not None:
            need = self.columns - self._have
            b = traj.reward.shape[1]
            if b <= need:
                self._parts.append(traj)
                self._have += b
                traj = None
            else:
                self._parts.append(_columns(traj, slice(0, need)))
                self._have += need
                traj = _columns(traj, slice(need, b))
            if self._have == self.columns:
                out.append(self._parts)
                self._parts, self._have = [], 0
        return out


def _columns(traj: Trajectory, cols: slice) -> Trajectory:
    return jax.tree.map(lambda x: x[cols] if x.ndim == 1 else x[:, cols], traj)


def stack(parts: list[Trajectory]) -> Trajectory:
    """Concatenates fragments along B (param_version is [B], the rest time-major, a recurrent
    core_state [K, B, ...] too)."""
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0 if xs[0].ndim == 1 else 1), *parts)


class Loader:
    """Fragments -> batches -> device, into prefetch slots.

    ``num_gpu_loader_threads`` threads copy batches to the devices. Without aggregator threads
    (``num_aggregator_actors_per_learner=0``) they also cut and stack the batches themselves;
    with N of them, N threads do the cutting and stacking on the host (RLlib's aggregator
    actors) and hand at most N x ``max_requests_in_flight_per_aggregator_actor`` stacked
    batches to the loader threads, which then only copy. The batcher is shared under a lock so
    no thread hoards half a batch; stacking and copies run outside it, in parallel.
    ``num_multi_gpu_tower_stacks`` bounds how many device batches wait for the learner.
    """

    def __init__(
        self,
        source: LearnerQueue,
        batcher: Batcher,
        to_device: Callable[[Trajectory], object],
        num_threads: int,
        num_slots: int,
        stop: threading.Event,
        num_aggregators: int = 0,
        aggregator_queue_size: int = 1,
    ):
        self._source = source
        self._batcher = batcher
        self._to_device = to_device
        self._stop = stop
        self._lock = threading.Lock()
        self._ready: list[list[Trajectory]] = []
        self.slots: queue.Queue = queue.Queue(num_slots)
        self._stacked: queue.Queue | None = None
        self.timers = Timers()
        self.error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._run, name=f"loader-{i}", daemon=True)
            for i in range(num_threads)
        ]
        if num_aggregators:
            self._stacked = queue.Queue(num_aggregators * aggregator_queue_size)
            self.threads += [
                threading.Thread(target=self._aggregate, name=f"aggregator-{i}", daemon=True)
                for i in range(num_aggregators)
            ]
        for t in self.threads:
            t.start()

    def _next_parts(self):
        with self._lock:
            while not self._ready:
                traj = self._source.get(self._stop)
                if traj is None:
                    return None
                self._ready.extend(self._batcher.add(traj))
            return self._ready.pop(0)

    def _put(self, q: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _next_host_batch(self) -> Trajectory | None:
        if self._stacked is None:
            parts = self._next_parts()
            if parts is None:
                return None
            with self.timers.time("stack"):
                return stack(parts)
        while not self._stop.is_set():
            try:
                return self._stacked.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _aggregate(self) -> None:
        try:
            while not self._stop.is_set():
                parts = self._next_parts()
                if parts is None:
                    return
                with self.timers.time("stack"):
                    host = stack(parts)
                if not self._put(self._stacked, host):
                    return
        except BaseException as err:  # raised in the learner's thread by get()
            self.error = err

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                host = self._next_host_batch()
                if host is None:
                    return
                with self.timers.time("transfer"):
                    item = (self._to_device(host), host.param_version)
                if not self._put(self.slots, item):
                    return
        except BaseException as err:  # raised in the learner's thread by get()
            self.error = err

    def get(self, timeout: float):
        """The next (device batch, param versions), or None after ``timeout`` seconds."""
        if self.error is not None:
            raise self.error
        try:
            return self.slots.get(timeout=timeout)
        except queue.Empty:
            if self.error is not None:
                raise self.error from None
            return None


class MinibatchBuffer:
    """RLlib's minibatch buffer: ``size`` device batches, each used ``num_epochs`` times.

    Batches are served round-robin, so reuse of one batch is interleaved with the others
    instead of back to back; a slot whose batch is used up takes the next new batch.
    """

    def __init__(self, size: int, num_epochs: int, next_batch):
        self._next = next_batch
        self._num_epochs = num_epochs
        self._slots: list = [None] * size
        self._uses_left = [0] * size
        self._idx = 0

    def next_batch(self):
        i = self._idx
        if self._uses_left[i] <= 0:
            self._slots[i] = None  # release the device batch before fetching the next
            self._slots[i] = self._next()
            self._uses_left[i] = self._num_epochs
        self._uses_left[i] -= 1
        self._idx = (i + 1) % len(self._slots)
        return self._slots[i]
