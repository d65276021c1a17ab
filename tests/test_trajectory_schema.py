"""One helper, ``core.types.empty_trajectory``, writes the fragment layout: the runners' buffers
and the learner's example batch (and so its replay slots) come from it, and the on-device
rollout appends its bootstrap rows with ``with_bootstrap``. A field the helper leaves out, or a
producer whose fragments differ from the example the learner compiled for, fails here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core.types import BOOTSTRAP_FIELDS, Trajectory, empty_trajectory, with_bootstrap
from tests.test_algorithm import small_config

T, B, L = 6, 3, 4
RECURRENT = ("core_state", "prev_action", "prev_reward", "reset")


def _empty(recurrent: bool, alloc=np.zeros) -> Trajectory:
    state = (jax.ShapeDtypeStruct((B, 5), np.float32), jax.ShapeDtypeStruct((B, 5), np.float32))
    return empty_trajectory(
        T,
        jax.ShapeDtypeStruct((B, 4, 2), np.int64),  # held as int32 without x64
        jax.ShapeDtypeStruct((B, 2), np.float32),
        jax.ShapeDtypeStruct((B, 4), np.float32),
        **(dict(core_state=state, chunks=T // L + 1) if recurrent else {}),
        alloc=alloc,
    )


def test_every_field_is_allocated_with_its_rows():
    traj = _empty(recurrent=True)
    missing = [name for name, value in traj._asdict().items() if value is None]
    assert not missing, f"empty_trajectory leaves out {missing}"
    for name, value in traj._asdict().items():
        if name == "core_state":
            assert [x.shape for x in value] == [(T // L + 1, B, 5)] * 2
        elif name == "param_version":
            assert (value.shape, value.dtype) == ((B,), np.int32)
        else:
            rows = T + 1 if name in BOOTSTRAP_FIELDS else T
            assert value.shape[:2] == (rows, B), name
    assert traj.obs.shape == (T + 1, B, 4, 2) and traj.obs.dtype == np.int32
    assert traj.action.dtype == traj.prev_action.dtype == np.float32
    assert traj.behaviour_logits.shape == (T, B, 4)
    assert (traj.reward.dtype, traj.valid.dtype, traj.prev_reward.dtype) == (np.float32,) * 3
    assert (traj.terminated.dtype, traj.truncated.dtype, traj.reset.dtype) == (np.bool_,) * 3
    assert all(not np.any(x) for x in jax.tree.leaves(traj))  # zeros by default


def test_a_feedforward_fragment_has_no_recurrent_fields():
    traj = _empty(recurrent=False, alloc=np.empty)
    assert [name for name, value in traj._asdict().items() if value is None] == list(RECURRENT)


def test_with_bootstrap_appends_row_T():
    rows = Trajectory(*(jnp.arange(T * B).reshape(T, B) for _ in range(7)), param_version=None)
    traj = with_bootstrap(rows, obs=jnp.full((B,), -1))
    assert traj.obs.shape == (T + 1, B) and (traj.obs[T] == -1).all()
    assert traj.reward.shape == (T, B)


def _layout(batch: Trajectory) -> list:
    batch = batch._replace(param_version=None)
    leaves, structure = jax.tree.flatten(batch, is_leaf=lambda x: x is None)
    return [structure] + [None if x is None else (x.shape, np.dtype(x.dtype)) for x in leaves]


@pytest.mark.parametrize(
    "env,model_config",
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4}),
        ("Pendulum-v1", {}),
    ],
    ids=["feedforward", "lstm", "box-actions"],
)
def test_a_runner_batch_is_laid_out_as_the_learners_example(env, model_config):
    config = small_config(env).rl_module(model_config={"fcnet_hiddens": [16], **model_config})
    with config.build() as algo:
        real, _ = algo.env_runner_group.next_batch()
        columns = real.reward.shape[1]
        example = algo.policy.example_batch(algo._T, columns, algo.action_dtype)
        assert _layout(real) == _layout(example)
