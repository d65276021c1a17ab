"""One multi-agent runner: its envs stepped on the host, every policy acting in one call.

A runner owns ``num_envs_per_env_runner`` multi-agent envs (envs.py) and their ``AgentLanes``
(lanes.py). Each ``step`` asks every env's acting agents for actions, grouped by policy into
one ``[M, C]`` batch that one compiled call (the policy's ``act`` mapped over the stacked
params) answers, steps the envs with them, and returns what is complete: per-policy columns
of ``T`` agent steps, ended episodes, and the env and agent steps taken.

A recurrent policy's act also takes each acting agent's carry (its state, previous action and
reward, reset flag: lanes.py keeps them per lane), gathered into ``[M, C, ...]`` at the agent's
(policy, slot) position in the batch, and the state it returns goes back to that lane.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from impala_jax.core.types import Trajectory
from impala_jax.runtime.multiagent.lanes import AgentLanes, EndedEpisode, RecurrentLayout

logger = logging.getLogger(__name__)


class StepOutput(NamedTuple):
    """What one ``step`` (or several, merged) produced."""

    columns: dict[int, list[Trajectory]]  # per policy index, oldest first
    episodes: list[EndedEpisode]
    env_steps: int
    agent_steps: int


@dataclasses.dataclass(frozen=True)
class StackedActor:
    """``act(params [M], obs [M, C, ...], keys [M]) -> (action [M, C], dist_inputs, keys)``:
    one policy's compiled act mapped over the policy axis; ``greedy`` without sampling. A
    recurrent policy's (core/policy.py, ``make_act_fns``) also takes ``carry`` ``(state [M, C,
    ...], prev_action [M, C, ...], prev_reward [M, C], reset [M, C])`` and returns the state
    after the row as a fourth output."""

    act: Callable
    greedy: Callable
    explore: bool

    @classmethod
    def of(cls, sample: Callable, greedy: Callable, explore: bool) -> StackedActor:
        return cls(jax.jit(jax.vmap(sample)), jax.jit(jax.vmap(greedy)), explore)

    def __call__(self, params, obs: np.ndarray, keys, carry=None):
        if carry is None:
            if self.explore:
                return self.act(params, obs, keys)
            action, dist_inputs = self.greedy(params, obs)
            return action, dist_inputs, keys
        if self.explore:
            return self.act(params, obs, keys, carry)
        action, dist_inputs, state = self.greedy(params, obs, carry)
        return action, dist_inputs, keys, state


def _bucket(n: int) -> int:
    """The rows an act call is padded to: a power of two, so a few programs serve any count."""
    return 1 << max(0, (n - 1).bit_length())


class EpisodeView(NamedTuple):
    """What ``policy_mapping_fn(agent_id, episode)`` gets as its episode (RLlib passes its
    ``MultiAgentEpisode``, not built here): ``id_`` is unique per episode, as RLlib's."""

    id_: str
    env_index: int


