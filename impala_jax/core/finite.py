"""What counts as a non-finite column of a batch: one rule, written once for an array module.

The runners' fragment door (`runtime/learning/buffers.py`) applies it with NumPy on the host, to
drop a fragment before it is batched; the learner step (`core/update.py`) applies it with
`jax.numpy` inside the compiled program, to keep a column that got past the door out of the replay
ring. Both must call the same thing non-finite, or a fragment the door lets through could be one the
replay write refuses (or the reverse).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def non_finite_columns(x: Any, xp: Any = np) -> Any:
    """bool ``[B]``: which columns (axis 1) of the leaf ``x`` hold a NaN or an inf anywhere.

    ``x`` is a time-major leaf ``[T, B, ...]`` (or a recurrent ``core_state`` ``[K, B, ...]``:
    axis 1 is the column there too). None for a leaf that cannot hold a non-finite value by its
    type or shape: an integer or bool array, or one with fewer than 2 axes (``param_version
    [B]``). ``xp`` is the array module, ``numpy`` or ``jax.numpy``.
    """
    # By exclusion, not "is it floating": NumPy does not count bfloat16 as np.floating and JAX
    # does, and the two modules must agree on every dtype.
    if x.ndim < 2 or x.dtype == bool or xp.issubdtype(x.dtype, xp.integer):
        return None
    return ~xp.all(xp.isfinite(x).reshape(x.shape[0], x.shape[1], -1), axis=(0, 2))
