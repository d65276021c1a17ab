"""The device engine: acting, env stepping and the update in one program, for envs in JAX.

``DeviceEngine`` is the ``Engine`` (runtime/engine.py) of an env written in JAX: no threads or
queues; each ``next_update`` runs one compiled program that rolls out every env for ``T`` steps
(core/rollout.py), as often as one learner batch needs, and hands the fragments to the
learner's own per-device step (replay, schedules, loss, optimizer) on the same devices, through
``Learner.run``: the learner keeps its state. The envs are split over the learner devices along
the batch axis. Over a member axis the same program trains a group of seeds side by side
(rllib/seed_group.py).

Over several processes (runtime/process/distributed.py) the learner's mesh spans every
process's devices and the program is the same one: each process steps the envs of its own
devices (the envs of one process's run, split: ``initial_envs``), the gradient mean runs over
all devices, and each iteration's ended episodes and their env's metrics are gathered from all
processes in the order one process reads them (``gathered_episodes``), so every process reports
what one process would.

``policy_lag`` = k: the envs act with the params of k updates before (the params before the
last k updates, kept in a ring on device); 0 acts with the params being updated, so every
importance weight of the first minibatch is 1 (bit for bit where the envs fill XLA's larger
matrix kernel: docs/config.md, "Envs written in JAX"). Over the first k updates after a start
or a restore the ring holds the starting params, and the lag reported is the true one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from impala_jax.core import hyperparams, optim
from impala_jax.core.rollout import (
    EnvCarry,
    Episodes,
    episode_metrics,
    make_policy_fn,
    make_rollout,
    reset_envs,
)
from impala_jax.core.types import LEARNER_AXIS, LearnerState
from impala_jax.core.update import on_one_device
from impala_jax.runtime.acting.env_runner import ParamStore
from impala_jax.runtime.engine import DeviceSpec, Report, Update
from impala_jax.runtime.envs.jax_envs import action_map, check_device_actions
from impala_jax.runtime.learning import parallel, program_cache
from impala_jax.runtime.metrics import Timers
from impala_jax.runtime.process import collectives


def _merge_rollouts(x):
    """``[n, T(+1), b, ...]`` from n rollouts -> ``[T(+1), n * b, ...]``, rollout-major columns."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def rollout_plan(spec, learner) -> tuple[int, int, int]:
    """``(envs, rollouts per update, env steps per update)`` of an on-device run: the envs
    split evenly over the learner devices, each device's batch columns a whole number of
    rollouts of its envs (else a ValueError naming the fields)."""
    T, num_envs = spec.rollout_fragment_length, spec.num_envs
    devices, columns = learner.num_devices, learner.step_spec.columns
    envs_per_device = num_envs // devices
    if num_envs % devices or columns % envs_per_device:
        raise ValueError(
            f"env {spec.env!r} on device: num_envs_per_env_runner x max(1, "
            f"num_env_runners) = {num_envs} envs over {devices} learner device(s) must "
            f"divide evenly, and each device's {columns} batch columns "
            f"(train_batch_size_per_learner / rollout_fragment_length) must be a multiple "
            f"of its envs; e.g. train_batch_size_per_learner="
            f"{T * num_envs // devices} with these envs."
        )
    rollouts = columns // envs_per_device
    return num_envs, rollouts, num_envs * T * rollouts


def device_rollout(spec, env, policy):
    """The spec's rollout of ``env`` with ``policy`` (an ``acting.policy.Policy``); a ValueError
    where its actions could leave the action space unnoticed (``check_device_actions``)."""
    check_device_actions(env.action_space, spec.normalize_actions, spec.clip_actions, env.name)
    return make_rollout(
        env,
        make_policy_fn(policy.networks, policy.distribution, spec.explore),
        action_map(env.action_space, spec.normalize_actions, spec.clip_actions),
        spec.rollout_fragment_length,
        max_seq_len=policy.networks.max_seq_len if policy.recurrent else 0,
    )


def recurrent_networks(policy):
    """The networks whose carry the envs start with (``reset_envs``): a recurrent policy's,
    else None."""
    return policy.networks if policy.recurrent else None


