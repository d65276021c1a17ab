"""Soak: a long CartPole run under faults; does it keep learning with flat memory and threads?

``make soak`` (= ``python -m benchmarks.soak``; ``--minutes M``, default 20). Not a CI test and
not part of ``make bench``: it takes as long as it says. During the run:

- every ``--kill-every`` seconds (30) one runner thread is broken (its env's ``send`` raises), so
  fault tolerance replaces it;
- every ``--nan-every`` seconds (60) one env returns a NaN reward once, as a broken env would: the
  runners' fragment door must drop that one fragment (``fault_tolerance/
  num_non_finite_fragments_dropped``) and no update may be skipped; ``--nan-into learner``
  instead hands one learner update a NaN-reward batch past the door, which the last line, the
  gradient guard, must skip (``num_non_finite_updates``) without keeping it in replay;
- a checkpoint after every iteration (the newest 3 kept), each read back at once: an unreadable
  one is counted, never expected.

Reported (``results/soak.json`` and printed): the return over the run (one line per ``--every``
seconds), RSS and thread count sampled every iteration with their least-squares slopes per
minute over the second half of the run (after warm-up), each fault's count (injected, restarts,
fragments dropped), the skipped updates per injected NaN, checkpoints written and unreadable.
The exit status is 1, with a ``SOAK FAILED`` line, when the mean return of the last minute is
below ``--min-return-fraction`` (0.9) of the best.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import common


def _rss_mib() -> float:
    """The current resident set size (not the peak), from /proc."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per minute; 0 with fewer than 2 points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / var


def _break_a_runner(algo) -> bool:
    runners = [r for r in algo.env_runner_group.runners if r.groups]
    if not runners:
        return False

    def broken(*args, **kwargs):
        raise RuntimeError("runner killed by the soak test")

    for group in runners[0].groups:
        group.env.send = broken
    return True


def _poison_next_step(algo) -> bool:
    """One env of a live runner returns a NaN reward at its next step (once), as a broken env
    would: the fragment door must drop that fragment."""
    import numpy as np

    runners = [r for r in algo.env_runner_group.runners if r.groups]
    if not runners:
        return False
    env = runners[-1].groups[0].env
    real = env.recv

    def recv():
        del env.recv  # the class's own again
        obs, reward, terminated, truncated = real()
        reward = np.array(reward, np.float32)
        reward[0] = np.nan
        return obs, reward, terminated, truncated

    env.recv = recv
    return True


def _poison_next_update(learner) -> None:
    """The next update's batch carries NaN rewards (once)."""
    import jax.numpy as jnp

    real = learner.update

    def update(batch, env_steps):
        learner.update = real
        return real(batch._replace(reward=batch.reward * jnp.nan), env_steps)

    learner.update = update


