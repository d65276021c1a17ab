"""Craftax on device (``environment("craftax:<id>")``): the adapter against Craftax stepped
directly, the per-episode metrics of the rollout, their reduction to success rates and the
Crafter score, and an IMPALA run that reports them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from impala_jax import IMPALAConfig
from impala_jax.core.rollout import reset_envs, step_envs, step_keys
from impala_jax.runtime.envs.craftax_envs import crafter_score
from impala_jax.runtime.envs.env_registry import choose_env, is_jax_env, make_jax_env
from impala_jax.runtime.metrics import EpisodeStats
from impala_jax.runtime.ondevice.device_engine import (
    ended_episode_metrics,
    ended_episodes,
    gathered_episodes,
)
from impala_jax.runtime.process import collectives

CLASSIC = "craftax:Craftax-Classic-Symbolic-v1"


def test_crafter_score_by_hand():
    """Hafner 2021, eq. 1: exp(mean ln(1 + s_i)) - 1 over success rates in percent."""
    assert crafter_score([0.0, 0.0]) == 0.0
    assert crafter_score([100.0] * 22) == pytest.approx(100.0)
    # (1 + 3) * (1 + 15) = 64, sqrt(64) - 1 = 7: a geometric, not an arithmetic, mean (9).
    assert crafter_score([3.0, 15.0]) == pytest.approx(7.0)
    assert math.isnan(crafter_score([]))


def test_the_craftax_ids_train_on_device_and_a_wrong_one_names_them():
    assert is_jax_env("craftax:Craftax-Symbolic-v1") and is_jax_env(CLASSIC)
    assert choose_env(CLASSIC).backend == "craftax"
    with pytest.raises(ValueError, match="craftax:Craftax-Symbolic-v1"):
        choose_env("craftax:Craftax-Symbolc-v1")


class Counter:
    """A JaxEnv whose episodes last 3 steps, and whose episode metrics are the steps taken and
    how many of them with action 1 (its state: (steps, ones))."""

    def reset(self, key):
        return jnp.zeros(1, jnp.float32), (jnp.int32(0), jnp.int32(0))

    def step(self, key, state, action):
        t, ones = state
        state = (t + 1, ones + (action == 1).astype(jnp.int32))
        return jnp.zeros(1, jnp.float32), state, jnp.float32(1.0), state[0] >= 3, jnp.bool_(False)

    def episode_metrics(self, state):
        return {"ones": state[1].astype(jnp.float32), "steps": state[0].astype(jnp.float32)}


def test_the_rollout_records_episode_metrics_of_the_final_state_only_where_episodes_end():
    env, B = Counter(), 2
    carry = reset_envs(env, jax.random.key(0), B)
    rows = []
    actions = [[1, 0], [1, 1], [0, 1], [1, 1], [1, 0], [1, 1], [0, 0], [1, 1]]
    for a in actions:
        carry, keys = step_keys(carry)
        carry, *_, episodes = step_envs(env, carry, jnp.asarray(a, jnp.int32), keys)
        rows.append(episodes)
    drained = [jax.tree.map(lambda *xs: np.stack(xs), *rows)]
    # Episodes of 3 steps, a reset row after each: rows 0-2, 4-6 end at rows 2 and 6.
    np.testing.assert_array_equal(drained[0].ended[:, 0], [0, 0, 1, 0, 0, 0, 1, 0])
    assert ended_episodes(drained) == [(3.0, 3), (3.0, 3), (3.0, 3), (3.0, 3)]
    metrics = ended_episode_metrics(drained)
    # Rows 0-2: env 0 took actions 1, 1, 0 (two ones), env 1 0, 1, 1 (two); row 3 resets (its
    # actions ignored); rows 4-6: env 0 1, 1, 0 (two), env 1 0, 1, 0 (one).
    np.testing.assert_array_equal(metrics["ones"], [2, 2, 2, 1])
    np.testing.assert_array_equal(metrics["steps"], [3, 3, 3, 3])
    # Not ended: zeros.
    assert float(np.abs(drained[0].metrics["ones"][~drained[0].ended]).sum()) == 0.0


def test_episodes_split_over_devices_are_gathered_in_one_device_order(monkeypatch):
    """What several processes report (``gathered_episodes``: each reads its own devices' envs,
    then the rows are gathered and sorted) equals one process reading all envs, metrics too:
    here the env axis of 4 envs split over 2 devices, so env 2's episodes live on device 1 at
    its column 0 (a wrong shard offset or order would swap them)."""
    env, B = Counter(), 4
    carry = reset_envs(env, jax.random.key(0), B)
    drained = []
    actions = np.random.default_rng(0).integers(0, 2, (2, 7, B))
    for update in actions:
        rows = []
        for a in update:
            carry, keys = step_keys(carry)
            carry, *_, episodes = step_envs(env, carry, jnp.asarray(a, jnp.int32), keys)
            rows.append(episodes)
        drained.append(jax.tree.map(lambda *xs: np.stack(xs), *rows))
    split = NamedSharding(Mesh(jax.devices()[:2], ("envs",)), PartitionSpec(None, "envs"))
    on_devices = [jax.device_put(e, split) for e in drained]
    assert len(on_devices[0].ended.addressable_shards) == 2
    # The rows through the collectives' encoding, which one process skips.
    sent = []

    def allgather_rows(rows, what):
        sent.append(rows)
        return collectives.from_int32_words(collectives.to_int32_words(rows))

    monkeypatch.setattr(collectives, "allgather_rows", allgather_rows)
    episodes, metrics = gathered_episodes(on_devices)
    assert episodes == ended_episodes(drained) and len(episodes) == 12
    expected = ended_episode_metrics(drained)
    assert sorted(metrics) == ["ones", "steps"]
    for name in metrics:
        np.testing.assert_array_equal(metrics[name], expected[name])
        assert metrics[name].dtype == expected[name].dtype
    assert len(set(metrics["ones"].tolist())) > 1  # the order is checked, not only the set


def test_episode_stats_reduce_achievements_to_success_rates_over_the_window():
    """Three episodes' achievements (100 = unlocked) and a window of 2: the last two count."""
    summarize_got = {}

    def summarize(means):
        summarize_got.update(means)
        return {"score": crafter_score([means["achievements/a"], means["achievements/b"]])}

    stats = EpisodeStats(2, summarize)
    stats.add([(1.0, 10)], {"achievements/a": [100.0], "achievements/b": [0.0]})
    stats.add(
        [(2.0, 20), (4.0, 40)], {"achievements/a": [0.0, 100.0], "achievements/b": [0.0, 100.0]}
    )
    result = stats.result(2, 60)
    assert result["achievements"] == {"a": 50.0, "b": 50.0}
    assert result["episode_return_mean"] == 3.0
    assert summarize_got["episode_return_mean"] == 3.0
    assert result["score"] == pytest.approx(50.0)
    restored = EpisodeStats(2, summarize)
    restored.set_state(stats.get_state())
    assert restored.result(0, 0)["achievements"] == result["achievements"]


