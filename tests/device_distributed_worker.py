"""One process of an on-device run (tests/test_device_distributed.py): ``python -m
tests.device_distributed_worker OUT [COORDINATOR NUM_PROCESSES PROCESS_ID]``; without the last
three, one process on the devices XLA_FLAGS gives it.

Trains the same small gymnax config (two learner devices, policy lag 1, mixin replay, an
evaluation) for three iterations and saves the params and each iteration's episode figures; over
several processes it then saves a checkpoint (process 0 writes it), trains on, restores the
checkpoint on every process and trains one more iteration.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ITERATIONS = 3
# Each iteration's figures that must equal one process's.
KEYS = ("episode_return_mean", "episode_return_max", "episode_len_mean", "num_episodes")


def config():
    from impala_jax import IMPALAConfig

    return (
        IMPALAConfig()
        .environment("gymnax:CartPole-v1")
        .env_runners(
            num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=20, policy_lag=1
        )
        .training(
            train_batch_size_per_learner=160,
            replay_proportion=0.5,
            replay_buffer_num_slots=8,
            lr=0.01,
        )
        .learners(num_learners=2)
        .evaluation(evaluation_interval=ITERATIONS, evaluation_duration=2)
        # Updates per iteration as in the one-process run: a count, never the clock.
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=1280)
        .debugging(seed=3)
    )


def _leaves(algo) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(algo.get_weights())]


def main(out: str, *join: str) -> None:
    if join:
        from impala_jax.runtime.process import distributed

        coordinator, n, me = join
        assert distributed.initialize(coordinator, int(n), int(me)) == int(n)
    saved = {}
    with config().build() as algo:
        results = [algo.train() for _ in range(ITERATIONS)]
        params = _leaves(algo)
        if join:
            checkpoint = algo.save(str(Path(out).parent / "checkpoint"))
            algo.train()
            algo.restore(checkpoint)
            saved = {f"restored_{i}": x for i, x in enumerate(_leaves(algo))}
            saved["after_restore"] = np.asarray(algo.train()["num_episodes_lifetime"])
    figures = {k: np.asarray([r["env_runners"][k] for r in results]) for k in KEYS}
    figures["num_env_steps_sampled_lifetime"] = np.asarray(
        [r["num_env_steps_sampled_lifetime"] for r in results]
    )
    evaluation = results[-1]["evaluation"]["env_runners"]
    figures["evaluation"] = np.asarray(
        [evaluation["episode_return_mean"], evaluation["num_episodes"]]
    )
    np.savez(out, *params, **figures, **saved)


if __name__ == "__main__":
    main(*sys.argv[1:])
