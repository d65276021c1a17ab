"""Per-stage timers, episode statistics and the nested result dict of ``train()``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
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
