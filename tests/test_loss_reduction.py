"""training(loss_reduction=...): the IMPALA paper's summed loss against a hand-written TF1 RMSProp
step, the step-size diagnostics, and the warning for a stalled optimizer (issue 17)."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core.distributions import make_distribution
from impala_jax.core.losses import LossSpec
from impala_jax.core.networks import make_networks
from impala_jax.core.optim import OptimizerSpec
from impala_jax.core.update import StepSpec
from impala_jax.core.vtrace import vtrace
from impala_jax.rllib.diagnostics import TrainingChecks, divergence_message, stalled_step_message
from impala_jax.runtime.learning.learner import Learner
from tests.test_learner import ACT, OBS, B, random_batch

# The IMPALA paper's Atari RMSProp (arXiv:1802.01561, table G.1): lr 6e-4, decay 0.99,
# epsilon 0.01, momentum 0, global-norm clipping at 40.
PAPER = dict(opt_type="rmsprop", lr=6e-4, decay=0.99, epsilon=0.01, momentum=0.0, grad_clip=40.0)
GAMMA, VF_COEFF, ENTROPY = 0.99, 0.5, 0.01


def _learner(reduction: str, num_devices: int = 1, **optimizer) -> Learner:
    columns = B // num_devices
    step = StepSpec(columns, 0, 0, columns, num_epochs=1, shuffle=False)
    loss = LossSpec(GAMMA, VF_COEFF, ENTROPY, 1.0, 1.0, None, loss_reduction=reduction)
    return Learner(
        make_networks({"fcnet_hiddens": [16]}, OBS, ACT),
        make_distribution(ACT),
        OptimizerSpec(**{**PAPER, **optimizer}),
        loss,
        step,
        jax.devices()[:num_devices],
        jax.random.key(0),
    )


def _summed_loss(networks, params, batch):
    """The paper's loss written out row by row: sums, not means, over the valid rows."""
    n_rows = batch.obs.shape[0] * batch.obs.shape[1]
    logits, values = networks.apply(params, batch.obs.reshape(n_rows, -1))
    logits = logits.reshape(*batch.obs.shape[:2], -1)
    values = values.reshape(batch.obs.shape[:2])
    log_p = jax.nn.log_softmax(logits[:-1])
    log_pi = jnp.take_along_axis(log_p, batch.action[..., None], -1)[..., 0]
    log_mu = jnp.take_along_axis(
        jax.nn.log_softmax(batch.behaviour_logits), batch.action[..., None], -1
    )[..., 0]
    mask = batch.valid
    rho = jnp.exp(jax.lax.stop_gradient(log_pi) - log_mu) * mask
    discount = GAMMA * (1.0 - batch.terminated.astype(jnp.float32))
    sg = jax.lax.stop_gradient
    targets = vtrace(sg(values[:-1]), sg(values[1:]), batch.reward, discount, rho)
    entropy = -jnp.sum(jnp.exp(log_p) * log_p, -1)
    pi_loss = -jnp.sum(mask * log_pi * targets.pg_advantages)
    vf_loss = 0.5 * jnp.sum(mask * jnp.square(targets.vs - values[:-1]))
    return pi_loss + VF_COEFF * vf_loss - ENTROPY * jnp.sum(mask * entropy)


def _tf1_rmsprop_step(grads, lr, decay, epsilon, clip):
    """tf.train.RMSPropOptimizer's first step after global-norm clipping, in numpy."""
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in leaves))
    scale = min(1.0, clip / norm)
    steps = []
    for g in leaves:
        g = g * scale
        ms = decay * 1.0 + (1 - decay) * g * g  # the mean square starts at 1
        steps.append(-lr * g / np.sqrt(ms + epsilon))
    return steps


def _params_delta(learner, batch):
    before = jax.device_get(learner.state.params)
    metrics = jax.device_get(learner.update(learner.put_batch(batch), env_steps=0))
    after = jax.device_get(learner.state.params)
    pairs = zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
    delta = [np.asarray(a, np.float64) - b for a, b in pairs]
    return before, delta, metrics


