"""``python -m impala_jax.run EXPERIMENT.py [section.field=value ...] [--stop KEY=VALUE ...]``

An experiment file is a Python file that defines a module-level ``config`` (an IMPALAConfig) and
optionally ``stop``, a dict of result paths to thresholds, as Ray Tune and RLlib's tuned
examples use: the run stops when any result value reaches its threshold. Overrides go through
the same builder methods: ``training.lr=3e-4`` calls ``config.training(lr=3e-4)``; values are
Python literals (a bare word is a string), and ``section.field.key=value`` changes one key of a
dict field, e.g. ``rl_module.model_config.fcnet_hiddens=[64,64]``.

The run directory LOGDIR/NAME_TIMESTAMP/ receives params.json (the resolved config), run.json
(how the run was started), result.json (one JSON line per iteration, Tune's format),
progress.csv, TensorBoard event files (step: env steps sampled), learning_curve.png (return
against env steps, refreshed every few seconds), and checkpoints checkpoint_NNNNNN every
--checkpoint-freq iterations and at the end (the newest --keep-checkpoints are kept).

Ctrl-C (or SIGTERM) finishes the current iteration, saves a checkpoint and exits with the
command that resumes the run; a second Ctrl-C exits at once. --resume RUN_DIR continues from the
newest checkpoint with the same counters and appends to the same logs.

Exit status: 0 when a stop criterion is met, 2 for a usage or config error, 130 / 143 after
SIGINT / SIGTERM, 1 when training fails.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from impala_jax import loggers
from impala_jax.display import Display
from impala_jax.metrics import lookup

EXAMPLES = """examples:
  python -m impala_jax.run experiments/cartpole.py
  python -m impala_jax.run experiments/cartpole.py training.lr=1e-3 \\
      env_runners.num_envs_per_env_runner=32 --stop env_runners/episode_return_mean=400
  python -m impala_jax.run experiments/pong.py --stop num_env_steps_sampled_lifetime=2e6 \\
      --name pong_short --logdir /data/runs --checkpoint-freq 20
  python -m impala_jax.run experiments/cartpole.py learners.num_learners=2 --devices 2
  python -m impala_jax.run experiments/cartpole.py 'rl_module.model_config.fcnet_hiddens=[32]'
  python -m impala_jax.run --resume runs/cartpole_2025-01-01_12-00-00 --stop time_total_s=600
  WANDB_MODE=offline python -m impala_jax.run experiments/cartpole.py --wandb

