"""Breakout-MinAtar (gymnax), on device: the envs, acting and the update in one program.

MinAtar (Young & Tian 2019, arXiv 1903.03176) shrinks Atari games to a 10x10 grid with one
channel per object: here 4 channels and 3 actions (no-op, left, right), 1 point per brick.
A random policy scores 0.41 per episode (17,101 episodes).

The network is PureJaxRL's for MinAtar (examples/brax_minatar.ipynb): a relu MLP of 64-64 on
the flattened grid, here shared by the policy and value heads (30,084 params). MinAtar's own
network (one 3x3 convolution of 16 channels, dense 128: ``encoder="nature_cnn"``,
``conv_filters=[[16, 3, 1, "valid"]]``, ``post_fcnet_hiddens=[128]``, 132,308 params) trained
at 23 K env steps/s on this 2-core CPU against 166 K for this MLP, and was at 6.4 after 1.5 M
env steps where the MLP passed 20 at 1.3 M (2026-12-07, seed 0): XLA's CPU convolutions are
the cost.
Four minibatch updates per batch with mixin replay and lr 2e-3 (measured 2026-12-05 with a
larger network: one update per batch at lr 5e-4 sat at 5.4 from 0.75 M env steps).

Goal: a return of 28 within 5 M env steps (the stop below), gymnax-blines' PPO return after 10 M
(gymnax's README); measured: 34.5 at 5 M env steps (mean of 3 seeds, the MinAtar table in
benchmarks/README.md, `make bench-minatar`).
"""

from impala_jax import IMPALAConfig

config = (
    IMPALAConfig()
    .environment("gymnax:Breakout-MinAtar")
    .env_runners(num_env_runners=0, num_envs_per_env_runner=128, rollout_fragment_length=20)
    .training(
        lr=2e-3,
        train_batch_size_per_learner=2560,
        minibatch_size=640,
        num_epochs=1,
        gamma=0.99,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
        replay_proportion=1.0,
        replay_buffer_num_slots=1280,
        grad_clip=40.0,
    )
    .learners(num_learners=0)
    .rl_module(
        model_config={"encoder": "mlp", "fcnet_hiddens": [64, 64], "fcnet_activation": "relu"}
    )
    .reporting(min_time_s_per_iteration=1)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 28, "num_env_steps_sampled_lifetime": 5_000_000}
