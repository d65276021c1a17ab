"""Per-stage timers, episode statistics and the nested result dict of ``train()``."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from impala_jax.core.learner_metrics import read_metric
from impala_jax.runtime.metrics_logger import deep_merge


class Timers:
    """Accumulated seconds and counts per stage; one per thread that owns stages."""

    def __init__(self):
        self._lock = threading.Lock()
        self._total: dict[str, float] = {}
        self._count: dict[str, int] = {}

    @contextlib.contextmanager
    def time(self, stage: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - started)

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._total[stage] = self._total.get(stage, 0.0) + seconds
            self._count[stage] = self._count.get(stage, 0) + 1

    def drain(self) -> dict[str, tuple[float, int]]:
        """Seconds and counts since the last drain."""
        with self._lock:
            out = {k: (v, self._count[k]) for k, v in self._total.items()}
            self._total.clear()
            self._count.clear()
        return out


def merge_timers(drained: list[dict[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    out: dict[str, tuple[float, int]] = {}
    for d in drained:
        for k, (s, n) in d.items():
            s0, n0 = out.get(k, (0.0, 0))
            out[k] = (s0 + s, n0 + n)
    return out


class EpisodeStats:
    """The last ``window`` finished episodes (RLlib's metrics_num_episodes_for_smoothing)."""

    def __init__(self, window: int):
        self._returns: deque = deque(maxlen=window)
        self._lengths: deque = deque(maxlen=window)
        self.num_episodes_lifetime = 0

    def add(self, episodes: list[tuple[float, int]]) -> None:
        for ret, length in episodes:
            self._returns.append(ret)
            self._lengths.append(length)
        self.num_episodes_lifetime += len(episodes)

    def get_state(self) -> dict:
        """The smoothing window and the lifetime count, as JSON (a checkpoint's counters)."""
        return {
            "returns": [float(x) for x in self._returns],
            "lengths": [int(x) for x in self._lengths],
            "num_episodes_lifetime": self.num_episodes_lifetime,
        }

    def set_state(self, state: dict) -> None:
        self._returns.clear()
        self._lengths.clear()
        self._returns.extend(state.get("returns", ()))
        self._lengths.extend(state.get("lengths", ()))
        self.num_episodes_lifetime = state["num_episodes_lifetime"]

    def result(self, num_new: int, num_env_steps: int) -> dict:
        r = np.asarray(self._returns, np.float64)
        n = np.asarray(self._lengths, np.float64)
        nan = float("nan")
        return {
            "episode_return_mean": float(r.mean()) if r.size else nan,
            "episode_return_min": float(r.min()) if r.size else nan,
            "episode_return_max": float(r.max()) if r.size else nan,
            "episode_len_mean": float(n.mean()) if n.size else nan,
            "num_episodes": num_new,
            "num_episodes_lifetime": self.num_episodes_lifetime,
            "num_env_steps_sampled": num_env_steps,
        }


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
    learner.update(
        module_steps,
        num_env_steps_trained=trained,
        num_updates_lifetime=num_updates_lifetime,
        default_optimizer_learning_rate=read_metric(learner, "curr_lr", float("nan")),
        effective_train_batch_size_per_learner=batch_size_per_learner,
        effective_total_train_batch_size=total_batch_size,
    )
    return {
        "env_runners": env_runners,
        "learners": {
            "default_policy": learner,
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


class SysUsage:
    """``debugging(log_sys_usage=True)``: RLlib's (Ray Tune's) ``perf/cpu_util_percent`` and
    ``perf/ram_util_percent`` for the machine.

    Tune samples psutil every 0.7 s in a thread and reports the means; here the CPU share is
    measured over the whole iteration (the mean of every sample there could be) and the memory
    share at its end. psutil when installed, else Linux's /proc; with neither, nothing is
    reported and a warning says so.
    """

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self._psutil = psutil
        self._last_cpu = self._cpu_times()
        if psutil is None and self._last_cpu is None:
            logging.getLogger(__name__).warning(
                "debugging(log_sys_usage=True): neither psutil nor /proc is available, so "
                "perf/cpu_util_percent and perf/ram_util_percent are not reported; install "
                "psutil or set log_sys_usage=False."
            )
        elif psutil is not None:
            psutil.cpu_percent(interval=None)  # starts psutil's interval at build

    @staticmethod
    def _cpu_times() -> tuple[float, float] | None:
        """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
        try:
            with open("/proc/stat") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        total = sum(fields[:8])  # guest time is already counted in user time
        return total - idle, total

    def result(self) -> dict:
        """CPU use since the last call (percent of all cores) and memory in use (percent)."""
        if self._psutil is not None:
            return {
                "cpu_util_percent": float(self._psutil.cpu_percent(interval=None)),
                "ram_util_percent": float(self._psutil.virtual_memory().percent),
            }
        now, last = self._cpu_times(), self._last_cpu
        if now is None or last is None:
            return {}
        self._last_cpu = now
        out = {}
        if now[1] > last[1]:
            out["cpu_util_percent"] = 100.0 * (now[0] - last[0]) / (now[1] - last[1])
        try:
            meminfo = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, value = line.split(":", 1)
                    meminfo[key] = float(value.split()[0])
            total = meminfo["MemTotal"]
            out["ram_util_percent"] = 100.0 * (total - meminfo["MemAvailable"]) / total
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            pass
        return out
