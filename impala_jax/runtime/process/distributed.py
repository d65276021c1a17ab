"""One learner over several processes and hosts: ``jax.distributed`` start-up and roles.

Call `initialize` before anything starts JAX's backends (before ``build()``). Each process
then sees every process's devices in ``jax.devices()``, the learner mesh spans them
(``learners(num_learners=N)`` counts devices across processes; 0 is one device of each
process: ``parallel.learner_devices``) and the per-device learner step's gradient mean runs
over all of them. A process puts only its own part of a batch on the mesh (``parallel.put``:
``jax.make_array_from_process_local_data``); the learner state is the same value on every
process.

Every process runs its own EnvRunnerGroup (runner threads or lockstep) on a seed block of its
own (`process_seed_and_key`) and feeds its share of each batch. Before each update the processes
agree (`agreed_next_batch`) that every one has its batch, summing their env-step counts: a runner
failure anywhere stops all with that process's error instead of leaving the others in a
collective. Process 0 decides when an iteration and the run end, alone writes files and
checkpoints and evaluates; results count and pool over all processes.

A lost peer: a peer that exits or is killed breaks the collective it was in, and the others
stop with `PeerLost` naming it once the coordinator has missed its heartbeats
(``heartbeat_timeout_s``); every wait for the others is also watched (``collective_timeout_s``),
and a peer that hangs is named by the watchdog (from the collective counts each process posts
to the coordinator), which then ends this process: a thread cannot leave a hung collective.
Losing process 0 (the coordinator) ends the others through JAX's own fatal error. JAX's
recoverability mode is on, so that a lost peer fails the others' collectives instead of
aborting them from C++; in exchange every process waits for the others at exit (bounded).

CPU processes use gloo collectives (two processes on 127.0.0.1 in the tests), GPUs NCCL. JAX
is imported only inside functions; ``import impala_jax`` does not import this module.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import sys
import threading
import time

import numpy as np

# The environment variables `initialize` reads when it is given no arguments.
ENV_COORDINATOR = "IMPALA_JAX_COORDINATOR"  # HOST:PORT of process 0's coordinator service
ENV_NUM_PROCESSES = "IMPALA_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "IMPALA_JAX_PROCESS_ID"
# Exit status of a process the watchdog ends (a hung collective); as the CLI's failures.
EXIT_PEER_LOST = 1
# Env seeds of process p start at seed + p * this (far above any runner's restart blocks).
PROCESS_SEED_STRIDE = 1 << 24

_ADDRESS = re.compile(r"^\[?[\w.\-:]+\]?:\d{1,5}$")


class PeerLost(RuntimeError):
    """Another process of the run is gone (it exited, was killed or hangs)."""


class _Run:
    """This process's multi-process settings (set by `initialize`)."""

    collective_timeout_s: float = 60.0
    heartbeat_timeout_s: float = 10.0
    peer_lost: bool = False
    watchdog: _Watchdog | None = None


