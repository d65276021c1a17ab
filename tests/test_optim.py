"""optim.py against hand-written numpy optimizers, clipping rules and RLlib's schedule rule."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from impala_jax.core import optim
from impala_jax.core.optim import OptimizerSpec, current_lr, make_optimizer, non_finite_count

RTOL = 1e-5
ATOL = 1e-7


def _params():
    return {
        "encoder": {"w": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)},
        "pi": {"w": jnp.asarray([[0.1, 0.2], [0.3, -0.4]], jnp.float32)},
        "vf": {"b": jnp.asarray([0.25], jnp.float32)},
    }


def _grads(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda p: jnp.asarray(scale * rng.normal(size=p.shape), jnp.float32), _params()
    )


def _np(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _run(spec, grads_seq, env_steps_seq):
    """Applies make_optimizer(spec) over the gradient sequence; returns params after each step."""
    tx = make_optimizer(spec)
    params = _params()
    state = tx.init(params)
    history = []
    for grads, env_steps in zip(grads_seq, env_steps_seq, strict=True):
        updates, state = tx.update(grads, state, params, env_steps=jnp.int32(env_steps))
        params = optax.apply_updates(params, updates)
        history.append(params)
    return history, state


def _assert_trees_close(actual, expected):
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(np.asarray(a), e, rtol=RTOL, atol=ATOL),
        actual,
        expected,
    )


def _adam_first_step(grads, lr):
    """Adam's first update: m_hat = g and v_hat = g^2, so it is -lr * g / (|g| + eps)."""
    return jax.tree.map(lambda g: -lr * g / (np.abs(g) + 1e-8), _np(grads))


def _rllib_piecewise(endpoints, t):
    """RLlib's PiecewiseSchedule.value with outside_value = last value, as a plain loop."""
    for (l_t, l_v), (r_t, r_v) in zip(endpoints[:-1], endpoints[1:], strict=True):
        if l_t <= t < r_t:
            alpha = (t - l_t) / (r_t - l_t)
            return l_v + alpha * (r_v - l_v)
    return endpoints[-1][1]


# Hand-written optimizers (float64 numpy), one leaf at a time.


