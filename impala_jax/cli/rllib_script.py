"""RLlib's example scripts: the arguments of ``add_rllib_example_script_args``, which an RLlib
tuned example parses when it loads, applied as RLlib's example runner applies them."""

from __future__ import annotations

import argparse

from impala_jax.cli.errors import RunError, one_line

# The attributes by which a module-level `args` is recognised as the namespace of RLlib's
# add_rllib_example_script_args (ray.rllib.examples.utils); every such namespace has them.
_EXAMPLE_ARG_MARKERS = ("stop_reward", "stop_iters", "stop_timesteps", "num_env_runners")
# What RLlib's run_rllib_example_script_experiment does with the rest, and why it has no
# counterpart here (impala_jax.run is the runner): an error when the value is not RLlib's
# default, so no argument is silently dropped.
_EXAMPLE_ARGS_WITHOUT_COUNTERPART = {
    "framework": "impala_jax runs JAX only",
    "output": "offline data output is not supported",
    "old_api_stack": "there is one API stack here",
    "local_mode": "RLlib no longer supports it either",
    "num_gpus": "the new stack uses num_gpus_per_learner (RLlib rejects --num-gpus too)",
    "num_cpus": "impala_jax runs in one process, no Ray cluster is started",
    "num_samples": "one run per command; sweeps run on Ray Tune",
    "max_concurrent_trials": "one run per command; sweeps run on Ray Tune",
    "verbose": "Tune's reporter; impala_jax.run has its own display (--quiet)",
    "tune_max_report_freq": "Tune's reporter; impala_jax.run has its own display (--quiet)",
    "checkpoint_freq": "use impala_jax.run's --checkpoint-freq (before `--`)",
    "checkpoint_at_end": "impala_jax.run always checkpoints at the end",
    "wandb_key": "use impala_jax.run's --wandb (the key comes from wandb's own login)",
    "wandb_project": "use impala_jax.run's --wandb --wandb-project (before `--`)",
    "wandb_run_name": "use impala_jax.run's --name (before `--`)",
    "as_test": "impala_jax.run's exit status says which stop criterion was met",
    "as_release_test": "impala_jax.run's exit status says which stop criterion was met",
}


def rllib_example_args(module) -> argparse.Namespace | None:
    """The module's ``args`` if it comes from RLlib's ``add_rllib_example_script_args``."""
    args = getattr(module, "args", None)
    if isinstance(args, argparse.Namespace) and all(hasattr(args, k) for k in _EXAMPLE_ARG_MARKERS):
        return args
    return None


def apply_example_args(config, args: argparse.Namespace) -> dict:
    """Applies RLlib's example-script arguments to ``config`` as RLlib's example runner does.

    ``--num-env-runners``, ``--num-envs-per-env-runner``, ``--num-learners``,
    ``--num-cpus-per-learner``, ``--num-gpus-per-learner``,
    ``--num-aggregator-actors-per-learner``, ``--log-level`` when given; ``--env`` when the
    config has none; the ``--evaluation-*`` arguments when ``--evaluation-interval`` > 0.
    Returns RLlib's default stop: ``--stop-reward`` on ``env_runners/episode_return_mean``,
    ``--stop-timesteps`` on ``env_runners/num_env_steps_sampled_lifetime``, ``--stop-iters``
    on ``training_iteration``. An argument with no counterpart here, set to anything but
    RLlib's default, is a RunError naming it; ``--algo``, ``--no-tune`` and
    ``--enable-new-api-stack`` are accepted whatever their value (they describe what
    impala_jax.run is).
    """
    from ray.rllib.examples.utils import add_rllib_example_script_args

    defaults = vars(add_rllib_example_script_args().parse_args([]))
    given = vars(args)
    for name, why in _EXAMPLE_ARGS_WITHOUT_COUNTERPART.items():
        if name in given and given[name] != defaults.get(name):
            flag = "--" + name.replace("_", "-")
            raise RunError(f"RLlib example argument {flag}={given[name]!r}: {why}")
    try:
        if args.env is not None and config.env is None:
            config.environment(args.env)
        runners = {
            k: given[k]
            for k in ("num_env_runners", "num_envs_per_env_runner")
            if given.get(k) is not None
        }
        if runners:
            config.env_runners(**runners)
        learners = {
            k: given[k]
            for k in (
                "num_learners",
                "num_cpus_per_learner",
                "num_gpus_per_learner",
                "num_aggregator_actors_per_learner",
            )
            if given.get(k) is not None
        }
        if learners:
            config.learners(**learners)
        if (given.get("evaluation_interval") or 0) > 0:
            config.evaluation(
                evaluation_num_env_runners=args.evaluation_num_env_runners,
                evaluation_interval=args.evaluation_interval,
                evaluation_duration=args.evaluation_duration,
                evaluation_duration_unit=args.evaluation_duration_unit,
                evaluation_parallel_to_training=args.evaluation_parallel_to_training,
            )
        if given.get("log_level") is not None:
            config.debugging(log_level=args.log_level)
    except (ValueError, TypeError) as err:
        raise RunError(f"RLlib example arguments: {one_line(err)}") from err
    return {
        "env_runners/episode_return_mean": args.stop_reward,
        "env_runners/num_env_steps_sampled_lifetime": args.stop_timesteps,
        "training_iteration": args.stop_iters,
    }
