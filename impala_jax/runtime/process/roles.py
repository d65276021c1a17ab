"""Which process this one is in a multi-process run, and the JAX client it reaches the others by.

The roles every other module asks about: this process's index, how many processes there are,
whether this one is process 0 (the one that writes files), and the env seed block and action
key of this process. With one process (no `distributed.initialize`): index 0 of 1, seeds and key
unchanged. JAX is imported only inside functions.
"""

from __future__ import annotations

# Env seeds of process p start at seed + p * this (far above any runner's restart blocks).
PROCESS_SEED_STRIDE = 1 << 24


def client():
    """JAX's client of the coordinator service; None until `distributed.initialize` joins a run."""
    from jax._src import distributed

    return distributed.global_state.client


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def is_primary() -> bool:
    """Process 0: the one that writes files."""
    return process_index() == 0


def process_seed_and_key(seed: int, actor_key):
    """This process's env seed block (envpool seeds env i with seed + i) and action key; with
    one process, both unchanged."""
    if process_count() == 1:
        return seed, actor_key
    from jax.random import fold_in

    return seed + process_index() * PROCESS_SEED_STRIDE, fold_in(actor_key, process_index())