stop keys are slash paths into the result dict, e.g. env_runners/episode_return_mean,
num_env_steps_sampled_lifetime, training_iteration, time_total_s; the step, iteration and time
budgets give the live display its ETA.
"""

RUN_FILE = "run.json"
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")
EXIT_STOPPED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class RunError(Exception):
    """A usage or config problem: reported as one line, exit status 2."""


# ---------------------------------------------------------------------------- arguments


def parse_args(argv: list[str]) -> argparse.Namespace:
    rest = __doc__.split("\n\n", 1)[1]
    parser = argparse.ArgumentParser(
        prog="python -m impala_jax.run",
        description=rest,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "experiment", nargs="?", help="experiment file defining `config` (and optionally `stop`)"
    )
    parser.add_argument(
        "overrides", nargs="*", help="section.field=value, e.g. training.lr=1e-3 (repeatable)"
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="stop when result KEY (slash path) reaches VALUE; repeatable; replaces the "
        "experiment's `stop`",
    )
    parser.add_argument("--name", help="run name (default: the experiment file's name)")
    parser.add_argument("--logdir", default="runs", help="where run directories go (default: runs)")
    parser.add_argument("--seed", type=int, help="sets debugging(seed=N)")
    parser.add_argument(
        "--checkpoint-freq",
        type=int,
        default=10,
        metavar="N",
        help="checkpoint every N iterations (default 10; 0: only at the end)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="N",
        help="how many of the newest checkpoints to keep (default 3)",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint (the experiment file is optional; "
        "overrides and --stop still apply)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the final lines, no per-iteration output"
    )
    parser.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="run JAX on N forced CPU devices (sets XLA_FLAGS and JAX_PLATFORMS=cpu before JAX "
        "starts), e.g. for learners(num_learners=N) on a machine without accelerators",
    )
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=os.path.join(os.path.expanduser("~"), ".cache", "impala_jax", "xla"),
        help="JAX's persistent compilation cache: a rerun of the same experiment skips "
        "compiling (default ~/.cache/impala_jax/xla; 'none' turns it off)",
    )
    parser.add_argument(
        "--wandb", action="store_true", help="also log to Weights & Biases (needs wandb)"
    )
    parser.add_argument(
        "--wandb-project", default="impala_jax", help="W&B project (default impala_jax)"
    )
    args = parser.parse_intermixed_args(argv)
    # `--resume DIR training.lr=1e-3`: the first override lands in the experiment slot.
    if args.experiment and "=" in args.experiment and not args.experiment.endswith(".py"):
        args.overrides.insert(0, args.experiment)
        args.experiment = None
    if args.experiment is None and args.resume is None:
        parser.error("an experiment file (or --resume RUN_DIR) is required")
    if args.checkpoint_freq < 0 or args.keep_checkpoints < 1:
        parser.error("--checkpoint-freq must be >= 0 and --keep-checkpoints >= 1")
    if args.devices is not None and args.devices < 1:
        parser.error("--devices must be >= 1")
    return args


def set_jax_environment(devices: int | None) -> None:
    """Environment variables that JAX reads once, at import: set here, never by the library."""
    if devices is None:
        return
    if "jax" in sys.modules:
        raise RunError("--devices must be set before JAX is imported (run it as a fresh process)")
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
    )
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


def enable_compile_cache(directory: str) -> None:
    """Caches every compiled program on disk (the actor's act, the learner step)."""
    if directory.lower() == "none":
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    # The default thresholds skip programs that compile in under a second: cache them all.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# ---------------------------------------------------------------------------- experiment


def load_experiment(path: str | Path) -> tuple[Any, dict]:
    """Runs the experiment file; returns its ``config`` (a copy) and ``stop``.

    The module is registered in sys.modules under ``experiment_<name>``, so an env class it
    defines is stored in checkpoints as ``experiment_<name>:Class`` and found again on resume.
    """
    from impala_jax import IMPALAConfig

    path = Path(path)
    if not path.is_file():
        raise RunError(f"experiment file {path} does not exist")
    name = "experiment_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise RunError(
            f"experiment file {path} failed to load: {type(err).__name__}: {err}{where}"
        ) from err
    config = getattr(module, "config", None)
    if not isinstance(config, IMPALAConfig):
        raise RunError(
            f"experiment file {path} must define a module-level `config` (an IMPALAConfig); "
            f"found {type(config).__name__}"
        )
    stop = getattr(module, "stop", None) or {}
    if not isinstance(stop, dict):
        raise RunError(f"experiment file {path}: `stop` must be a dict, not {type(stop).__name__}")
    return config.copy(copy_frozen=False), check_stop(stop)


