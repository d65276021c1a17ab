"""Several policies in one learner program: each policy's update is a lone Learner's."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from impala_jax.core.distributions import make_distribution
from impala_jax.core.losses import LossSpec
from impala_jax.core.networks import make_networks
from impala_jax.core.optim import OptimizerSpec
from impala_jax.core.update import StepSpec
from impala_jax.runtime.learning.learner import Learner
from impala_jax.runtime.learning.policy_stack import PolicyStackLearner
from tests.test_learner import ACT, OBS, B, random_batch

NETWORKS = make_networks({"fcnet_hiddens": [8]}, OBS, ACT)
LOSS = LossSpec(0.99, 0.5, 0.01, 1.0, 1.0, None)
REPLAY_COLUMNS = 2


def step_spec(num_devices=1, replay=False):
    columns = B // num_devices
    if replay:
        return StepSpec(columns, REPLAY_COLUMNS, 2 * columns, columns + REPLAY_COLUMNS, 1, False)
    return StepSpec(columns, 0, 0, columns, 1, False)


def policy_keys(m):
    return list(jax.random.split(jax.random.key(7), m))


def make_stack(m, num_devices=1, replay=False, hparams=None, lr=1e-2):
    return PolicyStackLearner(
        NETWORKS,
        make_distribution(ACT),
        OptimizerSpec(lr=lr),
        LOSS,
        step_spec(num_devices, replay),
        jax.devices()[:num_devices],
        policy_keys(m),
        hparams=hparams,
        example=lambda params: random_batch(0),
    )


def make_single(key, lr=1e-2, loss=LOSS):
    return Learner(
        NETWORKS,
        make_distribution(ACT),
        OptimizerSpec(lr=lr),
        loss,
        step_spec(),
        jax.devices()[:1],
        key,
    )


def stacked(batches):
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


def policy(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def host_state(learner):
    """The state's and replay slots' leaves as host arrays (the key as key data)."""
    state, replay = learner.state_arrays()
    return state + replay


def assert_close(a, b, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)


@pytest.mark.timeout(240)
def test_each_policy_updates_as_a_lone_learner_with_its_hyperparameters():
    lrs, gammas = [1e-2, 3e-3, 3e-2], [0.99, 0.9, 0.95]
    stack = make_stack(3, hparams={"lr": lrs, "gamma": gammas})
    batches = [[random_batch(10 * i + u) for i in range(3)] for u in range(2)]
    for u, round_ in enumerate(batches):
        metrics = stack.update(stack.put_batch(stacked(round_)), u * 100, np.ones(3, bool))
    metrics = jax.device_get(metrics)
    assert stack._program._cache_size() == 1  # one program, compiled once
    for i, key in enumerate(policy_keys(3)):
        loss = LossSpec(gammas[i], 0.5, 0.01, 1.0, 1.0, None)
        single = make_single(key, lr=lrs[i], loss=loss)
        for u, round_ in enumerate(batches):
            alone = single.update(single.put_batch(round_[i]), u * 100)
        alone = jax.device_get(alone)
        assert_close(policy(stack.get_params(), i), jax.device_get(single.state.params))
        assert set(metrics) == set(alone)
        np.testing.assert_allclose(metrics["curr_lr"][i], lrs[i], rtol=1e-6)
        np.testing.assert_allclose(metrics["total_loss"][i], alone["total_loss"], rtol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("m", [3, 1])  # mapped, and one policy's program (a lax.cond)
def test_a_policy_not_trained_keeps_its_whole_state(m):
    stack = make_stack(m)
    before = host_state(stack)
    batch = stacked([random_batch(i) for i in range(m)])
    train = np.arange(m) != 1 if m > 1 else np.zeros(1, bool)
    metrics = jax.device_get(stack.update(stack.put_batch(batch), 0, train))
    after = host_state(stack)
    frozen = 1 if m > 1 else 0
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x[frozen], y[frozen])  # params, optimizer, step, key
    for i in np.flatnonzero(train):
        assert any(not np.array_equal(x[i], y[i]) for x, y in zip(before, after, strict=True))
    assert np.isfinite(metrics["total_loss"][frozen])  # its loss on its batch, reported


@pytest.mark.timeout(240)
@pytest.mark.parametrize("m,replay", [(3, False), (3, True), (1, True)])
def test_a_policy_without_valid_rows_keeps_its_state_and_replay_slots(m, replay):
    stack = make_stack(m, replay=replay)
    train = np.ones(m, bool)
    stack.update(stack.put_batch(stacked([random_batch(i) for i in range(m)])), 0, train)
    before, before_slots = host_state(stack), jax.device_get(stack.replay)
    batches = [random_batch(10 + i) for i in range(m)]
    empty = 1 if m > 1 else 0
    batches[empty] = batches[empty]._replace(valid=np.zeros_like(batches[empty].valid))
    stack.update(stack.put_batch(stacked(batches)), 100, train)
    after = host_state(stack)
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x[empty], y[empty])
    others = [i for i in range(m) if i != empty]
    for i in others:
        assert any(not np.array_equal(x[i], y[i]) for x, y in zip(before, after, strict=True))
    if replay:  # the other policies' slots took their new columns, counted, new keys
        slots = jax.device_get(stack.replay)
        pairs = [(before_slots.data.obs, slots.data.obs)]
        pairs += list(zip(before_slots[1:], slots[1:], strict=True))
        for x, y in pairs:
            for i in others:
                assert not np.array_equal(x[i], y[i])


@pytest.mark.timeout(120)
def test_one_policy_is_the_plain_learner():
    key = policy_keys(1)[0]
    stack = make_stack(1)
    single = make_single(key)
    for u in range(2):
        batch = random_batch(u)
        metrics = stack.update(stack.put_batch(stacked([batch])), u * 100, np.ones(1, bool))
        alone = single.update(single.put_batch(batch), u * 100)
    metrics, alone = jax.device_get((metrics, alone))
    state, single_state = stack.state_arrays()[0], single.state_arrays()[0]
    for x, y in zip(state, single_state, strict=True):
        np.testing.assert_array_equal(x[0], y)
    for name, value in alone.items():
        np.testing.assert_array_equal(metrics[name][0], value, err_msg=name)


@pytest.mark.timeout(240)
def test_two_devices_give_the_same_updates_as_one():
    assert len(jax.devices()) >= 2, "conftest forces two CPU devices"
    batches = [random_batch(i) for i in range(3)]
    # Policy 2 has valid rows only in the columns of the second device: it still updates.
    batches[2] = batches[2]._replace(valid=batches[2].valid * (np.arange(B) >= B // 2))
    train = np.array([True, False, True])
    results = []
    for n in (1, 2):
        stack = make_stack(3, num_devices=n, hparams={"lr": [1e-2, 1e-2, 3e-3]})
        initial = host_state(stack)
        for u in range(2):
            metrics = stack.update(stack.put_batch(stacked(batches)), u * 100, train)
        results.append((stack.get_params(), jax.device_get(metrics), host_state(stack)))
    (p1, m1, s1), (p2, m2, s2) = results
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), p1, p2)
    for name in ("total_loss", "gradients_default_optimizer_global_norm"):
        np.testing.assert_allclose(m1[name], m2[name], rtol=1e-5, err_msg=name)
    for x, y in zip(initial, s2, strict=True):
        np.testing.assert_array_equal(x[1], y[1])  # not trained, on 2 devices too
    assert any(not np.array_equal(x[2], y[2]) for x, y in zip(initial, s2, strict=True))


@pytest.mark.timeout(120)
def test_set_params_replaces_one_policy_and_checks_its_shapes():
    stack = make_stack(3)
    before = host_state(stack)
    params = stack.get_params()
    new = jax.tree.map(lambda x: x[1] + 1.0, params)
    stack.set_params(1, new)
    got = stack.get_params()
    assert_close(policy(got, 1), new, atol=0)
    for i in (0, 2):
        assert_close(policy(got, i), policy(params, i), atol=0)
    n_params = len(jax.tree.leaves(params))
    for x, y in zip(before[n_params:], host_state(stack)[n_params:], strict=True):
        np.testing.assert_array_equal(x, y)  # the optimizer state, steps, keys kept
    # The stack still updates from the new params.
    stack.update(stack.put_batch(stacked([random_batch(i) for i in range(3)])), 0, np.ones(3))
    wrong = jax.tree.map(lambda x: x[1], params)
    leaf = jax.tree.leaves(wrong)[0]
    wrong = jax.tree.unflatten(
        jax.tree.structure(wrong), [np.zeros((*leaf.shape, 2)), *jax.tree.leaves(wrong)[1:]]
    )
    with pytest.raises(ValueError, match="policy 2"):
        stack.set_params(2, wrong)
    with pytest.raises(ValueError, match="policy 0"):
        stack.set_params(0, {"not": np.zeros(3)})
    with pytest.raises(IndexError):
        stack.set_params(3, new)


@pytest.mark.timeout(120)
def test_state_arrays_restore_every_policy_and_its_replay_slots():
    batch = stacked([random_batch(i) for i in range(2)])
    stack = make_stack(2, replay=True)
    stack.update(stack.put_batch(batch), 0, np.ones(2, bool))
    saved, saved_replay = stack.state_arrays()
    other = PolicyStackLearner(
        NETWORKS,
        make_distribution(ACT),
        OptimizerSpec(lr=1e-2),
        LOSS,
        step_spec(replay=True),
        jax.devices()[:1],
        list(jax.random.split(jax.random.key(99), 2)),
        example=lambda params: random_batch(0),
    )
    other.load_state_arrays(saved, saved_replay)
    for x, y in zip(saved + saved_replay, host_state(other), strict=True):
        np.testing.assert_array_equal(x, y)
    # Both continue alike: the restored key and slots are the ones the next step reads.
    stack.update(stack.put_batch(batch), 100, np.ones(2, bool))
    other.update(other.put_batch(batch), 100, np.ones(2, bool))
    for x, y in zip(host_state(stack), host_state(other), strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="do not match"):
        make_stack(3).load_state_arrays(saved, None)


@pytest.mark.timeout(300)
def test_the_stored_program_gives_the_plain_programs_updates(tmp_path, monkeypatch):
    from impala_jax.runtime.learning import program_cache

    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    program_key = program_cache.model_description({"fcnet_hiddens": [8]}, OBS, ACT)

    def run(cached):
        stack = PolicyStackLearner(
            NETWORKS,
            make_distribution(ACT),
            OptimizerSpec(lr=1e-2),
            LOSS,
            step_spec(replay=True),
            jax.devices()[:1],
            policy_keys(2),
            hparams={"lr": [1e-2, 3e-3]},
            program_key=program_key if cached else None,
            example=lambda params: random_batch(0),
        )
        for u in range(2):
            batch = stacked([random_batch(2 * u + i) for i in range(2)])
            stack.update(stack.put_batch(batch), u * 100, np.array([True, u == 0]))
        return stack, host_state(stack)

    _, plain = run(cached=False)
    first, exported = run(cached=True)
    assert first._program.source == "exported"
    jax.clear_caches()
    second, loaded = run(cached=True)
    assert second._program.source == "loaded"
    for x, y, z in zip(plain, exported, loaded, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


def test_bad_hyperparameters_and_batches_are_named():
    with pytest.raises(ValueError, match="hparams\\['lr'\\] has shape \\(2,\\)"):
        make_stack(3, hparams={"lr": [1e-2, 1e-3]})
    with pytest.raises(ValueError, match="momentum"):  # hyperparams' own check, for one policy
        make_stack(2, hparams={"grad_clip": [1.0, 2.0], "momentum": [0.1, 0.2]})
    stack = make_stack(2)
    with pytest.raises(ValueError, match="expected one batch per policy, 2"):
        stack.update(stack.put_batch(stacked([random_batch(0)] * 3)), 0, np.ones(2, bool))
    with pytest.raises(ValueError, match="train"):
        stack.update(stack.put_batch(stacked([random_batch(0)] * 2)), 0, np.ones(3, bool))


@pytest.mark.timeout(300)
def test_32_policies_of_rllibs_default_mlp_start_and_update():
    # Catches: the stacked initial state made by jax.vmap, whose batched orthogonal
    # initializers (QR) hung XLA:CPU from about 28 policies of a 256-256 MLP. In a process of
    # its own, so that a hang ends in a timeout rather than stalling the suite.
    import subprocess
    import sys

    code = (
        "import jax, numpy as np\n"
        "from benchmarks.multi_agent import make_batch, specs\n"
        "from impala_jax.runtime.learning.policy_stack import PolicyStackLearner\n"
        "keys = list(jax.random.split(jax.random.key(0), 32))\n"
        "stack = PolicyStackLearner(*specs(), jax.devices()[:1], keys)\n"
        "batch = jax.tree.map(lambda *xs: np.stack(xs), *[make_batch(i) for i in range(32)])\n"
        "metrics = stack.update(stack.put_batch(batch), 0, np.ones(32, bool))\n"
        "assert np.all(np.isfinite(jax.device_get(metrics['total_loss'])))\n"
    )
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240, cwd=repo)
