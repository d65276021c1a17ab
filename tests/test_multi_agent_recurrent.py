"""Recurrent policies (model_config use_lstm) in multi-agent runs: a hand-built two-agent episode
whose lanes' recurrent fields are checked row by row, the sampler's stacked act against one
policy's RecurrentActor stepped on a lane alone, the learner's unroll over engine batches
reproducing the behaviour logits, a short MultiAgentStatelessCartPole training run, and RLlib's
tuned multi_agent_stateless_cartpole_impala.py with its import swapped.

The lanes' other fields are tested in test_multi_agent_lanes.py, the recurrent core in
test_recurrent.py."""

from __future__ import annotations

import zlib

import gymnasium as gym
import jax
import numpy as np
import pytest
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentStatelessCartPole

from impala_jax.core.distributions import make_distribution
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG
from impala_jax.core.policy import RecurrentActor, make_act_fns
from impala_jax.core.recurrent import make_recurrent_networks
from impala_jax.runtime.multiagent.envs import make_multi_agent_env
from impala_jax.runtime.multiagent.lanes import AgentLanes, RecurrentLayout
from impala_jax.runtime.multiagent.sampler import MultiAgentSampler, StackedActor
from tests.test_multi_agent import ma_config
from tests.test_multi_agent_lanes import action_of, ob, step

# -- lanes: the recurrent fields row by row ----------------------------------------------------


def initial_state(n):
    """A state pytree of two leaves, not zeros: a reset to it is visible in the stored states."""
    return {"c": np.full((n, 2), -1.0, np.float32), "h": np.full((n, 3), -2.0, np.float32)}


def state_after(obs):
    """The state the fake act returns after acting at ``obs``: it names the observation."""
    return {"c": np.asarray(obs, np.float32), "h": np.full(3, action_of(obs), np.float32)}


def leaves(state):
    return jax.tree.leaves(state)


def act_recurrent(lanes, version):
    """Records an action and the state after it for every request, checking the carry the agent
    acts from against the row it stands on."""
    for env_index, aid, _, obs in lanes.requests():
        core, prev_action, prev_reward, reset = lanes.carry(env_index, aid)
        lane = lanes._episodes[env_index].members[aid]
        frag, t = lane.frag, lane.t
        assert (prev_action, prev_reward, reset) == (
            frag.prev_action[t, 0],
            frag.prev_reward[t, 0],
            frag.reset[t, 0],
        )
        if reset:  # an agent's episode starts from the initial state
            for x, init in zip(core, leaves(initial_state(1)), strict=True):
                np.testing.assert_array_equal(x, init[0])
        lanes.record(env_index, aid, action_of(obs), obs.copy(), version, leaves(state_after(obs)))


def check_recurrent(col, prev_obs, prev_reward, reset, stored):
    """A B=1 column's recurrent fields: ``prev_obs[t]`` is the observation the agent acted at in
    the row before (None: no action, 0), ``stored[k]`` the observation whose act's state is
    kept before row k * L (None: the initial state)."""
    prev_action = [0 if o is None else action_of(o) for o in prev_obs]
    np.testing.assert_array_equal(col.prev_action[:, 0], prev_action, err_msg="prev_action")
    np.testing.assert_array_equal(col.prev_reward[:, 0], prev_reward, err_msg="prev_reward")
    np.testing.assert_array_equal(col.reset[:, 0], reset, err_msg="reset")
    assert col.prev_reward.dtype == np.float32 and col.reset.dtype == bool
    init = initial_state(1)
    for k, o in enumerate(stored):
        want = jax.tree.map(lambda x: x[0], init) if o is None else state_after(o)
        for name in ("c", "h"):
            np.testing.assert_array_equal(col.core_state[name][k, 0], want[name], f"{name}[{k}]")
    assert col.core_state["c"].shape == (len(stored), 1, 2)


