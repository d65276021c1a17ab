"""IMPALA on device for envs written in JAX (``"gymnax:<id>"``): the rollout's layout against
the host runner's, the policy lag, devices, determinism, learning and the algorithm's surface."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core.rollout import make_rollout, reset_envs
from impala_jax.rllib import diagnostics, specs
from impala_jax.runtime.acting.env_runner import EnvRunner, ParamStore
from impala_jax.runtime.envs.env_registry import make_jax_env
from tests.test_fragment_door import saturate

ENV = "gymnax:CartPole-v1"


def _small(lag=None, num_learners=0, seed=3) -> IMPALAConfig:
    """16 envs x 20 steps, one minibatch of two rollouts per update, no replay."""
    return (
        IMPALAConfig()
        .environment(ENV)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=16,
            rollout_fragment_length=20,
            policy_lag=lag,
        )
        .training(
            train_batch_size_per_learner=640 // max(1, num_learners),
            minibatch_size=640,
            num_epochs=1,
            lr=0.01,
        )
        .learners(num_learners=num_learners)
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
        .debugging(seed=seed)
    )


def _train(config, iterations: int):
    with config.build() as algo:
        results = [algo.train() for _ in range(iterations)]
        params = jax.device_get(algo.learner.state.params)
    return results, params


def _leaves_equal(a, b) -> bool:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(np.array_equal(x, y) for x, y in pairs)


def test_host_and_device_rollouts_give_identical_trajectories():
    """The same gymnax envs (same keys) and the same actions, stepped by the host runner
    through its adapter and by the compiled rollout, give the same fragments row for row:
    observations, bootstrap rows, rewards, both flags and the reset rows' masks."""
    T, n, seed = 25, 6, 5
    config = IMPALAConfig().environment(ENV)
    config = config.env_runners(num_env_runners=0, num_envs_per_env_runner=n)
    config = config.env_runners(rollout_fragment_length=T)
    params = {"unused": jnp.zeros(1)}

    def host_act(params, obs, key):  # pushes the cart the way it moves: episodes end soon
        obs = np.asarray(obs)
        return (obs[:, 1] > 0).astype(np.int32), obs[:, :2].copy(), key

    def device_policy(params, obs, keys, policy_carry=()):
        return (obs[:, 1] > 0).astype(jnp.int32), obs[:, :2], None

    runner = EnvRunner(
        specs.runner_spec(config),
        0,
        host_act,
        host_act,
        ParamStore(params, jax.devices()[0]),
        seed=seed,
    )
    env = make_jax_env(ENV)
    rollout = jax.jit(make_rollout(env, device_policy, lambda a: a, T))
    carry = reset_envs(env, jax.random.key(seed), n)
    device_episodes = []
    try:
        for _ in range(4):
            (host,) = runner.sample()
            carry, device, episodes = rollout(params, carry)
            for field in ("obs", "action", "behaviour_logits", "reward", "terminated"):
                np.testing.assert_array_equal(getattr(host, field), getattr(device, field), field)
            for field in ("truncated", "valid"):
                np.testing.assert_array_equal(getattr(host, field), getattr(device, field), field)
            ended = np.asarray(episodes.ended)
            rows, cols = np.nonzero(ended)
            device_episodes += list(
                zip(
                    np.asarray(episodes.episode_return)[rows, cols].tolist(),
                    np.asarray(episodes.episode_len)[rows, cols].tolist(),
                    strict=True,
                )
            )
            assert (host.valid == 0).any() and host.terminated.any()  # resets were compared
        assert runner.episodes.drain() == device_episodes
    finally:
        runner.close()


