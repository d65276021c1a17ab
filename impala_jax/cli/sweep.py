"""A sweep from the command line: an experiment whose ``config`` holds Ray Tune search spaces.

``python -m impala_jax.run experiments/cartpole_sweep.py`` hands such a config here (run.py
imports this module only then, and this module imports ray only inside `run_sweep`, so a plain
run never imports ray). The sweep is ``tune.Tuner("impala_jax", param_space=config)``: each
trial builds `IMPALA` from its resolved config in a process of its own (impala_jax.rllib.ray_tune).

The run directory LOGDIR/NAME_TIMESTAMP/ holds

- params.json: the config as the file wrote it, each search space described
  (``{"grid_search": [...]}``, or ``{"search_space": "Float LogUniform (0.0001, 0.01)"}``);
- run.json: how the sweep was started (experiment, overrides, stop, argv) and the swept paths;
- tune/: Tune's experiment (storage_path is the run directory, name ``tune``): one directory
  per trial with its result.json, progress.csv and checkpoints, and the experiment state that
  ``tune.ExperimentAnalysis(RUN_DIR/tune)`` and ``tune.Tuner.restore(RUN_DIR/tune,
  trainable="impala_jax")`` read (notebooks/sweep_analysis.ipynb).

Besides ``config`` and ``stop``, the experiment file may define ``num_samples`` (how many
times Tune samples the search space, default 1; a grid is repeated that often) and
``failure_config`` (a ``tune.FailureConfig``: how often a failed trial is retried). The stop
criteria stop each trial, as in Tune; trials are ranked by the first stop key if it is an
episode return, else by ``env_runners/episode_return_mean``, higher is better.
``--checkpoint-freq`` and ``--keep-checkpoints`` become Tune's ``checkpoint_frequency`` and
``num_to_keep``; every trial also checkpoints at the end. Ray starts locally with every CPU of
the machine, or joins ``--ray-address``.

At the end the CLI prints one line per trial (name, status, swept values, iterations, env
steps, the metric's last value) and the best trial's checkpoint. Exit status: 0 when every trial
terminated, 1 when a trial errored or did not finish, 2 for a usage or config error.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from impala_jax.cli import loggers
from impala_jax.cli.errors import RunError, one_line
from impala_jax.cli.experiment import module_name
from impala_jax.cli.run_dir import RUN_FILE, new_run_dir, write_json
from impala_jax.rllib.results import lookup
from impala_jax.rllib.values import is_search_space

__all__ = [
    "TUNE_DIR",
    "describe_search_space",
    "resume_error",
    "run_sweep",
    "sweep_metric",
    "swept_paths",
    "trial_table",
]

# Tune's experiment inside the run directory; run.py knows a sweep's run directory by it.
TUNE_DIR = "tune"
DEFAULT_METRIC = "env_runners/episode_return_mean"
MODE = "max"
INSTALL_HINT = 'pip install "impala_jax[tune]"'
EXIT_TERMINATED, EXIT_FAILED = 0, 1


def describe_search_space(value: Any) -> Any:
    """A search space as JSON: a grid stays ``{"grid_search": [...]}``; a sampled domain is
    ``{"search_space": "Float LogUniform (0.0001, 0.01)"}`` (its class, sampler and range)."""
    if isinstance(value, dict):
        return loggers.json_safe(value)
    parts = [type(value).__name__]
    sampler = getattr(value, "sampler", None)
    if sampler is not None:
        inner, q = getattr(sampler, "sampler", None), getattr(sampler, "q", None)
        parts.append(f"Quantized({inner}, q={q:g})" if q is not None else str(sampler))
    func = getattr(value, "func", None)
    if func is not None:
        parts.append(f"sample_from({loggers.json_safe(func)})")
    else:
        parts.append(str(getattr(value, "domain_str", "")))
    return {"search_space": " ".join(p for p in parts if p)}


def _described(value: Any) -> Any:
    if is_search_space(value):
        return describe_search_space(value)
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_described(v) for v in value]
    return value


def swept_paths(config_dict: dict, prefix: str = "") -> list[str]:
    """Slash paths of the search spaces in ``config.to_dict()``: ``lr``,
    ``model_config/fcnet_hiddens``, ``lr/1/1`` (a value inside a schedule)."""
    found = []
    items = config_dict.items() if isinstance(config_dict, dict) else enumerate(config_dict)
    for key, value in items:
        path = f"{prefix}{key}"
        if is_search_space(value):
            found.append(path)
        elif isinstance(value, dict | list | tuple):
            found += swept_paths(value, path + "/")
    return found


def _at(node: Any, path: str) -> Any:
    """The value at a `swept_paths` path of a trial's resolved config (None if absent)."""
    for part in path.split("/"):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list | tuple) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def sweep_metric(stop: dict) -> str:
    """What ranks trials: the first stop key if it is an episode return, else the mean return."""
    first = next(iter(stop), None)
    if first is not None and first.rsplit("/", 1)[-1].startswith("episode_return"):
        return first
    return DEFAULT_METRIC


