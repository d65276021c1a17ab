"""The learner's compile boundary: ``learner_step`` per device, and the Learner that runs it.

One step consumes a batch of ``train_batch_size_per_learner`` env steps per device (time-major
``[T+1, B]``), mixes in replayed columns from the device-resident replay slots
(``replay_proportion``), and runs ``num_epochs`` passes of minibatch updates inside the same
compiled program (``lax.scan``, or unrolled: see MAX_UNROLLED_UPDATES_ON_CPU). Grads and metrics
are averaged over ``LEARNER_AXIS``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from impala_jax.core import losses, optim
from impala_jax.core.types import LEARNER_AXIS, Batch, LearnerState
from impala_jax.runtime import parallel, program_cache

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LossSpec:
    gamma: float
    vf_loss_coeff: float
    entropy_coeff: Any  # float or ((t, v), ...): a schedule in env steps
    clip_rho_threshold: float
    clip_pg_rho_threshold: float
    clip_rewards: Any
    # "mean" over the (mini)batch's valid rows (RLlib's) or their "sum" (the IMPALA paper's code):
    # the sum's gradient is N = valid rows times the mean's, which is what the paper's RMSProp
    # constants (epsilon, grad_clip) were set for. See docs/config.md, "Loss reduction".
    loss_reduction: str = "mean"


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static sizes of one learner step, per device."""

    columns: int  # new trajectories per device
    replay_columns: int  # replayed trajectories mixed in per device
    replay_slots: int  # replay slots held per device
    minibatch_columns: int  # trajectories per minibatch per device
    num_epochs: int
    shuffle: bool
    log_gradients: bool = False  # reporting(log_gradients=...): per-group gradient norms


class Replay(NamedTuple):
    """Replay slots on one device: column-major ``[S, T(+1), ...]`` copies of Batch fields."""

    data: Batch
    count: jax.Array  # [1] int32: columns ever inserted on this device
    key: jax.Array  # [1, 2] uint32 raw PRNG key data: slot sampling differs per device


# Loss metrics that are not masked means over rows, and so are not reweighted per device.
_NOT_MEANS = ("max_rho", "vf_explained_var")


def _time_major(x):
    return jnp.swapaxes(x, 0, 1)


def _uniform_index(key, n: int, span: jax.Array) -> jax.Array:
    """``n`` indices drawn uniformly from ``[0, span)`` (int32), for ``span`` up to 2^31.

    One 32-bit draw each, reduced modulo ``span``: each index is off uniform by less than
    ``span / 2^32`` (2.3e-5 relative for a million slots). ``jax.random.randint`` makes two
    draws and more arithmetic to remove that bias, which added a fifth of a second to the
    learner step's compilation on a 2-core CPU.
    """
    bits = jax.random.bits(key, (n,), jnp.uint32)
    return (bits % span.astype(jnp.uint32)).astype(jnp.int32)


def _permutations(key, rows: int, n: int) -> jax.Array:
    """``rows`` independent uniform permutations of ``range(n)``, int32 ``[rows, n]``.

    One sort by 64 random bits per row (two 32-bit keys): ties, which a stable sort breaks by
    position, have a probability below ``n^2 / 2^65``. ``jax.random.permutation`` sorts by 32
    bits and adds rounds past n = 1,625; one sort of the whole ``[rows, n]`` here also avoids
    its per-row key splits (compile time, as above).
    """
    hi, lo = jax.random.bits(key, (2, rows, n), jnp.uint32)
    iota = jax.lax.broadcasted_iota(jnp.int32, (rows, n), 1)
    return jax.lax.sort((hi, lo, iota), dimension=1, num_keys=2)[2]


