"""A population of runs trained side by side in one program, with exploit/explore inside it.

The members are one device engine's run (``DeviceEngine.pure_functions``) over a member axis:
each has its key, its learner state, replay slots, envs and acting ring, and its traced
hyperparameters (core/hyperparams.py). One call of ``interval`` makes every member's updates of
one perturbation interval, scores each member by the mean return of the episodes that ended in
it, and then, unless exploit is off or the burn-in has not passed, runs population-based
training's exploit and explore (core/pbt.py, Ray Tune's ``PopulationBasedTraining`` rules,
all members at once as Tune's ``synch=True``): a member of the bottom quantile takes a top
member's params, optimizer state, acting ring and hyperparameters, then perturbs or resamples
the hyperparameters. It keeps its own envs, replay slots and random key, so it does not replay
the copied member's future.

``train`` is the whole run as one pure function (a ``lax.scan`` over intervals).

Where a process has several devices and each member's learner takes one (``num_learners`` 0
or 1), the members are spread over them (``member_mesh``): each device runs its share of the
members' updates (a ``shard_map`` over the member axis, each member's learner without a mesh of
its own, ``core.update.on_one_device``), with no collective inside the interval; exploit and
explore then take members across devices. On a CPU, forced host devices (``--devices 2``) put
one share on each core.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from impala_jax.core.pbt import exploit, explore


@dataclasses.dataclass(frozen=True)
class PopulationPlan:
    """What the program needs of a PBT schedule, in updates rather than env steps."""

    updates_per_interval: int
    mutations: tuple  # ((name, core.pbt.Domain or tuple of values), ...)
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    perturbation_factors: tuple = (1.2, 0.8)
    burn_in_intervals: int = 0  # no exploit at the end of the first this many intervals
    exploit: bool = True  # False: a grid or random search, every member left alone
    sign: float = 1.0  # 1.0: a higher score is better (mode "max"), -1.0: lower


class Lineage(NamedTuple):
    """One interval's exploit/explore, per member (``[M]`` each)."""

    score: jax.Array  # the score it was ranked by (NaN: no episode ended yet)
    source: jax.Array  # int32: whom it copied (itself where not copied)
    copied: jax.Array  # bool
    operations: dict  # name -> int32 core.pbt operation code
    hparams: dict  # name -> its hyperparameters for the next interval


def copy_members(carry, source: jax.Array):
    """``carry`` (a ``TrainCarry`` with a member axis) with each member's params, optimizer
    state, update count and acting ring taken from member ``source[i]``; its envs, replay slots
    and key stay its own."""

    def take(x):
        return jnp.take(x, source, axis=0)

    state = carry.state
    copied = state.replace(
        params=jax.tree.map(take, state.params),
        opt_state=jax.tree.map(take, state.opt_state),
        update_step=take(state.update_step),
    )
    return carry._replace(state=copied, ring=jax.tree.map(take, carry.ring))


MEMBERS = "members"  # the mesh axis the members are spread over


def member_mesh(num_members: int, learner_devices: int, devices=None) -> Mesh | None:
    """The mesh the members are spread over: the most local devices (``devices``, by default
    ``jax.local_devices()``) that divide ``num_members`` evenly; None where that is one device
    or each member's learner has several devices of its own (then every member is data-parallel
    over them instead)."""
    devices = list(jax.local_devices() if devices is None else devices)
    n = math.gcd(num_members, len(devices))
    if learner_devices > 1 or n < 2:
        return None
    return Mesh(np.array(devices[:n]), (MEMBERS,))


def place(tree, mesh: Mesh | None, by_member: bool = True):
    """``tree``'s arrays spread over ``mesh``'s devices along their member (leading) axis, or
    copied to each (``by_member=False``); as they are where ``mesh`` is None."""
    if mesh is None:
        return tree
    spec = PartitionSpec(MEMBERS) if by_member else PartitionSpec()
    return jax.device_put(tree, NamedSharding(mesh, spec))


def placed(inputs: tuple, mesh: Mesh | None, learner_devices: list) -> tuple:
    """``(carry, hparams, score, key)`` where the interval program takes them: spread by
    member over ``mesh``; copied to every learner device where each member's learner has
    several (a stored program is exported for all of them); as they are on one device."""
    carry, hparams, score, key = inputs
    if mesh is None and len(learner_devices) > 1:
        return place(inputs, Mesh(np.array(learner_devices), (MEMBERS,)), by_member=False)
    return (*place((carry, hparams, score), mesh), place(key, mesh, by_member=False))


