"""What ``train()`` can report for a config (``result_schema``), as slash paths: a stop key that
can never appear fails before anything is built."""

from __future__ import annotations

import dataclasses

from impala_jax.core import learner_metrics

# What train() returns, section by section, as slash paths. The learner's metrics come from
# their declaration (core/learner_metrics.py); the rest is written from the code that fills
# each section (results.train_result, metrics.EpisodeStats.result, the stage timers of
# env_runner / env_runner_group / buffers / algorithm, EnvRunnerGroup.fault_tolerance_metrics,
# evaluation.Evaluator). tests/test_experiment.py holds it equal to real results, so a key
# added there fails a test until it is listed here.
TOP_LEVEL_KEYS = (
    "num_env_steps_sampled_lifetime",
    "num_env_steps_trained_lifetime",
    "num_episodes_lifetime",
    "num_training_step_calls_per_iteration",
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    # Ray Tune's Trainable bookkeeping (results.trainable_info), as in RLlib's results.
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
# The learner's metrics (core/learner_metrics.py); those reported for some configs only:
# entropy / its maximum (none for Box), the encoder's feature diagnostics (not for LSTMs).
LEARNER_KEYS = tuple(k for k, m in learner_metrics.REPORTED.items() if not m.optional)
OPTIONAL_LEARNER_KEYS = tuple(k for k, m in learner_metrics.REPORTED.items() if m.optional)
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
# A multi-agent run's engine (runtime/multiagent/engine.py): it waits for its runners' steps
# and lays out the [M, T, C] batch; its runners are not timed by stage.
MULTI_AGENT_TIMERS = ("sample_wait", "batch")
MULTI_AGENT_FAULT_TOLERANCE_KEYS = (
    "num_healthy_workers",
    "num_remote_worker_restarts",
    "num_dropped_columns",
)
# Per module (policy id) and per agent: RLlib's multi-agent episode means, after an episode.
MODULE_RETURNS = "env_runners/module_episode_returns_mean/"
AGENT_RETURNS = "env_runners/agent_episode_returns_mean/"
ITERATION_TIMERS = ("learner_fetch",)
# Callbacks (impala_jax.rllib.callbacks) log where RLlib's do: episode hooks under env_runners/
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
    modules = list(config.policies) if config.is_multi_agent else ["default_policy"]
    fault_keys = FAULT_TOLERANCE_KEYS
    open_prefixes: tuple[str, ...] = (CONFIG_PREFIX, "fault_tolerance/non_finite_fragments_by_env/")
    episodes = {f"env_runners/{k}" for k in EPISODE_KEYS}
    if config.is_multi_agent:  # rllib/multi_agent.py
        timers = MULTI_AGENT_TIMERS + LEARNER_TIMERS + ITERATION_TIMERS
        module_keys += ("policy_lag_mean",)  # each policy's own (runtime/multiagent/engine.py)
        fault_keys = MULTI_AGENT_FAULT_TOLERANCE_KEYS
        episodes |= {f"{MODULE_RETURNS}{m}" for m in modules}
        open_prefixes += (AGENT_RETURNS,)  # the env's agent ids
    optional = {
        f"learners/{m}/{k}" for m in modules for k in (OPTIONAL_LEARNER_KEYS if learns else ())
    }

    keys = (
        set(TOP_LEVEL_KEYS)
        | episodes
        | {f"env_runners/{k}" for k in ENV_RUNNER_KEYS}
        | {f"learners/{m}/{k}" for m in modules for k in module_keys}
        | {f"learners/__all_modules__/{k}" for k in ALL_MODULES_KEYS}
        | {f"timers/{k}_s" for k in timers}
        | {f"perf/{k}" for k in PERF_KEYS + (SYS_USAGE_KEYS if config.log_sys_usage else ())}
        | {f"fault_tolerance/{k}" for k in fault_keys}
    )
    evaluation: set[str] = set()
    if config.evaluation_interval:
        if config.custom_evaluation_function is not None:
            open_prefixes += ("evaluation/",)
        else:
            evaluation = {
                f"evaluation/env_runners/{k}" for k in EVALUATION_ENV_RUNNER_KEYS + EPISODE_KEYS
            }
            if config.is_multi_agent:
                open_prefixes += tuple(f"evaluation/{p}" for p in (MODULE_RETURNS, AGENT_RETURNS))
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
    from impala_jax.rllib import callbacks

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