def test_lag_zero_acts_with_the_params_being_updated():
    """Policy lag 0: every importance weight of the one minibatch is exactly 1 at every update
    (max and mean rho 1, and the behaviour and target logits bit-equal: a KL of exactly 0); the
    reported lag is 0.

    With 64 envs: XLA:CPU multiplies a matrix of fewer than 64 rows with another kernel, whose
    rounding differs by an ulp from the one the learner's larger batch gets (measured: rho
    within 4.8e-7 of 1 with 16 or 32 envs; exactly 1 with 64 or 128), so there the acting and
    the learning forward pass of the same params are not bit-equal (docs/config.md)."""
    config = _small(lag=0).env_runners(num_envs_per_env_runner=64, rollout_fragment_length=10)
    results, _ = _train(config, 6)
    for result in results:
        learner = result["learners"]["default_policy"]
        assert learner["max_rho"] == 1.0 and learner["mean_rho"] == 1.0, learner
        assert learner["mean_kl"] == 0.0, learner
        assert result["perf"]["policy_lag_max"] == 0


@pytest.mark.parametrize("env", ["CartPole-v1", ENV])
def test_mixin_replays_empty_slots_are_not_averaged_into_the_first_result(env):
    """Issue 56: with mixin replay the first update's replayed columns are slots still empty;
    as their own minibatch they were averaged in as rho 0 (mean_rho 0.5, entropy ln 2 / 2 on
    the first result of an on-policy run), on device and on the host alike."""
    config = _small(lag=0 if env == ENV else None).environment(env)
    # 32 new columns and 32 replayed ones, in two unshuffled minibatches: the new, the replayed.
    config = config.training(replay_proportion=1.0, replay_buffer_num_slots=64)
    (result,), _ = _train(config, 1)
    learner = result["learners"]["default_policy"]
    # On policy (lag 0 on device; the host's lockstep acts with the params being updated):
    # 1 within float rounding (rho within 4.8e-7 of 1 with 16 envs: docs/config.md).
    assert abs(learner["mean_rho"] - 1.0) < 1e-5 and abs(learner["max_rho"] - 1.0) < 1e-5
    assert learner["entropy"] > 0.69  # a fresh policy's, about ln 2


def test_on_policy_rounding_is_not_counted_as_clipping():
    """Issue 56: at lag 0 with 16 envs the acting forward pass rounds a few logits an ulp
    apart from the learner's (rho up to 1 + 1.2e-7), and those rows were counted in
    clipped_rho_fraction (0.013 and 0.006 here; 0.35-0.47 at max_rho 1.001 on a GPU)."""
    results, _ = _train(_small(lag=0), 3)
    learners = [r["learners"]["default_policy"] for r in results]
    assert max(learner["max_rho"] for learner in learners) > 1.0  # the rounding is there
    assert all(learner["clipped_rho_fraction"] == 0.0 for learner in learners), learners


def _warnings_of(config, iterations: int) -> tuple[list[str], list[dict]]:
    with warnings.catch_warnings(record=True) as caught, config.build() as algo:
        warnings.simplefilter("always")
        results = [algo.train() for _ in range(iterations)]
    return [str(w.message) for w in caught if w.category is RuntimeWarning], results


