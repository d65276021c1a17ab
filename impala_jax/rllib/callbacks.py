"""RLlib-style callbacks (``config.callbacks(...)``); they log to metrics_logger.MetricsLogger.

The runners and the evaluation reach the episode hooks through runtime's small protocol
(runtime/acting/episode_hooks.py): `CallbacksSpec` makes their logger and their hooks,
`RLlibEpisodeHooks` adapts RLlib's episode callbacks to it.

RLlib 2.60's two forms both work: a callbacks class (``RLlibCallback`` subclass, from
``ray.rllib.callbacks.callbacks`` or from here; a list of classes too), instantiated once for the
algorithm and once per env runner, as RLlib does; and per-event callables
(``callbacks(on_train_result=fn)``, a callable or a list), called after the class methods. Both
get RLlib's keyword arguments:

- ``on_algorithm_init(algorithm, metrics_logger)``: end of ``IMPALA.__init__``.
- ``on_train_result(algorithm, metrics_logger, result)``: end of ``train()``; ``result`` may be
  mutated. Values logged here land in the next result (RLlib reduces its logger before).
- ``on_evaluate_start(algorithm, metrics_logger)`` / ``on_evaluate_end(algorithm,
  metrics_logger, evaluation_metrics)``: around ``IMPALA.evaluate()``.
- ``on_checkpoint_loaded(algorithm)``: after ``restore()`` (so also in ``from_checkpoint``).
- ``on_episode_start`` / ``on_episode_end(episode, env_runner, metrics_logger, env, env_index,
  rl_module)`` (``on_episode_end`` also gets ``prev_episode_chunks=[]``): in the thread that steps
  the env: a runner thread, the main thread in lockstep mode, the evaluation thread.

Algorithm-level values (``algorithm.metrics``) land at the top level of the result; episode
values under ``env_runners/`` (``evaluation/env_runners/`` for evaluation episodes), as in RLlib.
RLlib's other hooks are not called here: overriding one, or passing it as a keyword, is an error
at build (`UNSUPPORTED_HOOKS` says why for each). This module imports neither ray nor jax.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from impala_jax.rllib.metrics_logger import MetricsLogger
from impala_jax.runtime.acting.episode_hooks import EpisodeHooks
from impala_jax.runtime.acting.user_code import UserCodeError, describe
from impala_jax.runtime.process.import_path import import_object, split_import_path

__all__ = [
    "DefaultCallbacks",
    "Episode",
    "MetricsLogger",
    "RLlibCallback",
    "SUPPORTED_HOOKS",
    "UNSUPPORTED_HOOKS",
]

ALGORITHM_HOOKS = (
    "on_algorithm_init",
    "on_train_result",
    "on_evaluate_start",
    "on_evaluate_end",
    "on_checkpoint_loaded",
)
EPISODE_HOOKS = ("on_episode_start", "on_episode_end")
SUPPORTED_HOOKS = ALGORITHM_HOOKS + EPISODE_HOOKS

_NO_OFFLINE = "impala_jax has no offline evaluation"
_OLD_STACK = "an old-API-stack hook, which RLlib 2.60's new stack does not call either"
UNSUPPORTED_HOOKS = {
    "on_evaluate_offline_start": _NO_OFFLINE,
    "on_evaluate_offline_end": _NO_OFFLINE,
    "on_offline_eval_runners_recreated": _NO_OFFLINE,
    "on_env_runners_recreated": (
        "impala_jax does not call it (restarts are counted in "
        "fault_tolerance/num_remote_worker_restarts)"
    ),
    "on_environment_created": "impala_jax does not call it (envs are built inside the runners)",
    "on_episode_created": "impala_jax does not call it; use on_episode_start",
    "on_episode_step": (
        "impala_jax keeps no per-step episode data on the host (steps go straight into "
        "fragments); use on_episode_end"
    ),
    "on_sample_end": "impala_jax does not call it (runners sample fragments, not episodes)",
    "on_sub_environment_created": _OLD_STACK,
    "on_postprocess_trajectory": _OLD_STACK,
    "on_create_policy": _OLD_STACK,
    "on_learn_on_batch": _OLD_STACK,
    "on_workers_recreated": _OLD_STACK,
}
# The per-event keywords of RLlib 2.60's AlgorithmConfig.callbacks(), in its order.
CALLBACK_KEYWORDS = (
    "on_algorithm_init",
    "on_train_result",
    "on_evaluate_start",
    "on_evaluate_end",
    "on_evaluate_offline_start",
    "on_evaluate_offline_end",
    "on_env_runners_recreated",
    "on_offline_eval_runners_recreated",
    "on_checkpoint_loaded",
    "on_environment_created",
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_sample_end",
)


class RLlibCallback:
    """Base class of a callbacks class; every hook is a no-op (RLlib's ``RLlibCallback``).

    Subclass it (or RLlib's own) and override the hooks you need; the keyword arguments are
    RLlib's (see the module docstring). ``DefaultCallbacks`` is the same class (RLlib's old name).
    """

    def on_algorithm_init(self, *, algorithm, metrics_logger=None, **kwargs) -> None:
        pass

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        pass

    def on_evaluate_start(self, *, algorithm, metrics_logger=None, **kwargs) -> None:
        pass

    def on_evaluate_end(
        self, *, algorithm, metrics_logger=None, evaluation_metrics: dict, **kwargs
    ) -> None:
        pass

    def on_checkpoint_loaded(self, *, algorithm, **kwargs) -> None:
        pass

    def on_episode_start(
        self,
        *,
        episode,
        env_runner=None,
        metrics_logger=None,
        env=None,
        env_index: int,
        rl_module=None,
        **kwargs,
    ) -> None:
        pass

    def on_episode_end(
        self,
        *,
        episode,
        prev_episode_chunks=None,
        env_runner=None,
        metrics_logger=None,
        env=None,
        env_index: int,
        rl_module=None,
        **kwargs,
    ) -> None:
        pass


DefaultCallbacks = RLlibCallback


def _is_base(cls: type) -> bool:
    """A class whose hooks are no-ops: ours, RLlib's RLlibCallback / DefaultCallbacks, object."""
    if cls is RLlibCallback or cls is object:
        return True
    return cls.__module__.startswith("ray.rllib.") and cls.__name__ in (
        "RLlibCallback",
        "DefaultCallbacks",
    )


def overrides(cls: type, hook: str) -> bool:
    """Whether `cls` (or a parent that is not a base class) defines `hook`."""
    for klass in cls.__mro__:
        if hook in vars(klass):
            return not _is_base(klass)
    return False


def unsupported_overrides(cls: type) -> list[str]:
    """The hooks `cls` overrides that impala_jax does not call."""
    return [hook for hook in UNSUPPORTED_HOOKS if overrides(cls, hook)]


def resolve(value: Any, field: str) -> Any:
    """`value`, or the object its import path names: "pkg.mod:Name" (checkpoints) or
    "pkg.mod.Name" (RLlib's spelling)."""
    if not isinstance(value, str):
        return value
    parts = split_import_path(value)
    if parts is None:
        raise ValueError(
            f"callbacks({field}={value!r}): not an importable path. Checkpoints store callbacks "
            "by import path, so a lambda or a function or class defined inside another function "
            "cannot be restored from one: define it at module level, or build from your config "
            "and call algo.restore(path)."
        )
    module, qualname = parts
    try:
        return import_object(module, qualname)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"callbacks({field}={value!r}): cannot import {qualname!r} from {module!r} ({err})."
        ) from err


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


