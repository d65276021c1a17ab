"""The learner step's minibatch/epoch schedule against a plain NumPy loop over the same orders.

The learner step runs ``num_epochs`` passes of minibatch updates in one compiled program. Here
a NumPy loop chooses the columns of every update itself (a fresh permutation each epoch, cut
into disjoint consecutive blocks, epoch after epoch) and applies plain SGD with the gradient
of the loss on exactly those columns; the step's params and metrics must be the loop's.
"""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core import losses, optim
from impala_jax.core.distributions import make_distribution
from impala_jax.core.networks import make_networks
from impala_jax.core.types import LearnerState
from impala_jax.core.update import StepSpec, make_learner_step
from impala_jax.runtime.learning import parallel
from tests.test_learner import random_batch

T, B = 4, 8
MB = 2  # columns per minibatch: 4 minibatches per epoch
EPOCHS = 3
LR = 0.5  # large: a wrong column choice or update order moves the params far from the loop's
OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
LOSS = losses.LossSpec(
    gamma=0.9,
    vf_loss_coeff=0.5,
    entropy_coeff=0.01,
    vtrace_clip_rho_threshold=1.0,
    vtrace_clip_pg_rho_threshold=1.0,
    clip_rewards=None,
)
# The project's RMSProp with a mean square that stays at 1 (decay 1, no epsilon) and no
# clipping or momentum: plain SGD, params -= lr * grad.
SGD = optim.OptimizerSpec(
    opt_type="rmsprop",
    lr=LR,
    grad_clip=None,
    decay=1.0,
    epsilon=0.0,
    rmsprop_initial_scale=1.0,
    momentum=0.0,
)
GRAD_NORM = "gradients_default_optimizer_global_norm"


def _run_step(shuffle: bool, max_unrolled_updates: int, batch):
    """One learner step on one device: (params before, params after, metrics, the step key)."""
    networks = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
    distribution = make_distribution(ACT)
    optimizer = optim.make_optimizer(SGD)
    step_spec = StepSpec(
        columns=B,
        replay_columns=0,
        replay_slots=0,
        minibatch_columns=MB,
        num_epochs=EPOCHS,
        shuffle=shuffle,
    )
    step = make_learner_step(
        networks, distribution, optimizer, SGD, LOSS, step_spec, max_unrolled_updates
    )
    mesh = parallel.make_mesh(jax.devices()[:1])
    run = parallel.data_parallel(
        step,
        mesh,
        in_specs=(parallel.REPLICATED, parallel.TIME_MAJOR, (), parallel.REPLICATED),
        out_specs=(parallel.REPLICATED, (), parallel.REPLICATED),
    )
    init_key, state_key = jax.random.split(jax.random.key(7))
    params = networks.init(init_key)
    state = LearnerState(params, optimizer.init(params), jnp.zeros((), jnp.int32), state_key)
    device_batch = batch._replace(param_version=None)
    env_steps = jnp.asarray(optim.env_steps_operand(0))
    new_state, _, metrics = run(state, device_batch, (), env_steps)
    return networks, distribution, jax.device_get(params), jax.device_get((new_state, metrics))


def _numpy_orders(step_key, shuffle: bool) -> list[np.ndarray]:
    """The columns of each update, in order, chosen here: every epoch a permutation of the
    batch's columns (the step's own draw from its key when shuffling), cut into consecutive
    disjoint minibatches."""
    from impala_jax.core.update import _permutations  # the step's draw, reproduced

    if shuffle:
        _, perm_key = jax.random.split(step_key)
        perms = np.asarray(_permutations(perm_key, EPOCHS, B))
    else:
        perms = np.tile(np.arange(B), (EPOCHS, 1))
    # Checked here, not assumed: each epoch's order is a permutation, a fresh one when shuffling.
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(B))
    if shuffle:
        assert len({tuple(p) for p in perms}) == EPOCHS, perms
    orders = []
    for epoch in range(EPOCHS):
        for m in range(B // MB):
            orders.append(np.array([perms[epoch][m * MB + i] for i in range(MB)]))
        used = np.concatenate(orders[-(B // MB) :])
        assert sorted(used.tolist()) == list(range(B))  # every column once per epoch
    return orders


def _loss_and_grad(networks, distribution):
    """The one-device loss of a minibatch of columns, and its gradient."""

    def loss(params, mb):
        t1, b = mb.obs.shape[:2]
        dist_inputs, values = networks.apply(params, mb.obs.reshape(t1 * b, -1))
        total, metrics = losses.impala_loss(
            dist_inputs.reshape(t1, b, -1)[:-1],
            values.reshape(t1, b),
            mb.behaviour_logits,
            mb.action,
            mb.reward,
            LOSS.gamma * (1.0 - mb.terminated.astype(jnp.float32)),
            mb.valid,
            distribution=distribution,
            **LOSS.loss_keywords(),
        )
        return total, metrics

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [True, False])
def test_minibatch_epochs_match_a_numpy_loop_over_the_same_orders(shuffle):
    # The scanned updates (test_learner.py shows the unrolled ones equal them).
    batch = random_batch(3)
    networks, distribution, params, (state, metrics) = _run_step(shuffle, 0, batch)
    step_key = jax.random.split(jax.random.key(7))[1]
    grad_fn = _loss_and_grad(networks, distribution)
    host = batch._replace(param_version=None)
    losses_, norms, rows = [], [], []
    for cols in _numpy_orders(step_key, shuffle):
        minibatch = jax.tree.map(lambda x, c=cols: np.asarray(x)[:, c], host)
        rows.append(float(np.sum(minibatch.valid)))
        (total, _), grads = grad_fn(params, minibatch)
        grads = jax.device_get(grads)
        losses_.append(float(total))
        leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
        norms.append(np.sqrt(sum(np.sum(np.square(g)) for g in leaves)))
        params = jax.tree.map(lambda p, g: p - np.float32(LR) * g, params, grads)
    assert int(state.update_step) == 1
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # A row mean (the loss) is the mean over every valid row of the step: the updates' means
    # weighted by their valid rows; a statistic of the gradient is the mean over the updates.
    weighted = np.sum(np.multiply(losses_, rows)) / np.sum(rows)
    assert len(set(rows)) > 1  # the weighting is tested: the minibatches' valid rows differ
    np.testing.assert_allclose(metrics["total_loss"], weighted, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics[GRAD_NORM], np.mean(norms), rtol=1e-4)