def resume_error(run_dir: str | Path) -> RunError:
    tune_dir = Path(run_dir) / TUNE_DIR
    return RunError(
        f"--resume {run_dir}: resuming a sweep is not supported yet; use "
        f"tune.Tuner.restore({str(tune_dir)!r}, trainable='impala_jax', "
        "resume_unfinished=True).fit()"
    )


def _experiment_settings(experiment: str | None, tune) -> tuple[int, Any]:
    """``num_samples`` and ``failure_config`` of the experiment file (loaded already)."""
    module = None
    if experiment:
        module = sys.modules.get(module_name(experiment))
    num_samples = getattr(module, "num_samples", 1)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise RunError(f"experiment file: num_samples={num_samples!r} must be an integer >= 1")
    failure_config = getattr(module, "failure_config", None)
    if failure_config is not None and not isinstance(failure_config, tune.FailureConfig):
        raise RunError(
            f"experiment file: failure_config must be a ray.tune.FailureConfig, not "
            f"{type(failure_config).__name__} (e.g. tune.FailureConfig(max_failures=2))"
        )
    return num_samples, failure_config


def _import_tune():
    try:
        import ray
        from ray import tune
    except ImportError as err:
        raise RunError(
            f"the config holds Ray Tune search spaces, so it runs as a sweep on Ray Tune, which "
            f"is not installed ({err}); install it with: {INSTALL_HINT}"
        ) from err
    return ray, tune


def _start_ray(ray, address: str | None, compile_cache: str) -> bool:
    """Starts (or joins) Ray; True when this call started it, so it is also ours to shut down.

    Trials read their compilation cache from IMPALA_JAX_COMPILE_CACHE (ray_tune); the runtime
    env carries it to trial processes on every node of a cluster too.
    """
    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": {"IMPALA_JAX_COMPILE_CACHE": compile_cache}}
    with warnings.catch_warnings():
        # Ray starts its processes with subprocess (fork, then exec at once), which is safe in
        # a process that has imported JAX; JAX's warning about fork is noise here.
        warnings.filterwarnings(
            "ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning
        )
        if address:
            ray.init(address=address, runtime_env=runtime_env)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=runtime_env)
    return True


def _check_resources(config) -> None:
    """A trial no node can hold is a usage error now, not a trial PENDING forever."""
    from impala_jax.rllib.ray_tune import IMPALATrainable

    try:
        IMPALATrainable.default_resource_request(config.to_dict())
    except TypeError:  # a resource field is swept: Tune checks each trial's own request
        pass
    except ValueError as err:
        raise RunError(one_line(err)) from err


def run_sweep(
    args: argparse.Namespace, config, stop: dict, name: str, record: dict, notes: Sequence[str]
) -> int:
    """Runs the sweep of ``config`` (search spaces unresolved) and prints its trials.

    `args` are run.py's (logdir, checkpoint_freq, keep_checkpoints, ray_address, quiet,
    compile_cache, wandb); `record` is run.py's run record. RunError for a usage problem
    before anything is written; otherwise the exit status (module docstring).
    """
    if args.wandb:
        raise RunError(
            "--wandb is not supported for sweeps yet; use Tune's "
            "ray.air.integrations.wandb.WandbLoggerCallback with tune.Tuner"
        )
    ray, tune = _import_tune()
    from impala_jax.rllib.ray_tune import TUNE_NAME

    num_samples, failure_config = _experiment_settings(record.get("experiment"), tune)
    config_dict = config.to_dict()
    paths = swept_paths(config_dict)
    metric = sweep_metric(stop)
    started_ray = _start_ray(ray, args.ray_address, args.compile_cache)
    try:
        _check_resources(config)
        run_dir = new_run_dir(args.logdir, name).absolute()
        record = dict(
            record,
            sweep={"swept": paths, "num_samples": num_samples, "metric": metric, "mode": MODE},
        )
        write_json(run_dir / loggers.PARAMS_FILE, _described(config_dict))
        write_json(run_dir / RUN_FILE, record)
        for note in notes:
            print(f"note: {note}")
        print(f"sweep over {', '.join(paths)}: Tune experiment {run_dir / TUNE_DIR}", flush=True)
        tuner = tune.Tuner(
            TUNE_NAME,
            param_space=config,
            tune_config=tune.TuneConfig(num_samples=num_samples, metric=metric, mode=MODE),
            run_config=tune.RunConfig(
                name=TUNE_DIR,
                storage_path=str(run_dir),
                stop=stop or None,
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=args.checkpoint_freq,
                    num_to_keep=args.keep_checkpoints,
                    checkpoint_at_end=True,
                ),
                failure_config=failure_config,
                callbacks=[] if args.quiet else [_progress(tune, paths, metric)],
                verbose=0,  # Tune's own tables print every trial's ~190-key config and result
            ),
        )
        grid = tuner.fit()
        analysis = tune.ExperimentAnalysis(
            grid.experiment_path, default_metric=metric, default_mode=MODE
        )
        return _report(analysis, paths, metric, run_dir)
    finally:
        if started_ray:
            ray.shutdown()


