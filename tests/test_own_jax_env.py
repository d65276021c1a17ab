"""A user's own env written in JAX (a gymnax ``Environment``) trains on device, in every form
``environment()`` takes; other envs keep the host path; a broken env is a clear error."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from experiments.catch_jax import Catch, CatchParams
from experiments.custom_env import CorridorEnv
from impala_jax import IMPALA, IMPALAConfig, register_env
from impala_jax.runtime.envs import env_registry
from impala_jax.runtime.envs.env_registry import choose_env, is_jax_env, make_jax_env
from impala_jax.runtime.learning import program_cache
from impala_jax.runtime.ondevice.device_engine import DeviceEngine


@pytest.fixture
def registry(monkeypatch):
    """impala_jax's registry, emptied after the test."""
    monkeypatch.setattr(env_registry, "REGISTERED", {})
    return env_registry.REGISTERED


def _small(env, **env_config) -> IMPALAConfig:
    """16 envs x 20 steps, one update per iteration."""
    return (
        IMPALAConfig()
        .environment(env, env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=20)
        .training(train_batch_size_per_learner=320)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
        .debugging(seed=0)
    )


def _params_equal(a, b) -> bool:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(np.array_equal(x, y) for x, y in pairs)


@pytest.mark.parametrize("form", ["class", "instance", "import path", "registered name"])
def test_every_form_of_a_jax_env_trains_on_device(form, registry):
    env = {
        "class": Catch,
        "instance": Catch(),
        "import path": "experiments.catch_jax:Catch",
        "registered name": "my_catch",
    }[form]
    register_env("my_catch", lambda env_config: Catch())
    assert is_jax_env(env)
    with _small(env).build() as algo:
        assert isinstance(algo.engine, DeviceEngine) and algo.env_runner_group is None
        steps = [algo.train()["num_env_steps_sampled_lifetime"] for _ in range(2)]
    assert steps == [320, 640]


def test_env_config_sets_params_and_a_creator_receives_it(registry):
    env = make_jax_env(Catch, {"rows": 6, "columns": 3})
    assert (env.params.rows, env.params.columns) == (6, 3) and env.version is None
    with pytest.raises(ValueError, match=r"\['rowz'\] are not fields of CatchParams"):
        make_jax_env(Catch, {"rowz": 6})
    # A creator gets env_config (RLlib's habit) and may return gymnax.make's (env, params).
    register_env("sized", lambda cfg: (Catch(), CatchParams(rows=cfg["rows"])))
    assert make_jax_env("sized", {"rows": 4}).params.rows == 4
    with _small("sized", rows=4).build() as algo:
        result = algo.train()
    # Every episode lasts rows - 1 = 3 steps.
    assert result["env_runners"]["episode_len_mean"] == 3


def test_a_checkpoint_of_an_importable_class_restores_on_device(tmp_path):
    """The class is stored by its import path (experiments.catch_jax:Catch) and found again."""
    with _small(Catch).build() as algo:
        algo.train()
        path = algo.save(tmp_path / "ckpt").checkpoint.path
        params = jax.device_get(algo.learner.state.params)
    with IMPALA.from_checkpoint(path) as restored:
        assert isinstance(restored.engine, DeviceEngine)
        assert _params_equal(params, jax.device_get(restored.learner.state.params))
        assert restored.train()["num_env_steps_sampled_lifetime"] == 640


def test_an_instance_is_not_stored_and_from_checkpoint_asks_for_it(tmp_path):
    with _small(Catch()).build() as algo:
        algo.train()
        path = algo.save(tmp_path / "ckpt").checkpoint.path
    with pytest.raises(ValueError, match=r"env instance.*from_checkpoint\(path, env=MyEnv"):
        IMPALA.from_checkpoint(path)
    with IMPALA.from_checkpoint(path, env=Catch()) as restored:
        assert restored.train()["num_env_steps_sampled_lifetime"] == 640


def test_a_users_env_program_is_not_kept_on_disk(tmp_path, monkeypatch):
    """The program cache's key covers impala_jax's code and gymnax's version, not the user's
    env: its rollout-and-update program is traced in every process."""
    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    with _small(Catch).build() as algo:
        algo.train()
        assert not isinstance(algo.engine._program, program_cache.CachedProgram)


