"""The command line's arguments: the options, the help text, the checks, the exit statuses."""

from __future__ import annotations

import argparse
import difflib

from impala_jax.runtime.process.jax_setup import DEFAULT_COMPILE_CACHE

DESCRIPTION = """\
Trains the config an experiment file defines until a stop criterion is met.

An experiment file is a Python file with a module-level config (an IMPALAConfig)
and optionally stop, a dict of result paths to thresholds: the run stops when a
result value reaches its threshold. An override section.field=value calls
config.section(field=value); values are Python literals (a bare word is a
string) and section.field.key=value sets one key of a dict field. Arguments
after -- are the file's own (its sys.argv[1:] while it loads, as RLlib's example
scripts expect); the file runs as a module, not as __main__.

The run directory LOGDIR/NAME_TIMESTAMP/ holds params.json, run.json,
result.json, progress.csv, TensorBoard events, learning_curve.png and
checkpoints. Ctrl-C (or SIGTERM) saves a checkpoint and prints the command that
resumes the run; a second Ctrl-C exits at once. A config with Ray Tune search
spaces runs as a sweep (needs the tune extra). Several processes: give every
process --coordinator, --num-processes and --process-id (or none of them under
SLURM or Open MPI); process 0 writes the run directory. README.md has the rest.
"""

EXAMPLES = """\
examples:
  python -m impala_jax.run experiments/cartpole.py
  python -m impala_jax.run experiments/cartpole.py training.lr=1e-3 \\
      --stop env_runners/episode_return_mean=400
  python -m impala_jax.run experiments/cartpole.py \\
      'rl_module.model_config.fcnet_hiddens=[32]' --seed 1
  python -m impala_jax.run --resume runs/cartpole_2025-01-01_12-00-00 \\
      --stop time_total_s=600
  python -m impala_jax.run cartpole_impala.py -- --stop-reward=450
  python -m impala_jax.run experiments/cartpole_sweep.py

stop keys are slash paths into the result, e.g. env_runners/episode_return_mean,
num_env_steps_sampled_lifetime, training_iteration, time_total_s.

exit status: 0 a stop criterion was met (a sweep: every trial terminated),
2 a usage or config error, 130 / 143 after SIGINT / SIGTERM, 1 training failed.
"""

EXIT_STOPPED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# The arguments in --help's order: (names, argparse keywords).
OPTIONS: tuple[tuple[tuple[str, ...], dict], ...] = (
    (
        ("experiment",),
        dict(nargs="?", help="the experiment file (defines config, optionally stop)"),
    ),
    (
        ("overrides",),
        dict(nargs="*", help="section.field=value, e.g. training.lr=1e-3"),
    ),
    (
        ("script_args",),
        dict(
            nargs="*",
            metavar="-- SCRIPT_ARGS",
            help="after --: the experiment file's own arguments",
        ),
    ),
    (
        ("--stop",),
        dict(
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="stop when result KEY reaches VALUE (repeatable; replaces the file's stop)",
        ),
    ),
    (("--name",), dict(help="run name (default: the experiment file's name)")),
    (("--logdir",), dict(default="runs", help="where run directories go (default: runs)")),
    (("--seed",), dict(type=int, help="sets debugging(seed=N)")),
    (
        ("--checkpoint-freq",),
        dict(
            type=int,
            default=10,
            metavar="N",
            help="checkpoint every N iterations (default 10; 0: at the end only)",
        ),
    ),
    (
        ("--keep-checkpoints",),
        dict(
            type=int,
            default=3,
            metavar="N",
            help="keep the newest N checkpoints (default 3)",
        ),
    ),
    (
        ("--on-checkpoint-error",),
        dict(
            choices=("warn", "stop"),
            default="warn",
            help="a checkpoint that cannot be written: warn and train on (default) or stop",
        ),
    ),
    (
        ("--resume",),
        dict(
            metavar="RUN_DIR",
            help="continue RUN_DIR from its newest intact checkpoint",
        ),
    ),
    (
        ("--quiet",),
        dict(action="store_true", help="print only the final lines"),
    ),
    (
        ("--devices",),
        dict(
            type=int,
            metavar="N",
            help="run JAX on N CPU devices (e.g. learners.num_learners=N without a GPU)",
        ),
    ),
    (
        ("--compile-cache",),
        dict(
            metavar="DIR",
            default=DEFAULT_COMPILE_CACHE,
            help="compiled programs kept for reruns (default ~/.cache/impala_jax/xla; none: off)",
        ),
    ),
    (("--wandb",), dict(action="store_true", help="also log to Weights & Biases")),
    (
        ("--ray-address",),
        dict(
            metavar="ADDRESS",
            help="a sweep joins this Ray cluster, e.g. auto (default: a local Ray)",
        ),
    ),
    (("--wandb-project",), dict(default="impala_jax", help="W&B project (default impala_jax)")),
    (
        ("--coordinator",),
        dict(
            metavar="HOST:PORT",
            help="several processes: process 0's address",
        ),
    ),
    (("--num-processes",), dict(type=int, metavar="N", help="processes in the run")),
    (("--process-id",), dict(type=int, metavar="I", help="this process, 0 to N-1")),
    (
        ("--collective-timeout",),
        dict(
            type=float,
            default=60.0,
            metavar="S",
            help="several processes: how long to wait for the others (default 60)",
        ),
    ),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line's arguments, checked; ``parser.error`` (exit status 2) on a bad one."""
    parser = argparse.ArgumentParser(
        prog="python -m impala_jax.run",
        usage="%(prog)s EXPERIMENT.py [overrides] [options] [-- args]\n"
        "       %(prog)s --resume RUN_DIR [overrides] [options]",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for names, keywords in OPTIONS:
        parser.add_argument(*names, **keywords)
    # Everything after the first `--` belongs to the experiment file's own parser.
    script_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, script_args = argv[:at], argv[at + 1 :]
    args, unknown = parser.parse_known_intermixed_args(argv)
    if unknown:
        flags = [name for names, _ in OPTIONS for name in names if name.startswith("--")]
        close = [
            match
            for arg in unknown
            if arg.startswith("--")
            for match in difflib.get_close_matches(arg.partition("=")[0], flags, n=1, cutoff=0.75)
        ]
        hint = (
            f"did you mean {' '.join(close)}?"
            if close
            else "arguments for the experiment file's own parser go after `--`"
        )
        parser.error(f"unrecognized arguments: {' '.join(unknown)} ({hint})")
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
