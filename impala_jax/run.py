"""``python -m impala_jax.run EXPERIMENT.py [section.field=value ...] [--stop KEY=VALUE ...]
[-- SCRIPT_ARGS ...]``

An experiment file is a Python file that defines a module-level ``config`` (an IMPALAConfig) and
optionally ``stop``, a dict of result paths to thresholds, as Ray Tune and RLlib's tuned
examples use: the run stops when any result value reaches its threshold. Overrides go through
the same builder methods: ``training.lr=3e-4`` calls ``config.training(lr=3e-4)``; values are
Python literals (a bare word is a string), and ``section.field.key=value`` changes one key of a
dict field, e.g. ``rl_module.model_config.fcnet_hiddens=[64,64]``.

While the file runs, sys.argv is the file's path plus the arguments after ``--``, so a file that
parses its own arguments (RLlib's tuned examples: add_rllib_example_script_args, then
parser.parse_args()) sees only those; it runs as a module, not as __main__, so its
``if __name__ == "__main__":`` block does not run. RLlib's example arguments act as RLlib's
example runner makes them act: --num-env-runners, --num-envs-per-env-runner, --num-learners,
--env, --evaluation-* set the config, and --stop-reward / --stop-timesteps / --stop-iters are
the stop when the file defines none; one with no counterpart here is an error.

A stop key must be a result train() can report for the config; one that can never appear
(a typo, evaluation/... without evaluation) is an error before anything is built. A key not
reported yet (env_runners/episode_return_mean before the first episode ends) just waits.
Callbacks may log keys of their own: with episode hooks, keys under env_runners/ are accepted;
with an algorithm-level hook (on_train_result, ...), any key; each with a note.

The run directory LOGDIR/NAME_TIMESTAMP/ receives params.json (the resolved config), run.json
(how the run was started), result.json (one JSON line per iteration, Tune's format),
progress.csv, TensorBoard event files (step: env steps sampled), learning_curve.png (return
against env steps, refreshed every few seconds), and checkpoints checkpoint_NNNNNN every
--checkpoint-freq iterations and at the end (the newest --keep-checkpoints are kept). A save that
fails (disk full, permission denied) leaves the previous checkpoint intact and, as
--on-checkpoint-error says, warns and trains on (default) or stops the run.

Ctrl-C (or SIGTERM) finishes the current iteration, saves a checkpoint and exits with the
command that resumes the run; a second Ctrl-C exits at once. --resume RUN_DIR continues from the
newest intact checkpoint (a damaged one, which fails its manifest check, is skipped with a note)
with the same counters and appends to the same logs, dropping what was logged after that
checkpoint.

A config that holds Ray Tune search spaces (tune.grid_search, tune.uniform, ... anywhere in
the builder calls) runs as a Ray Tune sweep (impala_jax/cli/sweep.py): one trial per point, each
stopped by the stop criteria, in one run directory with Tune's experiment under tune/; at the
end one line per trial and the best trial's checkpoint. The file may also set num_samples and
failure_config. --ray-address joins a running Ray cluster (default: a local Ray with every CPU).

One run over several processes or hosts (impala_jax/runtime/distributed.py): start the same command
in every process with --coordinator HOST:PORT (process 0's address) --num-processes N
--process-id I, or with none of them under a cluster manager JAX detects (SLURM, Open MPI).
Process 0 writes the run directory and prints; the others print only errors. --resume needs
the run directory where every process can read it (a shared filesystem); process 0 reads the
checkpoint and sends it to the others. A lost process ends the others within
--collective-timeout seconds, naming it.

Exit status: 0 when a stop criterion is met, 2 for a usage or config error, 130 / 143 after
SIGINT / SIGTERM, 1 when training fails. A sweep: 0 when every trial terminated, 1 when a trial
errored or did not finish, 2 for a usage or config error.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from impala_jax.cli import loggers
from impala_jax.cli.display import Display
from impala_jax.cli.experiment import (
    RunError,
    apply_overrides,
    check_stop,
    check_stop_keys,
    load_experiment,
    one_line,
    parse_stop,
    stop_reached,
)
from impala_jax.cli.run_dir import (
    checkpoint_config,
    checkpoint_path,
    checkpoints,
    new_run_dir,
    resume_point,
    save_checkpoint,
    write_run_files,
)
from impala_jax.rllib.config_checks import find_search_space
from impala_jax.runtime import distributed
from impala_jax.runtime.jax_setup import (
    DEFAULT_COMPILE_CACHE,
    enable_compile_cache,
    force_host_devices,
    initialize_lapack,
)

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
  python -m impala_jax.run cartpole_impala.py --stop training_iteration=50 \\
      -- --num-env-runners=2 --stop-reward=450
  python -m impala_jax.run experiments/cartpole_sweep.py       # a Ray Tune sweep
  python -m impala_jax.run experiments/cartpole_sweep.py --ray-address auto
  python -m impala_jax.run experiments/cartpole.py --coordinator 10.0.0.1:1234 \
      --num-processes 2 --process-id 0 learners.num_learners=2   # and --process-id 1

stop keys are slash paths into the result dict, e.g. env_runners/episode_return_mean,
env_runners/num_env_steps_sampled_lifetime (RLlib's step budget; the same count as the
top-level num_env_steps_sampled_lifetime), training_iteration, time_total_s; the step,
iteration and time budgets give the live display its ETA.
"""

