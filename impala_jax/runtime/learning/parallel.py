"""Data parallelism over the "learner" mesh axis, written once.

The learner step is a per-device function that averages over ``LEARNER_AXIS``; it is wrapped
here with ``jax.shard_map`` under ``jax.jit`` (what ``jax.pmap`` itself lowers to since JAX 0.8).
Batches are time-major, so they are split along axis 1 (B); params and optimizer state are
replicated; per-device buffers (replay slots) are split along their leading axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from impala_jax.core.types import LEARNER_AXIS

REPLICATED = P()
TIME_MAJOR = P(None, LEARNER_AXIS)  # [T, B, ...]: split B
LEADING = P(LEARNER_AXIS)  # [N, ...]: split the leading axis


def joined_processes() -> int:
    """The processes of this run (``runtime.distributed``), known without starting JAX's
    backends: 1 before ``jax.distributed.initialize``, or without it."""
    from jax._src import distributed

    state = distributed.global_state
    return state.num_processes if state.client is not None else 1


def learner_device_count(num_learners: int) -> int:
    """The learner devices ``learners(num_learners=...)`` asks for: N counts devices across
    processes; 0 (RLlib: the main process is the learner) is one device of each process, so
    one experiment runs unchanged on one process or several."""
    return num_learners if num_learners > 0 else joined_processes()


def learner_devices(num_learners: int) -> tuple[list, list]:
    """The learner mesh's devices (`learner_device_count` of them) and this process's own among
    them (its batch columns; its actors act on the first)."""
    devices, processes = jax.devices(), jax.process_count()
    if num_learners == 0 and processes > 1:  # the first device of each process
        devices = [next(d for d in devices if d.process_index == p) for p in range(processes)]
    n = max(1, num_learners)
    if n > len(devices):
        raise ValueError(
            f"learners(num_learners={num_learners}) needs {n} devices but only {len(devices)} "
            f"are present ({devices[0].platform}); use num_learners<={len(devices)}."
        )
    devices = devices if num_learners == 0 and processes > 1 else devices[:n]
    local = [d for d in devices if d.process_index == jax.process_index()]
    if not local:
        raise ValueError(
            f"learners(num_learners={num_learners}) uses none of this process's devices "
            f"(process {jax.process_index()} of {jax.process_count()}); every process needs a "
            "learner device: num_learners = the devices of all processes, or 0 (one each)."
        )
    return devices, local


def make_mesh(devices: Sequence) -> Mesh:
    return Mesh(np.asarray(devices), (LEARNER_AXIS,))


def put(tree, mesh: Mesh, spec: P, may_alias: bool | None = None):
    """Host or device arrays -> arrays laid out on the mesh with one spec for every leaf.

    On a mesh over several processes (impala_jax.runtime.process.distributed) each process passes
    its own part: for a split spec, its slice of the split axis (its batch columns); for REPLICATED,
    the whole value, the same on every process (the learner state). ``may_alias=False``: copies,
    never views of host memory (for arrays a program will donate).
    """
    sharding = NamedSharding(mesh, spec)
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding, may_alias=may_alias)
    return jax.tree.map(lambda x: _put_global(x, sharding, spec), tree)


def _put_global(x, sharding: NamedSharding, spec: P):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_put_global(jax.random.key_data(x), sharding, spec))
    if spec == REPLICATED:
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.make_array_from_process_local_data(sharding, np.asarray(jax.device_get(x)))


def data_parallel(
    fn: Callable,
    mesh: Mesh,
    in_specs: tuple,
    out_specs,
    donate_argnums: tuple = (),
    check_vma: bool = True,
) -> Callable:
    """The one wrapper: per-device ``fn`` over the mesh, compiled, with buffer donation.

    ``check_vma=False`` turns off shard_map's varying-across-devices types, for programs that
    run third-party JAX code (an env's step) which mixes constants into a loop carry (gymnax's
    Asterix: a ``while_loop`` from ``jnp.array([0, 0])`` over the per-device env state). The
    gradient is then each device's own without a cast (``core.update.per_device``); the pmean
    after it is the same either way (tests/test_on_device.py: 1 device = 2 devices)."""
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma),
        donate_argnums=donate_argnums,
    )
