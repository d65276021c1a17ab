"""Env resolution the RLlib way: registered names, envpool only where it is gymnasium's env,
ALE ids with ALE's semantics, RLlib's own Pong creator, and checkpoints of creator envs."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest
from gymnasium.envs.registration import load_env_creator

from impala_jax import IMPALA, IMPALAConfig
from impala_jax.rllib.registry import register_env
from impala_jax.runtime.envs import env_registry, vec_env
from tests.fake_envs import ContextEnv
from tests.test_algorithm import small_config

envpool = pytest.importorskip("envpool")

ROOT = Path(__file__).resolve().parents[1]
INT_MAX = 2**31 - 1
# Options envpool and gymnasium both accept for an allow-listed id; each is checked below to
# mean the same in both.
SAME_MEANING = {"max_episode_steps", "is_slippery"}
STOCHASTIC = {"FrozenLake-v1", "FrozenLake8x8-v1", "CliffWalkingSlippery-v1"}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered")
        warnings.filterwarnings("ignore", message=".*out of date")
        yield


def _gym(env_id, **kwargs):
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def _envpool(env_id, num_envs=1, seed=0, **kwargs):
    return envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed, **kwargs)


def _gymnasium_kwargs(env_id) -> set[str]:
    cls = load_env_creator(gym.spec(env_id).entry_point)
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "render_mode"}
    return names | {"max_episode_steps"}  # gymnasium.make's own TimeLimit option


def _set_state(env_id, genv, obs):
    """Puts gymnasium's env into the state envpool's observation shows."""
    u = genv.unwrapped
    if isinstance(genv.observation_space, gym.spaces.Discrete):
        u.s = int(obs)
        return
    o = np.asarray(obs, np.float64)
    if env_id.startswith("Pendulum"):
        u.state = np.array([np.arctan2(o[1], o[0]), o[2]])
    elif env_id.startswith("Acrobot"):
        u.state = np.array([np.arctan2(o[1], o[0]), np.arctan2(o[3], o[2]), o[4], o[5]])
    else:  # CartPole, MountainCar: the observation is the state
        u.state = o


def _env_action(space, rng):
    if isinstance(space, gym.spaces.Discrete):
        return int(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(space.dtype)


def _check_same_transitions(env_id, steps=300, **options):
    """Every envpool transition (s, a) -> (s', r, terminated) is one gymnasium's table allows;
    returns the most next states seen for one (s, a), to show slipping happens."""
    penv, genv = _envpool(env_id, seed=3, **options), _gym(env_id, **options)
    genv.reset(seed=3)
    table = genv.unwrapped.P
    rng = np.random.default_rng(0)
    s = int(penv.reset()[0][0])
    assert genv.unwrapped.initial_state_distrib[s] > 0
    outcomes: dict = {}
    for _ in range(steps):
        a = int(rng.integers(genv.action_space.n))
        o, r, te, tr, _ = penv.step(np.array([a]))
        o, r, te, tr = int(o[0]), float(r[0]), bool(te[0]), bool(tr[0])
        allowed = {(n, float(rr), bool(d)) for p, n, rr, d in table[s][a] if p > 0}
        assert (o, r, te) in allowed, (env_id, s, a, (o, r, te), table[s][a])
        outcomes.setdefault((s, a), set()).add(o)
        s = o
        if te or tr:  # next-step autoreset: the step after the end returns the reset state
            s = int(penv.step(np.array([0]))[0][0])
            assert genv.unwrapped.initial_state_distrib[s] > 0
    return max(len(v) for v in outcomes.values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_id", sorted(env_registry.ENVPOOL_SAME_AS_GYMNASIUM))
def test_allow_listed_envpool_env_is_gymnasiums(env_id):
    assert env_registry.choose_env(env_id).backend == "envpool"
    penv, genv = _envpool(env_id), _gym(env_id)
    # Spaces and time limits.
    assert penv.single_observation_space == genv.observation_space
    assert penv.single_action_space == genv.action_space
    limit = envpool.make_spec(env_id).config.max_episode_steps
    assert (None if limit == INT_MAX else limit) == gym.spec(env_id).max_episode_steps
    # Every option both accept is one whose meaning is checked here.
    shared = (env_registry.envpool_options(env_id) & _gymnasium_kwargs(env_id)) - SAME_MEANING
    assert not shared, f"{env_id}: {shared} mean something in both; check them"
    if env_id in STOCHASTIC:
        assert _check_same_transitions(env_id) > 1
        return
    # Reset states: envpool's lie in the range gymnasium's do.
    if isinstance(genv.observation_space, gym.spaces.Box):
        g0 = np.stack([genv.reset(seed=s)[0] for s in range(100)])
        p0 = _envpool(env_id, num_envs=100, seed=5).reset()[0]
        margin = 0.1 * (g0.max(0) - g0.min(0))
        assert np.all(p0 >= g0.min(0) - margin) and np.all(p0 <= g0.max(0) + margin)
    else:
        genv.reset(seed=0)
        p0 = _envpool(env_id, num_envs=50, seed=5).reset()[0]
        assert np.all(genv.unwrapped.initial_state_distrib[p0] > 0)
    # Dynamics: from envpool's state, both step to the same observations and rewards.
    for seed in range(3):
        penv = _envpool(env_id, seed=seed)
        genv.reset(seed=seed)
        _set_state(env_id, genv, penv.reset()[0][0])
        rng = np.random.default_rng(seed)
        for _ in range(40):
            a = _env_action(genv.action_space, rng)
            obs, r, te, tr, _ = penv.step(np.asarray(a)[None])
            gobs, gr, gte, gtr, _ = genv.step(a)
            np.testing.assert_allclose(obs[0], gobs, atol=1e-4, err_msg=env_id)
            assert abs(float(r[0]) - float(gr)) < 1e-4 and bool(te[0]) == gte
            if gte or gtr:
                break


@pytest.mark.timeout(60)
def test_shared_options_mean_the_same():
    # max_episode_steps: both truncate after that many steps.
    vec = vec_env.make_vec_env("CartPole-v1", 1, 0, {"max_episode_steps": 3})
    assert isinstance(vec, vec_env.EnvpoolVecEnv)
    vec.async_reset()
    truncated = []
    for _ in range(3):
        vec.recv()
        vec.send(np.zeros(1, np.int64))
        truncated.append(bool(vec.recv()[3][0]))
    vec.close()
    genv = _gym("CartPole-v1", max_episode_steps=3)
    genv.reset(seed=0)
    assert truncated == [genv.step(0)[3] for _ in range(3)] == [False, False, True]
    # is_slippery: CliffWalking-v1 slips the same way in both.
    assert env_registry.choose_env("CliffWalking-v1", {"is_slippery": True}).backend == "envpool"
    assert _check_same_transitions("CliffWalking-v1", is_slippery=True) > 1


def test_ids_both_have_but_differ_run_under_gymnasium():
    both = env_registry.envpool_ids() & set(gym.registry)
    for env_id in sorted(both - env_registry.ENVPOOL_SAME_AS_GYMNASIUM):
        assert env_registry.choose_env(env_id).backend == "gymnasium", env_id
    # Blackjack: gymnasium's Tuple observations, not envpool's Box; each is an explicit choice.
    with pytest.raises(ValueError, match=r"Tuple.*'envpool:Blackjack-v1'"):
        vec_env.make_vec_env("Blackjack-v1", 1, 0)
    vec = vec_env.make_vec_env("envpool:Blackjack-v1", 2, 0)
    assert isinstance(vec, vec_env.EnvpoolVecEnv) and vec.observation_space.shape == (3,)
    vec.close()


def test_gymnasium_only_options_pick_gymnasium():
    # envpool's FrozenLake is always slippery: is_slippery=False is gymnasium's env.
    choice = env_registry.choose_env("FrozenLake-v1", {"is_slippery": False})
    assert choice == env_registry.EnvChoice("gymnasium", "FrozenLake-v1", "FrozenLake-v1")
    vec = vec_env.make_vec_env("FrozenLake-v1", 1, 0, {"is_slippery": False})
    vec.async_reset()
    vec.recv()
    vec.send(np.array([2]))  # right, and not slipping: state 1
    assert isinstance(vec, vec_env.GymnasiumVecEnv) and int(vec.recv()[0][0]) == 1
    vec.close()
    assert (
        env_registry.choose_env("CartPole-v1", {"sutton_barto_reward": True}).backend == "gymnasium"
    )
    # An option only envpool has keeps envpool.
    assert env_registry.choose_env("FrozenLake-v1", {"size": 8}).backend == "envpool"
    # Ids only envpool has are envpool's; "gymnasium:<id>" forces gymnasium's.
    assert env_registry.choose_env("Pong-v5").backend == "envpool"
    assert env_registry.choose_env("gymnasium:CartPole-v1").backend == "gymnasium"
    with pytest.raises(ValueError, match="envpool has no env"):
        env_registry.choose_env("envpool:NoSuchEnv-v0")


@pytest.mark.timeout(60)
def test_ale_ids_have_ales_semantics():
    pytest.importorskip("ale_py")
    vec = vec_env.make_vec_env("ALE/Pong-v5", 2, 0)
    assert isinstance(vec, vec_env.GymnasiumVecEnv)
    assert vec.observation_space == gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    assert vec.action_space == gym.spaces.Discrete(6)
    vec.async_reset()
    obs = vec.recv()[0]
    assert obs.shape == (2, 210, 160, 3)
    vec.close()
    kwargs = gym.spec("ALE/Pong-v5").kwargs
    assert kwargs["repeat_action_probability"] == 0.25 and kwargs["frameskip"] == 4
    assert kwargs["full_action_space"] is False
    assert env_registry.choose_env("ale_py:ALE/Breakout-v5").target == "ALE/Breakout-v5"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.timeout(150)
def test_resolution_imports_ray_never_and_ale_py_on_demand():
    code = """
import sys
from impala_jax.runtime.envs.env_registry import choose_env
assert choose_env("CartPole-v1").backend == "envpool"
assert choose_env("tests.fake_envs:ContextEnv").backend == "gymnasium"
try:
    choose_env("NoSuchEnv-v0")
except ValueError as err:
    assert "register_env" in str(err), err
assert "ray" not in sys.modules
assert "ale_py" not in sys.modules
try:
    import ale_py  # noqa: F401
except ImportError:
    sys.exit(0)
del sys.modules["ale_py"]
assert choose_env("ALE/Pong-v5").backend == "gymnasium"
sys.modules["ale_py"] = None  # ale-py not installed
import gymnasium as gym
for env_id in [k for k in gym.registry if k.startswith("ALE/")]:
    del gym.registry[env_id]
try:
    choose_env("ALE/Breakout-v5")
except ValueError as err:
    assert "ale-py" in str(err) and "'Pong-v5'" in str(err), err
else:
    raise AssertionError("no error without ale_py")
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture
def registry(monkeypatch):
    """impala_jax's registry, emptied after the test."""
    monkeypatch.setattr(env_registry, "REGISTERED", {})
    return env_registry.REGISTERED


def test_register_env_names_resolve_and_win(registry):
    import impala_jax

    calls = []

    def creator(ctx):
        calls.append(ctx)
        return ContextEnv(ctx)

    impala_jax.register_env("my_env", creator)
    assert env_registry.choose_env("my_env") == env_registry.EnvChoice(
        "gymnasium", creator, "my_env"
    )
    impala_jax.register_env("CartPole-v1", creator)  # a registered name wins, as in RLlib
    assert env_registry.choose_env("CartPole-v1").target is creator
    vec = vec_env.make_vec_env(
        "my_env", 3, 0, {"a": 1}, worker_index=2, num_workers=4, first_vector_index=3
    )
    assert vec.name == "my_env"
    vec.async_reset()
    np.testing.assert_array_equal(vec.recv()[0], [[2, 3, 4], [2, 4, 4], [2, 5, 4]])
    vec.close()
    ctx = calls[-1]
    assert isinstance(ctx, dict) and dict(ctx) == {"a": 1} and ctx.remote is False
    with pytest.raises(TypeError, match="callable"):
        impala_jax.register_env("bad", "not a function")


@pytest.mark.timeout(60)
def test_async_vectorize_mode_pickles_the_context(registry):
    register_env("ctx_env", ContextEnv)
    vec = vec_env.make_vec_env("ctx_env", 2, 0, {"a": 1}, "async", worker_index=1, num_workers=1)
    vec.async_reset()
    np.testing.assert_array_equal(vec.recv()[0], [[1, 0, 1], [1, 1, 1]])
    vec.close()


@pytest.mark.timeout(120)
def test_creators_get_rllibs_env_context_in_runner_threads(registry):
    seen = []

    def creator(ctx):
        seen.append((ctx.worker_index, ctx.vector_index, ctx.num_workers, dict(ctx)))
        return ContextEnv(ctx)

    register_env("where_env", creator)
    config = small_config("where_env", num_env_runners=2, num_envs_per_env_runner=2)
    config.environment(env_config={"k": 7})
    with config.build() as algo:
        algo.train()
    where = {s[:3] for s in seen}
    # The build-time probe (main thread, 0) and both runner threads' envs (1 and 2).
    assert {(0, 0, 2), (1, 0, 2), (1, 1, 2), (2, 0, 2), (2, 1, 2)} <= where
    assert all(s[3] == {"k": 7} for s in seen)


@pytest.mark.timeout(60)
def test_tune_registered_names_resolve():
    tune_registry = pytest.importorskip("ray.tune.registry")
    from ray.tune import register_env

    register_env("impala_jax_test_tune_env", lambda ctx: ContextEnv(ctx))
    choice = env_registry.choose_env("impala_jax_test_tune_env")
    assert choice.backend == "gymnasium" and callable(choice.target)
    vec = vec_env.make_vec_env("impala_jax_test_tune_env", 1, 0)
    vec.async_reset()
    assert vec.recv()[0].shape == (1, 3)
    vec.close()
    assert tune_registry._global_registry.contains(
        tune_registry.ENV_CREATOR, "impala_jax_test_tune_env"
    )


@pytest.mark.timeout(240)
def test_rllib_tuned_pong_example_builds_and_trains():
    """rllib/tuned_examples/impala/pong_impala.py with only IMPALAConfig's import swapped;
    the env creation is the file's, the sizes are shrunk for the test."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    wrappers = pytest.importorskip("ray.rllib.env.wrappers.atari_wrappers")
    from ray.tune.registry import register_env

    wrap_atari_for_new_api_stack = wrappers.wrap_atari_for_new_api_stack

    def _env_creator(cfg):
        return wrap_atari_for_new_api_stack(
            gym.make("ALE/Pong-v5", **cfg, **{"render_mode": "rgb_array"}),
            dim=64,
            framestack=4,
        )

    register_env("env", _env_creator)
    config = (
        IMPALAConfig()
        # Enable new API stack and use EnvRunner.
        .api_stack(
            enable_rl_module_and_learner=True,
            enable_env_runner_and_connector_v2=True,
        )
        .environment(
            "env",
            env_config={
                # Make analogous to old v4 + NoFrameskip.
                "frameskip": 1,
                "full_action_space": False,
                "repeat_action_probability": 0.0,
            },
            clip_rewards=True,
        )
        .env_runners(num_envs_per_env_runner=5)
        .training(
            train_batch_size_per_learner=500,
            grad_clip=40.0,
            grad_clip_by="global_norm",
            lr=0.007 * ((None or 1) ** 0.5),  # args.num_gpus is None without arguments
            vf_loss_coeff=0.5,
            entropy_coeff=0.008,  # <- crucial parameter to finetune
            # Only update connector states and model weights every n training_step calls.
            broadcast_interval=5,
        )
        .rl_module(
            rl_module_spec=None,  # args.use_tiny_cnn is False
            model_config={
                "vf_share_layers": True,
                "conv_filters": [[16, 4, 2], [32, 4, 2], [64, 4, 2], [128, 4, 2]],
                "conv_activation": "relu",
                "post_fcnet_hiddens": [256],
            },
        )
    )
    # The test's sizes: one lockstep runner of 2 envs, short fragments, short iterations.
    config.env_runners(num_envs_per_env_runner=2, num_env_runners=0, rollout_fragment_length=10)
    config.training(train_batch_size_per_learner=20).learners(num_learners=0)
    config.reporting(min_time_s_per_iteration=0).debugging(seed=0)
    with config.build() as algo:
        assert algo.observation_space == gym.spaces.Box(-1.0, 1.0, (64, 64, 4), np.float32)
        assert algo.action_space == gym.spaces.Discrete(6)
        result = algo.train()
    assert result["num_env_steps_sampled_lifetime"] >= 20
    assert np.isfinite(result["learners"]["default_policy"]["total_loss"])


@pytest.mark.timeout(300)
def test_checkpoints_of_lambda_and_registered_creators(tmp_path, registry):
    creator = lambda ctx: gym.make("CartPole-v1")  # noqa: E731
    with small_config(creator).build() as algo:
        algo.train()
        lambda_path = algo.save(tmp_path / "lambda").checkpoint.path
        weights = jax.tree.leaves(algo.get_weights())
    with pytest.raises(ValueError, match=r"lambda.*from_checkpoint\(path, env=creator\)"):
        IMPALA.from_checkpoint(lambda_path)
    # The creator passed back, here under a registered name; that name is what it saves.
    register_env("ckpt_env", creator)
    with IMPALA.from_checkpoint(lambda_path, env="ckpt_env") as restored:
        assert restored.iteration == 1
        for a, b in zip(weights, jax.tree.leaves(restored.get_weights()), strict=True):
            np.testing.assert_array_equal(a, b)
        named_path = restored.save(tmp_path / "named").checkpoint.path
    stored = json.loads((Path(named_path) / "state.json").read_text())["config"]["env"]
    assert stored == "ckpt_env"
    with IMPALA.from_checkpoint(named_path) as restored:
        assert restored.config.env == "ckpt_env" and restored.iteration == 1
    del registry["ckpt_env"]
    with pytest.raises(ValueError, match=r"'ckpt_env'.*register it again"):
        IMPALA.from_checkpoint(named_path)


@pytest.mark.parametrize(
    "env,atari",
    [
        ("ALE/Pong-v5", True),
        ("ale_py:ALE/Breakout-v5", True),
        ("Pong-v5", True),  # envpool's Atari
        ("envpool:Breakout-v5", True),
        ("CartPole-v1", False),
        ("envpool:CartPole-v1", False),
        ("HalfCheetah-v5", False),
    ],
)
def test_is_atari_is_detected_from_the_id_and_clips_rewards(env, atari):
    from impala_jax import IMPALAConfig
    from impala_jax.rllib import specs
    from impala_jax.runtime.envs.env_registry import is_atari_id

    assert is_atari_id(env) is atari
    config = IMPALAConfig().environment(env)
    assert specs.clip_rewards(config) == (True if atari else None)
    assert specs.clip_rewards(config.copy().environment(is_atari=False)) is None
    assert specs.clip_rewards(config.copy().environment(clip_rewards=False)) is False


@pytest.mark.timeout(150)
def test_envpool_imports_without_its_families_inits_and_still_makes_every_family():
    # import_envpool skips every family's package __init__ (C++ extensions, 152 py_env classes,
    # jumanji's renderer with matplotlib.pyplot: 0.3-1.0 s of start-up); every family stays
    # registered, and making an env imports its real family package.
    code = """
import sys
from impala_jax.runtime.envs.env_registry import choose_env, import_envpool
from impala_jax.runtime.envs.vec_env import EnvpoolVecEnv
envpool = import_envpool()
assert "matplotlib" not in sys.modules
families = ("envpool.atari", "envpool.classic_control", "envpool.jumanji", "envpool.mujoco.gym")
for family in families:
    assert family not in sys.modules, family
    assert family + ".registration" in sys.modules, family
assert not hasattr(envpool, "jumanji") and not hasattr(envpool, "mujoco")
assert choose_env("CartPole-v1").backend == "envpool"
env = EnvpoolVecEnv("CartPole-v1", 2, 0, {})
env.async_reset(); env.recv(); env.close()
assert sys.modules["envpool.classic_control"].__file__.endswith("__init__.py")
assert "envpool.atari" not in sys.modules and "matplotlib" not in sys.modules
from envpool.registration import registry
registered = {spec[0] for spec in registry.specs.values()}
assert set(families) <= registered, registered
assert len(envpool.list_all_envs()) > 1000
for env_id, shape in (("Pong-v5", (4, 84, 84)), ("HalfCheetah-v5", (17,))):
    env = EnvpoolVecEnv(env_id, 1, 0, {})
    assert env.observation_space.shape == shape, (env_id, env.observation_space)
    env.close()
jumanji_id = next(i for i, spec in registry.specs.items() if spec[0] == "envpool.jumanji")
env = envpool.make(jumanji_id, env_type="gymnasium", num_envs=1)
env.reset()
env.close()
assert sys.modules["envpool.jumanji"].__file__.endswith("__init__.py")
assert import_envpool() is envpool
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_envpool_binding_gives_what_envpools_python_api_gives(env_id):
    # EnvpoolVecEnv steps envpool through its C++ binding (_send/_recv) rather than its Python
    # send/recv: the same observations, rewards and flags, with the same dtypes, step by step.
    fast, public = vec_env.EnvpoolVecEnv(env_id, 8, 3, {}), vec_env.EnvpoolVecEnv(env_id, 8, 3, {})
    public._binding = None
    assert fast._binding is not None
    space = fast.action_space
    space.seed(0)
    fast.async_reset(), public.async_reset()
    ends = 0
    for step in range(600):
        a, b = fast.recv(), public.recv()
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), step
        ends += int(np.count_nonzero(a[2] | a[3]))
        action = np.stack([space.sample() for _ in range(8)])
        fast.send(action), public.send(action)
    assert ends > 0  # episodes ended (and reset) along the way
    fast.close(), public.close()