def initial_envs(
    env, seed: int, restores: int, num_envs: int, networks=None, mesh=None
) -> EnvCarry:
    """A run's envs: from ``seed``'s key, and after each restore from a new one; ``networks``:
    ``recurrent_networks(policy)``. ``mesh``: the envs split along their axis over its
    devices; over several processes each process makes the envs of its own devices, the same
    envs as one process makes (env i's key is ``split(key, num_envs)[i]`` wherever it runs)."""
    key = jax.random.fold_in(jax.random.key(seed), restores)
    placed = None if mesh is None else NamedSharding(mesh, parallel.LEADING)
    if placed is None or placed.is_fully_addressable:  # one process: made, then placed
        carry = jax.jit(reset_envs, static_argnums=(0, 2, 3))(env, key, num_envs, networks)
        if mesh is None:
            return carry
        return parallel.put(carry, mesh, parallel.LEADING, may_alias=False)
    reset = jax.jit(_reset_envs_from_data, static_argnums=(0, 2, 3), out_shardings=placed)
    # The key as host data: an input every process passes alike, as a program over several
    # processes' devices needs.
    return reset(env, np.asarray(jax.random.key_data(key)), num_envs, networks)


def _reset_envs_from_data(env, key_data, num_envs: int, networks) -> EnvCarry:
    return reset_envs(env, jax.random.wrap_key_data(key_data), num_envs, networks)


def acting_ring(params, lag: int, seeds: bool = False):
    """The acting params of the next ``lag`` updates, all ``params`` (``()`` at lag 0);
    ``seeds``: params with a leading seed axis, a ring per seed."""
    if not lag:
        return ()
    axis = 1 if seeds else 0
    return jax.jit(lambda p: jax.tree.map(lambda x: jnp.stack([x] * lag, axis=axis), p))(params)


def acting_params(params, ring, lag: int, hparams):
    """The params the envs act with: ``params`` at ``lag`` 0, else the ring's oldest (``lag``
    updates before); a traced ``hparams["policy_lag"]`` = k in ``[0, lag]`` picks the params of
    k updates before (rounded, clamped to the ring)."""
    if "policy_lag" in hparams and hyperparams.policy_lag_problem(lag):
        raise ValueError(f"hparams['policy_lag']: {hyperparams.policy_lag_problem(lag)}")
    if not lag:
        return params
    if "policy_lag" not in hparams:
        return jax.tree.map(lambda r: r[0], ring)
    k = jnp.clip(jnp.round(hparams["policy_lag"]), 0, lag).astype(jnp.int32)
    # ring[lag - k] is the params of k updates before; k = 0 is the params themselves (no
    # concatenation: that would copy the whole ring every update).
    index = jnp.maximum(lag - k, 0) % lag
    return jax.tree.map(
        lambda r, p: jnp.where(k == 0, p, jax.lax.dynamic_index_in_dim(r, index, keepdims=False)),
        ring,
        params,
    )


def sample_and_update_fn(rollout, step, rollouts: int, lag: int):
    """The per-device ``(state, replay, carry, ring, env_steps, hparams=None) -> (state, replay,
    carry, ring, metrics, episodes)``: ``rollouts`` rollouts with the acting params, then
    ``step``. ``hparams``: traced hyperparameters (core/hyperparams.py), ``policy_lag`` read
    here, the rest by the learner step."""

    def sample_and_update(state, replay, carry, ring, env_steps, hparams=None):
        hparams = dict(hparams or {})
        acting = acting_params(state.params, ring, lag, hparams)
        hparams.pop("policy_lag", None)

        def one(carry, _):
            carry, traj, episodes = rollout(acting, carry)
            return carry, (traj, episodes)

        carry, (trajs, episodes) = jax.lax.scan(one, carry, None, length=rollouts)
        batch = jax.tree.map(_merge_rollouts, trajs)
        if lag:  # the params before this update join the ring; the oldest leave it
            ring = jax.tree.map(lambda r, p: jnp.concatenate([r[1:], p[None]]), ring, state.params)
        state, replay, metrics = step(state, batch, replay, env_steps, hparams)
        episodes = jax.tree.map(lambda x: x.reshape(-1, x.shape[-1]), episodes)
        return state, replay, carry, ring, metrics, episodes

    return sample_and_update


def episodes_structure(env):
    """The tree structure of the ``Episodes`` that ``env``'s rollout returns (its episode
    metrics' names are part of it)."""
    names = jax.eval_shape(
        lambda k: episode_metrics(env, jax.vmap(env.reset)(k)[1]),
        jax.random.split(jax.random.key(0), 1),
    )
    return jax.tree.structure(Episodes(0, 0, 0, dict.fromkeys(names, 0)))