@pytest.mark.parametrize("clip", [40.0, 0.5])  # 0.5: the clip is active on this small net
def test_a_summed_loss_step_is_the_papers_tf1_rmsprop_step(clip):
    batch = random_batch(0)
    learner = _learner("sum", grad_clip=clip)
    networks = make_networks({"fcnet_hiddens": [16]}, OBS, ACT)
    before, delta, metrics = _params_delta(learner, batch)
    to_jax = jax.tree.map(jnp.asarray, batch._replace(param_version=None))
    grads = jax.grad(_summed_loss, argnums=1)(networks, before, to_jax)
    expected = _tf1_rmsprop_step(grads, PAPER["lr"], PAPER["decay"], PAPER["epsilon"], clip)
    assert max(float(np.max(np.abs(e))) for e in expected) > 2e-5  # the step is not ~0
    for got, want in zip(delta, expected, strict=True):
        # atol: the delta of float32 params of size ~1 is exact only to ~1e-7.
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-7)
    # The summed gradient is the mean's times the valid rows: the reported norm says so.
    norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads)))
    np.testing.assert_allclose(metrics["gradients_default_optimizer_global_norm"], norm, rtol=1e-4)
    assert (norm > clip) == (clip < 1), norm


def test_the_mean_loss_step_is_n_times_smaller_before_rmsprop_and_much_smaller_after():
    batch = random_batch(0)
    rows = float(np.sum(batch.valid))
    _, mean_delta, mean_m = _params_delta(_learner("mean"), batch)
    _, sum_delta, sum_m = _params_delta(_learner("sum"), batch)
    np.testing.assert_allclose(
        sum_m["gradients_default_optimizer_global_norm"],
        rows * mean_m["gradients_default_optimizer_global_norm"],
        rtol=1e-4,
    )
    # The losses' metrics stay means either way (the same numbers are reported).
    np.testing.assert_allclose(sum_m["mean_pi_loss"], mean_m["mean_pi_loss"], rtol=1e-5)

    def rms(delta):
        return math.sqrt(sum(float(np.sum(d * d)) for d in delta) / sum(d.size for d in delta))

    assert rms(sum_delta) > 5 * rms(mean_delta)


def test_step_size_and_entropy_diagnostics_are_what_they_say():
    batch = random_batch(1)
    before, delta, metrics = _params_delta(_learner("mean", opt_type="adam", lr=1e-3), batch)
    size = sum(d.size for d in delta)
    update_norm = math.sqrt(sum(float(np.sum(d * d)) for d in delta))
    param_norm = math.sqrt(sum(float(np.sum(np.square(p))) for p in jax.tree.leaves(before)))
    np.testing.assert_allclose(
        metrics["update_to_param_norm_ratio"], update_norm / param_norm, 1e-4
    )
    rms_over_lr = update_norm / math.sqrt(size) / 1e-3
    np.testing.assert_allclose(metrics["update_rms_to_lr_ratio"], rms_over_lr, rtol=1e-4)
    assert 0.5 < metrics["update_rms_to_lr_ratio"] <= 1.0 + 1e-4  # Adam's first step: ~lr each
    np.testing.assert_allclose(
        metrics["entropy_fraction_of_max"], metrics["entropy"] / math.log(2), rtol=1e-5
    )


@pytest.mark.timeout(120)
def test_one_and_two_devices_sum_the_same_loss():
    assert len(jax.devices()) >= 2, "conftest forces two CPU devices"
    deltas = []
    for n in (1, 2):
        _, delta, _ = _params_delta(_learner("sum", n), random_batch(2))
        deltas.append(delta)
    for a, b in zip(*deltas, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def _quiet_cartpole(env_config):
    """CartPole paying 0.01 per step: small rewards, small mean-loss gradients."""
    return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 0.01 * r)


def _cartpole(reduction: str):
    return (
        IMPALAConfig()
        .environment(_quiet_cartpole)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=32, rollout_fragment_length=20)
        .training(train_batch_size_per_learner=640, loss_reduction=reduction, **PAPER)
        .rl_module(model_config={"fcnet_hiddens": [256, 256]})
        .reporting(min_time_s_per_iteration=0, min_train_timesteps_per_iteration=12 * 640)
        .debugging(seed=0)
    )


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_papers_rmsprop_with_a_mean_loss_warns_that_the_policy_will_not_move():
    with _cartpole("mean").build() as algo, pytest.warns(RuntimeWarning) as caught:
        result = algo.train()
    (warning,) = [w for w in caught if "barely move" in str(w.message)]
    message = str(warning.message)
    assert "epsilon=0.01" in message and "loss_reduction='sum'" in message, message
    assert result["learners"]["default_policy"]["update_rms_to_lr_ratio"] < 1e-2
    with _cartpole("sum").build() as algo:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = algo.train()
            algo.train()  # checked once: no second look, no warning later either
    assert not [w for w in caught if "barely move" in str(w.message)]
    assert result["learners"]["default_policy"]["update_rms_to_lr_ratio"] > 1e-2


