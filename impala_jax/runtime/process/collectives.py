"""The collectives between the processes of a run, each one under the watchdog.

`allgather` and `broadcast` move host arrays (64-bit integers as exact int32 pairs:
`to_int32_words`); `allgather_rows`, `allgather_json`, `broadcast_json` and `broadcast_tree`
carry rows of different lengths, JSON-able values and pytrees. With one process each returns
its input unchanged (gathered over a leading axis of 1) and starts no collective.
"""

from __future__ import annotations

import json

import numpy as np

from impala_jax.runtime.process import roles
from impala_jax.runtime.process.watchdog import collective


def to_int32_words(values: np.ndarray) -> np.ndarray:
    """Integers of up to 62 bits as int32 pairs [..., 2] (high, low 31 bits): without x64, JAX
    would truncate int64 to int32, and env-step counters pass 2^31 in long runs."""
    values = np.asarray(values, np.int64)
    if np.any(np.abs(values) >= 2**62):
        raise OverflowError(f"a value of {values.ravel()[:4]} does not fit 62 bits")
    return np.stack([values >> 31, values & (2**31 - 1)], axis=-1).astype(np.int32)


def from_int32_words(words: np.ndarray) -> np.ndarray:
    words = np.asarray(words, np.int64)
    return (words[..., 0] << 31) + words[..., 1]


def allgather(values, what: str, extra_s: float = 0.0) -> np.ndarray:
    """Every process's ``values`` (same shape and dtype on each): an array [processes, ...].
    64-bit integers travel as int32 pairs, so they arrive exact."""
    values = np.asarray(values)
    if roles.process_count() == 1:
        return values[None]
    from jax.experimental import multihost_utils  # slow to import: only with others

    wide = values.dtype in (np.int64, np.uint64)
    sent = to_int32_words(values) if wide else values
    got = collective(lambda: multihost_utils.process_allgather(sent), what, extra_s)
    got = np.asarray(got).reshape(roles.process_count(), *sent.shape)
    return from_int32_words(got).astype(values.dtype) if wide else got


def broadcast(values, what: str, extra_s: float = 0.0) -> np.ndarray:
    """Process 0's ``values`` on every process (the others pass an array of the same shape)."""
    values = np.asarray(values)
    if roles.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(
        collective(lambda: multihost_utils.broadcast_one_to_all(values), what, extra_s)
    )


def _padded(n: int) -> int:
    """Sizes rounded up to a power of two: few distinct shapes, few compiled collectives."""
    return 1 << max(0, int(n) - 1).bit_length()


def _json(obj) -> bytes:
    """JSON bytes; numpy values as lists or numbers, anything else as its str."""
    plain = lambda o: o.tolist() if hasattr(o, "tolist") else str(o)  # noqa: E731
    return json.dumps(obj, default=plain).encode()


def allgather_rows(rows: np.ndarray, what: str) -> np.ndarray:
    """Every process's rows [n_i, k] concatenated in process order: [sum n_i, k]."""
    rows = np.asarray(rows)
    counts = allgather(np.int64(len(rows)), what)
    size = _padded(int(counts.max()))
    padded = np.zeros((size, *rows.shape[1:]), rows.dtype)
    padded[: len(rows)] = rows
    gathered = allgather(padded, what)
    return np.concatenate([gathered[i, : int(n)] for i, n in enumerate(counts)])


def allgather_json(obj, what: str) -> list:
    """Every process's JSON-able ``obj``, in process order."""
    data = np.frombuffer(_json(obj), np.uint8)
    counts = allgather(np.int64(len(data)), what)
    padded = np.zeros(_padded(int(counts.max())), np.uint8)
    padded[: len(data)] = data
    gathered = allgather(padded, what)
    return [json.loads(bytes(gathered[i, : int(n)])) for i, n in enumerate(counts)]


def broadcast_json(obj, what: str, extra_s: float = 0.0):
    """Process 0's JSON-able ``obj`` on every process (the others' ``obj`` is ignored)."""
    data = np.frombuffer(_json(obj), np.uint8) if roles.is_primary() else None
    size = broadcast(np.int64(len(data) if data is not None else 0), what, extra_s)
    padded = np.zeros(_padded(int(size)), np.uint8)
    if data is not None:
        padded[: len(data)] = data
    padded = broadcast(padded, what)
    return json.loads(bytes(padded[: int(size)]))


def broadcast_tree(tree, what: str):
    """Process 0's pytree of host arrays on every process (the others pass one of the same
    shapes and dtypes)."""
    if roles.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    got = collective(lambda: multihost_utils.broadcast_one_to_all(tree), what)
    return [np.asarray(x) for x in got] if isinstance(tree, list) else got
