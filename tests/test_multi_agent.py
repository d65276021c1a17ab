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
    config = ma_config().evaluation(custom_evaluation_function=lambda algo, workers: {})
    with pytest.raises(ValueError, match="custom_evaluation_function=.*multi-agent"):
        config.validate()


def _trained(config, iterations=2):
    algo = config.build()
    assert isinstance(algo, MultiAgentIMPALA)
    results = [algo.train() for _ in range(iterations)]
    return algo, results


@pytest.fixture(scope="module")
def two_policies():
    """ma_config() built and trained for 2 iterations, shared by the tests that only read it."""
    algo, results = _trained(ma_config())
    try:
        yield algo, results
    finally:
        algo.stop()


def test_two_policies_train_with_rllib_result_keys(two_policies):
    algo, results = two_policies
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
        assert learners[pid]["policy_lag_mean"] >= 0  # lockstep: 0 or 1 behind
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


@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
def test_a_train_batch_counts_what_count_steps_by_names(count_steps_by):
    # Lockstep, two agents alive from the start: a batch of 32 agent steps is about 16 env
    # steps, one of 32 env steps at least 32. The first update waits for a first column.
    config = ma_config().multi_agent(count_steps_by=count_steps_by)
    with config.build() as algo:
        algo.engine.next_update()
        sampled = algo.engine.num_env_steps_sampled_lifetime
    if count_steps_by == "env_steps":
        assert sampled >= 32
    else:
        assert sampled < 32


def test_a_policys_own_config_overrides_its_numbers():
    # p0's lr is 0 (its params never move), p1 takes the config's.
    config = ma_config().multi_agent(policies={"p0": (None, None, None, {"lr": 0.0}), "p1": None})
    with config.build() as algo:
        before = algo.get_weights()
        result = algo.train()
        after = algo.get_weights()
    learners = result["learners"]
    assert learners["p0"]["default_optimizer_learning_rate"] == 0.0
    assert learners["p1"]["default_optimizer_learning_rate"] == pytest.approx(1e-3)
    for a, b in zip(jax.tree.leaves(before["p0"]), jax.tree.leaves(after["p0"]), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before["p1"]), jax.tree.leaves(after["p1"]), strict=True)
    )


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


@pytest.mark.parametrize(
    "name", ["multi_agent_cartpole_impala", "multi_agent_stateless_cartpole_impala"]
)
def test_rllib_tuned_multi_agent_examples_run_with_their_import_swapped(name, tmp_path):
    example = REPO / "tests" / "rllib_examples" / f"{name}.py"
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


@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_result_keys_are_the_schemas_and_pass_rllibs_check(num_env_runners, request):
    """RLlib's own check of a new-stack result (ray.rllib.utils.test_utils), and the CLI's
    schema of what train() reports (cli/result_schema.py), on real multi-agent results."""
    from ray.rllib.utils.test_utils import check_train_results_new_api_stack

    from impala_jax.cli import result_schema
    from impala_jax.rllib.results import flatten

    config = ma_config(num_env_runners=num_env_runners)
    schema = result_schema.result_schema(config)
    if num_env_runners == 0:  # ma_config() itself
        _, results = request.getfixturevalue("two_policies")
    else:
        with config.build() as algo:
            results = [algo.train() for _ in range(2)]
    for result in results:
        check_train_results_new_api_stack(result)
    keys = set(flatten(results[0])) | set(flatten(results[1]))
    assert sorted(k for k in keys if not schema.known(k)) == []
    not_yet = schema.episode_keys | schema.optional_keys
    assert sorted(schema.keys - keys - not_yet) == []
    assert "env_runners/module_episode_returns_mean/p1" in keys
    assert "env_runners/agent_episode_returns_mean/1" in keys


def _state(algo):
    arrays, replay = algo.learner.state_arrays()
    return arrays + replay


