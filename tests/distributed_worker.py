"""One process of a multi-process test (tests/test_distributed.py): ``python -m
tests.distributed_worker MODE COORDINATOR NUM_PROCESSES PROCESS_ID OUT``."""

from __future__ import annotations

import sys

import numpy as np


def main(mode: str, coordinator: str, num_processes: str, process_id: str, out: str) -> None:
    from impala_jax import distributed

    assert distributed.initialize(coordinator, int(num_processes), int(process_id)) == 2
    import jax
    from jax.sharding import PartitionSpec as P

    from impala_jax import parallel
    from impala_jax.types import LEARNER_AXIS

    me = distributed.process_index()
    if mode == "psum":
        mesh = parallel.make_mesh(jax.devices())
        local = np.full((1,), float(me + 1), np.float32)  # process i holds i + 1
        x = parallel.put(local, mesh, parallel.LEADING)
        total = parallel.data_parallel(
            lambda v: jax.lax.psum(v, LEARNER_AXIS), mesh, (P(LEARNER_AXIS),), P()
        )(x)
        np.save(out, np.asarray(total))
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
        np.savez(out, *leaves, total_loss=np.asarray(jax.device_get(metrics["total_loss"])))
    elif mode == "build":
        from impala_jax import IMPALAConfig

        config = IMPALAConfig().environment("CartPole-v1").learners(num_learners=2)
        try:
            config.build()
        except ValueError as err:
            np.save(out, np.asarray("runs only in lockstep so far" in str(err)))
        else:
            raise SystemExit("IMPALA built with runner threads over two processes")
    elif mode == "train":
        from impala_jax import IMPALAConfig

        config = (
            IMPALAConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
            .training(train_batch_size_per_learner=32)
            .learners(num_learners=2)
            # Process 0's clock ends each iteration; process 1 follows.
            .reporting(min_time_s_per_iteration=1.0 if me == 0 else 0)
            .debugging(seed=3)
        )
        with config.build() as algo:
            results = [algo.train() for _ in range(2)]
            leaves = [np.asarray(x) for x in jax.tree.leaves(algo.get_weights())]
        updates = [r["learners"]["default_policy"]["num_updates_lifetime"] for r in results]
        np.savez(out, *leaves, updates=np.asarray(updates))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
