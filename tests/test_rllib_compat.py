"""RLlib 2.60's own IMPALA material, run with only the import line swapped.

The docstring example, the config blocks of RLlib's tuned IMPALA examples (as
rllib/tuned_examples/impala/*.py publish them), the assertions of RLlib's
``test_impala_lr_schedule``, and RLlib's result check. ray is installed by the test extra.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_jax import IMPALAConfig  # the only change: was ray.rllib.algorithms.impala

ray = pytest.importorskip("ray")
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.rllib.utils.metrics import (  # noqa: E402
    ENV_RUNNER_RESULTS,
    EPISODE_RETURN_MEAN,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)
from ray.rllib.utils.test_utils import (  # noqa: E402
    add_rllib_example_script_args,
    check_train_results_new_api_stack,
)

DEFAULT_POLICY_ID = "default_policy"


def example_args(**defaults):
    """What RLlib's example scripts parse, for a run with no command-line arguments."""
    parser = add_rllib_example_script_args(**defaults)
    parser.set_defaults(enable_new_api_stack=True)
    return parser.parse_args([])


def train_twice(config, check_built=None) -> list[dict]:
    """Two iterations of a fresh build; `check_built(algo)` first, where given."""
    algo = config.build()
    try:
        if check_built is not None:
            check_built(algo)
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for result in results:
        check_train_results_new_api_stack(result)
    return results


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_docstring_example_runs_verbatim():
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(lr=0.0003, train_batch_size_per_learner=512)
        .learners(num_learners=1)
    )
    # Build a Algorithm object from the config and run 1 training iteration.
    algo = config.build()
    result = algo.train()
    del algo
    check_train_results_new_api_stack(result)
    # 512 is rounded up to 11 whole fragments of 50 (as RLlib packs them): 550 per update.
    learner = result[LEARNER_RESULTS][DEFAULT_POLICY_ID]
    assert learner["effective_train_batch_size_per_learner"] == 550
    assert learner["effective_total_train_batch_size"] == 550
    assert learner["num_updates_lifetime"] >= 1
    assert result["num_env_steps_trained_lifetime"] == 550 * learner["num_updates_lifetime"]
    trained = result[LEARNER_RESULTS]["__all_modules__"]["num_env_steps_trained"]
    assert trained > 0 and trained % 550 == 0


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_tuned_cartpole_example():
    args = example_args(default_reward=450.0, default_timesteps=2000000)
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .training(
            train_batch_size_per_learner=500,
            grad_clip=40.0,
            grad_clip_by="global_norm",
            lr=0.0005 * ((args.num_learners or 1) ** 0.5),
            vf_loss_coeff=0.05,
            entropy_coeff=0.0,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                vf_share_layers=True,
            ),
        )
    )
    results = train_twice(config)
    assert results[-1][NUM_ENV_STEPS_SAMPLED_LIFETIME] > results[0][NUM_ENV_STEPS_SAMPLED_LIFETIME]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_tuned_stateless_cartpole_example_is_recurrent():
    # RLlib's own StatelessCartPole env class (velocities removed) and its config block.
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

    args = example_args(default_reward=350.0, default_timesteps=2000000)
    args.num_env_runners = 3  # the example's parser.set_defaults
    config = (
        IMPALAConfig()
        .api_stack(
            enable_rl_module_and_learner=True,
            enable_env_runner_and_connector_v2=True,
        )
        .environment(StatelessCartPole)
        .training(
            learner_queue_size=1,
            lr=0.0005 * ((args.num_learners or 1) ** 0.5),
            vf_loss_coeff=0.05,
            entropy_coeff=0.0,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                vf_share_layers=True,
                use_lstm=True,
                max_seq_len=20,
            ),
        )
    )
    config.env_runners(num_env_runners=args.num_env_runners)  # as RLlib's example runner does

    def recurrent(algo):
        assert algo.recurrent and set(algo.get_initial_state()) == {"lstm"}

    results = train_twice(config, recurrent)
    assert results[-1]["learners"][DEFAULT_POLICY_ID]["num_updates_lifetime"] >= 1


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_tuned_pendulum_example():
    args = example_args()
    config = (
        IMPALAConfig()
        .env_runners(num_envs_per_env_runner=5)
        .environment("Pendulum-v1")
        .training(
            train_batch_size_per_learner=256,
            grad_clip=40.0,
            grad_clip_by="global_norm",
            lr=0.0003 * ((args.num_learners or 1) ** 0.5),
            vf_loss_coeff=0.05,
            entropy_coeff=[[0, 0.1], [2000000, 0.0]],
        )
        .rl_module(
            model_config=DefaultModelConfig(
                vf_share_layers=True,
                fcnet_hiddens=[512, 512],
            ),
        )
    )
    stop = {
        f"{ENV_RUNNER_RESULTS}/{EPISODE_RETURN_MEAN}": -200.0,
        NUM_ENV_STEPS_SAMPLED_LIFETIME: 5000000,
    }
    results = train_twice(config)
    assert np.isfinite(results[-1][ENV_RUNNER_RESULTS][EPISODE_RETURN_MEAN])
    assert all(k.split("/")[0] in results[-1] for k in stop)
    # 256 steps are packed as whole fragments of 50: 300 per update.
    trained = results[-1][LEARNER_RESULTS]["__all_modules__"]["num_env_steps_trained_lifetime"]
    assert trained > 0 and trained % 300 == 0