def parse_value(text: str) -> Any:
    """A Python literal (``1e-3``, ``[64, 64]``, ``None``, ``'a'``); a bare word is a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if re.fullmatch(r"[\w\-./:]+", text):
        return text  # e.g. env ids: CartPole-v1, ALE/Pong-v5, package.module:Env
    raise RunError(f"{text!r} is not a Python literal (quote strings with spaces or brackets)")


def builder_sections(config) -> dict[str, inspect.Signature]:
    """The builder methods (``training``, ``env_runners``, ...) and their signatures."""
    from impala_jax import NotProvided

    out = {}
    for name in dir(config):
        method = getattr(config, name, None)
        if name.startswith("_") or not callable(method):
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):
            continue
        params = signature.parameters.values()
        if params and all(p.default is NotProvided for p in params):
            out[name] = signature
    return out


def apply_overrides(config, overrides: list[str]):
    """``section.field=value`` through ``config.section(field=value)``; mutates and returns."""
    sections = builder_sections(config)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise RunError(f"override {item!r} is not of the form section.field=value")
        section, field, *subkeys = parts
        if section not in sections:
            close = difflib.get_close_matches(section, sections, n=1)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; sections: {', '.join(sections)}"
            )
            raise RunError(f"override {item!r}: no config section {section!r}{hint}")
        fields = sections[section].parameters
        if field not in fields:
            owner = [s for s, sig in sections.items() if field in sig.parameters]
            close = difflib.get_close_matches(field, list(fields), n=1)
            hint = (
                f"; it is set by {owner[0]}.{field}"
                if owner
                else f"; did you mean {section}.{close[0]}?"
                if close
                else ""
            )
            raise RunError(f"override {item!r}: {section}() has no field {field!r}{hint}")
        try:
            value = parse_value(text.strip())
        except RunError as err:
            raise RunError(f"override {item!r}: {err}") from None
        if subkeys:
            value = _with_key(getattr(config, field, None), subkeys, value, item)
        try:
            getattr(config, section)(**{field: value})
        except (ValueError, TypeError) as err:
            raise RunError(f"override {item!r}: {one_line(err)}") from err
    return config


def _with_key(current: Any, keys: list[str], value: Any, item: str) -> dict:
    """A copy of the dict field ``current`` with ``value`` at the nested ``keys``."""
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise RunError(f"override {item!r}: the field is not a dict, give the whole value")
    out = dict(current)
    node = out
    for k in keys[:-1]:
        child = node.get(k)
        node[k] = dict(child) if isinstance(child, dict) else {}
        node = node[k]
    node[keys[-1]] = value
    return out


def check_stop(stop: dict) -> dict:
    out = {}
    for key, value in stop.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise RunError(f"stop criterion {key!r}: {value!r} is not a number")
        out[key] = value
    return out


def parse_stop(items: list[str]) -> dict:
    stop = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise RunError(f"--stop {item!r} is not of the form KEY=VALUE")
        try:
            stop[key.strip()] = parse_value(text.strip())
        except RunError as err:
            raise RunError(f"--stop {item!r}: {err}") from None
    return check_stop(stop)


def stop_reached(result: dict, stop: dict) -> str | None:
    """The first criterion met (Tune's rule: value >= threshold), as text; None if none is."""
    for key, threshold in stop.items():
        value = lookup(result, key)
        if value is not None and value >= threshold:  # NaN never stops a run
            return f"{key}={value:g} >= {threshold:g}"
    return None


def missing_stop_keys(result: dict, stop: dict) -> list[str]:
    """Stop keys absent from a result: typos that would never stop the run.

    ``evaluation/...`` keys are exempt: they appear only in iterations that evaluate.
    """
    return [k for k in stop if not k.startswith("evaluation/") and lookup(result, k, None) is None]


def one_line(err: BaseException | str) -> str:
    """A multi-line message (config validation lists every bad field) on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} " + "; ".join(lines[1:])
    return "; ".join(lines)


# ---------------------------------------------------------------------------- run directory


def new_run_dir(logdir: str, name: str) -> Path:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = Path(logdir) / f"{name}_{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}_{n}"), n + 1
    run_dir.mkdir(parents=True)
    return run_dir


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run directory, oldest first."""
    from impala_jax.checkpoint import STATE_FILE

    found = []
    for path in Path(run_dir).iterdir() if Path(run_dir).is_dir() else ():
        match = CHECKPOINT_RE.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(algo, run_dir: Path, iteration: int, keep: int) -> Path:
    path = Path(algo.save(Path(run_dir) / f"checkpoint_{iteration:06d}"))
    for _, old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(loggers.json_safe(value), indent=1) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- signals


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


# ---------------------------------------------------------------------------- main


def prepare(args: argparse.Namespace):
    """Config, stop, the run directory to resume (None: new run) and the run record.

    Nothing is built and nothing is written: a usage or config error leaves no trace.
    """
    from impala_jax import IMPALAConfig
    from impala_jax.checkpoint import STATE_FILE

    resume_from = None
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / RUN_FILE).is_file():
            raise RunError(f"--resume {run_dir}: not a run directory (no {RUN_FILE})")
        record = json.loads((run_dir / RUN_FILE).read_text())
        found = checkpoints(run_dir)
        if not found:
            raise RunError(f"--resume {run_dir}: no checkpoint to resume from")
        resume_from = found[-1][1]
        experiment = args.experiment or record.get("experiment")
        if experiment and Path(experiment).is_file():
            load_experiment(experiment)  # registers an env class the experiment defines
        meta = json.loads((resume_from / STATE_FILE).read_text())
        try:
            config = IMPALAConfig.from_dict(meta["config"])
        except (ValueError, TypeError) as err:
            raise RunError(
                f"checkpoint {resume_from}: config does not load: {one_line(err)}"
            ) from err
        stop = check_stop(record.get("stop", {}))
        name = record.get("name", run_dir.name)
    else:
        config, stop = load_experiment(args.experiment)
        name = args.name or Path(args.experiment).stem
        record = {"experiment": str(Path(args.experiment).absolute()), "name": name}
        run_dir = None
    apply_overrides(config, args.overrides)
    if args.seed is not None:
        apply_overrides(config, [f"debugging.seed={args.seed}"])
    if args.stop:
        stop = parse_stop(args.stop)
    try:
        config.validate()
    except ValueError as err:
        hint = ""
        if "num_learners" in str(err) and "device" in str(err) and args.devices is None:
            hint = "; on a CPU, --devices N runs JAX on N host devices"
        raise RunError(one_line(err) + hint) from err
    if config.env is None:
        raise RunError('no environment: set config.environment("...") or environment.env=ID')
    if args.wandb:
        missing = loggers.wandb_missing_message()
        if missing:
            raise RunError(missing)
    record.update(stop=stop, overrides=record.get("overrides", []) + list(args.overrides))
    record.setdefault("wandb_id", uuid.uuid4().hex[:12])
    record.setdefault("argv", []).append(sys.argv[1:])
    return config, stop, run_dir, name, record, resume_from


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # envpool builds its gymnasium Box spaces from float64 bounds and gymnasium warns about the
    # cast on every build: noise in front of the progress display.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    try:
        set_jax_environment(args.devices)
        enable_compile_cache(args.compile_cache)
        config, stop, run_dir, name, record, resume_from = prepare(args)
    except RunError as err:
        print(f"impala_jax.run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.quiet:
        mode = "quiet"
    else:
        mode = "live" if sys.stdout.isatty() else "plain"
    display = Display(mode, run_dir, name, stop)
    with StopSignal(display) as interrupt:
        try:
            return _train(
                args, config, stop, run_dir, name, record, resume_from, display, interrupt
            )
        finally:
            display.close()


def _train(args, config, stop, run_dir, name, record, resume_from, display, interrupt) -> int:
    try:
        algo = config.build()
    except ValueError as err:  # e.g. an env id that neither envpool nor gymnasium has
        display.close()
        print(f"impala_jax.run: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    if run_dir is None:  # created only once the config has built: a failed start leaves none
        run_dir = display.run_dir = new_run_dir(args.logdir, name)
    write_json(run_dir / loggers.PARAMS_FILE, config.to_dict())
    write_json(run_dir / RUN_FILE, record)
    writers: list = []
    with algo:
        resume_iteration = None
        if resume_from is not None:
            algo.restore(resume_from)
            counters = algo.get_state()["counters"]
            resume_iteration = counters["training_iteration"]
            display.note(
                f"resumed from {resume_from} (iteration {resume_iteration}, "
                f"{counters['num_env_steps_sampled_lifetime']:,} env steps)"
            )
        try:
            writers.append(loggers.JsonLogger(run_dir, resume_iteration))
            writers.append(loggers.CSVLogger(run_dir, resume_iteration))
            steps0 = algo.num_env_steps_sampled_lifetime if resume_from else None
            writers.append(loggers.TensorBoardLogger(run_dir, (steps0 + 1) if steps0 else None))
            writers.append(
                loggers.CurvePlotter(
                    run_dir,
                    stop,
                    title=name,
                    history=loggers.read_results(run_dir) if resume_from else (),
                )
            )
            if args.wandb:
                writers.append(
                    loggers.WandbLogger(
                        run_dir,
                        name,
                        loggers.json_safe(config.to_dict()),
                        args.wandb_project,
                        record["wandb_id"],
                    )
                )
            return _loop(
                algo, args, stop, run_dir, display, interrupt, writers, resume_iteration or 0
            )
        finally:
            for writer in writers:
                writer.close()


def _loop(algo, args, stop, run_dir, display, interrupt, writers, iteration: int) -> int:
    from impala_jax.metrics import flatten

    reason, saved_at, first, result = None, None, True, None
    while interrupt.signum is None:
        result = algo.train()
        iteration = result["training_iteration"]
        reason = stop_reached(result, stop)
        result["done"] = reason is not None
        for writer in writers:
            writer.write(result)
        display.update(result)
        missing = missing_stop_keys(result, stop) if first else []
        first = False
        if missing:
            keys = list(flatten(result))
            hints = [
                f"{k} (did you mean {close[0]}?)" if close else k
                for k in missing
                for close in [difflib.get_close_matches(k, keys, n=1)]
            ]
            display.close()
            print(
                f"impala_jax.run: error: stop key(s) not in the results: {', '.join(hints)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        if reason:
            break
        if args.checkpoint_freq and iteration % args.checkpoint_freq == 0:
            save_checkpoint(algo, run_dir, iteration, args.keep_checkpoints)
            saved_at = iteration
    if saved_at == iteration:
        path = run_dir / f"checkpoint_{iteration:06d}"
    else:
        path = save_checkpoint(algo, run_dir, iteration, args.keep_checkpoints)
    elapsed = time.perf_counter() - display.started
    display.status = "stopped" if reason else "interrupted"
    steps = (
        result["num_env_steps_sampled_lifetime"] if result else algo.num_env_steps_sampled_lifetime
    )
    at = f"iteration {iteration}, {steps:,} env steps, {elapsed:.1f} s"
    if reason:
        display.final(
            [f"stopped: {reason} ({at})", f"checkpoint: {path}", f"run directory: {run_dir}"]
        )
        return EXIT_STOPPED
    display.final(
        [
            f"interrupted by {signal.Signals(interrupt.signum).name} ({at})",
            f"checkpoint: {path}",
            f"resume with: python -m impala_jax.run --resume {run_dir}",
            f"run directory: {run_dir}",
        ]
    )
    return 128 + interrupt.signum


if __name__ == "__main__":
    sys.exit(main())