def test_loss_reduction_is_validated():
    with pytest.raises(ValueError, match="loss_reduction"):
        IMPALAConfig().training(loss_reduction="average").validate()


RELU_NETWORKS = make_networks({"fcnet_hiddens": [32], "fcnet_activation": "relu"}, OBS, ACT)


def _relu_learner(num_devices: int = 1) -> Learner:
    columns = B // num_devices
    return Learner(
        RELU_NETWORKS,
        make_distribution(ACT),
        OptimizerSpec(opt_type="adam", lr=1e-3),
        LossSpec(GAMMA, VF_COEFF, ENTROPY, 1.0, 1.0, None),
        StepSpec(columns, 0, 0, columns, num_epochs=1, shuffle=False),
        jax.devices()[:num_devices],
        jax.random.key(0),
    )


@pytest.mark.slow
def test_feature_diagnostics_tell_a_blind_encoder_from_a_seeing_one():
    """encoder_dead_unit_fraction and encoder_feature_std against numpy on the same rows; an
    encoder whose units are all pushed below zero (dead ReLUs) reads 1 and 0; one device and
    two devices (each with half the rows) report the same."""
    batch = random_batch(3)
    learner = _relu_learner()
    params = jax.device_get(learner.state.params)
    rows = batch.obs.reshape(-1, batch.obs.shape[-1])
    _, _, features = RELU_NETWORKS.apply(params, rows, with_features=True)
    features = np.asarray(features)
    _, _, metrics = _params_delta(learner, batch)
    np.testing.assert_allclose(
        metrics["encoder_dead_unit_fraction"], np.mean(np.all(features <= 0, 0)), atol=1e-6
    )
    np.testing.assert_allclose(metrics["encoder_feature_std"], features.std(0).mean(), rtol=1e-4)
    assert metrics["encoder_dead_unit_fraction"] < 0.5 and metrics["encoder_feature_std"] > 0.01

    two = _relu_learner(num_devices=2)
    _, _, metrics_2 = _params_delta(two, batch)
    for key in ("encoder_dead_unit_fraction", "encoder_feature_std"):
        np.testing.assert_allclose(metrics_2[key], metrics[key], rtol=1e-4, atol=1e-6)

    blind = _relu_learner()
    params = jax.device_get(blind.state.params)
    leaves, _ = jax.tree_util.tree_flatten_with_path(params["encoder"])
    last_bias = [path for path, _ in leaves if "bias" in jax.tree_util.keystr(path)][-1]

    def kill(path, x):  # every unit of the encoder's last layer pushed far below zero
        return x - 1e3 if path == last_bias else x

    encoder = jax.tree_util.tree_map_with_path(kill, params["encoder"])
    blind.state = blind.state.replace(params={**params, "encoder": encoder})
    _, _, metrics = _params_delta(blind, batch)
    assert metrics["encoder_dead_unit_fraction"] == 1.0
    assert metrics["encoder_feature_std"] == 0.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lr,blind", [(0.5, True), (1e-3, False)])
def test_an_encoder_gone_blind_is_warned_about_once(lr, blind):
    """Adam at lr 0.5 kills every ReLU of a CartPole MLP within 10 updates; lr 1e-3 does not."""
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        # The jitted act's action stream: with this seed every unit dies within 15 updates (the
        # NumPy actor's stream leaves 2 of 32 alive at seeds 0 and 1; all die at seed 2).
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=8,
            rollout_fragment_length=10,
            inference_backend="jax",
        )
        .training(train_batch_size_per_learner=80, opt_type="adam", lr=lr)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [32, 32], "fcnet_activation": "relu"})
        .reporting(min_time_s_per_iteration=0)
        .debugging(seed=0)
    )
    with warnings.catch_warnings(record=True) as caught, config.build() as algo:
        warnings.simplefilter("always")
        for _ in range(15):
            learner = algo.train()["learners"]["default_policy"]
    messages = [str(w.message) for w in caught if "encoder_dead_unit_fraction=" in str(w.message)]
    if blind:
        assert learner["encoder_dead_unit_fraction"] == 1.0, learner
        assert learner["encoder_feature_std"] == 0.0
        assert len(messages) == 1 and "smaller training(lr=...)" in messages[0], messages
    else:
        assert learner["encoder_dead_unit_fraction"] < 0.5 and messages == []


