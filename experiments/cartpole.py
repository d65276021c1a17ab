"""CartPole-v1 to a return of 450 in seconds on 2 CPU cores.

Starts from RLlib's tuned IMPALA CartPole example (lr 5e-4, vf_loss_coeff 0.5-ish, entropy 0)
and adapts it to this machine: many envs per runner (envpool steps them in C++), short
fragments, a small network and a larger learning rate, so that the learner is not the
bottleneck on a CPU.
"""

from impala_jax import IMPALAConfig

config = (
    IMPALAConfig()
    .environment("CartPole-v1")
    .env_runners(num_env_runners=1, num_envs_per_env_runner=64, rollout_fragment_length=20)
    .training(
        lr=0.003,
        train_batch_size_per_learner=1280,
        vf_loss_coeff=0.5,
        entropy_coeff=0.0,
        grad_clip=40.0,
        gamma=0.99,
    )
    .learners(num_learners=0)
    .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"})
    .reporting(min_time_s_per_iteration=1.0)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 450, "num_env_steps_sampled_lifetime": 3_000_000}
