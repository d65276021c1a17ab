"""Learning tests: a broken V-trace can pass every unit test and only stop learning."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def experiment(name):
    spec = importlib.util.spec_from_file_location(
        f"exp_{name}", ROOT / "experiments" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.config


def train_until(config, key, threshold, max_steps, kill_every=None):
    best = -np.inf
    with config.build() as algo:
        while True:
            result = algo.train()
            value = result["env_runners"][key]
            best = max(best, value) if value == value else best
            if best >= threshold or result["num_env_steps_sampled_lifetime"] >= max_steps:
                return best, result
            if kill_every and result["training_iteration"] % kill_every == 0:
                # Break one runner's env: its thread fails and fault tolerance replaces it.
                runner = next(iter(algo._threads.values())).runner

                def broken(*args, **kwargs):
                    raise RuntimeError("runner killed by the test")

                for group in runner.groups:
                    group.env.send = broken


@pytest.mark.timeout(240)
def test_cartpole_learns():
    config = experiment("cartpole")
    best, result = train_until(config, "episode_return_mean", 300, 3_000_000)
    assert best >= 300, result["env_runners"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cartpole_reaches_450():
    best, result = train_until(experiment("cartpole"), "episode_return_mean", 450, 5_000_000)
    assert best >= 450, result["env_runners"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cartpole_reaches_450_while_runners_are_killed():
    config = (
        experiment("cartpole")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=32)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0)
    )
    best, result = train_until(config, "episode_return_mean", 450, 8_000_000, kill_every=3)
    assert best >= 450, result["env_runners"]
    assert result["fault_tolerance"]["num_remote_worker_restarts"] >= 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pendulum_beats_random():
    # A uniformly random policy scores about -1200 to -1400 on Pendulum-v1.
    best, result = train_until(experiment("pendulum"), "episode_return_mean", -400, 4_000_000)
    assert best >= -400, result["env_runners"]
