"""host_actor.py: the NumPy act equals the networks' forward pass and samples the same
distributions as the jitted act; which policies use it (``inference_backend``)."""

import threading
import types

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core.distributions import Categorical, make_distribution
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG
from impala_jax.core.networks import make_networks
from impala_jax.core.policy import make_act_fns
from impala_jax.runtime.acting.host_actor import (
    AUTO_MAX_MACS,
    HostActor,
    act_macs,
    host_actor_unsupported,
)
from tests.fake_envs import ImageCueEnv
from tests.test_algorithm import small_config

BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE2 = gym.spaces.Discrete(2)
BOX2 = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)

# (model_config, observation space, action space): every key HostActor's mirror reads.
CASES = {
    "cartpole": ({"fcnet_hiddens": [64, 64]}, BOX4, DISCRETE2),
    "no_hidden": ({"fcnet_hiddens": []}, BOX4, gym.spaces.Discrete(3)),
    **{
        f"act_{name}": ({"fcnet_hiddens": [8, 8], "fcnet_activation": name}, BOX4, DISCRETE2)
        for name in ("relu", "ELU", "swish", "silu", "sigmoid", "linear", None)
    },
    "layernorm_heads_post": (
        {
            "fcnet_hiddens": [8, 6],
            "fcnet_use_layernorm": True,
            "post_fcnet_hiddens": [5],
            "post_fcnet_activation": "tanh",
            "head_fcnet_hiddens": [7, 3],
            "head_fcnet_activation": "elu",
            "head_fcnet_use_layernorm": True,
        },
        BOX4,
        gym.spaces.Discrete(4),
    ),
    "discrete_obs": ({"fcnet_hiddens": [8]}, gym.spaces.Discrete(5, start=2), DISCRETE2),
    "uint8_2d_obs": (
        {"fcnet_hiddens": [8], "encoder": "mlp"},
        gym.spaces.Box(0, 255, (3, 5), np.uint8),
        DISCRETE2,
    ),
    "gaussian": ({"fcnet_hiddens": [8], "log_std_clip_param": 0.5}, BOX4, BOX2),
    "gaussian_free_log_std": (
        {"fcnet_hiddens": [8], "free_log_std": True, "head_fcnet_hiddens": [4]},
        BOX4,
        BOX2,
    ),
}


def _obs(space, n, seed=0):
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=(n,)).astype(np.int64)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, size=(n, *space.shape)).astype(np.uint8)
    return (2.0 * rng.normal(size=(n, *space.shape))).astype(np.float32)


def _setup(name):
    model_config, obs_space, act_space = CASES[name]
    full = {**DEFAULT_MODEL_CONFIG, **model_config}
    nets = make_networks(full, obs_space, act_space)
    distribution = make_distribution(act_space, full)
    # Random params, not the init (whose zero biases, unit LayerNorm scales and zero log-std
    # would hide a term left out).
    params = nets.init(jax.random.key(0))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = treedef.unflatten(
        [x + 0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    act, greedy = make_act_fns(nets, distribution)
    host = HostActor(full, obs_space, distribution, act)
    return nets, distribution, params, act, greedy, host, obs_space


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_pass_equals_the_networks(name):
    nets, distribution, params, act, greedy, host, obs_space = _setup(name)
    obs = _obs(obs_space, 9)
    expected, _ = jax.jit(nets.apply)(params, jnp.asarray(obs))
    got = host.dist_inputs(params, obs)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, np.asarray(expected), rtol=2e-5, atol=2e-5)
    # greedy: the distribution's mode; sampled actions: the jitted act's dtypes and shapes
    mode, _ = greedy(params, obs)
    host_mode, _ = host.greedy(params, obs)
    np.testing.assert_allclose(host_mode, np.asarray(mode), rtol=2e-5, atol=2e-5)
    action, dist_inputs, key = host(params, obs, host.key(0))
    jitted = jax.eval_shape(act, params, obs, jax.random.key(0))
    assert action.dtype == jitted[0].dtype and action.shape == jitted[0].shape
    assert isinstance(key, np.random.Generator)
    np.testing.assert_array_equal(dist_inputs, got)


def test_categorical_samples_follow_the_softmax():
    distribution = Categorical(3)
    host = HostActor({**DEFAULT_MODEL_CONFIG}, BOX4, distribution, None)
    n = 40_000
    probs = np.array([0.2, 0.5, 0.3])
    logits = np.tile(np.log(probs).astype(np.float32) + 1.7, (n, 1))
    actions = host._sample(host.key(3), logits)
    counts = np.bincount(actions, minlength=3)
    sigma = np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(counts - n * probs) < 4.5 * sigma), counts
    # A masked logit (finfo.min, as Categorical documents) is never drawn.
    masked = logits.copy()
    masked[:, 1] = np.finfo(np.float32).min
    actions = host._sample(host.key(4), masked)
    assert not np.any(actions == 1)
    assert abs(np.mean(actions == 0) - 0.4) < 0.02  # 0.2 / (0.2 + 0.3)


