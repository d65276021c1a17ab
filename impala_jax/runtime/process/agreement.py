"""What every process of a run agrees on, where one process's failure stops them all.

`check_same_config`, the first collective of a build: every process started, with the same
config. `agreed_next_batch`, before each update: every process has its train batch, and their
env-step counts are summed. `from_process_0`: a value process 0 computes (a checkpoint's
header), or its error, on every process.
"""

from __future__ import annotations

import numpy as np

from impala_jax.runtime.process import roles
from impala_jax.runtime.process.collectives import allgather, allgather_json, broadcast_json


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


def from_process_0(fn, what: str):
    """``fn()``'s JSON-able value, computed on process 0 and sent to all; an error there is
    raised on every process (as a RuntimeError naming it on the others)."""
    value, error = None, None
    if roles.is_primary():
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
