"""RLlib's result dict of one ``train()`` iteration, the keys Ray Tune's Trainable adds to it, and
reading a result by Tune's slash paths (``"env_runners/episode_return_mean"``)."""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import Any

import numpy as np

from impala_jax.core.learner_metrics import read_metric
from impala_jax.runtime.metrics import deep_merge


def lookup(result: dict, path: str, missing: Any = None) -> float | None:
    """The number at Tune's slash ``path`` (``"env_runners/episode_return_mean"``).

    ``missing`` when the path or a number is not there; None when the value is NaN.
    """
    node: Any = result
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return missing
        node = node[part]
    try:
        value = float(node)
    except (TypeError, ValueError):
        return missing
    return value if value == value else None


def flatten(result: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in result.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def train_result(
    *,
    env_runners: dict,
    episode_metrics: dict,
    learner: dict,
    timers: dict[str, tuple[float, int]],
    lag: np.ndarray,
    sampled: int,
    trained: int,
    elapsed: float,
    num_env_steps_sampled_lifetime: int,
    num_env_steps_trained_lifetime: int,
    num_updates_lifetime: int,
    num_episodes_lifetime: int,
    num_trainable_parameters: int,
    num_training_step_calls: int,
    training_iteration: int,
    time_total_s: float,
    batch_size_per_learner: int,
    total_batch_size: int,
    learner_queue_size: int,
    sys_usage: dict,
    fault_tolerance: dict,
    trainable: dict,
) -> dict:
    """RLlib's nested result dict of one ``train()`` iteration, plus impala_jax's perf/ and
    fault_tolerance/.

    ``env_runners``: `EpisodeStats.result` of the iteration, to which ``episode_metrics`` (what
    on_episode_* callbacks logged) are merged; ``learner``: the learner's metrics as floats
    (updated in place with the step counts); ``timers``: merged `Timers.drain` results; ``lag``:
    the policy lag of every row trained on; ``sampled`` / ``trained``: the iteration's env
    steps; ``batch_size_per_learner``: train_batch_size_per_learner rounded up to whole
    fragments, ``total_batch_size`` over every learner; ``trainable``: `trainable_info`.
    """
    env_runners["num_env_steps_sampled_lifetime"] = num_env_steps_sampled_lifetime
    deep_merge(env_runners, episode_metrics)
    module_steps = {
        "num_module_steps_trained": trained,
        "num_module_steps_trained_lifetime": num_env_steps_trained_lifetime,
    }
    # One module's metrics, or a multi-agent run's {module id: metrics} (rllib/multi_agent.py).
    modules = learner if learner and all(isinstance(v, dict) for v in learner.values()) else None
    for metrics in (modules or {"default_policy": learner}).values():
        metrics.update(
            module_steps,
            num_env_steps_trained=trained,
            num_updates_lifetime=num_updates_lifetime,
            default_optimizer_learning_rate=read_metric(metrics, "curr_lr", float("nan")),
            effective_train_batch_size_per_learner=batch_size_per_learner,
            effective_total_train_batch_size=total_batch_size,
        )
    return {
        "env_runners": env_runners,
        "learners": {
            **(modules or {"default_policy": learner}),
            "__all_modules__": dict(
                module_steps,
                num_env_steps_trained=trained,
                num_env_steps_trained_lifetime=num_env_steps_trained_lifetime,
                num_trainable_parameters=num_trainable_parameters,
            ),
        },
        "num_env_steps_sampled_lifetime": num_env_steps_sampled_lifetime,
        "num_env_steps_trained_lifetime": num_env_steps_trained_lifetime,
        "num_episodes_lifetime": num_episodes_lifetime,
        "num_training_step_calls_per_iteration": num_training_step_calls,
        "training_iteration": training_iteration,
        "time_this_iter_s": elapsed,
        "time_total_s": time_total_s,
        "timers": {f"{k}_s": v for k, (v, _) in sorted(timers.items())},
        "perf": {
            "env_steps_sampled_per_s": sampled / elapsed,
            "env_steps_trained_per_s": trained / elapsed,
            "policy_lag_mean": float(lag.mean()),
            "policy_lag_max": int(lag.max()),
            "learner_queue_size": learner_queue_size,
            **sys_usage,
        },
        "fault_tolerance": fault_tolerance,
        **trainable,
    }


def trainable_info(iterations_since_restore: int, time_since_restore: float, config: dict) -> dict:
    """The keys Ray Tune's Trainable adds to every result, which RLlib's results carry."""
    now = time.time()
    hostname = socket.gethostname()
    return {
        "done": False,
        "config": config,
        "iterations_since_restore": iterations_since_restore,
        "time_since_restore": time_since_restore,
        "timestamp": int(now),
        "date": time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)),
        "pid": os.getpid(),
        "hostname": hostname,
        "node_ip": _node_ip(hostname),
    }


@functools.cache
def _node_ip(hostname: str) -> str:
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return "127.0.0.1"
