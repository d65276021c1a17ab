"""Multi-agent trajectories (docs/semantics.md, "Multi-agent trajectories"): a hand-built
episode row by row, random episodes against RLlib's own MultiAgentEpisode and per-episode
V-trace, policy switches, errors, and the env adapters with RLlib's MultiAgentCartPole and
PettingZoo-style parallel envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_jax.core.vtrace import vtrace
from impala_jax.runtime.multiagent.envs import (
    MultiAgentEnvAdapter,
    is_multi_agent_env,
    make_multi_agent_env,
)
from impala_jax.runtime.multiagent.lanes import AgentLanes

GAMMA = 0.9
CODES = {"a": 1, "b": 2, "c": 3, "x": 4, "y": 5}


def ob(agent, k):
    """Agent ``agent``'s observation number ``k``: (agent code, k)."""
    return np.array([CODES[agent], k], np.float32)


def action_of(obs):
    """The action taken at ``obs`` in these tests: it names the observation."""
    return int(100 * obs[0] + obs[1])


def make_lanes(T, mapping, num_envs=1):
    calls = []

    def map_agent(env_index, agent_id):
        calls.append((env_index, agent_id))
        return mapping(env_index, agent_id)

    lanes = AgentLanes(num_envs, T, np.zeros(2, np.float32), np.zeros((), np.int32), 2, map_agent)
    return lanes, calls


def act(lanes, version):
    """Records an action for every request; returns {env_index: {agent_id: action}}."""
    actions = {}
    for env_index, aid, _, obs in lanes.requests():
        actions.setdefault(env_index, {})[aid] = action_of(obs)
        lanes.record(env_index, aid, action_of(obs), obs.copy(), version)
    return actions


def step(lanes, obs, rewards, terminateds=None, truncateds=None, env_index=0):
    """``step_result`` with the ``"__all__"`` keys the adapter always adds."""
    return lanes.step_result(
        env_index,
        obs,
        rewards,
        {"__all__": False, **(terminateds or {})},
        {"__all__": False, **(truncateds or {})},
    )


def check_column(col, obs, reward, terminated, truncated, valid, version):
    """Every field of a B=1 column; actions and logits follow from obs on valid rows, 0 else."""
    T = len(reward)
    obs = np.asarray(obs, np.float32)
    valid = np.asarray(valid, np.float32)
    np.testing.assert_array_equal(col.obs[:, 0], obs, err_msg="obs")
    action = [action_of(o) if v else 0 for o, v in zip(obs[:T], valid, strict=True)]
    np.testing.assert_array_equal(col.action[:, 0], action, err_msg="action")
    np.testing.assert_array_equal(col.behaviour_logits[:, 0], obs[:T] * valid[:, None], "logits")
    np.testing.assert_array_equal(col.reward[:, 0], reward, err_msg="reward")
    np.testing.assert_array_equal(col.terminated[:, 0], terminated, err_msg="terminated")
    np.testing.assert_array_equal(col.truncated[:, 0], truncated, err_msg="truncated")
    np.testing.assert_array_equal(col.valid[:, 0], valid, err_msg="valid")
    assert col.param_version.tolist() == [version]
    assert col.obs.dtype == np.float32 and col.reward.dtype == np.float32
    assert col.terminated.dtype == bool and col.param_version.dtype == np.int32
    assert col.core_state is None and col.reset is None


