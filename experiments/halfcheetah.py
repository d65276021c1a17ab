"""MuJoCo HalfCheetah on envpool ("envpool:HalfCheetah-v5"), Box actions.

The "envpool:" prefix asks for envpool's variant explicitly: a plain "HalfCheetah-v5" is
gymnasium's (which needs mujoco installed), since the two drift apart within a few steps.

IMPALA's paper has no MuJoCo runs, so the settings follow what works for on-policy actor-critics
on MuJoCo (the PPO defaults of Schulman et al. 2017 and CleanRL): Adam at 3e-4, separate
256x256 tanh policy and value networks, a state-independent log-std, no entropy bonus,
gamma 0.99; actions are sampled in [-1, 1] and rescaled to the action bounds
(``normalize_actions``). IMPALA's V-trace corrects the policy lag of the asynchronous actors.

Goal: a return of 3000 within 10 M env steps (the stop below); not measured here.
"""

from impala_jax import IMPALAConfig

BUDGET = 10_000_000  # env steps

config = (
    IMPALAConfig()
    .environment("envpool:HalfCheetah-v5", normalize_actions=True)
    .env_runners(
        num_env_runners=2,
        num_envs_per_env_runner=32,
        num_cpus_per_env_runner=4,  # envpool worker threads per runner
        rollout_fragment_length=32,
    )
    .training(
        train_batch_size_per_learner=64 * 32,
        lr=[[0, 3e-4], [BUDGET, 0.0]],
        gamma=0.99,
        vf_loss_coeff=0.5,
        entropy_coeff=0.0,
        grad_clip=0.5,
    )
    .learners(num_learners=1)
    .rl_module(
        model_config={
            "fcnet_hiddens": [256, 256],
            "fcnet_activation": "tanh",
            "vf_share_layers": False,
            "free_log_std": True,
        }
    )
    .reporting(min_time_s_per_iteration=5)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 3000, "num_env_steps_sampled_lifetime": BUDGET}
