"""The IMPALA loss: its terms, its masking of reset rows, and its numerical safety."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core.distributions import Categorical, DiagGaussian
from impala_jax.core.losses import CLIPPED_RHO_TOLERANCE, clip_reward, impala_loss
from impala_jax.core.vtrace import vtrace

GAMMA = 0.9
T, B, N = 7, 3, 4
MIN = float(jnp.finfo(jnp.float32).min)
METRIC_KEYS = {
    "total_loss",
    "pi_loss",
    "vf_loss",
    "entropy",
    "mean_rho",
    "clipped_rho_fraction",
    "max_rho",
    "vf_explained_var",
    "mean_kl",
    "mean_vs",
}


def make_batch(seed, distribution=None, on_policy=False):
    """A random [T, B] batch with terminations and reset rows (mask 0)."""
    distribution = distribution or Categorical(N)
    rng = np.random.default_rng(seed)
    P = distribution.param_size
    logits_t = rng.normal(size=(T, B, P)).astype(np.float32)
    behaviour = logits_t if on_policy else logits_t + rng.normal(size=(T, B, P)).astype(np.float32)
    action = distribution.sample(jax.random.key(seed), behaviour)
    terminated = rng.uniform(size=(T, B)) < 0.15
    mask = np.ones((T, B), np.float32)
    mask[[2, 5], [0, 1]] = 0.0  # reset rows
    mask[0, 2] = 0.0
    return dict(
        logits_t=jnp.asarray(logits_t),
        values=jnp.asarray(rng.normal(size=(T + 1, B)).astype(np.float32)),
        behaviour_logits=jnp.asarray(behaviour),
        action=action,
        r_t=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32) * 2),
        discount_t=jnp.asarray((GAMMA * (1.0 - terminated)).astype(np.float32)),
        mask=jnp.asarray(mask),
    )


def loss_and_grads(batch, **kwargs):
    kwargs = dict(
        dict(distribution=Categorical(N), vf_loss_coeff=0.5, entropy_coeff=0.01), **kwargs
    )

    def loss_fn(logits_t, values):
        return impala_loss(logits_t, values, **rest, **kwargs)

    rest = {k: v for k, v in batch.items() if k not in ("logits_t", "values")}
    (loss, metrics), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
        batch["logits_t"], batch["values"]
    )
    return loss, metrics, grads


def test_metrics_and_terms_match_their_definitions():
    batch = make_batch(0)
    dist = Categorical(N)
    loss, metrics, _ = loss_and_grads(
        batch,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
        vtrace_clip_rho_threshold=1.2,
        lambda_=0.9,
    )
    assert set(metrics) == METRIC_KEYS
    for value in metrics.values():
        assert isinstance(value, jax.Array) and value.shape == ()

    mask = np.asarray(batch["mask"])
    valid = mask > 0
    n = mask.sum()
    log_pi = dist.log_prob(batch["logits_t"], batch["action"])
    log_mu = dist.log_prob(batch["behaviour_logits"], batch["action"])
    rho = np.exp(np.asarray(log_pi - log_mu)) * mask
    v = np.asarray(batch["values"])
    out = vtrace(
        v[:-1],
        v[1:],
        batch["r_t"],
        batch["discount_t"],
        rho.astype(np.float32),
        lambda_=0.9,
        clip_rho_threshold=1.2,
    )
    pi_loss = -np.sum(mask * log_pi * out.pg_advantages) / n
    vf_loss = 0.5 * np.sum(mask * (out.vs - v[:-1]) ** 2) / n
    entropy = np.sum(mask * dist.entropy(batch["logits_t"])) / n
    expected = dict(
        pi_loss=pi_loss,
        vf_loss=vf_loss,
        entropy=entropy,
        total_loss=pi_loss + 0.5 * vf_loss - 0.01 * entropy,
        mean_rho=rho[valid].mean(),
        max_rho=rho[valid].max(),
        clipped_rho_fraction=(rho[valid] > 1.2 * (1 + CLIPPED_RHO_TOLERANCE)).mean(),
        mean_kl=np.asarray(dist.kl(batch["behaviour_logits"], batch["logits_t"]))[valid].mean(),
        mean_vs=np.asarray(out.vs)[valid].mean(),
        vf_explained_var=1.0
        - np.var(np.asarray(out.vs - v[:-1])[valid]) / np.var(np.asarray(out.vs)[valid]),
    )
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(loss, metrics["total_loss"])


def test_rounding_is_not_clipping_and_a_real_excess_is():
    """Catches (issue 56): on-policy weights that are 1 up to float rounding counted as
    clipped (clipped_rho_fraction 0.35-0.47 at max_rho 1.001), while a weight clearly above
    the threshold must still count."""
    batch = make_batch(7, on_policy=True)
    rng = np.random.default_rng(7)
    features = rng.normal(size=(T, B, 64)).astype(np.float32)
    weights = rng.normal(size=(64, N)).astype(np.float32) / 8
    target = jnp.einsum("tbk,kn->tbn", features, weights)
    # The same logits as another kernel sums them (the reversed order), and as a reduced
    # precision matmul rounds them (TF32's 2^-11 per operand, about 1e-3 on the logits).
    reordered = jnp.einsum("tbk,kn->tbn", features[..., ::-1], weights[::-1])
    tf32_like = target * (1 + 1e-3 * rng.normal(size=target.shape).astype(np.float32))
    action = Categorical(N).sample(jax.random.key(7), target)
    batch.update(logits_t=target, action=action)
    assert not np.array_equal(reordered, target)
    for behaviour in (reordered, tf32_like):
        batch["behaviour_logits"] = behaviour
        _, metrics, _ = loss_and_grads(batch)
        assert metrics["max_rho"] > 1.0, metrics  # rounding is there...
        assert metrics["clipped_rho_fraction"] == 0.0, metrics  # ...and is not clipping
    # Three valid rows whose behaviour probability of the action taken is a third lower:
    # rho = 1.5 there, clipped at 1 by any count.
    rows = ([1, 3, 4], [0, 1, 2])
    assert np.all(np.asarray(batch["mask"])[rows] > 0)
    probs = np.asarray(jax.nn.softmax(target))
    behaviour = np.log(probs)
    taken = np.asarray(action)[rows]
    p = probs[rows[0], rows[1], taken]
    behaviour[rows[0], rows[1], taken] = np.log(p / 1.5)
    # The other actions share the freed probability: a valid distribution, the others' rho < 1.
    others = np.ones(N, bool)
    for (t, b), a, p_a in zip(zip(*rows, strict=True), taken, p, strict=True):
        others[:] = True
        others[a] = False
        rest = probs[t, b, others]
        behaviour[t, b, others] = np.log(rest * (1 - p_a / 1.5) / rest.sum())
    batch["behaviour_logits"] = jnp.asarray(behaviour)
    _, metrics, _ = loss_and_grads(batch)
    np.testing.assert_allclose(metrics["max_rho"], 1.5, rtol=1e-5)
    n_valid = np.asarray(batch["mask"]).sum()
    np.testing.assert_allclose(metrics["clipped_rho_fraction"], 3 / n_valid, rtol=1e-6)


def test_value_gradient_only_through_v():
    batch = make_batch(1)
    _, _, (_, grad_values) = loss_and_grads(batch, vf_loss_coeff=1.0, entropy_coeff=0.0)
    mask = np.asarray(batch["mask"])
    v = np.asarray(batch["values"])
    # d/dV of 0.5 * mean((vs - V)^2) with vs a constant target; none into the bootstrap row.
    rho = np.exp(
        np.asarray(
            Categorical(N).log_prob(batch["logits_t"], batch["action"])
            - Categorical(N).log_prob(batch["behaviour_logits"], batch["action"])
        )
    )
    vs = vtrace(v[:-1], v[1:], batch["r_t"], batch["discount_t"], (rho * mask).astype(np.float32))
    expected = -mask * (np.asarray(vs.vs) - v[:-1]) / mask.sum()
    np.testing.assert_allclose(grad_values[:-1], expected, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(grad_values[-1], 0.0)


def test_bellman_consistent_on_policy_data_has_zero_errors():
    batch = make_batch(2, on_policy=True)
    r_t, discount_t, mask = (np.asarray(batch[k]) for k in ("r_t", "discount_t", "mask"))
    values = np.zeros((T + 1, B), np.float32)
    values[T] = np.random.default_rng(0).normal(size=B)
    for t in reversed(range(T)):
        # V(x_t) = r_t + gamma_t V(x_{t+1}) on real rows; a reset row's value (that of a final
        # observation) is arbitrary, and it is what a truncated episode bootstraps from.
        values[t] = np.where(mask[t] > 0, r_t[t] + discount_t[t] * values[t + 1], 3.0 * (t - 3))
    batch["values"] = jnp.asarray(values)
    _, metrics, (grad_logits, grad_values) = loss_and_grads(
        batch, vf_loss_coeff=1.0, entropy_coeff=0.0
    )
    np.testing.assert_allclose(metrics["vf_loss"], 0.0, atol=1e-9)
    np.testing.assert_allclose(metrics["pi_loss"], 0.0, atol=1e-6)
    np.testing.assert_allclose(metrics["mean_rho"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["mean_kl"], 0.0, atol=1e-6)
    np.testing.assert_allclose(metrics["vf_explained_var"], 1.0, atol=1e-4)
    # Zero advantages: the policy gradient vanishes, and so does the value gradient.
    np.testing.assert_allclose(grad_logits, 0.0, atol=1e-6)
    np.testing.assert_allclose(grad_values, 0.0, atol=1e-6)


@pytest.mark.parametrize("distribution", [Categorical(N), DiagGaussian(2)])
def test_entropy_step_raises_entropy(distribution):
    batch = make_batch(3, distribution=distribution)
    batch["r_t"] = jnp.zeros((T, B))
    batch["values"] = jnp.zeros((T + 1, B))  # zero advantages and zero value loss

    @jax.jit
    def step(logits_t, entropy_coeff):  # entropy_coeff is traced, as from a schedule
        def loss_fn(logits):
            return impala_loss(
                logits,
                batch["values"],
                batch["behaviour_logits"],
                batch["action"],
                batch["r_t"],
                batch["discount_t"],
                batch["mask"],
                distribution=distribution,
                vf_loss_coeff=1.0,
                entropy_coeff=entropy_coeff,
            )

        (_, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logits_t)
        return logits_t - 5.0 * grad, metrics

    new_logits, before = step(batch["logits_t"], jnp.float32(1.0))
    _, after = step(new_logits, jnp.float32(1.0))
    np.testing.assert_allclose(before["total_loss"], -before["entropy"], rtol=1e-6)
    assert after["entropy"] > before["entropy"] + 1e-3


def test_no_nan_with_masked_and_peaked_logits():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(T, B, N)).astype(np.float32)
    logits[..., 3] = MIN  # action 3 is illegal everywhere
    logits[1, :, :] = [0.0, MIN, MIN, MIN]  # a single legal action
    logits[2, :, :] = [60.0, 0.0, -60.0, MIN]  # peaked
    logits[3, :, :] = [1e4, 0.0, 0.0, MIN]  # one-hot
    behaviour = logits + rng.normal(size=(T, B, N)).astype(np.float32)
    behaviour[..., 3] = MIN
    behaviour[3, :, :] = [-100.0, 0.0, 0.0, MIN]
    batch = make_batch(4)
    action = np.array(Categorical(N).sample(jax.random.key(4), jnp.asarray(behaviour)))
    # An improbable behaviour action the target is sure of: rho = exp(100.7) overflows to inf.
    action[3, :] = 0
    # Reset rows carry whatever action the actor sampled: an illegal one, or one whose log-ratio
    # overflows (row 0 of column 2 is a reset row).
    action[np.asarray(batch["mask"]) == 0] = 3
    logits[0, 2] = [1e4, 0.0, 0.0, MIN]
    behaviour[0, 2] = [-1e4, 0.0, 0.0, MIN]
    action[0, 2] = 0
    batch.update(
        logits_t=jnp.asarray(logits),
        behaviour_logits=jnp.asarray(behaviour),
        action=jnp.asarray(action),
    )
    for clip in (1.0, 2.0):
        loss, metrics, grads = loss_and_grads(
            batch, vtrace_clip_rho_threshold=clip, vtrace_clip_pg_rho_threshold=clip
        )
        assert np.isfinite(loss)
        for g in grads:
            assert np.all(np.isfinite(np.asarray(g)))
        for name, value in metrics.items():
            if name in ("mean_rho", "max_rho"):
                assert value == np.inf, name  # the unclipped ratio really is inf here
            else:
                assert np.isfinite(value), name


@pytest.mark.parametrize("distribution", [Categorical(N), DiagGaussian(2)])
def test_reset_rows_contribute_nothing(distribution):
    batch = make_batch(5, distribution=distribution)
    kwargs = dict(distribution=distribution, clip_rewards=None, lambda_=0.95)
    loss, metrics, grads = loss_and_grads(batch, **kwargs)

    reset = np.asarray(batch["mask"]) == 0
    rng = np.random.default_rng(6)
    changed = dict(batch)
    for key in ("r_t", "discount_t", "logits_t", "behaviour_logits", "action"):
        x = np.array(batch[key])
        noise = rng.normal(size=x.shape).astype(x.dtype) * 50
        x[reset] = (x + noise)[reset] if key != "action" else (N - 1 - x)[reset]
        changed[key] = jnp.asarray(x)
    changed["r_t"] = changed["r_t"].at[jnp.asarray(reset)].set(1e30)
    loss2, metrics2, grads2 = loss_and_grads(changed, **kwargs)

    np.testing.assert_allclose(loss2, loss, rtol=1e-6)
    for key in metrics:
        np.testing.assert_allclose(metrics2[key], metrics[key], rtol=1e-6, err_msg=key)
    for g, g2 in zip(grads, grads2, strict=True):
        np.testing.assert_allclose(g2, g, rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(grads[0])[reset], 0.0)

    # A valid row, changed the same way, does change the loss: the comparison above can fail.
    valid_changed = dict(batch, r_t=batch["r_t"].at[1, 2].add(5.0))
    assert not np.isclose(loss_and_grads(valid_changed, **kwargs)[0], loss)


def test_all_rows_masked_is_finite():
    batch = make_batch(7)
    batch["mask"] = jnp.zeros((T, B))
    loss, metrics, grads = loss_and_grads(batch)
    assert loss == 0.0
    assert all(np.isfinite(v) for v in metrics.values())
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)


def test_clip_reward():
    r = jnp.array([[-3.0, -0.5, 0.0, 0.2, 7.0]])
    np.testing.assert_array_equal(clip_reward(r, None), r)
    np.testing.assert_array_equal(clip_reward(r, False), r)
    np.testing.assert_array_equal(clip_reward(r, True), [[-1.0, -1.0, 0.0, 1.0, 1.0]])
    np.testing.assert_allclose(clip_reward(r, 1.0), [[-1.0, -0.5, 0.0, 0.2, 1.0]])
    np.testing.assert_allclose(clip_reward(r, 0.3), [[-0.3, -0.3, 0.0, 0.2, 0.3]])
    np.testing.assert_allclose(clip_reward(r, 2), [[-2.0, -0.5, 0.0, 0.2, 2.0]])
    for bad in (0.0, -1.0, "yes"):
        with pytest.raises(ValueError, match="clip_rewards"):
            clip_reward(r, bad)


def test_loss_clips_rewards():
    batch = make_batch(8)
    clipped, _, _ = loss_and_grads(batch, clip_rewards=True)
    signed, _, _ = loss_and_grads(dict(batch, r_t=jnp.sign(batch["r_t"])))
    unclipped, _, _ = loss_and_grads(batch)
    np.testing.assert_allclose(clipped, signed, rtol=1e-6)
    assert not np.isclose(clipped, unclipped)


def test_vtrace_false_weighs_every_row_as_on_policy():
    # The IMPALA paper's "no-correction" baseline: the targets of an off-policy batch are those
    # V-trace computes with rho = c = 1 (here a plain n-step return loop checks it), while the
    # rho metrics report the true weights.
    batch = make_batch(1)
    loss, metrics, _ = loss_and_grads(batch, vtrace=False)
    off_metrics = loss_and_grads(batch)[1]
    mask = np.asarray(batch["mask"])
    v, r, d = np.asarray(batch["values"]), np.asarray(batch["r_t"]), np.asarray(batch["discount_t"])
    vs = np.zeros((T, B))
    acc = np.zeros(B)  # vs_t - V(x_t), backwards: delta_t + gamma_t * acc_{t+1}
    for t in reversed(range(T)):
        delta = mask[t] * (r[t] + d[t] * v[t + 1] - v[t])
        acc = delta + d[t] * mask[t] * acc
        vs[t] = v[t] + acc
    vs_tp1 = np.concatenate([vs[1:], v[-1:]])
    adv = r + d * vs_tp1 - v[:-1]
    dist = Categorical(N)
    log_pi = np.asarray(dist.log_prob(batch["logits_t"], batch["action"]))
    n = mask.sum()
    np.testing.assert_allclose(metrics["pi_loss"], -np.sum(mask * log_pi * adv) / n, rtol=1e-5)
    vf_loss = 0.5 * np.sum(mask * (vs - v[:-1]) ** 2) / n
    np.testing.assert_allclose(metrics["vf_loss"], vf_loss, rtol=1e-5)
    assert metrics["mean_rho"] == off_metrics["mean_rho"] and metrics["mean_rho"] != 1.0
    assert not np.isclose(loss, off_metrics["total_loss"])


@pytest.mark.parametrize("flag", [True, False])
def test_a_traced_vtrace_flag_is_the_static_one(flag):
    batch = make_batch(2)
    static = loss_and_grads(batch, vtrace=flag)
    traced = jax.jit(lambda f: loss_and_grads(batch, vtrace=f))(jnp.float32(flag))
    np.testing.assert_allclose(traced[0], static[0], rtol=1e-6)
    for x, y in zip(jax.tree.leaves(traced[2]), jax.tree.leaves(static[2]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
