"""What a run's engine is: the one thing that produces batches and trains on them.

``IMPALA`` (rllib/algorithm.py) runs the same iteration loop whatever executes it; how a run
executes is the engine it holds, not a branch in that loop:

- ``HostEngine`` (runtime/acting/host_engine.py): envs stepped on the host by runner threads, or by
the
  main thread in lockstep; each update takes the next batch from the runners and hands it to
  the ``Learner``. The debug samplers (``fake_sampler``, skipped learners) are its options, and
  agreement across processes wraps its batch source (runtime/process/agreement.py).
- ``DeviceEngine`` (runtime/ondevice/device_engine.py): envs written in JAX, rolled out and trained
on in
  one compiled program per update; over a member axis it runs several seeds side by side
  (rllib/seed_group.py).

Every engine has members, runs trained side by side: one, or a group of seeds. Its ``Report``
and the metrics of its ``Update`` hold each member's values (a leading member axis in a group).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Update:
    """One learner update as the iteration loop books it."""

    metrics: dict[str, Any]  # the learner's metrics, still on device
    lag: np.ndarray  # int [columns]: updates between the acting params and these, per column
    env_steps_trained: int  # the columns trained on, new and replayed, in env steps


@dataclass(frozen=True)
class Report:
    """What an engine gathered since the last ``drain``: the iteration's result reads it."""

    episodes: list[list[tuple[float, int]]]  # per member: (return, length) of ended episodes
    episode_metrics: dict = field(default_factory=dict)  # what episode callbacks logged
    # per member: {name: [episodes]}, an env's own metrics of the episodes in ``episodes``
    # (on device: core/rollout.py's ``Episodes.metrics``); empty where an engine has none.
    episode_values: list[dict] = field(default_factory=list)
    timers: list[dict] = field(default_factory=list)  # its threads' stage timers
    queue_size: int = 0  # batches waiting for the learner
    fault_tolerance: dict = field(default_factory=dict)  # fault_tolerance/... of the result


@dataclass(frozen=True)
class HostEngineSpec:
    """How the host engine feeds the learner (rllib/specs.py builds it from the config)."""

    minibatch_buffer_size: int  # device batches kept for reuse (RLlib's minibatch buffer)
    num_epochs: int  # uses of each batch in that buffer
    fake_sampler: bool  # debugging(fake_sampler=True): the first batch, over and over
    sample_only: bool  # _env_runners_only / _skip_learners: sample, never train
    env_steps_trained_per_update: int  # new and replayed columns, in env steps


@dataclass(frozen=True)
class DeviceSpec:
    """An on-device run's rollout (rllib/specs.py builds it from the config)."""

    env: str  # the env's id, for messages
    num_envs: int  # num_envs_per_env_runner x max(1, num_env_runners)
    rollout_fragment_length: int
    policy_lag: int
    explore: bool
    normalize_actions: bool
    clip_actions: bool


class Engine(Protocol):
    """Produces batches and trains the ``Learner`` on them; see the module docstring."""

    members: int  # runs trained side by side
    param_store: Any  # the newest published params, what evaluation and inference read

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled so far, of each member (over processes: of all of them)."""

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        """A restored count, to which what is sampled from now on adds."""

    def start(self) -> None:
        """Starts sampling (threads, envs); before the first ``next_update``."""

    def next_update(self) -> Update | None:
        """Samples (or rolls out) the next batch and trains on it; None where the engine only
        samples (``debugging(_skip_learners=True)``)."""

    def publish(self) -> None:
        """The learner's params to whatever acts with them (``broadcast_interval``)."""

    def begin_iteration(self) -> None: ...

    def end_iteration(self) -> None: ...

    def drain(self) -> Report:
        """Episodes, callbacks' metrics, timers and fault counts since the last call."""

    def restart_for_restore(self) -> None:
        """After the learner's state was restored: sampling starts again from its params."""

    def stop(self) -> None:
        """Ends threads and closes envs; idempotent."""
