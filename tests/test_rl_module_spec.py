"""``rl_module(rl_module_spec=RLModuleSpec(factory=...))`` on the config side: what it stores, how
it round-trips (to_dict/from_dict/copy, a checkpoint's JSON), and the errors that name the field,
the value and the fix. What the algorithm builds with it is tests/test_network_factory.py's."""

from __future__ import annotations

import json

import pytest

import impala_jax
from impala_jax import IMPALAConfig, RLModuleSpec
from impala_jax.rllib.module_spec import DEFAULT_FACTORY
from impala_jax.runtime.process import checkpoint

FACTORY_PATH = "tests.test_rl_module_spec:my_factory"


def my_factory(model_config, observation_space, action_space):
    from impala_jax.core.networks import make_networks

    return make_networks(model_config, observation_space, action_space)


NOT_A_FUNCTION = 3


def with_factory(factory) -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment("CartPole-v1")
        .rl_module(rl_module_spec=RLModuleSpec(factory=factory))
    )


def test_the_face_exports_the_spec():
    assert impala_jax.RLModuleSpec is RLModuleSpec
    assert "RLModuleSpec" in impala_jax.__all__


def test_default_is_impala_jaxs_own_networks():
    config = IMPALAConfig()
    assert config.rl_module_spec is None
    assert config.to_dict()["rl_module_spec"] is None
    assert RLModuleSpec().factory is None
    assert config.get_default_rl_module_spec().factory == DEFAULT_FACTORY
    config.rl_module(rl_module_spec=None).validate()
    assert config == IMPALAConfig()


@pytest.mark.parametrize("factory", [my_factory, FACTORY_PATH])
def test_a_factory_is_stored_and_round_trips(factory):
    config = with_factory(factory)
    config.validate()
    assert config.rl_module_spec == RLModuleSpec(factory=factory)
    spec = config.get_default_rl_module_spec()
    assert spec.factory is factory or spec.factory == factory
    assert spec.model_config == config.model_config
    assert config.to_dict()["rl_module_spec"] == {"factory": factory}
    assert IMPALAConfig.from_dict(config.to_dict()) == config
    assert config.copy() == config and config.copy(copy_frozen=True).rl_module_spec.factory
    assert config != IMPALAConfig().environment("CartPole-v1")


def test_a_dict_of_the_spec_sets_it_too():
    config = IMPALAConfig().rl_module(rl_module_spec={"factory": FACTORY_PATH})
    assert config.rl_module_spec == RLModuleSpec(factory=FACTORY_PATH)


def test_a_checkpoint_stores_the_factory_by_import_path():
    stored = json.loads(json.dumps(checkpoint.jsonable(with_factory(my_factory).to_dict())))
    assert stored["rl_module_spec"] == {"factory": FACTORY_PATH}
    restored = IMPALAConfig.from_dict(stored)
    restored.validate()
    assert restored.get_default_rl_module_spec().factory == FACTORY_PATH


def test_rllibs_rl_module_spec_is_a_clear_error():
    rllib_spec = pytest.importorskip("ray.rllib.core.rl_module.rl_module").RLModuleSpec
    with pytest.raises(ValueError, match=r"rl_module_spec=.*impala_jax\.RLModuleSpec\(factory="):
        IMPALAConfig().rl_module(rl_module_spec=rllib_spec())


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (NOT_A_FUNCTION, "not callable"),
        ("tests.test_rl_module_spec:NOT_A_FUNCTION", "not callable"),
        ("tests.test_rl_module_spec:no_such_factory", "cannot be imported"),
        ("no_such_package.nets:factory", "cannot be imported"),
        ("my_factory", "not an importable path"),
        ("tests.test_rl_module_spec:<lambda>", "not an importable path"),
    ],
)
def test_a_bad_factory_names_the_field_the_value_and_the_fix(factory, match):
    config = with_factory(factory)
    with pytest.raises(ValueError, match="rl_module_spec=") as err:
        config.validate()
    assert match in str(err.value) and repr(factory) in str(err.value)
    assert ".rl_module(rl_module_spec=...)" in str(err.value)


def test_a_lambda_validates_but_its_checkpoint_does_not():
    config = with_factory(lambda m, o, a: None)
    config.validate()
    stored = checkpoint.jsonable(config.to_dict())
    with pytest.raises(ValueError, match="define the factory at module level"):
        IMPALAConfig.from_dict(stored).validate()


def test_other_values_are_errors_at_once_and_change_nothing():
    config = IMPALAConfig()
    for value, match in [
        (3, "expected None or an impala_jax.RLModuleSpec"),
        ({"factory": FACTORY_PATH, "module_class": 1}, "unknown key"),
        (RLModuleSpec(factory=FACTORY_PATH, model_config={"fcnet_hiddens": [8]}), "model_config"),
        (RLModuleSpec(observation_space=object()), "environment\\(observation_space"),
    ]:
        with pytest.raises(ValueError, match=match):
            config.rl_module(model_config={"fcnet_hiddens": [8]}, rl_module_spec=value)
    assert config == IMPALAConfig()


def test_a_custom_factory_with_use_lstm_is_an_error():
    config = with_factory(my_factory).rl_module(model_config={"use_lstm": True})
    with pytest.raises(ValueError, match=r"rl_module_spec=.*use_lstm.*LSTM core"):
        config.validate()
    # impala_jax's own factory, given by name, builds the LSTM itself.
    with_factory(DEFAULT_FACTORY).rl_module(model_config={"use_lstm": True}).validate()
    IMPALAConfig().rl_module(model_config={"use_lstm": True}).validate()


def test_a_search_space_is_carried_until_a_trial_resolves_it():
    space = {"grid_search": [None, {"factory": FACTORY_PATH}]}
    config = IMPALAConfig().rl_module(rl_module_spec=space)
    config.validate()
    assert config.to_dict()["rl_module_spec"] == space
    with pytest.raises(ValueError, match="rl_module_spec"):
        config.environment("CartPole-v1").build()


@pytest.mark.parametrize(
    ("factory", "names"),
    [
        (None, "own"),
        (DEFAULT_FACTORY, "own"),
        ("impala_jax.core.networks:make_networks", "own"),
        (my_factory, "custom"),
        (FACTORY_PATH, "custom"),
        ("tests.test_rl_module_spec.my_factory", "custom"),
        (NOT_A_FUNCTION, "nothing"),
        ("tests.test_rl_module_spec:NOT_A_FUNCTION", "nothing"),
        ("tests.test_rl_module_spec:no_such_factory", "nothing"),
        ("my_factory", "nothing"),
    ],
)
def test_validate_and_the_runners_resolve_a_factory_alike(factory, names):
    # One resolution (runtime/acting/network_factory.py): a factory validate() passes is one the
    # runners and the learner can build with, and the reverse.
    from impala_jax.runtime.acting.network_factory import resolve_factory

    try:
        resolved = resolve_factory(factory)
    except ValueError:
        resolved = "nothing"
    assert {None: "own", my_factory: "custom"}.get(resolved, resolved) == names
    try:
        with_factory(factory).validate()
    except ValueError:
        assert names == "nothing"
    else:
        assert names != "nothing"
