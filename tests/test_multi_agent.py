"""Multi-agent IMPALA end to end (rllib/multi_agent.py): RLlib's ``multi_agent()`` fields, a
two-policy MultiAgentCartPole run and its result keys, frozen policies, a shared policy, the
inference surface, and RLlib's tuned multi-agent example with its import swapped.

The per-agent trajectories are tested in test_multi_agent_lanes.py and the stacked learner in
test_policy_stack.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

from impala_jax import IMPALAConfig
from impala_jax.rllib.multi_agent import MultiAgentIMPALA

REPO = Path(__file__).resolve().parents[1]


def ma_config(num_agents=2, **runners):
    env_runners = dict(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=8)
    env_runners.update(runners)
    return (
        IMPALAConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": num_agents})
        .env_runners(**env_runners)
        .training(train_batch_size_per_learner=32, lr=1e-3)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=200)
        .multi_agent(
            policies={f"p{i}" for i in range(num_agents)},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
        .debugging(seed=3)
    )


def test_multi_agent_fields_follow_rllib():
    config = ma_config()
    assert config.is_multi_agent
    assert config.policies == {"p0": None, "p1": None}
    assert not IMPALAConfig().is_multi_agent
    assert IMPALAConfig().multi_agent(policies={"default_policy"}).is_multi_agent is False
    assert IMPALAConfig().multi_agent(policies=["x"]).is_multi_agent


@pytest.mark.parametrize(
    "change, field, words",
    [
        (dict(count_steps_by="episodes"), "count_steps_by", "env_steps"),
        (dict(policies_to_train=["p9"]), "policies_to_train", "p9"),
        (dict(policies_to_train=lambda pid, batch: True), "policies_to_train", "callable"),
        (dict(observation_fn=lambda **kw: None), "observation_fn", "None"),
        (dict(policies={"p0": (object, None, None, {})}), "policies", "policy class"),
        (dict(policies={"p0": (None, None, None, {"num_epochs": 2})}), "policies", "override"),
        (dict(policies={"a/b": None}), "policies", "without '/'"),
    ],
)
def test_bad_multi_agent_fields_name_the_field(change, field, words):
    config = ma_config().multi_agent(**change)
    with pytest.raises(ValueError) as err:
        config.validate()
    assert f"{field}=" in str(err.value) and words in str(err.value)


def test_what_multi_agent_runs_do_not_offer_yet_is_an_error():
    config = ma_config().evaluation(evaluation_interval=1)
    with pytest.raises(ValueError, match="evaluation_interval=1: evaluation of multi-agent"):
        config.validate()


def _trained(config, iterations=2):
    algo = config.build()
    assert isinstance(algo, MultiAgentIMPALA)
    results = [algo.train() for _ in range(iterations)]
    return algo, results


def test_two_policies_train_with_rllib_result_keys():
    algo, results = _trained(ma_config())
    try:
        result = results[-1]
        runners = result["env_runners"]
        assert set(runners["module_episode_returns_mean"]) == {"p0", "p1"}
        assert set(runners["agent_episode_returns_mean"]) == {"0", "1"}
        # MultiAgentCartPole pays 1 per agent step: the env return sums the agents'.
        per_agent = sum(runners["agent_episode_returns_mean"].values())
        assert runners["episode_return_mean"] == pytest.approx(per_agent, rel=0.5)
        learners = result["learners"]
        assert {"p0", "p1", "__all_modules__"} <= set(learners)
        for pid in ("p0", "p1"):
            assert np.isfinite(learners[pid]["total_loss"])
            assert learners[pid]["num_updates_lifetime"] >= 1
        assert result["num_env_steps_sampled_lifetime"] >= 400
        # Inference per policy, RLlib's surface.
        obs = np.zeros(4, np.float32)
        action = algo.compute_single_action(obs, policy_id="p1", explore=False)
        assert int(action) in (0, 1)
        assert algo.get_module("p0") is not None and algo.get_module("nope") is None
        out = algo.get_module("p0").forward_inference({"obs": obs[None]})
        assert out["action_dist_inputs"].shape == (1, 2)
        weights = algo.get_weights()
        assert set(weights) == {"p0", "p1"}
        with pytest.raises(ValueError, match="policy_id"):
            algo.compute_single_action(obs, policy_id="p7")
    finally:
        algo.stop()


def test_a_policy_not_in_policies_to_train_never_changes():
    config = ma_config().multi_agent(policies_to_train=["p0"])
    algo = config.build()
    try:
        before = algo.get_weights()
        for _ in range(2):
            algo.train()
        after = algo.get_weights()
    finally:
        algo.stop()
    for a, b in zip(jax.tree.leaves(before["p1"]), jax.tree.leaves(after["p1"]), strict=True):
        np.testing.assert_array_equal(a, b)
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before["p0"]), jax.tree.leaves(after["p0"]), strict=True)
    ]
    assert any(moved)


def test_one_shared_policy_over_every_agent():
    config = ma_config(num_agents=3).multi_agent(
        policies={"shared"}, policy_mapping_fn=lambda agent_id, episode, **kw: "shared"
    )
    algo, results = _trained(config, iterations=1)
    try:
        assert set(results[-1]["env_runners"]["module_episode_returns_mean"]) == {"shared"}
        # Three agents per env, one policy: three times the columns of one agent per update.
        assert algo.learner.step_spec.columns == 3 * 32 // 8
    finally:
        algo.stop()


def test_runner_threads_and_agent_step_counting():
    config = ma_config(num_env_runners=2).multi_agent(count_steps_by="agent_steps")
    algo, results = _trained(config, iterations=2)
    try:
        assert results[-1]["num_env_steps_sampled_lifetime"] > 0
        assert np.isfinite(results[-1]["learners"]["p0"]["total_loss"])
    finally:
        algo.stop()


def test_a_mapping_to_an_unknown_policy_names_it():
    config = ma_config().multi_agent(policy_mapping_fn=lambda agent_id, episode, **kw: "zz")
    with pytest.raises(ValueError, match="policy_mapping_fn returned 'zz'"):
        config.build()


def test_rllib_tuned_multi_agent_example_runs_with_its_import_swapped(tmp_path):
    example = REPO / "tests" / "rllib_examples" / "multi_agent_cartpole_impala.py"
    command = [
        sys.executable,
        "-m",
        "impala_jax.run",
        "--quiet",
        "--logdir",
        str(tmp_path),
        str(example),
        "--stop",
        "training_iteration=1",
        "--",
        "--num-env-runners=1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
