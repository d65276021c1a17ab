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

from typing import Any, NamedTuple

import flax.struct
import jax
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


@flax.struct.dataclass
class LearnerState:
    """Everything the learner step reads and writes; a plain pytree, donated every step."""

    params: Any
    opt_state: Any
    update_step: jax.Array  # int32 scalar: learner updates applied
    key: jax.Array
