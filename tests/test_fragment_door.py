"""Non-finite data stops at the runners' fragment door (issue 47): dropped, counted per env, kept
out of batches and replay; what passes the door anyway stays out of the replay ring; a killed
runner's partial fragment never reaches the learner; a dead policy is reported once."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

from impala_jax.core.update import StepSpec
from impala_jax.rllib import diagnostics
from impala_jax.runtime.acting.env_runner import RunnerThread
from impala_jax.runtime.learning.buffers import Batcher, FragmentDoor, stack
from tests.test_algorithm import small_config
from tests.test_learner import B, make_learner, random_batch

REPLAY = StepSpec(
    columns=B, replay_columns=B, replay_slots=3 * B, minibatch_columns=B, num_epochs=2, shuffle=True
)


def fragments(n: int, poisoned: int | None = None) -> list:
    """``n`` fragments of B/2 columns; fragment ``poisoned`` has a NaN reward in column 1."""
    out = []
    for i in range(n):
        f = random_batch(i, B // 2)
        if i == poisoned:
            f.reward[3, 1] = np.nan
        out.append(f)
    return out


def train_through_the_door(frags: list):
    """Fragments -> door -> batcher -> learner with mixin replay: the learner and its door."""
    learner = make_learner(1, step=REPLAY)
    door, batcher = FragmentDoor(1), Batcher(B)
    for f in frags:
        if door.admit(f, 0, offset=10):
            for parts in batcher.add(f):
                learner.update(learner.put_batch(stack(parts)), env_steps=0)
    return learner, door


def test_the_door_drops_non_finite_fragments_and_counts_their_envs():
    door = FragmentDoor(2)
    good = random_batch(0, 4)
    assert door.admit(good, 0, 0)
    bad_reward = random_batch(1, 4)
    bad_reward.reward[2, 1] = np.nan
    bad_bootstrap = random_batch(2, 4)
    bad_bootstrap.obs[-1, 3, 0] = np.inf  # the bootstrap row is checked too
    bad_logits = random_batch(3, 4)
    bad_logits.behaviour_logits[0, 0, 1] = -np.inf
    assert not door.admit(bad_reward, 1, 4)
    assert not door.admit(bad_bootstrap, 0, 0)
    assert not door.admit(bad_logits, 0, 0)
    assert door.num_dropped == 3
    assert door.by_env == {5: 1, 3: 1, 0: 1}
    assert door.hopeless(0) is None  # 2 in a row, not MAX_DROPPED_IN_A_ROW


def test_a_nan_fragment_never_enters_replay_and_the_updates_equal_those_without_it():
    with_nan, door = train_through_the_door(fragments(8, poisoned=3))
    without = train_through_the_door(fragments(8)[:3] + fragments(8)[4:])[0]
    assert door.num_dropped == 1 and door.by_env == {11: 1}
    for a, b in zip(
        jax.tree.leaves(with_nan.state_arrays()),
        jax.tree.leaves(without.state_arrays()),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)  # params, optimizer state, counters and replay ring
    ring = jax.device_get(with_nan.replay.data)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(ring) if x.dtype.kind == "f")


def test_a_nan_batch_past_the_door_costs_its_own_updates_only():
    learner = make_learner(1, step=REPLAY)
    learner.update(learner.put_batch(random_batch(0)), env_steps=0)
    bad = random_batch(1)
    bad.reward[:, ::2] = np.nan
    metrics = learner.update(learner.put_batch(bad), env_steps=0)
    skipped = int(jax.device_get(metrics["num_non_finite_updates"]))
    assert skipped == 4  # its own step's updates (2 minibatches x 2 epochs), by the guard
    ring = jax.device_get(learner.replay.data)
    assert np.isfinite(ring.reward).all()  # its columns were not kept for replay
    for seed in range(2, 8):  # later updates that sample the ring are not dropped
        metrics = learner.update(learner.put_batch(random_batch(seed)), env_steps=0)
    assert int(jax.device_get(metrics["num_non_finite_updates"])) == skipped


class _Once:
    """Wraps a VecEnv's recv: at call ``at`` env ``column``'s reward is NaN."""

    def __init__(self, env, at: int, column: int):
        self.env, self.real, self.at, self.column, self.calls = env, env.recv, at, column, 0

    def __call__(self):
        obs, reward, terminated, truncated = self.real()
        self.calls += 1
        if self.calls == self.at:
            reward = np.array(reward, np.float32)
            reward[self.column] = np.nan
        return obs, reward, terminated, truncated


@pytest.mark.timeout(120)
def test_a_nan_reward_from_an_env_costs_one_fragment_and_no_update():
    with small_config().build() as algo:
        env = algo.env_runner_group.local_runner.groups[0].env
        env.recv = _Once(env, at=3, column=1)
        for _ in range(3):
            result = algo.train()
    ft = result["fault_tolerance"]
    assert ft["num_non_finite_fragments_dropped"] == 1
    assert ft["non_finite_fragments_by_env"] == {"runner_0": {"env_1": 1}}
    assert result["learners"]["default_policy"]["num_non_finite_updates"] == 0


@pytest.mark.timeout(120)
def test_a_killed_runners_partial_fragment_never_reaches_the_learner():
    with small_config().build() as algo:
        runner = algo.env_runner_group.local_runner
        T = runner.T
        env = runner.groups[0].env
        real, sends = env.send, []

        def send(action):
            sends.append(1)
            if len(sends) == T + 3:  # inside the second fragment
                raise RuntimeError("runner killed mid-fragment")
            return real(action)

        env.send = send
        put = []
        thread = RunnerThread(runner, lambda traj, stop: put.append(traj) or True, False, 0)
        thread.run()  # in this thread: it ends with the failure
    assert isinstance(thread.error, RuntimeError)
    assert len(put) == 1 and thread.fragments == 1  # the first, whole fragment only
    assert put[0].reward.shape[0] == T
    assert np.isfinite(put[0].reward).all() and np.isfinite(put[0].obs).all()


def _learner(entropy_fraction: float) -> dict:
    return {"entropy_fraction_of_max": entropy_fraction}


def test_a_dead_policy_is_reported_once_with_cause_and_fixes():
    config = small_config().training(entropy_coeff=0.0)
    check = diagnostics.DeadPolicyCheck()
    healthy = [(0.6, 20.0), (0.4, 200.0), (0.3, 500.0), (0.2, 480.0), (0.25, 500.0)]
    assert all(check.message(_learner(e), r, config) is None for e, r in healthy)
    collapsed = [(1e-4, 60.0), (8e-5, 20.0), (5e-5, 9.4), (5e-5, 9.3), (4e-5, 9.4), (4e-5, 9.4)]
    messages = [check.message(_learner(e), r, config) for e, r in collapsed]
    assert [m is not None for m in messages] == [False] * 4 + [True, False]
    for needed in ("collapsed", "entropy_coeff=0.0", "training(entropy_coeff=", "lr="):
        assert needed in messages[4], needed
    assert all(check.message(_learner(1e-5), 9.0, config) is None for _ in range(10))  # once


def test_a_dip_that_recovers_or_a_low_entropy_solved_policy_is_not_reported():
    config = small_config()
    check = diagnostics.DeadPolicyCheck()
    solved = [(1e-3, 500.0)] * 10  # near-deterministic and solved: nothing fell
    dip = [(5e-3, 40.0)] * 3 + [(0.05, 120.0)] + [(4e-3, 60.0)] * 3 + [(3e-3, 500.0)] * 3
    assert all(check.message(_learner(e), r, config) is None for e, r in solved + dip)


@pytest.mark.timeout(180)
def test_a_forced_saturation_is_reported_and_a_healthy_run_is_not():
    config = small_config().training(entropy_coeff=0.0, lr=1e-9)
    with config.build() as algo, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            algo.train()  # a healthy policy (random, barely moving): no report
        assert not [w for w in caught if "collapsed" in str(w.message)]
        algo._dead_policy.best_return = 200.0  # as if it had learned, then saturate it
        weights = saturate(algo.get_weights()["default_policy"])
        algo.set_weights({"default_policy": weights})
        for _ in range(2 + diagnostics.DEAD_POLICY_ITERATIONS):
            algo.train()
    reports = [w for w in caught if "collapsed" in str(w.message)]
    assert len(reports) == 1


def saturate(params):
    """The params with the action logits' bias pushed apart: one action everywhere."""
    found = []

    def push(path, leaf):
        name = jax.tree_util.keystr(path)
        if "pi" in name and "bias" in name and np.shape(leaf) == (2,):
            found.append(name)
            return np.array([60.0, -60.0], leaf.dtype)
        return leaf

    params = jax.tree_util.tree_map_with_path(push, params)
    assert found
    return params


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, np.float64, "bfloat16", np.int32, np.uint8, np.bool_]
)
@pytest.mark.parametrize("shape", [(5, 4), (6, 4, 3), (2, 4, 3, 2), (4,)])
def test_numpy_and_jax_call_the_same_columns_non_finite(dtype, shape):
    import jax.numpy as jnp

    from impala_jax.core.finite import non_finite_columns

    x = np.zeros(shape, jnp.dtype(dtype))
    if jnp.issubdtype(x.dtype, jnp.floating):
        x.reshape(-1)[[1, -1]] = [np.nan, np.inf]
    by_numpy = non_finite_columns(x)
    by_jax = non_finite_columns(jnp.asarray(x), jnp)
    assert (by_numpy is None) == (by_jax is None)
    if by_numpy is not None:
        np.testing.assert_array_equal(by_numpy, np.asarray(by_jax))
        assert by_numpy.any()


def test_the_door_and_the_replay_write_refuse_the_same_columns():
    # The door's rule (NumPy, per field) and the learner step's (jnp, the replay write) are one.
    import jax.numpy as jnp

    from impala_jax.core.update import finite_columns
    from impala_jax.runtime.learning.buffers import non_finite_columns

    batch = random_batch(0, B)
    batch.reward[3, 1] = np.nan
    batch.obs[-1, 4, 2] = np.inf  # the bootstrap row counts too
    batch.behaviour_logits[0, 6, 0] = -np.inf
    door = np.logical_or.reduce(list(non_finite_columns(batch).values()))
    learner = np.asarray(finite_columns(jax.tree.map(jnp.asarray, batch)))
    np.testing.assert_array_equal(door, ~learner)
    assert list(np.flatnonzero(door)) == [1, 4, 6]
