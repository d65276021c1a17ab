"""The network plug point: ``rl_module(rl_module_spec=RLModuleSpec(factory=...))`` builds the
learner's and the actors' networks with the user's factory (Brax's ``network_factory``)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import impala_jax
from impala_jax import IMPALAConfig
from impala_jax.core.networks import Networks, make_networks
from impala_jax.runtime.acting.network_factory import resolve_factory
from impala_jax.runtime.learning import program_cache
from impala_jax.runtime.process import checkpoint

WIDTH = 24  # no impala_jax default has this width


class TinyActorCritic(nn.Module):
    """One shared tanh layer and two linear heads, with names of its own."""

    num_actions: int

    @nn.compact
    def __call__(self, obs):
        features = nn.tanh(nn.Dense(WIDTH, name="trunk")(obs.astype(jnp.float32)))
        logits = nn.Dense(self.num_actions, name="policy_logits")(features)
        value = nn.Dense(1, name="baseline")(features)[..., 0]
        return logits, value, features


def tiny_factory(model_config, observation_space, action_space) -> Networks:
    net = TinyActorCritic(int(action_space.n))
    dummy = jnp.zeros((1, *observation_space.shape), jnp.float32)

    def init(key):
        return net.init(key, dummy)["params"]

    def apply(params, obs, with_features=False):
        logits, value, features = net.apply({"params": params}, obs)
        return (logits, value, features) if with_features else (logits, value)

    return Networks(init=init, apply=apply, dist_size=int(action_space.n))


FACTORY_PATH = "tests.test_network_factory:tiny_factory"


def factory_config(factory=tiny_factory):
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
        .training(train_batch_size_per_learner=32, lr=1e-3)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [16]})  # impala_jax's own networks only
        .reporting(min_time_s_per_iteration=0)
        .debugging(seed=3)
    )
    if factory is not None:
        config.rl_module(rl_module_spec=impala_jax.RLModuleSpec(factory=factory))
    return config


def shapes(params) -> dict:
    return {
        jax.tree_util.keystr(path): np.shape(x)
        for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }


@pytest.mark.timeout(300)
def test_a_custom_factory_builds_the_learners_and_the_actors_networks(tmp_path, monkeypatch):
    # The program cache on (as the command line has it): a custom factory's programs are never
    # stored, since the cache's key does not cover the factory's code.
    programs = tmp_path / "programs"
    monkeypatch.setattr(program_cache, "directory", lambda: programs)
    with factory_config().build() as algo:
        assert algo.policy.custom and not algo.policy.host_actor  # the jitted act runs
        results = [algo.train() for _ in range(2)]
        params = algo.get_weights()["default_policy"]
        assert set(params) == {"trunk", "policy_logits", "baseline"}
        assert np.shape(params["trunk"]["kernel"]) == (4, WIDTH)
        assert np.shape(params["policy_logits"]["kernel"]) == (WIDTH, 2)
        assert results[-1]["learners"]["__all_modules__"]["num_trainable_parameters"] == (
            4 * WIDTH + WIDTH + WIDTH * 2 + 2 + WIDTH + 1
        )
        assert results[-1]["num_env_steps_trained_lifetime"] > 0
        action = algo.compute_single_action(np.zeros(4, np.float32))
        assert action in (0, 1)
        assert algo.get_module().forward_inference({"obs": np.zeros((3, 4), np.float32)})[
            "action_dist_inputs"
        ].shape == (3, 2)
        path = algo.save_to_path(tmp_path / "ckpt")
    assert not programs.exists() or not any(programs.iterdir())

    _, meta = checkpoint.load(path)
    assert FACTORY_PATH in repr(meta["config"])  # stored by its import path
    with impala_jax.IMPALA.from_checkpoint(path) as restored:
        factory = restored.config.get_default_rl_module_spec().factory
        assert resolve_factory(factory) is tiny_factory
        assert restored.policy.custom
        jax.tree.map(
            np.testing.assert_array_equal, restored.get_weights()["default_policy"], params
        )
        restored.train()


@pytest.mark.timeout(120)
def test_an_import_path_names_the_factory():
    with factory_config(FACTORY_PATH).build() as algo:
        assert algo.policy.custom
        assert set(algo.get_weights()["default_policy"]) == {"trunk", "policy_logits", "baseline"}


@pytest.mark.timeout(120)
def test_the_default_builds_impala_jaxs_own_networks():
    # None, or impala_jax's own make_networks by name: no user factory either way.
    assert resolve_factory(IMPALAConfig().get_default_rl_module_spec().factory) is None
    with factory_config(factory=None).build() as algo:
        assert not algo.policy.custom
        params = algo.get_weights()["default_policy"]
        assert {"encoder", "pi", "vf"} <= set(params)
        reference = make_networks(
            algo.config.model_config, algo.observation_space, algo.action_space
        ).init(jax.random.key(0))
        assert shapes(params) == shapes(reference)


def test_resolve_factory():
    assert resolve_factory(None) is None
    assert resolve_factory(make_networks) is None  # impala_jax's own
    assert resolve_factory("impala_jax.core.networks.make_networks") is None
    assert resolve_factory(FACTORY_PATH) is tiny_factory
    assert resolve_factory("tests.test_network_factory.tiny_factory") is tiny_factory
    with pytest.raises(ValueError, match="cannot import"):
        resolve_factory("tests.test_network_factory:no_such_factory")
