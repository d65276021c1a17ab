"""A Ray Tune sweep of experiments/cartpole.py: learning rate x network width, 4 trials.

    .venv/bin/python -m impala_jax.run experiments/cartpole_sweep.py
    .venv/bin/python -m impala_jax.run experiments/cartpole_sweep.py --ray-address auto

The config is cartpole.py's (loaded from it) with two search spaces, so the CLI runs it as a sweep
(impala_jax/cli/sweep.py): a grid over ``lr`` and over ``fcnet_hiddens`` inside ``model_config``.
It shows how sensitive CartPole's time to 450 is to a constant learning rate (cartpole.py
anneals its rate from 0.002 to 0.00005 over 500 K env steps instead, see its comments) and
whether a smaller network learns as fast. At the end the CLI prints one line
per trial (its lr, fcnet_hiddens, iterations and last mean return) and the best trial's
checkpoint; runs/cartpole_sweep_TIMESTAMP/tune/ holds Tune's experiment, which
notebooks/sweep_analysis.ipynb plots (``IMPALA_JAX_SWEEP=runs/cartpole_sweep_TIMESTAMP``).

Each trial asks Ray for 2 CPUs (the main process and learner, plus one runner thread:
impala_jax.rllib.ray_tune.trial_resources), so a 2-core machine runs the trials one after
another and a machine with 8 cores runs all four at once. Needs the tune extra
(``.venv/bin/pip install -e ".[tune]"``).

Goal: each trial a return of 450 within 3 M env steps (cartpole.py's stop); not measured here.
"""

from pathlib import Path

from ray import tune

from impala_jax.cli.experiment import load_experiment

# cartpole.py's config and stop, with two of its settings swept.
config, stop = load_experiment(Path(__file__).with_name("cartpole.py"))
config.training(lr=tune.grid_search([5e-4, 1e-3])).rl_module(
    model_config={
        "fcnet_hiddens": tune.grid_search([[64, 64], [32, 32]]),
        "fcnet_activation": "tanh",
    }
)

# Samples of the search space: a grid is run this many times (each with the same seed here).
num_samples = 1