EXIT_STOPPED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
        "script_args",
        nargs="*",
        metavar="-- SCRIPT_ARGS",
        help="after --: the experiment file's own arguments (its sys.argv[1:] while it loads)",
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
        "--on-checkpoint-error",
        choices=("warn", "stop"),
        default="warn",
        help="when a checkpoint cannot be written (disk full, permission denied, I/O error): "
        "warn and train on, the next save trying again (default), or stop the run; either way "
        "the previous checkpoint stays intact",
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
        default=DEFAULT_COMPILE_CACHE,
        help="JAX's persistent compilation cache, with the learner step's traced program in "
        "DIR/impala_jax_programs: a rerun of the same experiment skips compiling and tracing "
        "(default ~/.cache/impala_jax/xla; 'none' turns both off)",
    )
    parser.add_argument(
        "--wandb", action="store_true", help="also log to Weights & Biases (needs wandb)"
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="a sweep (a config with Ray Tune search spaces) joins this Ray cluster, e.g. auto "
        "(default: starts a local Ray with every CPU of the machine)",
    )
    parser.add_argument(
        "--wandb-project", default="impala_jax", help="W&B project (default impala_jax)"
    )
    parser.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="one run over several processes: process 0's address (jax.distributed); with "
        "--num-processes and --process-id",
    )
    parser.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    parser.add_argument("--process-id", type=int, metavar="I", help="this process, 0 to N-1")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="several processes: how long one waits for the others before it names the "
        "silent ones and exits (default 60)",
    )
    # Everything after the first `--` belongs to the experiment file's own parser.
    script_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, script_args = argv[:at], argv[at + 1 :]
    args, unknown = parser.parse_known_intermixed_args(argv)
    if unknown:
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (arguments for the experiment "
            "file's own parser go after `--`)"
        )
    args.script_args = script_args
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
    given = [args.coordinator, args.num_processes, args.process_id]
    if any(v is not None for v in given) and any(v is None for v in given):
        parser.error(
            "--coordinator, --num-processes and --process-id go together (got "
            f"{args.coordinator}, {args.num_processes}, {args.process_id}); give all three, or "
            "none for a single process or JAX's cluster detection"
        )
    if args.collective_timeout <= 0:
        parser.error("--collective-timeout must be > 0 seconds")
    return args


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


def prepare(args: argparse.Namespace):
    """Config, stop, the run directory to resume (None: new run) and the run record.

    Nothing is built and nothing is written: a usage or config error leaves no trace.
    """
    resume_from = None
    if args.resume:
        run_dir = Path(args.resume)
        record, resume_from = resume_point(run_dir)
        experiment = args.experiment or record.get("experiment")
        script_args = args.script_args or record.get("script_args", [])
        if experiment and Path(experiment).is_file():
            # Registers an env class the experiment defines; the config is the checkpoint's.
            load_experiment(experiment, script_args)
        config = checkpoint_config(resume_from)
        stop = check_stop(record.get("stop", {}))
        name = record.get("name", run_dir.name)
    else:
        script_args = args.script_args
        config, stop = load_experiment(args.experiment, script_args)
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
    notes = check_stop_keys(stop, config)
    if args.wandb:
        missing = loggers.wandb_missing_message()
        if missing:
            raise RunError(missing)
    record.update(
        stop=stop,
        overrides=record.get("overrides", []) + list(args.overrides),
        script_args=script_args,
    )
    record.setdefault("wandb_id", uuid.uuid4().hex[:12])
    record.setdefault("argv", []).append(sys.argv[1:])
    return config, stop, run_dir, name, record, resume_from, notes


