"""A multi-agent env's dict steps, turned into per-agent V-trace fragments (docs/semantics.md,
"Multi-agent trajectories").

A *lane* is one agent of one env. Its timeline is the agent's own acting steps, as in RLlib's
``MultiAgentEpisode`` (ray/rllib/env/multi_agent_episode.py, ``add_env_step``): an agent that gets
no observation in an env step does not act in it, and the rewards it receives meanwhile add up
into its last transition. A lane fills `Trajectory` columns (B = 1) with the layout of
core/types.py: when an agent's episode ends, the next row holds its final observation with
``valid = 0``, and its next episode continues in the same lane. Every column is one policy's:
a lane whose agent maps to another policy in a new episode hands its open fragment, padded, to the
old policy first.

Recurrent policies (``recurrent=RecurrentLayout(...)``): a lane also fills the recurrent fields
of core/types.py as the single-agent runners do, in the agent's own timeline: the core state
before rows 0, L, 2L, ... (L = ``max_seq_len``), and per row the agent's previous action and
reward (those of the lane's row before) and ``reset`` (the row is the agent's first observation
of an episode, where its state starts again from the initial one). ``carry`` is what the agent
acts from at its current row; ``record`` takes the state its act returned.

Pure NumPy bookkeeping: the caller steps the envs, runs the policies and calls, per env step,
``requests`` -> ``record`` (each request) -> ``env.step`` -> ``step_result``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from impala_jax.core.recurrent import num_chunks
from impala_jax.core.types import Trajectory, empty_trajectory

ALL = "__all__"  # RLlib's key for the whole env in terminateds/truncateds

# Where a lane stands in its env's current episode.
TO_ACT = "to_act"  # obs[t] is known; the agent acts there next
ACTED = "acted"  # action[t] is recorded; rewards add up in reward[t] until its next obs
DONE = "done"  # obs[t] is its final observation (valid 0); the lane waits for a next episode


class RecurrentLayout(NamedTuple):
    """What lanes need of a recurrent policy (core/policy.py's ``RecurrentActor`` has both)."""

    initial_state: Callable[[int], Any]  # n -> the state of n fresh envs, a pytree of [n, ...]
    max_seq_len: int  # L: a fragment keeps the state before rows 0, L, 2L, ...


class EndedEpisode(NamedTuple):
    """One env's finished episode, with RLlib's episode metrics (multi_agent_env_runner.py,
    ``get_metrics``)."""

    env_return: float  # sum of the agents' returns
    length: int  # env steps
    agent_returns: dict[Any, float]  # agent id -> its return, for every agent that acted
    module_returns: dict[int, float]  # policy index -> the returns of its agents, summed
    agent_steps: int  # acting steps of all agents


class _Lane:
    """One agent of one env: its open fragment and where it stands in it."""

    __slots__ = ("policy", "frag", "t", "state", "version", "core")

    def __init__(self, policy: int, frag: Trajectory):
        self.policy = policy
        self.frag = frag
        self.t = 0  # the row of the agent's latest observation
        self.state = TO_ACT
        self.version = -1  # param_version of the first action recorded in the fragment
        self.core: list | None = None  # recurrent: the state's leaves before row t (no B axis)


class _Episode:
    """One env's running episode: the lanes of its agents and its metrics."""

    def __init__(self):
        self.length = 0
        self.members: dict[Any, _Lane] = {}  # agents that joined, in the order they did
        self.to_act: dict[Any, None] = {}  # agents asked to act now, in obs-dict order
        self.returns: dict[Any, float] = {}
        self.module_returns: dict[int, float] = {}
        self.agent_steps = 0
        self.ended = False


class AgentLanes:
    """Per-(env, agent) V-trace fragments of ``num_envs`` multi-agent envs.

    ``obs_like``, ``action_like``: one agent's observation and action (shape and dtype of every
    agent's); ``dist_size``: the length of the distribution inputs an action is sampled from.
    ``map_agent(env_index, agent_id) -> policy index``: called at an agent's first observation in
    an episode; the agent keeps that policy for the episode. ``recurrent``: a recurrent policy's
    layout (None: feedforward, no recurrent fields).
    """

    def __init__(
        self,
        num_envs: int,
        T: int,
        obs_like: np.ndarray,
        action_like: np.ndarray,
        dist_size: int,
        map_agent: Callable[[int, Any], int],
        recurrent: RecurrentLayout | None = None,
    ):
        if T < 1:
            raise ValueError(f"T (rollout_fragment_length) must be at least 1, got {T}")
        self.num_envs, self.T = num_envs, T
        self._obs_like = np.asarray(obs_like)
        self._action_like = np.asarray(action_like)
        self._dist_like = np.zeros((1, dist_size), np.float32)
        self._map_agent = map_agent
        self._lanes: dict[tuple[int, Any], _Lane] = {}
        self._episodes: list[_Episode | None] = [None] * num_envs
        self._columns: dict[int, list[Trajectory]] = {}
        self._ended: list[EndedEpisode] = []
        self.env_steps = 0  # env steps taken so far
        self.agent_steps = 0  # acting steps of all agents so far
        self.recurrent = recurrent
        if recurrent is not None:
            # One env's initial state: fragments are shaped by it, lanes start from its leaves.
            self._initial = jax.tree.map(np.asarray, recurrent.initial_state(1))
            leaves, self.core_treedef = jax.tree.flatten(self._initial)
            self.initial_core = [leaf[0] for leaf in leaves]
            self._chunks = num_chunks(T, recurrent.max_seq_len)

    # -- the caller's calls, in the order it makes them --------------------------------------

    def start_episode(self, env_index: int, obs: Mapping[Any, Any]) -> None:
        """A new episode of env ``env_index`` (after ``env.reset()``), with the observations of
        the agents that act first."""
        self._check_env(env_index)
        running = self._episodes[env_index]
        if running is not None and not running.ended:
            raise ValueError(
                f"start_episode(env_index={env_index}): that env's episode is still running "
                "(step_result has not reported its end)"
            )
        where = f"start_episode(env_index={env_index})"
        checked = {aid: self._obs(o, where, aid) for aid, o in obs.items()}
        episode = self._episodes[env_index] = _Episode()
        for aid, o in checked.items():
            self._join(env_index, episode, aid, o)

    def requests(self) -> list[tuple[int, Any, int, np.ndarray]]:
        """``(env_index, agent_id, policy_index, obs)`` for every agent that must act now: by env
        index, then in the order of that env's last obs dict. ``obs`` is the lane's row (a
        view, read-only by contract), as the lane stores it."""
        out = []
        for env_index, episode in enumerate(self._episodes):
            if episode is None or episode.ended:
                continue
            for aid in episode.to_act:
                lane = episode.members[aid]
                out.append((env_index, aid, lane.policy, lane.frag.obs[lane.t, 0]))
        return out

    def carry(self, env_index: int, agent_id: Any) -> tuple[list, Any, Any, Any]:
        """A recurrent policy's carry for a requested agent's current row: ``(state leaves,
        prev_action, prev_reward, reset)``, one env's, without the B axis (the state's leaves in
        ``core_treedef`` order). Views, read-only by contract."""
        lane = self._episodes[env_index].members[agent_id]
        frag, t = lane.frag, lane.t
        return lane.core, frag.prev_action[t, 0], frag.prev_reward[t, 0], frag.reset[t, 0]

    def record(
        self,
        env_index: int,
        agent_id: Any,
        action: Any,
        dist_inputs: Any,
        param_version: int,
        core: list | None = None,
    ) -> None:
        """The action a requested agent takes, the distribution inputs it was sampled from, and
        the version of the params that computed them; for a recurrent policy also ``core``, the
        state its act returned (leaves as ``carry`` gives them), which its next row starts from."""
        episode = self._running(env_index, "record")
        if agent_id not in episode.to_act:
            raise ValueError(
                f"record(env_index={env_index}, agent_id={agent_id!r}): that agent was not asked "
                f"to act (requests() asks for {list(episode.to_act)} in this env)"
            )
        if (core is None) != (self.recurrent is None):
            raise ValueError(
                f"record(env_index={env_index}, agent_id={agent_id!r}): core (the state after "
                "the act) is given for a recurrent policy, and only then"
            )
        action = np.asarray(action)
        dist_inputs = np.asarray(dist_inputs)
        if action.shape != self._action_like.shape or dist_inputs.shape != (self._dist_like.size,):
            raise ValueError(
                f"record(env_index={env_index}, agent_id={agent_id!r}): action of shape "
                f"{action.shape} and dist_inputs of shape {dist_inputs.shape}, expected "
                f"{self._action_like.shape} (action_like) and ({self._dist_like.size},)"
            )
        lane = episode.members[agent_id]
        frag, t = lane.frag, lane.t
        if core is not None:
            lane.core = [np.asarray(x) for x in core]
        frag.action[t, 0] = action
        frag.behaviour_logits[t, 0] = dist_inputs
        frag.valid[t, 0] = 1.0
        if lane.version < 0:
            lane.version = int(param_version)
        lane.state = ACTED
        del episode.to_act[agent_id]
        episode.agent_steps += 1
        self.agent_steps += 1

    def step_result(
        self,
        env_index: int,
        obs: Mapping[Any, Any],
        rewards: Mapping[Any, float],
        terminateds: Mapping[Any, bool],
        truncateds: Mapping[Any, bool],
    ) -> bool:
        """What ``env.step()`` returned for env ``env_index``. True when its episode ended: the
        caller then resets that env and calls ``start_episode``.

        An agent's episode ends with its own flag or the env's ``"__all__"``, as in RLlib:
        ``terminated = own or __all__``, ``truncated = own or __all__``. The env's episode ends
        with ``"__all__"``, or (RLlib's ``MultiAgentEpisode`` rule) once every agent that joined
        it is done; then each keeps its own flags.
        """
        episode = self._running(env_index, "step_result")
        all_term, all_trunc = bool(terminateds.get(ALL, False)), bool(truncateds.get(ALL, False))
        checked = self._check_step(env_index, episode, obs, rewards, terminateds, truncateds)
        episode.length += 1
        self.env_steps += 1
        for aid, reward in rewards.items():
            lane = episode.members.get(aid)
            if lane is None or reward is None:  # before its first observation: RLlib drops it
                continue
            reward = float(reward)
            lane.frag.reward[lane.t, 0] += reward
            episode.returns[aid] += reward
            episode.module_returns[lane.policy] += reward
        for aid, lane in episode.members.items():
            if lane.state is not ACTED:
                continue
            term = bool(terminateds.get(aid, False)) or all_term
            trunc = bool(truncateds.get(aid, False)) or all_trunc
            if term or trunc:
                self._finish(lane, checked.get(aid), term, trunc)
        ending = all_term or all_trunc
        for aid, o in checked.items():
            lane = episode.members.get(aid)
            if lane is None:
                # A first observation that comes with its own end, or the env's, starts nothing
                # (RLlib: the agent is not part of the episode).
                if not (ending or terminateds.get(aid, False) or truncateds.get(aid, False)):
                    self._join(env_index, episode, aid, o)
            elif lane.state is ACTED:
                self._advance(lane, o)
                lane.state = TO_ACT
                episode.to_act[aid] = None
        if not ending and any(lane.state is not DONE for lane in episode.members.values()):
            return False
        self._end(episode)
        return True

    def pop_columns(self) -> dict[int, list[Trajectory]]:
        """The completed columns since the last call, per policy index, oldest first."""
        columns, self._columns = self._columns, {}
        return columns

    def pop_episodes(self) -> list[EndedEpisode]:
        """The episodes that ended since the last call, in the order they did."""
        ended, self._ended = self._ended, []
        return ended

    # -- checks -------------------------------------------------------------------------------

    def _check_env(self, env_index: int) -> None:
        if not 0 <= env_index < self.num_envs:
            raise ValueError(f"env_index {env_index} out of range: {self.num_envs} envs")

    def _running(self, env_index: int, call: str) -> _Episode:
        self._check_env(env_index)
        episode = self._episodes[env_index]
        if episode is None or episode.ended:
            state = "has not started" if episode is None else "has ended"
            raise ValueError(
                f"{call}(env_index={env_index}): that env's episode {state}; reset the env and "
                "call start_episode first"
            )
        return episode

    def _obs(self, obs: Any, where: str, agent_id: Any) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.shape != self._obs_like.shape:
            raise ValueError(
                f"{where}: observation of agent {agent_id!r} has shape {obs.shape}, expected "
                f"{self._obs_like.shape} (obs_like)"
            )
        return obs

    def _check_step(
        self,
        env_index: int,
        episode: _Episode,
        obs: Mapping[Any, Any],
        rewards: Mapping[Any, float],
        terminateds: Mapping[Any, bool],
        truncateds: Mapping[Any, bool],
    ) -> dict[Any, np.ndarray]:
        """The observations, checked, before anything is written: a step that raises leaves the
        lanes as they were."""
        where = f"step_result(env_index={env_index})"
        if episode.to_act:
            raise ValueError(
                f"{where}: agents {list(episode.to_act)} were asked to act and have no recorded "
                "action; record() every request before stepping the env"
            )
        # RLlib counts a None reward as no data (multi_agent_episode.py, add_env_step).
        for aid in [*obs, *(aid for aid, r in rewards.items() if r is not None)]:
            lane = episode.members.get(aid)
            if lane is not None and lane.state is DONE:
                what = "an observation" if aid in obs else "a reward"
                raise ValueError(
                    f"{where}: {what} for agent {aid!r}, whose episode has ended (it was "
                    "terminated or truncated earlier in this env episode); an agent gets no "
                    "data after its end, as RLlib's MultiAgentEpisode requires"
                )
        all_term, all_trunc = terminateds.get(ALL, False), truncateds.get(ALL, False)
        for aid, lane in episode.members.items():
            term = terminateds.get(aid, False) or all_term
            trunc = truncateds.get(aid, False) or all_trunc
            if lane.state is ACTED and trunc and not term and aid not in obs:
                raise ValueError(
                    f"{where}: agent {aid!r} acted and was then truncated without a final "
                    "observation, which the truncated episode's bootstrap value needs (RLlib "
                    "raises here too); return its observation in the step that truncates it"
                )
        return {aid: self._obs(o, where, aid) for aid, o in obs.items() if aid != ALL}

    # -- lanes --------------------------------------------------------------------------------

    def _fresh(self, lane: _Lane, obs: np.ndarray, before: Trajectory | None = None) -> None:
        """A new fragment for ``lane`` whose row 0 is ``obs``: row T of ``before``, the lane's
        last fragment, or (None) the agent's first observation of an episode."""
        recurrent = {}
        if self.recurrent is not None:
            recurrent = dict(core_state=self._initial, chunks=self._chunks)
        lane.frag = empty_trajectory(
            self.T,
            self._obs_like[None],
            self._action_like[None],
            self._dist_like,
            alloc=np.zeros,
            **recurrent,
        )
        lane.frag.obs[0, 0] = obs
        lane.t = 0
        lane.version = -1
        if self.recurrent is None:
            return
        if before is None:
            self._carry_row(lane, self.initial_core, None, None, True)
        else:
            T = self.T
            row = before.prev_action[T, 0], before.prev_reward[T, 0], bool(before.reset[T, 0])
            self._carry_row(lane, lane.core, *row)

    def _advance(self, lane: _Lane, obs: np.ndarray, reset: bool = False) -> None:
        """``obs`` into the row after ``lane.t`` (``reset``: the agent's first observation of
        an episode); at row T the column is complete, and row T becomes row 0 of the next
        fragment."""
        lane.t += 1
        frag, t = lane.frag, lane.t
        frag.obs[t, 0] = obs
        if self.recurrent is not None:
            # The agent's previous row in its own timeline is the lane's row before.
            if reset:
                self._carry_row(lane, self.initial_core, None, None, True)
            else:
                self._carry_row(
                    lane, lane.core, frag.action[t - 1, 0], frag.reward[t - 1, 0], False
                )
        if t == self.T:
            self._emit(lane)
            self._fresh(lane, obs, before=frag)

    def _carry_row(self, lane: _Lane, core: list, prev_action, prev_reward, reset: bool) -> None:
        """Row ``lane.t``'s recurrent fields, as the single-agent runners record them
        (env_runner.py, ``_record_carry``): the previous action and reward (None: zeros), the
        reset flag, and at a chunk start (t % L == 0) the state before the row. An episode's
        first row starts from the initial state (the core also zeroes it where ``reset``)."""
        frag, t = lane.frag, lane.t
        lane.core = core
        L = self.recurrent.max_seq_len
        if t % L == 0:
            for stored, leaf in zip(jax.tree.leaves(frag.core_state), core, strict=True):
                stored[t // L, 0] = leaf
        frag.prev_action[t, 0] = 0 if prev_action is None else prev_action
        frag.prev_reward[t, 0] = 0.0 if prev_reward is None else prev_reward
        frag.reset[t, 0] = reset

    def _emit(self, lane: _Lane) -> None:
        lane.frag.param_version[0] = lane.version
        self._columns.setdefault(lane.policy, []).append(lane.frag)

    def _finish(self, lane: _Lane, final_obs: np.ndarray | None, term: bool, trunc: bool) -> None:
        """The end of the agent's episode after ``action[t]``: the flags on row t, its final
        observation on the next row (valid 0). A terminated agent without one repeats its last
        observation, as RLlib does: with discount 0 its value is never used."""
        frag, t = lane.frag, lane.t
        frag.terminated[t, 0] = term
        frag.truncated[t, 0] = trunc
        self._advance(lane, frag.obs[t, 0].copy() if final_obs is None else final_obs)
        lane.state = DONE

    def _join(self, env_index: int, episode: _Episode, agent_id: Any, obs: np.ndarray) -> None:
        """An agent's first observation in an episode."""
        policy = self._map_agent(env_index, agent_id)
        if isinstance(policy, bool) or not isinstance(policy, int | np.integer):
            raise ValueError(
                f"map_agent({env_index}, {agent_id!r}) returned {policy!r}, expected a policy "
                "index (int)"
            )
        policy = int(policy)
        lane = self._lanes.get((env_index, agent_id))
        if lane is None:
            lane = self._lanes[(env_index, agent_id)] = _Lane(policy, None)
            self._fresh(lane, obs)
        elif lane.policy != policy:
            self._hand_over(lane)
            lane.policy = policy
            self._fresh(lane, obs)
        else:  # same policy: the new episode follows the final-observation row
            self._advance(lane, obs, reset=True)
        lane.state = TO_ACT
        episode.members[agent_id] = lane
        episode.to_act[agent_id] = None
        episode.returns[agent_id] = 0.0
        episode.module_returns.setdefault(policy, 0.0)

    def _hand_over(self, lane: _Lane) -> None:
        """The open fragment of a lane whose policy changes, emitted early to its old policy:
        after its final-observation row (row t), rows of valid 0 repeat that observation. A
        fragment with no valid row (only the final observation, already the bootstrap row of
        the column before) is dropped."""
        frag, t = lane.frag, lane.t
        if not frag.valid[:t, 0].any():
            return
        frag.obs[t + 1 :, 0] = frag.obs[t, 0]
        if self.recurrent is not None:
            # The padding rows' chunk starts hold the initial state (their other recurrent
            # fields stay zero): every stored state is a real one, whatever the rows' mask.
            L = self.recurrent.max_seq_len
            for k in range(t // L + 1, self._chunks):
                for stored, leaf in zip(
                    jax.tree.leaves(frag.core_state), self.initial_core, strict=True
                ):
                    stored[k, 0] = leaf
        self._emit(lane)

    def _end(self, episode: _Episode) -> None:
        episode.ended = True
        self._ended.append(
            EndedEpisode(
                env_return=float(sum(episode.returns.values())),
                length=episode.length,
                agent_returns={aid: float(r) for aid, r in episode.returns.items()},
                module_returns={p: float(r) for p, r in episode.module_returns.items()},
                agent_steps=episode.agent_steps,
            )
        )