def test_hand_built_episodes_row_by_row():
    """T=3. Episode 1: "a" acts every step and terminates at env step 4; "b" skips step 3
    (no obs in step 2) and is truncated by "__all__" at step 6; "c" joins at step 2 (its reward
    there, before its first obs, is dropped, as RLlib does), skips step 4, and its reward of
    step 4 adds to its transition from step 3. Episode 2: all three continue their lanes."""
    lanes, calls = make_lanes(3, lambda i, aid: 1 if aid == "c" else 0)
    a, b, c = (lambda k, n=n: ob(n, k) for n in "abc")
    lanes.start_episode(0, {"a": a(0), "b": b(0)})
    script = [  # obs, rewards, terminateds, truncateds, agents asked to act in the step
        ({"a": a(1), "b": b(1)}, {"a": 1, "b": 10}, {}, {}, ["a", "b"]),
        ({"a": a(2), "c": c(0)}, {"a": 2, "b": 20, "c": 100}, {}, {}, ["a", "b"]),
        ({"a": a(3), "b": b(2)}, {"a": 3, "b": 30, "c": 300}, {}, {}, ["a", "c"]),
        ({"a": a(4), "b": b(3), "c": c(1)}, {"a": 4, "b": 40, "c": 400}, {"a": True}, {}, "ab"),
        ({"b": b(4), "c": c(2)}, {"b": 50, "c": 500}, {}, {}, ["b", "c"]),
        ({"b": b(5), "c": c(3)}, {"b": 60, "c": 600}, {}, {"__all__": True}, ["b", "c"]),
    ]
    for n, (obs, rewards, terms, truncs, asked) in enumerate(script, start=1):
        assert [(r[1], r[2]) for r in lanes.requests()] == [(x, x == "c") for x in asked]
        act(lanes, version=n)
        assert step(lanes, obs, rewards, terms, truncs) == (n == 6)
    assert lanes.requests() == []
    [episode] = lanes.pop_episodes()
    assert episode.agent_returns == {"a": 10.0, "b": 210.0, "c": 1800.0}
    assert episode.module_returns == {0: 220.0, 1: 1800.0}
    assert (episode.env_return, episode.length, episode.agent_steps) == (2020.0, 6, 12)
    assert (lanes.env_steps, lanes.agent_steps) == (6, 12)

    lanes.start_episode(0, {"a": a(10), "b": b(10)})
    for n, (obs, rewards) in enumerate(
        [
            ({"a": a(11), "b": b(11), "c": c(10)}, {"a": 7, "b": 70, "c": 77}),
            ({"a": a(12), "b": b(12), "c": c(11)}, {"a": 8, "b": 80, "c": 800}),
            ({"a": a(13), "b": b(13), "c": c(12)}, {"a": 9, "b": 90, "c": 900}),
        ],
        start=7,
    ):
        act(lanes, version=n)
        assert not step(lanes, obs, rewards)
    assert (lanes.env_steps, lanes.agent_steps) == (9, 20)
    # map_agent: once per agent and episode, at its first observation.
    assert calls == [(0, "a"), (0, "b"), (0, "c"), (0, "a"), (0, "b"), (0, "c")]

    columns = lanes.pop_columns()
    assert sorted(columns) == [0, 1] and lanes.pop_columns() == {}
    a_cols = [col for col in columns[0] if col.obs[0, 0, 0] == CODES["a"]]
    b_cols = [col for col in columns[0] if col.obs[0, 0, 0] == CODES["b"]]
    assert [int(col.obs[0, 0, 0]) for col in columns[0]] == [1, 2, 2, 1, 2]  # oldest first
    check_column(a_cols[0], [a(0), a(1), a(2), a(3)], [1, 2, 3], [0] * 3, [0] * 3, [1] * 3, 1)
    # The final observation a(4) is a row of valid 0; episode 2 follows in the same lane.
    check_column(a_cols[1], [a(3), a(4), a(10), a(11)], [4, 0, 7], [1, 0, 0], [0] * 3, [1, 0, 1], 4)
    check_column(b_cols[0], [b(0), b(1), b(2), b(3)], [10, 50, 40], [0] * 3, [0] * 3, [1] * 3, 1)
    # "__all__" truncated: b keeps its final observation, the bootstrap of its last transition.
    check_column(
        b_cols[1], [b(3), b(4), b(5), b(10)], [50, 60, 0], [0] * 3, [0, 1, 0], [1, 1, 0], 5
    )
    check_column(
        b_cols[2], [b(10), b(11), b(12), b(13)], [70, 80, 90], [0] * 3, [0] * 3, [1] * 3, 7
    )
    c_cols = columns[1]
    check_column(
        c_cols[0], [c(0), c(1), c(2), c(3)], [700, 500, 600], [0] * 3, [0, 0, 1], [1] * 3, 3
    )
    # Row 0 is c's final observation: the version is that of the first action recorded (step 8);
    # c's reward in step 7, with its first observation of episode 2, is dropped.
    check_column(
        c_cols[1], [c(3), c(10), c(11), c(12)], [0, 800, 900], [0] * 3, [0] * 3, [0, 1, 1], 8
    )
    for cols in (a_cols, b_cols, c_cols):  # row T of a column is row 0 of the lane's next one
        for first, second in zip(cols, cols[1:], strict=False):
            np.testing.assert_array_equal(first.obs[-1], second.obs[0])


