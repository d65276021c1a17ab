"""Per-stage timers, episode statistics, the machine's CPU and memory use, and the nested-dict
merge that results are assembled with (rllib/results.py makes RLlib's result dict of them)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


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


def deep_merge(dst: dict, src: Mapping) -> dict:
    """`src` merged into `dst` (nested dicts merged, other values replaced); returns `dst`."""
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


class EpisodeStats:
    """The last ``window`` finished episodes (RLlib's metrics_num_episodes_for_smoothing).

    An env's own values of each episode (``Report.episode_values``: Craftax's achievements)
    are reported as their means over the same window, under their names split on ``/``;
    ``summarize(means) -> dict``, given those means and ``episode_return_mean``, adds what is
    derived from them (Craftax's scores, runtime/envs/craftax_envs.py).
    """

    def __init__(self, window: int, summarize: Callable[[dict], dict] | None = None):
        self._returns: deque = deque(maxlen=window)
        self._lengths: deque = deque(maxlen=window)
        self._values: dict[str, deque] = {}
        self._summarize = summarize
        self.num_episodes_lifetime = 0

    def add(
        self, episodes: list[tuple[float, int]], values: Mapping[str, Any] | None = None
    ) -> None:
        """``values``: ``{name: [len(episodes)]}``, the env's values of those episodes."""
        for ret, length in episodes:
            self._returns.append(ret)
            self._lengths.append(length)
        self.num_episodes_lifetime += len(episodes)
        for name, column in (values or {}).items():
            kept = self._values.setdefault(name, deque(maxlen=self._returns.maxlen))
            kept.extend(float(x) for x in np.asarray(column).reshape(-1))

    def get_state(self) -> dict:
        """The smoothing window and the lifetime count, as JSON (a checkpoint's counters)."""
        state = {
            "returns": [float(x) for x in self._returns],
            "lengths": [int(x) for x in self._lengths],
            "num_episodes_lifetime": self.num_episodes_lifetime,
        }
        if self._values:  # an env's own episode values (absent from older checkpoints)
            state["values"] = {k: list(v) for k, v in self._values.items()}
        return state

    def set_state(self, state: dict) -> None:
        self._returns.clear()
        self._lengths.clear()
        self._returns.extend(state.get("returns", ()))
        self._lengths.extend(state.get("lengths", ()))
        window = self._returns.maxlen
        self._values = {k: deque(v, maxlen=window) for k, v in state.get("values", {}).items()}
        self.num_episodes_lifetime = state["num_episodes_lifetime"]

    def result(self, num_new: int, num_env_steps: int) -> dict:
        r = np.asarray(self._returns, np.float64)
        n = np.asarray(self._lengths, np.float64)
        nan = float("nan")
        out = {
            "episode_return_mean": float(r.mean()) if r.size else nan,
            "episode_return_min": float(r.min()) if r.size else nan,
            "episode_return_max": float(r.max()) if r.size else nan,
            "episode_len_mean": float(n.mean()) if n.size else nan,
            "num_episodes": num_new,
            "num_episodes_lifetime": self.num_episodes_lifetime,
            "num_env_steps_sampled": num_env_steps,
        }
        means = {k: float(np.mean(v)) if v else nan for k, v in self._values.items()}
        if means and self._summarize is not None:
            means.update(
                self._summarize({**means, "episode_return_mean": out["episode_return_mean"]})
            )
        for name, value in means.items():
            *path, leaf = name.split("/")
            node = out
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out


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