@pytest.mark.parametrize("env", ["CartPole-v1", ENV])
def test_an_lr_far_too_large_is_warned_about_once_and_the_default_is_not(env):
    """Issue 56: lr=1e3 (Adam) took the loss from 27 to 1e8-1e10 and the entropy to 0 by the
    second update, every gradient finite and nothing said, on device and on the host."""
    config = (
        IMPALAConfig()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=10)
        .training(train_batch_size_per_learner=80)
        .rl_module(model_config={"fcnet_hiddens": [32, 32]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
        .debugging(seed=3)
    )
    messages, results = _warnings_of(config.training(lr=1e3), 4)
    learner = results[-1]["learners"]["default_policy"]
    assert learner["num_non_finite_updates"] == 0 and learner["entropy"] < 1e-3, learner
    (message,) = [m for m in messages if "updates are too large" in m]
    for needed in ("training(lr=1000.0)", "training(lr=10)", "entropy fell from 100%"):
        assert needed in message, message
    default_lr = IMPALAConfig().lr
    messages, _ = _warnings_of(config.training(lr=default_lr), diagnostics.EARLY_UPDATES + 2)
    assert not [m for m in messages if "too large" in m or "collapsed" in m], messages


def test_a_dead_policy_is_reported_on_device_as_on_the_host():
    """tests/test_fragment_door.py's forced saturation, on device: the same report, once."""
    config = _small(lag=0).training(entropy_coeff=0.0, lr=1e-9)
    with warnings.catch_warnings(record=True) as caught, config.build() as algo:
        warnings.simplefilter("always")
        for _ in range(2):
            algo.train()
        algo._dead_policy.best_return = 200.0  # as if it had learned, then saturate it
        algo.set_weights({"default_policy": saturate(algo.get_weights()["default_policy"])})
        for _ in range(2 + diagnostics.DEAD_POLICY_ITERATIONS):
            algo.train()
    assert len([w for w in caught if "collapsed" in str(w.message)]) == 1


def test_lag_k_is_the_reported_lag_and_moves_rho():
    """Policy lag 2: the lag grows 0, 1, 2 over the first updates and stays at 2; acting with
    older params shows in the importance weights."""
    results, _ = _train(_small().env_runners(policy_lag=2), 4)
    assert [r["perf"]["policy_lag_max"] for r in results] == [0, 1, 2, 2]
    assert results[3]["perf"]["policy_lag_mean"] == 2.0
    assert abs(results[3]["learners"]["default_policy"]["mean_rho"] - 1.0) > 1e-4


@pytest.mark.slow
def test_one_device_equals_two_devices():
    """The envs split over two learner devices give the same envs, actions and update as on
    one device: the episodes match exactly, the params to float32 rounding."""
    assert len(jax.devices()) >= 2, "tests/conftest.py forces 2 CPU devices"
    one, params_one = _train(_small(num_learners=1), 3)
    two, params_two = _train(_small(num_learners=2), 3)
    for a, b in zip(one, two, strict=True):
        assert a["env_runners"]["episode_return_mean"] == b["env_runners"]["episode_return_mean"]
        assert a["num_env_steps_sampled_lifetime"] == b["num_env_steps_sampled_lifetime"]
    # Adam divides by the gradient's running scale, so the rounding of a near-zero gradient
    # (summed in another order over two devices) moves a weight by a small fraction of lr.
    for x, y in zip(jax.tree.leaves(params_one), jax.tree.leaves(params_two), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)


def test_two_devices_report_one_devices_gradient():
    """The gradient over two devices is the mean of the devices' own, not N times it: the
    program runs without shard_map's varying types (parallel.data_parallel, for gymnax's
    Asterix), so a replicated param's cotangent must not be summed over the devices. Adam hides
    a scaled gradient; the reported norm of the first update (same params, same data) does not."""
    key = "gradients_default_optimizer_global_norm"
    norms = []
    for n in (1, 2):
        (result,), _ = _train(_small(num_learners=n), 1)
        norms.append(result["learners"]["default_policy"][key])
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-4)


def test_gymnax_asterix_steps_on_device():
    """Asterix's step runs a while_loop from a constant over the env state (gymnax's
    spawn_entity), which shard_map's varying types reject; the program runs without them."""
    config = _small().environment("gymnax:Asterix-MinAtar")
    config.rl_module(model_config={"encoder": "mlp", "fcnet_hiddens": [8]})
    (result,), _ = _train(config, 1)
    assert result["num_env_steps_sampled_lifetime"] >= 640


@pytest.mark.parametrize("env", ["gymnax:Catch-bsuite", "gymnax:DeepSea-bsuite"])
def test_bsuites_2d_boards_train_with_the_default_encoder(env):
    """The README's "any gymnax id": bsuite's 2-D observations with encoder "auto"."""
    (result,), _ = _train(_small().environment(env), 1)
    assert result["num_env_steps_sampled_lifetime"] >= 640


@pytest.mark.slow
def test_the_same_seed_twice_is_bit_identical_and_another_seed_is_not():
    a, params_a = _train(_small(lag=1), 3)
    b, params_b = _train(_small(lag=1), 3)
    _, params_c = _train(_small(lag=1, seed=4), 3)
    assert _leaves_equal(params_a, params_b)
    assert not _leaves_equal(params_a, params_c)
    for x, y in zip(a, b, strict=True):
        assert x["learners"]["default_policy"] == y["learners"]["default_policy"]