def run(
    minutes: float,
    kill_every: float,
    nan_every: float,
    checkpoints: bool = True,
    nan_into: str = "env",
    seed: int | None = None,
) -> dict:
    """``kill_every`` / ``nan_every`` <= 0 turn that fault off; ``checkpoints`` the saves;
    ``nan_into``: "env" (through the runners' door) or "learner" (past it); ``seed`` the run's
    ``debugging(seed=...)`` (None keeps the experiment's)."""
    from impala_jax.runtime.process import checkpoint

    config = (
        common.load_experiment()[0]
        .env_runners(num_env_runners=2)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0, max_num_env_runner_restarts=10**6)
    )
    if seed is not None:
        config = config.debugging(seed=seed)
    workdir = Path(tempfile.mkdtemp(prefix="impala_jax_soak_"))
    samples, returns = [], []
    written = unreadable = kills = poisons = 0
    started = time.monotonic()
    inf = float("inf")
    next_kill = started + kill_every if kill_every > 0 else inf
    next_nan = started + nan_every if nan_every > 0 else inf
    try:
        with config.build() as algo:
            while time.monotonic() - started < 60 * minutes:
                now = time.monotonic()
                if now >= next_kill:
                    kills += _break_a_runner(algo)
                    next_kill = now + kill_every
                if now >= next_nan:
                    if nan_into == "learner":
                        _poison_next_update(algo.learner)
                        poisons += 1
                    else:
                        poisons += _poison_next_step(algo)
                    next_nan = now + nan_every
                result = algo.train()
                t = time.monotonic() - started
                if checkpoints:
                    path = algo.save(workdir / f"checkpoint_{result['training_iteration']:06d}")
                    written += 1
                    try:
                        checkpoint.load(path)
                    except Exception:
                        unreadable += 1
                    for old in sorted(workdir.glob("checkpoint_*"))[:-3]:
                        shutil.rmtree(old, ignore_errors=True)
                samples.append((t, _rss_mib(), threading.active_count()))
                returns.append((t, result["env_runners"]["episode_return_mean"]))
            ft = result["fault_tolerance"]
            learner = result["learners"]["default_policy"]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    finite = [r for _, r in returns if r == r]
    last = [r for t, r in returns if t >= returns[-1][0] - 60 and r == r]
    return {
        "minutes": minutes,
        "iterations": len(samples),
        "env_steps": result["num_env_steps_sampled_lifetime"],
        "runner_kills": kills,
        "runner_restarts": ft["num_remote_worker_restarts"],
        "nan_injected_into": nan_into,
        "nan_injected": poisons,
        "non_finite_fragments_dropped": ft["num_non_finite_fragments_dropped"],
        "non_finite_fragments_by_env": ft["non_finite_fragments_by_env"],
        "non_finite_updates_skipped": learner["num_non_finite_updates"],
        "skipped_updates_per_injected_nan": (
            learner["num_non_finite_updates"] / poisons if poisons else None
        ),
        "checkpoints_written": written,
        "checkpoints_unreadable": unreadable,
        "return_best": max(finite) if finite else None,
        "return_mean_last_minute": sum(last) / len(last) if last else None,
        "rss_mib_first_last_max": [samples[0][1], samples[-1][1], max(s[1] for s in samples)],
        "rss_slope_mib_per_min_second_half": _slope_per_min([(t, r) for t, r, _ in half]),
        "threads_first_last_max": [samples[0][2], samples[-1][2], max(s[2] for s in samples)],
        "threads_slope_per_min_second_half": _slope_per_min([(t, n) for t, _, n in half]),
        "returns": returns[:: max(1, len(returns) // 200)],
        "rss_mib": [
            (round(t, 1), round(r, 1)) for t, r, _ in samples[:: max(1, len(samples) // 200)]
        ],
    }


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        minutes={"type": float, "default": 20.0, "help": "how long to run (default 20)"},
        nan_into={
            "default": "env",
            "choices": ["env", "learner"],
            "help": "NaN through an env (the door drops it) or into a learner update (the "
            "gradient guard skips it)",
        },
        min_return_fraction={
            "type": float,
            "default": 0.9,
            "help": "fail when the last minute's mean return is below this share of the best",
        },
        every={"type": float, "default": 30.0, "help": "seconds between printed return lines"},
        kill_every={"type": float, "default": 30.0, "help": "seconds between runner kills"},
        nan_every={"type": float, "default": 60.0, "help": "seconds between NaN batches"},
        no_checkpoints={"action": "store_true", "help": "no checkpoint per iteration"},
        name={"default": "soak", "help": "result name"},
        seed={
            "type": int,
            "default": None,
            "help": "debugging(seed=...) (default: the experiment's)",
        },
    )
    minutes = 2.0 if args.quick else args.minutes
    payload = run(
        minutes, args.kill_every, args.nan_every, not args.no_checkpoints, args.nan_into, args.seed
    )
    payload["seed"] = args.seed
    payload["faults"] = {
        "kill_every_s": args.kill_every,
        "nan_every_s": args.nan_every,
        "checkpoint_every_iteration": not args.no_checkpoints,
    }
    rows = [[k, v] for k, v in payload.items() if k not in ("returns", "rss_mib")]
    print(common.table(rows, ["soak", "value"]))
    print(_return_lines(payload["returns"], args.every))
    common.write_result(args.name, payload, args.quick)
    best, last = payload["return_best"], payload["return_mean_last_minute"]
    if best is None or last is None or last < args.min_return_fraction * best:
        print(
            f"SOAK FAILED: the last minute's mean return {last} is below "
            f"{args.min_return_fraction:g} x the best {best}: the policy did not stay learned."
        )
        sys.exit(1)
    return payload


def _return_lines(returns: list, every: float) -> str:
    """The return over the run: the mean of each ``every``-second window, one line each."""
    windows: dict[int, list[float]] = {}
    for t, r in returns:
        if r == r:
            windows.setdefault(int(t // every), []).append(r)
    return "\n".join(
        f"return {k * every:6.0f}-{(k + 1) * every:.0f} s: {sum(v) / len(v):7.1f}"
        for k, v in sorted(windows.items())
    )


if __name__ == "__main__":
    main()
