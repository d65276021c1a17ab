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
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

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


def interval_function(updates, plan: PopulationPlan):
    """``interval(carry, hparams, score, key, counters, exploit_now) -> (carry, hparams, score,
    key, metrics, lineage)``: every member's updates over one interval (``counters``:
    ``[updates_per_interval, 2]``), then exploit/explore where ``exploit_now`` (a traced bool)
    and the plan allow. ``score``: each member's last score, kept where no episode ended."""
    mutations = dict(plan.mutations)
    member_updates = jax.vmap(updates, in_axes=(0, None, 0))

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


def train_function(init, updates, counters, plan: PopulationPlan):
    """The whole population run as one pure function: ``train(keys, hparams, key) ->
    (carry, hparams, metrics, lineage)`` for member keys ``[M]``, their hyperparameters
    (name -> ``[M]``) and the key of exploit/explore; ``counters``: ``[intervals,
    updates_per_interval, 2]``. ``metrics`` and ``lineage`` have a leading interval axis."""
    interval = interval_function(updates, plan)

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