def test_cartpole_experiment_learns_on_device_with_only_the_env_changed():
    """experiments/cartpole.py's settings with the gymnax env: 450 within its 3 M budget."""
    from impala_jax.cli.experiment import load_experiment

    config, stop = load_experiment("experiments/cartpole.py")
    config = config.environment(ENV)
    with config.build() as algo:
        while True:
            result = algo.train()
            ret = result["env_runners"].get("episode_return_mean", float("nan"))
            steps = result["num_env_steps_sampled_lifetime"]
            if ret >= 450 or steps >= stop["num_env_steps_sampled_lifetime"]:
                break
    assert ret >= 450, (ret, steps)


def test_the_algorithm_surface_on_device(tmp_path):
    """train()'s result has every key the result schema names; evaluate(), actions, and a
    checkpoint that restores the learner state exactly."""
    from impala_jax.cli.result_schema import result_schema

    config = _small(lag=1).evaluation(evaluation_interval=2, evaluation_duration=3)
    with config.build() as algo:
        results = [algo.train() for _ in range(2)]
        flat = _flatten(results[1])
        schema = result_schema(config)
        required = schema.keys - schema.optional_keys
        missing = sorted(k for k in required if k not in flat and not k.startswith("timers/"))
        assert results[1]["evaluation"]["env_runners"]["num_episodes"] >= 3
        action = algo.compute_single_action(np.zeros(4, np.float32), explore=False)
        assert action in (0, 1)
        path = algo.save(tmp_path / "ckpt")
        before = jax.device_get(algo.learner.state.params)
        algo.train()
        algo.restore(path)
        assert _leaves_equal(before, jax.device_get(algo.learner.state.params))
        after_restore = algo.train()
        assert (
            after_restore["num_env_steps_sampled_lifetime"]
            > results[1]["num_env_steps_sampled_lifetime"]
        )
    assert not missing, missing


def _flatten(d: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in d.items():
        keys.add(prefix + k)
        if isinstance(v, dict):
            keys |= _flatten(v, prefix + k + "/")
    return keys


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda c: c.training(broadcast_interval=2), "broadcast_interval"),
        (lambda c: c.callbacks(on_episode_end=lambda **kw: None), "on_episode_end"),
        (lambda c: c.env_runners(inference_backend="numpy"), "inference_backend"),
        (lambda c: c.training(minibatch_buffer_size=2, num_epochs=2), "minibatch_buffer_size"),
        (lambda c: c.env_runners(policy_lag=-1), "policy_lag"),
    ],
)
def test_fields_without_meaning_on_device_are_errors(change, field):
    with pytest.raises(ValueError, match=field):
        change(_small()).validate()


def test_policy_lag_with_a_host_env_is_an_error():
    config = IMPALAConfig().environment("CartPole-v1").env_runners(policy_lag=1)
    with pytest.raises(ValueError, match="policy_lag=1.*gymnax"):
        config.validate()


def test_envs_that_do_not_fill_the_batch_evenly_are_an_error():
    config = _small().env_runners(num_envs_per_env_runner=24)
    with pytest.raises(ValueError, match="train_batch_size_per_learner"):
        config.build()


def test_gymnax_ids_and_env_config():
    env = make_jax_env("gymnax:CartPole-v1", {"max_steps_in_episode": 20})
    assert env.params.max_steps_in_episode == 20
    with pytest.raises(ValueError, match="max_step.*fields"):
        make_jax_env("gymnax:CartPole-v1", {"max_step": 20})
    with pytest.raises(ValueError, match="Did you mean 'gymnax:CartPole-v1'"):
        IMPALAConfig().environment("gymnax:CartPol-v1").build()
    breakout = make_jax_env("gymnax:Breakout-MinAtar")
    assert breakout.observation_space.shape == (10, 10, 4) and breakout.action_space.n == 3