def test_hand_built_episode_recurrent_fields_row_by_row():
    """T=4, L=2: states kept before rows 0, 2, 4. Episode 1: "a" acts three times and
    terminates (final observation a3 on row 3); "b" gets no observation in step 2 (its rewards
    of steps 2 and 3 add up on row 1) and is truncated in step 3 (final observation b2 on row 2,
    a chunk start: it keeps the episode's state). Episode 2 starts "a" on row 4 (the bootstrap
    row) and "b" on row 3, inside its fragment: reset rows with no previous action or reward,
    from the initial state."""
    layout = RecurrentLayout(initial_state, max_seq_len=2)
    mapping = {"a": 0, "b": 1}
    lanes = AgentLanes(
        1, 4, np.zeros(2, np.float32), np.zeros((), np.int32), 2,
        lambda i, aid: mapping[aid], recurrent=layout,
    )  # fmt: skip
    a, b = (lambda k, n=n: ob(n, k) for n in "ab")
    lanes.start_episode(0, {"a": a(0), "b": b(0)})
    script = [  # obs, rewards, terminateds, truncateds
        ({"a": a(1), "b": b(1)}, {"a": 1, "b": 10}, {}, {}),
        ({"a": a(2)}, {"a": 2, "b": 20}, {}, {}),
        ({"a": a(3), "b": b(2)}, {"a": 3, "b": 30}, {"a": True}, {"b": True}),
    ]
    for n, (obs, rewards, terms, truncs) in enumerate(script, start=1):
        act_recurrent(lanes, version=n)
        assert step(lanes, obs, rewards, terms, truncs) == (n == 3)
    assert lanes.pop_columns() == {}
    lanes.start_episode(0, {"a": a(10), "b": b(10)})
    for n in range(4, 9):
        act_recurrent(lanes, version=n)
        k = 10 + n - 3
        assert not step(lanes, {"a": a(k), "b": b(k)}, {"a": n, "b": 10 * n})
    columns = lanes.pop_columns()
    (a1, a2), (b1, b2) = columns[0], columns[1]
    np.testing.assert_array_equal(a1.obs[:, 0], [a(0), a(1), a(2), a(3), a(10)])
    check_recurrent(a1, [None, a(0), a(1), a(2), None], [0, 1, 2, 3, 0],
                    [1, 0, 0, 0, 1], [None, a(1), None])  # fmt: skip
    np.testing.assert_array_equal(a2.obs[:, 0], [a(10), a(11), a(12), a(13), a(14)])
    check_recurrent(a2, [None, a(10), a(11), a(12), a(13)], [0, 4, 5, 6, 7],
                    [1, 0, 0, 0, 0], [None, a(11), a(13)])  # fmt: skip
    np.testing.assert_array_equal(b1.obs[:, 0], [b(0), b(1), b(2), b(10), b(11)])
    np.testing.assert_array_equal(b1.valid[:, 0], [1, 1, 0, 1])
    check_recurrent(b1, [None, b(0), b(1), None, b(10)], [0, 10, 50, 0, 40],
                    [1, 0, 0, 1, 0], [None, b(1), b(10)])  # fmt: skip
    np.testing.assert_array_equal(b2.obs[:, 0], [b(11), b(12), b(13), b(14), b(15)])
    check_recurrent(b2, [b(10), b(11), b(12), b(13), b(14)], [40, 50, 60, 70, 80],
                    [0] * 5, [b(10), b(12), b(14)])  # fmt: skip
    for first, second in ((a1, a2), (b1, b2)):  # row T of a column is row 0 of the next one
        for name in ("prev_action", "prev_reward", "reset"):
            np.testing.assert_array_equal(getattr(first, name)[-1], getattr(second, name)[0])


