"""The learner's per-device step: ``make_learner_step`` builds ``learner_step``, a pure function.

One step consumes a batch of ``train_batch_size_per_learner`` env steps per device (time-major
``[T+1, B]``), mixes in replayed columns from the device-resident replay slots
(``replay_proportion``), and runs ``num_epochs`` passes of minibatch updates inside the same
compiled program (``lax.scan``, or unrolled: ``max_unrolled_updates``). Grads and metrics are
averaged over ``LEARNER_AXIS``, each reduction one flat vector (``all_reduce``).
runtime/learning/learner.py wraps it over the mesh and compiles it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from impala_jax.core import finite, hyperparams, learner_metrics, losses, optim
from impala_jax.core.types import LEARNER_AXIS, Batch, LearnerState


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


def _time_major(x):
    return jnp.swapaxes(x, 0, 1)


def _uniform_index(key, n: int, span: jax.Array) -> jax.Array:
    """``n`` indices drawn uniformly from ``[0, span)`` (int32), for ``span`` up to 2^31.

    One 32-bit draw each, reduced modulo ``span``: each index is off uniform by less than
    ``span / 2^32`` (2.3e-5 relative for a million slots). ``jax.random.randint`` makes two
    draws and more arithmetic to remove that bias, which lengthens the learner step's
    compilation.
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


def finite_columns(batch: Batch) -> jax.Array:
    """bool ``[B]``: whether every value of a column is finite, by `core.finite`'s rule (the
    runners' door applies the same one)."""
    ok = jnp.ones(batch.reward.shape[1], bool)
    for x in jax.tree.leaves(batch):
        bad = finite.non_finite_columns(x, jnp)
        if bad is not None:
            ok &= ~bad
    return ok


def mix_replay(batch: Batch, replay: Replay, step_spec: StepSpec) -> tuple[Batch, Replay]:
    """Appends ``replay_columns`` columns drawn uniformly from the filled slots (as they were
    before this batch), then writes the new columns into the ring of slots (per device); a
    column holding a non-finite value leaves its slot's old column there instead.

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
    # A column with a non-finite value is not kept: every later update that drew it would be
    # dropped whole by the optimizer's guard, long after the batch that brought it.
    keep = (count >= 0) & finite_columns(batch)[-n_insert:]

    def write(buf, x, old):
        new = _time_major(x)[-n_insert:]
        return buf.at[pos].set(jnp.where(keep.reshape(-1, *([1] * (new.ndim - 1))), new, old))

    data = jax.tree.map(write, replay.data, batch, overwritten)
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


def _feature_stats(features: jax.Array) -> dict[str, jax.Array]:
    """This device's sums over a minibatch's encoder features (every row, reset and bootstrap
    rows too), from which ``_feature_metrics`` makes the metrics once per learner step: one
    collective per step rather than three per minibatch update (each a round trip between
    processes over several hosts)."""
    f = features.reshape(features.shape[0], -1).astype(jnp.float32)
    return {
        _FEATURE_COUNT: jnp.float32(f.shape[0]),
        _FEATURE_SUM: jnp.sum(f, 0),
        _FEATURE_SQUARES: jnp.sum(jnp.square(f), 0),
        _FEATURE_MAX: jnp.max(f, 0),
    }


def _feature_metrics(stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Whether the policy's encoder still tells observations apart, per minibatch update
    (``[U]`` each), over its observations on every learner device, from ``_feature_stats``'
    ``[U, units]`` statistics of each update summed (the max: maximised) over the devices.

    ``encoder_dead_unit_fraction``: the share of the encoder's output units that are <= 0 for
    every observation (a dead ReLU: it passes no gradient and carries nothing).
    ``encoder_feature_std``: each output unit's standard deviation across the observations,
    averaged over units. Both near their limits (1 and 0) mean the policy and value see the same
    features whatever the frame: the network has gone blind (issue 17).
    """
    n, total = stats[_FEATURE_COUNT], stats[_FEATURE_SUM]
    alive = stats[_FEATURE_MAX] > 0.0
    mean = total / n[:, None]
    var = jnp.maximum(stats[_FEATURE_SQUARES] / n[:, None] - jnp.square(mean), 0.0)
    return {
        "encoder_dead_unit_fraction": 1.0 - jnp.mean(alive.astype(jnp.float32), axis=-1),
        "encoder_feature_std": jnp.mean(jnp.sqrt(var), axis=-1),
    }