class RandomTurnsEnv:
    """Three agents that join late, skip turns (no observation for some steps), end on their own
    or with the env (terminated without a final observation now and then), and get rewards in
    steps where they do not act, and before their first observation. Observation =
    (agent code, a number never used twice)."""

    possible_agents = ["a", "b", "c"]

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def _obs(self, aid):
        self.count += 1
        return ob(aid, self.count)

    def reset(self):
        self.state = {aid: "out" for aid in self.possible_agents}
        first = [aid for aid in self.possible_agents if self.rng.random() < 0.6] or ["a"]
        for aid in first:
            self.state[aid] = "act"
        return {aid: self._obs(aid) for aid in first}

    def step(self, actions):
        rng, state = self.rng, self.state
        assert set(actions) == {aid for aid, s in state.items() if s == "act"}
        for aid in actions:
            state[aid] = "hang"
        alive = [aid for aid, s in state.items() if s == "hang"]
        kind = int(rng.integers(3)) if rng.random() < 0.08 else None
        all_term, all_trunc = kind in (0, 2), kind in (1, 2)
        obs, rewards, terms, truncs = {}, {}, {"__all__": all_term}, {"__all__": all_trunc}
        for aid in alive:
            if rng.random() < 0.1:
                (terms if rng.random() < 0.5 else truncs)[aid] = True
            term, trunc = terms.get(aid, False) or all_term, truncs.get(aid, False) or all_trunc
            # RLlib needs a final observation for a truncated agent, and a reward for one that
            # acted and observes.
            if trunc or rng.random() < (0.5 if term else 0.6):
                obs[aid] = self._obs(aid)
            if aid in obs and aid in actions or rng.random() < 0.7:
                rewards[aid] = float(rng.integers(-5, 6))
            state[aid] = "done" if term or trunc else ("act" if aid in obs else "hang")
        if all(state[aid] == "done" for aid in alive) and not (all_term or all_trunc):
            terms["__all__"] = True  # no agent left: the env ends (newcomers would differ)
        for aid in [aid for aid, s in state.items() if s == "out"]:
            if rng.random() < 0.3:
                rewards[aid] = float(rng.integers(-5, 6))  # before its first obs: dropped
            if rng.random() < 0.25:
                obs[aid] = self._obs(aid)
                if rng.random() < 0.1:
                    terms[aid] = True  # a first observation with its end starts nothing
                elif not (terms["__all__"] or truncs["__all__"]):
                    state[aid] = "act"
        return obs, rewards, terms, truncs


def lane_streams(columns, T):
    """policy index -> the lane's columns concatenated: obs [N+1, 2], the rest [N]."""
    out = {}
    for policy, cols in columns.items():
        out[policy] = {
            "obs": np.concatenate([c.obs[:T, 0] for c in cols] + [cols[-1].obs[T:, 0]]),
            **{
                f: np.concatenate([getattr(c, f)[:, 0] for c in cols])
                for f in ("reward", "terminated", "truncated", "valid")
            },
        }
    return out


def agent_episodes(stream):
    """The complete agent episodes in a lane stream, each ended by its final-observation row
    (valid 0): (first row, obs with the final one, rewards, terminated, truncated)."""
    episodes, start = [], 0
    for end in np.flatnonzero(stream["valid"] == 0):
        if end > start:
            obs, rewards = stream["obs"][start : end + 1], stream["reward"][start:end]
            flags = bool(stream["terminated"][end - 1]), bool(stream["truncated"][end - 1])
            episodes.append((start, obs, rewards, *flags))
        start = end + 1
    return episodes


