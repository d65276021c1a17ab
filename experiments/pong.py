"""Atari Pong (envpool "Pong-v5") with the IMPALA paper's Atari settings.

Settings from Espeholt et al. 2018 (arXiv:1802.01561), Atari experiments and the
hyperparameter table of its appendix: the deep IMPALA ResNet (15 conv layers), unroll length 20,
32 trajectories per batch, discount 0.99, RMSProp (lr 6e-4, decay 0.99, epsilon 0.01, momentum 0)
with the learning rate decayed linearly to 0 over the budget, entropy cost 0.01, baseline cost
0.5, global-norm gradient clipping at 40, rewards clipped to [-1, 1] inside the loss (episode
returns stay raw).

Preprocessing is envpool's Atari default, the usual one (Mnih et al. 2015): 84x84 grayscale,
4 stacked frames, action repeat 4, up to 30 no-op starts, fire on reset, 27,000-step (108k-frame)
episode limit, no sticky actions. Life loss does not end an episode (Pong has no lives anyway),
and rewards reach the loss unclipped by envpool: ``clip_rewards=True`` clips them there.

The loss is **summed** over the batch's rows (``loss_reduction="sum"``), as in the paper's
code: its RMSProp constants belong to that scale. With impala_jax's default, RLlib's mean loss,
the gradient is 640 times smaller; RMSProp's epsilon (inside the square root) and its mean
square starting at 1 then swamp it, each update moves the params about 0.003 x lr in root mean
square instead of 0.02-0.3 x lr, and the policy stays uniform (measured: entropy ln 6 = 1.79
for 3 M frames). The build warns when that happens; docs/config.md, "Loss reduction", has the
numbers.

Goal: a return of 20 within 10 M env steps (the stop below: RLlib's tuned IMPALA Pong example
reaches it within 10 M agent steps, i.e. 40 M frames); not measured here.

Sizing. As written: one GPU and 16 cores (4 runners x 32 envs, 4 envpool threads each). On a
2-core CPU the deep network's learner step is too slow (about 50 samples/s), and even the Nature
CNN costs 49 minutes per 1 M env steps at 84 x 84. Frames of 42 x 42 (envpool resizes them; RLlib's
own fast Pong example trains on 42 x 42 too) make its convolutions about 13 times cheaper, so a
CPU can afford four passes over each batch. Measured (2026-12-02, benchmarks/README.md, "Atari
learning", fourth look: run q4): 1 M env steps in 10.7 minutes (1,564 env steps/s) with::

    python -m impala_jax.run experiments/pong.py \
        environment.env_config.img_height=42 environment.env_config.img_width=42 \
        env_runners.num_env_runners=1 env_runners.num_envs_per_env_runner=64 \
        env_runners.rollout_fragment_length=20 env_runners.num_cpus_per_env_runner=1 \
        training.train_batch_size_per_learner=1280 training.minibatch_size=320 \
        training.num_epochs=4 learners.num_learners=0 rl_module.model_config.encoder=nature_cnn \
        training.opt_type=rmsprop training.lr=5e-4 training.decay=0.99 training.epsilon=1e-5 \
        training.grad_clip=0.5 training.loss_reduction=mean \
        --stop num_env_steps_sampled_lifetime=1000000

(A2C's RMSProp on the mean loss there: it keeps the CNN's units alive where Adam empties them.)
What it learns on a CPU so far: the value does (explained variance 0.5-0.9 within 1 M env
steps), the policy not yet: the entropy dips to 1.2-1.7 and comes back to within 1-2 % of
ln 6, and the return stays at -20.1 to -20.3 after 1 M env steps. A PPO loop on the same env,
frames and network (benchmarks/pong_ppo_reference.py) does no better in 1 M env steps.

The Nature CNN is the likely culprit (benchmarks/encoder_probe.py): trained supervised to say
whether the ball is left of, under or right of the paddle, it stays at chance for 600-1,000
steps at 42 x 42 and 84 x 84, where this file's IMPALA ResNet is right 95 % of the time by step
250, even with channels [8, 16, 16]. That small ResNet at 42 x 42 costs about 8 times the
Nature CNN at 42 x 42 per trained row and still runs 1 M env steps in 43 minutes here (2
epochs). It learns Pong on this CPU (2026-12-03, run j42, benchmarks/README.md, "sixth look"):
the return passed -18 at 754 K env steps and was -17.4 at 1 M; the entropy fell from ln 6 =
1.79 to 1.61 (single iterations 1.37-1.48). With the entropy coefficient halved to 0.005 (run
k42, "seventh look") the return passed -18 at 829 K and reached -9.4 at 1 M, the entropy 1.40.
Those settings are experiments/pong_cpu.py::

    python -m impala_jax.run experiments/pong_cpu.py
"""

from impala_jax import IMPALAConfig

BUDGET = 10_000_000  # env steps

config = (
    IMPALAConfig()
    .environment(
        "Pong-v5",
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
        loss_reduction="sum",  # the paper's; see the docstring
    )
    .learners(num_learners=1)
    # The paper's deep network: three ResNet stacks (16, 32, 32 channels), then dense 256; its
    # optional LSTM is left out (model_config use_lstm=True adds one).
    .rl_module(model_config={"encoder": "impala_cnn"})
    .reporting(min_time_s_per_iteration=10)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 20, "num_env_steps_sampled_lifetime": BUDGET}
