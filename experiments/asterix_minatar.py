"""Asterix-MinAtar (gymnax), on device: breakout_minatar.py's settings at lr 1e-3, MLP 128-128.

MinAtar (Young & Tian 2019): a 10x10 grid of 4 channels, 5 actions (no-op and four moves),
1 point per treasure, the episode ends on an enemy; gymnax caps it at 1,000 steps. A slower
learner than Breakout: at breakout_minatar.py's lr 2e-3 and 64-64 it reached 7.7 at 9.3 M env
steps; this experiment's lr and width are what the sweeps in benchmarks/README.md ("MinAtar")
found (seed 0: 15.5 at 6.0 M, 22.5 at 10 M env steps, 84 K env steps/s).

Goal: a return of 15 within 10 M env steps (the stop below), gymnax-blines' PPO return after
10 M (gymnax's README); measured: 17.2 at 10 M env steps (mean of 3 seeds, the MinAtar table in
benchmarks/README.md, `make bench-minatar`).
"""

from pathlib import Path

from impala_jax.cli.experiment import load_experiment

config, _ = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
config.environment("gymnax:Asterix-MinAtar").training(lr=1e-3)
config.rl_module(
    model_config={"encoder": "mlp", "fcnet_hiddens": [128, 128], "fcnet_activation": "relu"}
)

stop = {"env_runners/episode_return_mean": 15, "num_env_steps_sampled_lifetime": 10_000_000}
