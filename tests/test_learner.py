"""The learner step: data parallelism, replay mixing, compile-once."""

from __future__ import annotations

import itertools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core import losses
from impala_jax.core import vtrace as vtrace_module
from impala_jax.core.distributions import make_distribution
from impala_jax.core.losses import LossSpec
from impala_jax.core.networks import make_networks
from impala_jax.core.optim import OptimizerSpec
from impala_jax.core.types import Trajectory
from impala_jax.core.update import Replay, StepSpec, _uniform_index, mix_replay
from impala_jax.runtime.learning import parallel
from impala_jax.runtime.learning.learner import Learner

T, B = 4, 8
OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def random_batch(seed=0, b=B):
    rng = np.random.default_rng(seed)
    done = rng.random((T, b)) < 0.2
    valid = ~np.concatenate([np.zeros((1, b), bool), done[:-1]])
    return Trajectory(
        obs=rng.normal(size=(T + 1, b, 4)).astype(np.float32),
        action=rng.integers(0, 2, (T, b)).astype(np.int32),
        behaviour_logits=rng.normal(size=(T, b, 2)).astype(np.float32),
        reward=rng.normal(size=(T, b)).astype(np.float32),
        terminated=done & (rng.random((T, b)) < 0.5),
        truncated=np.zeros((T, b), bool),
        valid=valid.astype(np.float32),
        param_version=np.zeros(b, np.int32),
    )


def make_learner(num_devices, num_epochs=1, minibatches=1, step=None):
    model = {"fcnet_hiddens": [8]}
    networks = make_networks(model, OBS, ACT)
    columns = B // num_devices
    step = step or StepSpec(
        columns=columns,
        replay_columns=0,
        replay_slots=0,
        minibatch_columns=columns // minibatches,
        num_epochs=num_epochs,
        shuffle=False,
    )
    loss = LossSpec(0.99, 0.5, 0.01, 1.0, 1.0, None)
    return Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss,
        step,
        jax.devices()[:num_devices],
        jax.random.key(0),
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_epochs,minibatches", [(1, 1), (2, 2)])
def test_two_devices_give_the_same_update_as_one(num_epochs, minibatches):
    assert len(jax.devices()) >= 2, "conftest forces two CPU devices"
    results = []
    for n in (1, 2):
        learner = make_learner(n, num_epochs, minibatches)
        for seed in range(2):
            # Columns interleave so each device's minibatches are the same columns as on one.
            metrics = learner.update(learner.put_batch(random_batch(seed)), env_steps=0)
            jax.block_until_ready(metrics)
        results.append((jax.device_get(learner.state.params), jax.device_get(metrics)))
    (p1, m1), (p2, m2) = results
    if minibatches == 1:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), p1, p2)
        np.testing.assert_allclose(m1["total_loss"], m2["total_loss"], rtol=1e-5)
        # Adam is nearly scale-invariant: the updates above would agree even with a gradient
        # N times too large (which 2 devices once had); its reported norm would not.
        name = "gradients_default_optimizer_global_norm"
        np.testing.assert_allclose(m1[name], m2[name], rtol=1e-5)
    else:
        # Minibatches are per-device column blocks: with 2 devices a minibatch holds columns
        # from both halves, so only the full-batch case is the same update.
        assert np.isfinite(m2["total_loss"])
        # Placed so that minibatch m's block on each device holds half of one device's
        # minibatch m (unshuffled), the columns give 2 devices one device's updates exactly.
        mb = B // 2 // minibatches
        perm = [
            m * 2 * mb + d * mb + i for d in (0, 1) for m in range(minibatches) for i in range(mb)
        ]
        learner = make_learner(2, num_epochs, minibatches)
        for seed in range(2):
            batch = jax.tree.map(
                lambda x: x[perm] if x.ndim == 1 else x[:, perm], random_batch(seed)
            )
            metrics = learner.update(learner.put_batch(batch), env_steps=0)
        p3, m3 = jax.device_get((learner.state.params, metrics))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), p1, p3)
        for name in ("total_loss", "entropy", "gradients_default_optimizer_global_norm"):
            np.testing.assert_allclose(m1[name], m3[name], rtol=1e-5)