def test_gaussian_samples_have_the_mean_and_clipped_std():
    distribution = make_distribution(BOX2, {"log_std_clip_param": 1.0})
    host = HostActor({**DEFAULT_MODEL_CONFIG}, BOX4, distribution, None)
    n = 40_000
    mean, log_std = np.array([0.5, -1.0]), np.array([-1.0, 3.0])  # the second clipped to 1
    dist_inputs = np.tile(np.concatenate([mean, log_std]).astype(np.float32), (n, 1))
    actions = host._sample(host.key(5), dist_inputs)
    assert actions.dtype == np.float32 and actions.shape == (n, 2)
    std = np.exp([-1.0, 1.0])
    assert np.all(np.abs(actions.mean(0) - mean) < 4.5 * std / np.sqrt(n)), actions.mean(0)
    np.testing.assert_allclose(actions.std(0), std, rtol=0.02)


def test_a_seed_fixes_the_actions_and_each_call_draws_anew():
    _, _, params, _, _, host, obs_space = _setup("cartpole")
    obs = _obs(obs_space, 256)
    a1, _, key = host(params, obs, host.key(7))
    a2, _, _ = host(params, obs, key)
    b1, _, _ = host(params, obs, host.key(7))
    c1, _, _ = host(params, obs, host.key(8))
    np.testing.assert_array_equal(a1, b1)
    assert np.any(a1 != a2) and np.any(a1 != c1)
    # A JAX key (compute_actions) seeds a Generator for the call: the same key, the same draw.
    k1, _, _ = host(params, obs, jax.random.key(3))
    k2, _, _ = host(params, obs, jax.random.key(3))
    np.testing.assert_array_equal(k1, k2)


def test_new_params_are_used_once_published():
    nets, _, params, _, _, host, obs_space = _setup("cartpole")
    obs = _obs(obs_space, 5)
    before = host.dist_inputs(params, obs)
    other = jax.tree.map(lambda x: x * 0.5, params)  # a new params object, as a publication is
    after = host.dist_inputs(other, obs)
    expected, _ = nets.apply(other, jnp.asarray(obs))
    np.testing.assert_allclose(after, np.asarray(expected), rtol=2e-5, atol=2e-5)
    assert not np.allclose(before, after)


def test_unsupported_policies_are_named():
    base = dict(DEFAULT_MODEL_CONFIG)
    categorical = Categorical(2)
    assert host_actor_unsupported(base, BOX4, categorical) is None
    assert "recurrent" in host_actor_unsupported({**base, "use_lstm": True}, BOX4, categorical)
    image = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
    assert "nature_cnn" in host_actor_unsupported(base, image, categorical)
    with pytest.raises(ValueError, match="HostActor cannot run this policy"):
        HostActor({**base, "encoder": "impala_cnn"}, image, categorical, None)