def mix_replay(batch: Batch, replay: Replay, step_spec: StepSpec) -> tuple[Batch, Replay]:
    """Appends ``replay_columns`` columns drawn uniformly from the filled slots (as they were
    before this batch), then writes the new columns into the ring of slots (per device).

    Its cost is O(batch), not O(slots): see the comment on the write."""
    key, sample_key = jax.random.split(jax.random.wrap_key_data(replay.key[0]))
    count, slots = replay.count[0], step_spec.replay_slots
    filled = jnp.minimum(count, slots)
    idx = _uniform_index(sample_key, step_spec.replay_columns, jnp.maximum(filled, 1))
    n_insert = min(step_spec.columns, slots)
    pos = (count + jnp.arange(n_insert)) % slots
    # The ring is written in place, then read: a read of the old ring that XLA cannot order
    # before the write makes it copy the whole ring, twice, every step (O(slots), not
    # O(batch)). So the slots about to be overwritten are read first, the write takes them as
    # an operand (a dependency XLA keeps: `count >= 0` always holds, but it cannot know), and a
    # draw that lands on an overwritten slot takes the saved column.
    overwritten = jax.tree.map(lambda buf: buf[pos], replay.data)
    keep = count >= 0
    data = jax.tree.map(
        lambda buf, x, old: buf.at[pos].set(jnp.where(keep, _time_major(x)[-n_insert:], old)),
        replay.data,
        batch,
        overwritten,
    )
    ahead = (idx - count) % slots  # j where idx = pos[j] (when below n_insert)
    saved = ahead < n_insert
    row = jnp.minimum(ahead, n_insert - 1)

    def draw(new_buf, old):
        pick = saved.reshape(-1, *([1] * (new_buf.ndim - 1)))
        return _time_major(jnp.where(pick, old[row], new_buf[idx]))

    replayed = jax.tree.map(draw, data, overwritten)
    # Until the first insert the slots hold zeros: mask them out of the loss.
    replayed = replayed._replace(valid=replayed.valid * (filled > 0))
    mixed = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), batch, replayed)
    return mixed, Replay(data, replay.count + n_insert, jax.random.key_data(key)[None])


def _global_norm(tree) -> jax.Array:
    """The L2 norm of all of ``tree``'s leaves together (``optax.tree.norm``'s value), as one
    reduction over their concatenation rather than one per leaf: fewer, larger kernels, which
    XLA:CPU compiles and runs faster at an MLP's sizes."""
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]
    return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate(leaves))))


def _step_size_metrics(updates, params, lr) -> dict[str, jax.Array]:
    """How far one update moved the params: a stalled optimizer shows here at a glance.

    ``update_to_param_norm_ratio`` is ||update|| / ||params|| (global norms). For Adam and
    RMSProp each parameter moves about lr per step when the gradient dominates the optimizer's
    denominator, so ``update_rms_to_lr_ratio`` (the update's root mean square over all
    parameters, divided by the learning rate) is of order 1; orders of magnitude below 1 means
    epsilon (or RMSProp's mean square initialised at 1) dominates instead (issue 17: a mean loss
    with the IMPALA paper's RMSProp constants).
    """
    size = sum(x.size for x in jax.tree.leaves(updates))
    update_norm = _global_norm(updates)
    return {
        "update_to_param_norm_ratio": update_norm / jnp.maximum(_global_norm(params), 1e-12),
        "update_rms_to_lr_ratio": update_norm / jnp.sqrt(size) / jnp.maximum(lr, 1e-30),
    }


def _feature_metrics(features: jax.Array) -> dict[str, jax.Array]:
    """Whether the policy's encoder still tells observations apart, over the (mini)batch's
    observations on every learner device (every row, reset and bootstrap rows too).

    ``encoder_dead_unit_fraction``: the share of the encoder's output units that are <= 0 for
    every observation (a dead ReLU: it passes no gradient and carries nothing).
    ``encoder_feature_std``: each output unit's standard deviation across the observations,
    averaged over units. Both near their limits (1 and 0) mean the policy and value see the same
    features whatever the frame: the network has gone blind (issue 17: Adam at lr 6e-4 and
    RMSProp at 3e-3 on Pong left 75-95 % of the Nature CNN's 512 units dead).
    """
    f = features.reshape(features.shape[0], -1).astype(jnp.float32)
    n, total = jax.lax.psum((jnp.float32(f.shape[0]), jnp.sum(f, 0)), LEARNER_AXIS)
    mean = total / n
    var = jax.lax.psum(jnp.sum(jnp.square(f - mean[None]), 0), LEARNER_AXIS) / n
    alive = jax.lax.pmax(jnp.max(f, 0), LEARNER_AXIS) > 0.0
    return {
        "encoder_dead_unit_fraction": 1.0 - jnp.mean(alive.astype(jnp.float32)),
        "encoder_feature_std": jnp.mean(jnp.sqrt(var)),
    }


