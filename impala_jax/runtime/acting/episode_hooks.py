"""Where the episodes that runtime steps meet user code, without runtime knowing RLlib's callbacks.

The runners and the evaluation find where each env's episodes start and end (`EpisodeCallbacks`)
and call an `EpisodeHooks`; their spec's ``callbacks`` (an `EpisodeHooksFactory`) makes the hooks
and the logger they log to (a `MetricsSink`), which runtime drains into each result.
rllib/callbacks.py implements the three with RLlib's callbacks classes, its episode object and
its ``MetricsLogger``. Only the hooks impala_jax calls are here: RLlib's on_episode_created and
on_episode_step are rejected at build (rllib/callbacks.py, ``UNSUPPORTED_HOOKS``).
"""

from __future__ import annotations

from typing import Any, Protocol


class MetricsSink(Protocol):
    """What episode hooks log to, as runtime drains it (RLlib's ``EnvRunner.metrics``)."""

    # A reentrant lock, held while episodes end and their hooks log and while the sink is drained
    # together with the episode log: an iteration's episodes and their metrics stay together.
    lock: Any

    def reduce(self) -> dict:
        """What was logged since the last call, as the nested dict a result merges in."""
        ...


class EpisodeHooks(Protocol):
    """The calls one env runner (or the evaluation) makes for the episodes of its envs: RLlib's
    on_episode_start and on_episode_end, named apart from those config fields."""

    def episode_started(self, *, env_index: int, env: Any) -> None:
        """Env ``env_index`` (within its runner; ``env`` is its vector env) begins an episode."""
        ...

    def episode_ended(
        self, *, env_index: int, env: Any, episode_return: float, length: int, terminated
    ) -> None:
        """The episode of env ``env_index`` ended: its raw-reward return, its length, and
        whether it terminated (else it was truncated)."""
        ...


class EpisodeHooksFactory(Protocol):
    """What a `RunnerSpec` or an `EvaluationSpec` carries as ``callbacks``."""

    # What the hooks get as ``env_runner.config`` (RLlib's EnvRunner.config); never read here.
    env_runner_config: Any

    def new_metrics(self) -> MetricsSink:
        """A fresh logger for one runner group (shared by its runners) or one evaluation."""
        ...

    def episode_hooks(self, env_runner: Any, metrics: MetricsSink) -> EpisodeHooks | None:
        """The hooks of ``env_runner`` (what user code gets as ``env_runner``) logging to
        ``metrics``; None when no episode hook has a receiver."""
        ...


class EpisodeCallbacks:
    """Finds the starts and ends of the episodes of one env runner's (or the evaluation's) envs
    and calls its `EpisodeHooks` there.

    Made only when there are hooks (`make` returns None otherwise), so the stepping loop pays one
    ``is None`` test per step without callbacks.
    """

    def __init__(self, hooks: EpisodeHooks, metrics: MetricsSink):
        self.hooks = hooks
        self.metrics = metrics
        self._groups: dict[int, Any] = {}  # first env index -> the env group seen there
        self._first: dict[int, int] = {}  # id(group) -> its first env index
        self._detached = False

    @classmethod
    def make(
        cls, factory: EpisodeHooksFactory, env_runner: Any, metrics: MetricsSink
    ) -> EpisodeCallbacks | None:
        hooks = factory.episode_hooks(env_runner, metrics)
        return None if hooks is None else cls(hooks, metrics)

    def detach(self) -> None:
        """A retired runner's later episodes call nothing and log nothing."""
        with self.metrics.lock:
            self._detached = True

    def begin(self, groups: list) -> None:
        """Before stepping ``groups``: envs of a group not seen before (new or rebuilt) start
        new episodes. A group has ``env`` (with ``num_envs``), ``episode_return``,
        ``episode_len``."""
        first = 0
        for g in groups:
            if self._groups.get(first) is not g:
                self._groups[first] = g
                self._first = {id(x): i for i, x in self._groups.items()}
                for i in range(g.env.num_envs):
                    self._start(first + i, g.env)
            first += g.env.num_envs

    def step(self, g, started, done, terminated, log=None, limit: int | None = None) -> int:
        """After one env step of group ``g`` (its return and length already updated, not yet
        reset): envs whose observation is a reset one start an episode; the first ``limit``
        (None: all) finished episodes, in env order, end, and are added to ``log`` together
        with what their hooks logged. Returns how many ended."""
        first = self._first[id(g)]
        for i in started.nonzero()[0].tolist():
            self._start(first + i, g.env)
        idx = done.nonzero()[0][:limit]
        if not len(idx):
            return 0
        returns, lengths = g.episode_return[idx], g.episode_len[idx]
        with self.metrics.lock:  # an iteration's episodes and their metrics stay together
            if self._detached:
                return 0
            for i, ret, length in zip(
                idx.tolist(), returns.tolist(), lengths.tolist(), strict=True
            ):
                self.hooks.episode_ended(
                    env_index=first + i,
                    env=g.env,
                    episode_return=ret,
                    length=length,
                    terminated=terminated[i],
                )
            if log is not None:
                log.add(returns, lengths)
        return len(idx)

    def _start(self, env_index: int, env) -> None:
        # A retired runner's hooks see no new episode (its running ones never end either).
        if not self._detached:
            self.hooks.episode_started(env_index=env_index, env=env)
