"""``learning_curve.png``: what is drawn, and the process that draws it for the CLI.

The CLI's plotter (loggers.CurvePlotter) runs this file as a process of its own
(``python -P curve.py SPEC``) and writes one JSON line per point to its stdin, and a draw
request at most every ``interval_s``. End of input draws the final curve, so the curve of a
run whose process died holds every point written before it died.

Why a process: matplotlib's import and each draw are long stretches of Python, which in a
thread of the training process hold the GIL that the runner thread needs after every envpool
call (benchmarks/README.md: the learning curve off the GIL).

Nothing here imports JAX or NumPy: of impala_jax only the face (which imports neither) and
runtime/process/atomic.py, and matplotlib only where a figure is drawn.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from impala_jax.runtime.process.atomic import write_atomic

RETURN_KEY = "env_runners/episode_return_mean"
STEPS_KEY = "num_env_steps_sampled_lifetime"
# RLlib's spelling of the same count (its example scripts' step budget).
RUNNER_STEPS_KEY = "env_runners/num_env_steps_sampled_lifetime"

# A score an env reports beside its return (Craftax's, runtime/envs/craftax_envs.py), drawn on
# a second axis.
SCORE_KEY = "env_runners/crafter_score"
# A point: (env steps, return mean, return min, return max, evaluation return mean[, score]);
# NaN where a result has no such number.
Point = tuple[float, ...]


def step_budget(stop: Mapping[str, Any]) -> float | None:
    """The env-step budget of a stop dict, under either spelling (the smaller if both)."""
    budgets = [stop[k] for k in (STEPS_KEY, RUNNER_STEPS_KEY) if k in stop]
    return min(budgets) if budgets else None


def plot_curve(ax, points: list[Point], stop: Mapping[str, Any] | None = None) -> None:
    """Draws ``(steps, mean, min, max, eval_mean)`` points and the stop thresholds on ``ax``.

    Shared by the PNG and the notebook, which draws inline.
    """
    stop = dict(stop or {})
    points = [p for p in points if math.isfinite(p[0])]
    steps = [p[0] for p in points]
    ax.fill_between(
        steps, [p[2] for p in points], [p[3] for p in points], alpha=0.2, label="min-max"
    )
    ax.plot(steps, [p[1] for p in points], label="episode return mean")
    if any(math.isfinite(p[4]) for p in points):
        ax.plot(steps, [p[4] for p in points], "o-", ms=3, label="evaluation return mean")
    if RETURN_KEY in stop:
        ax.axhline(float(stop[RETURN_KEY]), ls="--", color="tab:red", label="stop threshold")
    # The x axis follows the data (a run stops long before its budget, as a rule); the budget
    # line shows once the data comes near it.
    right = 1.05 * max(steps) if steps else None
    budget = step_budget(stop)
    if budget is not None and (right is None or budget <= 1.05 * right):
        ax.axvline(float(budget), ls=":", color="gray", label="env-step budget")
        right = None if right is None else 1.02 * max(right, float(budget))
    if right:
        ax.set_xlim(0, right)
    ax.set_xlabel("env steps sampled")
    ax.set_ylabel("return")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    scores = [p[5] if len(p) > 5 else math.nan for p in points]
    twin = None
    if any(math.isfinite(s) for s in scores):
        twin = ax.twinx()
        twin.plot(steps, scores, color="tab:green", label="Crafter score (%)")
        twin.set_ylabel("Crafter score (%)")
        more, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more, labels + more_labels
    # Outside the axes, on the right: over the axes it covers a curve that ends anywhere.
    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01 if twin is None else 1.1, 1.0),  # past the twin's tick labels
        fontsize="small",
        borderaxespad=0,
    )


def figure_class():
    """matplotlib's Figure, with the file-only Agg backend (never a window)."""
    import matplotlib

    matplotlib.use("Agg")  # harmless if already set
    from matplotlib.figure import Figure

    return Figure


def draw(path: Path, points: list[Point], stop: Mapping[str, Any], title: str) -> None:
    """Writes the curve to ``path`` (replaced whole: a reader never sees half a PNG)."""
    fig = figure_class()(figsize=(8, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    plot_curve(ax, points, stop)
    if title:
        ax.set_title(title)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    write_atomic(path, png.getvalue())


def serve(lines, path: Path, stop: Mapping[str, Any], title: str) -> None:
    """The drawing process's loop over its input lines: ``{"point": [...]}`` adds a point,
    ``{"draw": true}`` draws; at the end of input the curve is drawn unless it already holds
    every point."""
    figure_class()  # the import, while the run starts, rather than at the first draw
    points: list[Point] = []
    drawn = -1  # points in the file
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:  # the last line, cut short when the training process died
            continue
        if "point" in message:
            points.append(tuple(float(x) for x in message["point"]))
        if message.get("draw"):
            draw(path, points, stop, title)
            drawn = len(points)
    if drawn != len(points) or not path.exists():
        draw(path, points, stop, title)


def main(argv: list[str]) -> None:
    # The CLI handles Ctrl-C itself (a checkpoint, then the final curve): the terminal's SIGINT
    # reaches this process too, which must keep going until its input ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Training first: the import and the draws would otherwise take CPU from the runner and
    # the learner; the final draw comes when training has stopped and the cores are free.
    os.nice(10)
    spec = json.loads(argv[0])
    serve(sys.stdin, Path(spec["path"]), spec["stop"], spec["title"])


if __name__ == "__main__":
    main(sys.argv[1:])
    # The curve is on disk. The interpreter's teardown (matplotlib's modules) would only add
    # to what the training process's close() waits for.
    os._exit(0)