def test_random_episodes_match_rllib_and_per_episode_vtrace():
    """Random multi-agent episodes, fed to AgentLanes and to RLlib's MultiAgentEpisode: each
    agent's episodes in its lane (observations with the final one, rewards, flags) equal
    RLlib's SingleAgentEpisodes, and so do the returns. Then V-trace over a lane's columns,
    concatenated, gives per-episode discounted returns (on-policy, lambda 1), and per column
    the same targets as over the concatenation (with values consistent with them)."""
    episode_cls = pytest.importorskip("ray.rllib.env.multi_agent_episode").MultiAgentEpisode
    T = 5
    env = RandomTurnsEnv(seed=3)
    lanes, _ = make_lanes(T, lambda i, aid: CODES[aid])  # one policy per agent: one lane each
    rllib_eps = {aid: [] for aid in env.possible_agents}
    for _ in range(60):
        obs = env.reset()
        lanes.start_episode(0, obs)
        episode = episode_cls(agent_to_module_mapping_fn=lambda aid, ep: aid)
        episode.add_env_reset(observations=obs)
        done = False
        while not done:
            actions = act(lanes, version=0).get(0, {})
            obs, rewards, terms, truncs = env.step(actions)
            episode.add_env_step(
                observations=obs,
                actions=actions,
                rewards=rewards,
                terminateds=terms,
                truncateds=truncs,
            )
            done = lanes.step_result(0, obs, rewards, terms, truncs)
            assert done == episode.is_done
        [mine] = lanes.pop_episodes()
        assert mine.length == len(episode)
        assert mine.env_return == pytest.approx(episode.get_return())
        assert mine.agent_returns == {
            aid: pytest.approx(sa.get_return()) for aid, sa in episode.agent_episodes.items()
        }
        assert mine.agent_steps == sum(len(sa) for sa in episode.agent_episodes.values())
        for aid, sa in episode.agent_episodes.items():
            rllib_eps[aid].append(sa)
    streams = lane_streams(lanes.pop_columns(), T)
    for aid in env.possible_agents:
        stream = streams[CODES[aid]]
        mine = agent_episodes(stream)
        assert len(mine) >= 15
        for (_, obs, rewards, term, trunc), sa in zip(mine, rllib_eps[aid], strict=False):
            np.testing.assert_array_equal(obs, np.asarray(sa.get_observations()))
            np.testing.assert_array_equal(rewards, sa.get_rewards())
            assert (term, trunc) == (sa.is_terminated, sa.is_truncated)
        check_vtrace(stream, mine, T)


def lane_targets(stream, values, rows):
    """V-trace targets (on-policy: rho = valid, lambda 1) of ``rows`` of a lane stream, with
    ``values[k]`` = V(observation number k) and bootstrap V(obs[rows.stop])."""
    v = values[stream["obs"][rows.start : rows.stop + 1, 1].astype(int)].astype(np.float32)
    discount = GAMMA * (1.0 - stream["terminated"][rows])
    r_t, discount_t, rho_tm1 = (
        np.asarray(x, np.float32)[:, None]
        for x in (stream["reward"][rows], discount, stream["valid"][rows])
    )
    return np.asarray(vtrace(v[:-1, None], v[1:, None], r_t, discount_t, rho_tm1).vs[:, 0])


