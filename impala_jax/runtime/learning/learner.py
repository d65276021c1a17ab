"""The Learner: the learner state on the mesh and the one compiled ``learner_step``.

The step itself is core/update.py's pure per-device function; here it is wrapped over the
device mesh (runtime/learning/parallel.py), compiled (ahead of time in a warm-up thread, or loaded
from runtime/learning/program_cache.py), and fed the replay slots, the state arrays of a checkpoint
and the params of ``set_weights``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from impala_jax.core import optim
from impala_jax.core.types import LEARNER_AXIS, Batch, LearnerState
from impala_jax.core.update import Replay, make_learner_step
from impala_jax.runtime.learning import parallel, program_cache

logger = logging.getLogger(__name__)


# With a convolutional network on CPU, up to this many minibatch updates per learner step run
# as a Python-unrolled sequence (lax.scan beyond, and always for other networks or devices):
# conv gradients inside a scan are many times slower on XLA:CPU, while unrolling costs compile
# time, which an MLP does not win back (benchmarks/README.md, "Atari learning (issue 17)").
MAX_UNROLLED_UPDATES_ON_CPU = 16


def _layout(batch: Batch) -> list:
    """Shapes and dtypes of a batch's leaves: what a program compiled ahead of time takes."""
    return [(x.shape, str(x.dtype)) for x in jax.tree.leaves(batch)]


def run_keys(seed: int) -> tuple:
    """A run's learner key and actor key, from its seed."""
    learner_key, actor_key = jax.random.split(jax.random.key(seed))
    return learner_key, actor_key


# XLA options for a program that runs once: compiled fast rather than run fast.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


