"""A Ray Tune sweep of the MinAtar experiments' settings: 4 trials, run on one game.

    .venv/bin/python -m impala_jax.run experiments/minatar_sweep.py
    .venv/bin/python -m impala_jax.run experiments/minatar_sweep.py \
        environment.env=gymnax:Freeway-MinAtar

The config is breakout_minatar.py's (loaded from it) on Asterix, or the game the command line
sets, with a grid over ``lr`` (constant or annealed) and ``gamma`` at an MLP of 128-128; 2 trials
run at a time on a 2-core machine. benchmarks/README.md ("MinAtar") has what the two grids before
it found (MLP width x ``entropy_coeff``, ``lr`` x ``num_epochs``), and why this one was stopped
at 2 M env steps for single runs (Tune's trials ran at 13 K env steps/s each, 6x below one run).
Needs the tune extra (``.venv/bin/pip install -e ".[tune]"``).

Goal: each trial a return of 15 within 10 M env steps (asterix_minatar.py's, the stop below).
"""

from pathlib import Path

from ray import tune

from impala_jax.cli.experiment import load_experiment

config, stop = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
config.environment("gymnax:Asterix-MinAtar")
ANNEALED = [[0, 2e-3], [10_000_000, 1e-5]]  # RLlib's schedule: [[env steps, value], ...]
config.training(lr=tune.grid_search([1e-3, ANNEALED]), gamma=tune.grid_search([0.99, 0.995]))
config.rl_module(
    model_config={"encoder": "mlp", "fcnet_hiddens": [128, 128], "fcnet_activation": "relu"}
)
stop = {"env_runners/episode_return_mean": 15, "num_env_steps_sampled_lifetime": 10_000_000}
num_samples = 1
