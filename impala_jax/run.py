"""``python -m impala_jax.run EXPERIMENT.py [section.field=value ...] [--stop KEY=VALUE ...]
[-- SCRIPT_ARGS ...]``

Trains the ``config`` an experiment file defines, with its overrides, until a stop criterion is
met or a signal comes, writing the run directory as it goes; ``--help`` tells the whole story
(impala_jax/cli/args.py). ``main(argv)`` is the command line in-process, ``prepare`` checks a
run without building anything; the options, the process and the run directory live in
impala_jax/cli/.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
import uuid
import warnings
from pathlib import Path

from impala_jax.cli import deps

try:
    from impala_jax.cli import loggers, process
    from impala_jax.cli.args import EXIT_FAILED, EXIT_STOPPED, EXIT_USAGE, parse_args
    from impala_jax.cli.display import Display
    from impala_jax.cli.errors import RunError, one_line
    from impala_jax.cli.experiment import load_experiment
    from impala_jax.cli.overrides import apply_overrides
    from impala_jax.cli.population import population_settings, run_population
    from impala_jax.cli.run_dir import (
        CheckpointFailed,
        checkpoint_config,
        checkpoint_or_warn,
        checkpoint_path,
        checkpoint_steps,
        new_run_dir,
        resume_point,
        write_run_files,
    )
    from impala_jax.cli.stop_criteria import check_stop, check_stop_keys, parse_stop, stop_reached
    from impala_jax.rllib.values import find_search_space
    from impala_jax.runtime.process import roles
    from impala_jax.runtime.process.jax_setup import enable_compile_cache, initialize_lapack
    from impala_jax.runtime.process.watchdog import PeerLost
except ModuleNotFoundError as err:  # a Python without the dependencies: one line, no traceback
    if __name__ != "__main__" or not deps.is_runtime_package(err.name):
        raise
    print(f"impala_jax.run: error: {deps.missing_message(err.name)}", file=sys.stderr)
    sys.exit(2)


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
        from impala_jax.rllib.checks import start_together

        try:  # over several processes every one stops with this process's error
            start_together(config, err)
        except ValueError as every:
            err = every
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    missing = deps.missing_package()
    if missing:  # before anything imports it: one line naming it and the fix
        print(f"impala_jax.run: error: {deps.missing_message(missing)}", file=sys.stderr)
        return EXIT_USAGE
    # envpool builds its gymnasium Box spaces from float64 bounds and gymnasium warns about the
    # cast on every build: noise in front of the progress display.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    try:
        process.set_jax_environment(args.devices)
        enable_compile_cache(args.compile_cache)
        os.environ["IMPALA_JAX_COMPILE_CACHE"] = args.compile_cache  # build() follows the CLI
        process.join(args)
        # A sweep's run directory holds Tune's experiment (sweep.TUNE_DIR).
        if args.resume and (Path(args.resume) / "tune").is_dir():
            from impala_jax.cli.sweep import resume_error

            raise resume_error(args.resume)
        config, stop, run_dir, name, record, resume_from, notes = prepare(args)
    except RunError as err:
        print(f"impala_jax.run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = population_settings(args.experiment)
        if settings is not None:  # num_members: the members in one program, not a sweep
            return run_population(args, config, stop, name, record, settings)
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
    if not roles.is_primary():
        mode = "silent"  # process 0 speaks for the run
    elif args.quiet:
        mode = "quiet"
    else:
        mode = "live" if sys.stdout.isatty() else "plain"
    display = Display(mode, run_dir, name, stop)
    for note in notes:
        display.note(note)
    with process.StopSignal(display) as interrupt:
        try:
            return _train(
                args, config, stop, run_dir, name, record, resume_from, display, interrupt
            )
        except (PeerLost, CheckpointFailed) as err:
            display.close()
            print(f"impala_jax.run: error: {err}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            display.close()


def _train(args, config, stop, run_dir, name, record, resume_from, display, interrupt) -> int:
    initialize_lapack()  # a quicker start: the learner's orthogonal init lowers a QR (LAPACK)
    try:
        algo = config.build()
    except ValueError as err:  # e.g. an env id that neither envpool nor gymnasium has
        display.close()
        print(f"impala_jax.run: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    primary = roles.is_primary()  # the other processes of a run write nothing
    if run_dir is None and primary:  # created once the config has built: a failed start, none
        run_dir = display.run_dir = new_run_dir(args.logdir, name)
    if primary:
        write_run_files(run_dir, config, record)
    if algo.env_runner_group is not None:  # host runners (on device, none)
        algo.env_runner_group.on_down = display.runners_down  # while no runner samples
    process.need_teardown(not algo._callbacks.empty)
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


def _loop(algo, args, stop, run_dir, display, interrupt, writers, iteration: int) -> int:
    reason, saved_at, result, signum = None, None, None, None
    primary = roles.is_primary()
    save = functools.partial(
        checkpoint_or_warn,
        algo,
        run_dir,
        keep=args.keep_checkpoints,
        on_error=args.on_checkpoint_error,
        warn=display.note,
    )
    while True:
        result = algo.train()
        iteration = result["training_iteration"]
        reason, signum = process.agreed_stop(stop_reached(result, stop), interrupt.signum)
        result["done"] = reason is not None
        for writer in writers:
            writer.write(result)
        display.update(result)
        if reason or signum:
            break
        if primary and args.checkpoint_freq and iteration % args.checkpoint_freq == 0:
            if save(iteration) is not None:
                saved_at = iteration
    if saved_at == iteration or not primary:
        path = checkpoint_path(run_dir, iteration) if primary else None
    else:
        path = save(iteration, final=True)
    elapsed = time.perf_counter() - display.started
    display.status = "stopped" if reason else "interrupted"
    # The checkpoint's count (the runners sample on while it is written): the one --resume
    # reports and continues from.
    steps = checkpoint_steps(path)
    if steps is None:
        steps = (
            result["num_env_steps_sampled_lifetime"]
            if result
            else algo.num_env_steps_sampled_lifetime
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


if __name__ == "__main__":
    process.exit_without_teardown(main())
