"""The watch on every wait for the other processes of a run, and naming a process that is lost.

`collective` runs one blocking collective under the `Watchdog`: a failure caused by a lost peer
becomes `PeerLost` naming it (`lost_processes`, from the coordinator's heartbeats), and a wait
that outlasts ``collective_timeout_s`` ends this process with `describe_loss`'s message, naming
the processes behind from the collective counts each one posts to the coordinator. `Run` holds
this process's bounds, its watchdog and whether a peer was lost (set by `distributed.initialize`,
read at exit).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from impala_jax.runtime.process import roles

# Exit status of a process the watchdog ends (a hung collective); as the CLI's failures.
EXIT_PEER_LOST = 1


class PeerLost(RuntimeError):
    """Another process of the run is gone (it exited, was killed or hangs)."""


class Run:
    """This process's multi-process settings (set by `distributed.initialize`)."""

    collective_timeout_s: float = 60.0
    heartbeat_timeout_s: float = 10.0
    peer_lost: bool = False
    watchdog: Watchdog | None = None


def lost_processes(timeout_s: float = 5.0) -> list[int] | None:
    """The processes the coordinator no longer counts as alive; None when that is not known
    within ``timeout_s`` (the coordinator, process 0, is gone, or a live process hangs: the
    coordinator answers once every live process asks)."""
    client = roles.client()
    if client is None:
        return []
    count = roles.process_count()
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
    watchdog, client = Run.watchdog, roles.client()
    if watchdog is None or client is None:
        return "some process"
    mine = watchdog.count
    others = [i for i in range(roles.process_count()) if i != roles.process_index()]
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
    me, count = roles.process_index(), roles.process_count()
    # A hung process (the watchdog's case) would keep the coordinator from answering; a dead
    # one does until the coordinator misses its heartbeats (heartbeat_timeout_s).
    lost = [] if waited_s is not None else lost_processes(Run.heartbeat_timeout_s + 5)
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
    timeout = Run.collective_timeout_s
    return (
        f"process {me} of {count}: {who}, while waiting for {what}. Every process of the run "
        "must be restarted: rerun the same command on every host with --resume RUN_DIR to go "
        f"on from the newest checkpoint. (The wait bound is collective_timeout_s={timeout:g}: "
        "distributed.initialize(collective_timeout_s=...) or --collective-timeout.)"
    )


_PROGRESS_KEY = "impala_jax/collectives"
_SILENT_S = 1.5  # three of the watchdog's posting periods


class Watchdog:
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
            self._deadline = now + Run.collective_timeout_s + extra_s
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def _post(self) -> None:
        # Every period, changed or not: the post number says this process is still running.
        count, client = self.count, roles.client()
        if client is not None:
            self._posted += 1
            try:
                key, value = f"{_PROGRESS_KEY}/{roles.process_index()}", f"{count} {self._posted}"
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
                Run.peer_lost = True
                print(f"impala_jax: error: {describe_loss(what, waited)}", file=sys.stderr)
                sys.stdout.flush()
                sys.stderr.flush()
                # A thread cannot leave a hung collective: the process ends here. Checkpoints
                # and log lines written so far are on disk (each is flushed when written).
                os._exit(EXIT_PEER_LOST)


def collective(fn, what: str, extra_s: float = 0.0):
    """Runs one blocking collective under the watchdog; a failure caused by a lost peer
    becomes `PeerLost` naming it."""
    watchdog = Run.watchdog
    context = watchdog.waiting(what, extra_s) if watchdog else contextlib.nullcontext()
    try:
        with context:
            return fn()
    except Exception as err:
        if roles.process_count() > 1 and lost_processes() != []:
            Run.peer_lost = True
            raise PeerLost(describe_loss(what)) from err
        raise