def _over_devices(metrics: dict) -> dict:
    """The step's metrics from its minibatch updates' (``[U]`` each) over the learner devices,
    in two collectives, one sum and one max: each metric combined over the updates
    (``_combine_updates``), then averaged over the devices, or maximised where its reduction
    says so; the feature metrics made from ``_feature_stats``' sums and maxima over the devices,
    then combined over the updates."""
    stats = {k: metrics.pop(k) for k in _FEATURE_STATS if k in metrics}
    rows = metrics[_VALID_ROWS]  # each update's rows on every device already
    metrics = _combine_updates(metrics)
    device_max = learner_metrics.keys_reduced_by(learner_metrics.DEVICE_MAX)
    top = {k: metrics.pop(k) for k in device_max if k in metrics}
    if stats:
        top[_FEATURE_MAX] = stats.pop(_FEATURE_MAX)
    sums, stats = all_reduce((metrics, stats), jax.lax.psum)
    devices = jax.lax.psum(1, LEARNER_AXIS)  # the axis size: no collective
    metrics = {k: v / devices for k, v in sums.items()}  # pmean's own arithmetic
    top = all_reduce(top, jax.lax.pmax) if top else {}
    if stats:
        stats[_FEATURE_MAX] = top.pop(_FEATURE_MAX)
        metrics.update(_combine_updates({**_feature_metrics(stats), _VALID_ROWS: rows}))
    return {**metrics, **top}


# _feature_stats' keys: popped from the minibatch updates' metrics, never reported.
_FEATURE_COUNT, _FEATURE_SUM = "feature_count", "feature_sum"
_FEATURE_SQUARES, _FEATURE_MAX = "feature_squares", "feature_max"
_FEATURE_STATS = (_FEATURE_COUNT, _FEATURE_SUM, _FEATURE_SQUARES, _FEATURE_MAX)


def all_reduce(tree, reduce=jax.lax.pmean):
    """``reduce`` (``pmean``, ``psum`` or ``pmax``) over ``LEARNER_AXIS`` of ``tree``'s leaves
    as one flat vector: one collective however many leaves. Between processes on CPU, XLA's
    gloo collectives exchange a tuple leaf by leaf, about 1 ms each (benchmarks/README.md,
    "Processes"); elementwise, the result is the same."""
    flat, unravel = ravel_pytree(tree)
    return unravel(reduce(flat, LEARNER_AXIS))


def per_device(tree):
    """``tree`` (replicated over the learner axis) as per-device values inside shard_map, so a
    gradient taken with respect to it is each device's own. Without the cast, JAX's shard_map
    types treat a replicated input as unvarying and sum its cotangent over the devices."""
    cast = getattr(jax.lax, "pcast", None)
    if cast is not None:
        return cast(tree, LEARNER_AXIS, to="varying")
    pvary = getattr(jax.lax, "pvary", None)  # the older spelling
    return pvary(tree, LEARNER_AXIS) if pvary is not None else tree


def on_one_device(fn):
    """``fn``, a per-device function for a learner of one device, with ``LEARNER_AXIS`` bound
    by a ``vmap`` of size 1 (its collectives are then the identity) rather than by shard_map
    over a mesh of its own: the program can sit inside a program sharded another way, a
    population's members spread over devices (runtime/ondevice/population.py). A learner step
    in it is ``make_learner_step(..., manual_axis=False)``'s. Arguments and results as one
    device's shard_map would see them."""

    def on_one(*args):
        out = jax.vmap(fn, axis_name=LEARNER_AXIS)(*jax.tree.map(lambda x: x[None], args))
        return jax.tree.map(lambda x: x[0], out)

    return on_one