def test_a_policy_switch_pads_with_initial_states_and_restarts_the_lane():
    policy = {"x": 0}
    layout = RecurrentLayout(initial_state, max_seq_len=2)
    lanes = AgentLanes(
        1, 4, np.zeros(2, np.float32), np.zeros((), np.int32), 2,
        lambda i, aid: policy[aid], recurrent=layout,
    )  # fmt: skip
    x = lambda k: ob("x", k)  # noqa: E731
    lanes.start_episode(0, {"x": x(0)})
    act_recurrent(lanes, 1)
    step(lanes, {"x": x(1)}, {"x": 1.0})
    act_recurrent(lanes, 2)
    assert step(lanes, {"x": x(2)}, {"x": 2.0}, {"x": True})
    policy["x"] = 1
    lanes.start_episode(0, {"x": x(10)})
    [early] = lanes.pop_columns()[0]
    # Rows 3 and 4 pad after the final observation (row 2, which keeps the episode's state).
    check_recurrent(early, [None, x(0), x(1), None, None], [0, 1, 2, 0, 0],
                    [1, 0, 0, 0, 0], [None, x(1), None])  # fmt: skip
    [(_, _, p, _)] = lanes.requests()
    assert p == 1
    assert lanes.carry(0, "x")[3]  # the new policy's fragment starts with a reset row


def test_record_takes_a_state_exactly_for_a_recurrent_policy():
    lanes = AgentLanes(
        1, 2, np.zeros(2, np.float32), np.zeros((), np.int32), 2, lambda i, aid: 0,
        recurrent=RecurrentLayout(initial_state, 2),
    )  # fmt: skip
    lanes.start_episode(0, {"x": ob("x", 0)})
    with pytest.raises(ValueError, match="core"):
        lanes.record(0, "x", 0, np.zeros(2), 0)
    feedforward = AgentLanes(
        1, 2, np.zeros(2, np.float32), np.zeros((), np.int32), 2, lambda i, aid: 0
    )
    feedforward.start_episode(0, {"x": ob("x", 0)})
    with pytest.raises(ValueError, match="core"):
        feedforward.record(0, "x", 0, np.zeros(2), 0, leaves(state_after(ob("x", 0))))


# -- the sampler's stacked act -------------------------------------------------------------------

MODEL = {
    **DEFAULT_MODEL_CONFIG,
    "use_lstm": True,
    "lstm_cell_size": 8,
    "fcnet_hiddens": [16],
    "max_seq_len": 3,
    "lstm_use_prev_action": True,
    "lstm_use_prev_reward": True,
}


class Recorded:
    """An env whose resets and steps the test sees: the last observation of each agent, and
    per agent the carry a lone RecurrentActor acts from (its own state, previous action and
    reward, reset flag)."""

    def __init__(self, env, actor):
        self.env, self.actor = env, actor
        self.obs, self.carry = {}, {}

    def reset(self, seed=None):
        obs, infos = self.env.reset(seed=seed)
        self.obs = dict(obs)
        state = self.actor.initial_state(1)
        self.carry = {aid: (state, np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, bool))
                      for aid in obs}  # fmt: skip
        return obs, infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self.obs.update(obs)
        for aid, r in rewards.items():
            state, a, _, reset = self.carry[aid]
            self.carry[aid] = (state, a, np.asarray([r], np.float32), reset)
        return obs, rewards, terms, truncs, infos

    def close(self):
        self.env.close()


