"""Host-side buffers: the minibatch buffer's reuse order, the aggregator and loader threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from impala_jax.core.types import Trajectory
from impala_jax.runtime.learning.buffers import Batcher, LearnerQueue, Loader, MinibatchBuffer


def test_minibatch_buffer_reuses_batches_round_robin():
    fresh = iter(range(100))
    buffer = MinibatchBuffer(size=2, num_epochs=3, next_batch=lambda: next(fresh))
    served = [buffer.next_batch() for _ in range(12)]
    assert served == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]


@pytest.mark.timeout(120)
def test_aggregator_threads_stack_what_loader_threads_copy():
    """num_aggregator_actors_per_learner=N: N host threads cut and stack the batches and the
    loader threads only copy; max_requests_in_flight_per_aggregator_actor bounds the queue."""
    frags = [random_fragment(i) for i in range(6)]
    source = LearnerQueue(10)
    stop = threading.Event()
    for traj in frags:
        assert source.put(traj, stop)
    copied = []

    def to_device(host):
        copied.append(threading.current_thread().name)
        return host

    loader = Loader(
        source,
        Batcher(4),
        to_device,
        num_threads=1,
        num_slots=1,
        stop=stop,
        num_aggregators=2,
        aggregator_queue_size=1,
    )
    try:
        names = sorted(t.name for t in loader.threads)
        assert names == ["aggregator-0", "aggregator-1", "loader-0"]
        assert loader._stacked.maxsize == 2
        batches = [loader.get(timeout=10)[0] for _ in range(3)]  # 6 fragments x 2 = 12 columns
        got = np.concatenate([b.reward for b in batches], axis=1)
        want = np.concatenate([f.reward for f in frags], axis=1)
        # Batches may leave the two aggregators in either order; their columns are intact.
        assert sorted(map(tuple, got.T)) == sorted(map(tuple, want.T))
        assert set(copied) == {"loader-0"}
        assert loader.timers.drain()["stack"][1] == 3
    finally:
        stop.set()
        for t in loader.threads:
            t.join(timeout=5)


@pytest.mark.timeout(120)
def test_aggregators_in_a_run_and_not_in_lockstep():
    from tests.test_algorithm import small_config

    config = small_config(num_env_runners=1).learners(
        num_aggregator_actors_per_learner=2, max_requests_in_flight_per_aggregator_actor=3
    )
    with config.build() as algo:
        result = algo.train()
        names = {t.name for t in threading.enumerate()}
        assert {"aggregator-0", "aggregator-1"} <= names
        # At most 3 stacked batches queued per aggregator thread.
        assert algo.env_runner_group._loader._stacked.maxsize == 2 * 3
    assert result["num_env_steps_trained_lifetime"] == 64
    with pytest.raises(ValueError, match="num_aggregator_actors_per_learner"):
        small_config().learners(num_aggregator_actors_per_learner=1).validate()


def random_fragment(seed: int, T: int = 3, B: int = 2) -> Trajectory:
    rng = np.random.default_rng(seed)
    return Trajectory(
        obs=rng.normal(size=(T + 1, B, 4)).astype(np.float32),
        action=rng.integers(0, 2, (T, B)),
        behaviour_logits=rng.normal(size=(T, B, 2)).astype(np.float32),
        reward=rng.normal(size=(T, B)).astype(np.float32),
        terminated=np.zeros((T, B), bool),
        truncated=np.zeros((T, B), bool),
        valid=np.ones((T, B), np.float32),
        param_version=np.zeros(B, np.int32),
    )