def _progress(tune, paths: Sequence[str], metric: str, every_s: float = 10.0):
    """A Tune callback printing one line per trial event: start (with the swept values), a
    result at most every `every_s` seconds per trial, completion and error."""

    class Progress(tune.Callback):
        def __init__(self):
            self.printed: dict[str, float] = {}

        def on_trial_start(self, iteration, trials, trial, **info):
            swept = "  ".join(f"{p}={_short(_at(trial.config, p))}" for p in paths)
            print(f"{trial} started: {swept}", flush=True)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            now = time.monotonic()
            if now - self.printed.get(trial.trial_id, -math.inf) >= every_s:
                self.printed[trial.trial_id] = now
                print(f"{trial}: {_progress_line(result, metric)}", flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            print(f"{trial} finished: {_progress_line(trial.last_result, metric)}", flush=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            print(f"{trial} errored (error file: {_error_file(trial)})", flush=True)

    return Progress()


def _progress_line(result: dict, metric: str) -> str:
    value = lookup(result or {}, metric)
    steps = lookup(result or {}, "num_env_steps_sampled_lifetime") or 0
    return (
        f"iteration {(result or {}).get('training_iteration', 0)}, {steps:,.0f} env steps, "
        f"{metric}={'nan' if value is None else f'{value:.4g}'}"
    )


def trial_table(trials: Sequence[Any], paths: Sequence[str], metric: str) -> list[str]:
    """One line per trial (name, status, swept values, iterations, env steps, the metric's last
    value), under a header; columns padded to line up."""
    rows = [["trial", "status", *paths, "iter", "env_steps", metric]]
    for trial in trials:
        last = trial.last_result or {}
        value = lookup(last, metric)
        rows.append(
            [
                str(trial),
                trial.status,
                *(_short(_at(trial.config, p)) for p in paths),
                str(last.get("training_iteration", 0)),
                str(last.get("num_env_steps_sampled_lifetime", 0)),
                "nan" if value is None else f"{value:.4g}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(loggers.json_safe(value)).replace(" ", "")


def _report(analysis, paths: Sequence[str], metric: str, run_dir: Path) -> int:
    trials = sorted(analysis.trials, key=str)
    print()
    for line in trial_table(trials, paths, metric):
        print(line)
    errored = [t for t in trials if t.status == "ERROR"]
    unfinished = [t for t in trials if t.status not in ("TERMINATED", "ERROR")]
    for trial in errored:
        error_file = _error_file(trial)
        print(f"trial {trial} errored: {_last_line(error_file)} (error file: {error_file})")
    if unfinished:
        print(
            f"{len(unfinished)} trial(s) did not finish; continue with tune.Tuner.restore("
            f"{str(run_dir / TUNE_DIR)!r}, trainable='impala_jax', resume_unfinished=True).fit()"
        )
    best = analysis.get_best_trial(metric, MODE, scope="last")
    if best is None:
        print(f"no best trial: no trial reported {metric}")
    else:
        value = lookup(best.last_result, metric)
        checkpoint = best.checkpoint.path if best.checkpoint is not None else None
        print(f"Best trial {best} ({metric}={value:.4g}): checkpoint {checkpoint}")
    print(f"run directory: {run_dir}")
    return EXIT_FAILED if errored or unfinished else EXIT_TERMINATED


def _error_file(trial) -> str | None:
    """The trial's error.txt in the run directory; Tune writes it first into Ray's session
    directory (``trial.error_file``), which goes away with the session, then copies it."""
    name = trial.run_metadata.error_filename
    if trial.path and name and Path(trial.path, name).is_file():
        return str(Path(trial.path, name))
    return trial.error_file


def _last_line(path: str | None) -> str:
    """The exception line of a trial's error file (its last non-empty line)."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, TypeError):
        return "(no error file)"
    return lines[-1].strip() if lines else "(empty error file)"
