"""What the CLI shows while it trains: a live panel on a terminal, one line per iteration
otherwise (or only the final lines with --quiet), with ETA from the run's step, iteration or
time budget."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from impala_jax.cli import loggers
from impala_jax.rllib.results import lookup

BUDGET_KEYS = (
    "num_env_steps_sampled_lifetime",
    loggers.RUNNER_STEPS_KEY,
    "training_iteration",
    "time_total_s",
)


def eta_s(result: dict, stop: dict, steps_per_s: float | None) -> float | None:
    """Seconds until the first step, iteration or time budget in ``stop`` is reached."""
    etas = []
    steps = loggers.step_budget(stop)
    if steps is not None and steps_per_s:
        etas.append((steps - result.get("num_env_steps_sampled_lifetime", 0)) / steps_per_s)
    iterations = stop.get("training_iteration")
    if iterations is not None and result.get("training_iteration"):
        per_iter = result.get("time_total_s", 0) / result["training_iteration"]
        etas.append((iterations - result["training_iteration"]) * per_iter)
    seconds = stop.get("time_total_s")
    if seconds is not None:
        etas.append(seconds - result.get("time_total_s", 0))
    return max(0.0, min(etas)) if etas else None


def budget_fraction(result: dict, stop: dict) -> float | None:
    """How far along the nearest budget the run is, in [0, 1]; None without a budget."""
    fractions = [lookup(result, k, 0.0) / stop[k] for k in BUDGET_KEYS if k in stop and stop[k] > 0]
    return min(1.0, max(fractions)) if fractions else None


# The live panel's widest: an 80-column terminal never wraps it.
PANEL_WIDTH = 80


def _fit(text: str, width: int, left: bool = False) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (on the left: a path's end)."""
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :] if left else text[: width - 1] + "…"


def _clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _num(value: Any, fmt: str = ",.0f") -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if value != value else format(value, fmt)


class Display:
    """Per-iteration output: a live panel on a terminal, plain lines otherwise, or none (quiet).

    Every mode ends with the same final lines (``final``), on stdout, except "silent": nothing
    at all (the processes other than 0 of a multi-process run; errors still go to stderr).
    """

    def __init__(self, mode: str, run_dir: Path | None, name: str, stop: dict):
        self.mode = mode  # "live", "plain", "quiet" or "silent"
        self.run_dir = run_dir
        self.name = name
        self.stop = stop
        self.started = time.perf_counter()
        self.result: dict | None = None
        self.status = "building (compiling the actor and the learner)"
        self._first: tuple[float, float] | None = None  # (time, env steps) of the first result
        self._result_time = self.started
        self._live = None
        if mode == "live":
            from rich.live import Live

            self._live = Live(self, refresh_per_second=2, transient=False)
            self._live.start()

    def steps_per_s(self) -> float | None:
        """Env steps/s since the first result of this process (compile time excluded)."""
        r = self.result
        if r is None:
            return None
        steps, now = r.get("num_env_steps_sampled_lifetime", 0), time.perf_counter()
        if self._first is None or now - self._first[0] < 1e-3 or steps <= self._first[1]:
            return None  # the first iteration's rate includes compiling: no estimate yet
        return (steps - self._first[1]) / (now - self._first[0])

    def update(self, result: dict) -> None:
        if self._first is None:
            self._first = (time.perf_counter(), result.get("num_env_steps_sampled_lifetime", 0))
        self.result = result
        self._result_time = time.perf_counter()
        self.status = "training"
        if self.mode in ("quiet", "silent"):
            return
        line = self.line(result)
        if self._live is not None:
            self._live.console.print(line, highlight=False)
        else:
            print(line, flush=True)

    def line(self, r: dict) -> str:
        er, perf = r.get("env_runners", {}), r.get("perf", {})
        eta = eta_s(r, self.stop, self.steps_per_s())
        # At most 80 columns (a terminal's width): the learner's rate and the elapsed time are
        # in the panel, the logs and the final line.
        return (
            f"iter {r.get('training_iteration', 0):5d}  "
            f"steps {_num(r.get('num_env_steps_sampled_lifetime')):>9}  "
            f"return {_num(er.get('episode_return_mean'), '.2f'):>8}  "
            f"env steps/s {_num(perf.get('env_steps_sampled_per_s')):>8}"
            + (f"  ETA {_clock(eta)}" if eta is not None else "")
        )

    def runners_down(self, report: str) -> None:
        """No env runner samples (every one failed, restarts pending): say so, and why."""
        self.status = "waiting: no env runner is sampling (restarts pending)"
        self.note(report)

    def note(self, text: str) -> None:
        """A message that must be seen in every mode but silent (interrupts, warnings): on
        stderr."""
        if self.mode == "silent":
            return
        if self._live is not None:
            self._live.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def __rich__(self):
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        r = self.result or {}
        er, perf = r.get("env_runners", {}), r.get("perf", {})
        elapsed = time.perf_counter() - self.started
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_column(style="bold")
        grid.add_column()
        target = self.stop.get(loggers.RETURN_KEY)
        ret = _num(er.get("episode_return_mean"), ".2f")
        if target is not None:
            ret += f"  (stop at {target:g})"
        budget = loggers.step_budget(self.stop)
        steps = _num(r.get("num_env_steps_sampled_lifetime"))
        if budget:
            steps += f" / {budget:,.0f}"
        grid.add_row("iteration", str(r.get("training_iteration", "-")), "env steps", steps)
        grid.add_row(
            "return mean",
            ret,
            "min / max",
            f"{_num(er.get('episode_return_min'), '.1f')} / "
            f"{_num(er.get('episode_return_max'), '.1f')}",
        )
        grid.add_row(
            "env steps/s",
            _num(perf.get("env_steps_sampled_per_s")),
            "learner steps/s",
            _num(perf.get("env_steps_trained_per_s")),
        )
        eta = eta_s(r, self.stop, self.steps_per_s()) if r else None
        if eta is not None:  # counted from the last result: tick it down until the next one
            eta = max(0.0, eta - (time.perf_counter() - self._result_time))
        grid.add_row("elapsed", _clock(elapsed), "ETA", _clock(eta))
        fraction = budget_fraction(r, self.stop) if r else None
        rows: list = [grid]
        if fraction is not None:
            rows.append(ProgressBar(total=1.0, completed=fraction, width=50))
        table = Table.grid()
        for row in rows:
            table.add_row(row)
        return Panel(
            table,
            title=_fit(f"{self.name} · {self.status}", PANEL_WIDTH - 6),
            subtitle=_fit(str(self.run_dir or ""), PANEL_WIDTH - 6, left=True),
            expand=False,
        )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def final(self, lines: list[str]) -> None:
        self.close()
        if self.mode == "silent":
            return
        for line in lines:
            print(line, flush=True)
