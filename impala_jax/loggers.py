"""What a run writes into its directory: result.json, progress.csv, TensorBoard, a PNG, W&B.

Each writer takes the nested result dict of ``IMPALA.train()`` once per iteration. The formats
are Ray Tune's, so tools that read Tune's trial directories read these too: ``result.json``
holds one JSON object per line, ``progress.csv`` the flattened slash keys, the TensorBoard
scalars one tag per numeric flattened key (step: ``num_env_steps_sampled_lifetime``).

Nothing here imports JAX; matplotlib and wandb are imported by their writers only.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from impala_jax.metrics import flatten, lookup

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
PARAMS_FILE = "params.json"
CURVE_FILE = "learning_curve.png"
IMPORT_WAIT_S = 60.0  # longest wait for the curve plotter's matplotlib import
RETURN_KEY = "env_runners/episode_return_mean"
STEPS_KEY = "num_env_steps_sampled_lifetime"
# RLlib's spelling of the same count (its example scripts' step budget).
RUNNER_STEPS_KEY = "env_runners/num_env_steps_sampled_lifetime"


def step_budget(stop: Mapping[str, Any]) -> float | None:
    """The env-step budget of a stop dict, under either spelling (the smaller if both)."""
    budgets = [stop[k] for k in (STEPS_KEY, RUNNER_STEPS_KEY) if k in stop]
    return min(budgets) if budgets else None


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types: callables and classes as ``"module:qualname"``.

    numpy scalars and arrays become numbers and lists; anything else unknown becomes its repr,
    so writing a config never fails (params.json is for reading, not for loading code).
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy arrays and scalars
        return json_safe(value.tolist())
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}:{value.__qualname__}"
    return repr(value)


# Result keys that are not metrics: the config (params.json has it) and Tune's bookkeeping.
# Tune's TensorBoard logger leaves the same out; progress.csv keeps all but the config.
NOT_SCALARS = ("config", "pid", "timestamp")


def scalars(result: Mapping) -> dict[str, float]:
    """The numeric leaves of ``result`` under their slash keys (flags such as ``done`` left out)."""
    out = {}
    for key, value in flatten({k: v for k, v in result.items() if k not in NOT_SCALARS}).items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) or (
            hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0
        ):
            out[key] = float(value)
    return out


class JsonLogger:
    """``result.json``: one result per line, Tune's trial format (nested dict plus bookkeeping).

    On resume the lines after the checkpoint's iteration (written before a crash, never
    checkpointed) are dropped, so the file reads as one history.
    """

    def __init__(self, run_dir: Path, resume_iteration: int | None = None):
        self.path = Path(run_dir) / RESULT_FILE
        if resume_iteration is not None and self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines(keepends=True)
                if _iteration_of(line) <= resume_iteration
            ]
            _write_atomic(self.path, "".join(kept))
        self._file = open(self.path, "a")
        self._started = time.time()
        self._iterations = 0

    def write(self, result: Mapping) -> None:
        self._iterations += 1
        now = time.time()
        line = dict(result)
        line.setdefault("done", False)
        # IMPALA.train() reports these itself (Tune's keys); added for results without them.
        for key, value in dict(
            timestamp=int(now),
            date=datetime.datetime.fromtimestamp(now).strftime("%Y-%m-%d_%H-%M-%S"),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            iterations_since_restore=self._iterations,
            time_since_restore=now - self._started,
        ).items():
            line.setdefault(key, value)
        # NaN (no episode finished yet) is written as NaN, as Tune does; json.loads reads it.
        self._file.write(json.dumps(json_safe(line)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _iteration_of(line: str) -> float:
    try:
        return json.loads(line).get("training_iteration", 0)
    except ValueError:
        return math.inf  # a line cut short by a crash: dropped


class CSVLogger:
    """``progress.csv``: the flattened result, one row per iteration.

    The header is the union of every key seen. When a later result brings new keys (the first
    evaluation, a new timer) the file is rewritten once with the wider header, so every row
    lines up with it.
    """

    def __init__(self, run_dir: Path, resume_iteration: int | None = None):
        self.path = Path(run_dir) / PROGRESS_FILE
        self._fields: list[str] = []
        if self.path.exists():
            fields, rows = self._read()
            self._fields = fields
            if resume_iteration is not None:
                # Rows past the checkpoint, and a row cut short by a kill (missing fields).
                kept = [
                    r
                    for r in rows
                    if _float(r.get("training_iteration")) <= resume_iteration
                    and None not in r.values()
                    and None not in r
                ]
                if len(kept) != len(rows):
                    self._rewrite(kept)

    def _read(self) -> tuple[list[str], list[dict]]:
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return list(reader.fieldnames or []), rows

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, self._fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)

    def write(self, result: Mapping) -> None:
        metrics = {k: v for k, v in result.items() if k != "config"}  # as Tune's CSV logger
        row = {k: _csv_value(v) for k, v in flatten(metrics).items()}
        new = [k for k in row if k not in self._fields]
        if new or not self.path.exists():
            rows = self._read()[1] if self.path.exists() else []
            self._fields.extend(new)
            self._rewrite(rows + [row])
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self._fields, restval="").writerow(row)

    def close(self) -> None:
        pass


def _csv_value(value: Any) -> Any:
    if isinstance(value, list | tuple | dict):
        return json.dumps(json_safe(value))
    return value


def _float(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.inf


class TensorBoardLogger:
    """TensorBoard event files in the run directory (impala_jax.tfevents; no TensorFlow needed).

    One scalar per numeric flattened key, at step ``num_env_steps_sampled_lifetime``, so curves
    of runs with different iteration lengths line up; one event per iteration holds them all.
    On resume, ``purge_step`` tells TensorBoard to drop what an earlier life logged past the
    checkpoint.
    """

    def __init__(self, run_dir: Path, purge_step: int | None = None):
        from impala_jax.tfevents import EventFileWriter

        self._writer = EventFileWriter(run_dir, purge_step)

    def write(self, result: Mapping) -> None:
        step = int(result.get(STEPS_KEY, result.get("training_iteration", 0)))
        values = {k: v for k, v in scalars(result).items() if math.isfinite(v)}
        self._writer.add_scalars(values, step)

    def close(self) -> None:
        self._writer.close()


class CurvePlotter:
    """``learning_curve.png``: return mean (with the min-max band) against env steps.

    Drawn first ``interval_s`` seconds after it is opened, then at most every ``interval_s``
    seconds (a draw costs ~0.1-0.3 s, too much for every short iteration), and always at
    ``close()``. matplotlib is imported by a thread of its own as the plotter opens: in the
    training loop's thread that import (0.4-1.0 s on 2 cores) stalled the learner at the first
    iteration, a tenth of a 10 s CartPole run. The stop threshold on the return, and the
    env-step budget, are drawn as dashed lines. The history is read back from result.json on
    resume.
    """

    def __init__(
        self,
        run_dir: Path,
        stop: Mapping[str, Any] | None = None,
        title: str = "",
        interval_s: float = 10.0,
        history: Iterable[Mapping] = (),
    ):
        self.path = Path(run_dir) / CURVE_FILE
        self.stop = dict(stop or {})
        self.title = title
        self.interval_s = interval_s
        self._points: list[tuple[float, float, float, float, float]] = []
        self._last_draw = time.monotonic()  # the first draw waits interval_s too
        self._import = threading.Thread(
            target=_import_matplotlib, name="impala_jax-matplotlib-import", daemon=True
        )
        self._import.start()
        self._dirty = False
        for result in history:
            self._add(result)

    def _add(self, result: Mapping) -> None:
        def get(key: str) -> float:
            value = lookup(result, key)
            return math.nan if value is None else value

        steps = get(STEPS_KEY)
        mean = get(RETURN_KEY)
        low, high = get("env_runners/episode_return_min"), get("env_runners/episode_return_max")
        evaluation = get("evaluation/" + RETURN_KEY)
        self._points.append((steps, mean, low, high, evaluation))
        self._dirty = True

    def write(self, result: Mapping) -> None:
        self._add(result)
        if time.monotonic() - self._last_draw >= self.interval_s:
            self.draw()

    def draw(self) -> None:
        # Bounded: if the import thread is stuck, the import below does it (or raises).
        self._import.join(timeout=IMPORT_WAIT_S)
        Figure = _import_matplotlib()

        fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        plot_curve(ax, self._points, self.stop)
        if self.title:
            ax.set_title(self.title)
        tmp = self.path.with_name(f".{self.path.stem}.tmp.png")
        fig.savefig(tmp)
        os.replace(tmp, self.path)
        self._last_draw = time.monotonic()
        self._dirty = False

    def close(self) -> None:
        if self._dirty or not self.path.exists():
            self.draw()


def _import_matplotlib():
    """matplotlib's Figure, with the file-only Agg backend (never a window)."""
    import matplotlib

    matplotlib.use("Agg")  # harmless if already set
    from matplotlib.figure import Figure

    return Figure