def _stall_check(
    opt_type, epsilon, grad_norm, ratio=5e-4, num_parameters=1_000_000, initial_scale=1.0
):
    config = IMPALAConfig().training(
        opt_type=opt_type, epsilon=epsilon, grad_clip=None, rmsprop_initial_scale=initial_scale
    )
    learner = {
        "update_rms_to_lr_ratio": ratio,
        "curr_lr": 7e-4,
        "gradients_default_optimizer_global_norm": grad_norm,
    }
    return stalled_step_message(learner, config, num_parameters)


def test_rmsprops_warm_up_from_a_mean_square_of_1_is_not_reported_as_a_stall():
    # The gradient's RMS per parameter is 2.2e-3 (global norm 2.2 over 1 M parameters): with
    # epsilon 1e-5 (A2C's) the steady step is about lr * 2.2e-3 / sqrt(4.8e-6 + 1e-5) = 0.57 lr,
    # so a small step at update 10 is the mean square still decaying from 1, not a stall. It
    # decays to 1.48e-5 in ln(1.48e-5) / ln(0.99) = 1,106 updates: that long a warm-up is
    # reported as one, with the fix.
    message = _stall_check("rmsprop", 1e-5, grad_norm=2.2)
    assert message and "about 1,106 updates" in message and "epsilon=" not in message, message
    assert "rmsprop_initial_scale=0.0" in message, message
    assert "rmsprop_initial_scale=1.0 (TF1's)" in message, message
    assert _stall_check("rmsprop", 1e-5, grad_norm=2.2, initial_scale=0.0) is None
    # Another start is named as the user's own, not TF1's: ln(1.48e-5 / 0.5) / ln(0.99) = 1,037.
    message = _stall_check("rmsprop", 1e-5, grad_norm=2.2, initial_scale=0.5)
    assert message and "about 1,037 updates" in message and "TF1" not in message, message
    # The paper's summed loss (epsilon 0.01, global norm 100 over 1 M parameters): 0.02 is
    # reached in 389 updates, no warning.
    assert _stall_check("rmsprop", 0.01, grad_norm=100.0) is None
    # The paper's epsilon 0.01 under a mean loss: 1e-5 / sqrt(0.01) = 1e-4 x lr for good.
    message = _stall_check("rmsprop", 0.01, grad_norm=0.01)
    assert message and "epsilon=0.01" in message, message
    # Adam has no such warm-up: a small step after 10 updates is reported as it is.
    assert _stall_check("adam", 0.1, grad_norm=2.2) is not None
    # A step that is not small is never reported.
    assert _stall_check("rmsprop", 0.01, grad_norm=0.01, ratio=0.05) is None


def test_the_stall_check_sees_the_clipped_gradient():
    # A global norm of 1000 clipped to 0.01 reaches RMSProp as 1e-5 per parameter: a stall.
    config = IMPALAConfig().training(opt_type="rmsprop", epsilon=0.01, grad_clip=0.01)
    learner = {
        "update_rms_to_lr_ratio": 5e-4,
        "curr_lr": 7e-4,
        "gradients_default_optimizer_global_norm": 1000.0,
    }
    assert stalled_step_message(learner, config, 1_000_000) is not None
    unclipped = IMPALAConfig().training(opt_type="rmsprop", epsilon=0.01, grad_clip=None)
    assert stalled_step_message(learner, unclipped, 1_000_000) is None


def _updates(grads, losses, fractions=None) -> list[dict]:
    """Learner metrics of consecutive updates (``fractions`` None: a Box action space)."""
    fractions = fractions or [None] * len(grads)
    out = []
    for grad, loss, fraction in zip(grads, losses, fractions, strict=True):
        metrics = {"gradients_default_optimizer_global_norm": grad, "total_loss": loss}
        if fraction is not None:
            metrics["entropy_fraction_of_max"] = fraction
        out.append(metrics)
    return out