@dataclasses.dataclass(frozen=True)
class CallbacksSpec:
    """The ``callbacks()`` fields, as rllib/specs.py reads them off the config."""

    callbacks_class: Any  # a class, its import path, or a list of them; None: none
    hooks: dict[str, Any]  # every CALLBACK_KEYWORDS field -> its callable(s) or None
    # What episode callbacks get as ``env_runner.config`` (RLlib's EnvRunner.config): handed to
    # user code as it is, never read here.
    env_runner_config: Any

    # runtime's EpisodeHooksFactory (runtime/acting/episode_hooks.py): the runners and the
    # evaluation make their logger and their episode hooks through these two.
    def new_metrics(self) -> MetricsLogger:
        return MetricsLogger()

    def episode_hooks(self, env_runner: Any, metrics: MetricsLogger) -> EpisodeHooks | None:
        """RLlib's episode callbacks for ``env_runner``; None without an episode hook (the
        callbacks classes are instantiated per runner either way, as RLlib does)."""
        callbacks = Callbacks.from_spec(self)
        if not any(callbacks.has(h) for h in EPISODE_HOOKS):
            return None
        return RLlibEpisodeHooks(callbacks, env_runner, metrics)


class Callbacks:
    """The receivers of every hook for one component (the algorithm, or one env runner)."""

    def __init__(self, objects: list, receivers: dict[str, list[Callable]]):
        self.objects = objects  # the callbacks_class instances (RLlib's ``algo.callbacks``)
        self._receivers = receivers

    @classmethod
    def from_spec(cls, spec: CallbacksSpec) -> Callbacks:
        """Resolves import paths, checks every hook is one impala_jax calls, instantiates the
        callbacks classes. Raises ValueError naming the field, the hook and the fix."""
        classes = [resolve(c, "callbacks_class") for c in _as_list(spec.callbacks_class)]
        for klass in classes:
            if not isinstance(klass, type):
                raise ValueError(
                    f"callbacks(callbacks_class={klass!r}): expected a class (an RLlibCallback "
                    "subclass), its import path, or a list of them."
                )
            bad = unsupported_overrides(klass)
            if bad:
                raise ValueError(
                    f"callbacks(callbacks_class={klass.__qualname__}) overrides "
                    + "; ".join(f"{hook}, which {UNSUPPORTED_HOOKS[hook]}" for hook in bad)
                    + f". Remove it, or move its logic to a hook impala_jax calls: "
                    f"{', '.join(SUPPORTED_HOOKS)}."
                )
        for hook in UNSUPPORTED_HOOKS:
            if spec.hooks.get(hook) is not None:
                raise ValueError(
                    f"callbacks({hook}=...): {UNSUPPORTED_HOOKS[hook]}. Use one of "
                    f"{', '.join(SUPPORTED_HOOKS)}."
                )
        objects = [klass() for klass in classes]
        receivers: dict[str, list[Callable]] = {}
        for hook in SUPPORTED_HOOKS:
            fns = [getattr(o, hook) for o in objects if overrides(type(o), hook)]
            for fn in _as_list(spec.hooks[hook]):
                fn = resolve(fn, hook)
                if not callable(fn):
                    raise ValueError(
                        f"callbacks({hook}={fn!r}): expected a callable or a list of callables."
                    )
                fns.append(fn)
            if fns:
                receivers[hook] = fns
        return cls(objects, receivers)

    def has(self, hook: str) -> bool:
        return hook in self._receivers

    @property
    def empty(self) -> bool:
        """No callbacks class and no callable: nothing of the user's runs at any hook."""
        return not (self.objects or self._receivers)

    def call(self, hook: str, **kwargs) -> None:
        """Class methods first, then the per-event callables, in order (RLlib's order).

        An exception from one is re-raised as `UserCodeError` naming the hook and the callable
        (the original, with its traceback, is its ``__cause__``): a bug in user code, which no
        restart fixes."""
        for fn in self._receivers.get(hook, ()):
            try:
                fn(**kwargs)
            except Exception as err:
                raise UserCodeError(f"the {hook} callback {describe(fn)}", err) from err