def plot_curve(ax, points: list[tuple], stop: Mapping[str, Any] | None = None) -> None:
    """Draws ``(steps, mean, min, max, eval_mean)`` points and the stop thresholds on ``ax``.

    Shared by the PNG writer and the notebook, which draws inline.
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
    budget = step_budget(stop)
    if budget is not None:
        ax.axvline(float(budget), ls=":", color="gray", label="env-step budget")
    ax.set_xlabel("env steps sampled")
    ax.set_ylabel("return")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")


class WandbLogger:
    """Weights & Biases: the flattened numeric results, plotted against env steps.

    ``WANDB_MODE=offline`` logs into the run directory without a network; ``wandb sync`` uploads
    it later. The W&B run id is kept in run.json, so ``--resume`` continues the same W&B run.
    """

    def __init__(self, run_dir: Path, name: str, config: dict, project: str, run_id: str):
        import wandb

        self._wandb = wandb
        self._run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )
        self._run.define_metric(STEPS_KEY)
        self._run.define_metric("*", step_metric=STEPS_KEY)

    def write(self, result: Mapping) -> None:
        self._run.log(scalars(result))

    def close(self) -> None:
        self._run.finish()


def wandb_missing_message() -> str | None:
    """None when wandb can be imported, else what to install."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return (
            "--wandb needs the wandb package, which is not installed: "
            "pip install 'impala_jax[wandb]' (or pip install wandb); "
            "set WANDB_MODE=offline to log without a network"
        )
    return None