def perturbed(params, seed):
    """``params`` plus noise: logits of order 1 (the initial policy head's are near 0), so that
    a tolerance of 1e-6 means something."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: x + rng.normal(0, 0.5, x.shape).astype(np.float32), params)


def test_the_stacked_act_equals_one_policys_recurrent_actor_on_each_lane_alone():
    """Two policies, two envs of two agents (MultiAgentStatelessCartPole): at every step each
    agent's distribution inputs from the one vmapped call over [M, C] equal those of its
    policy's RecurrentActor stepped on that agent alone, with a carry the test keeps from the
    env's own outputs (the sampler's actions fed back)."""
    space_obs, space_act = gym.spaces.Box(-10, 10, (2,), np.float32), gym.spaces.Discrete(2)
    nets = make_recurrent_networks(MODEL, space_obs, space_act)
    distribution = make_distribution(space_act, MODEL)
    lone = RecurrentActor(nets, distribution, nets.max_seq_len)
    params = [perturbed(nets.init(jax.random.key(k)), k) for k in (1, 2)]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *params)
    envs = [
        Recorded(make_multi_agent_env(MultiAgentStatelessCartPole, {"num_agents": 2}), lone)
        for _ in range(2)
    ]
    sampler = MultiAgentSampler(
        envs, 5, np.zeros(2, np.float32), np.zeros((), np.int32), nets.dist_size,
        lambda aid, episode: aid, StackedActor.of(*make_act_fns(nets, distribution), True),
        2, jax.random.key(0), seed=0, to_env=lambda actions: [int(a) for a in actions],
        recurrent=RecurrentLayout(lone.initial_state, nets.max_seq_len),
    )  # fmt: skip
    record, checked, resets = sampler.lanes.record, [0], [0]

    def checked_record(env_index, aid, action, dist_inputs, version, core):
        env = envs[env_index]
        state, prev_action, prev_reward, reset = env.carry[aid]
        obs = np.asarray(env.obs[aid], np.float32)[None]
        _, want, state = lone.greedy(params[aid], obs, env.carry[aid])
        np.testing.assert_allclose(dist_inputs, np.asarray(want)[0], rtol=1e-6, atol=1e-6)
        for x, y in zip(core, jax.tree.leaves(state), strict=True):
            np.testing.assert_allclose(x, np.asarray(y)[0], rtol=1e-6, atol=1e-6)
        env.carry[aid] = (state, np.asarray([action], np.int32), prev_reward, np.zeros(1, bool))
        checked[0] += 1
        resets[0] += int(reset[0])
        record(env_index, aid, action, dist_inputs, version, core)

    sampler.lanes.record = checked_record
    for _ in range(60):
        sampler.step(stacked, 0)
    assert checked[0] > 150 and resets[0] > 4  # several episodes per lane


# -- the learner's unroll over engine batches ------------------------------------------------------


class TurnsEnv:
    """Three agents: "a" and "b" from the start, "c" joining later. In each env step some of them
    observe (the others' rewards hang until their next observation) and each ends on its own,
    terminated or truncated, with its final observation; the env ends when all have."""

    possible_agents = ["a", "b", "c"]

    def __init__(self, config=None):
        self.rng = np.random.default_rng(int((config or {}).get("seed", 0)))
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))

    def _obs(self, aid):
        return np.array([ord(aid) - ord("b"), self.rng.normal()], np.float32)

    def reset(self, *, seed=None, options=None):
        self.live, self.joined = ["a", "b"], {"a", "b"}
        return {aid: self._obs(aid) for aid in self.live}, {}

    def step(self, actions):
        rng = self.rng
        rewards = {aid: float(rng.integers(-3, 4)) for aid in self.live}
        obs, terms, truncs = {}, {}, {}
        for aid in list(self.live):
            if rng.random() < 0.6:
                obs[aid] = self._obs(aid)
                if rng.random() < 0.1:
                    (terms if rng.random() < 0.5 else truncs)[aid] = True
                    self.live.remove(aid)
        if "c" not in self.joined and rng.random() < 0.2:
            self.joined.add("c")
            self.live.append("c")
            obs["c"] = self._obs("c")
        if self.live and not any(aid in obs for aid in self.live):
            obs[self.live[0]] = self._obs(self.live[0])  # someone acts in the next step
        terms["__all__"], truncs["__all__"] = not self.live, False
        return obs, rewards, terms, truncs, {}


def episode_policy(agent_id, episode, **kwargs):
    """p0 or p1 by a hash of (agent, episode): agents switch policies between episodes."""
    return f"p{zlib.crc32(f'{agent_id}/{episode.id_}'.encode()) % 2}"


@pytest.mark.timeout(240)
def test_the_learners_unroll_over_engine_batches_reproduces_the_behaviour_logits():
    """On policy (no update in between), each policy's unroll of its [T+1, C] slice of an engine
    batch (core_state [M, K, C, cell]) gives the logits its agents acted with, on every valid
    row: the states, resets, previous actions and rewards of the lanes (agents skipping turns,
    their rewards hanging, episodes ending inside fragments, policies switching) are those the
    actors used. Params perturbed, so logits are of order 1."""
    model = {k: MODEL[k] for k in ("use_lstm", "lstm_cell_size", "fcnet_hiddens", "max_seq_len")}
    model.update(lstm_use_prev_action=True, lstm_use_prev_reward=True)
    config = (
        ma_config(rollout_fragment_length=5, num_envs_per_env_runner=3)
        .environment(TurnsEnv, env_config={"seed": 4})
        .rl_module(model_config=model)
        .multi_agent(policy_mapping_fn=episode_policy)
        .training(train_batch_size_per_learner=20)
    )
    with config.build() as algo:
        algo.set_weights(
            {pid: perturbed(w, i) for i, (pid, w) in enumerate(algo.get_weights().items())}
        )
        engine, nets = algo.engine, algo.networks
        params = jax.device_get(algo.learner.state.params)
        checked = resets = 0
        for _ in range(6):
            for _ in range(40):
                engine._take(engine._next_output())
            batch, _ = engine._batch()
            K, C = 5 // 3 + 1, batch.obs.shape[2]  # states kept per column, columns
            assert jax.tree.leaves(batch.core_state)[0].shape == (2, K, C, 8)
            for m in range(2):
                one = jax.tree.map(lambda x, m=m: x[m], batch)
                logits, _ = nets.unroll(
                    jax.tree.map(lambda x, m=m: x[m], params), one.core_state, one.obs,
                    one.prev_action, one.prev_reward, one.reset, nets.max_seq_len,
                )  # fmt: skip
                valid = one.valid == 1
                np.testing.assert_allclose(
                    np.asarray(logits)[:-1][valid], one.behaviour_logits[valid],
                    rtol=1e-5, atol=1e-5,
                )  # fmt: skip
                checked += int(valid.sum())
                resets += int(one.reset[1:-1].sum())  # inside fragments
        assert checked > 300 and resets > 5


# -- training -------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_multi_agent_stateless_cartpole_trains_a_recurrent_policy_per_agent(num_env_runners):
    model = {k: MODEL[k] for k in ("use_lstm", "lstm_cell_size", "fcnet_hiddens", "max_seq_len")}
    config = (
        ma_config(num_env_runners=num_env_runners)
        .environment(MultiAgentStatelessCartPole, env_config={"num_agents": 2})
        .rl_module(model_config=model)
    )
    config.validate()  # use_lstm with multi_agent() is no longer an error
    with config.build() as algo:
        assert algo.recurrent
        results = [algo.train() for _ in range(2)]
        result = results[-1]
        assert set(result["env_runners"]["module_episode_returns_mean"]) == {"p0", "p1"}
        assert set(result["env_runners"]["agent_episode_returns_mean"]) == {"0", "1"}
        for pid in ("p0", "p1"):
            learner = result["learners"][pid]
            assert np.isfinite(learner["total_loss"]) and learner["num_updates_lifetime"] >= 2
        obs = np.zeros(2, np.float32)
        initial = algo.get_initial_state(policy_id="p1")
        action, state, extra = algo.compute_single_action(
            obs, initial, policy_id="p1", explore=False
        )
        assert jax.tree.structure(initial) == jax.tree.structure(state)
        assert int(action) in (0, 1) and extra["action_dist_inputs"].shape == (2,)
        again = algo.compute_single_action(obs, state, policy_id="p1", prev_action=action)
        assert jax.tree.structure(again[1]) == jax.tree.structure(state)
        with pytest.raises(ValueError, match="recurrent one"):
            algo.get_module("p0")