def device_program(
    rollout,
    learner,
    rollouts: int,
    lag: int,
    seeds: bool = False,
    description=None,
    episodes=None,
):
    """The compiled program over the learner's mesh, donating the state, the replay slots, the
    envs and the ring. ``seeds``: every input but ``env_steps`` has a leading seed axis, and the
    program maps the step over it (rllib/seed_group.py). ``description``: plain data deciding
    ``rollout`` (``rollout_description``); given, and where the learner's own step is kept on
    disk, the traced program is kept there too (program_cache), so a later process skips
    tracing the rollout and the step; ``episodes``: ``episodes_structure`` of the env (None:
    an env without episode metrics)."""
    fn = sample_and_update_fn(rollout, learner.per_device_step, rollouts, lag)
    split, rows, replay_spec = parallel.LEADING, parallel.TIME_MAJOR, parallel.LEADING
    if seeds:
        fn = jax.vmap(fn, in_axes=(0, 0, 0, 0, None))
        split, rows = P(None, LEARNER_AXIS), P(None, None, LEARNER_AXIS)
        replay_spec = split
    replay_spec = replay_spec if learner.step_spec.replay_columns else ()
    ring_spec = parallel.REPLICATED if lag else ()
    replicated = parallel.REPLICATED
    program = parallel.data_parallel(
        fn,
        learner.mesh,
        in_specs=(replicated, replay_spec, split, ring_spec, replicated),
        out_specs=(
            replicated,
            replay_spec,
            split,
            ring_spec,
            replicated,
            Episodes(rows, rows, rows, rows),
        ),
        donate_argnums=(0, 1, 2, 3),
        check_vma=False,  # the env's own step runs inside (parallel.data_parallel)
    )
    if description is None or learner.program_description is None:
        return program
    return program_cache.CachedProgram(
        program,
        "device_step",
        [*learner.program_description, description, rollouts, lag, seeds],
        # The state, the replay slots, the envs, the ring, the metrics, the episodes.
        outputs_like=(0, 1, 2, 3, None, episodes or jax.tree.structure(Episodes(0, 0, 0))),
        donate_argnums=(0, 1, 2, 3),
    )


def ended_episodes(drained: list, seed: int | None = None) -> list[tuple[float, int]]:
    """(return, length) of every episode that ended in ``drained`` (host ``Episodes``, one per
    update), in the order the updates ran, then row by row, then env by env; ``seed``: the
    episodes of that seed of a group, whose fields carry a leading seed axis."""
    out = []
    for episodes in drained:
        if seed is not None:
            episodes = jax.tree.map(lambda x: x[seed], episodes)
        rows, cols = np.nonzero(episodes.ended)
        returns = episodes.episode_return[rows, cols].tolist()
        out.extend(zip(returns, episodes.episode_len[rows, cols].tolist(), strict=True))
    return out


def gathered_episodes(drained: list) -> tuple[list[tuple[float, int]], dict[str, np.ndarray]]:
    """``ended_episodes`` and ``ended_episode_metrics`` of device ``Episodes`` (one per update)
    whose env axis is split over devices and processes: each process reads its own devices'
    envs, and every process's ended episodes are gathered and put in the order one process
    reads them (update, row, env). Returns and metrics travel as the two 32-bit words of their
    float64 values (the collectives carry integers of up to 62 bits), so they arrive exact."""
    names = sorted(drained[0].metrics) if drained else []
    found = []
    for update, episodes in enumerate(drained):
        fields = (episodes.ended, episodes.episode_len, episodes.episode_return)
        fields += tuple(episodes.metrics[name] for name in names)
        shards = list(zip(*(x.addressable_shards for x in fields), strict=True))
        host = jax.device_get([[s.data for s in shard] for shard in shards])
        for (ended, lengths, *values), shard in zip(host, shards, strict=True):
            rows, cols = np.nonzero(ended)
            first = shard[0].index[-1].start or 0  # the shard's first env
            bits = [_words(np.asarray(v)[rows, cols]) for v in values]
            where = [np.full_like(rows, update), rows, cols + first, lengths[rows, cols]]
            found.append(np.concatenate([np.stack(where, 1), *bits], 1).astype(np.int64))
    width = 4 + 2 * (1 + len(names))
    mine = np.concatenate(found) if found else np.zeros((0, width), np.int64)
    every = collectives.allgather_rows(mine, "the iteration's episodes")
    every = every[np.lexsort((every[:, 2], every[:, 1], every[:, 0]))]
    values = np.ascontiguousarray(every[:, 4:].astype(np.uint32)).view(np.float64)
    returns = values[:, 0].astype(np.float32).tolist()
    metrics = {name: values[:, 1 + i] for i, name in enumerate(names)}
    if drained:  # each metric in its own dtype, as ended_episode_metrics gives it
        metrics = {k: v.astype(drained[0].metrics[k].dtype) for k, v in metrics.items()}
    return list(zip(returns, every[:, 3].tolist(), strict=True)), metrics