@pytest.mark.timeout(120)
def test_one_cpu_device_steps_on_host_batches_as_on_device_batches():
    # On one CPU device put_batch hands the host arrays to the step, whose dispatch places
    # them (no jax.device_put holding the GIL in the loader thread); the update must be the
    # one a device-placed batch gives, ahead-of-time compiled or not.
    results = []
    for placed in (False, True):
        for ahead_of_time in (False, True):
            learner = make_learner(1)
            if ahead_of_time:
                learner.warm_up(random_batch())
            for seed in range(3):
                batch = random_batch(seed)
                given = learner.put_batch(batch)
                assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(given))
                if placed:
                    given = parallel.put(given, learner.mesh, parallel.TIME_MAJOR)
                metrics = learner.update(given, env_steps=seed)
            assert (learner._compiled is not None) == ahead_of_time
            results.append(jax.device_get((learner.state.params, metrics)))
    for other in results[1:]:
        jax.tree.map(np.testing.assert_array_equal, results[0], other)
    # Over two devices the batch is split onto them as before.
    split = make_learner(2).put_batch(random_batch())
    assert all(len(x.sharding.device_set) == 2 for x in jax.tree.leaves(split))


@pytest.mark.timeout(120)
def test_learner_compiles_once_across_steps_and_env_steps():
    learner = make_learner(1)
    for step in range(4):
        learner.update(learner.put_batch(random_batch(step)), env_steps=step * 1000)
    assert learner._step._cache_size() == 1


def test_mix_replay_draws_uniformly_from_filled_slots():
    spec = StepSpec(
        columns=4,
        replay_columns=4,
        replay_slots=8,
        minibatch_columns=8,
        num_epochs=1,
        shuffle=False,
    )
    template = random_batch(b=4)
    zeros = jax.tree.map(
        lambda x: jnp.zeros((8, x.shape[0], *x.shape[2:]), x.dtype),
        template._replace(param_version=None),
    )
    replay = Replay(zeros, jnp.zeros((1,), jnp.int32), jax.random.key_data(jax.random.key(0))[None])
    mix = jax.jit(lambda b, r: mix_replay(b, r, spec))

    def batch_with_ids(ids):
        b = template._replace(param_version=None)
        reward = np.broadcast_to(np.asarray(ids, np.float32), (T, 4))
        return b._replace(reward=jnp.asarray(reward), valid=jnp.ones((T, 4)))

    mixed, replay = mix(batch_with_ids([0, 1, 2, 3]), replay)
    assert mixed.reward.shape == (T, 8)
    np.testing.assert_array_equal(mixed.valid[:, 4:], 0.0)  # empty slots are masked out
    for start in (4, 8):  # ids 0..11 inserted into 8 slots: 4..11 remain
        mixed, replay = mix(batch_with_ids(range(start, start + 4)), replay)
    mixed, _ = mix(batch_with_ids([12, 13, 14, 15]), replay)
    assert set(np.asarray(mixed.reward[0, 4:]).astype(int)) <= set(range(4, 12))
    # Uniform draws from a known set of 8 slots: check frequencies on a frozen buffer.
    frozen = replay  # holds ids 4..11
    draws = []
    for i in range(400):
        key = jax.random.key_data(jax.random.key(i))[None]
        mixed, _ = mix(batch_with_ids([999] * 4), frozen._replace(key=key))
        draws.extend(np.asarray(mixed.reward[0, 4:]).tolist())
    values, freq = np.unique(draws, return_counts=True)
    assert len(values) == 8
    expected = len(draws) / 8
    assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected))
    assert int(replay.count[0]) == 3 * 4


