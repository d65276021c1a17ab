"""Several policies of one architecture updated by one compiled learner program.

RLlib's multi-agent IMPALA trains one module per policy id. Where the policies share the
networks, the optimizer, the loss and the step sizes, their learner states stack: every leaf
carries a leading policy axis ``[M]``, and core/update.py's per-device ``learner_step`` is mapped
over it (``jax.vmap``) inside the one data-parallel program of runtime/learning/parallel.py,
batches split along B over the learner devices as a single ``Learner``'s are. Policy ``i``'s
update is the one a ``Learner`` makes on policy ``i``'s batch alone (tests/test_policy_stack.py).

A policy that is not trained (RLlib's ``policies_to_train``), or whose batch has no valid row on
any device (it produced no data this round), keeps its state and replay slots bit for bit: the
program chooses, per policy, between the updated state and the one it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from impala_jax.core import hyperparams as hyperparams_module
from impala_jax.core import optim
from impala_jax.core.types import LEARNER_AXIS, Batch, LearnerState
from impala_jax.runtime.learning import parallel, program_cache
from impala_jax.runtime.learning.learner import Learner

# [M, T(+1), B, ...]: the policy axis whole on every device, B split.
STACKED_TIME_MAJOR = P(None, None, LEARNER_AXIS)
# [M, N * S, ...]: each policy's replay slots split over the devices behind the policy axis.
STACKED_LEADING = P(None, LEARNER_AXIS)


def _per_policy(flags: jax.Array, x: jax.Array) -> jax.Array:
    """``flags`` (``[M]``) shaped to broadcast against ``x`` (``[M, ...]``)."""
    return flags.reshape(flags.shape[0], *([1] * (x.ndim - 1)))


def _keep_unless(update: jax.Array, new, old):
    """Per policy, ``new`` where ``update`` and ``old`` elsewhere, leaf by leaf."""
    return jax.tree.map(lambda n, o: jnp.where(_per_policy(update, n), n, o), new, old)


def stacked_step(per_device_step: Callable) -> Callable:
    """``step(state, replay, batch, env_steps, train, hparams) -> (state, replay, metrics)``
    on each device: ``per_device_step`` mapped over the policy axis of the state, the replay
    slots, the batch and ``hparams``; ``env_steps`` is shared.

    A policy updates where ``train`` holds and its batch has a valid row on some device (the
    count summed over ``LEARNER_AXIS``, so every device decides alike). Any other keeps its
    state; its metrics are still its loss on its batch. Its replay slots enter the step with a
    count of -1, under which core/update.py's ``mix_replay`` writes its own old columns back
    into the slots it would fill (and masks what it draws), and its count and key are restored
    after: the slots stay as they were without a choice between two copies of the whole ring,
    which would make the step O(slots), not O(batch).
    """
    vmapped = jax.vmap(per_device_step, in_axes=(0, 0, 0, None, 0))

    def alone(state, batch, replay, env_steps, hparams):
        """A stack of one policy: the step unmapped."""
        state, batch, replay, hparams = jax.tree.map(
            lambda x: x[0], (state, batch, replay, hparams)
        )
        out = per_device_step(state, batch, replay, env_steps, hparams)
        return jax.tree.map(lambda x: x[None], out)

    def kept_alone(state, *args):
        return (state, *alone(state, *args)[1:])

    def step(state, replay, batch, env_steps, train, hparams):
        valid = batch.valid.reshape(batch.valid.shape[0], -1)
        rows = jax.lax.psum(jnp.sum(valid, axis=1), LEARNER_AXIS)
        update = train & (rows > 0)
        given = replay
        if replay != ():
            replay = replay._replace(count=jnp.where(update[:, None], replay.count, -1))
        args = (state, batch, replay, env_steps, hparams)
        if update.shape[0] == 1:
            # A branch of a lax.cond compiles on its own: one policy's program computes what a
            # lone Learner's does, bit for bit (choosing afterwards, as below, changes how
            # XLA fuses the step, and its last bits).
            state, replay, metrics = jax.lax.cond(update[0], alone, kept_alone, *args)
        else:
            new_state, replay, metrics = vmapped(*args)
            state = _keep_unless(update, new_state, state)
        if replay != ():
            kept = _keep_unless(update, (replay.count, replay.key), (given.count, given.key))
            replay = replay._replace(count=kept[0], key=kept[1])
        return state, replay, metrics

    return step


def check_hparams(hparams: Mapping[str, Any] | None, num_policies: int, opt_spec, loss_spec):
    """``hparams`` as float32 arrays with a leading policy axis of ``num_policies``; a
    ValueError names a value of another length, or one core/hyperparams.py cannot trace."""
    values = {}
    for name, value in (hparams or {}).items():
        array = np.asarray(value, np.float32)
        if array.ndim == 0 or array.shape[0] != num_policies:
            raise ValueError(
                f"hparams[{name!r}] has shape {array.shape}; expected one value per policy, a "
                f"leading axis of {num_policies} (then the config's shape for one policy)."
            )
        values[name] = array
    hyperparams_module.check(
        {k: v[0] for k, v in values.items()}, opt_spec, loss_spec, max_policy_lag=None
    )
    return values


class PolicyStackLearner:
    """M same-shaped policies' learner states stacked on a leading policy axis, updated by one
    compiled program (see the module docstring).

    ``state`` is a ``LearnerState`` whose every leaf has a leading ``[M]`` axis, replicated over
    the mesh; ``replay`` the replay slots ``[M, N * S, ...]``, split over the N devices behind
    the policy axis; ``abstract_state`` one policy's shapes (``Learner.abstract_state``).
    """

    def __init__(
        self,
        networks,
        distribution,
        opt_spec,
        loss_spec,
        step_spec,
        devices,
        keys: Sequence[jax.Array],
        hparams: Mapping[str, Any] | None = None,
        program_key: Any = None,
        example: Callable[[Any], Batch] | None = None,
    ):
        """``keys``: one learner key per policy (``run_keys`` of a seed each, or splits of the
        run's): policy ``i`` starts where a ``Learner`` given ``keys[i]`` starts.

        ``hparams``: traced hyperparameters per policy (core/hyperparams.py's names, each value
        with a leading ``[M]`` axis), read in place of the specs' numbers.

        ``example``: given one policy's params shapes (jax.ShapeDtypeStruct leaves), a host
        batch of one policy (``[T(+1), B, ...]``): the replay slots' shapes. Needed with replay
        (``step_spec.replay_columns > 0``).

        ``program_key``: as ``Learner``'s; given, with the persistent compilation cache on, the
        stacked program's trace is kept on disk too."""
        keys = list(keys)
        if not keys:
            raise ValueError("PolicyStackLearner(keys=[]): expected one key per policy.")
        if step_spec.replay_columns and example is None:
            raise ValueError(
                "PolicyStackLearner: replay (step_spec.replay_columns > 0) needs example, a "
                "host batch of one policy, for the replay slots' shapes."
            )
        self.num_policies = len(keys)
        hparams = check_hparams(hparams, self.num_policies, opt_spec, loss_spec)
        # One policy's Learner, without a state: its per-device step, mesh and initial state
        # function, and init_group for the stacked state and slots.
        self._learner = Learner(
            networks,
            distribution,
            opt_spec,
            loss_spec,
            step_spec,
            devices,
            keys[0],
            program_key=program_key,
            initial_state=False,
        )
        learner = self._learner
        one = example(learner.abstract_state.params) if example is not None else None
        learner.init_group(keys, one)
        # As Learner's: host batches on one CPU device (put_batch), host operands over processes.
        self._host_batches = len(devices) == 1 and devices[0].platform == "cpu"
        self._host_batches &= jax.process_count() == 1
        self._multiprocess = not NamedSharding(learner.mesh, P()).is_fully_addressable
        self._hparams = parallel.put(hparams, learner.mesh, parallel.REPLICATED)
        self._program = self._make_program()

    def _make_program(self):
        """The one compiled program, donating the state and the replay slots."""
        learner = self._learner
        replay_spec = STACKED_LEADING if self.step_spec.replay_columns else ()
        replicated = parallel.REPLICATED
        program = parallel.data_parallel(
            stacked_step(learner.per_device_step),
            learner.mesh,
            in_specs=(
                replicated,
                replay_spec,
                STACKED_TIME_MAJOR,
                replicated,
                replicated,
                replicated,
            ),
            out_specs=(replicated, replay_spec, replicated),
            donate_argnums=(0, 1),
        )
        if learner.program_description is None:
            return program
        description = [*learner.program_description, self.num_policies, sorted(self._hparams)]
        return program_cache.CachedProgram(
            program,
            "policy_stack_step",
            description,
            outputs_like=(0, 1, None),  # the state, the replay slots, the metrics
            donate_argnums=(0, 1),
        )

    @property
    def num_devices(self) -> int:
        return self._learner.num_devices

    @property
    def mesh(self):
        return self._learner.mesh

    @property
    def step_spec(self):
        return self._learner.step_spec

    @property
    def abstract_state(self) -> LearnerState:
        return self._learner.abstract_state

    @property
    def state(self) -> LearnerState:
        return self._learner.state

    @property
    def replay(self):
        return self._learner.replay

    def put_batch(self, batch: Batch) -> Batch:
        """Host batch ``[M, T(+1), B, ...]`` -> device batch split along B (axis 2) over the
        mesh (on one CPU device the host arrays, as ``Learner.put_batch``)."""
        batch = batch._replace(param_version=None)
        if self._host_batches:
            return batch
        return parallel.put(batch, self.mesh, STACKED_TIME_MAJOR)

    def update(self, batch: Batch, env_steps: int, train: np.ndarray) -> dict:
        """One step of every policy, dispatched asynchronously; ``train``: bool ``[M]``, the
        policies to update. Returns the learner metrics, each ``[M]``, on device."""
        m = self.num_policies
        train = np.asarray(train, bool)
        if train.shape != (m,):
            raise ValueError(f"update(train=...) has shape {train.shape}; expected ({m},).")
        if np.shape(batch.valid)[0] != m:
            raise ValueError(
                f"update(batch): the batch's leading axis is {np.shape(batch.valid)[0]}; "
                f"expected one batch per policy, {m}."
            )
        env_steps = optim.env_steps_operand(env_steps)
        if not self._multiprocess:
            env_steps, train = jnp.asarray(env_steps), jnp.asarray(train)
        batch = batch._replace(param_version=None)
        (metrics,) = self._learner.run(self._program, batch, env_steps, train, self._hparams)
        return metrics

    def wait_for_warm_up(self) -> None:
        """As ``Learner``'s (the stacked program compiles at its first call)."""
        self._learner.wait_for_warm_up()

    def get_params(self):
        """Every policy's params as host arrays, each leaf with the leading ``[M]`` axis."""
        return jax.device_get(self.state.params)

    def set_params(self, index: int, params) -> None:
        """Replaces policy ``index``'s params (one policy's structure and shapes), keeping its
        optimizer state and every other policy's params."""
        if not 0 <= index < self.num_policies:
            raise IndexError(f"set_params({index}): the stack has {self.num_policies} policies.")
        expected = jax.tree.map(lambda x: x.shape[1:], self.state.params)
        try:
            got = jax.tree.map(np.shape, params)
            same = jax.tree.structure(params) == jax.tree.structure(self.state.params)
            same = same and got == expected
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(
                f"set_params({index}): policy {index}'s params do not match the stack's network "
                "(structure or shapes differ); pass one policy's params, as get_params()'s "
                "leaves indexed [i]."
            )

        def replace(stacked, x):
            out = np.array(stacked)
            out[index] = np.asarray(x, out.dtype)
            return out

        host = jax.tree.map(replace, self.get_params(), params)
        placed = parallel.put(host, self.mesh, parallel.REPLICATED, may_alias=False)
        self._learner.state = self.state.replace(params=placed)

    def state_arrays(self, replay: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``Learner.state_arrays``: host copies of the state's and the replay slots' leaves,
        each with the leading policy axis."""
        return self._learner.state_arrays(replay)

    def load_state_arrays(self, leaves: list, replay: list | None) -> None:
        """The inverse of ``state_arrays``. Replay slots are per device: saved on another
        device count (or another number of policies) they stay as they are."""
        self._learner.load_state_arrays(leaves, None)  # checks the shapes, places the state
        if not replay or self.replay == ():
            return
        like = jax.tree.leaves(self.replay)
        if [np.shape(x) for x in replay] != [x.shape for x in like]:
            return
        restored = jax.tree.unflatten(jax.tree.structure(self.replay), list(replay))
        self._learner.replay = parallel.put(restored, self.mesh, STACKED_LEADING, may_alias=False)