def _np_adam(params, grads_seq, lrs, b1=0.9, b2=0.999, eps=1e-8):
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  w -= lr * m_hat / (sqrt(v_hat) + eps)."""
    w = np.asarray(params, np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    out = []
    for t, (g, lr) in enumerate(zip(grads_seq, lrs, strict=True), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
        out.append(w)
    return out


def _np_rmsprop_tf1(params, grads_seq, lrs, decay, eps, momentum, initial=1.0):
    """TF1 RMSProp: ms starts at 1 (`initial`); ms = d ms + (1-d) g^2;
    mom = mu mom + lr g / sqrt(ms + eps)."""
    w = np.asarray(params, np.float64)
    ms = np.full_like(w, initial)
    mom = np.zeros_like(w)
    out = []
    for g, lr in zip(grads_seq, lrs, strict=True):
        ms = decay * ms + (1 - decay) * g**2
        mom = momentum * mom + lr * g / np.sqrt(ms + eps)
        w = w - mom
        out.append(w)
    return out


def _per_leaf(np_opt, grads_seq, lrs, **kwargs):
    """Runs a numpy optimizer on every leaf of _params(); returns a list of param trees."""
    params = _np(_params())
    leaves, treedef = jax.tree.flatten(params)
    grad_leaves = [jax.tree.leaves(_np(g)) for g in grads_seq]
    per_leaf = [
        np_opt(leaf, [gl[i] for gl in grad_leaves], lrs, **kwargs) for i, leaf in enumerate(leaves)
    ]
    return [
        jax.tree.unflatten(treedef, [per_leaf[i][s] for i in range(len(leaves))])
        for s in range(len(grads_seq))
    ]


def test_adam_three_steps_match_numpy():
    grads_seq = [_grads(s) for s in range(3)]
    spec = OptimizerSpec(opt_type="adam", lr=0.01, grad_clip=None)
    history, _ = _run(spec, grads_seq, [0, 10, 20])
    expected = _per_leaf(_np_adam, grads_seq, [0.01] * 3)
    for got, want in zip(history, expected, strict=True):
        _assert_trees_close(got, want)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_three_steps_match_tf1_numpy(momentum):
    grads_seq = [_grads(s) for s in range(3)]
    # A scheduled lr that differs per step shows where the lr enters: before the momentum trace.
    schedule = [[0, 0.01], [100, 0.001]]
    env_steps = [0, 50, 200]
    lrs = [_rllib_piecewise(schedule, t) for t in env_steps]
    spec = OptimizerSpec(
        opt_type="rmsprop", lr=schedule, grad_clip=None, decay=0.99, epsilon=0.1, momentum=momentum
    )
    history, _ = _run(spec, grads_seq, env_steps)
    expected = _per_leaf(_np_rmsprop_tf1, grads_seq, lrs, decay=0.99, eps=0.1, momentum=momentum)
    for got, want in zip(history, expected, strict=True):
        _assert_trees_close(got, want)


def test_rmsprop_initial_scale_0_starts_at_the_gradients_scale():
    grads_seq = [jax.tree.map(lambda g: 1e-3 * g, _grads(s)) for s in range(3)]
    spec = OptimizerSpec(
        opt_type="rmsprop", lr=0.01, grad_clip=None, epsilon=1e-5, rmsprop_initial_scale=0.0
    )
    history, _ = _run(spec, grads_seq, [0, 10, 20])
    expected = _per_leaf(
        _np_rmsprop_tf1, grads_seq, [0.01] * 3, decay=0.99, eps=1e-5, momentum=0.0, initial=0.0
    )
    for got, want in zip(history, expected, strict=True):
        _assert_trees_close(got, want)
    # Gradients of 1e-3 x O(1): from a mean square of 1 the first step is ~1e-3 x lr per
    # param; from 0 it is g / sqrt(0.01 g^2 + 1e-5), a few tenths of lr.
    p0 = _np(_params())
    tf1, _ = _run(
        OptimizerSpec(opt_type="rmsprop", lr=0.01, grad_clip=None, epsilon=1e-5), grads_seq[:1], [0]
    )

    def step_rms(history):
        leaves = zip(jax.tree.leaves(_np(history[0])), jax.tree.leaves(p0), strict=True)
        return np.sqrt(np.mean(np.concatenate([np.ravel(a - b) ** 2 for a, b in leaves])))

    assert step_rms(history) > 30 * step_rms(tf1)


def _np_clip(grads, clip, by):
    grads = _np(grads)
    if clip is None:
        return grads
    if by == "value":
        return jax.tree.map(lambda g: np.clip(g, -clip, clip), grads)
    if by == "norm":
        return jax.tree.map(
            lambda g: g * clip / np.linalg.norm(g) if np.linalg.norm(g) > clip else g, grads
        )
    total = np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(grads)))
    return jax.tree.map(lambda g: g * clip / total if total > clip else g, grads)


@pytest.mark.parametrize(
    "clip_by,clip,scale",
    [
        ("global_norm", 1.0, 3.0),  # clipped
        ("global_norm", 100.0, 1.0),  # below the threshold: unchanged
        ("norm", 1.5, 1.5),  # some tensors above, some below
        ("value", 0.5, 1.0),
        ("value", None, 50.0),  # grad_clip None: no clipping whatever the mode
    ],
)
def test_clipping_matches_hand_computation(clip_by, clip, scale):
    grads = _grads(7, scale)
    if clip_by == "norm":
        norms = [np.linalg.norm(np.asarray(g)) for g in jax.tree.leaves(grads)]
        assert min(norms) < clip < max(norms)
    clipped = _np_clip(grads, clip, clip_by)
    if clip_by == "global_norm" and clip == 100.0:
        _assert_trees_close(grads, clipped)
    # RMSProp's first step is nonlinear in g, so it shows the gradient's scale after clipping.
    spec = OptimizerSpec(opt_type="rmsprop", lr=0.1, grad_clip=clip, grad_clip_by=clip_by)
    history, _ = _run(spec, [grads], [0])
    clipped_leaves, treedef = jax.tree.flatten(clipped)
    expected = jax.tree.unflatten(
        treedef,
        [
            _np_rmsprop_tf1(p, [g], [0.1], decay=0.99, eps=0.1, momentum=0.0)[0]
            for p, g in zip(jax.tree.leaves(_np(_params())), clipped_leaves, strict=True)
        ],
    )
    _assert_trees_close(history[0], expected)


def test_schedule_interpolates_like_rllib():
    endpoints = [[0, 1.0], [100, 0.5], [300, 0.1]]
    fn = optim.piecewise_linear(endpoints)
    for t in [0, 1, 50, 99, 100, 101, 200, 299, 300, 301, 10**6]:
        value = fn(jnp.int32(t))
        assert value.dtype == jnp.float32 and value.shape == ()
        np.testing.assert_allclose(value, _rllib_piecewise(endpoints, t), rtol=1e-6)
    np.testing.assert_allclose(fn(jnp.int32(50)), 0.75, rtol=1e-6)
    np.testing.assert_allclose(fn(jnp.int32(200)), 0.3, rtol=1e-6)


def test_schedules_stay_exact_past_2_31_env_steps():
    # A DMLab-scale run: breakpoints a thousand steps apart at 3 G env steps. int32 overflows
    # at 2^31; one float32 rounds 3e9 + 1 to 3e9 (a step of 256 there).
    endpoints = [[0, 1.0], [3_000_000_000, 1.0], [3_000_001_000, 0.0], [2**45, 0.5]]
    fn = jax.jit(optim.piecewise_linear(endpoints))
    for t in [
        2**31 - 1,
        2**31,
        2**31 + 1,
        3 * 10**9,
        3 * 10**9 + 1,
        3 * 10**9 + 500,
        3 * 10**9 + 999,
        3 * 10**9 + 1000,
        3 * 10**9 + 1001,
        2**40,
        2**45,
        2**47,
    ]:
        got = fn(optim.env_steps_operand(t))
        np.testing.assert_allclose(got, _rllib_piecewise(endpoints, t), rtol=0, atol=2e-6)
    with pytest.raises(OverflowError, match="env_steps"):
        optim.env_steps_operand(2**48)


def test_constant_schedule():
    fn = optim.piecewise_linear(3e-4)
    for t in [0, 5, 10**7]:
        out = fn(jnp.int32(t))
        assert out.dtype == jnp.float32 and out.shape == ()
        np.testing.assert_allclose(out, 3e-4)
    # One point is not a schedule (RLlib's Scheduler.validate asks for two): a constant is a float.
    with pytest.raises(ValueError, match="at least 2"):
        optim.piecewise_linear([[0, 0.2]])


@pytest.mark.parametrize(
    "bad",
    [
        [[1, 0.1], [10, 0.2]],  # first timestep not 0
        [[0, 0.1], [10, 0.2], [10, 0.3]],  # not strictly increasing
        [[0, 0.1], [10]],  # not a pair
        [],
        "0.1",
        [[0, 0.1], [10, -0.2]],  # a negative value
        [["0", 0.1], [10, 0.2]],  # a timestep that is not a number
    ],
)
def test_bad_schedules_raise(bad):
    with pytest.raises(ValueError, match="schedule"):
        optim.piecewise_linear(bad)


def test_spec_normalises_and_validates():
    spec = OptimizerSpec(lr=[[0, 0.1], [10, 0.01]])
    assert spec.lr == ((0, 0.1), (10, 0.01))
    assert hash(spec) == hash(OptimizerSpec(lr=((0, 0.1), (10, 0.01))))
    assert OptimizerSpec(lr=1).lr == 1.0
    with pytest.raises(ValueError, match="opt_type"):
        OptimizerSpec(opt_type="sgd")
    with pytest.raises(ValueError, match="grad_clip_by"):
        OptimizerSpec(grad_clip_by="l1")
    with pytest.raises(ValueError, match="grad_clip"):
        OptimizerSpec(grad_clip=-1.0)


def test_schedule_read_from_env_steps_inside_jit_without_retracing():
    schedule = [[0, 0.1], [1000, 0.0]]
    spec = OptimizerSpec(opt_type="adam", lr=schedule, grad_clip=None)
    tx = make_optimizer(spec)
    params = _params()
    state = tx.init(params)
    grads = _grads(3)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params, state, grads, env_steps):
        updates, _ = tx.update(grads, state, params, env_steps=env_steps)
        return updates, current_lr(spec, env_steps)

    for t in [0, 250, 500, 2000]:
        updates, lr = step(params, state, grads, jnp.int32(t))
        expected_lr = _rllib_piecewise(schedule, t)
        np.testing.assert_allclose(lr, expected_lr, rtol=1e-6, atol=1e-9)
        _assert_trees_close(updates, _adam_first_step(grads, expected_lr))


@pytest.mark.parametrize("opt_type", ["adam", "rmsprop"])
def test_non_finite_gradient_is_skipped_and_counted(opt_type):
    spec = OptimizerSpec(opt_type=opt_type, lr=0.01, momentum=0.9)
    tx = make_optimizer(spec)
    params = _params()
    state = tx.init(params)
    good = _grads(0)
    # One finite step first, so the moments are non-trivial.
    updates, state = tx.update(good, state, params, env_steps=jnp.int32(0))
    params = optax.apply_updates(params, updates)
    assert int(non_finite_count(state)) == 0

    inner_before = state.inner_state
    for count, bad_value in enumerate([jnp.nan, jnp.inf, -jnp.inf], start=1):
        bad = _grads(1)
        bad["pi"]["w"] = bad["pi"]["w"].at[0, 1].set(bad_value)
        updates, state = tx.update(bad, state, params, env_steps=jnp.int32(10))
        new_params = optax.apply_updates(params, updates)
        chex.assert_trees_all_equal(new_params, params)
        chex.assert_trees_all_equal(state.inner_state, inner_before)
        assert int(non_finite_count(state)) == count

    # A finite gradient afterwards updates as if the bad ones never happened.
    reference = make_optimizer(spec)
    ref_params = _params()
    ref_state = reference.init(ref_params)
    ref_updates, ref_state = reference.update(good, ref_state, ref_params, env_steps=jnp.int32(0))
    ref_params = optax.apply_updates(ref_params, ref_updates)
    following = _grads(2)
    updates, state = tx.update(following, state, params, env_steps=jnp.int32(20))
    ref_updates, _ = reference.update(following, ref_state, ref_params, env_steps=jnp.int32(20))
    chex.assert_trees_all_close(updates, ref_updates, rtol=1e-6)
    assert bool(jnp.all(jnp.isfinite(jnp.asarray(jax.tree.leaves(updates)[0]))))
    assert int(non_finite_count(state)) == 3


def test_non_finite_guard_equals_optax_apply_if_finite():
    # impala_jax's guard picks by jnp.where, optax's by lax.cond: the same updates and states
    # over good, skipped and (past max_consecutive_non_finite) forced-through gradients.
    from impala_jax.core import optim

    spec = OptimizerSpec(lr=0.01, max_consecutive_non_finite=2)
    ours = jax.jit(make_optimizer(spec).update)
    theirs_tx = optax.apply_if_finite(optim._single(spec, spec.lr), 2)
    theirs = jax.jit(theirs_tx.update)
    params = _params()
    state = ref_state = theirs_tx.init(params)
    assert jax.tree.structure(make_optimizer(spec).init(params)) == jax.tree.structure(state)
    for i, bad in enumerate([None, jnp.nan, jnp.inf, jnp.nan, None, jnp.nan, None]):
        grads = _grads(i)
        if bad is not None:
            grads["pi"]["w"] = grads["pi"]["w"].at[0, 1].set(bad)
        updates, state = ours(grads, state, params, env_steps=jnp.int32(i))
        ref_updates, ref_state = theirs(grads, ref_state, params, env_steps=jnp.int32(i))
        jax.tree.map(np.testing.assert_allclose, (updates, state), (ref_updates, ref_state))
    assert int(non_finite_count(state)) == 4


def _vf_params():
    params = _params()
    params["vf_encoder"] = {"w": jnp.asarray([1.0, -2.0], jnp.float32)}
    return params


def test_separate_vf_optimizer_uses_lr_vf_for_vf_params():
    spec = OptimizerSpec(
        opt_type="adam",
        lr=[[0, 0.01], [100, 0.001]],
        lr_vf=0.5,
        grad_clip=None,
        separate_vf_optimizer=True,
    )
    tx = make_optimizer(spec)
    params = _vf_params()
    state = tx.init(params)
    rng = np.random.default_rng(5)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params, env_steps=jnp.int32(50))
    lr_default = 0.0055  # halfway between 0.01 and 0.001
    expected = {
        key: _adam_first_step(sub, 0.5 if key.startswith("vf") else lr_default)
        for key, sub in grads.items()
    }
    _assert_trees_close(updates, expected)


def test_separate_vf_optimizer_clips_each_group_on_its_own():
    spec = OptimizerSpec(
        opt_type="rmsprop", lr=0.1, lr_vf=0.2, grad_clip=0.5, separate_vf_optimizer=True
    )
    tx = make_optimizer(spec)
    params = _vf_params()
    state = tx.init(params)
    rng = np.random.default_rng(9)
    grads = jax.tree.map(lambda p: jnp.asarray(3 * rng.normal(size=p.shape), jnp.float32), params)
    updates, _ = tx.update(grads, state, params, env_steps=jnp.int32(0))
    expected = {}
    for group, lr in [(("encoder", "pi"), 0.1), (("vf", "vf_encoder"), 0.2)]:
        clipped = _np_clip({k: grads[k] for k in group}, 0.5, "global_norm")
        for key in group:
            expected[key] = jax.tree.map(
                lambda g, lr=lr: -lr * g / np.sqrt(0.99 + 0.01 * g**2 + 0.1), clipped[key]
            )
    _assert_trees_close(updates, expected)
