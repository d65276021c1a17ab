"""A Ray Tune sweep of the MinAtar experiments' settings: 4 trials, run on one game.

    .venv/bin/python -m impala_jax.run experiments/minatar_sweep.py \
        environment.env=gymnax:Asterix-MinAtar

The config is breakout_minatar.py's (loaded from it, the game set on the command line) with a
grid over ``lr`` (constant or annealed) and ``gamma`` at an MLP of 128-128; 2 trials run at a
time on a 2-core machine. benchmarks/README.md ("MinAtar") has what this grid and the two
before it (MLP width x ``entropy_coeff``, ``lr`` x ``num_epochs``) found, and the settings each
game's experiment took from them. Needs the tune extra (``.venv/bin/pip install -e ".[tune]"``).
"""

from pathlib import Path

from ray import tune

from impala_jax.cli.experiment import load_experiment

config, stop = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
ANNEALED = [[0, 2e-3], [10_000_000, 1e-5]]  # RLlib's schedule: [[env steps, value], ...]
config.training(lr=tune.grid_search([1e-3, ANNEALED]), gamma=tune.grid_search([0.99, 0.995]))
config.rl_module(
    model_config={"encoder": "mlp", "fcnet_hiddens": [128, 128], "fcnet_activation": "relu"}
)
stop = {"num_env_steps_sampled_lifetime": 10_000_000}
num_samples = 1