def test_act_macs_counts_the_dense_layers():
    config = {**DEFAULT_MODEL_CONFIG, "fcnet_hiddens": [64, 64]}
    assert act_macs(config, BOX4, 2, 256) == 256 * (4 * 64 + 64 * 64 + 64 * 2)
    assert act_macs(config, BOX4, 2, 256) <= AUTO_MAX_MACS  # experiments/cartpole.py
    config = {**config, "post_fcnet_hiddens": [8], "head_fcnet_hiddens": [3]}
    discrete = gym.spaces.Discrete(5)
    assert act_macs(config, discrete, 4, 1) == 5 * 64 + 64 * 64 + 64 * 8 + 8 * 3 + 3 * 4
    big = {**DEFAULT_MODEL_CONFIG, "fcnet_hiddens": [256, 256]}
    assert act_macs(big, BOX4, 2, 32) > AUTO_MAX_MACS


def _image_config(backend):
    return small_config(ImageCueEnv).env_runners(inference_backend=backend)


def test_inference_backend_chooses_the_actor():
    algo = small_config().build()  # "auto": NumPy for an MLP acting on the CPU
    try:
        assert isinstance(algo._act, HostActor)
        assert isinstance(algo.env_runner_group.local_runner._key, np.random.Generator)
        assert algo.compute_single_action(np.zeros(4, np.float32), explore=True) in (0, 1)
    finally:
        algo.stop()
    algo = small_config().env_runners(inference_backend="jax").build()
    try:
        assert not isinstance(algo._act, HostActor)
    finally:
        algo.stop()
    # A policy whose dots are large enough for XLA's threads to pay keeps the jitted act.
    big = small_config(num_envs_per_env_runner=32).rl_module(
        model_config={"fcnet_hiddens": [256, 256]}
    )
    algo = big.build()
    try:
        assert not isinstance(algo._act, HostActor)
    finally:
        algo.stop()
    algo = big.env_runners(inference_backend="numpy").build()
    try:
        assert isinstance(algo._act, HostActor)
    finally:
        algo.stop()
    algo = _image_config("auto").build()  # a CNN keeps the jitted act
    try:
        assert not isinstance(algo._act, HostActor)
    finally:
        algo.stop()
    with pytest.raises(ValueError, match="inference_backend='numpy'.*nature_cnn"):
        _image_config("numpy").build()


def test_inference_backend_is_validated():
    with pytest.raises(ValueError, match="inference_backend='gpu'"):
        small_config().env_runners(inference_backend="gpu").validate()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_lockstep_runs_repeat_exactly(backend):
    """Lockstep mode stays deterministic with either actor: the same seed, the same run."""
    runs = []
    for _ in range(2):
        algo = small_config().env_runners(inference_backend=backend).build()
        try:
            algo.train()
            result = algo.train()
            params = jax.tree.leaves(jax.device_get(algo.learner.state.params))
            runs.append((result["env_runners"]["episode_return_mean"], params))
        finally:
            algo.stop()
    assert runs[0][0] == runs[1][0]
    for x, y in zip(runs[0][1], runs[1][1], strict=True):
        np.testing.assert_array_equal(x, y)


def test_blas_is_held_at_one_thread_while_a_numpy_actor_runs():
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    assert before, "NumPy's BLAS was not found"
    first, second = small_config().build(), small_config().build()
    try:
        assert set(blas_threads()) == {1}
        first.stop()
        assert set(blas_threads()) == {1}  # the second still acts with NumPy
    finally:
        first.stop()
        second.stop()
    assert blas_threads() == before
    with small_config().env_runners(inference_backend="jax").build():
        assert blas_threads() == before  # the jitted act leaves BLAS alone