def make_learner_step(
    networks, distribution, optimizer, opt_spec, loss_spec, step_spec, max_unrolled_updates=0
):
    """Returns the per-device ``learner_step(state, batch, replay, env_steps)``."""
    entropy_coeff_at = optim.piecewise_linear(loss_spec.entropy_coeff)

    def loss_fn(params, batch: Batch, entropy_coeff):
        # The loss is a mean over this device's valid rows; weighting it by this device's share
        # of all valid rows makes the pmean of grads the gradient of the global mean, so N
        # devices give the same update as one device with the whole batch (and the same for
        # the global sum with loss_reduction="sum").
        valid = jnp.sum(batch.valid)
        weight = valid / jnp.maximum(jax.lax.pmean(valid, LEARNER_AXIS), 1e-6)
        t1, b = batch.obs.shape[:2]
        if batch.core_state is not None:  # a recurrent policy (recurrent.py): one unroll
            dist_inputs, values = networks.unroll(
                params,
                batch.core_state,
                batch.obs,
                batch.prev_action,
                batch.prev_reward,
                batch.reset,
                networks.max_seq_len,
            )
            features = None
        else:
            dist_inputs, values, features = networks.apply(
                params, batch.obs.reshape(t1 * b, *batch.obs.shape[2:]), with_features=True
            )
        dist_inputs = dist_inputs.reshape(t1, b, -1)
        values = values.reshape(t1, b)
        discount_t = loss_spec.gamma * (1.0 - batch.terminated.astype(jnp.float32))
        loss, metrics = losses.impala_loss(
            dist_inputs[:-1],
            values,
            batch.behaviour_logits,
            batch.action,
            batch.reward,
            discount_t,
            batch.valid,
            distribution=distribution,
            vf_loss_coeff=loss_spec.vf_loss_coeff,
            entropy_coeff=entropy_coeff,
            clip_rho_threshold=loss_spec.clip_rho_threshold,
            clip_pg_rho_threshold=loss_spec.clip_pg_rho_threshold,
            clip_rewards=loss_spec.clip_rewards,
        )
        # Masked means become shares of the global mean, so their pmean is the global mean.
        metrics = {k: v if k in _NOT_MEANS else v * weight for k, v in metrics.items()}
        # RLlib's names: pi_loss / vf_loss are sums over the (mini)batch's valid rows, beside
        # their means; a device's share times the global row count has the global sum as pmean.
        total_valid = jax.lax.psum(valid, LEARNER_AXIS)
        for name in ("pi_loss", "vf_loss"):
            metrics[f"mean_{name}"] = metrics[name]
            metrics[name] = metrics[name] * total_valid
        if features is not None:
            metrics.update(_feature_metrics(jax.lax.stop_gradient(features)))
        max_entropy = getattr(distribution, "max_entropy", None)
        if max_entropy:  # None for a Gaussian, 0 for a one-action space: nothing to compare
            metrics["entropy_fraction_of_max"] = metrics["entropy"] / max_entropy
        if loss_spec.loss_reduction == "sum":
            # The global mean times the global valid-row count is the global sum.
            return loss * weight * total_valid, metrics
        return loss * weight, metrics

    def learner_step(state: LearnerState, batch: Batch, replay, env_steps):
        batch = batch._replace(param_version=None)
        if step_spec.replay_columns:
            batch, replay = mix_replay(batch, replay, step_spec)
        n_cols = batch.reward.shape[1]
        mb = step_spec.minibatch_columns
        n_mb = n_cols // mb
        entropy_coeff = entropy_coeff_at(env_steps)
        key, perm_key = jax.random.split(state.key)
        if step_spec.shuffle:
            order = _permutations(perm_key, step_spec.num_epochs, n_cols)
        else:
            order = jnp.tile(jnp.arange(n_cols), (step_spec.num_epochs, 1))
        order = order.reshape(step_spec.num_epochs * n_mb, mb)

        def update(carry, cols):
            params, opt_state = carry
            minibatch = jax.tree.map(lambda x: jnp.take(x, cols, axis=1), batch)
            # The params are replicated (unvarying over the learner axis): differentiated as
            # they are, shard_map would already sum their cotangents over the devices, and the
            # pmean below would be a no-op on an N-times-too-large gradient (invisible under
            # Adam, which is scale-invariant; wrong under RMSProp, clipping and the reported
            # norm). Cast to per-device values, each device's gradient is its own.
            local = parallel.per_device(params)
            grads, metrics = jax.grad(loss_fn, has_aux=True)(local, minibatch, entropy_coeff)
            grads = jax.lax.pmean(grads, LEARNER_AXIS)
            metrics = dict(metrics, gradients_default_optimizer_global_norm=_global_norm(grads))
            if step_spec.log_gradients:  # static: no extra work in the program when off
                for group, group_grads in grads.items():
                    metrics[f"gradients_{group}_global_norm"] = _global_norm(group_grads)
            updates, opt_state = optimizer.update(grads, opt_state, params, env_steps=env_steps)
            metrics.update(
                _step_size_metrics(updates, params, optim.current_lr(opt_spec, env_steps))
            )
            params = optax.apply_updates(params, updates)
            return (params, opt_state), metrics

        carry = (state.params, state.opt_state)
        n_updates = order.shape[0]
        if n_updates == 1 or n_updates <= max_unrolled_updates:
            # Unrolled, not scanned: on CPU, conv gradients inside lax.scan run ~25x slower
            # (jax-ml/jax#12868; scan's unroll= does not help), which made the Atari learner
            # crawl (Pong with 4 minibatches: 30 vs 166 env steps/s end to end).
            per_update = []
            for i in range(n_updates):
                carry, update_metrics = update(carry, order[i])
                per_update.append(update_metrics)
            params, opt_state = carry
            metrics = jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *per_update)
        else:
            (params, opt_state), metrics = jax.lax.scan(update, carry, order)
            metrics = jax.tree.map(jnp.mean, metrics)
        max_rho = jax.lax.pmax(metrics.pop("max_rho"), LEARNER_AXIS)
        metrics = jax.lax.pmean(metrics, LEARNER_AXIS)
        metrics["max_rho"] = max_rho
        metrics["curr_lr"] = optim.current_lr(opt_spec, env_steps)
        metrics["curr_entropy_coeff"] = entropy_coeff
        metrics["num_non_finite_updates"] = optim.non_finite_count(opt_state)
        metrics["num_consecutive_non_finite_updates"] = optim.consecutive_non_finite(opt_state)
        state = LearnerState(
            params=params,
            opt_state=opt_state,
            update_step=state.update_step + 1,
            key=key,
        )
        return state, replay, metrics

    return learner_step


