"""From IMPALAConfig to the learner step's loss, with clips that matter.

The config sets two different V-trace thresholds (neither 1) and ``clip_rewards=True``; the
batch has importance ratios above both thresholds and rewards of magnitude above 1. The
learner step's metrics must be a float64 NumPy loop of V-trace eq. 1 (arXiv:1802.01561,
section 4.1) and the loss terms of section 4.2 on the same network outputs.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core.losses import CLIPPED_RHO_TOLERANCE
from impala_jax.core.types import Trajectory

T, B = 5, 8
RHO_BAR, PG_RHO_BAR = 1.7, 1.3  # different from each other and from 1
GAMMA, VF_COEFF, ENTROPY_COEFF = 0.9, 0.25, 0.02


def _config():
    return (
        IMPALAConfig()
        .environment("CartPole-v1", clip_rewards=True)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=B, rollout_fragment_length=T)
        .training(
            train_batch_size_per_learner=T * B,
            gamma=GAMMA,
            vf_loss_coeff=VF_COEFF,
            entropy_coeff=ENTROPY_COEFF,
            vtrace_clip_rho_threshold=RHO_BAR,
            vtrace_clip_pg_rho_threshold=PG_RHO_BAR,
        )
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .reporting(min_time_s_per_iteration=0)
        .debugging(seed=3)
    )


def _batch(action_dtype) -> Trajectory:
    rng = np.random.default_rng(0)
    done = rng.random((T, B)) < 0.15
    valid = ~np.concatenate([np.zeros((1, B), bool), done[:-1]])
    action = rng.integers(0, 2, (T, B))
    # The behaviour policy gave the taken action anywhere from 2% to 90%: with a near-uniform
    # target policy, ratios from about 0.5 to 25, many above both thresholds.
    taken = np.log(rng.uniform(0.02, 0.9, (T, B)))
    other = np.log1p(-np.exp(taken))
    behaviour = np.where(action[..., None] == np.arange(2), taken[..., None], other[..., None])
    return Trajectory(
        obs=rng.normal(size=(T + 1, B, 4)).astype(np.float32),
        action=action.astype(action_dtype),
        behaviour_logits=behaviour.astype(np.float32),
        reward=rng.choice([-3.0, -1.5, -0.4, 0.0, 0.6, 2.5], (T, B)).astype(np.float32),
        terminated=done,
        truncated=np.zeros((T, B), bool),
        valid=valid.astype(np.float32),
        param_version=np.zeros(B, np.int32),
    )


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _reference(logits, values, batch: Trajectory) -> dict:
    """The loss terms in float64: V-trace eq. 1 as its sum over s >= t, not a recursion."""
    logits, values = logits.astype(np.float64), values.astype(np.float64)
    mask = batch.valid.astype(np.float64)
    count = max(mask.sum(), 1.0)
    log_pi_all = _log_softmax(logits)
    a = batch.action.astype(np.int64)[..., None]
    log_pi = np.take_along_axis(log_pi_all, a, -1)[..., 0]
    log_mu = np.take_along_axis(_log_softmax(batch.behaviour_logits.astype(np.float64)), a, -1)
    rho = np.where(mask > 0, np.exp(log_pi - log_mu[..., 0]), 0.0)
    reward = np.sign(batch.reward.astype(np.float64))  # clip_rewards=True: the sign
    discount = GAMMA * (1.0 - batch.terminated.astype(np.float64))
    v = values  # [T+1, B]
    vs = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total, trace = v[t, b], 1.0
            for s in range(t, T):
                td = reward[s, b] + discount[s, b] * v[s + 1, b] - v[s, b]
                delta = min(RHO_BAR, rho[s, b]) * td
                total += trace * delta
                trace *= discount[s, b] * min(1.0, rho[s, b])
            vs[t, b] = total
    vs_next = np.concatenate([vs[1:], v[-1:]])
    adv = np.minimum(PG_RHO_BAR, rho) * (reward + discount * vs_next - v[:-1])
    pi_loss = -np.sum(mask * log_pi * adv) / count
    vf_loss = 0.5 * np.sum(mask * (vs - v[:-1]) ** 2) / count
    entropy = np.sum(mask * -np.sum(np.exp(log_pi_all) * log_pi_all, -1)) / count
    return {
        "total_loss": pi_loss + VF_COEFF * vf_loss - ENTROPY_COEFF * entropy,
        "mean_pi_loss": pi_loss,
        "mean_vf_loss": vf_loss,
        "entropy": entropy,
        "mean_vs": np.sum(mask * vs) / count,
        "clipped_rho_fraction": np.sum((mask > 0) & (rho > RHO_BAR * (1 + CLIPPED_RHO_TOLERANCE)))
        / count,
        "rho": rho,
    }


@pytest.mark.timeout(120)
def test_config_clips_reach_the_loss_as_a_float64_vtrace_loop():
    with _config().build() as algo:
        learner = algo.learner
        assert int(learner.state.update_step) == 0
        params = jax.device_get(learner.state.params)
        batch = _batch(algo.action_dtype)
        metrics = jax.device_get(learner.update(learner.put_batch(batch), env_steps=0))
        assert int(learner.state.update_step) == 1
        logits, values = algo.networks.apply(params, batch.obs.reshape((T + 1) * B, 4))
    logits = np.asarray(logits).reshape(T + 1, B, -1)[:-1]
    want = _reference(logits, np.asarray(values).reshape(T + 1, B), batch)
    # Each clip matters on this batch: ratios above both thresholds and between them, and
    # rewards that the sign changes.
    valid_rho = want.pop("rho")[batch.valid > 0]
    assert np.sum(valid_rho > RHO_BAR) >= 5
    assert np.sum((PG_RHO_BAR < valid_rho) & (valid_rho < RHO_BAR)) >= 1
    assert np.sum(np.abs(batch.reward) > 1) >= 5
    for name, value in want.items():
        np.testing.assert_allclose(metrics[name], value, rtol=2e-5, atol=1e-6, err_msg=name)
