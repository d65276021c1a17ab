"""Breakout-MinAtar, a population of 8 trained with population-based training in one program.

    .venv/bin/python -m impala_jax.run experiments/breakout_minatar_pbt.py [--devices 2]

(``--devices 2``: the members spread over two CPU devices, one per core; 1.4x faster here.)

breakout_minatar.py's config (loaded from it), with each member's lr drawn log-uniformly in
[1e-4, 1e-2] and its entropy_coeff in [1e-3, 3e-2]. Every 250 K env steps per member the
bottom quarter of the members (2 of 8), ranked by the mean return of the episodes that ended in
the interval, copy the params, optimizer state and hyperparameters of one of the top 2, then
multiply each hyperparameter by 1.2 or 0.8, or (with probability 0.25) draw it anew: Ray Tune's
``PopulationBasedTraining``, here inside the compiled program (rllib/population.py). The run
directory holds a result file per member, the lineage and a plot of the population's curves.
``loguniform`` is Tune's ``tune.loguniform`` without importing ray (Tune's own works too).

Goal: the best member a return of 28 within 5 M env steps (per member; gymnax-blines' PPO return
after 10 M env steps), and PBT above the same 8 members with exploit off (median of 3 seeds of
the whole experiment; ``make bench-pbt``, benchmarks/README.md "Population-based training");
measured (2026-12-08, the best member's interval mean): seed 1 passed 28 at 2.51 M and ended at
88.3, seed 0 passed it at 4.26 M, seed 2 ended at 17.5 (benchmarks/README.md).
"""

from pathlib import Path

from impala_jax import PopulationBasedTraining
from impala_jax.cli.experiment import load_experiment
from impala_jax.rllib.pbt_spec import loguniform

config, _ = load_experiment(Path(__file__).with_name("breakout_minatar.py"))
config.training(lr=loguniform(1e-4, 1e-2), entropy_coeff=loguniform(1e-3, 3e-2))

num_members = 8
scheduler = PopulationBasedTraining(
    time_attr="num_env_steps_sampled_lifetime",
    perturbation_interval=250_000,
    hyperparam_mutations={
        "lr": loguniform(1e-4, 1e-2),
        "entropy_coeff": loguniform(1e-3, 3e-2),
    },
)
stop = {"env_runners/episode_return_mean": 28, "num_env_steps_sampled_lifetime": 5_000_000}
