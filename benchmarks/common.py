"""What every benchmark shares: arguments, interleaved timing, machine facts, JSON results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# benchmarks/gpu.sh points this elsewhere, so a device run does not overwrite this machine's.
RESULTS = Path(os.environ.get("IMPALA_JAX_RESULTS") or REPO / "benchmarks" / "results")
CARTPOLE_EXPERIMENT = REPO / "experiments" / "cartpole.py"

SHARED_NOTE = (
    "The machine may be shared with other work: absolute figures vary from run to run, the "
    "ratios (measured interleaved, in the same run) are the comparable numbers."
)


def parse_args(argv: Sequence[str] | None, description: str, **extra) -> argparse.Namespace:
    """``--quick`` (fewer sizes, seeds and repetitions) plus benchmark-specific options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, seeds and repetitions")
    for flag, kwargs in extra.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", **kwargs)
    return parser.parse_args(argv)


def machine() -> dict:
    """Facts about where the figures were taken; load average says how shared it was."""
    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m": os.getloadavg()[0],
    }
    try:
        import jax

        info["jax"] = jax.__version__
        info["jax_backend"] = jax.default_backend()
        info["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as err:  # a benchmark without JAX still records where it ran
        info["jax"] = repr(err)
    return info


def write_result(name: str, payload: dict, quick: bool) -> Path:
    """``results/<name>.json``, written through a temp file so a killed run leaves no half file."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "quick": quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "note": SHARED_NOTE,
        **payload,
    }
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def _jsonable(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def interleaved(cases: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Runs each case once per repetition, rotating the order, and collects what they return.

    Alternating the cases means a burst of load from another process hits all of them alike,
    so per-repetition ratios stay meaningful on a shared machine.
    """
    names = list(cases)
    out: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(cases[name]())
    return out


def seconds_per_call(fn: Callable[[], object], block: Callable[[object], object], n: int) -> float:
    """Mean seconds of ``n`` back-to-back calls, waiting for the last result (``block``)."""
    started = time.perf_counter()
    result = None
    for _ in range(n):
        result = fn()
    block(result)
    return (time.perf_counter() - started) / n


def calls_for(fn: Callable[[], object], block: Callable[[object], object], target_s: float) -> int:
    """How many calls make one timing sample of about ``target_s`` (timer noise stays small)."""
    one = seconds_per_call(fn, block, 3)
    return max(1, min(100_000, int(target_s / max(one, 1e-7))))


def run_python(
    args: Sequence[str], timeout: float, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repo root with this interpreter; output captured, time-limited."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_experiment(path: Path = CARTPOLE_EXPERIMENT):
    """``(config, stop)`` of an experiment file, loaded the way ``impala_jax.run`` loads it."""
    from impala_jax.cli.experiment import load_experiment as load

    return load(str(path))


def table(rows: Sequence[Sequence], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "nan"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def replace_between_markers(path: Path, start: str, end: str, text: str) -> None:
    """Rewrites what lies between the ``start`` and ``end`` markers of ``path`` with ``text``."""
    readme = path.read_text()
    head, rest = readme.split(start)
    _, tail = rest.split(end)
    path.write_text(f"{head}{start}\n{text}\n{end}{tail}")