@pytest.mark.parametrize(
    "slots,columns,replay_columns", [(8, 4, 4), (10, 4, 6), (4, 4, 4), (3, 4, 2)]
)
def test_mix_replay_is_draw_then_insert_exactly(slots, columns, replay_columns):
    # A plain ring on the host: draw from the slots as they were, then write the batch's
    # columns after the newest. The step writes first and reads after (so XLA need not copy
    # the ring); draws that land on an overwritten slot must still see the old column. The
    # sizes wrap the ring mid-insert (10 slots, 4 columns), overwrite every slot each step (4
    # and 4), and insert only the last columns when the batch is wider than the ring (3, 4).
    spec = StepSpec(
        columns=columns,
        replay_columns=replay_columns,
        replay_slots=slots,
        minibatch_columns=columns + replay_columns,
        num_epochs=1,
        shuffle=False,
    )

    template = random_batch(b=columns)._replace(param_version=None)
    ring = jax.tree.map(lambda x: np.zeros((slots, x.shape[0], *x.shape[2:]), x.dtype), template)
    key = jax.random.key_data(jax.random.key(7))[None]
    replay = Replay(jax.tree.map(jnp.asarray, ring), jnp.zeros((1,), jnp.int32), key)
    mix = jax.jit(lambda b, r: mix_replay(b, r, spec), donate_argnums=1)
    count, host_key = 0, np.asarray(key)
    n_insert = min(columns, slots)
    for step in range(9):
        batch = random_batch(seed=100 + step, b=columns)._replace(param_version=None)
        mixed, replay = mix(jax.tree.map(jnp.asarray, batch), replay)
        new_key, sample_key = jax.random.split(jax.random.wrap_key_data(host_key[0]))
        filled = min(count, slots)
        idx = np.asarray(_uniform_index(sample_key, replay_columns, jnp.int32(max(filled, 1))))
        expected = jax.tree.map(
            lambda b, r, idx=idx: np.concatenate([b, np.swapaxes(r[idx], 0, 1)], 1), batch, ring
        )
        expected = expected._replace(
            valid=np.concatenate(
                [batch.valid, np.swapaxes(ring.valid[idx], 0, 1) * (filled > 0)], 1
            )
        )
        pos = (count + np.arange(n_insert)) % slots
        for buf, x in zip(jax.tree.leaves(ring), jax.tree.leaves(batch), strict=True):
            buf[pos] = np.swapaxes(x, 0, 1)[-n_insert:]
        count += n_insert
        host_key = np.asarray(jax.random.key_data(new_key))[None]
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(mixed), expected)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(replay.data), ring)
        assert int(replay.count[0]) == count
        np.testing.assert_array_equal(replay.key, host_key)


@pytest.mark.timeout(120)
def test_the_step_does_not_copy_the_replay_ring():
    # Reading the old ring after (or unordered with) its in-place write made XLA copy every
    # slot twice per step: 41 ms instead of 4.5 ms for CartPole's step with 256,000 slots.
    slots = 1000
    learner = make_learner(1, step=StepSpec(B, B, slots, 2 * B, num_epochs=1, shuffle=False))
    batch = learner.put_batch(random_batch())
    learner.init_replay(batch)
    env_steps = jnp.zeros((2,), jnp.float32)
    text = learner._step.lower(learner.state, batch, learner.replay, env_steps).compile().as_text()
    ring_copies = [line for line in text.splitlines() if f"[{slots}," in line and " copy(" in line]
    assert not ring_copies, ring_copies[:3]
    learner.update(batch, env_steps=0)  # and the step runs


def _chi_square_ok(counts, expected):
    # Pearson's statistic against a bound that a uniform draw exceeds with probability < 1e-4
    # (the normal approximation of the chi-square's upper tail, z = 3.72).
    counts = np.asarray(counts, np.float64)
    dof = counts.size - 1
    stat = float(np.sum((counts - expected) ** 2 / expected))
    return stat < dof + 3.72 * np.sqrt(2 * dof), stat


def test_shuffle_orders_are_uniform_permutations():
    # The minibatch orders: every row a permutation of range(n), each of the n! orders drawn
    # equally often, rows of one key independent of each other.
    from impala_jax.core.update import _permutations

    keys = jax.random.split(jax.random.key(0), 12_000)
    orders = np.asarray(jax.jit(jax.vmap(lambda k: _permutations(k, 2, 4)))(keys))
    assert orders.shape == (12_000, 2, 4) and orders.dtype == np.int32
    np.testing.assert_array_equal(
        np.sort(orders, axis=-1), np.broadcast_to(np.arange(4), orders.shape)
    )
    codes = orders @ np.array([64, 16, 4, 1])  # one id per order
    _, freq = np.unique(codes[:, 0], return_counts=True)
    assert freq.size == 24
    ok, stat = _chi_square_ok(freq, 12_000 / 24)
    assert ok, stat
    pair = np.unique(codes[:, 0] * 256 + codes[:, 1], return_counts=True)[1]
    assert pair.size > 500  # of 576 pairs; the same order in both rows would give 24
    # Large n (past jax.random.permutation's one-round limit of 1,625): still permutations.
    big = np.asarray(_permutations(jax.random.key(1), 3, 5000))
    np.testing.assert_array_equal(
        np.sort(big, axis=-1), np.broadcast_to(np.arange(5000), big.shape)
    )
    assert len({tuple(row[:20]) for row in big}) == 3


