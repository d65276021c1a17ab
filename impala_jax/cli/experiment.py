"""The experiment as the CLI takes it: the file, its ``section.field=value`` overrides, its stop.

Also what ``train()`` can report for a config (``result_schema``), so a stop key that can never
appear fails before anything is built, and RLlib's example-script arguments
(``add_rllib_example_script_args``), which an RLlib tuned example parses when it loads.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.util
import inspect
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from impala_jax.runtime.metrics import lookup


class RunError(Exception):
    """A usage or config problem: reported as one line, exit status 2."""


def one_line(err: BaseException | str) -> str:
    """A multi-line message (config validation lists every bad field) on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} " + "; ".join(lines[1:])
    return "; ".join(lines)


def module_name(path: str | Path) -> str:
    """The file's module name for load_experiment: the name that imports it from sys.path
    (``experiments.custom_env`` in the repository root), else ``experiment_<stem>``."""
    path = Path(path).absolute()
    for entry in sys.path:
        try:
            parts = path.with_suffix("").relative_to(Path(entry or ".").absolute()).parts
        except ValueError:
            continue
        name = ".".join(parts)
        if parts and all(p.isidentifier() for p in parts) and _imports_file(name, path):
            return name
    return "experiment_" + re.sub(r"\W", "_", path.stem)


def _imports_file(name: str, path: Path) -> bool:
    """Whether ``import name`` would load ``path`` (not a module of that name elsewhere)."""
    try:
        spec = importlib.util.find_spec(name)
        return Path(spec.origin) == path
    except (ImportError, ValueError, AttributeError, TypeError):  # none, or a package's own
        return False