# Measured (issue 56): gymnax CartPole, 16 envs x 20 steps, one Adam update per iteration,
# seed 0; the gradient's global norm, the total loss and the entropy over its maximum.
LR_1E3 = _updates([7.78, 9.89e4, 1.44e6], [26.7, 5.85e7, 1.06e10], [1.0, 0.0, 0.0])
LR_0_1 = _updates(
    [7.78, 47.5, 68.8, 43.1, 21.6, 14.2, 16.9, 17.7, 7.82, 7.49],
    [26.7, 29.9, 28.0, 28.0, 7.74, 1.93, 5.38, 6.43, 2.42, 1.61],
    [1.0, 0.849, 6.35e-8, 1.03e-21, 4.9e-30, 0.0, 0.0, 0.0, 0.0, 0.0],
)
DEFAULT_LR = _updates(
    [7.78, 6.77, 7.82, 6.52, 7.67, 7.73, 7.33, 7.05, 8.95, 7.26],
    [26.7, 20.8, 26.6, 19.5, 25.0, 24.8, 21.0, 21.0, 28.9, 20.8],
    [1.0, 1.0, 1.0, 0.999, 0.999, 0.998, 0.998, 0.996, 0.996, 0.995],
)
# lr 0.01: the entropy dipped to 0.8 % of its maximum at update 21, then recovered.
LR_0_01 = _updates(
    [7.78, 10.1, 13.9, 18.8, 7.41, 19.3, 24.3, 18.3, 5.86, 17.8],
    [26.7, 23.5, 32.0, 26.5, 8.22, 13.8, 9.44, 3.09, 2.61, 5.55],
    [1.0, 0.982, 0.958, 0.924, 0.804, 0.174, 0.195, 0.526, 0.644, 0.657],
)


def test_diverging_updates_are_told_from_healthy_ones():
    config = IMPALAConfig().training(lr=1e3)
    message = divergence_message(LR_1E3[:2], LR_1E3[1], config, 2)
    for needed in (
        "updates are too large",
        "global norm reached 9.89e+04",
        "entropy fell from 100%",
        "training(lr=1000.0)",
        "training(lr=10)",
        "num_non_finite_updates is 0",
    ):
        assert needed in message, message
    # lr 0.1: no growth, but one action everywhere by the third update, and still.
    message = divergence_message(LR_0_1, LR_0_1[-1], config.training(lr=0.1), 10)
    assert "entropy fell from 100% of its maximum to 0.00% by update 3" in message, message
    assert "global norm" not in message and "training(lr=0.001)" in message
    # The default lr 60 updates on (norm 33, loss 23, entropy 95 %); lr 0.01 at its dip.
    later = {**DEFAULT_LR[-1], "gradients_default_optimizer_global_norm": 33.3}
    assert divergence_message(DEFAULT_LR, later, IMPALAConfig(), 60) is None
    dip = _updates([73.2], [30.2], [0.00782])[0]
    assert divergence_message(LR_0_01, dip, config.training(lr=0.01), 21) is None


def test_the_divergence_check_needs_a_scale_and_a_stochastic_start():
    config = IMPALAConfig()
    # A sparse reward not yet seen: the first update's norm and loss near 0 are no scale.
    sparse = _updates([1e-3, 5.0], [1e-4, 500.0], [1.0, 0.9])
    assert divergence_message(sparse, sparse[-1], config, 2) is None
    # Loss or norm alone grown (a return that rose) is not divergence; both are.
    one = _updates([7.8, 1e4], [26.7, 100.0], [1.0, 0.9])
    assert divergence_message(one, one[-1], config, 2) is None
    box = _updates([7.8, 1e4], [26.7, 1e5])  # no entropy fraction for a Box
    assert "global norm reached 1e+04" in divergence_message(box, box[-1], config, 2)
    # A policy that was near-deterministic from the start (a restored checkpoint).
    restored = _updates([7.8] * 3, [26.7] * 3, [1e-3] * 3)
    assert divergence_message(restored, restored[-1], config, 3) is None
    # A collapse that has recovered by the time of the check.
    recovered = {**LR_0_1[-1], "entropy_fraction_of_max": 0.3}
    assert divergence_message(LR_0_1, recovered, config, 12) is None
    assert divergence_message([], LR_1E3[-1], config, 0) is None


def test_a_divergence_under_an_lr_schedule_names_the_schedule_and_is_reported_once():
    config = IMPALAConfig().training(lr=[[0, 1e3], [10_000, 1e2]])
    learner = {**LR_1E3[-1], "curr_lr": 990.0}
    checks = TrainingChecks()
    (message,) = checks.warnings(learner, config, 3, 1000, LR_1E3)
    assert "training(lr=[[0, 1000.0], [10000, 100.0]])" in message, message
    assert "100 times smaller (it is 990 now)" in message, message
    assert checks.warnings(learner, config, 4, 1000, LR_1E3) == []  # once per build