def check_vtrace(stream, episodes, T):
    """V-trace on a lane stream against a plain loop over its complete agent episodes."""
    N = len(stream["valid"])
    ids = stream["obs"][:, 1].astype(int)
    table = np.random.default_rng(0).normal(size=ids.max() + 1)  # V(obs), by its number
    whole = lane_targets(stream, table, slice(0, N))
    # Per-episode discounted return: a truncated episode bootstraps from V(final observation),
    # a terminated one from nothing. The final-observation row cuts the trace, so the episodes
    # after it change nothing.
    for start, obs, rewards, term, _ in episodes:
        n = len(rewards)
        for k in range(n):
            g = 0.0 if term else GAMMA ** (n - k) * table[int(obs[-1, 1])]
            g += sum(GAMMA ** (j - k) * rewards[j] for j in range(k, n))
            assert whole[start + k] == pytest.approx(g, rel=1e-4, abs=1e-4)
    # With values consistent with the targets, each column alone gives the same targets as the
    # concatenation: split fragments = the whole lane.
    consistent = table.copy()
    valid = np.flatnonzero(stream["valid"])
    consistent[ids[valid]] = whole[valid]
    whole = lane_targets(stream, consistent, slice(0, N))
    split = np.concatenate(
        [lane_targets(stream, consistent, slice(k, k + T)) for k in range(0, N, T)]
    )
    np.testing.assert_allclose(split[valid], whole[valid], rtol=1e-5, atol=1e-4)


def test_policy_switch_hands_the_open_fragment_to_the_old_policy():
    policy = {"x": 0}
    lanes, _ = make_lanes(4, lambda i, aid: policy[aid])
    x = lambda k: ob("x", k)  # noqa: E731
    lanes.start_episode(0, {"x": x(0)})
    act(lanes, 1)
    step(lanes, {"x": x(1)}, {"x": 1.0})
    act(lanes, 2)
    assert step(lanes, {"x": x(2)}, {"x": 2.0}, {"x": True})
    assert lanes.pop_columns() == {}  # 2 of 4 rows
    policy["x"] = 1
    lanes.start_episode(0, {"x": x(10)})
    [early] = lanes.pop_columns()[0]
    # Emitted early, padded after the final observation with rows of valid 0 that repeat it.
    check_column(early, [x(0), x(1), x(2), x(2), x(2)], [1, 2, 0, 0], [0, 1, 0, 0], [0] * 4,
                 [1, 1, 0, 0], 1)  # fmt: skip
    for n in range(4):
        assert lanes.requests()[0][2] == 1
        act(lanes, 3 + n)
        step(lanes, {"x": x(11 + n)}, {"x": 10.0 + n})
    columns = lanes.pop_columns()
    assert list(columns) == [1]  # the new episode starts a fresh fragment of the new policy
    check_column(columns[1][0], [x(10 + k) for k in range(5)], [10, 11, 12, 13], [0] * 4,
                 [0] * 4, [1] * 4, 3)  # fmt: skip


def test_policy_switch_after_a_full_column_drops_nothing_but_padding():
    """When the final observation was row T of the last column, the open fragment holds only it
    (valid 0, already that column's bootstrap): a switch emits no all-padding column."""
    policy = {"x": 0}
    lanes, _ = make_lanes(2, lambda i, aid: policy[aid])
    x = lambda k: ob("x", k)  # noqa: E731
    lanes.start_episode(0, {"x": x(0)})
    act(lanes, 1)
    step(lanes, {"x": x(1)}, {"x": 1.0})
    act(lanes, 2)
    step(lanes, {"x": x(2)}, {"x": 2.0}, truncateds={"x": True})
    [col] = lanes.pop_columns()[0]
    check_column(col, [x(0), x(1), x(2)], [1, 2], [0, 0], [0, 1], [1, 1], 1)
    policy["x"] = 1
    lanes.start_episode(0, {"x": x(10)})
    assert lanes.pop_columns() == {}
    act(lanes, 3)
    step(lanes, {"x": x(11)}, {"x": 3.0})
    act(lanes, 4)
    step(lanes, {"x": x(12)}, {"x": 4.0})
    [col] = lanes.pop_columns()[1]
    check_column(col, [x(10), x(11), x(12)], [3, 4], [0, 0], [0, 0], [1, 1], 3)


