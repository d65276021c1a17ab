"""impala_jax.runtime.learning.program_cache: a stored learner step is the same program as a
freshly traced one, on one device and on two, and a different config, a damaged file or user code
in the model config never gets a stored program that is not its own."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest

import impala_jax
from impala_jax.core.distributions import make_distribution
from impala_jax.core.losses import LossSpec
from impala_jax.core.networks import make_networks
from impala_jax.core.optim import OptimizerSpec
from impala_jax.core.update import StepSpec
from impala_jax.runtime.learning import program_cache
from impala_jax.runtime.learning.learner import Learner
from tests.test_learner import ACT, OBS, B, random_batch

MODEL = {"fcnet_hiddens": [8]}


@pytest.fixture
def programs(tmp_path, monkeypatch):
    """The program cache on, in a folder of this test's own."""
    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    return tmp_path


def make_learner(num_devices=1, gamma=0.99, replay=0, cached=True, model=MODEL, warm_up=False):
    columns = B // num_devices
    step = StepSpec(
        columns=columns,
        replay_columns=replay,
        replay_slots=2 * replay,
        minibatch_columns=(columns + replay) // 2,
        num_epochs=2,
        shuffle=True,
    )
    return Learner(
        make_networks(model, OBS, ACT),
        make_distribution(ACT),
        OptimizerSpec(lr=[[0, 1e-2], [1000, 1e-3]]),
        LossSpec(gamma, 0.5, 0.01, 1.0, 1.0, None),
        step,
        jax.devices()[:num_devices],
        jax.random.key(0),
        program_key=program_cache.model_description(model, OBS, ACT) if cached else None,
        example=(lambda params: random_batch(99)) if warm_up else None,
    )


def train(learner, updates=3):
    """Params, optimizer state and metrics after ``updates`` steps on fixed batches."""
    metrics = []
    for i in range(updates):
        out = learner.update(learner.put_batch(random_batch(i)), env_steps=400 * i)
        metrics.append(jax.device_get(out))
    return jax.device_get((learner.state.params, learner.state.opt_state)), metrics