def test_save_restore_round_trips_every_policy_bit_for_bit(tmp_path):
    from impala_jax.rllib.algorithm import IMPALA

    config = ma_config().training(replay_proportion=1.0, replay_buffer_num_slots=16)
    with config.build() as algo:
        algo.train()
        saved = algo.save(tmp_path / "ckpt").checkpoint.path
        before = _state(algo)
    assert len(before) > 4
    with config.build() as fresh:
        fresh.restore(saved)
        for a, b in zip(before, _state(fresh), strict=True):
            np.testing.assert_array_equal(a, b)
    mapping = config.policy_mapping_fn
    # RLlib's MultiAgentCartPole is a class made inside a function: passed back, as the
    # mapping lambda.
    env = MultiAgentCartPole
    with pytest.raises(ValueError, match="policy_mapping_fn=fn"):
        IMPALA.from_checkpoint(saved, env=env)
    with IMPALA.from_checkpoint(saved, env=env, policy_mapping_fn=mapping) as restored:
        assert isinstance(restored, MultiAgentIMPALA)
        for a, b in zip(before, _state(restored), strict=True):
            np.testing.assert_array_equal(a, b)
        assert np.isfinite(restored.train()["learners"]["p0"]["total_loss"])
    # Another policy set, or a single-agent algorithm: a clear error naming both sets.
    other = ma_config(num_agents=3)
    with other.build() as algo, pytest.raises(ValueError, match=r"\['p0', 'p1'\]"):
        algo.restore(saved)
    from tests.test_algorithm import small_config

    with small_config().build() as single, pytest.raises(ValueError, match="p0"):
        single.restore(saved)


def test_a_mapping_output_that_is_no_policy_id_names_the_agent():
    config = ma_config().multi_agent(policy_mapping_fn=lambda agent_id, episode, **kw: 5)
    with pytest.raises(ValueError, match="returned 5 for agent 0"):
        config.build()


def test_episode_callbacks_are_an_error_and_algorithm_hooks_run():
    from impala_jax.rllib.callbacks import RLlibCallback

    class EpisodeEnd(RLlibCallback):
        def on_episode_end(self, **kwargs):
            pass

    with pytest.raises(ValueError, match="on_episode_end of multi-agent runs"):
        ma_config().callbacks(EpisodeEnd).build()
    seen = []

    def on_train_result(*, result, metrics_logger, **kwargs):
        seen.append(result)
        metrics_logger.log_value("my_count", len(seen), reduce="sum")

    config = ma_config().callbacks(on_train_result=on_train_result)
    with config.build() as algo:
        algo.train()
        second = algo.train()
    assert seen and "p0" in seen[0]["learners"]
    # What an algorithm-level hook logs lands in the next result, as in single-agent runs.
    assert second["my_count"] == 1


def test_the_readme_multi_agent_example_runs():
    text = (REPO / "README.md").read_text()
    start = text.index("  ```python\n  from ray.rllib.examples.envs.classes.multi_agent")
    block = text[start : text.index("  ```\n", start + 10)].split("\n", 1)[1]
    code = "\n".join(line[2:] for line in block.splitlines())
    quick = "IMPALAConfig().reporting(min_time_s_per_iteration=0)\n"
    code = code.replace("IMPALAConfig()\n", quick)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert "p0" in scope["result"]["learners"] and int(scope["action"]) in (0, 1)


class _Guess:
    """A PettingZoo parallel env (pettingzoo.utils.env.ParallelEnv's API): each of two agents
    sees a one-hot target and is paid 1 for naming it; 10 steps an episode."""

    metadata = {"name": "guess_v0"}

    def __init__(self, config=None):
        import gymnasium as gym

        self.possible_agents = ["a", "b"]
        self.agents = []
        self._obs_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._act_space = gym.spaces.Discrete(3)
        self._rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _observe(self):
        self._targets = {a: int(self._rng.integers(3)) for a in self.agents}
        return {a: np.eye(3, dtype=np.float32)[t] for a, t in self._targets.items()}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: float(actions[a] == self._targets[a]) for a in self.agents}
        self._t += 1
        done = self._t >= 10
        obs = self._observe()
        terminations = {a: False for a in self.agents}
        truncations = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def close(self):
        pass


