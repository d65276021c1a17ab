"""One learner over several processes and hosts: ``jax.distributed`` start-up and roles.

Call `initialize` before anything starts JAX's backends (before ``build()``). Each process
then sees every process's devices in ``jax.devices()``, the learner mesh spans them
(``learners(num_learners=N)`` counts devices across processes) and the per-device learner step's
gradient mean runs over all of them. A process puts only its own part of a batch on the mesh
(``parallel.put``: ``jax.make_array_from_process_local_data``); the learner state is the same
value on every process.

Status (issue 12): the learner works across processes, and so does ``IMPALA`` in lockstep
(``env_runners(num_env_runners=0)``). Each process samples its own envs (a seed block of its
own) for its share of the batch, process 0 decides when an iteration ends and broadcasts it,
and every process keeps identical params (tests/test_distributed.py). Not done yet: runner
threads across processes (a clear error), results summed or pooled over processes (each
process reports its own counts and episodes), only process 0 writing files and checkpoints,
the command line's flags, and a test of a lost peer (JAX's coordination service ends the
others after ``heartbeat_timeout_s``).

CPU processes use gloo collectives (the test setup: two processes on 127.0.0.1); GPUs use NCCL.
This module imports JAX only inside its functions, and nothing imports it at ``import
impala_jax``.
"""

from __future__ import annotations

import os
import re

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


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    initialization_timeout_s: int = 300,
    heartbeat_timeout_s: int = 100,
) -> int:
    """Joins this process to a multi-process run; returns the number of processes.

    With no arguments: the ``IMPALA_JAX_COORDINATOR`` / ``IMPALA_JAX_NUM_PROCESSES`` /
    ``IMPALA_JAX_PROCESS_ID`` environment variables, else JAX's own cluster detection (SLURM,
    Open MPI, TPU pods); with none found, one process and nothing is started (returns 1).
    ``initialization_timeout_s`` bounds the wait for every process to join;
    ``heartbeat_timeout_s`` how long a silent peer may stay silent before JAX ends the run.
    """
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "impala_jax.distributed.initialize() must come before anything uses JAX (before "
            "build(), jax.devices(), any computation): JAX has started its backends already."
        )
    coordinator_address = coordinator_address or _from_env(ENV_COORDINATOR)
    if num_processes is None and _from_env(ENV_NUM_PROCESSES):
        num_processes = _int(ENV_NUM_PROCESSES, _from_env(ENV_NUM_PROCESSES))
    if process_id is None and _from_env(ENV_PROCESS_ID):
        process_id = _int(ENV_PROCESS_ID, _from_env(ENV_PROCESS_ID))
    explicit = (coordinator_address, num_processes, process_id)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = {
        "initialization_timeout": initialization_timeout_s,
        "heartbeat_timeout_seconds": heartbeat_timeout_s,
    }
    if all(v is None for v in explicit):
        try:
            jax.distributed.initialize(**timeouts)
        except ValueError:  # no cluster environment detected: a single process
            return 1
        return jax.process_count()
    if any(v is None for v in explicit):
        raise ValueError(
            "impala_jax.distributed.initialize needs all of coordinator_address, num_processes "
            f"and process_id (got {coordinator_address!r}, {num_processes!r}, {process_id!r}); "
            "give the three, or none for JAX's cluster detection."
        )
    if not isinstance(coordinator_address, str) or not _ADDRESS.match(coordinator_address):
        raise ValueError(
            f"coordinator_address={coordinator_address!r} must be HOST:PORT of process 0, e.g. "
            "10.0.0.1:1234"
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
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **timeouts)
    return num_processes


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def is_primary() -> bool:
    """Process 0: the one that writes files."""
    return process_index() == 0
