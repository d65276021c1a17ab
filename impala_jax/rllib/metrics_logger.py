"""The MetricsLogger that callbacks log custom metrics to (RLlib's ``MetricsLogger``).

``log_value(key, value, reduce=..., window=..., clear_on_reduce=...)`` with RLlib 2.60's
reductions and defaults; tuple keys nest. Thread-safe: episode callbacks log from the runner
threads. ``reduce()`` returns the nested dict a result merges in (``deep_merge``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

# reduce= values: per-result ones start afresh after each result; the others carry over.
_PER_RESULT = ("mean", "min", "max", "sum", "item", "item_series")
REDUCTIONS = _PER_RESULT + ("ema", "lifetime_sum")
_UNSET = object()


def _number(value: Any, key: tuple) -> Any:
    """A Python number from an int, a float, or a one-element array (numpy, jax, torch)."""
    if hasattr(value, "item") and not isinstance(value, int | float):
        try:
            return value.item()
        except (ValueError, RuntimeError) as err:
            raise TypeError(
                f"log_value({'/'.join(key)!r}): expected a single number, got an array of shape "
                f"{getattr(value, 'shape', '?')}; log one value per call, or use reduce='item'."
            ) from err
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"log_value({'/'.join(key)!r}): expected a number, got {type(value).__name__}; use "
            "reduce='item' or 'item_series' for other values."
        )
    return value


def _finite(values: Iterable) -> list:
    return [v for v in values if not (isinstance(v, float) and math.isnan(v))]


class _Stat:
    """The values logged under one key and how they reduce."""

    def __init__(self, reduce: str, window: int | None, ema_coeff: float | None):
        self.reduce, self.window, self.ema_coeff = reduce, window, ema_coeff
        self.values: deque = deque(maxlen=1 if reduce == "item" else window)
        self.total = 0  # lifetime_sum
        self.ema = math.nan

    def push(self, value: Any, key: tuple) -> None:
        if self.reduce in ("item", "item_series"):
            self.values.append(value)
            return
        value = _number(value, key)
        if self.reduce == "lifetime_sum":
            self.total += value
        elif self.reduce == "ema":
            if not math.isnan(value):
                c = self.ema_coeff
                self.ema = value if math.isnan(self.ema) else c * value + (1 - c) * self.ema
        else:
            self.values.append(value)

    def peek(self) -> Any:
        r = self.reduce
        if r == "ema":
            return self.ema
        if r == "lifetime_sum":
            return self.total
        if r == "item":
            return self.values[-1] if self.values else None
        if r == "item_series":
            return list(self.values)
        values = _finite(self.values)
        if not values:
            return math.nan  # RLlib's value for a period without values
        if r == "mean":
            return sum(values) / len(values)
        return {"min": min, "max": max, "sum": sum}[r](values)

    def reduce_now(self) -> Any:
        out = self.peek()
        if self.reduce in _PER_RESULT:
            self.values.clear()
        return out


def _key(key: Any) -> tuple:
    key = tuple(key) if isinstance(key, tuple | list) else (key,)
    if not key or not all(isinstance(k, str) and k for k in key):
        raise TypeError(f"a metrics key is a string or a tuple of strings, got {key!r}.")
    return key


def _nest(flat: Mapping[tuple, Any]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


class MetricsLogger:
    """RLlib's MetricsLogger for custom metrics: ``log_value``, ``log_dict``, ``log_time``,
    ``peek``. Thread-safe: runner threads log into one logger.

    ``reduce`` (RLlib 2.60's names and defaults): "mean", "min", "max", "sum" over the values
    logged since the last result (``window=N``: the last N of them; NaN when there were none);
    "ema" (the default; ``ema_coeff`` default 0.01) and "lifetime_sum" (also
    ``reduce="sum", clear_on_reduce=False``) carry over between results; "item" is the last
    value, "item_series" the list of values since the last result. A tuple key nests:
    ``("a", "b")`` is ``result[...]["a"]["b"]``. A key's reduction is fixed by its first call.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self._stats: dict[tuple, _Stat] = {}

    def log_value(
        self,
        key,
        value,
        *,
        reduce: str | None = None,
        window: int | float | None = None,
        ema_coeff: float | None = None,
        percentiles=None,
        clear_on_reduce=_UNSET,
        with_throughput: bool | None = None,
    ) -> None:
        key = _key(key)
        if percentiles:
            raise ValueError(f"log_value({'/'.join(key)!r}): percentiles are not supported here.")
        if with_throughput:
            raise ValueError(
                f"log_value({'/'.join(key)!r}): with_throughput is not supported here; divide by "
                "the result's time_this_iter_s."
            )
        with self.lock:
            stat = self._stats.get(key)
            if stat is None:
                stat = self._new(key, reduce, window, ema_coeff, clear_on_reduce)
            elif self._conflicts(stat, reduce, window, clear_on_reduce):
                raise ValueError(
                    f"log_value({'/'.join(key)!r}, reduce={reduce!r}, window={window!r}): this "
                    f"key was first logged with reduce={stat.reduce!r}, window={stat.window!r}; "
                    "a key keeps its reduction."
                )
            stat.push(value, key)

    @staticmethod
    def _conflicts(stat: _Stat, reduce, window, clear_on_reduce) -> bool:
        if reduce == "sum" and clear_on_reduce is False:
            reduce = "lifetime_sum"
        return (reduce is not None and reduce != stat.reduce) or (
            window is not None and window != stat.window
        )

    def _new(self, key, reduce, window, ema_coeff, clear_on_reduce) -> _Stat:
        name = "/".join(key)
        if reduce is None:
            reduce = "mean" if window is not None else "ema"  # RLlib's defaults
        if reduce == "sum" and clear_on_reduce is False:
            reduce = "lifetime_sum"
        elif clear_on_reduce is False:
            raise ValueError(
                f"log_value({name!r}, reduce={reduce!r}, clear_on_reduce=False): only sums can "
                "carry over (reduce='lifetime_sum'); for a running mean use reduce='ema' or a "
                "window."
            )
        if reduce not in REDUCTIONS:
            raise ValueError(
                f"log_value({name!r}): reduce={reduce!r}; expected one of {REDUCTIONS}."
            )
        if window == math.inf:
            window = None
        if window is not None and (
            reduce not in ("mean", "min", "max", "sum")
            or isinstance(window, bool)
            or not isinstance(window, int)
            or window < 1
        ):
            raise ValueError(
                f"log_value({name!r}, window={window!r}): a window is an int >= 1, for reduce "
                "mean, min, max or sum."
            )
        if ema_coeff is not None and (reduce != "ema" or not 0 < ema_coeff <= 1):
            raise ValueError(
                f"log_value({name!r}, ema_coeff={ema_coeff!r}): only with reduce='ema', in (0, 1]."
            )
        for other in self._stats:
            shorter, longer = sorted((other, key), key=len)
            if longer[: len(shorter)] == shorter:
                raise ValueError(
                    f"log_value({name!r}): {'/'.join(other)!r} is already logged; a key cannot "
                    "hold both a value and nested keys."
                )
        stat = _Stat(reduce, window, 0.01 if ema_coeff is None else ema_coeff)
        self._stats[key] = stat
        return stat

    def log_dict(self, value_dict: Mapping, *, key=None, reduce: str | None = "mean", **kwargs):
        """Logs every leaf of a nested dict, under ``key`` if given (RLlib's default "mean")."""
        prefix = _key(key) if key is not None else ()

        def walk(d: Mapping, path: tuple) -> None:
            for k, v in d.items():
                if isinstance(v, Mapping):
                    walk(v, path + (k,))
                else:
                    self.log_value(path + (k,), v, reduce=reduce, **kwargs)

        with self.lock:
            walk(value_dict, prefix)

    @contextlib.contextmanager
    def log_time(self, key, *, reduce: str | None = "ema", **kwargs):
        """``with logger.log_time(key): ...`` logs the block's duration in seconds."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.log_value(key, time.perf_counter() - started, reduce=reduce, **kwargs)

    def __contains__(self, key) -> bool:
        key = _key(key)
        with self.lock:
            return any(k[: len(key)] == key for k in self._stats)

    def peek(self, key=None, default=None) -> Any:
        """The current reduced value(s) under ``key`` (None: all) without resetting them; a
        nested dict for a key that has nested keys. A missing key returns ``default``, or raises
        KeyError when ``default`` is None (RLlib's behaviour)."""
        with self.lock:
            if key is None:
                return _nest({k: s.peek() for k, s in self._stats.items()})
            key = _key(key)
            if key in self._stats:
                return self._stats[key].peek()
            below = {
                k[len(key) :]: s.peek() for k, s in self._stats.items() if k[: len(key)] == key
            }
        if below:
            return _nest(below)
        if default is None:
            raise KeyError(f"no metric {'/'.join(key)!r} has been logged")
        return default

    def reduce(self) -> dict:
        """Every metric as a nested dict, starting the next period (what a result gets)."""
        with self.lock:
            return _nest({k: s.reduce_now() for k, s in self._stats.items()})