def assert_same(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_devices,replay", [(1, 0), (1, 4), (2, 2)])
def test_stored_program_gives_the_plain_jits_updates_bit_for_bit(programs, num_devices, replay):
    reference = make_learner(num_devices, replay=replay, cached=False)
    plain = train(reference)
    plain_entries = reference._step._cache_size()
    first = make_learner(num_devices, replay=replay)
    exported = train(first)
    assert first._step.source == "exported"
    (path,) = programs.glob("learner_step-*.jaxexport")
    assert len(list(programs.glob("learner_init-*.jaxexport"))) == 1  # the initial state's
    jax.clear_caches()  # nothing traced in this process is reused below
    second = make_learner(num_devices, replay=replay)
    loaded = train(second)
    assert second._step.source == "loaded"
    assert list(programs.glob("learner_step-*.jaxexport")) == [path]
    assert_same(plain, exported)
    assert_same(plain, loaded)
    # No more jit cache entries than the plain jit (the outputs fed back keep the arguments'
    # shardings, so the updates after the first do not compile the step again).
    assert 1 <= second._step._cache_size() <= plain_entries


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_devices,replay", [(1, 0), (1, 4), (2, 2)])
def test_the_step_compiled_ahead_from_shapes_gives_the_same_updates(programs, num_devices, replay):
    """warm_up compiles the step from the initial state's trace before that state exists
    (stored program or plain jit alike); the updates are the plain jit's, bit for bit, and
    the jit never compiles a program of its own."""
    plain = train(make_learner(num_devices, replay=replay, cached=False))
    for cached in (False, True, True):  # plain jit, then exported, then loaded
        learner = make_learner(num_devices, replay=replay, cached=cached, warm_up=True)
        assert_same(plain, train(learner))
        assert learner._compiled is not None
        assert learner._step._cache_size() == 0
        if cached:
            assert learner._step.source in ("exported", "loaded")
    assert learner._step.source == "loaded"


@pytest.mark.timeout(300)
def test_a_batch_unlike_the_warm_up_example_is_compiled_for_not_refused(caplog):
    """A batch whose dtypes differ from the example the step was compiled for ahead of time
    is not refused by that program: the learner warns, compiles it for the batch (the jit)
    and gives the plain jit's updates."""
    plain = train(make_learner(cached=False))
    learner = make_learner(cached=False, warm_up=False)
    odd = random_batch(99)
    learner.warm_up(odd._replace(reward=odd.reward.astype(np.float16)))
    with caplog.at_level("WARNING", logger="impala_jax.runtime.learning.learner"):
        assert_same(plain, train(learner))
    assert "compiled for ahead of time" in caplog.text
    assert learner._compiled is None and learner._step._cache_size() == 1


@pytest.mark.timeout(300)
def test_a_different_config_gets_a_program_of_its_own(programs):
    train(make_learner(gamma=0.99), updates=1)
    other = make_learner(gamma=0.5)
    got = train(other, updates=2)
    assert other._step.source == "exported"  # not the gamma=0.99 program
    assert len(list(programs.glob("learner_step-*.jaxexport"))) == 2
    assert_same(got, train(make_learner(gamma=0.5, cached=False), updates=2))
    wider = make_learner(model={"fcnet_hiddens": [16]})
    train(wider, updates=1)
    assert wider._step.source == "exported"


@pytest.mark.timeout(300)
def test_a_damaged_file_is_traced_and_written_again(programs):
    train(make_learner(), updates=1)
    (path,) = programs.glob("learner_step-*.jaxexport")
    path.write_bytes(b"not a program")
    again = make_learner()
    got = train(again, updates=2)
    assert again._step.source == "exported"
    assert_same(got, train(make_learner(cached=False), updates=2))
    reloaded = make_learner()
    train(reloaded, updates=1)
    assert reloaded._step.source == "loaded"


def test_without_the_compilation_cache_or_with_user_code_nothing_is_stored(monkeypatch):
    monkeypatch.setattr(program_cache, "directory", lambda: None)
    assert not isinstance(make_learner()._step, program_cache.CachedProgram)
    custom = {"fcnet_hiddens": [8], "fcnet_kernel_initializer": lambda *a: None}
    assert program_cache.model_description(custom, OBS, ACT) is None


def test_space_bounds_and_sources_change_the_description(tmp_path):
    low = np.zeros(2000, np.float32)
    high = np.linspace(1, 2, 2000, dtype=np.float32)
    other_high = high.copy()
    other_high[1000] += 0.5
    a, b = gym.spaces.Box(low, high), gym.spaces.Box(low, other_high)
    assert repr(a) == repr(b)  # gymnasium's repr abbreviates the bounds...
    assert program_cache.model_description(MODEL, a, ACT) != program_cache.model_description(
        MODEL, b, ACT
    )  # ...the description does not
    (tmp_path / "m.py").write_text("x = 1\n")
    before = program_cache.source_digest(tmp_path)
    (tmp_path / "m.py").write_text("x = 2\n")
    assert program_cache.source_digest(tmp_path) != before


def test_the_source_digest_covers_the_whole_package():
    """Catches: the digest reading one layer only (it read runtime/ alone, so an edit to
    core/update.py loaded the programs traced before it)."""
    assert program_cache._PACKAGE == Path(impala_jax.__file__).resolve().parent
    assert (program_cache._PACKAGE / "core" / "update.py").is_file()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "model",
    [
        {"fcnet_hiddens": [16]},
        {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4},
    ],
    ids=["mlp", "lstm"],
)
def test_an_algorithm_built_twice_loads_its_step_and_trains(programs, model):
    from impala_jax import IMPALAConfig

    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1, num_envs_per_env_runner=8, rollout_fragment_length=8)
        .training(
            train_batch_size_per_learner=64, replay_proportion=1.0, replay_buffer_num_slots=64
        )
        .rl_module(model_config=model)
        .reporting(min_time_s_per_iteration=0)
    )
    sources, trained = [], []
    for _ in range(2):
        with config.build() as algo:
            for _ in range(2):
                result = algo.train()
            sources.append(algo.learner._step.source)
            trained.append(result["num_env_steps_trained_lifetime"])
    assert sources == ["exported", "loaded"]
    assert min(trained) > 0
