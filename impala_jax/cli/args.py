"""The command line's arguments: the options, the help text, the checks, the exit statuses."""

from __future__ import annotations

import argparse

from impala_jax.runtime.jax_setup import DEFAULT_COMPILE_CACHE

DESCRIPTION = """\
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
  python -m impala_jax.run experiments/cartpole.py --coordinator 10.0.0.1:1234 \\
      --num-processes 2 --process-id 0 learners.num_learners=2   # and --process-id 1

stop keys are slash paths into the result dict, e.g. env_runners/episode_return_mean,
env_runners/num_env_steps_sampled_lifetime (RLlib's step budget; the same count as the
top-level num_env_steps_sampled_lifetime), training_iteration, time_total_s; the step,
iteration and time budgets give the live display its ETA.
"""

EXIT_STOPPED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# The arguments in --help's order: (names, argparse keywords).
OPTIONS: tuple[tuple[tuple[str, ...], dict], ...] = (
    (
        ("experiment",),
        dict(nargs="?", help="experiment file defining `config` (and optionally `stop`)"),
    ),
    (
        ("overrides",),
        dict(nargs="*", help="section.field=value, e.g. training.lr=1e-3 (repeatable)"),
    ),
    (
        ("script_args",),
        dict(
            nargs="*",
            metavar="-- SCRIPT_ARGS",
            help="after --: the experiment file's own arguments (its sys.argv[1:] while it loads)",
        ),
    ),
    (
        ("--stop",),
        dict(
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="stop when result KEY (slash path) reaches VALUE; repeatable; replaces the "
            "experiment's `stop`",
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
            help="checkpoint every N iterations (default 10; 0: only at the end)",
        ),
    ),
    (
        ("--keep-checkpoints",),
        dict(
            type=int,
            default=3,
            metavar="N",
            help="how many of the newest checkpoints to keep (default 3)",
        ),
    ),
    (
        ("--on-checkpoint-error",),
        dict(
            choices=("warn", "stop"),
            default="warn",
            help="when a checkpoint cannot be written (disk full, permission denied, I/O error): "
            "warn and train on, the next save trying again (default), or stop the run; either "
            "way the previous checkpoint stays intact",
        ),
    ),
    (
        ("--resume",),
        dict(
            metavar="RUN_DIR",
            help="continue RUN_DIR from its newest checkpoint (the experiment file is optional; "
            "overrides and --stop still apply)",
        ),
    ),
    (
        ("--quiet",),
        dict(action="store_true", help="print only the final lines, no per-iteration output"),
    ),
    (
        ("--devices",),
        dict(
            type=int,
            metavar="N",
            help="run JAX on N forced CPU devices (sets XLA_FLAGS and JAX_PLATFORMS=cpu before "
            "JAX starts), e.g. for learners(num_learners=N) on a machine without accelerators",
        ),
    ),
    (
        ("--compile-cache",),
        dict(
            metavar="DIR",
            default=DEFAULT_COMPILE_CACHE,
            help="JAX's persistent compilation cache, with the learner step's traced program in "
            "DIR/impala_jax_programs: a rerun of the same experiment skips compiling and "
            "tracing (default ~/.cache/impala_jax/xla; 'none' turns both off)",
        ),
    ),
    (("--wandb",), dict(action="store_true", help="also log to Weights & Biases (needs wandb)")),
    (
        ("--ray-address",),
        dict(
            metavar="ADDRESS",
            help="a sweep (a config with Ray Tune search spaces) joins this Ray cluster, e.g. "
            "auto (default: starts a local Ray with every CPU of the machine)",
        ),
    ),
    (("--wandb-project",), dict(default="impala_jax", help="W&B project (default impala_jax)")),
    (
        ("--coordinator",),
        dict(
            metavar="HOST:PORT",
            help="one run over several processes: process 0's address (jax.distributed); with "
            "--num-processes and --process-id",
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
            help="several processes: how long one waits for the others before it names the "
            "silent ones and exits (default 60)",
        ),
    ),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line's arguments, checked; ``parser.error`` (exit status 2) on a bad one."""
    parser = argparse.ArgumentParser(
        prog="python -m impala_jax.run",
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