def test_every_agent_done_without_all_ends_the_episode_with_own_flags():
    """RLlib's MultiAgentEpisode ends an episode once every agent in it is done, "__all__" or
    not; each agent keeps its own flag (RLlib would add terminated to a truncated one)."""
    lanes, _ = make_lanes(3, lambda i, aid: 0)
    x, y = (lambda k, n=n: ob(n, k) for n in "xy")
    lanes.start_episode(0, {"x": x(0), "y": y(0)})
    act(lanes, 1)
    # y terminates without a final observation: its last one is repeated.
    assert not step(lanes, {"x": x(1)}, {"x": 1.0, "y": 2.0}, {"y": True})
    act(lanes, 2)
    assert step(lanes, {"x": x(2)}, {"x": 1.0}, truncateds={"x": True})
    [episode] = lanes.pop_episodes()
    assert episode.agent_returns == {"x": 2.0, "y": 2.0} and episode.length == 2
    lanes.start_episode(0, {"x": x(3), "y": y(3)})  # the lanes continue
    act(lanes, 3)
    step(lanes, {"x": x(4), "y": y(4)}, {"x": 5.0, "y": 6.0})
    x_col, y_col = lanes.pop_columns()[0]
    check_column(x_col, [x(0), x(1), x(2), x(3)], [1, 1, 0], [0] * 3, [0, 1, 0], [1, 1, 0], 1)
    check_column(y_col, [y(0), y(0), y(3), y(4)], [2, 0, 6], [1, 0, 0], [0] * 3, [1, 0, 1], 1)


def test_clear_errors():
    lanes, _ = make_lanes(3, lambda i, aid: 0, num_envs=2)
    with pytest.raises(ValueError, match=r"agent 'a' has shape \(3,\), expected \(2,\)"):
        lanes.start_episode(0, {"a": np.zeros(3)})
    with pytest.raises(ValueError, match="has not started"):
        step(lanes, {}, {})
    with pytest.raises(ValueError, match="env_index 2 out of range: 2 envs"):
        lanes.start_episode(2, {"a": ob("a", 0)})
    lanes.start_episode(0, {"a": ob("a", 0), "b": ob("b", 0)})
    with pytest.raises(ValueError, match="still running"):
        lanes.start_episode(0, {"a": ob("a", 0)})
    with pytest.raises(ValueError, match=r"agent_id='c'\): that agent was not asked"):
        lanes.record(0, "c", 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match=r"action of shape \(2,\)"):
        lanes.record(0, "a", np.zeros(2), np.zeros(2), 0)
    lanes.record(0, "a", 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match="'a'.*not asked"):
        lanes.record(0, "a", 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match=r"agents \['b'\] were asked to act"):
        step(lanes, {"a": ob("a", 1)}, {"a": 1.0})
    lanes.record(0, "b", 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match="'b' has shape"):
        step(lanes, {"a": ob("a", 1), "b": np.zeros(5)}, {})
    with pytest.raises(ValueError, match="truncated without a final observation"):
        step(lanes, {"a": ob("a", 1)}, {}, truncateds={"b": True})
    # A step that raised changed nothing: the same step goes through.
    assert not step(lanes, {"a": ob("a", 1)}, {"a": 1.0}, {"b": True})
    lanes.record(0, "a", 0, np.zeros(2), 0)
    with pytest.raises(ValueError, match="an observation for agent 'b', whose episode has ended"):
        step(lanes, {"a": ob("a", 2), "b": ob("b", 1)}, {})
    with pytest.raises(ValueError, match="a reward for agent 'b', whose episode has ended"):
        step(lanes, {"a": ob("a", 2)}, {"b": 1.0})
    assert step(lanes, {"a": ob("a", 2)}, {"a": 1.0, "b": None}, {"__all__": True})
    with pytest.raises(ValueError, match="has ended; reset the env"):
        step(lanes, {}, {})
    bad, _ = make_lanes(3, lambda i, aid: "p0")
    with pytest.raises(ValueError, match=r"returned 'p0', expected a policy index"):
        bad.start_episode(0, {"a": ob("a", 0)})


# -- env adapters ----------------------------------------------------------------------------


