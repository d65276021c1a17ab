"""The engines (runtime/engine.py): every engine has the whole declared interface, and the
iteration loop that IMPALA and SeedGroup share keeps RLlib's stop rule for both."""

from __future__ import annotations

import inspect

import pytest

from impala_jax import IMPALAConfig
from impala_jax.runtime.acting.host_engine import AgreedHostEngine, HostEngine
from impala_jax.runtime.engine import Engine
from impala_jax.runtime.ondevice.device_engine import DeviceEngine


def _methods(cls) -> set[str]:
    return {
        n
        for n, m in vars(cls).items()
        if not n.startswith("_") and (callable(m) or isinstance(m, property))
    }


@pytest.mark.parametrize("engine", [HostEngine, AgreedHostEngine, DeviceEngine])
def test_every_engine_has_the_whole_interface(engine):
    """A method or attribute added to the Engine protocol but not to an engine fails here, by
    name."""
    methods = _methods(Engine)
    assert {"next_update", "publish", "drain", "restart_for_restore", "stop"} <= methods
    assert sorted(m for m in methods if not hasattr(engine, m)) == []
    source = "".join(inspect.getsource(c) for c in engine.__mro__ if c is not object)
    attributes = set(Engine.__annotations__)
    assert attributes == {"members", "param_store"}
    missing = [a for a in attributes if not hasattr(engine, a) and f"self.{a} = " not in source]
    assert missing == []


def _gymnax(**reporting) -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment("gymnax:CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=20)
        .training(train_batch_size_per_learner=320, lr=0.01)
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0, **reporting)
        .debugging(seed=3)
    )


def test_a_seed_group_iterates_by_impalas_stop_rule():
    """min_train_timesteps_per_iteration ends a group's iteration as it ends a run's: three
    updates of 320 env steps to train at least 700."""
    from impala_jax import SeedGroup

    with SeedGroup(_gymnax(min_train_timesteps_per_iteration=700), [0, 1]) as group:
        results = group.train()
    for seed, result in zip([0, 1], results, strict=True):
        assert result["seed"] == seed
        assert result["num_training_step_calls_per_iteration"] == 3
        assert result["num_env_steps_trained_lifetime"] == 960
        assert "learner_dispatch_s" in str(result["timers"])


def test_the_learner_owns_its_state_on_device():
    """The device engine's update leaves the learner holding the new state (Learner.run), and
    set_weights reaches the acting params through the engine."""
    import jax
    import numpy as np

    with _gymnax().build() as algo:
        before = algo.learner.state
        algo.train()
        assert algo.learner.state is not before
        assert int(algo.learner.state.update_step) >= 1
        weights = jax.tree.map(np.zeros_like, algo.get_weights()["default_policy"])
        algo.set_weights({"default_policy": weights})
        published, _ = algo.engine.param_store.get()
        assert all(not np.any(x) for x in jax.tree.leaves(jax.device_get(published)))


def test_from_train_to_vtrace_is_a_short_walk(monkeypatch):
    """The package's own calls from IMPALA.train() down to the V-trace call, on the host path
    (lockstep): at most 9, so a reader can follow an iteration to the equation."""
    import impala_jax.core.losses as losses
    from impala_jax.runtime.learning import program_cache
    from impala_jax.runtime.learning.learner import Learner

    chains = []
    vtrace = losses.vtrace_targets

    def spy(*args, **kwargs):
        frames = [f for f in inspect.stack()[1:] if "/impala_jax/" in f.filename]
        names = [f.function for f in reversed(frames)]
        chains.append(names[max(i for i, n in enumerate(names) if n == "train") :])
        return vtrace(*args, **kwargs)

    monkeypatch.setattr(losses, "vtrace_targets", spy)
    monkeypatch.setattr(program_cache, "directory", lambda: None)  # traced here, not loaded
    monkeypatch.setattr(Learner, "warm_up", lambda self, example: None)  # traced in train()
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=5)
        .training(train_batch_size_per_learner=20)
        .reporting(min_time_s_per_iteration=0)
    )
    with config.build() as algo:
        algo.train()
    assert chains, "V-trace was not traced inside train()"
    assert chains[0][-1] == "impala_loss"
    assert len(chains[0]) <= 9, " -> ".join(chains[0])


def test_training_step_reads_like_the_paper_and_a_seed_group_stays_small():
    from impala_jax.rllib import seed_group
    from impala_jax.rllib.training_loop import TrainingLoop

    step = inspect.getsource(TrainingLoop.training_step).splitlines()
    assert len(step) <= 15, "\n".join(step)
    assert not any(flag in "\n".join(step) for flag in ("_on_device", "fake", "skip", "process"))
    assert len(inspect.getsource(seed_group).splitlines()) <= 80


def test_each_result_owns_its_fault_counts():
    """A result changed by its reader (a callback, a logger) leaves the next one as it was: the
    device engine's fault counts are one constant, handed out as copies."""
    with _gymnax().build() as algo:
        first = algo.train()
        first["fault_tolerance"]["num_env_restarts"] = 99
        assert algo.train()["fault_tolerance"]["num_env_restarts"] == 0