def _make_loss_fn(networks, distribution, loss_spec: losses.LossSpec):
    """``loss_fn(params, batch, coeffs, total_valid) -> (loss, metrics)``: this device's share
    of the global loss, differentiated by the minibatch update. ``coeffs``: the loss's numbers
    that are not the spec's constants (the current entropy coefficient, traced
    hyperparameters); ``total_valid``: the minibatch's valid rows on every device
    (``_valid_rows_per_update``)."""

    def loss_fn(params, batch: Batch, coeffs, total_valid):
        # The loss is a mean over this device's valid rows; weighting it by this device's share
        # of all valid rows makes the pmean of grads the gradient of the global mean, so N
        # devices give the same update as one device with the whole batch (and the same for
        # the global sum with loss_reduction="sum").
        valid = jnp.sum(batch.valid)
        devices = jax.lax.psum(1, LEARNER_AXIS)  # the axis size: no collective
        weight = valid / jnp.maximum(total_valid / devices, 1e-6)  # total / devices: pmean's
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
        coeffs = dict(coeffs)
        gamma = coeffs.pop("gamma", loss_spec.gamma)
        discount_t = gamma * (1.0 - batch.terminated.astype(jnp.float32))
        loss, metrics = losses.impala_loss(
            dist_inputs[:-1],
            values,
            batch.behaviour_logits,
            batch.action,
            batch.reward,
            discount_t,
            batch.valid,
            distribution=distribution,
            **loss_spec.loss_keywords(**coeffs),
        )
        # Masked means become shares of the global mean, so their pmean is the global mean;
        # RLlib's pi_loss / vf_loss are sums, beside the means.
        metrics = learner_metrics.device_shares(metrics, weight, total_valid)
        # How much this minibatch update weighs when the step's updates are combined
        # (_combine_updates); popped there, never reported.
        metrics[_VALID_ROWS] = total_valid
        if features is not None:
            metrics.update(_feature_stats(jax.lax.stop_gradient(features)))
        max_entropy = getattr(distribution, "max_entropy", None)
        if max_entropy:  # None for a Gaussian, 0 for a one-action space: nothing to compare
            metrics["entropy_fraction_of_max"] = metrics["entropy"] / max_entropy
        if loss_spec.loss_reduction == "sum":
            # The global mean times the global valid-row count is the global sum.
            return loss * weight * total_valid, metrics
        return loss * weight, metrics

    return loss_fn


# The valid rows of a minibatch update, over every device: how _combine_updates weighs it.
_VALID_ROWS = "valid_rows"


def _combine_updates(metrics: dict) -> dict:
    """The step's metrics from those of its minibatch updates (each a ``[U]`` array), on each
    device, before the devices combine them.

    A row mean (``learner_metrics.ROW_MEAN``) is weighted by each update's valid rows, so the
    result is the mean over every valid row of the step; a maximum is the maximum over the
    updates; anything else (a sum over a minibatch's rows, a statistic of the gradient or of
    the features) is the mean over the updates that had valid rows. An update without any, a
    minibatch of replay slots still empty on the first step, would otherwise count as mean_rho
    0, entropy 0, explained variance 1 (issue 56). With no valid row anywhere, plain means.
    """
    rows = metrics.pop(_VALID_ROWS)
    has_rows = (rows > 0).astype(jnp.float32)
    some = jnp.sum(has_rows) > 0

    def mean(x, weights):
        weights = jnp.where(some, weights, jnp.ones_like(weights))
        return jnp.sum(x * weights) / jnp.sum(weights)

    out = {}
    for key, x in metrics.items():
        metric = learner_metrics.REPORTED.get(key)  # gradients_<group>_global_norm is not
        reduce = metric.reduce if metric is not None else learner_metrics.DEVICE_MEAN
        if reduce == learner_metrics.DEVICE_MAX:
            out[key] = jnp.max(x)
        elif reduce == learner_metrics.ROW_MEAN and key != metric.sum_key:
            out[key] = mean(x, rows)
        else:
            out[key] = mean(x, has_rows)
    return out


def _minibatch_orders(key, step_spec: StepSpec, n_cols: int) -> jax.Array:
    """The columns of every minibatch update, epoch after epoch: int32 ``[updates, columns]``."""
    mb = step_spec.minibatch_columns
    n_mb = n_cols // mb
    if step_spec.shuffle:
        order = _permutations(key, step_spec.num_epochs, n_cols)
    else:
        order = jnp.tile(jnp.arange(n_cols), (step_spec.num_epochs, 1))
    return order.reshape(step_spec.num_epochs * n_mb, mb)


def _valid_rows_per_update(batch: Batch, order: jax.Array) -> jax.Array:
    """float32 ``[U]``: the valid rows of each minibatch update's columns ``order[u]`` on every
    learner device, one collective for the step rather than one per update."""
    local = jnp.sum(jnp.take(batch.valid, order, axis=1), axis=(0, 2))
    return jax.lax.psum(local, LEARNER_AXIS)