def _words(values: np.ndarray) -> np.ndarray:
    """Values as the two unsigned 32-bit words of their float64s: [n, 2]."""
    return np.asarray(values, np.float64).view(np.uint32).reshape(-1, 2)


def ended_episode_metrics(drained: list, seed: int | None = None) -> dict[str, np.ndarray]:
    """The env's episode metrics (``Episodes.metrics``) of the episodes ``ended_episodes``
    lists, in its order: ``{name: [episodes]}``."""
    columns: dict[str, list] = {}
    for episodes in drained:
        if seed is not None:
            episodes = jax.tree.map(lambda x: x[seed], episodes)
        ended = np.asarray(episodes.ended, bool)
        for name, values in episodes.metrics.items():
            columns.setdefault(name, []).append(np.asarray(values)[ended])
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def rollout_description(spec, env) -> list | None:
    """What decides ``device_rollout(spec, env, ...)``'s trace beside the networks: the env
    (its id, params and gymnax's version), the fragment length and how actions are taken. None
    for a user's env (no version): its code is not covered, so its program is not kept."""
    if env.version is None:
        return None
    return [
        env.name,
        repr(env.params),
        env.version,
        spec.rollout_fragment_length,
        spec.explore,
        spec.normalize_actions,
        spec.clip_actions,
    ]


def counters(env_steps_per_update: int, first: int, n: int) -> np.ndarray:
    """float32 ``[n, 2]``: the env-step counter (``optim.env_steps_operand``) after each of
    updates ``first .. first + n - 1``, what ``pure_functions``' ``updates`` takes."""
    done = (first + 1 + np.arange(n)) * env_steps_per_update
    return np.stack([optim.env_steps_operand(int(t)) for t in done])


def pure_functions(spec, env, policy, learner, mesh: bool = True):
    """``(init, updates)``, a run on device as pure functions, needing no engine nor learner
    state (``Learner(..., initial_state=False)`` will do): ``init(key) -> TrainCarry`` starts a
    run from its key; ``updates(carry, counters, hparams) -> (TrainCarry, metrics)`` makes one
    update per row of ``counters`` (``counters(...)``: the env-step counter after each), one
    ``lax.scan`` over the mesh. ``DeviceEngine.train_function`` and populations
    (runtime/ondevice/population.py) are made of them. ``mesh=False`` (a learner of one device):
    no mesh, ``core.update.on_one_device``, for a program that shards its runs itself."""
    lag = spec.policy_lag
    num_envs, rollouts, _ = rollout_plan(spec, learner)
    learner_step = learner.per_device_step if mesh else learner.one_device_step()
    step = sample_and_update_fn(device_rollout(spec, env, policy), learner_step, rollouts, lag)
    example = None
    if learner.step_spec.replay_columns:  # a host batch like the learner's: the slots' shapes
        dtype = policy.action_dtype(learner.abstract_state.params)
        columns = learner.step_spec.columns * learner.num_devices
        example = policy.example_batch(spec.rollout_fragment_length, columns, dtype)

    def run(state, replay, carry, ring, counters, hparams):  # on each device
        def one(c, env_steps):
            state, replay, carry, ring, metrics, eps = step(*c, env_steps, hparams)
            ended = jnp.sum(eps.ended)
            returns = jnp.sum(jnp.where(eps.ended, eps.episode_return, 0.0))
            metrics = dict(
                metrics,
                episode_return_sum=jax.lax.psum(returns, LEARNER_AXIS),
                num_episodes=jax.lax.psum(ended, LEARNER_AXIS),
            )
            return (state, replay, carry, ring), metrics

        return jax.lax.scan(one, (state, replay, carry, ring), counters)

    replay_spec = parallel.LEADING if example is not None else ()
    ring_spec = parallel.REPLICATED if lag else ()
    carry_specs = (parallel.REPLICATED, replay_spec, parallel.LEADING, ring_spec)
    replicated = parallel.REPLICATED
    if not mesh:
        program = on_one_device(run)
    else:
        program = jax.shard_map(
            run,
            mesh=learner.mesh,
            in_specs=(*carry_specs, replicated, replicated),
            out_specs=(carry_specs, replicated),
            check_vma=False,  # as device_program: the env's own step runs inside
        )

    def init(key):
        learner_key, _ = jax.random.split(key)  # run_keys
        state, replay_key = learner.init_state(learner_key)
        envs_key = jax.random.fold_in(key, 0)  # initial_envs
        carry = reset_envs(env, envs_key, num_envs, recurrent_networks(policy))
        replay = () if example is None else learner.replay_slots_of(replay_key, example)
        ring = () if not lag else jax.tree.map(lambda x: jnp.stack([x] * lag), state.params)
        return TrainCarry(state, replay, carry, ring)

    def updates(carry, counters, hparams=None):
        final, metrics = program(*carry, counters, dict(hparams or {}))
        return TrainCarry(*final), metrics

    return init, updates


