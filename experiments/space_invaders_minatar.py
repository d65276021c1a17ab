"""SpaceInvaders-MinAtar (gymnax), on device: breakout_minatar.py's settings, another game.

MinAtar (Young & Tian 2019): a 10x10 grid of 6 channels, 4 actions (no-op, left, right, fire),
1 point per alien shot; gymnax caps an episode at 1,000 steps. The network and settings are
breakout_minatar.py's (a relu MLP of 64-64 on the flattened grid, mixin replay 1:1, lr 2e-3);
the sweeps that chose them are in benchmarks/README.md ("MinAtar").

Goal: a return of 131 within 10 M env steps (the stop below), gymnax-blines' PPO return after
10 M (gymnax's README); measured: 143.5 at 10 M env steps (mean of 3 seeds, the MinAtar table in
benchmarks/README.md, `make bench-minatar`).
"""

from pathlib import Path

from impala_jax.cli.experiment import load_experiment

config, _ = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
config.environment("gymnax:SpaceInvaders-MinAtar")

stop = {"env_runners/episode_return_mean": 131, "num_env_steps_sampled_lifetime": 10_000_000}