def _member_updates(updates, mesh: Mesh | None):
    """Every member's ``updates`` (``(carry, counters, hparams) -> (carry, metrics)``, each
    with a leading member axis but ``counters``): one vmap, or where ``mesh`` is given a vmap
    on each device over its share of the members."""
    members = jax.vmap(updates, in_axes=(0, None, 0))
    if mesh is None:
        return members
    spread = PartitionSpec(MEMBERS)
    return jax.shard_map(
        members,
        mesh=mesh,
        in_specs=(spread, PartitionSpec(), spread),
        out_specs=(spread, spread),
        check_vma=False,  # as device_engine: the env's own step runs inside
    )


def interval_function(updates, plan: PopulationPlan, mesh: Mesh | None = None):
    """``interval(carry, hparams, score, key, counters, exploit_now) -> (carry, hparams, score,
    key, metrics, lineage)``: every member's updates over one interval (``counters``:
    ``[updates_per_interval, 2]``), then exploit/explore where ``exploit_now`` (a traced bool)
    and the plan allow. ``score``: each member's last score, kept where no episode ended.
    ``mesh``: ``member_mesh``'s, with ``updates`` made for one device without a mesh."""
    mutations = dict(plan.mutations)
    member_updates = _member_updates(updates, mesh)

    def interval(carry, hparams, score, key, counters, exploit_now):
        carry, metrics = member_updates(carry, counters, hparams)
        ended = jnp.sum(metrics["num_episodes"], axis=-1)
        returns = jnp.sum(metrics["episode_return_sum"], axis=-1)
        score = jnp.where(ended > 0, returns / jnp.maximum(ended, 1), score)
        members = score.shape[0]
        key, exploit_key, explore_key = jax.random.split(key, 3)
        source = jnp.arange(members, dtype=jnp.int32)
        copied = jnp.zeros(members, bool)
        operations = {name: jnp.zeros(members, jnp.int32) for name in mutations}
        if plan.exploit:
            ranked = jnp.where(exploit_now, plan.sign * score, jnp.nan)  # NaN: not ranked
            source, copied = exploit(exploit_key, ranked, plan.quantile_fraction)
            carry = copy_members(carry, source)
            taken = {k: jnp.take(v, source, axis=0) for k, v in hparams.items()}
            explored, operations = explore(
                explore_key,
                {k: taken[k] for k in mutations},
                mutations,
                copied,
                plan.resample_probability,
                plan.perturbation_factors,
            )
            hparams = taken | explored
            score = jnp.take(score, source, axis=0)
        lineage = Lineage(score, source, copied, operations, hparams)
        return carry, hparams, score, key, metrics, lineage

    return interval


def train_function(init, updates, counters, plan: PopulationPlan, mesh: Mesh | None = None):
    """The whole population run as one pure function: ``train(keys, hparams, key) ->
    (carry, hparams, metrics, lineage)`` for member keys ``[M]``, their hyperparameters
    (name -> ``[M]``) and the key of exploit/explore; ``counters``: ``[intervals,
    updates_per_interval, 2]``. ``metrics`` and ``lineage`` have a leading interval axis.
    ``mesh``: as ``interval_function``'s."""
    interval = interval_function(updates, plan, mesh)

    def train(keys, hparams: dict[str, Any], key):
        carry = jax.vmap(init)(keys)
        score = jnp.full(keys.shape[0], jnp.nan, jnp.float32)

        def one(c, xs):
            carry, hparams, score, key = c
            counters_i, i = xs
            exploit_now = i >= plan.burn_in_intervals
            carry, hparams, score, key, metrics, lineage = interval(
                carry, hparams, score, key, counters_i, exploit_now
            )
            return (carry, hparams, score, key), (metrics, lineage)

        steps = (counters, jnp.arange(counters.shape[0]))
        (carry, hparams, _, _), (metrics, lineage) = jax.lax.scan(
            one, (carry, hparams, score, key), steps
        )
        return carry, hparams, metrics, lineage

    return train