def _make_minibatch_update(
    loss_fn, optimizer, opt_spec, step_spec, batch, coeffs, opt_values, env_steps, manual_axis
):
    """``update((params, opt_state), (cols, total_valid)) -> ((params, opt_state), metrics)``:
    one optimizer step on the minibatch of ``batch``'s columns ``cols`` (``total_valid`` valid
    rows over the devices), grads averaged over the devices. ``manual_axis``: as
    ``make_learner_step``'s."""

    def update(carry, xs):
        cols, total_valid = xs
        params, opt_state = carry
        minibatch = jax.tree.map(lambda x: jnp.take(x, cols, axis=1), batch)
        # The params are replicated (unvarying over the learner axis): differentiated as
        # they are, shard_map would already sum their cotangents over the devices, and the
        # pmean below would be a no-op on an N-times-too-large gradient (invisible under
        # Adam, which is scale-invariant; wrong under RMSProp, clipping and the reported
        # norm). Cast to per-device values, each device's gradient is its own.
        local = per_device(params) if manual_axis else params  # a vmap's axis has no types
        grads, metrics = jax.grad(loss_fn, has_aux=True)(local, minibatch, coeffs, total_valid)
        grads = all_reduce(grads)
        metrics = dict(metrics, gradients_default_optimizer_global_norm=_global_norm(grads))
        if step_spec.log_gradients:  # static: no extra work in the program when off
            for group, group_grads in grads.items():
                metrics[f"gradients_{group}_global_norm"] = _global_norm(group_grads)
        updates, opt_state = optimizer.update(
            grads, opt_state, params, env_steps=env_steps, hparams=opt_values
        )
        lr = optim.current_lr(opt_spec, env_steps, opt_values)
        metrics.update(_step_size_metrics(updates, params, lr))
        params = optax.apply_updates(params, updates)
        return (params, opt_state), metrics

    return update


def make_learner_step(
    networks,
    distribution,
    optimizer,
    opt_spec,
    loss_spec,
    step_spec,
    max_unrolled_updates=0,
    manual_axis=True,
):
    """Returns the per-device ``learner_step(state, batch, replay, env_steps, hparams=None)``.

    ``max_unrolled_updates``: up to this many minibatch updates per step run as an unrolled
    sequence, more as a ``lax.scan``. ``hparams``: traced values of some of
    core/hyperparams.py's names, read in place of the specs' (checked when traced).
    ``manual_axis``: ``LEARNER_AXIS`` is shard_map's; False: a vmap's (``on_one_device``).
    """
    entropy_coeff_at = optim.piecewise_linear(loss_spec.entropy_coeff, "entropy_coeff")
    loss_fn = _make_loss_fn(networks, distribution, loss_spec)

    def learner_step(state: LearnerState, batch: Batch, replay, env_steps, hparams=None):
        hyperparams.check(hparams or {}, opt_spec, loss_spec, max_policy_lag=None)
        loss_values, opt_values = hyperparams.split(hparams)
        batch = batch._replace(param_version=None)
        if step_spec.replay_columns:
            batch, replay = mix_replay(batch, replay, step_spec)
        n_cols = batch.reward.shape[1]
        entropy_coeff = entropy_coeff_at(env_steps, loss_values.get("entropy_coeff"))
        coeffs = loss_values | {"entropy_coeff": entropy_coeff}
        key, perm_key = jax.random.split(state.key)
        order = _minibatch_orders(perm_key, step_spec, n_cols)
        update = _make_minibatch_update(
            loss_fn,
            optimizer,
            opt_spec,
            step_spec,
            batch,
            coeffs,
            opt_values,
            env_steps,
            manual_axis,
        )
        carry = (state.params, state.opt_state)
        totals = _valid_rows_per_update(batch, order)
        if order.shape[0] == 1 or order.shape[0] <= max_unrolled_updates:
            # Unrolled, not scanned: on CPU, conv gradients inside lax.scan run many times slower
            # (jax-ml/jax#12868; scan's unroll= does not help).
            per_update = []
            for i in range(order.shape[0]):
                carry, update_metrics = update(carry, (order[i], totals[i]))
                per_update.append(update_metrics)
            metrics = jax.tree.map(lambda *xs: jnp.stack(xs), *per_update)
        else:
            carry, metrics = jax.lax.scan(update, carry, (order, totals))
        metrics = _over_devices(metrics)
        params, opt_state = carry
        metrics["curr_lr"] = optim.current_lr(opt_spec, env_steps, opt_values)
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