def test_host_envs_keep_the_host_path(registry):
    """A gymnasium class is never called to ask; a creator is, once per env_config, and a host
    env it made is closed."""
    assert not is_jax_env(CorridorEnv) and choose_env(CorridorEnv).backend == "gymnasium"
    assert not is_jax_env("CartPole-v1") and not is_jax_env("experiments.custom_env:CorridorEnv")
    made = []

    def creator(cfg):
        made.append(CorridorEnv(cfg))
        made[-1].close = lambda: made.append("closed")
        return made[-1]

    register_env("corridor", creator)
    assert not is_jax_env("corridor") and not is_jax_env("corridor")
    assert made[1:] == ["closed"]
    with _small(CorridorEnv).build() as algo:
        assert algo.env_runner_group is not None and not isinstance(algo.engine, DeviceEngine)
    with pytest.raises(ValueError, match="policy_lag"):
        _small(CorridorEnv).env_runners(policy_lag=1).validate()
    _small(Catch).env_runners(policy_lag=1).validate()


def test_asking_whether_an_env_is_in_jax_imports_no_gymnax():
    code = (
        "import sys\n"
        "from impala_jax.runtime.envs.env_registry import is_jax_env\n"
        "from experiments.custom_env import CorridorEnv\n"
        "assert not is_jax_env('CartPole-v1') and not is_jax_env(CorridorEnv)\n"
        "assert not is_jax_env('experiments.custom_env:CorridorEnv')\n"
        "assert 'gymnax' not in sys.modules, 'gymnax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


class LooksLikeGymnax:
    """gymnax's methods without its base class."""

    def reset_env(self, key, params): ...

    def step_env(self, key, state, action, params): ...


class NoStep(environment.Environment):
    def reset_env(self, key, params):
        return jnp.zeros(2), environment.EnvState(time=0)

    def action_space(self, params):
        return spaces.Discrete(2)


@struct.dataclass
class Timeless:
    x: jax.Array


class NoTime(NoStep):
    """Its state has no time field and it does not define is_truncated."""

    def reset_env(self, key, params):
        return jnp.zeros(2), Timeless(x=jnp.zeros(()))

    def step_env(self, key, state, action, params):
        return jnp.zeros(2), state, jnp.zeros(()), jnp.array(False), {}

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (2,), jnp.float32)


class BatchedReward(NoTime):
    def reset_env(self, key, params):
        return jnp.zeros(2), environment.EnvState(time=0)

    def step_env(self, key, state, action, params):
        return jnp.zeros(2), state, jnp.zeros((4,)), jnp.array(False), {}


class NeedsArguments(Catch):
    def __init__(self, size):
        self.size = size


@pytest.mark.parametrize(
    "env, match",
    [
        (
            LooksLikeGymnax,
            "LooksLikeGymnax has gymnax's reset_env and step_env but does not "
            "subclass gymnax.environments.environment.Environment",
        ),
        (NoStep, "NoStep does not define step_env, observation_space"),
        (NoTime, r"step_env.*or is_truncated\(state, params\) cannot be traced.*'time'"),
        (BatchedReward, r"reward \(4,\) \(expected \(\)\)"),
        (NeedsArguments, r"NeedsArguments\(\) needs arguments.*register_env"),
    ],
)
def test_an_env_that_breaks_the_protocol_is_a_clear_error(env, match):
    with pytest.raises(ValueError, match=match) as err:
        _small(env).build()
    if env is not NeedsArguments:
        assert "docs/config.md" in str(err.value) or "expected" in str(err.value)


def test_a_seed_group_trains_a_users_env():
    from impala_jax import SeedGroup

    with SeedGroup(_small(Catch), [0, 1]) as group:
        results = group.train()
    assert [r["seed"] for r in results] == [0, 1]
    assert all(r["num_env_steps_sampled_lifetime"] == 320 for r in results)


def test_the_catch_experiment_learns():
    """experiments/catch_jax.py reaches its stop's return within its env-step budget."""
    from impala_jax.cli.experiment import load_experiment

    config, stop = load_experiment("experiments/catch_jax.py")
    goal, budget = stop["env_runners/episode_return_mean"], stop["num_env_steps_sampled_lifetime"]
    with config.build() as algo:
        assert isinstance(algo.engine, DeviceEngine)
        while True:
            result = algo.train()
            ret = result["env_runners"].get("episode_return_mean", float("nan"))
            steps = result["num_env_steps_sampled_lifetime"]
            if ret >= goal or steps >= budget:
                break
    assert ret >= goal, (ret, steps)


def test_the_example_in_the_docs_trains_on_device(registry):
    """docs/config.md's Coin, run as written; its last config (a registered name) trains."""
    text = open("docs/config.md").read()
    block = text[text.index("```python\nimport jax\n") + len("```python\n") :]
    namespace: dict = {}
    exec(block[: block.index("```")], namespace)
    config = namespace["config"]
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=20)
    config.training(train_batch_size_per_learner=320).reporting(min_time_s_per_iteration=0)
    with config.build() as algo:
        assert isinstance(algo.engine, DeviceEngine)
        assert algo.train()["env_runners"]["episode_len_mean"] == 10
