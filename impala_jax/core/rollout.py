"""Envs written in JAX, stepped inside a compiled program: the on-device rollout.

A ``JaxEnv`` is a pure env without autoreset: ``reset(key) -> (obs, state)`` and
``step(key, state, action) -> (obs, state, reward, terminated, truncated)`` for one env
(runtime/envs/jax_envs.py adapts gymnax's). ``step_envs`` steps a batch of them with the next-step
autoreset of envpool and gymnasium (types.py): the step that ends an episode returns its final
observation, the step after it ignores the action and returns the reset observation with
reward 0. So a fragment from ``make_rollout`` has the host runners' layout row for row, and
V-trace, the loss and the masks need no change.

Every random draw of env ``i`` (its steps, its resets, its sampled actions) comes from its own
key in ``EnvCarry.key``, split once per step: a run gives the same envs and actions however its
envs are split over devices.

A recurrent policy (core/recurrent.py) carries its per-env ``(state, prev_action, prev_reward,
reset)`` in ``EnvCarry.policy`` from row to row, exactly as the host runners carry it
(core/policy.py's ``initial_carry`` and ``next_carry``, written once for both), and its
fragments hold the same recurrent fields row for row (types.py): the state before rows 0, L,
2L, ... and each row's previous action, previous reward and reset flag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from impala_jax.core.policy import act, initial_carry, next_carry
from impala_jax.core.types import Trajectory, with_bootstrap


class JaxEnv(Protocol):
    """One env as pure functions (no autoreset); ``action`` is already the env's action.

    An env may also define ``episode_metrics(state) -> dict[str, jax.Array]``: scalars of one
    env's state at the end of an episode (the state its final step returned), which
    ``step_envs`` records in ``Episodes.metrics`` (Craftax's achievements:
    runtime/envs/craftax_envs.py), and ``summarize_episodes(means) -> dict``, on the host,
    what the results derive from their means (runtime/metrics.py's ``EpisodeStats``).
    """

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array]: ...


class EnvCarry(NamedTuple):
    """What a batch of ``B`` envs carries from one step to the next (leading axis ``B``)."""

    state: Any  # the envs' own states
    obs: jax.Array  # [B, ...]: the observation the next action is taken in
    prev_done: jax.Array  # [B] bool: obs is a final observation, so the next row resets
    key: jax.Array  # [B] PRNG keys, one per env
    episode_return: jax.Array  # [B] float32: the running episode's return so far
    episode_len: jax.Array  # [B] int32
    # A recurrent policy's (state, prev_action, prev_reward, reset) per env; () otherwise.
    policy: Any = ()


class Episodes(NamedTuple):
    """Episodes that ended during a rollout, per row: ``[T, B]`` each."""

    ended: jax.Array  # bool: an episode ended at this row's step
    episode_return: jax.Array  # float32: its return (0 where not ended)
    episode_len: jax.Array  # int32: its length (0 where not ended)
    # The env's ``episode_metrics`` of its final state, each [T, B] (0 where not ended); {}
    # for an env without them.
    metrics: dict = {}


def episode_metrics(env: JaxEnv, state: Any) -> dict:
    """``env.episode_metrics`` of a batch of states (leading axis ``B``); {} without them."""
    metrics = getattr(env, "episode_metrics", None)
    return {} if metrics is None else jax.vmap(metrics)(state)


def reset_envs(env: JaxEnv, key: jax.Array, num_envs: int, networks=None) -> EnvCarry:
    """``num_envs`` fresh envs; env ``i``'s key is ``split(key, num_envs)[i]``. ``networks``: a
    recurrent policy's (core/recurrent.py), whose carry the envs start with (``initial_carry``:
    zero state, every row a reset row); None for a feedforward policy."""
    keys = jax.random.split(key, num_envs)
    split = jax.vmap(jax.random.split)(keys)  # [B, 2]: the env's next key, its reset key
    obs, state = jax.vmap(env.reset)(split[:, 1])
    return EnvCarry(
        state=state,
        obs=obs,
        prev_done=jnp.zeros(num_envs, bool),
        key=split[:, 0],
        episode_return=jnp.zeros(num_envs, jnp.float32),
        episode_len=jnp.zeros(num_envs, jnp.int32),
        policy=() if networks is None else initial_carry(networks, num_envs, env.action_space),
    )


def step_keys(carry: EnvCarry) -> tuple[EnvCarry, jax.Array]:
    """Splits every env's key once per step: the carry with the next keys, and ``[B, 3]`` keys
    for (the action's sample, the env's step, the env's reset)."""
    split = jax.vmap(lambda k: jax.random.split(k, 4))(carry.key)
    return carry._replace(key=split[:, 0]), split[:, 1:]


def step_envs(
    env: JaxEnv, carry: EnvCarry, action: jax.Array, keys: jax.Array
) -> tuple[EnvCarry, jax.Array, jax.Array, jax.Array, Episodes]:
    """One step of every env with next-step autoreset; ``keys`` from ``step_keys``.

    Returns the carry and the row's ``(reward, terminated, truncated, episodes)``. An env whose
    observation was final (``prev_done``) is reset instead of stepped: its row has reward 0 and
    neither flag, and is not a step of any episode.
    """

    def one(state, a, step_key, reset):
        obs, next_state, reward, terminated, truncated = env.step(step_key, state, a)
        return (
            obs,
            next_state,
            jnp.where(reset, 0.0, reward).astype(jnp.float32),
            ~reset & terminated.astype(bool),
            ~reset & truncated.astype(bool),
        )

    reset = carry.prev_done
    obs, state, reward, terminated, truncated = jax.vmap(one)(
        carry.state, action, keys[:, 1], reset
    )
    # The envs are reset only in steps where one of them resets: the stepped values stand in
    # otherwise, and every one is replaced by its stepped value below. A reset can cost more
    # than a step (Craftax generates its world).
    fresh_obs, fresh_state = jax.lax.cond(
        jnp.any(reset),
        lambda: jax.vmap(env.reset)(keys[:, 2]),
        lambda: (obs, state),
    )
    pick = lambda fresh, stepped: jnp.where(  # noqa: E731
        reset.reshape(reset.shape + (1,) * (stepped.ndim - 1)), fresh, stepped
    )
    obs, state = pick(fresh_obs, obs), jax.tree.map(pick, fresh_state, state)
    real = ~carry.prev_done
    episode_return = carry.episode_return + reward * real
    episode_len = carry.episode_len + real.astype(jnp.int32)
    done = terminated | truncated
    # The state an episode ended in: its final step's, before the next row resets it.
    metrics = jax.tree.map(
        lambda x: jnp.where(done, x, jnp.zeros_like(x)), episode_metrics(env, state)
    )
    episodes = Episodes(
        done, jnp.where(done, episode_return, 0.0), jnp.where(done, episode_len, 0), metrics
    )
    carry = carry._replace(
        state=state,
        obs=obs,
        prev_done=done,
        episode_return=jnp.where(done, 0.0, episode_return),
        episode_len=jnp.where(done, 0, episode_len),
    )
    return carry, reward, terminated, truncated, episodes


def recurrent(policy_carry) -> bool:
    """Whether ``EnvCarry.policy`` is a recurrent policy's carry (``()`` for a feedforward one)."""
    return policy_carry != ()


def make_rollout(
    env: JaxEnv, policy: Callable, to_env_action: Callable, T: int, max_seq_len: int = 0
) -> Callable:
    """``rollout(params, carry) -> (carry, Trajectory, Episodes)``: ``T`` steps of every env.

    ``policy(params, obs, keys, policy_carry) -> (action, dist_inputs, state)`` acts for the
    whole batch with one key per env (``make_policy_fn``); ``to_env_action`` maps a policy
    action to the env's (bounds, offsets). The Trajectory's ``param_version`` is None: the
    caller knows which params acted. A carry with a recurrent policy's ``policy`` (see
    ``reset_envs``) gives fragments with the recurrent fields, the state kept before every
    ``max_seq_len``-th row.
    """

    def row(params, carry: EnvCarry):
        carry, keys = step_keys(carry)
        obs, valid = carry.obs, ~carry.prev_done
        action, dist_inputs, state = policy(params, obs, keys[:, 0], carry.policy)
        # What the row was acted from, before the step (the policy's carry of this row).
        acted_from = carry.policy
        carry, reward, terminated, truncated, episodes = step_envs(
            env, carry, to_env_action(action), keys
        )
        if recurrent(acted_from):  # obs being final (~valid) makes the next row a reset row
            carry = carry._replace(policy=next_carry(state, action, reward, ~valid))
        out = Trajectory(
            obs=obs,
            action=action,
            behaviour_logits=dist_inputs.astype(jnp.float32),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            valid=valid.astype(jnp.float32),
            param_version=None,
        )
        return carry, (out, acted_from, episodes)

    def rollout(params, carry: EnvCarry):
        carry, (rows, acted_from, episodes) = jax.lax.scan(
            lambda c, _: row(params, c), carry, None, length=T
        )
        rows = with_bootstrap(rows, obs=carry.obs)
        if not recurrent(carry.policy):
            return carry, rows, episodes
        # Row T (the bootstrap row, the next fragment's row 0) is acted from the carry now.
        add_last = lambda r, last: jnp.concatenate([r, last[None]])  # noqa: E731
        states, prev_action, prev_reward, reset = jax.tree.map(add_last, acted_from, carry.policy)
        rows = rows._replace(
            core_state=jax.tree.map(lambda s: s[::max_seq_len], states),
            prev_action=prev_action,
            prev_reward=prev_reward,
            reset=reset,
        )
        return carry, rows, episodes

    return rollout


def make_policy_fn(networks, distribution, explore: bool = True) -> Callable:
    """``policy(params, obs, keys, policy_carry=()) -> (action, dist_inputs, state)`` for
    ``make_rollout``: ``act`` (core/policy.py) with one key per env, so env ``i`` samples with
    ``keys[i]`` (``explore``), or every env takes the distribution's mode. ``policy_carry``: a
    recurrent policy's carry (``EnvCarry.policy``), ``()`` for a feedforward one (whose
    ``state`` is None)."""

    def policy(params, obs, keys, policy_carry=()):
        return act(
            networks,
            distribution,
            params,
            obs,
            keys,
            explore,
            carry=policy_carry if recurrent(policy_carry) else None,
            per_env_keys=True,
        )

    return policy