# With a convolutional network on CPU, up to this many minibatch updates per learner step run
# as a Python-unrolled sequence (lax.scan beyond, and always for other networks or devices):
# conv gradients inside a scan are ~10-25x slower on XLA:CPU (Nature CNN, 4 updates of 80
# rows: 7.1 s vs 0.80 s per step). Unrolling costs compile time (2.8 -> 8.0 s there), and for
# an MLP it is not worth it (CartPole, 4 updates: 5.4 vs 4.7 ms per step, compile 3.1 -> 5.9 s).
MAX_UNROLLED_UPDATES_ON_CPU = 16


def _layout(batch: Batch) -> list:
    """Shapes and dtypes of a batch's leaves: what a program compiled ahead of time takes."""
    return [(x.shape, str(x.dtype)) for x in jax.tree.leaves(batch)]


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
    ):
        """``program_key``: plain data deciding ``networks`` and ``distribution`` (the model
        config and the spaces: program_cache.model_description); given, and with the
        persistent compilation cache on, the step's traced program is kept on disk
        (impala_jax.runtime.program_cache) and a later process skips tracing it.

        ``example``: given the params' shapes (jax.ShapeDtypeStruct leaves), a host batch with
        the real shapes and dtypes; the step then compiles in a thread of its own (warm_up)
        from here on, beside the initial state's compilation rather than after it."""
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

        # One compiled program, not dozens of ops, and compiled without XLA's backend
        # optimizations: it runs once, and they double its compile time (1.0 vs 2.0 s for the
        # CartPole MLP's orthogonal inits on 2 cores) for nothing.
        # Created replicated on the mesh, not copied there leaf by leaf (a program per leaf).
        placed = (NamedSharding(self.mesh, parallel.REPLICATED), None)
        init_jit = jax.jit(init_state, out_shardings=placed)
        traced = init_jit.trace(key)
        self._multiprocess = not NamedSharding(self.mesh, P()).is_fully_addressable
        cached = program_key is not None and not self._multiprocess and program_cache.directory()
        # The state's and the replay key's shapes, dtypes and shardings, known from the trace
        # before anything compiles: the step compiles from them (warm_up).
        self._abstract_state, replay_key_info = traced.out_info
        self._key_data_shape = jax.eval_shape(jax.random.key_data, replay_key_info).shape
        self.replay = ()
        self._replay_like = ()  # the slots' shapes once warm_up knows them (a restore's tree)
        self._warm_up: threading.Thread | None = None
        # The step compiled ahead of time by warm_up (None until then, or without it: the
        # step then compiles at its first call).
        self._compiled = None
        self._compiled_for = None  # the example's layout, until the first batch is checked
        # Convolutions (4-D kernels) on CPU: the minibatch updates unrolled (see the constant).
        conv = any(len(x.shape) == 4 for x in jax.tree.leaves(self._abstract_state.params))
        cpu = devices[0].platform == "cpu"
        unrolled = MAX_UNROLLED_UPDATES_ON_CPU if cpu and conv else 0
        step = make_learner_step(
            networks, distribution, self.optimizer, opt_spec, loss_spec, step_spec, unrolled
        )
        replay_spec = parallel.LEADING if step_spec.replay_columns else ()
        self._step = parallel.data_parallel(
            step,
            self.mesh,
            in_specs=(parallel.REPLICATED, parallel.TIME_MAJOR, replay_spec, parallel.REPLICATED),
            out_specs=(parallel.REPLICATED, replay_spec, parallel.REPLICATED),
            donate_argnums=(0, 2),
        )
        if cached:
            self._step = program_cache.CachedProgram(
                self._step,
                "learner_step",
                [program_key, opt_spec, loss_spec, step_spec, unrolled, self.mesh, devices],
                outputs_like=(0, 2, None),  # the state, the replay slots, the metrics
                donate_argnums=(0, 2),
            )
        if example is not None:
            self.warm_up(example(self._abstract_state.params))
        if cached:
            # Lowering this program (the orthogonal initializer's QR, threefry) takes 0.3 s on
            # 2 cores, three times its trace: a stored one skips it (program_cache).
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

    def init_replay(self, example: Batch) -> None:
        """Zeroed slots shaped like one column of ``example`` (a host fragment).

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
        # compile or load from the cache (0.1-0.3 s of start-up on 2 cores).
        data = jax.tree.map(zeros, example._replace(param_version=None))
        keys = jax.random.split(self._replay_key, self.num_devices)
        keys = np.asarray(jax.random.key_data(keys))[np.asarray(mine)]
        replay = Replay(data, np.zeros((n,), np.int32), keys)
        self.replay = parallel.put(replay, self.mesh, parallel.LEADING, may_alias=False)

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
        ``jax.device_put`` holds the GIL ~0.5 ms per batch in the loader thread, time the
        runner thread waits for (1.12x CartPole training, benchmarks/README.md, tenth pass)."""
        batch = batch._replace(param_version=None)
        if self._host_batches:
            return batch
        return parallel.put(batch, self.mesh, parallel.TIME_MAJOR)

    def warm_up(self, example: Batch) -> None:
        """Compiles the step ahead of time in a background thread, from shapes alone.

        ``example`` is a host batch with the real shapes and dtypes; the state's and the
        replay slots' shapes come from the initial state's trace, so compilation (seconds on
        a CPU) needs no state yet: it overlaps the initial state's compilation, the policy's
        and the runners' first fragments instead of delaying the first update. Over several
        processes it also keeps collectives out of a thread of their own (nothing runs).
        """
        # Compiled for the device layout whichever put_batch returns: the same program.
        device_batch = parallel.put(
            example._replace(param_version=None), self.mesh, parallel.TIME_MAJOR
        )
        self._compiled_for = _layout(device_batch)
        self._replay_like = self._abstract_replay(device_batch)
        args = (self._abstract_state, device_batch, self._replay_like)
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
