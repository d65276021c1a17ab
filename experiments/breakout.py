"""Atari Breakout (envpool "Breakout-v5") with the IMPALA paper's Atari settings.

Settings from Espeholt et al. 2018 (arXiv:1802.01561), Atari experiments and the
hyperparameter table of its appendix: the deep IMPALA ResNet (15 conv layers), unroll length 20,
32 trajectories per batch, discount 0.99, RMSProp (lr 6e-4, decay 0.99, epsilon 0.01, momentum 0)
with the learning rate decayed linearly to 0 over the budget, entropy cost 0.01, baseline cost
0.5, global-norm gradient clipping at 40, rewards clipped to [-1, 1] inside the loss (episode
returns stay raw).

Preprocessing is envpool's Atari default, the usual one (Mnih et al. 2015): 84x84 grayscale,
4 stacked frames, action repeat 4, up to 30 no-op starts, fire on reset, 27,000-step (108k-frame)
episode limit, no sticky actions. Life loss does not end an episode (returns are whole games),
and rewards reach the loss unclipped by envpool: ``clip_rewards=True`` clips them there.

Target: no tuned figure to hold it to; the settings are pong.py's (the paper used one setting for
all 57 games). The run stops at the 10 M env-step budget (40 M frames), or at a return of 400.
Sized for one GPU and ~16 cores: scale ``num_env_runners`` and ``num_envs_per_env_runner`` to
your cores.
"""

from impala_jax import IMPALAConfig

BUDGET = 10_000_000  # env steps

config = (
    IMPALAConfig()
    .environment(
        "Breakout-v5",
        env_config={"episodic_life": False, "reward_clip": False},
        clip_rewards=True,
    )
    .env_runners(
        num_env_runners=4,
        num_envs_per_env_runner=32,
        num_cpus_per_env_runner=4,  # envpool worker threads per runner
        rollout_fragment_length=20,
    )
    .training(
        train_batch_size_per_learner=32 * 20,
        opt_type="rmsprop",
        lr=[[0, 6e-4], [BUDGET, 0.0]],
        decay=0.99,
        epsilon=0.01,
        momentum=0.0,
        gamma=0.99,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
        grad_clip=40.0,
        grad_clip_by="global_norm",
    )
    .learners(num_learners=1)
    # The paper's deep network: three ResNet stacks (16, 32, 32 channels), then dense 256; its
    # optional LSTM is left out (impala_jax has none yet).
    .rl_module(model_config={"encoder": "impala_cnn"})
    .reporting(min_time_s_per_iteration=10)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 400, "num_env_steps_sampled_lifetime": BUDGET}