def _direct(env, keys, actions):
    """Craftax's own reset_env and step_env, with this adapter's layout by hand: the step after
    a done step is a reset with the reset key, reward 0 and no flags."""
    raw, params = env._env, env.params
    reset_env = jax.jit(lambda k: raw.reset_env(k, params))
    step_env = jax.jit(lambda k, s, a: raw.step_env(k, s, a, params)[:4])
    obs, state = reset_env(keys[0])
    out, prev_done = [], False
    for t in range(len(actions)):
        if prev_done:
            obs, state = reset_env(keys[t + 1][1])
            reward, done, time_up = 0.0, False, False
        else:
            obs, state, reward, done = step_env(keys[t + 1][0], state, actions[t])
            time_up = bool(state.timestep >= params.max_timesteps) and not bool(
                state.player_health <= 0
            )
        out.append((np.asarray(obs), float(reward), bool(done) and not time_up, time_up))
        prev_done = bool(done)
    return out


@pytest.mark.slow
def test_the_adapter_steps_as_craftax_itself_with_the_same_keys():
    """Craftax-Classic with a time limit of 5 steps: observations, rewards, the time limit as a
    truncation, and the next-step autoreset, against Craftax's reset_env and step_env."""
    env = make_jax_env(CLASSIC, {"max_timesteps": 5})
    T = 13
    carry = reset_envs(env, jax.random.key(1), 1)
    actions = np.random.default_rng(0).integers(0, 17, T).astype(np.int32)

    @jax.jit
    def rollout(carry):
        def row(carry, a):
            carry, keys = step_keys(carry)
            obs_keys = keys[0]
            carry, reward, terminated, truncated, _ = step_envs(env, carry, a[None], keys)
            return carry, (carry.obs[0], reward[0], terminated[0], truncated[0], obs_keys)

        return jax.lax.scan(row, carry, jnp.asarray(actions))

    # reset_envs' key of env 0, then each row's (step, reset) keys from step_keys.
    first_key = jax.vmap(jax.random.split)(jax.random.split(jax.random.key(1), 1))[0, 1]
    _, (obs, reward, terminated, truncated, keys) = rollout(carry)
    keys = [first_key] + [(k[1], k[2]) for k in keys]
    want = _direct(env, keys, [int(a) for a in actions])
    for t, (o, r, te, tr) in enumerate(want):
        np.testing.assert_array_equal(np.asarray(obs[t]), o.astype(np.float32), err_msg=f"row {t}")
        assert float(reward[t]) == pytest.approx(r), t
        assert (bool(terminated[t]), bool(truncated[t])) == (te, tr), t
    assert bool(truncated[4]) and not bool(truncated[5])  # the limit, then the reset row


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_impala_on_craftax_reports_the_achievements_and_scores():
    """A few iterations on Craftax-Classic-Symbolic (the full game's program takes minutes to
    compile; the metrics' path is the same) with a short time limit, so episodes end."""
    config = (
        IMPALAConfig()
        .environment(CLASSIC, env_config={"max_timesteps": 20})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=16)
        .training(train_batch_size_per_learner=64, lr=1e-3)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
        .debugging(seed=0)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
    runners = results[-1]["env_runners"]
    assert runners["num_episodes_lifetime"] >= 4
    achievements = runners["achievements"]
    assert len(achievements) == 22 and "collect_wood" in achievements
    assert all(0.0 <= v <= 100.0 for v in achievements.values())
    assert runners["crafter_score"] == pytest.approx(
        crafter_score(list(achievements.values())), rel=1e-6
    )
    assert runners["episode_return_pct_of_max"] == pytest.approx(
        100 * runners["episode_return_mean"] / 22
    )