_NO_HISTORY = (
    "impala_jax's episodes keep no per-step data on the host (steps go straight into "
    "fragments): an episode callback can read get_return(), len(episode), is_terminated, "
    "is_truncated, get_duration_s(), id_ and custom_data."
)


class Episode:
    """The ``episode`` an episode callback gets: the part of RLlib's SingleAgentEpisode that
    impala_jax has. The same object goes to on_episode_start and on_episode_end, so
    ``custom_data`` carries state from one to the other. It is always a whole episode (RLlib
    may hand over the last chunk; here ``prev_episode_chunks`` is ``[]``)."""

    def __init__(self, env_index: int):
        self.id_ = uuid.uuid4().hex
        self.env_index = env_index  # impala_jax's: the env within its runner
        self.custom_data: dict = {}
        self.is_terminated = False
        self.is_truncated = False
        self.t_started = 0
        self._return = 0.0
        self._length = 0
        self._started = time.perf_counter()
        self._ended: float | None = None

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def t(self) -> int:
        return self._length

    def get_return(self) -> float:
        """Sum of the raw (unclipped) rewards; 0.0 in on_episode_start."""
        return self._return

    def __len__(self) -> int:
        return self._length

    def env_steps(self) -> int:
        return self._length

    def agent_steps(self) -> int:
        return self._length

    def get_duration_s(self) -> float:
        return (self._ended or time.perf_counter()) - self._started

    def _finish(self, ret: float, length: int, terminated: bool) -> None:
        self._return, self._length = float(ret), int(length)
        self.is_terminated, self.is_truncated = bool(terminated), not terminated
        self._ended = time.perf_counter()

    def get_observations(self, *args, **kwargs):
        raise NotImplementedError(_NO_HISTORY)

    get_actions = get_rewards = get_infos = get_extra_model_outputs = get_observations

    def __repr__(self) -> str:
        return f"Episode(id_={self.id_!r}, len={self._length}, return={self._return:g})"


class RLlibEpisodeHooks:
    """runtime's `EpisodeHooks` for the envs of one env runner (or the evaluation), with RLlib's
    episode callbacks: each episode is an `Episode`, and the hooks get RLlib's keywords.
    ``env_runner`` is what the callbacks get as ``env_runner``."""

    def __init__(self, callbacks: Callbacks, env_runner: Any, metrics_logger: MetricsLogger):
        self._callbacks = callbacks
        self._runner = env_runner
        self.metrics = metrics_logger
        self._episodes: dict[int, Episode] = {}  # env index -> its running episode

    def episode_started(self, *, env_index: int, env) -> None:
        episode = self._episodes[env_index] = Episode(env_index)
        if self._callbacks.has("on_episode_start"):
            self._call("on_episode_start", episode, env_index, env)

    def episode_ended(
        self, *, env_index: int, env, episode_return: float, length: int, terminated
    ) -> None:
        episode = self._episodes.pop(env_index)
        episode._finish(episode_return, length, terminated)
        self._call("on_episode_end", episode, env_index, env, prev_episode_chunks=[])

    def _call(self, hook: str, episode: Episode, env_index: int, env, **extra) -> None:
        self._callbacks.call(
            hook,
            episode=episode,
            env_runner=self._runner,
            metrics_logger=self.metrics,
            env=env,
            env_index=env_index,
            rl_module=None,  # impala_jax has no RLModule object; params: env_runner.param_store
            **extra,
        )