def test_making_a_gymnax_env_imports_only_its_module():
    """``import gymnax`` imports every env family, and with them seaborn and matplotlib's
    pyplot; a run imports the one module its env needs, and gymnax still imports whole after."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from impala_jax.runtime.envs.env_registry import make_jax_env\n"
        "make_jax_env('gymnax:CartPole-v1')\n"
        "heavy = [m for m in ('seaborn', 'matplotlib.pyplot', 'gymnax.registration') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import gymnax\n"
        "assert type(gymnax.make('CartPole-v1')[0]).__name__ == 'CartPole'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.slow
def test_seed_i_of_a_group_is_seed_i_alone():
    """Two seeds vmapped in one program (with replay and a lag) give each seed's run alone:
    the same episodes, the same losses and params to float32 rounding."""
    from impala_jax import SeedGroup

    config = _small(lag=1).training(replay_proportion=1.0, replay_buffer_num_slots=64)
    with SeedGroup(config, [3, 4]) as group:
        grouped = [group.train() for _ in range(3)]
        weights = [group.get_weights(s)["default_policy"] for s in (3, 4)]
    for i, seed in enumerate((3, 4)):
        alone, params = _train(config.debugging(seed=seed), 3)
        for a, b in zip(alone, [results[i] for results in grouped], strict=True):
            assert b["seed"] == seed
            assert (
                a["env_runners"]["episode_return_mean"] == b["env_runners"]["episode_return_mean"]
            )
            assert a["num_env_steps_sampled_lifetime"] == b["num_env_steps_sampled_lifetime"]
            assert a["perf"]["policy_lag_mean"] == b["perf"]["policy_lag_mean"]
            la, lb = a["learners"]["default_policy"], b["learners"]["default_policy"]
            assert la["total_loss"] == pytest.approx(lb["total_loss"], rel=1e-4)
        pairs = zip(jax.tree.leaves(params), jax.tree.leaves(weights[i]), strict=True)
        for x, y in pairs:  # Adam's normalised step: see test_one_device_equals_two_devices
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)


def test_seed_group_errors():
    from impala_jax import SeedGroup

    with pytest.raises(ValueError, match="gymnax"):
        SeedGroup(IMPALAConfig().environment("CartPole-v1"), [0, 1])
    with pytest.raises(ValueError, match="distinct"):
        SeedGroup(_small(), [1, 1])


def test_a_ray_tune_trial_trains_on_device_and_restores(tmp_path):
    """The Tune Trainable (what a sweep's trials run) with a gymnax env: results, a checkpoint,
    and a second trial restored from it with the same weights."""
    pytest.importorskip("ray.tune")
    from impala_jax.rllib.ray_tune import IMPALATrainable

    first = IMPALATrainable(config=_small(lag=1).to_dict())
    try:
        last = [first.train() for _ in range(2)][-1]
        saved = first.save(str(tmp_path / "ckpt"))
        weights = first.algo.get_weights()
    finally:
        first.stop()
    assert last["num_env_steps_sampled_lifetime"] == 2 * 640  # 16 envs x 20 steps x 2
    second = IMPALATrainable(config=_small(lag=1).to_dict())
    try:
        second.restore(saved)
        np.testing.assert_equal(second.algo.get_weights(), weights)
        assert second.train()["training_iteration"] == 3
    finally:
        second.stop()


def test_a_second_build_loads_the_stored_device_program(tmp_path, monkeypatch):
    """With the program cache on, the rollout-and-update program is traced once and stored; a
    second build loads it and trains bit for bit as the first."""
    from impala_jax.runtime.learning import program_cache

    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    sources, params = [], []
    for _ in range(2):
        with _small(lag=1).build() as algo:
            for _ in range(2):
                algo.train()
            sources.append(algo.engine._program.source)
            params.append(jax.device_get(algo.learner.state.params))
    assert sources == ["exported", "loaded"]
    assert _leaves_equal(*params)


def test_a_bounded_box_without_normalize_or_clip_is_an_error_on_device():
    """On device an action outside the bounds could not be reported: Pendulum's torque needs
    normalize_actions (the default) or clip_actions there."""
    config = _small().environment("gymnax:Pendulum-v1", normalize_actions=False, clip_actions=False)
    with pytest.raises(ValueError, match="normalize_actions=False, clip_actions=False"):
        config.build()
    with _small().environment("gymnax:Pendulum-v1").build() as algo:  # normalized: trains
        assert algo.train()["num_env_steps_sampled_lifetime"] > 0


def test_on_device_envs_get_distinct_keys():
    """The engine's envs (initial_envs) each draw from a key of their own: their first
    observations differ, so do the actions a sampling policy takes in them, their first
    episodes' lengths, and the observations they reset to after them."""
    from impala_jax.runtime.ondevice.device_engine import initial_envs

    n, T = 8, 120
    env = make_jax_env(ENV)

    def coin_policy(params, obs, keys, policy_carry=()):  # a fair coin per env, from its key
        action = jax.vmap(lambda k: jax.random.bernoulli(k).astype(jnp.int32))(keys)
        return action, jnp.zeros((n, 2)), None

    carry = initial_envs(env, 3, 0, n)
    first_obs = np.asarray(carry.obs)
    _, traj, episodes = jax.jit(make_rollout(env, coin_policy, lambda a: a, T))(None, carry)
    ended = np.asarray(episodes.ended)
    assert ended.any(axis=0).all(), "every env ends an episode within T steps"
    first_end = ended.argmax(axis=0)  # the row each env's first episode ends at
    assert (first_end + 2 < T).all()
    lengths = np.asarray(episodes.episode_len)[first_end, np.arange(n)]
    reset_obs = np.asarray(traj.obs)[first_end + 2, np.arange(n)]  # after the reset row

    assert len({tuple(o) for o in first_obs.tolist()}) == n
    assert len({tuple(o) for o in reset_obs.tolist()}) == n
    assert len(set(np.asarray(traj.action)[0].tolist())) == 2
    assert len(set(lengths.tolist())) > 1, lengths


def test_seeds_of_a_group_differ_and_seed_i_is_seed_i_alone_small():
    """The fast test_seed_i_of_a_group_is_seed_i_alone, at a tiny size (4 envs, fragments of 25,
    an MLP of 8, 2 updates): the group's seeds start from different params and different
    envs, end different episodes, and the second gives what it gives alone."""
    from impala_jax import SeedGroup

    config = (
        _small()
        .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=25)
        .training(train_batch_size_per_learner=100, minibatch_size=None)
        .rl_module(model_config={"fcnet_hiddens": [8]})
    )
    seeds = (3, 4)
    with SeedGroup(config, seeds) as group:
        initial = [group.get_weights(s)["default_policy"] for s in seeds]
        first_obs = np.asarray(group.engine._carry.obs)  # [seed, env, obs]
        grouped = [group.train() for _ in range(2)]
        weights = [group.get_weights(s)["default_policy"] for s in seeds]
    kernels = [[x for x in jax.tree.leaves(p) if x.ndim > 1] for p in initial]  # biases: 0
    same_kernels = [np.array_equal(x, y) for x, y in zip(*kernels, strict=True)]
    assert same_kernels and not any(same_kernels), f"seeds 3 and 4 share kernels: {same_kernels}"
    shared = np.isin(first_obs[0], first_obs[1])
    assert not shared.any(), f"seed 3's first observations hold seed 4's: {shared.tolist()}"
    episodes = [
        [(r["env_runners"]["episode_return_mean"], r["env_runners"]["num_episodes"]) for r in rs]
        for rs in zip(*grouped, strict=True)
    ]
    assert episodes[0] != episodes[1], episodes
    # Seed 4 alone (one build: the slow test compares every seed): the second member, which a
    # group that gives its members its first seed's keys would run as seed 3.
    alone, params = _train(config.debugging(seed=4), 2)
    for a, b in zip(alone, [results[1] for results in grouped], strict=True):
        assert b["seed"] == 4
        assert a["env_runners"]["num_episodes"] > 0
        assert a["env_runners"]["episode_return_mean"] == b["env_runners"]["episode_return_mean"]
        assert a["num_env_steps_sampled_lifetime"] == b["num_env_steps_sampled_lifetime"]
        la, lb = a["learners"]["default_policy"], b["learners"]["default_policy"]
        assert la["total_loss"] == pytest.approx(lb["total_loss"], rel=1e-4)
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(weights[1]), strict=True)
    for x, y in pairs:  # Adam's normalised step: see test_one_device_equals_two_devices
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)