def load_experiment(path: str | Path, script_args: Sequence[str] = ()) -> tuple[Any, dict]:
    """Runs the experiment file; returns its ``config`` (a copy) and ``stop``.

    While the file runs, ``sys.argv`` is ``[path, *script_args]``: a file that parses its own
    arguments at module level (RLlib's tuned examples call ``parser.parse_args()``) sees the
    arguments given after ``--`` on the command line, never the CLI's. The module runs under
    ``module_name(path)``, not ``__main__``, so an ``if __name__ == "__main__":`` block
    (RLlib's ``run_rllib_example_script_experiment(config, args)``) does not run. The module
    stays registered in sys.modules under that name, so an env class it defines is stored in
    checkpoints as ``experiments.custom_env:Class`` (run from the repository root) and found
    again on resume and by ``IMPALA.from_checkpoint`` in a script started there.

    A module-level ``args`` from RLlib's ``add_rllib_example_script_args`` is applied as
    RLlib's example runner applies it (``apply_example_args``); its stop criteria are the stop
    when the file defines no ``stop``.
    """
    from impala_jax.rllib.config import IMPALAConfig

    path = Path(path)
    if not path.is_file():
        near = [str(p) for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        close = difflib.get_close_matches(str(path), near, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise RunError(f"experiment file {path} does not exist{hint}")
    name = module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    argv = sys.argv
    sys.argv = [str(path), *script_args]
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # the file's own argument parser: --help, or a rejected argument
        del sys.modules[name]
        if err.code in (0, None):
            raise
        raise RunError(
            f"experiment file {path} exited with status {err.code} while loading; if its own "
            "argument parser rejected an argument, pass the file's arguments after `--` "
            f"(it was given {list(script_args)})"
        ) from None
    except Exception as err:
        del sys.modules[name]
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise RunError(
            f"experiment file {path} failed to load: {type(err).__name__}: {err}{where}"
        ) from err
    finally:
        sys.argv = argv
    config = getattr(module, "config", None)
    if not isinstance(config, IMPALAConfig):
        raise RunError(
            f"experiment file {path} must define a module-level `config` (an IMPALAConfig); "
            f"found {type(config).__name__}"
        )
    stop = getattr(module, "stop", None)
    if stop is not None and not isinstance(stop, dict):
        raise RunError(f"experiment file {path}: `stop` must be a dict, not {type(stop).__name__}")
    config = config.copy(copy_frozen=False)
    example_args = rllib_example_args(module)
    if example_args is not None:
        example_stop = apply_example_args(config, example_args)
        if stop is None:
            stop = example_stop
    return config, check_stop(stop or {})


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
    from impala_jax.rllib.compat import NotProvided

    out = {}
    for name in dir(config):
        method = getattr(config, name, None)
        if name.startswith("_") or not callable(method):
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):
            continue
        # A builder's fields default to NotProvided; its **rllib_kwargs (RLlib-only keywords,
        # routed by rllib/compat.py) are not fields an override can set.
        params = [
            p
            for p in signature.parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if params and all(p.default is NotProvided for p in params):
            out[name] = signature.replace(parameters=params)
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


# What train() returns, section by section, as slash paths. Written from the code that fills
# each section (metrics.train_result, metrics.EpisodeStats.result, learner.learner_step's
# metrics with losses.impala_loss's, the stage timers of env_runner / env_runner_group /
# buffers / algorithm, EnvRunnerGroup.fault_tolerance_metrics, evaluation.Evaluator).
# tests/test_experiment.py holds it equal to real results, so a key added there fails a test
# until it is listed here.
TOP_LEVEL_KEYS = (
    "num_env_steps_sampled_lifetime",
    "num_env_steps_trained_lifetime",
    "num_episodes_lifetime",
    "num_training_step_calls_per_iteration",
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    # Ray Tune's Trainable bookkeeping (metrics.trainable_info), as in RLlib's results.
    "done",
    "iterations_since_restore",
    "time_since_restore",
    "timestamp",
    "date",
    "pid",
    "hostname",
    "node_ip",
)
# Results that are not numbers, or do not change: never a stop criterion.
NOT_STOP_KEYS = ("date", "hostname", "node_ip", "pid", "timestamp")
# `config/...`: the resolved config (Tune's `config` key), whatever keys it has.
CONFIG_PREFIX = "config/"
# Means over the smoothing window: NaN until the first episode has finished.
EPISODE_KEYS = (
    "episode_return_mean",
    "episode_return_min",
    "episode_return_max",
    "episode_len_mean",
)
ENV_RUNNER_KEYS = (
    "num_episodes",
    "num_episodes_lifetime",
    "num_env_steps_sampled",
    "num_env_steps_sampled_lifetime",
)
EVALUATION_ENV_RUNNER_KEYS = ENV_RUNNER_KEYS
LEARNER_KEYS = (
    "total_loss",
    "pi_loss",
    "vf_loss",
    "entropy",
    "mean_kl",
    "mean_vs",
    "vf_explained_var",
    "mean_rho",
    "clipped_rho_fraction",
    "max_rho",
    "mean_pi_loss",
    "mean_vf_loss",
    "gradients_default_optimizer_global_norm",
    "curr_lr",
    "curr_entropy_coeff",
    "num_non_finite_updates",
    "num_consecutive_non_finite_updates",
    "update_to_param_norm_ratio",  # learning diagnostics (core/update.py)
    "update_rms_to_lr_ratio",
)
# Reported for some configs only: entropy / its maximum (ln n for Discrete(n), none for Box), and
# the encoder's feature diagnostics (core/update.py; feedforward policies, not LSTMs).
OPTIONAL_LEARNER_KEYS = (
    "entropy_fraction_of_max",
    "encoder_dead_unit_fraction",
    "encoder_feature_std",
)
# What the module reports also when no update runs (debugging(_skip_learners=True)).
LEARNER_COUNT_KEYS = (
    "num_env_steps_trained",
    "num_module_steps_trained",
    "num_module_steps_trained_lifetime",
    "num_updates_lifetime",
    "default_optimizer_learning_rate",
    "effective_train_batch_size_per_learner",
    "effective_total_train_batch_size",
)
ALL_MODULES_KEYS = (
    "num_env_steps_trained",
    "num_env_steps_trained_lifetime",
    "num_module_steps_trained",
    "num_module_steps_trained_lifetime",
    "num_trainable_parameters",
)
PERF_KEYS = (
    "env_steps_sampled_per_s",
    "env_steps_trained_per_s",
    "policy_lag_mean",
    "policy_lag_max",
    "learner_queue_size",
)
SYS_USAGE_KEYS = ("cpu_util_percent", "ram_util_percent")  # debugging(log_sys_usage=True)
FAULT_TOLERANCE_KEYS = (
    "num_healthy_workers",
    "num_remote_worker_restarts",
    "num_env_runner_failures",
    "num_env_restarts",
    "num_dropped_episodes",
    "num_non_finite_fragments_dropped",
)
# Stage timers (seconds this iteration) by the thread that runs the stage: the runners step
# and act, the lockstep group or the loader threads stack and transfer, the learner waits,
# dispatches, broadcasts and fetches.
RUNNER_TIMERS = ("inference", "env_send", "env_recv")
THREADED_TIMERS = ("queue_put_wait", "stack", "transfer", "learner_wait")
LOCKSTEP_TIMERS = ("transfer",)
LEARNER_TIMERS = ("learner_dispatch", "broadcast")
ITERATION_TIMERS = ("learner_fetch",)
# Callbacks (impala_jax.runtime.callbacks) log where RLlib's do: episode hooks under env_runners/
# (evaluation/env_runners/ for evaluation episodes); algorithm-level hooks get the algorithm's
# metrics logger, which writes any path from the top, and on_train_result may mutate the result.
EPISODE_CALLBACK_PREFIXES = ("env_runners/", "evaluation/env_runners/")


@dataclasses.dataclass(frozen=True)
class ResultSchema:
    """Every result path ``train()`` can report for one config.

    ``episode_keys`` are NaN until the first episode has finished (NaN never stops a run);
    ``evaluation_keys`` appear only in iterations that evaluate; timers only in iterations
    whose stage ran. ``open_prefixes``: any path under them can appear (``config/``, and
    ``evaluation/`` for a ``custom_evaluation_function``, which returns what it likes).
    ``callback_prefixes``: where the configured callbacks may log keys of their own (``""``:
    anywhere). ``optional_keys`` (in ``keys`` too) appear for some envs only (an action space
    with a maximum entropy).
    """

    keys: frozenset[str]
    episode_keys: frozenset[str]
    evaluation_keys: frozenset[str]
    open_prefixes: tuple[str, ...] = ()
    callback_prefixes: tuple[str, ...] = ()
    optional_keys: frozenset[str] = frozenset()

    def known(self, path: str) -> bool:
        """Whether impala_jax itself can report ``path`` for this config."""
        return path in self.keys or path.startswith(self.open_prefixes)

    def can_appear(self, path: str) -> bool:
        """Whether ``path`` can be in a result: known, or a place callbacks may log to."""
        return self.known(path) or path.startswith(self.callback_prefixes)


def result_schema(config) -> ResultSchema:
    """The result paths ``train()`` can produce for ``config`` (an IMPALAConfig)."""
    learns = not (config._env_runners_only or config._skip_learners)
    timers = (
        RUNNER_TIMERS
        + (THREADED_TIMERS if config.num_env_runners else LOCKSTEP_TIMERS)
        + (LEARNER_TIMERS if learns else ())
        + ITERATION_TIMERS
    )
    module_keys = LEARNER_COUNT_KEYS + (LEARNER_KEYS if learns else ())
    optional = {f"learners/default_policy/{k}" for k in (OPTIONAL_LEARNER_KEYS if learns else ())}
    episodes = {f"env_runners/{k}" for k in EPISODE_KEYS}
    keys = (
        set(TOP_LEVEL_KEYS)
        | episodes
        | {f"env_runners/{k}" for k in ENV_RUNNER_KEYS}
        | {f"learners/default_policy/{k}" for k in module_keys}
        | {f"learners/__all_modules__/{k}" for k in ALL_MODULES_KEYS}
        | {f"timers/{k}_s" for k in timers}
        | {f"perf/{k}" for k in PERF_KEYS + (SYS_USAGE_KEYS if config.log_sys_usage else ())}
        | {f"fault_tolerance/{k}" for k in FAULT_TOLERANCE_KEYS}
    )
    evaluation: set[str] = set()
    open_prefixes: tuple[str, ...] = (CONFIG_PREFIX, "fault_tolerance/non_finite_fragments_by_env/")
    if config.evaluation_interval:
        if config.custom_evaluation_function is not None:
            open_prefixes += ("evaluation/",)
        else:
            evaluation = {
                f"evaluation/env_runners/{k}" for k in EVALUATION_ENV_RUNNER_KEYS + EPISODE_KEYS
            }
            episodes |= {f"evaluation/env_runners/{k}" for k in EPISODE_KEYS}
    return ResultSchema(
        keys=frozenset(keys | evaluation | optional),
        episode_keys=frozenset(episodes),
        evaluation_keys=frozenset(evaluation),
        open_prefixes=open_prefixes,
        callback_prefixes=callback_prefixes(config),
        optional_keys=frozenset(optional),
    )


def callback_prefixes(config) -> tuple[str, ...]:
    """Where the config's callbacks may log result keys of their own: ``()`` for none,
    ``EPISODE_CALLBACK_PREFIXES`` for episode hooks only (``env_runners/`` alone without
    evaluation), ``("",)`` (anywhere) once an
    algorithm-level hook is set. A hook counts when a ``callbacks_class`` overrides it or its
    ``on_*`` keyword is given; a class that does not import counts as every hook (``build()``
    reports it)."""
    from impala_jax.runtime import callbacks

    hooks = {h for h in callbacks.CALLBACK_KEYWORDS if getattr(config, h, None) is not None}
    classes = config.callbacks_class
    for cls in classes if isinstance(classes, list | tuple) else [classes]:
        if cls is None:
            continue
        try:
            cls = callbacks.resolve(cls, "callbacks_class")
        except ValueError:
            return ("",)
        if not isinstance(cls, type):
            return ("",)
        hooks |= {h for h in callbacks.SUPPORTED_HOOKS if callbacks.overrides(cls, h)}
    if hooks - set(callbacks.EPISODE_HOOKS):
        return ("",)
    if not hooks:
        return ()
    return EPISODE_CALLBACK_PREFIXES if config.evaluation_interval else ("env_runners/",)


def check_stop_keys(stop: dict, config) -> list[str]:
    """Raises RunError for stop keys ``train()`` can never report for ``config``.

    A key that is merely absent so far (no episode has finished yet, no evaluation has run)
    is fine: the run waits for it. Returns notes for keys accepted only because the
    configured callbacks may log them.
    """
    schema = result_schema(config)
    keys = sorted(schema.keys)
    impossible, notes = [], []
    for key in stop:
        if key in NOT_STOP_KEYS or key.startswith(CONFIG_PREFIX):
            raise RunError(f"stop key {key}: not a result that training moves (bookkeeping)")
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.75)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        if not schema.can_appear(key):
            impossible.append(key + hint)
        elif not schema.known(key):
            notes.append(
                f"stop key {key} is not a result impala_jax reports{hint}; kept because "
                "callbacks are configured and may log it"
            )
    if impossible:
        why = ""
        if any(k.startswith("evaluation/") for k in impossible) and not config.evaluation_interval:
            why = "; evaluation/... keys need evaluation(evaluation_interval=N)"
        raise RunError(
            f"stop key(s) that train() never reports for this config: {', '.join(impossible)}"
            f"{why}; impala_jax.cli.experiment.result_schema(config).keys lists every key"
        )
    return notes


# The attributes by which a module-level `args` is recognised as the namespace of RLlib's
# add_rllib_example_script_args (ray.rllib.examples.utils); every such namespace has them.
_EXAMPLE_ARG_MARKERS = ("stop_reward", "stop_iters", "stop_timesteps", "num_env_runners")
# What RLlib's run_rllib_example_script_experiment does with the rest, and why it has no
# counterpart here (impala_jax.run is the runner): an error when the value is not RLlib's
# default, so no argument is silently dropped.
_EXAMPLE_ARGS_WITHOUT_COUNTERPART = {
    "framework": "impala_jax runs JAX only",
    "num_agents": "multi-agent is not supported",
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