class Runners:
    """A PettingZoo-style parallel env, duck-typed: "p" runs ``p_len`` steps and terminates,
    "q" runs ``q_len`` steps and is truncated; each leaves ``agents`` when done. Reward 1 per
    step; the observation is (agent code, step)."""

    possible_agents: list  # declared, as PettingZoo's classes do; set in __init__

    def __init__(self, config=None):
        config = dict(config or {})
        self.lengths = {"p": config.get("p_len", 3), "q": config.get("q_len", 5)}
        self.possible_agents = ["p", "q"]
        self.observation_spaces = {a: gym.spaces.Box(0, 9, (2,), np.float32) for a in "pq"}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in "pq"}
        self.closed = False

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed=None, options=None):
        self.agents, self.t = ["p", "q"], 0
        return {a: np.array([ord(a), 0], np.float32) for a in self.agents}, {}

    def step(self, actions):
        assert set(actions) == set(self.agents)
        self.t += 1
        obs = {a: np.array([ord(a), self.t], np.float32) for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        terms = {a: a == "p" and self.t == self.lengths["p"] for a in self.agents}
        truncs = {a: a == "q" and self.t == self.lengths["q"] for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}

    def close(self):
        self.closed = True


def run_episodes(env, lanes, episodes, rng=None, env_index=0):
    """Random actions for ``episodes`` episodes of ``env`` (an adapter), through ``lanes``;
    returns each episode's acting steps per agent."""
    rng = rng or np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    lanes.start_episode(env_index, obs)
    counts, lengths = {}, []
    while len(lengths) < episodes:
        actions = {}
        for i, aid, _, _ in lanes.requests():
            actions[aid] = int(rng.integers(2))
            lanes.record(i, aid, actions[aid], rng.normal(size=2), len(lengths))
            counts[aid] = counts.get(aid, 0) + 1
        obs, rewards, terms, truncs, _ = env.step(actions)
        assert "__all__" in terms and "__all__" in truncs
        if lanes.step_result(env_index, obs, rewards, terms, truncs):
            lengths.append(counts)
            counts = {}
            obs, _ = env.reset()
            lanes.start_episode(env_index, obs)
    return lengths


@pytest.mark.parametrize("p_len", [3, 5])
def test_parallel_env_adapter(p_len):
    """ "__all__" once no agent is left: truncated when the last step truncates an agent, so that
    agent keeps its bootstrap; p's own termination stays a termination."""
    for made in (
        make_multi_agent_env(Runners, {"p_len": p_len}),
        make_multi_agent_env(lambda config: Runners(config), {"p_len": p_len}),
        make_multi_agent_env(Runners({"p_len": p_len}), {}),
    ):
        assert isinstance(made, MultiAgentEnvAdapter) and made.possible_agents == ["p", "q"]
    env = made
    assert env.observation_space("q").shape == (2,) and env.action_space("p").n == 2
    obs, infos = env.reset(seed=1)
    assert list(obs) == ["p", "q"] and infos == {}
    ends = []
    for _ in range(5):
        _, _, terms, truncs, _ = env.step({a: 0 for a in env.env.agents})
        ends.append((terms["__all__"], truncs["__all__"]))
    assert ends == [(False, False)] * 4 + [(False, True)]
    lanes, _ = make_lanes(2, lambda i, aid: "pq".index(aid))
    lengths = run_episodes(env, lanes, 2)
    assert lengths == [{"p": p_len, "q": 5}] * 2
    assert [e.agent_returns for e in lanes.pop_episodes()] == [{"p": p_len, "q": 5.0}] * 2
    streams = lane_streams(lanes.pop_columns(), 2)
    p, q = streams[0], streams[1]
    np.testing.assert_array_equal(p["valid"][: p_len + 1], [1] * p_len + [0])
    np.testing.assert_array_equal(p["terminated"][: p_len + 1], [0] * (p_len - 1) + [1, 0])
    np.testing.assert_array_equal(q["valid"][:6], [1] * 5 + [0])
    np.testing.assert_array_equal(q["truncated"][:6], [0] * 4 + [1, 0])
    assert not q["terminated"].any()  # q bootstraps from V(its final observation):
    np.testing.assert_array_equal(q["obs"][5], [ord("q"), 5])
    env.close()
    assert env.env.closed


def test_pettingzoo_parallel_env_subclass():
    pettingzoo_env = pytest.importorskip("pettingzoo.utils.env")

    class Runners2(Runners, pettingzoo_env.ParallelEnv):
        metadata = {"name": "runners2"}

    assert is_multi_agent_env(Runners2) and is_multi_agent_env(Runners2())
    env = make_multi_agent_env(Runners2, {})
    lanes, _ = make_lanes(4, lambda i, aid: 0 if aid == "p" else 1)
    lengths = run_episodes(env, lanes, 3)
    assert lengths == [{"p": 3, "q": 5}] * 3
    assert [e.module_returns for e in lanes.pop_episodes()] == [{0: 3.0, 1: 5.0}] * 3


class AECLike:
    possible_agents = ["p"]

    def agent_iter(self):
        return iter(())

    def last(self):
        return None

    def step(self, action):
        pass

    def reset(self, seed=None, options=None):
        pass


class NoAgents:
    possible_agents: list = []

    def step(self, actions):
        return {}, {}, {}, {}, {}

    def reset(self, seed=None, options=None):
        return {}, {}


def test_is_multi_agent_env_and_adapter_errors():
    assert is_multi_agent_env(Runners) and is_multi_agent_env(Runners())
    assert not is_multi_agent_env(gym.make("CartPole-v1"))
    assert not is_multi_agent_env(gym.envs.classic_control.CartPoleEnv)
    assert not is_multi_agent_env(lambda config: Runners(config))
    with pytest.raises(ValueError, match=r"need possible_agents \(the agents that may ever act\)"):
        make_multi_agent_env(NoAgents(), {})
    with pytest.raises(ValueError, match="AEC env.*aec_to_parallel"):
        make_multi_agent_env(AECLike(), {})
    with pytest.raises(ValueError, match="made a CartPoleEnv, which is not a multi-agent env"):
        make_multi_agent_env(lambda config: gym.make("CartPole-v1").unwrapped, {})
    with pytest.raises(ValueError, match="no env is registered under that name"):
        make_multi_agent_env("no-such-multi-agent-env", {})


def test_rllib_multi_agent_cartpole():
    """RLlib's MultiAgentCartPole (2 agents, registered with Ray Tune's register_env) with random
    actions: every valid row's reward is 1, each agent's return is its CartPole episode length
    and the env return their sum."""
    tune_registry = pytest.importorskip("ray.tune.registry")
    ma_classes = pytest.importorskip("ray.rllib.examples.envs.classes.multi_agent")
    tune_registry.register_env(
        "ma_lanes_cartpole", lambda config: ma_classes.MultiAgentCartPole(config)
    )
    assert is_multi_agent_env(ma_classes.MultiAgentCartPole)
    env = make_multi_agent_env("ma_lanes_cartpole", {"num_agents": 2})
    assert env.possible_agents == [0, 1] and env.observation_space(1).shape == (4,)
    lanes = AgentLanes(1, 8, np.zeros(4, np.float32), np.zeros((), np.int64), 2, lambda i, a: a)
    lengths = run_episodes(env, lanes, 10)
    episodes = lanes.pop_episodes()
    assert len(episodes) == 10
    for episode, counts in zip(episodes, lengths, strict=True):
        assert episode.agent_returns == {aid: float(n) for aid, n in counts.items()}
        assert episode.env_return == sum(counts.values()) == episode.agent_steps
        assert episode.length == max(counts.values())  # both act until their pole falls
    assert lanes.agent_steps >= sum(sum(c.values()) for c in lengths)
    columns = lanes.pop_columns()
    assert sorted(columns) == [0, 1]
    for cols in columns.values():
        for col in cols:
            valid = col.valid[:, 0] == 1
            assert (col.reward[valid] == 1.0).all() and (col.reward[~valid] == 0.0).all()
            # CartPole terminates (its time limit is far off with random actions); after a
            # terminated row comes the final observation, valid 0.
            ends = np.flatnonzero(col.terminated[:, 0])
            assert valid[ends].all() and not col.truncated.any()
            assert all(not valid[t + 1] for t in ends if t + 1 < len(valid))
    env.close()