def read_results(run_dir: Path) -> list[dict]:
    """The results of result.json, skipping a last line cut short by a crash."""
    path = Path(run_dir) / RESULT_FILE
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def open_writers(
    run_dir: Path,
    name: str,
    stop: Mapping[str, Any],
    resume_iteration: int | None = None,
    resume_steps: int | None = None,
    wandb: tuple[dict, str, str] | None = None,
) -> list:
    """Every writer of a run; if one fails to open, those opened before it are closed.

    ``resume_iteration`` and ``resume_steps``: the counters of the checkpoint resumed from (None:
    a new run). ``wandb``: WandbLogger's ``(config, project, run_id)``, None for no W&B. The curve
    reads its history after JsonLogger has cut result.json back to ``resume_iteration``.
    """
    writers: list = []
    try:
        writers.append(JsonLogger(run_dir, resume_iteration))
        writers.append(CSVLogger(run_dir, resume_iteration))
        writers.append(TensorBoardLogger(run_dir, (resume_steps + 1) if resume_steps else None))
        history = read_results(run_dir) if resume_iteration is not None else ()
        writers.append(CurvePlotter(run_dir, stop, title=name, history=history))
        if wandb is not None:
            writers.append(WandbLogger(run_dir, name, *wandb))
    except BaseException:
        for writer in writers:
            writer.close()
        raise
    return writers


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
