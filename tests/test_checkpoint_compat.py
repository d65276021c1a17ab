"""A checkpoint written before the package's modules were grouped into core/, runtime/, rllib/ and
cli/ still restores, with the same learner state, counters and policy.

``tests/data/checkpoint_pre_layers`` was written by main at 7984af7 (the flat layout): CartPole-v1,
lockstep, 8 envs x 10 steps, mixin replay, ``fcnet_hiddens=[16]``, ``callbacks(RLlibCallback)``
(stored by its old import path ``impala_jax.callbacks:RLlibCallback``), seed 3, two iterations.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from impala_jax import IMPALA
from impala_jax.rllib.callbacks import RLlibCallback

OLD = Path(__file__).parent / "data" / "checkpoint_pre_layers"
OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


def test_a_checkpoint_of_the_flat_layout_restores(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(OLD, old)  # restoring must not need to write next to the repository's copy
    algo = IMPALA.from_checkpoint(old)
    try:
        assert algo.config.callbacks_class in (
            RLlibCallback,
            "impala_jax.rllib.callbacks:RLlibCallback",
        )
        counters = algo.get_state()["counters"]
        assert counters["num_env_steps_sampled_lifetime"] == 1_569_760
        assert counters["training_iteration"] == 2
        # What main at 7984af7 answered for this observation.
        assert int(algo.compute_single_action(OBS, explore=False)) == 1
        # The whole learner state (params, optimizer, replay) is the one that was saved.
        again = Path(algo.save(tmp_path / "again").checkpoint.path)
        before, after = np.load(old / "arrays.npz"), np.load(again / "arrays.npz")
        assert sorted(before) == sorted(after)
        for key in before:
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
        algo.train()  # and it trains on
    finally:
        algo.stop()


def test_old_import_paths_name_the_same_objects_now():
    """Every import path the flat layout could write resolves to its object's current module."""
    from impala_jax.runtime.process.checkpoint import _current_paths

    moved = {
        "impala_jax.callbacks:RLlibCallback": "impala_jax.rllib.callbacks:RLlibCallback",
        "impala_jax.envs:EnvContext": "impala_jax.runtime.envs.env_registry:EnvContext",
        "impala_jax.envs:ActionAdapter": "impala_jax.runtime.envs.vec_env:ActionAdapter",
        "impala_jax.learner:Learner": "impala_jax.runtime.learning.learner:Learner",
        "impala_jax.networks:make_networks": "impala_jax.core.networks:make_networks",
        "impala_jax.config:IMPALAConfig": "impala_jax.rllib.config:IMPALAConfig",
        "my_package.envs:MyEnv": "my_package.envs:MyEnv",  # not impala_jax's: unchanged
    }
    assert {old: _current_paths(old) for old in moved} == moved
    assert _current_paths({"a": ["impala_jax.callbacks:RLlibCallback"]}) == {
        "a": ["impala_jax.rllib.callbacks:RLlibCallback"]
    }


def test_paths_of_rllib_surface_once_in_runtime_name_the_same_objects_now():
    """A checkpoint written while RLlib's callbacks, MetricsLogger and result dict lived in
    runtime/ (or in the flat layout) names them by a path that now resolves in rllib/."""
    from impala_jax.runtime.process.checkpoint import _current_paths

    cb, ml = "impala_jax.rllib.callbacks", "impala_jax.rllib.metrics_logger"
    moved = {
        "impala_jax.runtime.callbacks:RLlibCallback": f"{cb}:RLlibCallback",
        "impala_jax.runtime.callbacks:DefaultCallbacks": f"{cb}:DefaultCallbacks",
        "impala_jax.runtime.callbacks:Episode.get_return": f"{cb}:Episode.get_return",
        "impala_jax.callbacks:DefaultCallbacks": f"{cb}:DefaultCallbacks",
        "impala_jax.runtime.metrics_logger:MetricsLogger": f"{ml}:MetricsLogger",
        "impala_jax.metrics_logger:MetricsLogger": f"{ml}:MetricsLogger",
        "impala_jax.runtime.metrics:train_result": "impala_jax.rllib.results:train_result",
        "impala_jax.runtime.metrics:Timers": "impala_jax.runtime.metrics:Timers",
    }
    assert {old: _current_paths(old) for old in moved} == moved


PRE_ENGINES = Path(__file__).parent / "data" / "checkpoint_pre_engines"


@pytest.mark.parametrize(("kind", "greedy"), [("host", 1), ("device", 0)])
def test_a_checkpoint_from_before_the_engines_restores(tmp_path, kind, greedy):
    """``tests/data/checkpoint_pre_engines`` was written by main at bad0627, before runtime/ was
    split into rooms and the callbacks moved to rllib/: two iterations of lockstep CartPole-v1
    (8 envs x 10 steps, mixin replay, ``fcnet_hiddens=[16]``, ``callbacks(RLlibCallback)`` stored
    as ``impala_jax.runtime.callbacks:RLlibCallback``) and of gymnax's CartPole on device (16
    envs x 10 steps, ``policy_lag=1``), seed 3. It restores the same state and trains on."""
    old = tmp_path / kind
    shutil.copytree(PRE_ENGINES / kind, old)
    algo = IMPALA.from_checkpoint(old)
    try:
        if kind == "host":
            assert algo.config.callbacks_class in (
                RLlibCallback,
                "impala_jax.rllib.callbacks:RLlibCallback",
            )
        assert algo.get_state()["counters"]["training_iteration"] == 2
        # What main at bad0627 answered for this observation.
        assert int(algo.compute_single_action(OBS, explore=False)) == greedy
        again = Path(algo.save(tmp_path / "again").checkpoint.path)
        before, after = np.load(old / "arrays.npz"), np.load(again / "arrays.npz")
        assert sorted(before) == sorted(after)
        for key in before:
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
        assert algo.train()["training_iteration"] == 3
    finally:
        algo.stop()
