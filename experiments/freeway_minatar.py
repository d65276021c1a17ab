"""Freeway-MinAtar (gymnax), on device: breakout_minatar.py's settings at lr 1e-3.

MinAtar (Young & Tian 2019): a 10x10 grid of 7 channels, 3 actions (no-op, up, down), 1 point
each time the chicken crosses the road; gymnax caps an episode at 2,500 steps. The network is
breakout_minatar.py's (a relu MLP of 64-64 on the flattened grid); lr 1e-3 from the sweeps in
benchmarks/README.md ("MinAtar"): seed 0 reached 58.5 at 6.1 M and 59.5 at 9.2 M env steps,
against 57.1 at 5.0 M and 58.9 at 9.6 M at lr 2e-3. The return levels off near 60.

Goal: a return of 58 within 10 M env steps (the stop below), gymnax-blines' PPO return after
10 M (gymnax's README); measured: 59.6 at 10 M env steps (mean of 3 seeds, the MinAtar table in
benchmarks/README.md, `make bench-minatar`).
"""

from pathlib import Path

from impala_jax.cli.experiment import load_experiment

config, _ = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
config.environment("gymnax:Freeway-MinAtar").training(lr=1e-3)

stop = {"env_runners/episode_return_mean": 58, "num_env_steps_sampled_lifetime": 10_000_000}
