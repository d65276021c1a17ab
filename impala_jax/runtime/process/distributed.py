"""One learner over several processes and hosts: joining the run (``jax.distributed``), leaving it.

Call `initialize` before anything starts JAX's backends (before ``build()``). Each process
then sees every process's devices in ``jax.devices()``, the learner mesh spans them
(``learners(num_learners=N)`` counts devices across processes; 0 is one device of each
process: ``parallel.learner_devices``) and the per-device learner step's gradient mean runs
over all of them. A process puts only its own part of a batch on the mesh (``parallel.put``:
``jax.make_array_from_process_local_data``); the learner state is the same value on every
process.

Every process runs its own EnvRunnerGroup (runner threads or lockstep) on a seed block of its
own (``roles.process_seed_and_key``) and feeds its share of each batch. Before each update the
processes agree (``agreement.agreed_next_batch``) that every one has its batch, summing their
env-step counts: a runner failure anywhere stops all with that process's error instead of
leaving the others in a collective. Process 0 decides when an iteration and the run end, alone
writes files and checkpoints and evaluates; results count and pool over all processes.

A lost peer: a peer that exits or is killed breaks the collective it was in, and the others
stop with ``watchdog.PeerLost`` naming it once the coordinator has missed its heartbeats
(``heartbeat_timeout_s``); every wait for the others is also watched (``collective_timeout_s``),
and a peer that hangs is named by the watchdog (from the collective counts each process posts
to the coordinator), which then ends this process: a thread cannot leave a hung collective.
Losing process 0 (the coordinator) ends the others through JAX's own fatal error. JAX's
recoverability mode is on, so that a lost peer fails the others' collectives instead of
aborting them from C++; in exchange every process waits for the others at exit (bounded).

This module holds `initialize` and the barrier every process passes at exit; beside it in
``runtime/process/``: ``roles.py`` (which process this one is, its seeds), ``collectives.py``
(allgather and broadcast, of arrays, rows, JSON and pytrees), ``watchdog.py`` (the bound on every
wait for the others, naming a lost process) and ``agreement.py`` (the same config on every
process, every process's batch before each update, a value computed on process 0).

CPU processes use gloo collectives (two processes on 127.0.0.1 in the tests), GPUs NCCL. JAX
is imported only inside functions; ``import impala_jax`` does not import these modules.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import time

from impala_jax.runtime.process import roles
from impala_jax.runtime.process.watchdog import Run, Watchdog, lost_processes

# The environment variables `initialize` reads when it is given no arguments.
ENV_COORDINATOR = "IMPALA_JAX_COORDINATOR"  # HOST:PORT of process 0's coordinator service
ENV_NUM_PROCESSES = "IMPALA_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "IMPALA_JAX_PROCESS_ID"

_ADDRESS = re.compile(r"^\[?[\w.\-:]+\]?:\d{1,5}$")


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

    if roles.client() is not None:  # joined already (a second call): nothing more to do
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
    Run.collective_timeout_s = float(collective_timeout_s)
    Run.heartbeat_timeout_s = float(heartbeat_timeout_s)
    if jax.process_count() > 1:
        Run.watchdog = Watchdog()
        # Runs before JAX's own shutdown (atexit is last-in first-out): process 0 keeps the
        # coordinator up until every process is done with it.
        atexit.register(_exit_barrier)
    return jax.process_count()


def _exit_barrier() -> None:
    """At exit: every process waits for the others (bounded), then the others disconnect
    while process 0's coordinator is still up, and process 0 shuts it down last. (With
    recoverability on, JAX's own shutdown does not wait for them; skipped once a peer is
    lost.)"""
    import jax

    if Run.watchdog is not None:  # no post may be in flight once JAX shuts its client down
        Run.watchdog.stop()
    client = roles.client()
    if client is None or Run.peer_lost:
        return
    bound_s = Run.collective_timeout_s
    try:
        client.wait_at_barrier("impala_jax_exit", int(bound_s * 1000))
        if not roles.is_primary():
            jax.distributed.shutdown()
            return
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            lost = lost_processes(timeout_s=max(0.1, deadline - time.monotonic()))
            if lost is not None and len(lost) == roles.process_count() - 1:
                break  # every other process has disconnected
            time.sleep(0.05)
    except Exception as err:
        print(f"impala_jax: the other processes did not reach the exit: {err}", file=sys.stderr)
