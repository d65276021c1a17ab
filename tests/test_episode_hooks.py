"""runtime calls episode hooks only through its protocol (runtime/acting/episode_hooks.py), and
rllib's CallbacksSpec implements it with RLlib's keywords: no env, no JAX, no algorithm."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from impala_jax.rllib.callbacks import CALLBACK_KEYWORDS, CallbacksSpec, Episode, MetricsLogger
from impala_jax.runtime.acting.episode_hooks import EpisodeCallbacks
from impala_jax.runtime.acting.user_code import UserCodeError


def group(num_envs: int, returns, lengths):
    """What EpisodeCallbacks reads of an env group: its env, returns and lengths so far."""
    return SimpleNamespace(
        env=SimpleNamespace(num_envs=num_envs),
        episode_return=np.asarray(returns, np.float64),
        episode_len=np.asarray(lengths, np.int64),
    )


class Recording:
    """Runtime's EpisodeHooksFactory, written from the protocol alone (not rllib's)."""

    env_runner_config = None

    def __init__(self):
        self.calls = []

    def new_metrics(self):
        return MetricsLogger()

    def episode_hooks(self, env_runner, metrics):
        calls = self.calls

        class Hooks:
            def episode_started(self, **kw):
                calls.append(("start", kw))

            def episode_ended(self, **kw):
                calls.append(("end", kw))

        return Hooks()


def test_episode_boundaries_reach_the_hooks_through_the_protocol():
    factory = Recording()
    callbacks = EpisodeCallbacks.make(factory, "runner", factory.new_metrics())
    a, b = group(2, [1.0, 2.0], [3, 4]), group(3, [5.0, 6.0, 7.0], [8, 9, 10])
    callbacks.begin([a, b])
    assert [(h, kw["env_index"]) for h, kw in factory.calls] == [("start", i) for i in range(5)]
    assert factory.calls[2][1]["env"] is b.env  # the second group's envs are numbered after a's
    factory.calls.clear()
    logged = []
    log = SimpleNamespace(
        add=lambda returns, lengths: logged.append((list(returns), list(lengths)))
    )
    started = np.array([False, True, False])
    done = np.array([True, False, True])
    terminated = np.array([True, False, False])
    assert callbacks.step(b, started, done, terminated, log) == 2
    assert [(h, kw["env_index"]) for h, kw in factory.calls] == [
        ("start", 3),
        ("end", 2),
        ("end", 4),
    ]
    ends = [kw for h, kw in factory.calls if h == "end"]
    assert [(kw["episode_return"], kw["length"], bool(kw["terminated"])) for kw in ends] == [
        (5.0, 8, True),
        (7.0, 10, False),
    ]
    assert logged == [([5.0, 7.0], [8, 10])]
    # A group seen before starts nothing again; a retired runner calls nothing.
    factory.calls.clear()
    callbacks.begin([a, b])
    callbacks.detach()
    assert callbacks.step(a, np.array([True, False]), np.array([False, True]), done[:2]) == 0
    assert factory.calls == []


def spec(**hooks) -> CallbacksSpec:
    return CallbacksSpec(
        callbacks_class=None,
        hooks={k: hooks.get(k) for k in CALLBACK_KEYWORDS},
        env_runner_config="the runner's config",
    )


def test_rllib_callbacks_spec_is_runtimes_factory_with_rllibs_keywords():
    seen = []
    factory = spec(
        on_episode_start=lambda **kw: seen.append(("start", kw)),
        on_episode_end=lambda **kw: seen.append(("end", kw)),
    )
    metrics = factory.new_metrics()
    assert isinstance(metrics, MetricsLogger)
    callbacks = EpisodeCallbacks.make(factory, "runner", metrics)
    g = group(1, [2.5], [7])
    callbacks.begin([g])
    callbacks.step(g, np.array([False]), np.array([True]), np.array([False]))
    (_, start), (_, end) = seen
    assert set(start) == {
        "episode",
        "env_runner",
        "metrics_logger",
        "env",
        "env_index",
        "rl_module",
    }
    assert set(end) == set(start) | {"prev_episode_chunks"}
    episode = end["episode"]
    assert isinstance(episode, Episode) and episode is start["episode"]
    assert (episode.get_return(), len(episode), episode.is_truncated) == (2.5, 7, True)
    assert end["env_runner"] == "runner" and end["metrics_logger"] is metrics
    assert end["env"] is g.env and end["env_index"] == 0 and end["rl_module"] is None
    assert end["prev_episode_chunks"] == []


def test_no_episode_hook_no_episode_path_and_user_errors_stop():
    # An algorithm-level hook alone: the runners get no episode path at all.
    assert spec(on_train_result=print).episode_hooks("runner", MetricsLogger()) is None
    assert EpisodeCallbacks.make(spec(), "runner", MetricsLogger()) is None

    def boom(**kw):
        raise KeyError("user bug")

    callbacks = EpisodeCallbacks.make(spec(on_episode_start=boom), "runner", MetricsLogger())
    with pytest.raises(UserCodeError, match="on_episode_start callback .*boom"):
        callbacks.begin([group(1, [0.0], [0])])
