"""RLlib's Algorithm API and result keys on impala_jax's IMPALA; restores that are exact."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest

from impala_jax.runtime.process.checkpoint import Checkpoint, SaveResult
from tests.test_algorithm import small_config

EPISODE_LEN = 10


class ActionOneBandit(gym.Env):
    """Reward 1 for action 1, 0 for action 0; episodes of EPISODE_LEN steps. The return is the
    number of times the policy chose 1, so it tells which params sampled the episode."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.ones(2, np.float32), {}

    def step(self, action):
        self._t += 1
        return np.ones(2, np.float32), float(action == 1), False, self._t >= EPISODE_LEN, {}


def bandit_config(num_env_runners=0):
    return (
        small_config(ActionOneBandit, num_env_runners=num_env_runners)
        .training(lr=1e-7)  # the restored policy must not move within the test
        .reporting(min_sample_timesteps_per_iteration=400)
    )


def always_one(weights: dict) -> dict:
    """The same params with a policy head that takes action 1 with probability ~1."""
    params = jax.tree.map(np.array, weights["default_policy"])
    pi = params["pi"]
    bias_path = [k for k in jax.tree_util.tree_flatten_with_path(pi)[0] if "bias" in str(k[0])]
    assert bias_path, pi
    path, _ = bias_path[-1]
    node = pi
    for key in path[:-1]:
        node = node[key.key]
    node[path[-1].key] = np.array([-30.0, 30.0], np.float32)
    return {"default_policy": params}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_from_checkpoint_samples_only_with_the_restored_params(tmp_path, num_env_runners):
    with bandit_config(num_env_runners).build() as algo:
        algo.set_weights(always_one(algo.get_weights()))
        result = algo.save(tmp_path / "ckpt")
    assert isinstance(result, SaveResult) and isinstance(result.checkpoint, Checkpoint)
    from impala_jax.rllib.algorithm import IMPALA

    with IMPALA.from_checkpoint(result.checkpoint.path) as restored:
        first = restored.train()["env_runners"]
    assert first["num_episodes"] > 0
    # Every episode of the first iteration chose action 1 throughout: the restored policy.
    assert first["episode_return_min"] == EPISODE_LEN


@pytest.mark.timeout(180)
def test_restore_mid_run_drops_what_the_old_policy_sampled(tmp_path):
    with bandit_config(num_env_runners=1).build() as algo:
        algo.set_weights(always_one(algo.get_weights()))
        path = algo.save_to_path(tmp_path / "ckpt")
    with bandit_config(num_env_runners=1).build() as algo:
        before = algo.train()
        assert before["env_runners"]["episode_return_min"] < EPISODE_LEN  # a random policy
        algo.restore(path)
        after = algo.train()
    assert after["env_runners"]["episode_return_min"] == EPISODE_LEN
    assert after["iterations_since_restore"] == 1
    assert after["training_iteration"] == 1  # the checkpoint's count (0) plus this one


@pytest.mark.timeout(180)
def test_episode_window_and_counters_survive_a_restore(tmp_path):
    with bandit_config().build() as algo:
        algo.set_weights(always_one(algo.get_weights()))
        saved = algo.train()
        result = algo.save()  # no path: a fresh directory, as in RLlib
    assert saved["env_runners"]["episode_return_mean"] == EPISODE_LEN
    from impala_jax.rllib.algorithm import IMPALA

    with IMPALA.from_checkpoint(result) as restored:
        assert restored.iteration == 1
        again = restored.train()
    assert again["env_runners"]["num_episodes_lifetime"] == (
        saved["env_runners"]["num_episodes_lifetime"] + again["env_runners"]["num_episodes"]
    )
    assert again["num_env_steps_sampled_lifetime"] > saved["num_env_steps_sampled_lifetime"]


@pytest.mark.timeout(120)
def test_rllib_result_keys_and_checks():
    from ray.rllib.utils.test_utils import check_train_results_new_api_stack

    with small_config().build() as algo:
        result = algo.train()
        check_train_results_new_api_stack(result)
        config = algo.get_config()
    assert result["config"]["lr"] == config.lr and isinstance(result["config"], dict)
    assert result["done"] is False and result["iterations_since_restore"] == 1
    assert (
        result["env_runners"]["num_env_steps_sampled_lifetime"]
        == result["num_env_steps_sampled_lifetime"]
    )
    learner = result["learners"]["default_policy"]
    assert learner["default_optimizer_learning_rate"] == pytest.approx(1e-3)
    all_modules = result["learners"]["__all_modules__"]
    assert all_modules["num_env_steps_trained_lifetime"] == result["num_env_steps_trained_lifetime"]
    assert all_modules["num_trainable_parameters"] > 0
    assert result["num_episodes_lifetime"] == result["env_runners"]["num_episodes_lifetime"]


@pytest.mark.timeout(120)
def test_pi_and_vf_losses_are_sums_beside_their_means():
    with small_config().build() as algo:
        result = algo.train()
    learner = result["learners"]["default_policy"]
    # Lockstep: the batch is the iteration's 64 env steps; the row after each episode's end is
    # a reset row, masked: sum = mean x (64 - episodes ended), for both losses.
    valid = 64 - result["env_runners"]["num_episodes"]
    assert valid < 64  # an episode ended: a masked row is in the batch
    for name in ("pi_loss", "vf_loss"):
        assert learner[name] == pytest.approx(valid * learner[f"mean_{name}"], rel=1e-5), name
    assert learner["vf_loss"] > 0


@pytest.mark.timeout(120)
def test_module_weights_and_config():
    with small_config().build() as algo:
        module = algo.get_module()
        assert algo.get_module("no_such_module") is None
        obs = np.zeros((3, 4), np.float32)
        out = module.forward_inference({"obs": obs})
        assert out["action_dist_inputs"].shape == (3, 2)
        assert module.forward_train({"obs": obs})["vf_preds"].shape == (3,)
        weights = algo.get_weights()
        zeroed = jax.tree.map(np.zeros_like, weights)
        algo.set_weights(zeroed)
        # The module follows the published params: all-zero weights give zero logits.
        np.testing.assert_array_equal(
            module.forward_inference({"obs": obs + 1})["action_dist_inputs"], 0.0
        )
        np.testing.assert_array_equal(jax.tree.leaves(algo.get_weights()["default_policy"])[0], 0.0)
        with pytest.raises(ValueError, match="do not match"):
            algo.set_weights({"default_policy": {"pi": {}}})
        with pytest.raises(KeyError, match="default_policy"):
            algo.set_weights({"policy_1": {}})
        assert algo.get_config().is_frozen and algo.iteration == 0
        algo.train()  # zero weights still train
        assert algo.iteration == 1