def test_a_pettingzoo_parallel_env_trains_through_the_same_path():
    pettingzoo = pytest.importorskip("pettingzoo")

    class Guess(_Guess, pettingzoo.ParallelEnv):
        pass

    config = (
        ma_config()
        .environment(Guess, env_config={})
        .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=5)
        .training(lr=1e-2, gamma=0.5, vf_loss_coeff=0.1, train_batch_size_per_learner=40)
        .multi_agent(policies={"pa", "pb"}, policy_mapping_fn=lambda aid, ep, **kw: f"p{aid}")
        .reporting(min_sample_timesteps_per_iteration=2000, metrics_num_episodes_for_smoothing=20)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
    last = results[-1]["env_runners"]["agent_episode_returns_mean"]
    # Random guessing pays 10/3 per agent an episode; both policies learn to read the target
    # (a reward credited to the wrong row or agent would leave them guessing).
    assert set(last) == {"a", "b"} and min(last.values()) > 9.0


class _Crashing(MultiAgentCartPole):
    """MultiAgentCartPole whose first instances crash at their 30th step (later ones, built by
    a restart, do not)."""

    made = 0

    def __init__(self, config=None):
        super().__init__(config)
        type(self).made += 1
        self._crash_at = 30 if type(self).made <= 2 else None
        self._steps = 0

    def step(self, action_dict):
        self._steps += 1
        if self._steps == self._crash_at:
            raise RuntimeError("env crashed by the test")
        return super().step(action_dict)


@pytest.mark.parametrize("num_env_runners", [0, 2])
def test_a_crashed_runner_is_rebuilt_as_fault_tolerance_says(num_env_runners):
    from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure

    def config(**fault):
        _Crashing.made = 0
        return (
            ma_config(num_env_runners=num_env_runners, num_envs_per_env_runner=1)
            .environment(_Crashing)
            .fault_tolerance(delay_between_env_runner_restarts_s=0, **fault)
        )

    with config().build() as algo:
        results = [algo.train() for _ in range(3)]
    assert results[-1]["fault_tolerance"]["num_remote_worker_restarts"] >= 1
    assert np.isfinite(results[-1]["learners"]["p0"]["total_loss"])
    with config(restart_failed_env_runners=False).build() as algo:
        with pytest.raises(EnvRunnerFailure, match="env crashed by the test"):
            for _ in range(3):
                algo.train()


def test_ignoring_a_failed_runner_trains_on_with_the_others():
    _Crashing.made = 0  # the probe env (made first), then runner 0's env, which crashes
    config = (
        ma_config(num_env_runners=2, num_envs_per_env_runner=1)
        .environment(_Crashing)
        .fault_tolerance(restart_failed_env_runners=False, ignore_env_runner_failures=True)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
    assert results[-1]["fault_tolerance"]["num_healthy_workers"] == 1
    assert np.isfinite(results[-1]["learners"]["p1"]["total_loss"])


@pytest.mark.parametrize("parallel", [False, True])
def test_evaluation_runs_the_policies_greedily_on_their_own_envs(parallel):
    from impala_jax.cli import result_schema
    from impala_jax.rllib.results import flatten

    config = ma_config().evaluation(
        evaluation_interval=1,
        evaluation_duration=3 if not parallel else "auto",
        evaluation_num_env_runners=1 if parallel else 0,
        evaluation_parallel_to_training=parallel,
    )
    with config.build() as algo:
        result = algo.train()
        direct = algo.evaluate()
    evaluation = result["evaluation"]["env_runners"]
    assert evaluation["num_env_steps_sampled"] > 0
    if not parallel:  # "auto" evaluates as long as the training step it runs beside
        assert evaluation["num_episodes"] == 3 == direct["env_runners"]["num_episodes"]
        assert set(evaluation["module_episode_returns_mean"]) == {"p0", "p1"}
        assert np.isfinite(direct["env_runners"]["episode_return_mean"])
    schema = result_schema.result_schema(config)
    assert sorted(k for k in flatten(result) if not schema.known(k)) == []


def test_two_learner_devices_split_each_policys_batch():
    # conftest gives this process two CPU devices.
    config = ma_config().learners(num_learners=2)
    with config.build() as algo:
        assert algo.learner.num_devices == 2
        result = algo.train()
    # train_batch_size_per_learner=32 on each of 2 learners, as in RLlib.
    assert result["learners"]["p0"]["effective_total_train_batch_size"] == 64
    assert np.isfinite(result["learners"]["p1"]["total_loss"])
    assert algo.engine.spec.batch_steps == 64