def test_replay_indices_are_uniform_below_the_span():

    draw = jax.jit(lambda k, span: _uniform_index(k, 70_000, span))
    for span in (1, 7, 2560):
        idx = np.asarray(draw(jax.random.key(span), jnp.int32(span)))
        assert idx.dtype == np.int32 and idx.min() >= 0 and idx.max() < span
        if span > 1:
            ok, stat = _chi_square_ok(np.bincount(idx, minlength=span), 70_000 / span)
            assert ok, (span, stat)


def test_global_norm_is_optax_tree_norm():
    import optax

    from impala_jax.core.update import _global_norm

    rng = np.random.default_rng(0)
    tree = {"a": rng.normal(size=(64, 64)), "b": {"c": rng.normal(size=3), "d": rng.normal()}}
    tree = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
    np.testing.assert_allclose(_global_norm(tree), optax.tree.norm(tree), rtol=1e-6)


@pytest.mark.timeout(120)
def test_a_step_past_2_31_env_steps_reads_the_schedule_there():
    schedule = [[0, 1e-2], [3_000_000_000, 1e-2], [3_000_002_000, 0.0]]
    columns = B
    learner = Learner(
        make_networks({"fcnet_hiddens": [8]}, OBS, ACT),
        make_distribution(ACT),
        OptimizerSpec(lr=schedule),
        LossSpec(0.99, 0.5, [[0, 0.01], [3_000_000_000, 0.01], [3_000_002_000, 0.0]], 1, 1, None),
        StepSpec(columns, 0, 0, columns, 1, False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    metrics = learner.update(learner.put_batch(random_batch(0)), env_steps=3_000_000_500)
    metrics = jax.device_get(metrics)
    np.testing.assert_allclose(metrics["curr_lr"], 0.75e-2, rtol=1e-5)
    np.testing.assert_allclose(metrics["curr_entropy_coeff"], 0.0075, rtol=1e-5)


@pytest.mark.timeout(240)
def test_training_continues_past_2_31_env_steps_with_its_lr_schedule(tmp_path):
    from tests.test_algorithm import small_config

    start = 3_000_000_000
    ramp = 100_000  # the lr falls to 0 over the 100 K env steps after 3 G
    config = small_config().training(lr=[[0, 1e-3], [start, 1e-3], [start + ramp, 0.0]])
    with config.build() as algo:
        algo.train()
        state = algo.get_state()
        state["counters"]["num_env_steps_sampled_lifetime"] = start
        algo.set_state(state)
        result = algo.train()
        assert result["num_env_steps_sampled_lifetime"] > start
        lr = result["learners"]["default_policy"]["curr_lr"]
        steps = result["num_env_steps_sampled_lifetime"]
        # The lr is read at the counter of the iteration's last update, <= the result's count.
        assert 1e-3 * (1 - (steps - start) / ramp) * (1 - 1e-6) <= lr < 1e-3 * (1 - 1 / ramp)
        path = algo.save(tmp_path / "checkpoint")
    with config.build() as again:
        again.restore(path)
        assert again.train()["num_env_steps_sampled_lifetime"] > steps


@pytest.mark.timeout(240)
def test_unrolled_minibatch_updates_equal_the_scanned_ones(monkeypatch):
    # A conv network on CPU runs its updates unrolled (lax.scan is ~10x slower there); two
    # epochs of two shuffled minibatches must give the scan's params and metrics.
    from impala_jax.runtime.learning import learner as learner_module

    obs_space = gym.spaces.Box(0, 255, (10, 10, 2), np.uint8)
    rng = np.random.default_rng(0)
    batch = random_batch(1)._replace(
        obs=rng.integers(0, 256, (T + 1, B, 10, 10, 2)).astype(np.uint8)
    )
    model = {"encoder": "nature_cnn", "conv_filters": [[4, 4, 2], [4, 3, 1]]}

    def run(max_unrolled):
        monkeypatch.setattr(learner_module, "MAX_UNROLLED_UPDATES_ON_CPU", max_unrolled)
        step = StepSpec(B, 0, 0, B // 2, num_epochs=2, shuffle=True)
        learner = Learner(
            make_networks(model, obs_space, ACT),
            make_distribution(ACT),
            OptimizerSpec(lr=1e-2),
            LossSpec(0.99, 0.5, 0.01, 1.0, 1.0, None),
            step,
            jax.devices()[:1],
            jax.random.key(0),
        )
        device_batch = learner.put_batch(batch)
        state, replay = learner.throwaway_copy()
        text = learner._step.lower(state, device_batch, replay, jnp.zeros(2)).as_text()
        metrics = learner.update(device_batch, env_steps=0)
        loops = text.count("stablehlo.while")  # V-trace's own scan is one per update
        return jax.device_get(learner.state.params), jax.device_get(metrics), loops

    unrolled, unrolled_metrics, unrolled_loops = run(16)
    scanned, scanned_metrics, scanned_loops = run(0)
    # Each path is the one asked for: unrolled, each of the 4 updates has its V-trace loop;
    # scanned, one V-trace loop sits inside the scan's loop (4 - 2 fewer loops).
    assert unrolled_loops - scanned_loops == 2, (unrolled_loops, scanned_loops)
    for a, b in zip(jax.tree.leaves(unrolled), jax.tree.leaves(scanned), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for key in ("total_loss", "entropy", "gradients_default_optimizer_global_norm"):
        np.testing.assert_allclose(unrolled_metrics[key], scanned_metrics[key], rtol=1e-5)


def _loss_on(networks, params, batch, loss_spec):
    """``impala_loss`` recomputed from scratch on ``batch`` at ``params``: the learner's loss,
    without the learner."""
    return _loss_and_metrics_on(networks, params, batch, loss_spec)[0]


def _loss_and_metrics_on(networks, params, batch, loss_spec):
    """``_loss_on`` with the loss's metrics."""
    t1, b = batch.obs.shape[:2]
    dist_inputs, values = networks.apply(params, jnp.asarray(batch.obs).reshape(t1 * b, -1))
    discount = loss_spec.gamma * (1.0 - jnp.asarray(batch.terminated, jnp.float32))
    return losses.impala_loss(
        dist_inputs.reshape(t1, b, -1)[:-1],
        values.reshape(t1, b),
        jnp.asarray(batch.behaviour_logits),
        jnp.asarray(batch.action),
        jnp.asarray(batch.reward),
        discount,
        jnp.asarray(batch.valid),
        distribution=make_distribution(ACT),
        **loss_spec.loss_keywords(),
    )


@pytest.mark.timeout(120)
def test_the_learner_step_bootstraps_a_truncated_step_and_not_a_terminated_one(monkeypatch):
    # Catches: the learner's discount treating truncation as termination (core/update.py,
    # `terminated | truncated` where `terminated` belongs), which only a learning run on a
    # time-limited env would otherwise show. Column 0's step 0 is truncated, column 1's is
    # terminated, both with reward r; row 1 of each is the reset row (obs[1] is the final
    # observation). rho is clipped to 1 at step 0 and is 0 on the reset row, lambda is 1, so
    # V-trace's target there is exactly r + gamma * V(final obs) when truncated, r when
    # terminated.
    seen = []

    def spy(**kw):
        out = vtrace_module.vtrace(**kw)
        jax.debug.callback(lambda vs: seen.append(np.asarray(vs)), out.vs)
        return out

    monkeypatch.setattr(losses, "vtrace_targets", spy)
    gamma, r = 0.9, 0.5
    loss_spec = LossSpec(gamma, 0.5, 0.01, 1.0, 1.0, None)
    networks = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
    learner = Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss_spec,
        StepSpec(2, 0, 0, 2, num_epochs=1, shuffle=False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    params = jax.device_get(learner.state.params)
    # A value far from 0 everywhere, so bootstrapping from it or not cannot be confused.
    params["vf"] = jax.tree.map(lambda x: x + 3.0 if x.ndim == 1 else x, params["vf"])
    learner.set_params(params)
    rng = np.random.default_rng(0)
    batch = Trajectory(
        obs=rng.normal(size=(3, 2, 4)).astype(np.float32),
        action=np.ones((2, 2), np.int32),
        # The behaviour policy all but never takes action 1: rho >> 1, clipped to exactly 1.
        behaviour_logits=np.tile(np.float32([5.0, -5.0]), (2, 2, 1)),
        reward=np.float32([[r, r], [0.0, 0.0]]),
        terminated=np.array([[False, True], [False, False]]),
        truncated=np.array([[True, False], [False, False]]),
        valid=np.float32([[1, 1], [0, 0]]),
        param_version=np.zeros(2, np.int32),
    )
    metrics = jax.device_get(learner.update(learner.put_batch(batch), env_steps=0))
    jax.effects_barrier()
    assert len(seen) == 1, len(seen)
    _, v_final = networks.apply(params, jnp.asarray(batch.obs[1]))
    v_final = np.asarray(v_final)  # V(obs[1]): each column's final observation
    assert np.all(np.abs(v_final) > 1.0), v_final
    vs = seen[0]
    np.testing.assert_allclose(vs[0, 0], r + gamma * v_final[0], rtol=1e-5, err_msg="truncated")
    np.testing.assert_allclose(vs[0, 1], r, rtol=1e-5, err_msg="terminated")
    # What the user reads: the step's mean V-trace target over the two valid rows.
    np.testing.assert_allclose(metrics["mean_vs"], r + gamma * v_final[0] / 2, rtol=1e-5)


@pytest.mark.timeout(120)
def test_replayed_columns_reach_the_loss():
    # Catches: mixin replay's draw not reaching the loss (core/update.py's `mix_replay`
    # returning the new batch unchanged, or its replayed columns zeroed or masked), which only
    # an env-steps-trained counter showed. With replay_columns=2 the second step's loss must
    # be impala_loss on its 4 new columns plus 2 columns drawn from the first step's 4 (the
    # only filled slots): one of the 10 multisets, found by trying each.
    b, replayed = 4, 2
    loss_spec = LossSpec(0.99, 0.5, 0.01, 1.0, 1.0, None)
    networks = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
    learner = Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss_spec,
        StepSpec(b, replayed, 2 * b, b + replayed, num_epochs=1, shuffle=False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    loss_on = jax.jit(lambda p, batch: _loss_on(networks, p, batch, loss_spec))
    first, second = random_batch(1, b), random_batch(2, b)
    params = jax.device_get(learner.state.params)
    metrics = jax.device_get(learner.update(learner.put_batch(first), env_steps=0))
    # Before any insert the slots hold nothing: the first step's loss is its new columns'.
    np.testing.assert_allclose(metrics["total_loss"], loss_on(params, first), rtol=1e-5)
    params = jax.device_get(learner.state.params)
    metrics = jax.device_get(learner.update(learner.put_batch(second), env_steps=b))
    new_only = float(loss_on(params, second))
    candidates = {}
    for cols in itertools.combinations_with_replacement(range(b), replayed):
        mixed = jax.tree.map(
            lambda n, o, cols=cols: np.concatenate([n, o[:, list(cols)]], axis=1),
            second._replace(param_version=None),
            first._replace(param_version=None),
        )
        candidates[cols] = float(loss_on(params, mixed))
    # The draw must be visible at all: every candidate's loss is apart from the new-only one.
    assert min(abs(v - new_only) for v in candidates.values()) > 1e-3, (new_only, candidates)
    reported = float(metrics["total_loss"])
    best = min(candidates, key=lambda c: abs(candidates[c] - reported))
    np.testing.assert_allclose(
        reported, candidates[best], rtol=1e-5, err_msg=f"new-only loss {new_only}; {candidates}"
    )


ROW_MEANS = ("total_loss", "entropy", "mean_rho", "clipped_rho_fraction", "mean_kl", "mean_vs")


@pytest.mark.timeout(120)
def test_a_minibatch_of_empty_replay_slots_leaves_the_metrics_alone():
    # Catches (issue 56): the step's metrics a plain mean over its minibatch updates. On the
    # first step the replayed columns are slots still empty (no valid row), and their
    # minibatch counted as mean_rho 0, max_rho 0, entropy 0 and loss 0: an on-policy run with
    # mixin replay reported mean_rho 0.5 on its first result.
    b = 4
    loss_spec = LossSpec(0.99, 0.5, 0.01, 1.2, 1.0, None)
    networks = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
    learner = Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss_spec,
        # Two minibatch updates, unshuffled: the new columns, then the replayed ones.
        StepSpec(b, b, 2 * b, b, num_epochs=1, shuffle=False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    first = random_batch(1, b)
    params = jax.device_get(learner.state.params)
    metrics = jax.device_get(learner.update(learner.put_batch(first), env_steps=0))
    # The new columns' minibatch is the only one with rows, and it is taken at these params.
    _, expected = jax.jit(lambda p, x: _loss_and_metrics_on(networks, p, x, loss_spec))(
        params, first._replace(param_version=None)
    )
    for name in (*ROW_MEANS, "max_rho"):
        np.testing.assert_allclose(metrics[name], expected[name], rtol=1e-5, err_msg=name)


@pytest.mark.timeout(120)
def test_minibatch_updates_combine_as_row_means_and_maxima():
    # Catches: the step's metrics a plain mean over its minibatch updates: a row mean is the
    # mean over every valid row of the step (each update weighted by its valid rows) and
    # max_rho the largest weight of any update, not the mean of the updates' maxima.
    loss_spec = LossSpec(0.99, 0.5, 0.01, 1.2, 1.0, None)
    networks = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
    two = Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss_spec,
        StepSpec(B, 0, 0, B // 2, num_epochs=1, shuffle=False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    batch = random_batch(3)
    batch = batch._replace(valid=batch.valid * (np.arange(B) != 0))  # uneven valid rows
    cut = B // 2
    halves = [
        jax.tree.map(lambda x, s=s: x[..., s] if x.ndim == 1 else x[:, s], batch)
        for s in (slice(0, cut), slice(cut, B))
    ]
    metrics_on = jax.jit(lambda p, x: _loss_and_metrics_on(networks, p, x, loss_spec)[1])
    p0 = jax.device_get(two.state.params)
    reported = jax.device_get(two.update(two.put_batch(batch), env_steps=0))
    # The second update's params: one update of the same optimizer on the first half.
    one = Learner(
        networks,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        loss_spec,
        StepSpec(B // 2, 0, 0, B // 2, num_epochs=1, shuffle=False),
        jax.devices()[:1],
        jax.random.key(0),
    )
    one.update(one.put_batch(halves[0]), env_steps=0)
    p1 = jax.device_get(one.state.params)
    parts = [
        jax.device_get(metrics_on(p, half._replace(param_version=None)))
        for p, half in zip((p0, p1), halves, strict=True)
    ]
    rows = [float(np.sum(half.valid)) for half in halves]
    assert rows[0] != rows[1]
    for name in ROW_MEANS:
        expected = sum(m[name] * n for m, n in zip(parts, rows, strict=True)) / sum(rows)
        np.testing.assert_allclose(reported[name], expected, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(reported["max_rho"], max(m["max_rho"] for m in parts), rtol=1e-6)
    assert parts[0]["max_rho"] != parts[1]["max_rho"]


def test_every_all_reduce_over_the_learner_devices_is_one_flat_vector():
    # Between processes XLA:CPU exchanges a tuple all-reduce leaf by leaf, about 1 ms each
    # (core/update.py all_reduce; benchmarks/README.md "Processes"): the compiled two-device
    # step must reduce the gradients as one vector per minibatch update and the step's metrics
    # in a fixed few, however many leaves the params and metrics have.
    import re

    learner = make_learner(2, num_epochs=2, minibatches=2)
    batch = learner.put_batch(random_batch())
    state, replay = learner.throwaway_copy()
    text = learner._step.lower(state, batch, replay, jnp.zeros(2)).compile().as_text()
    reduces = [line for line in text.splitlines() if re.search(r"all-reduce(-start)?\(", line)]
    operands = [re.search(r"all-reduce(?:-start)?\(([^)]*)\)", line).group(1) for line in reduces]
    assert all(o and "," not in o for o in operands), reduces  # one operand each, no tuple
    in_loop = [line for line in reduces if "while/body" in line]
    assert len(in_loop) == 1, reduces  # the gradients, once per minibatch update
    assert len(reduces) <= 4, reduces  # + valid rows, the metrics' sum and their max
    n_params = sum(x.size for x in jax.tree.leaves(learner.state.params))
    assert re.search(rf"f32\[{n_params}\]", in_loop[0]), (n_params, in_loop)
