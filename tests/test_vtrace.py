"""V-trace against eq. 1 written as a sum of products, against rlax, and the row-layout properties
of docs/semantics.md (episode boundaries and fragment splits)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from impala_jax.core.vtrace import VTraceOutput, vtrace

GAMMA = 0.9


def vtrace_eq1(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, rho_bar=1.0, pg_rho_bar=1.0):
    """Eq. 1 of arXiv:1802.01561 read literally, in float64, one (t, s) term at a time:
    vs_t = V(x_t) + sum_{s=t}^{T-1} (prod_{i=t}^{s-1} gamma_i c_i) rho_s (r_s + gamma_s V(x_{s+1})
    - V(x_s)); pg advantage = min(pg_rho_bar, rho_t) (r_t + gamma_t vs_{t+1} - V(x_t))."""
    v_tm1, v_t, r_t, discount_t, rho_tm1 = (
        np.asarray(x, np.float64) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1)
    )
    T, B = v_tm1.shape
    lam = np.broadcast_to(np.asarray(lambda_, np.float64), (T, B))
    rho = rho_tm1 if rho_bar is None else np.minimum(rho_bar, rho_tm1)
    pg_rho = rho_tm1 if pg_rho_bar is None else np.minimum(pg_rho_bar, rho_tm1)
    c = lam * np.minimum(1.0, rho_tm1)
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total = v_tm1[t, b]
            for s in range(t, T):
                weight = 1.0
                for i in range(t, s):
                    weight *= discount_t[i, b] * c[i, b]
                delta = rho[s, b] * (r_t[s, b] + discount_t[s, b] * v_t[s, b] - v_tm1[s, b])
                total += weight * delta
            vs[t, b] = total
        for t in range(T):
            vs_next = vs[t + 1, b] if t + 1 < T else v_t[T - 1, b]
            adv[t, b] = pg_rho[t, b] * (r_t[t, b] + discount_t[t, b] * vs_next - v_tm1[t, b])
    return vs, adv


def n_step_returns(r_t, discount_t, bootstrap):
    """sum_{s>=t} (prod_{i<s} gamma_i) r_s + (prod gamma) bootstrap, in float64."""
    r_t, discount_t = np.asarray(r_t, np.float64), np.asarray(discount_t, np.float64)
    T, B = r_t.shape
    out = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total, weight = 0.0, 1.0
            for s in range(t, T):
                total += weight * r_t[s, b]
                weight *= discount_t[s, b]
            out[t, b] = total + weight * bootstrap[b]
    return out


def random_inputs(rng, T, B, consistent_values=False):
    """Random [T, B] inputs with episode ends (discount 0) and reset rows (rho 0)."""
    values = rng.normal(size=(T + 1, B))
    v_tm1 = values[:-1]
    v_t = values[1:] if consistent_values else rng.normal(size=(T, B))
    r_t = rng.normal(size=(T, B))
    discount_t = GAMMA * (rng.uniform(size=(T, B)) > 0.2)
    rho_tm1 = rng.uniform(0.1, 2.5, size=(T, B)) * (rng.uniform(size=(T, B)) > 0.2)
    return [np.asarray(x, np.float32) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1)]


@pytest.mark.parametrize("T,B", [(1, 1), (6, 3), (13, 2)])
@pytest.mark.parametrize("lambda_kind", ["one", "scalar", "array"])
@pytest.mark.parametrize("clip", [(1.0, 1.0), (None, None), (0.7, 2.0)])
def test_matches_eq1_loop(T, B, lambda_kind, clip):
    rng = np.random.default_rng(T * 100 + B)
    inputs = random_inputs(rng, T, B)
    lambda_ = {
        "one": 1.0,
        "scalar": 0.8,
        "array": rng.uniform(0.3, 1.0, size=(T, B)).astype(np.float32),
    }[lambda_kind]
    out = vtrace(
        *inputs, lambda_=lambda_, clip_rho_threshold=clip[0], clip_pg_rho_threshold=clip[1]
    )
    assert isinstance(out, VTraceOutput)
    chex.assert_shape([out.vs, out.pg_advantages], (T, B))
    vs, adv = vtrace_eq1(*inputs, lambda_=lambda_, rho_bar=clip[0], pg_rho_bar=clip[1])
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, adv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lambda_kind", ["one", "scalar", "array"])
@pytest.mark.parametrize("clip", [(1.0, 1.0), (0.5, 3.0)])
def test_matches_rlax(lambda_kind, clip):
    T, B = 9, 4
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, T, B)
    lambda_ = {
        "one": 1.0,
        "scalar": 0.6,
        "array": rng.uniform(0.3, 1.0, size=(T, B)).astype(np.float32),
    }[lambda_kind]
    out = vtrace(
        *inputs, lambda_=lambda_, clip_rho_threshold=clip[0], clip_pg_rho_threshold=clip[1]
    )
    # rlax takes single [T] trajectories: map it over B (axis 1).
    rlax_fn = jax.vmap(
        lambda v_tm1, v_t, r_t, discount_t, rho_tm1, lam: rlax.vtrace_td_error_and_advantage(
            v_tm1,
            v_t,
            r_t,
            discount_t,
            rho_tm1,
            lambda_=lam,
            clip_rho_threshold=clip[0],
            clip_pg_rho_threshold=clip[1],
        ),
        in_axes=(1, 1, 1, 1, 1, 1 if lambda_kind == "array" else None),
        out_axes=1,
    )
    expected = rlax_fn(*inputs, jnp.asarray(lambda_, jnp.float32))
    np.testing.assert_allclose(out.vs, expected.errors + inputs[0], rtol=1e-5, atol=1e-5)
    if lambda_kind == "one":
        # For lambda < 1 rlax bootstraps the advantage from lambda * vs_{t+1} + (1 - lambda)
        # V(x_{t+1}); the paper (section 4.2), scalable_agent and RLlib use vs_{t+1}, as we do.
        np.testing.assert_allclose(out.pg_advantages, expected.pg_advantage, rtol=1e-5, atol=1e-5)


def test_on_policy_lambda_one_is_n_step_return():
    T, B = 8, 3
    rng = np.random.default_rng(3)
    v_tm1, v_t, r_t, discount_t, _ = random_inputs(rng, T, B, consistent_values=True)
    out = vtrace(v_tm1, v_t, r_t, discount_t, np.ones((T, B), np.float32))
    expected = n_step_returns(r_t, discount_t, v_t[-1])
    np.testing.assert_allclose(out.vs, expected, rtol=1e-5, atol=1e-5)


def build_stream(rng, T, episodes):
    """One env's fragment under next-step autoreset, and each episode on its own.

    ``episodes``: (length, end) with end in {"terminated", "truncated", None}. An episode that
    ends before the fragment does is followed by its reset row: ``obs`` is the final observation,
    the action is ignored, reward 0, not terminated, and ``valid`` 0.
    Returns the [T] row layout (values has T+1 entries) and per-episode references.
    """
    values, r_t, terminated, valid, rho = [], [], [], [], []
    refs = []
    bootstrap = None
    for length, end in episodes:
        v = rng.normal(size=length + 1)  # V(x_0), ..., V(x_L); x_L final or bootstrap obs
        rew = rng.normal(size=length)
        rh = rng.uniform(0.2, 2.5, size=length)
        refs.append((len(r_t), length, end, v, rew, rh))
        for k in range(length):
            values.append(v[k])
            r_t.append(rew[k])
            terminated.append(end == "terminated" and k == length - 1)
            valid.append(1.0)
            rho.append(rh[k])
        if len(r_t) == T:
            bootstrap = v[length]
            break
        assert end is not None, "an unfinished episode must fill the fragment"
        values.append(v[length])  # reset row: obs[t] is the final observation
        r_t.append(0.0)
        terminated.append(False)
        valid.append(0.0)
        rho.append(rng.uniform(0.2, 2.5))  # what the policy ratio would be; must be ignored
    assert len(r_t) == T and bootstrap is not None
    values.append(bootstrap)
    values = np.asarray(values)
    discount = GAMMA * (1.0 - np.asarray(terminated, np.float64))
    return values, np.asarray(r_t), discount, np.asarray(valid), np.asarray(rho), refs


STREAMS = [
    [(3, "terminated"), (2, "truncated"), (3, None)],
    [(0, "truncated"), (4, "truncated"), (4, "terminated")],  # starts on a reset row
    [(10, "truncated")],  # truncated exactly at the fragment end: bootstraps from final obs
    [(9, "terminated"), (0, None)],  # reset row is the last row
    [(1, "terminated"), (1, "truncated"), (5, "truncated"), (0, None)],
]


def stack_streams(rng, T):
    cols = [build_stream(rng, T, episodes) for episodes in STREAMS]
    stacked = [np.stack([c[i] for c in cols], axis=1).astype(np.float32) for i in range(5)]
    return stacked, [c[5] for c in cols]


@pytest.mark.parametrize(
    "lambda_,clip", [(1.0, (1.0, 1.0)), (0.7, (0.8, 1.5)), (0.9, (None, None))]
)
def test_reset_rows_reproduce_per_episode_vtrace(lambda_, clip):
    T = 10
    rng = np.random.default_rng(11)
    (values, r_t, discount_t, valid, rho), refs = stack_streams(rng, T)
    kwargs = dict(lambda_=lambda_, clip_rho_threshold=clip[0], clip_pg_rho_threshold=clip[1])
    out = vtrace(values[:-1], values[1:], r_t, discount_t, rho * valid, **kwargs)
    naive = vtrace(values[:-1], values[1:], r_t, discount_t, rho, **kwargs)

    naive_differs = False
    for b, col_refs in enumerate(refs):
        for start, length, end, v, rew, rh in col_refs:
            if length == 0:
                continue
            # Per-episode V-trace: termination has a zero bootstrap, truncation (and an episode
            # cut by the fragment end) bootstraps from V of the last observation.
            disc = np.full(length, GAMMA)
            if end == "terminated":
                disc[-1] = 0.0
            vs, adv = vtrace_eq1(
                v[:-1, None],
                v[1:, None],
                rew[:, None],
                disc[:, None],
                rh[:, None],
                lambda_=lambda_,
                rho_bar=clip[0],
                pg_rho_bar=clip[1],
            )
            rows = slice(start, start + length)
            np.testing.assert_allclose(out.vs[rows, b], vs[:, 0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(out.pg_advantages[rows, b], adv[:, 0], rtol=1e-5, atol=1e-5)
            naive_differs |= not np.allclose(naive.vs[rows, b], vs[:, 0], atol=1e-3)
    # The same layout without rho = 0 on reset rows leaks the next episode into truncated ones.
    assert naive_differs
    # A reset row is no transition: its target is its own value and its advantage is 0.
    np.testing.assert_allclose(np.where(valid == 0, out.vs - values[:-1], 0.0), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.where(valid == 0, out.pg_advantages, 0.0), 0.0, atol=1e-6)


@pytest.mark.parametrize("split", [1, 4, 9])
def test_fragment_split(split):
    T, B = 10, 3
    rng = np.random.default_rng(split)
    v_tm1, v_t, r_t, discount_t, rho = random_inputs(rng, T, B, consistent_values=True)
    values = np.concatenate([v_tm1, v_t[-1:]], axis=0)
    ones = np.ones((T, B), np.float32)
    full = vtrace(v_tm1, v_t, r_t, discount_t, ones)
    first = vtrace(v_tm1[:split], v_t[:split], r_t[:split], discount_t[:split], ones[:split])
    second = vtrace(v_tm1[split:], v_t[split:], r_t[split:], discount_t[split:], ones[split:])
    # On-policy, lambda = 1: each piece is the n-step return to its own bootstrap observation.
    np.testing.assert_allclose(
        first.vs, n_step_returns(r_t[:split], discount_t[:split], values[split]), atol=1e-5
    )
    np.testing.assert_allclose(
        second.vs, n_step_returns(r_t[split:], discount_t[split:], values[T]), atol=1e-5
    )
    np.testing.assert_allclose(full.vs[split:], second.vs, atol=1e-6)
    # Off-policy too, the later piece never sees the earlier one: the recursion runs backwards.
    full_off = vtrace(v_tm1, v_t, r_t, discount_t, rho, lambda_=0.8)
    second_off = vtrace(
        v_tm1[split:], v_t[split:], r_t[split:], discount_t[split:], rho[split:], lambda_=0.8
    )
    np.testing.assert_allclose(full_off.vs[split:], second_off.vs, atol=1e-6)
    np.testing.assert_allclose(full_off.pg_advantages[split:], second_off.pg_advantages, atol=1e-6)


def test_no_gradient_through_targets():
    T, B = 5, 2
    inputs = [jnp.asarray(x) for x in random_inputs(np.random.default_rng(5), T, B)]

    def total(*args):
        out = vtrace(*args, lambda_=0.9)
        return jnp.sum(out.vs) + jnp.sum(out.pg_advantages)

    grads = jax.grad(total, argnums=(0, 1, 2, 3, 4))(*inputs)
    for g in grads:
        np.testing.assert_array_equal(g, np.zeros((T, B)))


def test_rejects_bad_shapes():
    x = jnp.zeros((4, 2))
    with pytest.raises(AssertionError):
        vtrace(x, x, x, x, jnp.zeros((4, 3)))
    with pytest.raises(AssertionError):
        vtrace(x[:, 0], x[:, 0], x[:, 0], x[:, 0], x[:, 0])
    with pytest.raises(AssertionError):
        vtrace(x, x, x, x, x, lambda_=jnp.ones(4))
