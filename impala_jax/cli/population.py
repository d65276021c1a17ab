"""A population experiment: the CLI trains an experiment file's config as a ``Population``.

An experiment file that sets ``num_members = N`` (and, for population-based training,
``scheduler = PopulationBasedTraining(...)``) runs its N members in one program
(rllib/population.py) instead of one run or a Ray Tune sweep; search spaces in its config give
each member its start. The run directory holds, beside params.json and run.json:

- ``member_<i>/``: ``result.json``, ``progress.csv`` and TensorBoard scalars of member i, one
  result per perturbation interval, each with the hyperparameters it trained with;
- ``lineage.json``: every copy (who copied whom, when, with which hyperparameters);
- ``population_curves.png``: every member's return against its env steps;
- ``checkpoint_population/``: the whole population when the run ends (``Population.save``).

The population stops when any member's result meets a stop criterion (the env-step budget is
per member, so all meet it together; a return criterion: the best member reached it).
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from impala_jax.cli import curve, loggers
from impala_jax.cli.args import EXIT_STOPPED
from impala_jax.cli.errors import RunError
from impala_jax.cli.experiment import module_name
from impala_jax.cli.run_dir import new_run_dir, write_json, write_run_files
from impala_jax.cli.stop_criteria import stop_reached
from impala_jax.runtime.process.atomic import write_atomic

LINEAGE_FILE = "lineage.json"
CURVES_FILE = "population_curves.png"
CHECKPOINT_DIR = "checkpoint_population"


def population_settings(experiment: str | None) -> tuple[int, Any] | None:
    """``(num_members, scheduler)`` of an experiment file (loaded already) that sets
    ``num_members``; None for any other."""
    module = sys.modules.get(module_name(experiment)) if experiment else None
    members = getattr(module, "num_members", None)
    if members is None:
        return None
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise RunError(f"experiment file: num_members={members!r} must be an integer >= 1")
    return members, getattr(module, "scheduler", None)


def run_population(args, config, stop: dict, name: str, record: dict, settings) -> int:
    """Trains the population until a stop criterion or a signal; the exit code."""
    from impala_jax.rllib.population import Population

    if args.resume:
        raise RunError("--resume: a population run starts anew (Population.restore resumes one)")
    members, scheduler = settings
    try:
        population = Population(config, members, scheduler)
    except ValueError as err:
        raise RunError(str(err)) from err
    run_dir = new_run_dir(args.logdir, name)
    write_run_files(run_dir, population.config, dict(record, num_members=members))
    writers = [_member_writers(run_dir / f"member_{i}") for i in range(members)]
    print(f"population of {members} in {run_dir}", flush=True)
    history: list[list[dict]] = [[] for _ in range(members)]
    started, reason = time.time(), None
    try:
        while reason is None:
            results = population.train()
            for result, member_writers, past in zip(results, writers, history, strict=True):
                result["time_total_s"] = time.time() - started
                for writer in member_writers:
                    writer.write(result)
                past.append(result)
            write_json(run_dir / LINEAGE_FILE, population.lineage)
            print(_line(results), flush=True)
            reason = next(filter(None, (stop_reached(r, stop) for r in results)), None)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        for member_writers in writers:
            for writer in member_writers:
                writer.close()
        draw_curves(run_dir / CURVES_FILE, history, stop, name)
        population.save(run_dir / CHECKPOINT_DIR)
        population.stop()
    print(f"stopped: {reason}; run directory {run_dir}", flush=True)
    return EXIT_STOPPED


def _member_writers(path: Path) -> list:
    path.mkdir(parents=True)
    return [
        loggers.JsonLogger(path),
        loggers.CSVLogger(path),
        loggers.TensorBoardLogger(path),
    ]


def _line(results: list[dict]) -> str:
    """One line per interval: env steps per member, the best and median return, the copies."""
    returns = [r["env_runners"]["episode_return_mean"] for r in results]
    finite = [x for x in returns if math.isfinite(x)]
    best = max(
        range(len(results)), key=lambda i: returns[i] if math.isfinite(returns[i]) else -1e30
    )
    copies = " ".join(f"{r['member']}<-{r['pbt']['copied_from']}" for r in results if "pbt" in r)
    text = f"iter {results[0]['training_iteration']:4d}  "
    text += f"env steps/member {results[0][curve.STEPS_KEY]:,}  "
    if finite:
        text += f"best {returns[best]:.2f} (member {best})  median {statistics.median(finite):.2f}"
    return text + (f"  copies {copies}" if copies else "")


def draw_curves(path: Path, history: list[list[dict]], stop: dict, title: str) -> None:
    """Every member's return mean against its env steps, one line each."""
    if not any(history):
        return
    fig = curve.figure_class()(figsize=(8, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for i, results in enumerate(history):
        steps = [r[curve.STEPS_KEY] for r in results]
        returns = [r["env_runners"]["episode_return_mean"] for r in results]
        ax.plot(steps, returns, label=f"member {i}", linewidth=1.2)
    goal = stop.get(curve.RETURN_KEY)
    if goal is not None:
        ax.axhline(goal, linestyle="--", color="grey", linewidth=1)
    ax.set_xlabel("env steps per member")
    ax.set_ylabel("episode return (interval mean)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    write_atomic(path, png.getvalue())


def lineage(run_dir: Path) -> list[dict]:
    """The copies a population run made (``lineage.json``)."""
    return json.loads((Path(run_dir) / LINEAGE_FILE).read_text())
