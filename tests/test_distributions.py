"""Action distributions against closed forms (numpy/scipy) and sample statistics."""

from __future__ import annotations

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from impala_jax.core.distributions import Categorical, DiagGaussian, make_distribution

MIN = float(jnp.finfo(jnp.float32).min)


def np_log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# --- Categorical -----------------------------------------------------------------------------


def test_categorical_log_prob_entropy_kl_mode():
    rng = np.random.default_rng(0)
    p_logits = rng.normal(size=(3, 4, 5)).astype(np.float32) * 2
    q_logits = rng.normal(size=(3, 4, 5)).astype(np.float32)
    action = rng.integers(0, 5, size=(3, 4))
    dist = Categorical(5)
    assert dist.param_size == 5

    log_p, log_q = np_log_softmax(p_logits), np_log_softmax(q_logits)
    expected_lp = np.take_along_axis(log_p, action[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(dist.log_prob(p_logits, action), expected_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        dist.entropy(p_logits), -(np.exp(log_p) * log_p).sum(-1), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        dist.kl(p_logits, q_logits),
        (np.exp(log_p) * (log_p - log_q)).sum(-1),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(dist.kl(p_logits, p_logits), 0.0, atol=1e-6)
    mode = dist.mode(p_logits)
    assert mode.dtype == jnp.int32
    np.testing.assert_array_equal(mode, p_logits.argmax(-1))


def test_categorical_sample_frequencies():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    n = 20000
    samples = Categorical(4).sample(jax.random.key(0), np.broadcast_to(logits, (n, 4)))
    assert samples.shape == (n,) and samples.dtype == jnp.int32
    freq = np.bincount(np.asarray(samples), minlength=4) / n
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.015)


def test_categorical_masked_and_peaked_logits_are_finite():
    logits = jnp.array(
        [
            [1.0, MIN, 0.5, MIN],  # two masked actions
            [0.0, MIN, MIN, MIN],  # one legal action
            [80.0, 0.0, -80.0, 0.0],  # peaked
            [1e4, 0.0, 0.0, 0.0],  # effectively one-hot
            [1e35, MIN, 0.0, 0.0],  # MIN - 1e35 overflows to -inf inside log_softmax
        ]
    )
    other = jnp.array(
        [
            [0.0, MIN, 2.0, MIN],
            [0.0, MIN, MIN, MIN],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 1e4, 0.0, 0.0],
            [0.0, MIN, 1.0, 0.0],
        ]
    )
    dist = Categorical(4)
    masked_action = jnp.array([1, 3, 2, 1, 1])
    legal_action = jnp.array([0, 0, 0, 0, 0])

    def everything(logits):
        return (
            dist.log_prob(logits, legal_action).sum()
            + (1e-30 * dist.log_prob(logits, masked_action)).sum()
            + dist.entropy(logits).sum()
            + dist.kl(logits, other).sum()
            + dist.kl(other, logits).sum()
        )

    for value in (
        dist.log_prob(logits, masked_action),
        dist.log_prob(logits, legal_action),
        dist.entropy(logits),
        dist.kl(logits, other),
        everything(logits),
        jax.grad(everything)(logits),
    ):
        assert np.all(np.isfinite(np.asarray(value)))
    # A masked action is (numerically) impossible, and a single legal one is certain.
    assert np.all(np.asarray(dist.log_prob(logits[:2], masked_action[:2])) < -1e30)
    np.testing.assert_allclose(dist.entropy(logits)[1], 0.0, atol=1e-6)
    np.testing.assert_allclose(dist.entropy(logits)[3:], 0.0, atol=1e-6)
    samples = dist.sample(jax.random.key(1), jnp.broadcast_to(logits[0], (2000, 4)))
    assert not np.any(np.isin(np.asarray(samples), [1, 3]))


# --- DiagGaussian ----------------------------------------------------------------------------


def gaussian_params(rng, shape, action_dim):
    mean = rng.normal(size=(*shape, action_dim))
    log_std = rng.uniform(-1.0, 1.0, size=(*shape, action_dim))
    return np.concatenate([mean, log_std], axis=-1).astype(np.float32), mean, log_std


def test_gaussian_log_prob_entropy_kl_mode():
    rng = np.random.default_rng(1)
    dist = DiagGaussian(3)
    assert dist.param_size == 6
    p, mean_p, log_std_p = gaussian_params(rng, (4, 2), 3)
    q, mean_q, log_std_q = gaussian_params(rng, (4, 2), 3)
    action = rng.normal(size=(4, 2, 3)).astype(np.float32)

    expected_lp = stats.norm.logpdf(action, mean_p, np.exp(log_std_p)).sum(-1)
    np.testing.assert_allclose(dist.log_prob(p, action), expected_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        dist.entropy(p), stats.norm.entropy(mean_p, np.exp(log_std_p)).sum(-1), rtol=1e-5
    )
    var_p, var_q = np.exp(2 * log_std_p), np.exp(2 * log_std_q)
    expected_kl = (
        log_std_q - log_std_p + (var_p + (mean_p - mean_q) ** 2) / (2 * var_q) - 0.5
    ).sum(-1)
    np.testing.assert_allclose(dist.kl(p, q), expected_kl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dist.kl(p, p), 0.0, atol=1e-6)
    np.testing.assert_allclose(dist.mode(p), mean_p, rtol=1e-6)


def test_gaussian_sample_statistics():
    dist = DiagGaussian(2)
    params = np.array([1.5, -2.0, np.log(0.5), np.log(2.0)], np.float32)
    n = 20000
    samples = np.asarray(dist.sample(jax.random.key(2), np.broadcast_to(params, (n, 4))))
    assert samples.shape == (n, 2)
    np.testing.assert_allclose(samples.mean(0), [1.5, -2.0], atol=0.05)
    np.testing.assert_allclose(samples.std(0), [0.5, 2.0], rtol=0.03)


def test_gaussian_log_std_is_clipped():
    dist = DiagGaussian(1, log_std_clip_param=2.0)
    high = np.array([0.0, 30.0], np.float32)
    low = np.array([0.0, -30.0], np.float32)
    np.testing.assert_allclose(dist.entropy(high), stats.norm.entropy(0.0, np.exp(2.0)), rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(low), stats.norm.entropy(0.0, np.exp(-2.0)), rtol=1e-5)
    np.testing.assert_allclose(
        dist.log_prob(low, np.array([0.1], np.float32)),
        stats.norm.logpdf(0.1, 0.0, np.exp(-2.0)),
        rtol=1e-5,
    )
    # The default (RLlib's 20) keeps a huge log_std finite.
    huge = np.array([0.0, 1e3], np.float32)
    assert np.isfinite(DiagGaussian(1).log_prob(huge, np.array([1.0], np.float32)))
    np.testing.assert_allclose(DiagGaussian(1).entropy(huge), stats.norm.entropy(0, np.exp(20.0)))


# --- make_distribution -----------------------------------------------------------------------


def test_make_distribution():
    cat = make_distribution(gymnasium.spaces.Discrete(6))
    assert isinstance(cat, Categorical) and cat.param_size == 6
    box = gymnasium.spaces.Box(-1.0, 1.0, shape=(3,))
    gauss = make_distribution(box)
    assert isinstance(gauss, DiagGaussian) and gauss.param_size == 6
    assert gauss.log_std_clip_param == 20.0
    assert make_distribution(box, {"log_std_clip_param": 5.0}).log_std_clip_param == 5.0


@pytest.mark.parametrize(
    "space",
    [
        gymnasium.spaces.Box(-1.0, 1.0, shape=(2, 2)),
        gymnasium.spaces.MultiDiscrete([3, 3]),
        gymnasium.spaces.Discrete(3, start=1),
    ],
)
def test_make_distribution_rejects_unsupported(space):
    with pytest.raises(ValueError, match="Unsupported action space.*supported: "):
        make_distribution(space)