class DeviceEngine:
    """The rollouts of a run, or of a group of seeds side by side, and the one program that
    samples and updates; the ``Learner`` keeps the state (see the module docstring)."""

    def __init__(self, spec: DeviceSpec, env, policy, learner, actor_device, seeds, grouped=False):
        """``env``: a ``core.rollout.JaxEnv`` with gymnasium spaces; ``policy``: the run's
        ``acting.policy.Policy``; ``seeds``: the envs' seed of each member. ``grouped``: the
        learner's state and replay slots carry a leading member axis (``Learner.init_group``), and
        the program maps the step over it."""
        self._processes = jax.process_count()
        if grouped and self._processes > 1:
            raise ValueError(
                "a group of seeds or members side by side trains on the devices of one "
                "process; several processes (--num-processes) train one run."
            )
        self.spec = spec
        self.learner = learner
        self.members = len(seeds)
        self._grouped = grouped
        self.num_envs, self.rollouts_per_update, self.env_steps_per_update = rollout_plan(
            spec, learner
        )
        self.lag = spec.policy_lag
        params = learner.state.params
        # What evaluation and inference read: the one run's params (a group has neither).
        self.param_store = None if grouped else ParamStore(params, actor_device)
        self.timers = Timers()
        self._policy = policy
        self._env = env
        self._seeds = list(seeds)
        self._restores = 0
        self._sampled_base = 0
        self._sampled = 0
        self._since_fill = 0  # updates since the ring was filled: the lag grows to policy_lag
        self._episodes: list[Episodes] = []
        self._carry = self._reset_envs()
        self._ring = acting_ring(params, self.lag, seeds=grouped)
        step, T = learner.step_spec, spec.rollout_fragment_length
        self._trained_per_update = (step.columns + step.replay_columns) * learner.num_devices * T
        self._program = device_program(
            device_rollout(spec, env, policy),
            learner,
            self.rollouts_per_update,
            self.lag,
            seeds=grouped,
            description=rollout_description(spec, env),
            episodes=episodes_structure(env),
        )
        # What the iteration's result derives from the means of the episode metrics (Craftax's
        # scores), or None.
        self.summarize_episodes = getattr(env, "summarize_episodes", None)

    def _reset_envs(self) -> EnvCarry:
        networks = recurrent_networks(self._policy)
        if not self._grouped:
            seed, mesh = self._seeds[0], self.learner.mesh
            return initial_envs(self._env, seed, self._restores, self.num_envs, networks, mesh)
        carries = [
            initial_envs(self._env, s, self._restores, self.num_envs, networks) for s in self._seeds
        ]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *carries)
        return parallel.put(stacked, self.learner.mesh, P(None, LEARNER_AXIS), may_alias=False)

    def start(self) -> None:
        """Nothing to start: the rollout runs inside each update."""

    def next_update(self) -> Update:
        """One program: sample a batch with the acting params and update on it."""
        learner = self.learner
        with self.timers.time("learner_dispatch"):
            if learner.step_spec.replay_columns and learner.replay == ():
                learner.init_replay(self._example_batch())
            self._sampled += self.env_steps_per_update
            env_steps = optim.env_steps_operand(self.num_env_steps_sampled_lifetime)
            out = learner.run(self._program, self._carry, self._ring, env_steps)
            self._carry, self._ring, metrics, episodes = out
        self._episodes.append(episodes)
        lag = min(self.lag, self._since_fill)
        self._since_fill += 1
        columns = learner.step_spec.columns * learner.num_devices
        return Update(metrics, np.full(columns, lag, np.int32), self._trained_per_update)

    def train_function(self, num_updates: int):
        """The whole run as one pure function, PureJaxRL's ``train(key)``: ``train(key,
        hparams=None) -> (TrainCarry, metrics)``, ``num_updates`` of this engine's program in
        one ``lax.scan``, from the learner state, replay slots, envs and ring that ``key``
        gives. A user can ``jax.jit`` it, ``jax.vmap`` it over keys and hyperparameters and
        call it inside a program of their own.

        ``key = jax.random.key(seed)`` starts where a run with that seed starts (the learner's
        key from ``run_keys``, the envs' from ``initial_envs``), so the updates are the ones
        ``train()`` makes. ``hparams``: traced values of core/hyperparams.py's names, read in
        place of the config's. ``metrics``: each learner metric per update
        (``[num_updates]``), with ``episode_return_sum`` and ``num_episodes`` over the episodes
        that ended in it, and ``num_env_steps_sampled_lifetime`` after it."""
        init, updates = self.pure_functions()
        counters = jnp.asarray(self.counters(0, num_updates))
        lifetime = self.env_steps_per_update * jnp.arange(1, num_updates + 1)

        def train(key, hparams=None):
            final, metrics = updates(init(key), counters, hparams)
            metrics["num_env_steps_sampled_lifetime"] = lifetime
            return final, metrics

        return train

    def pure_functions(self):
        """``pure_functions(spec, env, policy, learner)`` for this engine's run."""
        if self._grouped:
            raise ValueError("train_function is one run's; a group has a member axis of its own.")
        if self._processes > 1:
            raise ValueError(
                "train_function builds a run in one process's program; over several processes "
                "(--num-processes) train with train()."
            )
        return pure_functions(self.spec, self._env, self._policy, self.learner)

    def counters(self, first: int, n: int) -> np.ndarray:
        """``counters(self.env_steps_per_update, first, n)``."""
        return counters(self.env_steps_per_update, first, n)

    def _example_batch(self):
        """A host batch like the learner's, for the replay slots' shapes."""
        spec, learner = self.spec, self.learner
        dtype = self._policy.action_dtype(learner.state.params)
        columns = learner.step_spec.columns * learner.num_devices
        return self._policy.example_batch(spec.rollout_fragment_length, columns, dtype)

    def publish(self) -> None:
        if self.param_store is not None:
            self.param_store.publish(self.learner.state.params)

    def begin_iteration(self) -> None:
        pass

    def end_iteration(self) -> None:
        pass

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self._sampled_base + self._sampled

    def set_num_env_steps_sampled_lifetime(self, value: int) -> None:
        self._sampled_base, self._sampled = value, 0

    def drain(self) -> Report:
        """Each member's episodes that ended since the last call, in the order the updates
        ran, then row by row, then env by env."""
        drained, self._episodes = self._episodes, []
        if self._processes > 1:
            episodes, values = gathered_episodes(drained)
            episodes, values = [episodes], [values]
        else:
            drained = jax.device_get(drained)
            members = range(self.members) if self._grouped else [None]
            episodes = [ended_episodes(drained, seed=i) for i in members]
            values = [ended_episode_metrics(drained, seed=i) for i in members]
        return Report(
            episodes=episodes,
            episode_values=values,
            timers=[self.timers.drain()],
            fault_tolerance=NO_FAULTS,
        )

    def restart_for_restore(self) -> None:
        """After a restore: fresh envs (a new key), running episodes dropped, and the ring
        refilled with the restored params at the next update."""
        self._restores += 1
        self._episodes = []
        self._carry = self._reset_envs()
        self._since_fill = 0
        self._ring = acting_ring(self.learner.state.params, self.lag, seeds=self._grouped)

    def stop(self) -> None:
        """Releases the envs, the ring and the episodes; idempotent."""
        self._episodes = []
        self._carry = self._ring = None


class TrainCarry(NamedTuple):
    """What ``DeviceEngine.train_function``'s ``train`` ends with: the learner state, the replay
    slots (``()`` without replay), the envs and the acting ring (``()`` at lag 0)."""

    state: LearnerState
    replay: Any
    envs: EnvCarry
    ring: Any


# The host engine's fault counts (EnvRunnerGroup.fault_tolerance_metrics): none on device.
NO_FAULTS = {
    "num_non_finite_fragments_dropped": 0,
    "non_finite_fragments_by_env": {},
    "num_healthy_workers": 0,
    "num_remote_worker_restarts": 0,
    "num_env_runner_failures": 0,
    "num_env_restarts": 0,
    "num_dropped_episodes": 0,
}