class Learner:
    """Owns the learner state on the mesh and the compiled step."""

    def __init__(
        self,
        networks,
        distribution,
        opt_spec,
        loss_spec,
        step_spec,
        devices,
        key,
        program_key: Any = None,
        example: Callable[[Any], Batch] | None = None,
        initial_state: bool = True,
    ):
        """``program_key``: plain data deciding ``networks`` and ``distribution`` (the model
        config and the spaces: program_cache.model_description); given, and with the
        persistent compilation cache on, the step's traced program is kept on disk
        (impala_jax.runtime.learning.program_cache) and a later process skips tracing it.

        ``example``: given the params' shapes (jax.ShapeDtypeStruct leaves), a host batch with
        the real shapes and dtypes; the step then compiles in a thread of its own (warm_up)
        from here on, beside the initial state's compilation rather than after it.

        ``initial_state=False``: no state is created yet (``state`` is None; its program is
        traced for the shapes but neither compiled nor run): a group of runs makes its states
        with ``init_group`` (rllib/seed_group.py); ``abstract_state`` gives the shapes."""
        self.mesh = parallel.make_mesh(devices)
        self.num_devices = len(devices)
        self._host_batches = (
            len(devices) == 1 and devices[0].platform == "cpu" and jax.process_count() == 1
        )
        self.step_spec = step_spec
        self.optimizer = optim.make_optimizer(opt_spec)

        def init_state(key):
            init_key, state_key, replay_key = jax.random.split(key, 3)
            params = networks.init(init_key)
            opt_state = self.optimizer.init(params)
            zero = jnp.zeros((), jnp.int32)
            return LearnerState(params, opt_state, zero, state_key), replay_key

        # Pure: a group of runs side by side (init_group) maps it over their keys.
        self.init_state = init_state
        # One compiled program, not dozens of ops, and compiled without XLA's backend
        # optimizations: it runs once, and they would lengthen its compilation for nothing.
        # Created replicated on the mesh, not copied there leaf by leaf (a program per leaf).
        placed = (NamedSharding(self.mesh, parallel.REPLICATED), None)
        init_jit = jax.jit(init_state, out_shardings=placed)
        traced = init_jit.trace(key)
        self._multiprocess = not NamedSharding(self.mesh, P()).is_fully_addressable
        cached = program_key is not None and not self._multiprocess and program_cache.directory()
        # The state's and the replay key's shapes, dtypes and shardings, known from the trace
        # before anything compiles: the step compiles from them (warm_up).
        self.abstract_state, replay_key_info = traced.out_info
        self._key_data_shape = jax.eval_shape(jax.random.key_data, replay_key_info).shape
        self.replay = ()
        self._replay_like = ()  # the slots' shapes once warm_up knows them (a restore's tree)
        self._warm_up: threading.Thread | None = None
        # The step compiled ahead of time by warm_up (None until then, or without it: the
        # step then compiles at its first call).
        self._compiled = None
        self._compiled_for = None  # the example's layout, until the first batch is checked
        # Convolutions (4-D kernels) on CPU: the minibatch updates unrolled (see the constant).
        conv = any(len(x.shape) == 4 for x in jax.tree.leaves(self.abstract_state.params))
        cpu = devices[0].platform == "cpu"
        unrolled = MAX_UNROLLED_UPDATES_ON_CPU if cpu and conv else 0
        # The step's ingredients, for the same step built for another program (one_device_step).
        self._make_step = functools.partial(
            make_learner_step,
            networks,
            distribution,
            self.optimizer,
            opt_spec,
            loss_spec,
            step_spec,
            unrolled,
        )
        step = self._make_step()
        # The per-device step itself, which an on-device rollout wraps into one program with
        # its acting (runtime/ondevice/device_engine.py).
        self.per_device_step = step
        replay_spec = parallel.LEADING if step_spec.replay_columns else ()
        self._step = parallel.data_parallel(
            step,
            self.mesh,
            in_specs=(parallel.REPLICATED, parallel.TIME_MAJOR, replay_spec, parallel.REPLICATED),
            out_specs=(parallel.REPLICATED, replay_spec, parallel.REPLICATED),
            donate_argnums=(0, 2),
        )
        # What decides the step's trace, for a program that wraps it (device_engine.py); None
        # where nothing is stored.
        self.program_description = (
            [program_key, opt_spec, loss_spec, step_spec, unrolled, self.mesh, devices]
            if cached
            else None
        )
        if cached:
            self._step = program_cache.CachedProgram(
                self._step,
                "learner_step",
                self.program_description,
                outputs_like=(0, 2, None),  # the state, the replay slots, the metrics
                donate_argnums=(0, 2),
            )
        if example is not None:
            self.warm_up(example(self.abstract_state.params))
        if not initial_state:
            self.state, self._replay_key = None, None
        elif cached:
            # Lowering this program (the orthogonal initializer's QR, threefry) costs more than
            # its trace: a stored one skips it (program_cache).
            init = program_cache.CachedProgram(
                init_jit,
                "learner_init",
                [program_key, opt_spec, self.mesh, devices],
                outputs_like=tuple(jax.tree.structure(x) for x in traced.out_info),
                out_shardings=placed,
                compiler_options=FAST_COMPILE,
            )
            self.state, self._replay_key = init(key)
        else:
            self.state, self._replay_key = traced.lower().compile(FAST_COMPILE)(key)

    def one_device_step(self):
        """The per-device step for a program with no mesh of its own, its ``LEARNER_AXIS`` a
        vmap's (``core.update.on_one_device``: a population's members spread over devices);
        a learner of one device only."""
        if self.num_devices != 1:
            raise ValueError(f"one_device_step: this learner has {self.num_devices} devices")
        return self._make_step(manual_axis=False)

    def init_group(self, keys: list, example: Batch) -> None:
        """The states of a group of runs trained side by side, each from its run's learner key
        (``run_keys``), made in one program: every leaf of ``state`` and of the replay slots
        (shaped like one column of ``example``) carries a leading member axis, the slots
        split over the mesh's devices behind it."""
        replicated = NamedSharding(self.mesh, parallel.REPLICATED)
        # Compiled as a run's own initial state is (XLA's backend optimizations round an
        # initializer's last bit differently): each member starts from a run alone's params
        # bit for bit. One member after another (lax.map), not vmap: vmapped, the orthogonal
        # initializers' QRs run batched, each LAPACK kernel waiting on XLA's CPU pool for its
        # batch's tasks, and with few cores the program never ends.
        init = jax.jit(partial(jax.lax.map, self.init_state), out_shardings=(replicated, None))
        keys = jnp.stack(keys)
        self.state, replay_keys = init.lower(keys).compile(FAST_COMPILE)(keys)
        if self.step_spec.replay_columns:
            slots = [self.replay_slots(k, example) for k in replay_keys]
            slots = jax.tree.map(lambda *xs: jnp.stack(xs), *slots)
            self.replay = parallel.put(slots, self.mesh, P(None, LEARNER_AXIS), may_alias=False)

    def run(self, program: Callable, *args) -> tuple:
        """Runs ``program(state, replay, *args) -> (state, replay, *outputs)`` (the learner's
        step wrapped with what feeds it, as the device engine's rollout and update are), keeps
        the state and slots it returns, and returns the outputs."""
        self.state, self.replay, *outputs = program(self.state, self.replay, *args)
        return tuple(outputs)

    def init_replay(self, example: Batch) -> None:
        """Zeroed slots shaped like one column of ``example`` (a host fragment), on the mesh."""
        replay = self.replay_slots(self._replay_key, example)
        self.replay = parallel.put(replay, self.mesh, parallel.LEADING, may_alias=False)

    def replay_slots(self, replay_key, example: Batch) -> Replay:
        """Zeroed host slots for ``replay_key``'s run, shaped like one column of ``example``.

        Over several processes each process builds the part on its own devices (parallel.put
        assembles the global array from the processes' parts): slots and keys for those devices
        only, each device keeping the key it has on one process.
        """
        mine = [
            i
            for i, d in enumerate(self.mesh.devices.flat)
            if d.process_index == jax.process_index()
        ]
        n = len(mine)

        def zeros(x):
            return np.zeros(self._slot_shape(x, n), x.dtype)

        # Built on the host and placed in one transfer: as jnp ops, a dozen small programs to
        # compile or load from the cache at start-up.
        data = jax.tree.map(zeros, example._replace(param_version=None))
        keys = jax.random.split(replay_key, self.num_devices)
        keys = np.asarray(jax.random.key_data(keys))[np.asarray(mine)]
        return Replay(data, np.zeros((n,), np.int32), keys)

    def replay_slots_of(self, replay_key, example: Batch) -> Replay:
        """``replay_slots`` as JAX values of a traced ``replay_key``, every device's slots (one
        process): what a training function built in one program starts from."""
        n = self.num_devices
        data = jax.tree.map(
            lambda x: jnp.zeros(self._slot_shape(x, n), x.dtype),
            example._replace(param_version=None),
        )
        keys = jax.random.key_data(jax.random.split(replay_key, n))
        return Replay(data, jnp.zeros((n,), jnp.int32), keys)

    def init_replay_from_leaves(self, leaves: list) -> None:
        """Replay slots from the flat leaves of a saved ``Replay`` (see state_arrays), laid out
        as this learner's slots (a recurrent batch's core_state is a pytree of its own)."""
        like = self.replay if self.replay != () else self._replay_like
        if like != ():
            replay = jax.tree.unflatten(jax.tree.structure(like), leaves)
        else:
            *fields, count, key = leaves
            replay = Replay(Batch(*fields, param_version=None), count, key)
        self.replay = parallel.put(replay, self.mesh, parallel.LEADING)

    def put_batch(self, batch: Batch) -> Batch:
        """Host batch -> device batch split along B (time-major axis 1).

        On one CPU device the host arrays are returned as they are: the step's own dispatch
        places them, in C++, in about the time it takes with a device batch, while
        ``jax.device_put`` holds the GIL in the loader thread, time the runner thread waits
        for."""
        batch = batch._replace(param_version=None)
        if self._host_batches:
            return batch
        return parallel.put(batch, self.mesh, parallel.TIME_MAJOR)

    def warm_up(self, example: Batch) -> None:
        """Compiles the step ahead of time in a background thread, from shapes alone.

        ``example`` is a host batch with the real shapes and dtypes; the state's and the
        replay slots' shapes come from the initial state's trace, so compilation needs no
        state yet: it overlaps the initial state's compilation, the policy's
        and the runners' first fragments instead of delaying the first update. Over several
        processes it also keeps collectives out of a thread of their own (nothing runs).
        """
        # Compiled for the device layout whichever put_batch returns: the same program.
        device_batch = parallel.put(
            example._replace(param_version=None), self.mesh, parallel.TIME_MAJOR
        )
        self._compiled_for = _layout(device_batch)
        self._replay_like = self._abstract_replay(device_batch)
        args = (self.abstract_state, device_batch, self._replay_like)
        replicated = NamedSharding(self.mesh, parallel.REPLICATED)
        env_steps = jax.ShapeDtypeStruct((2,), np.float32, sharding=replicated)
        compile_ = getattr(self._step, "compile", None)  # a CachedProgram's own

        def compile_step():
            if compile_ is not None:
                self._compiled = compile_(*args, env_steps)
            else:
                self._compiled = self._step.lower(*args, env_steps).compile()

        # Not a daemon: a process exiting mid-compilation would kill XLA inside C++ and abort.
        self._warm_up = threading.Thread(target=compile_step, name="learner-warm-up")
        self._warm_up.start()

    def _slot_shape(self, x, devices: int) -> tuple:
        """The replay slots of ``devices`` devices for a batch field ``x`` ([T(+1), B, ...]):
        one column per slot."""
        return (self.step_spec.replay_slots * devices, x.shape[0], *x.shape[2:])

    def _abstract_replay(self, device_batch: Batch):
        """The shapes, dtypes and shardings init_replay gives the slots (or () without)."""
        if not self.step_spec.replay_columns:
            return ()
        n = self.num_devices
        leading = NamedSharding(self.mesh, parallel.LEADING)

        def slots(x):
            return jax.ShapeDtypeStruct(self._slot_shape(x, n), x.dtype, sharding=leading)

        data = jax.tree.map(slots, device_batch._replace(param_version=None))
        count = jax.ShapeDtypeStruct((n,), np.int32, sharding=leading)
        key = jax.ShapeDtypeStruct((n, *self._key_data_shape), np.uint32, sharding=leading)
        return Replay(data, count, key)

    def throwaway_copy(self) -> tuple:
        """Copies of the state and replay slots to run the (donating) step on without touching
        the learner's own (the compute-only benchmark)."""
        copy = lambda x: jax.device_put(x, x.sharding, may_alias=False)  # noqa: E731
        return jax.tree.map(copy, self.state), jax.tree.map(copy, self.replay)

    def wait_for_warm_up(self) -> None:
        if self._warm_up is not None:
            self._warm_up.join()
            self._warm_up = None

    def update(self, device_batch: Batch, env_steps: int) -> dict:
        """One learner step, dispatched asynchronously; metrics stay on device."""
        self.wait_for_warm_up()  # one compilation, not two racing ones
        if self.step_spec.replay_columns and self.replay == ():
            self.init_replay(device_batch)
        if self._compiled_for is not None:  # the first batch after warm_up: checked once
            expected, self._compiled_for = self._compiled_for, None
            layout = _layout(device_batch)
            if self._compiled is not None and layout != expected:
                # Not the example's shapes or dtypes (a bug, or a custom runner's batch): the
                # ahead-of-time program cannot take it, the jit compiles one that can.
                logger.warning(
                    "learner step: the batch %s is not the %s it was compiled for ahead of "
                    "time; compiling it again for this batch",
                    layout,
                    expected,
                )
                self._compiled = None
        # [hi, lo] float32 (optim.env_steps_operand): past 2^31 env steps as exact as before.
        env_steps = optim.env_steps_operand(env_steps)
        step = self._compiled or self._step
        if step is self._step and not self._multiprocess:
            env_steps = jnp.asarray(env_steps)  # else a host value, placed by the program
        self.state, self.replay, metrics = step(self.state, device_batch, self.replay, env_steps)
        return metrics

    def state_arrays(self, replay: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Host copies of the learner state's leaves (the key as raw key data) and of the
        replay slots' leaves (none with ``replay=False``): what a checkpoint stores. The state
        is replicated, so one process can read it all even on a mesh over several processes;
        replay slots are per device, on every process's devices."""
        state = jax.device_get(self.state)
        state = state.replace(key=np.asarray(jax.random.key_data(self.state.key)))
        replay = jax.device_get(jax.tree.leaves(self.replay)) if replay else []
        return [np.asarray(x) for x in jax.tree.leaves(state)], [np.asarray(x) for x in replay]

    def load_state_arrays(self, leaves: list, replay: list | None) -> None:
        """The inverse of ``state_arrays``, placed on this learner's mesh.

        Replay slots are per device: restored onto another device count they start empty.
        """
        template = self.state.replace(key=jax.random.key_data(self.state.key))
        expected = [np.shape(x) for x in jax.tree.leaves(template)]
        got = [np.shape(x) for x in leaves]
        if expected != got:
            raise ValueError(
                "the checkpoint's learner arrays do not match this config's network and "
                f"optimizer ({len(got)} arrays vs {len(expected)}, or different shapes); restore "
                "it with the config it was saved with (IMPALA.from_checkpoint(path))."
            )
        restored: LearnerState = jax.tree.unflatten(jax.tree.structure(template), list(leaves))
        restored = restored.replace(key=jax.random.wrap_key_data(np.asarray(restored.key)))
        self.state = parallel.put(restored, self.mesh, parallel.REPLICATED)
        if replay and self.step_spec.replay_columns:
            n = self.num_devices
            if len(replay[-1]) == n and len(replay[0]) == self.step_spec.replay_slots * n:
                self.init_replay_from_leaves(list(replay))

    def set_params(self, params) -> None:
        """Replaces the params (same structure and shapes), keeping the optimizer state."""
        expected = jax.tree.map(np.shape, self.state.params)
        try:
            same = jax.tree.structure(params) == jax.tree.structure(self.state.params) and (
                jax.tree.map(np.shape, params) == expected
            )
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(
                "set_weights: the params do not match this algorithm's network (structure or "
                "shapes differ); pass what get_weights() returns for the same config."
            )
        params = jax.tree.map(lambda x, ref: np.asarray(x, ref.dtype), params, self.state.params)
        state = self.state.replace(params=params)
        self.state = parallel.put(state, self.mesh, parallel.REPLICATED)