class _FakeBindingPool:
    """envpool's binding surface, returning the envs out of id order."""

    _state_keys = ["info:env_id", "info:players.env_id", "done", "reward", "trunc", "obs"]
    config = {"max_num_players": 1}

    class _spec:  # noqa: N801 (envpool's attribute name)
        _action_keys = ["env_id", "players.env_id", "action"]
        _action_spec = ((np.int32,), (np.int32,), (np.int32,))

    def __init__(self):
        self.sent = []

    def _recv(self):
        ids = np.array([2, 0, 1], np.int32)
        obs = np.stack([np.full(4, i, np.float32) for i in ids])
        done = np.array([True, False, True])
        trunc = np.array([True, False, False])
        return [ids, ids, done, ids.astype(np.float32), trunc, obs]

    def _send(self, arrays):
        self.sent.append(arrays)

    def send(self, action, env_id):
        self.sent.append(("public", action, env_id))


def test_envpool_binding_reorders_by_env_id_and_sends_envpools_layout():
    vec = object.__new__(vec_env.EnvpoolVecEnv)
    vec._env, vec._env_ids, vec._sent = _FakeBindingPool(), np.arange(3, dtype=np.int32), False
    vec._binding = vec_env._binding_layout(vec._env)
    obs, reward, terminated, truncated = vec.recv()
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2])
    np.testing.assert_array_equal(reward, [0, 1, 2])
    assert reward.dtype == np.float32
    # done & ~trunc, reordered: env 2 truncated, env 1 terminated.
    np.testing.assert_array_equal(terminated, [False, True, False])
    np.testing.assert_array_equal(truncated, [False, False, True])
    # The first send goes through envpool's own (its one-time action check), the rest to the
    # binding as [env_id, players.env_id, action] in the action spec's dtype.
    vec.send(np.array([1, 0, 1], np.int64))
    vec.send(np.array([0, 1, 1], np.int64))
    assert vec._env.sent[0][0] == "public"
    ids, players, action = vec._env.sent[1]
    np.testing.assert_array_equal(ids, [0, 1, 2])
    np.testing.assert_array_equal(players, [0, 1, 2])
    assert action.dtype == np.int32 and action.flags.c_contiguous and action.flags.writeable
    np.testing.assert_array_equal(action, [0, 1, 1])


class _NoBindingPool:
    """Another envpool: without the binding methods the fast path calls (its Python API only)."""

    _state_keys = _FakeBindingPool._state_keys
    _spec = _FakeBindingPool._spec
    config = _FakeBindingPool.config


@pytest.mark.parametrize("pool_class", [_FakeBindingPool, _NoBindingPool])
@pytest.mark.parametrize(
    "change",
    [
        {"config": {"max_num_players": 2}},  # several players per env
        {"_state_keys": _FakeBindingPool._state_keys + ["obs:extra"]},  # a dict observation
        {"_state_keys": ["info:env_id", "done", "reward", "obs"]},  # no truncation flags
        {},
    ],
)
def test_envpool_layouts_the_binding_path_does_not_know_use_envpools_python_api(pool_class, change):
    pool = pool_class()
    for name, value in change.items():
        setattr(pool, name, value)
    known = isinstance(pool, _FakeBindingPool) and not change
    assert (vec_env._binding_layout(pool) is not None) == known
