"""The command line's process: JAX's environment, joining the other processes of a run, signals,
the stop decision they share, and the exit."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import numpy as np

from impala_jax.cli.errors import RunError, one_line
from impala_jax.runtime.process import collectives, distributed, roles
from impala_jax.runtime.process.jax_setup import force_host_devices

if TYPE_CHECKING:
    from impala_jax.cli.display import Display


def set_jax_environment(devices: int | None) -> None:
    """Environment variables that JAX reads once, at import: set here, never by the library."""
    if devices is None:
        return
    if "jax" in sys.modules:
        raise RunError("--devices must be set before JAX is imported (run it as a fresh process)")
    force_host_devices(devices)
    os.environ["JAX_PLATFORMS"] = "cpu"


def join(args) -> None:
    """Joins a multi-process run (the flags, IMPALA_JAX_* variables or a cluster JAX detects);
    a single process otherwise."""
    try:
        distributed.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            collective_timeout_s=args.collective_timeout,
        )
    except ValueError as err:
        raise RunError(one_line(err)) from err


class StopSignal:
    """SIGINT / SIGTERM set a flag that the loop checks between iterations; a second one exits."""

    def __init__(self, display: Display):
        self.display = display
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (an in-process caller): no handlers
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            self.display.close()
            print("second interrupt: exiting now, without a checkpoint", file=sys.stderr)
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum
        self.display.note(
            f"{signal.Signals(signum).name}: finishing this iteration, then saving a checkpoint "
            "(Ctrl-C again to exit at once)"
        )


def agreed_stop(reason: str | None, signum: int | None) -> tuple[str | None, int | None]:
    """Over several processes: process 0's stop decision, and an interrupt of any process,
    taken by every process at the same iteration."""
    if roles.process_count() == 1:
        return reason, signum
    flags = collectives.allgather(np.array([reason is not None, signum or 0]), "the stop decision")
    if not roles.is_primary():
        reason = "process 0 reached a stop criterion" if flags[0, 0] else None
    elif not flags[0, 0]:
        reason = None
    return reason, int(flags[:, 1].max()) or None


# Whether exit_without_teardown must let the interpreter tear down: set once a run has built.
_teardown_needed = True


def need_teardown(needed: bool) -> None:
    """Tells exit_without_teardown whether the run holds code (callbacks) that teardown serves."""
    global _teardown_needed
    _teardown_needed = needed


def exit_without_teardown(code: int) -> None:
    """Ends the CLI process with ``code`` once the run is over, skipping the interpreter's
    teardown where nothing needs it.

    By the time ``main`` returns, the run's files are closed (writers, checkpoints, the
    display) and its algorithm stopped; what teardown then does (clearing every module of JAX,
    Flax, envpool and the rest, destroying the XLA client and envpool's threads) only delays
    the exit. So the process runs the exit handlers (``atexit``: JAX's, the experiment file's),
    flushes its standard streams and calls ``os._exit``. The whole teardown runs where it
    matters: with callbacks (user code that may hold files open, which teardown flushes),
    several processes, Ray (a sweep, a cluster) and W&B.
    """
    if (
        _teardown_needed
        or roles.process_count() > 1
        or any(m in sys.modules for m in ("ray", "wandb"))
    ):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()  # CPython's own exit runs these, logging.shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
