"""One process of a multi-process test (tests/test_distributed.py): ``python -m
tests.distributed_worker MODE COORDINATOR NUM_PROCESSES PROCESS_ID OUT``.

``COLLECTIVE_TIMEOUT_S`` / ``HEARTBEAT_TIMEOUT_S`` in the environment set
distributed.initialize's bounds (the lost-peer tests).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def _config(me: int, num_env_runners: int):
    from impala_jax import IMPALAConfig

    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=num_env_runners, num_envs_per_env_runner=4, rollout_fragment_length=8
        )
        .training(train_batch_size_per_learner=32)
        .learners(num_learners=2)
        # Process 0's clock ends each iteration; process 1 follows.
        .reporting(min_time_s_per_iteration=1.0 if me == 0 else 0)
        .debugging(seed=3)
    )
    if num_env_runners:  # with threads, also an evaluation (process 0's, sent to both)
        config.evaluation(evaluation_interval=2, evaluation_duration=3)
    else:  # lockstep: with mixin replay, whose slots and keys each process builds for its devices
        config.training(replay_proportion=1.0, replay_buffer_num_slots=16)
    return config


def _save_run(out: str, algo, results: list[dict]) -> None:
    """The params (arr_i), the iterations' counters and the last one's evaluation."""
    import jax

    leaves = [np.asarray(x) for x in jax.tree.leaves(algo.get_weights())]
    counts = {
        key: np.asarray([r[key] for r in results])
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime")
    }
    updates = [r["learners"]["default_policy"]["num_updates_lifetime"] for r in results]
    evaluated = results[-1].get("evaluation", {}).get("env_runners", {})
    counts["evaluation_returns"] = np.asarray(
        [evaluated.get(k, np.nan) for k in ("episode_return_mean", "num_episodes")]
    )
    np.savez(out, *leaves, updates=np.asarray(updates), **counts)


def main(mode: str, coordinator: str, num_processes: str, process_id: str, out: str) -> None:
    from impala_jax.runtime.process import collectives, distributed, roles

    timeouts = {}
    if os.environ.get("COLLECTIVE_TIMEOUT_S"):
        timeouts["collective_timeout_s"] = float(os.environ["COLLECTIVE_TIMEOUT_S"])
    if os.environ.get("HEARTBEAT_TIMEOUT_S"):
        timeouts["heartbeat_timeout_s"] = int(os.environ["HEARTBEAT_TIMEOUT_S"])
    n = distributed.initialize(coordinator, int(num_processes), int(process_id), **timeouts)
    assert n == 2
    import jax
    from jax.sharding import PartitionSpec as P

    from impala_jax.core.types import LEARNER_AXIS
    from impala_jax.runtime.learning import parallel

    me = roles.process_index()
    if mode == "psum":
        mesh = parallel.make_mesh(jax.devices())
        local = np.full((1,), float(me + 1), np.float32)  # process i holds i + 1
        x = parallel.put(local, mesh, parallel.LEADING)
        total = parallel.data_parallel(
            lambda v: jax.lax.psum(v, LEARNER_AXIS), mesh, (P(LEARNER_AXIS),), P()
        )(x)
        # Env-step counters past 2^31 (int64) arrive exact, not truncated to int32 by JAX.
        counts = collectives.allgather(np.array([3_000_000_000 + me, -(2**40)], np.int64), "t")
        np.savez(out, total=np.asarray(total), counts=counts)
    elif mode == "update":
        from tests.test_learner import B, make_learner, random_batch

        learner = make_learner(len(jax.devices()))  # one device per process
        half = B // jax.process_count()
        for seed in range(2):
            batch = random_batch(seed)
            # This process's columns of the [T, B] batch (param_version, [B], is not sent).
            mine = jax.tree.map(
                lambda x: x[:, me * half : (me + 1) * half] if np.ndim(x) >= 2 else x, batch
            )
            metrics = learner.update(learner.put_batch(mine), env_steps=0)
        params = jax.device_get(learner.state.params)
        leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
        metrics = jax.device_get(metrics)
        np.savez(
            out,
            *leaves,
            total_loss=np.asarray(metrics["total_loss"]),
            grad_norm=np.asarray(metrics["gradients_default_optimizer_global_norm"]),
        )
    elif mode in ("lockstep", "threads"):
        # Two iterations; a checkpoint (process 0 writes it); one more iteration, undone by
        # restoring the checkpoint on both processes.
        with _config(me, 0 if mode == "lockstep" else 1).build() as algo:
            results = [algo.train() for _ in range(2)]
            saved_params = [np.asarray(x) for x in jax.tree.leaves(algo.get_weights())]
            saved_counters = algo.get_state()["counters"]
            saved = algo.save(str(Path(out).parent / "checkpoint"))
            algo.train()
            algo.restore(saved)
            restored = algo.get_state()["counters"]
            _save_run(out, algo, results)
        keys = sorted(saved_counters)
        with np.load(out) as got:
            np.savez(
                out,
                **dict(got),
                **{f"saved_{i}": x for i, x in enumerate(saved_params)},
                saved_counters=np.asarray([saved_counters[k] for k in keys], np.float64),
                restored_counters=np.asarray([restored[k] for k in keys], np.float64),
            )
    elif mode == "mismatch":
        # Process 1 was given another lr (an override on one host only): both refuse to build.
        config = _config(me, 0).training(lr=1e-3 if me == 0 else 3e-4)
        try:
            config.build()
        except ValueError as err:
            np.savez(out, error=np.asarray(str(err)))
        else:
            raise AssertionError("built with different configs")
    elif mode == "runner_failure":
        # Only process 1's envs fail (their seeds start at PROCESS_SEED_STRIDE): both stop.
        from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure
        from impala_jax.runtime.process.roles import PROCESS_SEED_STRIDE
        from tests.fake_envs import SeededFault

        config = (
            _config(me, 1)
            .environment(SeededFault, env_config={"from_seed": PROCESS_SEED_STRIDE})
            .evaluation(evaluation_interval=None)
            .fault_tolerance(restart_failed_env_runners=False)
        )
        with config.build() as algo:
            try:
                for _ in range(30):
                    algo.train()
            except EnvRunnerFailure as err:
                np.savez(out, message=np.asarray(str(err)), iteration=algo.iteration)
            else:
                raise SystemExit("no runner failure in 30 iterations")
    elif mode == "loop":
        # Trains until killed; OUT gets one line per iteration (the test's clock).
        with _config(me, 0).build() as algo:
            while True:
                result = algo.train()
                with open(out, "a") as f:
                    f.write(f"{result['training_iteration']}\n")
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
