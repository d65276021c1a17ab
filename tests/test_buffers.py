"""Host-side buffers: the minibatch buffer's reuse order."""

from __future__ import annotations

from impala_jax.buffers import MinibatchBuffer


def test_minibatch_buffer_reuses_batches_round_robin():
    fresh = iter(range(100))
    buffer = MinibatchBuffer(size=2, num_epochs=3, next_batch=lambda: next(fresh))
    served = [buffer.next_batch() for _ in range(12)]
    assert served == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]
