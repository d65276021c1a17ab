"""The data that crosses module boundaries, and the conventions it follows.

Time-major throughout: ``T`` = ``rollout_fragment_length``, ``B`` = trajectories (envs).

``obs`` is ``[T+1, B, ...]``: row ``T`` is the bootstrap observation and becomes row 0 of the
next fragment. Every other field is ``[T, B, ...]``. Row ``t`` holds ``obs[t]``, the
``action[t]`` taken there, the ``behaviour_logits[t]`` it was sampled from (never recomputed),
and the ``reward[t]``, ``terminated[t]``, ``truncated[t]`` that resulted.

envpool and gymnasium >= 1.0 autoreset on the *next* step: the step that ends an episode returns
the final observation, the step after it ignores the action and returns the reset observation
with reward 0. A row whose ``obs[t]`` is such a final observation is not a transition; its
``valid[t]`` is 0, so the loss masks it and V-trace gets ``rho = 0`` there. With
``discount[t] = gamma * (1 - terminated[t])`` this reproduces per-episode V-trace exactly, for
termination and for truncation (which bootstraps from V(final obs)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# The one name of the data-parallel mesh axis; the learner averages grads and metrics over it.
LEARNER_AXIS = "learner"


class Trajectory(NamedTuple):
    """One fragment from one EnvRunner: ``[T+1, B]`` obs, ``[T, B]`` everything else."""

    obs: np.ndarray  # [T+1, B, *obs_shape]
    action: np.ndarray  # [T, B, *action_shape]
    behaviour_logits: np.ndarray  # [T, B, P] distribution inputs the action was sampled from
    reward: np.ndarray  # [T, B] float32, raw (clipping happens in the loss)
    terminated: np.ndarray  # [T, B] bool
    truncated: np.ndarray  # [T, B] bool
    valid: np.ndarray  # [T, B] float32: 0 where obs[t] is a final observation (reset row)
    param_version: np.ndarray  # [B] int32: ParamStore version the fragment was sampled with
    # Recurrent policies only (model_config use_lstm; None otherwise), see recurrent.py:
    core_state: Any = None  # pytree of [K, B, cell]: the core state before rows 0, L, 2L, ...
    prev_action: np.ndarray | None = None  # [T+1, B, *action_shape]: the action of row t-1
    prev_reward: np.ndarray | None = None  # [T+1, B] float32: the reward of row t-1
    reset: np.ndarray | None = None  # [T+1, B] bool: obs[t] is an episode's first observation


# The learner consumes the same fields, stacked along B and placed on the learner devices.
Batch = Trajectory

# Fields with T+1 rows: row T is where the next fragment starts (its row 0).
BOOTSTRAP_FIELDS = ("obs", "prev_action", "prev_reward", "reset")


def empty_trajectory(
    T: int,
    obs: Any,
    action: Any,
    dist_inputs: Any,
    *,
    core_state: Any = None,
    chunks: int = 0,
    alloc: Callable = np.zeros,
) -> Trajectory:
    """A fragment of ``T`` rows for ``B`` envs, every field allocated by ``alloc`` (``np.zeros``
    or ``np.empty``): the one place the layout above is written. Runners fill it row by row;
    the learner compiles for it and shapes its replay slots like it.

    ``obs``, ``action``, ``dist_inputs``: one row for the ``B`` envs (arrays or
    ``jax.ShapeDtypeStruct``), ``[B, *obs_shape]``, ``[B, *action_shape]`` and ``[B, P]``;
    observations are held in the dtype JAX computes with (int64 as int32 without x64), so that
    every producer's batches and the learner's example agree. ``core_state``: a recurrent
    policy's state for the ``B`` envs (a pytree of ``[B, ...]``), kept before each of the
    ``chunks`` chunks of the fragment; None for a feedforward policy.
    """
    B = obs.shape[0]

    def rows(n: int, like: Any, dtype: Any = None) -> np.ndarray:
        return alloc((n, *like.shape), like.dtype if dtype is None else dtype)

    row = jax.ShapeDtypeStruct((B,), np.float32)
    recurrent = {}
    if core_state is not None:
        recurrent = dict(
            core_state=jax.tree.map(lambda x: rows(chunks, x), core_state),
            prev_action=rows(T + 1, action),
            prev_reward=rows(T + 1, row),
            reset=rows(T + 1, row, bool),
        )
    return Trajectory(
        obs=rows(T + 1, obs, jax.dtypes.canonicalize_dtype(obs.dtype)),
        action=rows(T, action),
        behaviour_logits=rows(T, dist_inputs, np.float32),
        reward=rows(T, row),
        terminated=rows(T, row, bool),
        truncated=rows(T, row, bool),
        valid=rows(T, row),
        param_version=alloc((B,), np.int32),
        **recurrent,
    )


def with_bootstrap(rows: Trajectory, **last: Any) -> Trajectory:
    """``rows`` (``T`` stacked rows, as a ``lax.scan`` returns them) with row ``T`` of each
    `BOOTSTRAP_FIELDS` field in ``last`` appended."""
    return rows._replace(
        **{
            name: jnp.concatenate([getattr(rows, name), value[None]])
            for name, value in last.items()
        }
    )


@flax.struct.dataclass
class LearnerState:
    """Everything the learner step reads and writes; a plain pytree, donated every step."""

    params: Any
    opt_state: Any
    update_step: jax.Array  # int32 scalar: learner updates applied
    key: jax.Array
