"""What a run writes into its directory: result.json, progress.csv, TensorBoard, a PNG, W&B.

Each writer takes the nested result dict of ``IMPALA.train()`` once per iteration. The formats
are Ray Tune's, so tools that read Tune's trial directories read these too: ``result.json``
holds one JSON object per line, ``progress.csv`` the flattened slash keys, the TensorBoard
scalars one tag per numeric flattened key (step: ``num_env_steps_sampled_lifetime``).

Nothing here imports JAX; wandb is imported by its writer only, matplotlib by the process that
draws the learning curve (curve.py).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import logging
import math
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from impala_jax.cli import curve
from impala_jax.cli.curve import (  # noqa: F401  (plot_curve: the notebooks draw with it)
    RETURN_KEY,
    RUNNER_STEPS_KEY,
    STEPS_KEY,
    plot_curve,
    step_budget,
)
from impala_jax.rllib.results import flatten, lookup
from impala_jax.runtime.process.atomic import write_atomic

logger = logging.getLogger(__name__)

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
PARAMS_FILE = "params.json"
CURVE_FILE = "learning_curve.png"


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
            write_atomic(self.path, "".join(kept))
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
        text = io.StringIO(newline="")  # csv's own \r\n line ends, as the appends write them
        writer = csv.DictWriter(text, self._fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.path, text.getvalue())

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
    """TensorBoard event files in the run directory (impala_jax.cli.tfevents; no TensorFlow needed).

    One scalar per numeric flattened key, at step ``num_env_steps_sampled_lifetime``, so curves
    of runs with different iteration lengths line up; one event per iteration holds them all.
    On resume, ``purge_step`` tells TensorBoard to drop what an earlier life logged past the
    checkpoint.
    """

    def __init__(self, run_dir: Path, purge_step: int | None = None):
        from impala_jax.cli.tfevents import EventFileWriter

        self._writer = EventFileWriter(run_dir, purge_step)

    def write(self, result: Mapping) -> None:
        step = int(result.get(STEPS_KEY, result.get("training_iteration", 0)))
        values = {k: v for k, v in scalars(result).items() if math.isfinite(v)}
        self._writer.add_scalars(values, step)

    def close(self) -> None:
        self._writer.close()


class CurvePlotter:
    """``learning_curve.png``: return mean (with the min-max band) against env steps.

    Drawn by a process of its own (impala_jax/cli/curve.py says why), fed one point per result:
    first ``interval_s`` seconds after the plotter opens, then at most every ``interval_s``
    seconds (a draw holds the CPU), and always at ``close()``, which waits for the final
    curve. If that process cannot start, stops reading or fails, the curve is drawn in this
    process instead, with a warning. The stop threshold on the return, and the env-step
    budget, are drawn as dashed lines. The history is read back from result.json on resume.
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
        self._points: list[curve.Point] = []
        self._last_draw = time.monotonic()  # the first draw waits interval_s too
        self._dirty = False
        self._pending = bytearray()  # for the drawing process, once its pipe takes it
        self._stderr = tempfile.TemporaryFile()
        self._proc = self._start()
        for result in history:
            self._add(result)

    def _start(self) -> subprocess.Popen | None:
        spec = {"path": str(self.path), "stop": json_safe(self.stop), "title": self.title}
        # -P keeps curve.py's folder off the drawing process's sys.path (its modules would shadow
        # any of the same name); the folder holding impala_jax/ goes on it, installed or not,
        # for the one write every file takes (runtime/process/atomic.py).
        package_root = str(Path(curve.__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-P", curve.__file__, json.dumps(spec)],
                env={**os.environ, "PYTHONPATH": path},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
            )
        except (OSError, ValueError, TypeError) as err:  # TypeError: no sys.executable
            self._fall_back(f"could not start ({err})")
            return None
        # Never blocks the training loop: what the pipe does not take now waits in _pending.
        os.set_blocking(proc.stdin.fileno(), False)
        return proc

    def _add(self, result: Mapping) -> None:
        def get(key: str) -> float:
            value = lookup(result, key)
            return math.nan if value is None else value

        steps = get(STEPS_KEY)
        mean = get(RETURN_KEY)
        low, high = get("env_runners/episode_return_min"), get("env_runners/episode_return_max")
        evaluation = get("evaluation/" + RETURN_KEY)
        self._points.append((steps, mean, low, high, evaluation, get(curve.SCORE_KEY)))
        self._dirty = True
        self._send({"point": self._points[-1]})

    def write(self, result: Mapping) -> None:
        self._add(result)
        if time.monotonic() - self._last_draw >= self.interval_s:
            self.draw()

    def draw(self) -> None:
        self._send({"draw": True})
        if self._proc is None:  # never started, or failed
            curve.draw(self.path, self._points, self.stop, self.title)
        self._last_draw = time.monotonic()
        self._dirty = False

    def _send(self, message: dict) -> None:
        if self._proc is None:
            return
        self._pending += (json.dumps(message) + "\n").encode()
        try:
            written = os.write(self._proc.stdin.fileno(), self._pending)
        except BlockingIOError:  # the pipe is full: the process is drawing
            written = 0
        except OSError as err:  # the process has gone
            self._stop_process(f"stopped reading its input ({err})")
            return
        del self._pending[:written]
        if len(self._pending) > PLOTTER_BACKLOG_BYTES:
            self._stop_process(f"left {len(self._pending):,} bytes of its input unread")

    def close(self) -> None:
        if self._proc is not None:
            self._finish()  # the final curve, or a fallback (then _dirty is set)
        if self._dirty or not self.path.exists():
            curve.draw(self.path, self._points, self.stop, self.title)
        self._dirty = False
        self._stderr.close()

    def _finish(self) -> None:
        """Ends the drawing process's input and waits, bounded, for its final curve."""
        proc, fd = self._proc, self._proc.stdin.fileno()
        deadline = time.monotonic() + PLOTTER_CLOSE_WAIT_S
        try:
            while self._pending:  # a process that stopped reading must not block this write
                if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
                    raise subprocess.TimeoutExpired(proc.args, PLOTTER_CLOSE_WAIT_S)
                try:
                    del self._pending[: os.write(fd, self._pending)]
                except BlockingIOError:
                    pass
            proc.stdin.close()
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._stop_process(f"did not finish the curve within {PLOTTER_CLOSE_WAIT_S:.0f} s")
            return
        except OSError as err:
            self._stop_process(f"stopped reading its input ({err})")
            return
        if code != 0:
            self._stop_process(f"failed (exit code {code})")
            return
        self._proc = None
        self._dirty = False  # its final curve holds every point

    def _stop_process(self, why: str) -> None:
        proc, self._proc = self._proc, None
        proc.kill()
        proc.wait()
        proc.stdin.close()  # nothing buffered: every write went to the fd (os.write)
        self._fall_back(why)

    def _fall_back(self, why: str) -> None:
        """From here on the curve is drawn in this process, the next time in full (whatever
        the drawing process drew last may lack points it was sent)."""
        self._dirty = True
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        logger.warning(
            "the process drawing %s %s; the curve is drawn in the training process instead%s",
            self.path,
            why,
            f". Its output:\n{tail}" if tail else "",
        )


# Input the drawing process has left unread before it counts as stuck (a point is ~90 bytes).
PLOTTER_BACKLOG_BYTES = 1 << 20
PLOTTER_CLOSE_WAIT_S = 60.0


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