def set_jax_environment(devices: int | None) -> None:
    """Environment variables that JAX reads once, at import: set here, never by the library."""
    if devices is None:
        return
    if "jax" in sys.modules:
        raise RunError("--devices must be set before JAX is imported (run it as a fresh process)")
    force_host_devices(devices)
    os.environ["JAX_PLATFORMS"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # envpool builds its gymnasium Box spaces from float64 bounds and gymnasium warns about the
    # cast on every build: noise in front of the progress display.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    try:
        set_jax_environment(args.devices)
        enable_compile_cache(args.compile_cache)
        _join(args)
        # A sweep's run directory holds Tune's experiment (sweep.TUNE_DIR).
        if args.resume and (Path(args.resume) / "tune").is_dir():
            from impala_jax.cli.sweep import resume_error

            raise resume_error(args.resume)
        config, stop, run_dir, name, record, resume_from, notes = prepare(args)
    except RunError as err:
        print(f"impala_jax.run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if find_search_space(config.to_dict()):
        from impala_jax.cli.sweep import run_sweep  # imports ray: only a sweep pays for it

        try:
            return run_sweep(args, config, stop, name, record, notes)
        except RunError as err:
            print(f"impala_jax.run: error: {err}", file=sys.stderr)
            return EXIT_USAGE
    if args.ray_address:
        print(
            "impala_jax.run: error: --ray-address is for sweeps (a config with Ray Tune search "
            "spaces); this config has none and runs in this process",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not distributed.is_primary():
        mode = "silent"  # process 0 speaks for the run
    elif args.quiet:
        mode = "quiet"
    else:
        mode = "live" if sys.stdout.isatty() else "plain"
    display = Display(mode, run_dir, name, stop)
    for note in notes:
        display.note(note)
    with StopSignal(display) as interrupt:
        try:
            return _train(
                args, config, stop, run_dir, name, record, resume_from, display, interrupt
            )
        except (distributed.PeerLost, CheckpointFailed) as err:
            display.close()
            print(f"impala_jax.run: error: {err}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            display.close()


class CheckpointFailed(RuntimeError):
    """A checkpoint could not be written and --on-checkpoint-error says stop."""


def _checkpoint(algo, run_dir, iteration, args, display, final: bool = False):
    """Saves checkpoint ``iteration``; on a failure (the previous checkpoint stays intact, as
    checkpoint.save writes beside it and renames) warns and returns None, or raises
    CheckpointFailed, as --on-checkpoint-error says. The final save always raises."""
    try:
        return save_checkpoint(algo, run_dir, iteration, args.keep_checkpoints)
    except Exception as err:  # OSError (ENOSPC, EACCES, EIO), numpy's errors, ...
        found = checkpoints(run_dir)
        previous = f"the newest intact one is {found[-1][1]}" if found else "there is none yet"
        what = (
            f"checkpoint {checkpoint_path(run_dir, iteration)} could not be written "
            f"({type(err).__name__}: {err}); {previous}"
        )
        if final or args.on_checkpoint_error == "stop":
            resume = f"; resume with: python -m impala_jax.run --resume {run_dir}" if found else ""
            raise CheckpointFailed(f"{what}; the run stopped{resume}") from err
        display.note(
            f"warning: {what}. Training goes on and the next save tries again "
            "(--on-checkpoint-error stop stops the run instead)."
        )
        return None


def _join(args) -> None:
    """Joins a multi-process run (the flags, IMPALA_JAX_* variables or a cluster JAX detects);
    a single process otherwise."""
    try:
        distributed.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            collective_timeout_s=args.collective_timeout,
        )
    except ValueError as err:
        raise RunError(one_line(err)) from err


# Whether exit_without_teardown must let the interpreter tear down: set once a run has built.
_TEARDOWN_NEEDED = True


def _train(args, config, stop, run_dir, name, record, resume_from, display, interrupt) -> int:
    global _TEARDOWN_NEEDED
    initialize_lapack()  # 0.1-0.2 s less start-up: the learner's orthogonal init lowers a QR
    try:
        algo = config.build()
    except ValueError as err:  # e.g. an env id that neither envpool nor gymnasium has
        display.close()
        print(f"impala_jax.run: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    primary = distributed.is_primary()  # the other processes of a run write nothing
    if run_dir is None and primary:  # created once the config has built: a failed start, none
        run_dir = display.run_dir = new_run_dir(args.logdir, name)
    if primary:
        write_run_files(run_dir, config, record)
    algo.env_runner_group.on_down = display.runners_down  # while no runner samples
    _TEARDOWN_NEEDED = not algo._callbacks.empty
    with algo:
        resume_iteration = resume_steps = None
        if resume_from is not None:
            algo.restore(resume_from)
            counters = algo.get_state()["counters"]
            resume_iteration = counters["training_iteration"]
            resume_steps = algo.num_env_steps_sampled_lifetime
            display.note(
                f"resumed from {resume_from} (iteration {resume_iteration}, "
                f"{counters['num_env_steps_sampled_lifetime']:,} env steps)"
            )
        wandb = None
        if args.wandb:
            wandb = (loggers.json_safe(config.to_dict()), args.wandb_project, record["wandb_id"])
        writers = []
        if primary:
            writers = loggers.open_writers(
                run_dir, name, stop, resume_iteration, resume_steps, wandb
            )
        try:
            return _loop(
                algo, args, stop, run_dir, display, interrupt, writers, resume_iteration or 0
            )
        finally:
            for writer in writers:
                writer.close()


def _agreed_stop(reason: str | None, signum: int | None) -> tuple[str | None, int | None]:
    """Over several processes: process 0's stop decision, and an interrupt of any process,
    taken by every process at the same iteration."""
    if distributed.process_count() == 1:
        return reason, signum
    flags = distributed.allgather(np.array([reason is not None, signum or 0]), "the stop decision")
    if not distributed.is_primary():
        reason = "process 0 reached a stop criterion" if flags[0, 0] else None
    elif not flags[0, 0]:
        reason = None
    return reason, int(flags[:, 1].max()) or None


def _loop(algo, args, stop, run_dir, display, interrupt, writers, iteration: int) -> int:
    reason, saved_at, result, signum = None, None, None, None
    primary = distributed.is_primary()
    while True:
        result = algo.train()
        iteration = result["training_iteration"]
        reason, signum = _agreed_stop(stop_reached(result, stop), interrupt.signum)
        result["done"] = reason is not None
        for writer in writers:
            writer.write(result)
        display.update(result)
        if reason or signum:
            break
        if primary and args.checkpoint_freq and iteration % args.checkpoint_freq == 0:
            if _checkpoint(algo, run_dir, iteration, args, display) is not None:
                saved_at = iteration
    if saved_at == iteration or not primary:
        path = checkpoint_path(run_dir, iteration) if primary else None
    else:
        path = _checkpoint(algo, run_dir, iteration, args, display, final=True)
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
            f"interrupted by {signal.Signals(signum).name} ({at})",
            f"checkpoint: {path}",
            f"resume with: python -m impala_jax.run --resume {run_dir}",
            f"run directory: {run_dir}",
        ]
    )
    return 128 + signum


def exit_without_teardown(code: int) -> None:
    """Ends the CLI process with ``code`` once the run is over, skipping the interpreter's
    teardown where nothing needs it.

    By the time ``main`` returns, the run's files are closed (writers, checkpoints, the
    display) and its algorithm stopped. What the interpreter's teardown then does (clearing
    every module of JAX, Flax, envpool and the rest, destroying the XLA client and envpool's
    threads) took 0.7-0.9 s after ``main`` returned, on 2 cores: a tenth of a CartPole run to
    450. So the process runs the exit handlers (``atexit``: JAX's, the experiment file's; 0.04
    s), flushes its standard streams and calls ``os._exit``. The whole teardown runs where it
    matters: with callbacks (user code that may hold files open, which teardown flushes;
    looking for such files among the heap's objects took 0.36 s), several processes, Ray (a
    sweep, a cluster) and W&B.
    """
    if (
        _TEARDOWN_NEEDED
        or distributed.process_count() > 1
        or any(m in sys.modules for m in ("ray", "wandb"))
    ):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()  # CPython's own exit runs these, logging.shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
