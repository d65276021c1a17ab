"""A Ray Tune sweep of experiments/cartpole.py: learning rate x network width, 4 trials.

    python -m impala_jax.run experiments/cartpole_sweep.py
    python -m impala_jax.run experiments/cartpole_sweep.py --ray-address auto   # a cluster

The config is cartpole.py's with two search spaces, so the CLI runs it as a sweep
(impala_jax/sweep.py): a grid over ``lr`` and over ``fcnet_hiddens`` inside ``model_config``,
each trial stopped at a mean return of 450 or after 3M env steps. It shows how sensitive
CartPole's time to 450 is to the learning rate (cartpole.py picked 0.001 for stability, see
its comments) and whether a smaller network learns as fast. At the end the CLI prints one line
per trial (its lr, fcnet_hiddens, iterations and last mean return) and the best trial's
checkpoint; runs/cartpole_sweep_TIMESTAMP/tune/ holds Tune's experiment, which
notebooks/sweep_analysis.ipynb plots (``IMPALA_JAX_SWEEP=runs/cartpole_sweep_TIMESTAMP``).

Each trial asks Ray for 2 CPUs (the main process and learner, plus one runner thread:
impala_jax.ray_tune.trial_resources), so a 2-core machine runs the trials one after another and
a machine with 8 cores runs all four at once.
"""

from ray import tune

from impala_jax import IMPALAConfig

config = (
    IMPALAConfig()
    .environment("CartPole-v1")
    .env_runners(num_env_runners=1, num_envs_per_env_runner=256, rollout_fragment_length=10)
    .training(
        lr=tune.grid_search([5e-4, 1e-3]),
        train_batch_size_per_learner=2560,
        minibatch_size=640,
        vf_loss_coeff=0.02,
        entropy_coeff=0.0,
        grad_clip=40.0,
        gamma=0.99,
        num_gpu_loader_threads=1,
    )
    .learners(num_learners=0)
    .rl_module(
        model_config={
            "fcnet_hiddens": tune.grid_search([[64, 64], [32, 32]]),
            "fcnet_activation": "tanh",
        }
    )
    .reporting(min_time_s_per_iteration=0.25)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 450, "num_env_steps_sampled_lifetime": 3_000_000}

# Samples of the search space: a grid is run this many times (each with the same seed here).
num_samples = 1