def _from_env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _int(name: str, value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be an integer") from None


def _checked(coordinator_address, num_processes, process_id) -> tuple[str, int, int]:
    """The explicit (coordinator, count, id), checked; a ValueError names a bad one."""
    if any(v is None for v in (coordinator_address, num_processes, process_id)):
        raise ValueError(
            "impala_jax.runtime.process.distributed.initialize needs all of coordinator_address, "
            f"num_processes and process_id (got {coordinator_address!r}, {num_processes!r}, "
            f"{process_id!r}); give the three, or none for JAX's cluster detection."
        )
    if not isinstance(coordinator_address, str) or not _ADDRESS.match(coordinator_address):
        raise ValueError(
            f"coordinator_address={coordinator_address!r} must be HOST:PORT of process 0, "
            "e.g. 10.0.0.1:1234"
        )
    num_processes = _int("num_processes", num_processes)
    process_id = _int("process_id", process_id)
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} must be >= 1")
    if not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id={process_id} must be in [0, {num_processes}) (num_processes="
            f"{num_processes})"
        )
    return coordinator_address, num_processes, process_id


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    collective_timeout_s: float = 60.0,
    initialization_timeout_s: int = 300,
    heartbeat_timeout_s: int = 10,
) -> int:
    """Joins this process to a multi-process run; returns the number of processes.

    With no arguments: the ``IMPALA_JAX_COORDINATOR`` / ``IMPALA_JAX_NUM_PROCESSES`` /
    ``IMPALA_JAX_PROCESS_ID`` environment variables, else JAX's own cluster detection (SLURM,
    Open MPI, TPU pods); with none found, one process and nothing is started (returns 1).
    ``collective_timeout_s`` bounds every wait for the other processes in training (a slower
    peer's batch, process 0's checkpoint save); past it the watchdog ends this process with a
    message naming the silent processes. ``initialization_timeout_s`` bounds the wait for
    every process to join; ``heartbeat_timeout_s`` is how long the coordinator waits for a
    silent process before it counts it as lost: a killed process is named about that long
    after the collective it broke failed (JAX's default, 100 s, is longer).
    """
    import jax
    from jax._src import xla_bridge

    if _client() is not None:  # joined already (a second call): nothing more to do
        return jax.process_count()
    asked = (coordinator_address, num_processes, process_id)
    asked += tuple(map(_from_env, (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)))
    # The arguments first: a bad one is the error to report, whatever state JAX is in.
    if not collective_timeout_s or collective_timeout_s <= 0:
        raise ValueError(
            f"collective_timeout_s={collective_timeout_s!r} must be > 0 seconds (how long a "
            "process waits for the others before it gives up)"
        )
    coordinator_address = coordinator_address or _from_env(ENV_COORDINATOR)
    if num_processes is None and _from_env(ENV_NUM_PROCESSES):
        num_processes = _int(ENV_NUM_PROCESSES, _from_env(ENV_NUM_PROCESSES))
    if process_id is None and _from_env(ENV_PROCESS_ID):
        process_id = _int(ENV_PROCESS_ID, _from_env(ENV_PROCESS_ID))
    explicit = (coordinator_address, num_processes, process_id)
    if not all(v is None for v in explicit):
        coordinator_address, num_processes, process_id = _checked(*explicit)
    if xla_bridge.backends_are_initialized():
        if all(v is None for v in asked):  # e.g. the CLI's main() called in a JAX program
            return jax.process_count()
        raise RuntimeError(
            "impala_jax.runtime.process.distributed.initialize() must come before anything uses "
            "JAX (before build(), jax.devices(), any computation): JAX has started its backends "
            "already."
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A lost peer then fails the collectives of the others (which name it and stop) instead
    # of aborting every process from JAX's C++ error poller.
    jax.config.update("jax_enable_recoverability", True)
    timeouts = {
        "initialization_timeout": initialization_timeout_s,
        "heartbeat_timeout_seconds": heartbeat_timeout_s,
    }
    if all(v is None for v in explicit):
        try:
            jax.distributed.initialize(**timeouts)
        except ValueError:  # no cluster environment detected: a single process
            return 1
    else:
        jax.distributed.initialize(coordinator_address, num_processes, process_id, **timeouts)
    _Run.collective_timeout_s = float(collective_timeout_s)
    _Run.heartbeat_timeout_s = float(heartbeat_timeout_s)
    if jax.process_count() > 1:
        _Run.watchdog = _Watchdog()
        # Runs before JAX's own shutdown (atexit is last-in first-out): process 0 keeps the
        # coordinator up until every process is done with it.
        atexit.register(_exit_barrier)
    return jax.process_count()


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def is_primary() -> bool:
    """Process 0: the one that writes files."""
    return process_index() == 0


def process_seed_and_key(seed: int, actor_key):
    """This process's env seed block (envpool seeds env i with seed + i) and action key; with
    one process, both unchanged."""
    if process_count() == 1:
        return seed, actor_key
    from jax.random import fold_in

    return seed + process_index() * PROCESS_SEED_STRIDE, fold_in(actor_key, process_index())


def agreed_next_batch(next_batch, local_env_steps, on_total, failure=RuntimeError):
    """``next_batch()``, once every process has its own: one allgather of whether each batch
    came and of each process's ``local_env_steps()``, whose sum (the same on every process, so
    the learner's schedules agree) goes to ``on_total``. A process whose ``next_batch()`` raised
    stops all, where the others would wait in the update's collective: its error there, a
    ``failure`` naming it on the others."""
    error = None
    try:
        got = next_batch()
    except Exception as err:  # a runner failure, a stalled queue: reported to all first
        got, error = None, err
    status = np.array([error is not None, local_env_steps()], np.int64)
    status = allgather(status, "every process's next train batch")
    on_total(int(status[:, 1].sum()))
    failed = [int(i) for i in np.flatnonzero(status[:, 0])]
    if failed:
        report = f"{type(error).__name__}: {error}" if error is not None else None
        reports = allgather_json(report, "the failure report")
        if error is not None:
            raise error
        raise failure(
            f"process {failed[0]} of {len(status)} could not produce its train batch, so "
            f"every process stops: {reports[failed[0]]}"
        )
    return got


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def lost_processes(timeout_s: float = 5.0) -> list[int] | None:
    """The processes the coordinator no longer counts as alive; None when that is not known
    within ``timeout_s`` (the coordinator, process 0, is gone, or a live process hangs: the
    coordinator answers once every live process asks)."""
    client = _client()
    if client is None:
        return []
    count = process_count()
    answer: list = []

    def ask() -> None:
        try:
            answer.append(client.get_live_nodes(list(range(count))))
        except Exception:
            pass

    thread = threading.Thread(target=ask, name="impala_jax-live-processes", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not answer:
        return None
    return [i for i in range(count) if i not in answer[0]]


def _progress(client, i: int) -> tuple[int, int] | None:
    """Process ``i``'s last posted (collectives entered, posts made); None if never posted."""
    try:
        count, posts = client.key_value_try_get(f"{_PROGRESS_KEY}/{i}").split()
        return int(count), int(posts)
    except Exception:
        return None


def _behind() -> str:
    """The processes behind this one, named: those whose last posted collective count is below
    this one's, else those that stopped posting (a stopped or frozen process: its watchdog
    thread posts every 0.5 s even while it waits inside a collective)."""
    watchdog, client = _Run.watchdog, _client()
    if watchdog is None or client is None:
        return "some process"
    mine, others = watchdog.count, [i for i in range(process_count()) if i != process_index()]
    seen = {i: _progress(client, i) for i in others}
    late = [
        f"process {i} (at collective {p[0] if p else 0}, this one at {mine})"
        for i, p in seen.items()
        if p is None or p[0] < mine
    ]
    if late:
        return ", ".join(late)
    time.sleep(_SILENT_S)
    silent = [i for i in others if _progress(client, i) == seen[i]]
    return (
        ", ".join(
            f"process {i} (at collective {seen[i][0]}, this one at {mine}; no progress posted for "
            f"{_SILENT_S:g} s: stopped or frozen)"
            for i in silent
        )
        or "some process"
    )


def describe_loss(what: str, waited_s: float | None = None) -> str:
    """The message for a lost peer: which process, during what, and how to go on."""
    me, count = process_index(), process_count()
    # A hung process (the watchdog's case) would keep the coordinator from answering; a dead
    # one does until the coordinator misses its heartbeats (heartbeat_timeout_s).
    lost = [] if waited_s is not None else lost_processes(_Run.heartbeat_timeout_s + 5)
    if lost is None and me == 0:
        who = "a collective failed and the coordinator could not say which process is gone"
    elif lost is None:
        who = "process 0 (the coordinator) cannot be reached"
    elif lost:
        names = ", ".join(str(i) for i in lost)
        who = f"process {names} of {count} is gone (the coordinator lost its connection)"
    elif waited_s is not None:
        who = (
            f"{_behind()} did not join for {waited_s:.0f} s although still connected (stuck "
            "outside the collective: its env runners stalled, or it is far slower)"
        )
    else:
        who = "a collective with the other processes failed although all are connected"
    timeout = _Run.collective_timeout_s
    return (
        f"process {me} of {count}: {who}, while waiting for {what}. Every process of the run "
        "must be restarted: rerun the same command on every host with --resume RUN_DIR to go "
        f"on from the newest checkpoint. (The wait bound is collective_timeout_s={timeout:g}: "
        "distributed.initialize(collective_timeout_s=...) or --collective-timeout.)"
    )


_PROGRESS_KEY = "impala_jax/collectives"
_SILENT_S = 1.5  # three of the watchdog's posting periods


class _Watchdog:
    """Ends this process when one wait for the other processes lasts past its bound.

    It also posts how many collectives this process has entered, with a post number, to the
    coordinator's key-value store every 0.5 s from its own thread, so a process that times out
    can name the ones behind it, or the ones that stopped posting.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._what: str | None = None
        self._deadline = 0.0
        self._since = 0.0
        self.count = 0  # collectives entered
        self._posted = 0  # posts made
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="impala_jax-collective-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ends the thread and waits for its last post (bounded): a post still in flight when
        JAX's shutdown frees the client aborts the process from C++."""
        self._stopped.set()
        self._thread.join(timeout_s)

    @contextlib.contextmanager
    def waiting(self, what: str, extra_s: float = 0.0):
        now = time.monotonic()
        with self._lock:
            self._what, self._since = what, now
            self._deadline = now + _Run.collective_timeout_s + extra_s
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def _post(self) -> None:
        # Every period, changed or not: the post number says this process is still running.
        count, client = self.count, _client()
        if client is not None:
            self._posted += 1
            try:
                key, value = f"{_PROGRESS_KEY}/{process_index()}", f"{count} {self._posted}"
                client.key_value_set(key, value, True)
            except Exception:  # the coordinator is gone: the collectives will say so
                pass

    def _watch(self) -> None:
        while not self._stopped.wait(0.5):
            self._post()
            with self._lock:
                what, late = self._what, time.monotonic() > self._deadline
                waited = time.monotonic() - self._since
            if what is not None and late:
                _Run.peer_lost = True
                print(f"impala_jax: error: {describe_loss(what, waited)}", file=sys.stderr)
                sys.stdout.flush()
                sys.stderr.flush()
                # A thread cannot leave a hung collective: the process ends here. Checkpoints
                # and log lines written so far are on disk (each is flushed when written).
                os._exit(EXIT_PEER_LOST)


def _collective(fn, what: str, extra_s: float = 0.0):
    """Runs one blocking collective under the watchdog; a failure caused by a lost peer
    becomes `PeerLost` naming it."""
    watchdog = _Run.watchdog
    context = watchdog.waiting(what, extra_s) if watchdog else contextlib.nullcontext()
    try:
        with context:
            return fn()
    except Exception as err:
        if process_count() > 1 and lost_processes() != []:
            _Run.peer_lost = True
            raise PeerLost(describe_loss(what)) from err
        raise


def to_int32_words(values: np.ndarray) -> np.ndarray:
    """Integers of up to 62 bits as int32 pairs [..., 2] (high, low 31 bits): without x64, JAX
    would truncate int64 to int32, and env-step counters pass 2^31 in long runs."""
    values = np.asarray(values, np.int64)
    if np.any(np.abs(values) >= 2**62):
        raise OverflowError(f"a value of {values.ravel()[:4]} does not fit 62 bits")
    return np.stack([values >> 31, values & (2**31 - 1)], axis=-1).astype(np.int32)


def from_int32_words(words: np.ndarray) -> np.ndarray:
    words = np.asarray(words, np.int64)
    return (words[..., 0] << 31) + words[..., 1]


def allgather(values, what: str, extra_s: float = 0.0) -> np.ndarray:
    """Every process's ``values`` (same shape and dtype on each): an array [processes, ...].
    64-bit integers travel as int32 pairs, so they arrive exact."""
    values = np.asarray(values)
    if process_count() == 1:
        return values[None]
    from jax.experimental import multihost_utils  # slow to import: only with others

    wide = values.dtype in (np.int64, np.uint64)
    sent = to_int32_words(values) if wide else values
    got = _collective(lambda: multihost_utils.process_allgather(sent), what, extra_s)
    got = np.asarray(got).reshape(process_count(), *sent.shape)
    return from_int32_words(got).astype(values.dtype) if wide else got


def broadcast(values, what: str, extra_s: float = 0.0) -> np.ndarray:
    """Process 0's ``values`` on every process (the others pass an array of the same shape)."""
    values = np.asarray(values)
    if process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(
        _collective(lambda: multihost_utils.broadcast_one_to_all(values), what, extra_s)
    )


def _padded(n: int) -> int:
    """Sizes rounded up to a power of two: few distinct shapes, few compiled collectives."""
    return 1 << max(0, int(n) - 1).bit_length()


def _json(obj) -> bytes:
    """JSON bytes; numpy values as lists or numbers, anything else as its str."""
    plain = lambda o: o.tolist() if hasattr(o, "tolist") else str(o)  # noqa: E731
    return json.dumps(obj, default=plain).encode()


def allgather_rows(rows: np.ndarray, what: str) -> np.ndarray:
    """Every process's rows [n_i, k] concatenated in process order: [sum n_i, k]."""
    rows = np.asarray(rows)
    counts = allgather(np.int64(len(rows)), what)
    size = _padded(int(counts.max()))
    padded = np.zeros((size, *rows.shape[1:]), rows.dtype)
    padded[: len(rows)] = rows
    gathered = allgather(padded, what)
    return np.concatenate([gathered[i, : int(n)] for i, n in enumerate(counts)])


def allgather_json(obj, what: str) -> list:
    """Every process's JSON-able ``obj``, in process order."""
    data = np.frombuffer(_json(obj), np.uint8)
    counts = allgather(np.int64(len(data)), what)
    padded = np.zeros(_padded(int(counts.max())), np.uint8)
    padded[: len(data)] = data
    gathered = allgather(padded, what)
    return [json.loads(bytes(gathered[i, : int(n)])) for i, n in enumerate(counts)]


# Fields only process 0's value of which counts (it ends each iteration for all; logging is
# per process): they may differ between processes.
PROCESS_0_DECIDES = frozenset(
    {
        "min_time_s_per_iteration",
        "min_sample_timesteps_per_iteration",
        "min_train_timesteps_per_iteration",
        "log_level",
    }
)


def check_same_config(config: dict, error: BaseException | None = None) -> None:
    """The first collective of a build: raises ValueError, the same on every process, when
    one could not start (its ``error``: a config error, an env it cannot make: no process then
    waits for a peer that quit) or the processes built different configs (a flag or override
    given to one host only: each field that differs, with every process's value)."""
    report = None if error is None else f"{type(error).__name__}: {error}"
    reports = allgather_json({"config": config, "error": report}, "every process's config")
    failed = [(i, r["error"]) for i, r in enumerate(reports) if r["error"] is not None]
    if failed:
        raise ValueError(
            f"process {failed[0][0]} of {len(reports)} could not start, so every process "
            f"stops: {failed[0][1]}"
        ) from error
    configs = [r["config"] for r in reports]
    differ = sorted(
        k
        for k in config
        if k not in PROCESS_0_DECIDES and any(c.get(k) != configs[0].get(k) for c in configs)
    )
    if differ:
        details = "; ".join(
            f"{k}: " + ", ".join(f"process {i}: {c.get(k)!r}" for i, c in enumerate(configs))
            for k in differ[:8]
        )
        raise ValueError(
            f"the {len(configs)} processes of this run built different configs ({details}); "
            "run the same command, with the same experiment file and overrides, on every host."
        )


def broadcast_json(obj, what: str, extra_s: float = 0.0):
    """Process 0's JSON-able ``obj`` on every process (the others' ``obj`` is ignored)."""
    data = np.frombuffer(_json(obj), np.uint8) if is_primary() else None
    size = broadcast(np.int64(len(data) if data is not None else 0), what, extra_s)
    padded = np.zeros(_padded(int(size)), np.uint8)
    if data is not None:
        padded[: len(data)] = data
    padded = broadcast(padded, what)
    return json.loads(bytes(padded[: int(size)]))


def broadcast_tree(tree, what: str):
    """Process 0's pytree of host arrays on every process (the others pass one of the same
    shapes and dtypes)."""
    if process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    got = _collective(lambda: multihost_utils.broadcast_one_to_all(tree), what)
    return [np.asarray(x) for x in got] if isinstance(tree, list) else got


def from_process_0(fn, what: str):
    """``fn()``'s JSON-able value, computed on process 0 and sent to all; an error there is
    raised on every process (as a RuntimeError naming it on the others)."""
    value, error = None, None
    if is_primary():
        try:
            value = fn()
        except Exception as err:
            error = err
    failure = None if error is None else f"{type(error).__name__}: {error}"
    report = {"value": value, "error": failure}
    report = broadcast_json(report, what)
    if error is not None:
        raise error
    if report["error"] is not None:
        raise RuntimeError(f"process 0 failed on {what}: {report['error']}")
    return report["value"]


def _exit_barrier() -> None:
    """At exit: every process waits for the others (bounded), then the others disconnect
    while process 0's coordinator is still up, and process 0 shuts it down last. (With
    recoverability on, JAX's own shutdown does not wait for them; skipped once a peer is
    lost.)"""
    import jax

    if _Run.watchdog is not None:  # no post may be in flight once JAX shuts its client down
        _Run.watchdog.stop()
    client = _client()
    if client is None or _Run.peer_lost:
        return
    bound_s = _Run.collective_timeout_s
    try:
        client.wait_at_barrier("impala_jax_exit", int(bound_s * 1000))
        if not is_primary():
            jax.distributed.shutdown()
            return
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            lost = lost_processes(timeout_s=max(0.1, deadline - time.monotonic()))
            if lost is not None and len(lost) == process_count() - 1:
                break  # every other process has disconnected
            time.sleep(0.05)
    except Exception as err:
        print(f"impala_jax: the other processes did not reach the exit: {err}", file=sys.stderr)