class MultiAgentSampler:
    """``envs`` stepped together. ``map_agent(agent_id, episode) -> policy index`` is asked
    at each agent's first step of an episode; ``to_env(actions)`` turns a batch of the policies'
    actions into the env's, one per row. ``recurrent``: a recurrent policy's layout (lanes.py);
    ``actor`` is then the stacked recurrent act."""

    def __init__(
        self,
        envs: list,
        T: int,
        obs_like: np.ndarray,
        action_like: np.ndarray,
        dist_size: int,
        map_agent: Callable[[Any, EpisodeView], int],
        actor: StackedActor,
        num_policies: int,
        key,
        seed: int,
        to_env: Callable[[np.ndarray], list],
        runner_index: int = 0,
        recurrent: RecurrentLayout | None = None,
    ):
        self.envs, self.actor = envs, actor
        self.num_policies = num_policies
        self._obs_like = obs_like
        self._action_like = np.asarray(action_like)
        self._keys = jax.random.split(key, num_policies)
        self._to_env = to_env
        self._episode_seed = seed
        self._runner = runner_index
        self._episodes = [0] * len(envs)
        self._started = False

        def lane_policy(env_index: int, agent_id) -> int:
            episode_id = f"{self._runner}-{env_index}-{self._episodes[env_index]}"
            return map_agent(agent_id, EpisodeView(episode_id, env_index))

        self.lanes = AgentLanes(
            len(envs), T, obs_like, action_like, dist_size, lane_policy, recurrent=recurrent
        )

    def _reset(self, i: int) -> None:
        # Each reset its own seed, so envs and runners never repeat an episode's start.
        obs, _ = self.envs[i].reset(seed=self._episode_seed)
        self._episode_seed += 1
        self._episodes[i] += 1
        self.lanes.start_episode(i, obs)

    def step(self, params, version: int) -> StepOutput:
        """One env step of every env: act, step, record."""
        if not self._started:
            for i in range(len(self.envs)):
                self._reset(i)
            self._started = True
        env0, agent0 = self.lanes.env_steps, self.lanes.agent_steps
        requests = self.lanes.requests()
        actions = self._act(params, requests)
        per_env: list[dict] = [{} for _ in self.envs]
        # The env's actions for every request at once (one check and rescale, not one each).
        env_actions = self._to_env(np.stack([a[0] for a in actions])) if actions else []
        for (env_index, agent_id, _, _), (action, dist_inputs, core), env_action in zip(
            requests, actions, env_actions, strict=True
        ):
            self.lanes.record(env_index, agent_id, action, dist_inputs, version, core)
            per_env[env_index][agent_id] = env_action
        for i, env in enumerate(self.envs):
            if not per_env[i]:
                continue
            obs, rewards, terminateds, truncateds, _ = env.step(per_env[i])
            if self.lanes.step_result(i, obs, rewards, terminateds, truncateds):
                self._reset(i)
        return StepOutput(
            self.lanes.pop_columns(),
            self.lanes.pop_episodes(),
            self.lanes.env_steps - env0,
            self.lanes.agent_steps - agent0,
        )

    def _act(self, params, requests: list) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        """Every request's (action, dist_inputs, state leaves after the act or None), from one
        call over all policies."""
        rows: list[list[int]] = [[] for _ in range(self.num_policies)]
        for n, (_, _, policy, _) in enumerate(requests):
            rows[policy].append(n)
        width = _bucket(max((len(r) for r in rows), default=1))
        obs = np.zeros((self.num_policies, width, *self._obs_like.shape), self._obs_like.dtype)
        for policy, ns in enumerate(rows):
            for c, n in enumerate(ns):
                obs[policy, c] = requests[n][3]
        if self.lanes.recurrent is None:
            action, dist_inputs, self._keys = self.actor(params, obs, self._keys)
            states = None
        else:
            carry = self._gather_carry(requests, rows, width)
            action, dist_inputs, self._keys, state = self.actor(params, obs, self._keys, carry)
            states = [np.asarray(x) for x in jax.tree.leaves(state)]
        action, dist_inputs = np.asarray(action), np.asarray(dist_inputs)
        out: list = [None] * len(requests)
        for policy, ns in enumerate(rows):
            for c, n in enumerate(ns):
                core = None if states is None else [x[policy, c] for x in states]
                out[n] = (action[policy, c], dist_inputs[policy, c], core)
        return out

    def _gather_carry(self, requests: list, rows: list[list[int]], width: int) -> tuple:
        """The acting lanes' carries at their (policy, slot) positions, ``[M, width, ...]``;
        padding slots get the initial state and a reset row (their outputs are dropped)."""
        lanes, M = self.lanes, self.num_policies
        leaves = [np.broadcast_to(x, (M, width, *x.shape)).copy() for x in lanes.initial_core]
        prev_action = np.zeros((M, width, *self._action_like.shape), self._action_like.dtype)
        prev_reward = np.zeros((M, width), np.float32)
        reset = np.ones((M, width), bool)
        for policy, ns in enumerate(rows):
            for c, n in enumerate(ns):
                core, a, r, done = lanes.carry(*requests[n][:2])
                for leaf, x in zip(leaves, core, strict=True):
                    leaf[policy, c] = x
                prev_action[policy, c], prev_reward[policy, c], reset[policy, c] = a, r, done
        state = jax.tree.unflatten(lanes.core_treedef, leaves)
        return state, prev_action, prev_reward, reset

    def close(self) -> None:
        """Closes the envs; one that fails to close (it may be what failed) is logged and
        does not stop the others closing."""
        for env in self.envs:
            try:
                env.close()
            except Exception as err:
                logger.warning("a multi-agent env failed to close: %s: %s", type(err).__name__, err)