def test_acting_yields_the_gil_unless_the_envs_release_it(monkeypatch):
    # A NumPy act yields the GIL once per call (a pure-Python env's runner would keep it), but
    # not for envpool, which releases it while its threads step (host_actor.no_gil_yield).
    from impala_jax.runtime.acting import host_actor
    from tests.test_evaluation import ClockEnv

    yields = []
    monkeypatch.setattr(host_actor.os, "sched_yield", lambda: yields.append(1))
    *_, params, _, _, host, space = _setup(sorted(CASES)[0])
    obs, rng = _obs(space, 4), HostActor.key(0)
    host(params, obs, rng)
    assert len(yields) == 1
    with host_actor.no_gil_yield():
        host(params, obs, rng)
        with host_actor.no_gil_yield():
            host.greedy(params, obs)
        host(params, obs, rng)  # the inner block restored the outer one's setting
    assert len(yields) == 1
    seen = []
    thread = threading.Thread(target=lambda: seen.append(host(params, obs, rng)))
    with host_actor.no_gil_yield():
        thread.start()  # another thread's acting is its own: it yields
        thread.join()
    assert len(seen) == 1 and len(yields) == 2
    host.greedy(params, obs)
    assert len(yields) == 3

    for env, releases in (("CartPole-v1", True), (ClockEnv, False)):
        with small_config(env).build() as algo:
            runner = algo.env_runner_group.local_runner
            assert runner._envs_release_gil is releases
            before = len(yields)
            runner.sample()  # 8 steps: 8 act calls
            assert len(yields) - before == (0 if releases else 8), env


class _Leaf:
    """A params leaf whose learner step is still computing it (is_ready False) or done."""

    def __init__(self, ready: bool):
        self.ready = ready

    def is_ready(self) -> bool:
        return self.ready


def test_a_numpy_actor_in_a_runner_thread_acts_with_computed_params_only(monkeypatch):
    # A NumPy actor reading params the learner step is still computing would wait for it (15 %
    # of the runner thread's time in CartPole training): it acts with the newest computed ones
    # of the last two publications, else with those it acted with if at most MAX_ACTING_LAG
    # versions behind; a fragment's version is the one that acted.
    from impala_jax.runtime.acting.env_runner import EnvRunner, ParamStore

    monkeypatch.setattr(ParamStore, "_to_actor", lambda self, params: params)
    store = ParamStore({"w": _Leaf(True)}, None)
    runner = types.SimpleNamespace(param_store=store, _acting=None, _waits_for_params=True)
    first = EnvRunner._params(runner)
    assert first[1] == 0
    one, two = {"w": _Leaf(False)}, {"w": _Leaf(False)}
    store.publish(one)
    assert EnvRunner._params(runner) == first  # version 1 is computing: version 0 acts
    store.publish(two)
    assert EnvRunner._params(runner) == first  # 0 is no longer kept, but is what acted
    one["w"].ready = True
    assert EnvRunner._params(runner) == (one, 1)  # the one before the newest, computed
    two["w"].ready = True
    assert EnvRunner._params(runner) == (two, 2)
    store.publish({"w": _Leaf(False)})
    assert EnvRunner._params(runner) == (two, 2)
    store.publish({"w": _Leaf(False)})
    assert EnvRunner._params(runner) == (two, 2)  # MAX_ACTING_LAG (2) behind the newest
    store.publish({"w": _Leaf(False)})
    assert EnvRunner._params(runner) == store.get()  # 3 behind: the newest, waited for
    # The jitted act takes params still being computed (its program waits for them on the
    # device), and lockstep takes the newest always (it must repeat exactly).
    runner._waits_for_params = False
    store.publish({"w": _Leaf(False)})
    assert EnvRunner._params(runner) == store.get() and store.get()[1] == 6

    for backend, runners, waits in (("auto", 1, True), ("jax", 1, False), ("auto", 0, False)):
        config = small_config(num_env_runners=runners).env_runners(inference_backend=backend)
        with config.build() as algo:
            assert [r._waits_for_params for r in algo.env_runner_group.runners] == [waits]