class EnlargeObs(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(
            -10.0,
            10.0,
            shape=(1024,),
            dtype=np.float32,
        )

    def observation(self, observation):
        return np.concatenate([observation, np.random.random(size=(1024 - observation.shape[0]))])


@pytest.mark.timeout(420)
@pytest.mark.slow
def test_tuned_heavy_cartpole_example():
    from ray import tune

    tune.register_env("heavy-cart", lambda cfg: EnlargeObs(gym.make("CartPole-v1")))
    example_args(default_reward=450.0, default_timesteps=2000000)
    config = (
        IMPALAConfig()
        .environment("heavy-cart")
        .training(
            num_aggregator_actors_per_learner=2,
            train_batch_size_per_learner=500,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[2048, 2048, 2048],
                vf_share_layers=False,
            ),
        )
        .evaluation(
            evaluation_interval=1,
            evaluation_num_env_runners=2,
            evaluation_duration="auto",
            evaluation_parallel_to_training=True,
        )
    )
    results = train_twice(config)
    assert "evaluation" in results[-1]


@pytest.mark.timeout(300)
def test_impala_lr_schedule():
    # RLlib's test_impala_lr_schedule, the import swapped. RLlib also reads the first lr off
    # its torch optimizer (`algo.learner_group._learner.get_optimizer()`), which has no
    # counterpart here; the first result's learning rate is checked instead. One more change:
    # iterations of 1 s, not IMPALA's 10 s. impala_jax samples these 4 CartPole envs at 7-11 K
    # env steps/s on 2 cores (RLlib: a tenth of that), so a 10 s iteration can pass the
    # schedule's 100 K env steps by the first result (measured: 70 K, and over 100 K in one CI
    # run, lr1 == lr3 == 1e-6), and the test would then measure the machine, not the schedule.
    config = (
        IMPALAConfig()
        .api_stack(
            enable_rl_module_and_learner=True,
            enable_env_runner_and_connector_v2=True,
        )
        .learners(num_learners=0)
        .training(
            lr=[
                [0, 0.05],
                [100000, 0.000001],
            ],
            train_batch_size=100,
        )
        .env_runners(num_envs_per_env_runner=2)
        .environment(env="CartPole-v1")
        .reporting(min_time_s_per_iteration=1)
    )

    def get_lr(result):
        return result[LEARNER_RESULTS][DEFAULT_POLICY_ID]["default_optimizer_learning_rate"]

    algo = config.build()
    try:
        for _ in range(1):
            r1 = algo.train()
        for _ in range(2):
            r2 = algo.train()
        for _ in range(2):
            r3 = algo.train()
        lr1 = get_lr(r1)
        lr2 = get_lr(r2)
        lr3 = get_lr(r3)
        assert lr2 <= lr1, (lr1, lr2)
        assert lr3 <= lr2, (lr2, lr3)
        assert lr3 < lr1, (lr1, lr3)
        assert lr1 <= 0.05
    finally:
        algo.stop()


def test_multi_agent_example_builds_its_config():
    # rllib/tuned_examples/impala/multi_agent_cartpole_impala.py, in essence; it trains in
    # tests/test_multi_agent.py.
    config = (
        IMPALAConfig()
        .environment("multi_agent_cartpole", env_config={"num_agents": 2})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, eps, **kw: f"p{aid}",
        )
    )
    assert config.is_multi_agent and set(config.policies) == {"p0", "p1"}
