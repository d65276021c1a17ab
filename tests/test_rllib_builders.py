"""RLlib parity: RLlib 2.60's builder surface, batch rounding, DefaultModelConfig, examples.

The signatures are compared against ray's own IMPALAConfig (the test extra installs ray); every
keyword RLlib accepts is accepted here, with its meaning or a clear error.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import warnings

import pytest

from impala_jax import IMPALAConfig
from impala_jax.rllib.compat_tables import DEPRECATED, RLLIB_OBJECT, UNSUPPORTED
from tests.test_algorithm import small_config

rllib_impala = pytest.importorskip("ray.rllib.algorithms.impala")
RLlibConfig = rllib_impala.IMPALAConfig
AlgorithmConfig = pytest.importorskip("ray.rllib.algorithms.algorithm_config").AlgorithmConfig
DefaultModelConfig = pytest.importorskip(
    "ray.rllib.core.rl_module.default_model_config"
).DefaultModelConfig

# RLlib's methods that return the config but are not builders.
NOT_BUILDERS = {"copy", "get_config_for_module", "update_from_dict"}


def _rllib_builders() -> list[str]:
    return sorted(
        name
        for name, fn in inspect.getmembers(RLlibConfig, inspect.isfunction)
        if not name.startswith("_")
        and "Self" in str(inspect.signature(fn).return_annotation)
        and name not in NOT_BUILDERS
    )


def _rllib_params(builder: str) -> dict[str, inspect.Parameter]:
    """RLlib's keywords of `builder`, following IMPALAConfig's **kwargs to AlgorithmConfig."""
    params = {}
    for cls in (RLlibConfig, AlgorithmConfig):
        for name, p in list(inspect.signature(getattr(cls, builder)).parameters.items())[1:]:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                params.setdefault(name, p)
    return params


def _own_params(builder: str) -> dict[str, inspect.Parameter]:
    sig = inspect.signature(getattr(IMPALAConfig, builder))
    return {n: p for n, p in list(sig.parameters.items())[1:] if p.kind is not p.VAR_KEYWORD}


BUILDERS = _rllib_builders()
KEYWORDS = [(b, k) for b in BUILDERS for k in _rllib_params(b)]


def test_rllib_builders_found():
    assert {"api_stack", "framework", "multi_agent", "offline_data", "training"} <= set(BUILDERS)
    assert len(KEYWORDS) > 250


@pytest.mark.parametrize("builder", BUILDERS)
def test_every_rllib_keyword_is_known_here(builder):
    assert hasattr(IMPALAConfig, builder)
    known = set(_own_params(builder)) | set(UNSUPPORTED.get(builder, {}))
    known |= set(DEPRECATED.get(builder, {}))
    missing = sorted(set(_rllib_params(builder)) - known)
    assert not missing, f"{builder}() lacks RLlib's keywords {missing}"
    # Nothing in the tables that RLlib does not have (typos would never be reached).
    extra = (set(UNSUPPORTED.get(builder, {})) | set(DEPRECATED.get(builder, {}))) - set(
        _rllib_params(builder)
    )
    assert not extra


@pytest.mark.parametrize("builder", BUILDERS)
def test_positional_parameters_match_rllib(builder):
    def positional(params):
        return [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]

    assert positional(_own_params(builder)) == positional(_rllib_params(builder))


@pytest.mark.parametrize(
    "builder,keyword",
    [(b, k) for b in UNSUPPORTED for k in UNSUPPORTED[b]],
)
def test_unsupported_keyword_accepts_rllibs_default_only(builder, keyword):
    default, _ = UNSUPPORTED[builder][keyword]
    fresh = RLlibConfig().__dict__.get(keyword, RLLIB_OBJECT)
    if default is not RLLIB_OBJECT and fresh is not RLLIB_OBJECT and not callable(fresh):
        assert fresh == default or fresh is None  # the table holds RLlib's fresh value
    config = IMPALAConfig()
    given = None if default is RLLIB_OBJECT else default
    assert getattr(config, builder)(**{keyword: given}) is config
    assert config == IMPALAConfig()  # nothing changed
    with pytest.raises(NotImplementedError, match=keyword):
        getattr(config, builder)(**{keyword: "something else"})


@pytest.mark.parametrize(
    "builder,keyword",
    [(b, k) for b in DEPRECATED for k in DEPRECATED[b]],
)
def test_deprecated_keyword_as_rllib(builder, keyword):
    old = DEPRECATED[builder][keyword]
    config = IMPALAConfig()
    getattr(config, builder)(**{keyword: -1})  # RLlib's "not given"
    assert config == IMPALAConfig()
    if not old.honoured:
        with pytest.raises(ValueError, match=keyword):
            getattr(config, builder)(**{keyword: 2})
        return
    value = {"model_config": {"fcnet_hiddens": [8]}}.get(old.target, 2)
    with pytest.warns(DeprecationWarning, match=keyword):
        getattr(config, builder)(**{keyword: value})
    if old.target is not None:
        assert config.to_dict()[old.target] == (
            config.model_config if old.target == "model_config" else value
        )


def test_harmless_calls_from_rllibs_example_harness(caplog):
    # What run_rllib_example_script_experiment calls on the new stack, with its defaults.
    config = IMPALAConfig().environment("CartPole-v1")
    with caplog.at_level(logging.INFO, logger="impala_jax"):
        config.framework("torch")
        config.framework("torch")
    assert sum("always runs JAX" in r.message for r in caplog.records) <= 1
    config.api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
    config.resources(num_gpus=0)
    config.learners(num_gpus_per_learner=0)
    config.multi_agent()
    config.offline_data()
    config.experimental(_validate_config=True)
    config.validate()
    assert config.enable_rl_module_and_learner is True and config.framework_str == "torch"
    d = config.to_dict()
    assert d["framework"] == "torch" and d["num_gpus"] == 0
    assert d["enable_env_runner_and_connector_v2"] is True
    assert IMPALAConfig.from_dict(d).to_dict() == d


def test_framework_and_api_stack_errors():
    with pytest.raises(NotImplementedError, match="old API stack"):
        IMPALAConfig().api_stack(enable_rl_module_and_learner=False)
    with pytest.raises(NotImplementedError, match="old API stack"):
        IMPALAConfig().api_stack(True, False)
    with pytest.raises(ValueError, match="tfe"):
        IMPALAConfig().framework("tfe")
    with pytest.raises(NotImplementedError, match="torch_compile_learner"):
        IMPALAConfig().framework("torch", torch_compile_learner=True)
    with pytest.raises(ValueError, match="rollouts"):
        IMPALAConfig().rollouts(num_rollout_workers=2)
    with pytest.raises(ValueError, match="exploration"):
        IMPALAConfig().exploration(explore=False)
    assert IMPALAConfig().framework_str == "jax"


def test_deprecated_resources_map_onto_their_fields():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = IMPALAConfig().resources(num_learner_workers=0, num_cpus_per_worker=2)
    assert config.num_learners == 0 and config.num_cpus_per_env_runner == 2


# --- DefaultModelConfig -------------------------------------------------------------------


def test_default_model_config_at_defaults_is_accepted():
    config = IMPALAConfig().rl_module(model_config=DefaultModelConfig())
    config.validate()
    assert config.model_config == dict(
        dataclasses.asdict(DefaultModelConfig()),
        encoder="auto",
        impala_cnn_channels=[16, 32, 32],
        post_fcnet_hiddens=None,
        post_fcnet_activation="relu",
    )
    # and as the plain dict of every field
    IMPALAConfig().rl_module(model_config=dataclasses.asdict(DefaultModelConfig())).validate()


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"use_lstm": "yes"}, "use_lstm"),
        ({"fusionnet_hiddens": [64]}, "fusionnet_hiddens"),
        ({"fcnet_kernel_initializer": "no_such_init_"}, "fcnet_kernel_initializer"),
        ({"conv_bias_initializer": "orthogonal_"}, "conv_bias_initializer"),
        (
            {
                "head_fcnet_kernel_initializer": "xavier_uniform_",
                "head_fcnet_kernel_initializer_kwargs": {"std": 1},
            },
            "head_fcnet_kernel_initializer_kwargs",
        ),
    ],
)
def test_default_model_config_values_not_honoured_are_errors(fields, match):
    config = IMPALAConfig().rl_module(model_config=DefaultModelConfig(**fields))
    with pytest.raises(ValueError, match=match):
        config.validate()


# --- builds and trains --------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_rounding_counts_over_two_learner_devices():
    # conftest forces 2 CPU devices; 20 steps with fragments of 8 -> 3 fragments = 24 each.
    config = small_config().training(train_batch_size_per_learner=20).learners(num_learners=2)
    assert config.effective_train_batch_size_per_learner == 24
    with config.build() as algo:
        result = algo.train()
    learner = result["learners"]["default_policy"]
    assert learner["effective_train_batch_size_per_learner"] == 24
    assert learner["effective_total_train_batch_size"] == 48
    updates = learner["num_updates_lifetime"]
    assert result["num_env_steps_trained_lifetime"] == 48 * updates


@pytest.mark.timeout(180)
def test_build_logs_the_effective_batch_once(caplog):
    config = small_config().training(train_batch_size_per_learner=20)
    with caplog.at_level(logging.INFO, logger="impala_jax"):
        algo = config.build()
    algo.stop()
    lines = [r.message for r in caplog.records if "rounded up" in r.message]
    assert len(lines) == 1 and "train_batch_size_per_learner=20" in lines[0] and "24" in lines[0]


@pytest.mark.timeout(180)
def test_default_model_config_builds_and_trains_one_iteration():
    config = small_config().rl_module(model_config=DefaultModelConfig())
    with config.build() as algo:
        params = algo.learner.state.params
        assert params["encoder"]["Dense_0"]["kernel"].shape[-1] == 256  # RLlib's [256, 256]
        result = algo.train()
    assert result["training_iteration"] == 1


# --- RLlib's other config attributes ----------------------------------------------------------


def test_every_rllib_attribute_exists_or_is_a_clear_error():
    from impala_jax.rllib.compat import NotOffered
    from impala_jax.rllib.compat_tables import ATTRIBUTE_ALIASES, RLLIB_ONLY_ATTRIBUTES

    ours, theirs = IMPALAConfig(), RLlibConfig()
    names = sorted(n for n in dir(theirs) if not n.startswith("_"))
    plain_missing = []
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                getattr(ours, name)
        except NotOffered as err:
            assert name in RLLIB_ONLY_ATTRIBUTES and name in str(err)
            assert isinstance(err, NotImplementedError)
        except AttributeError:
            plain_missing.append(name)
    assert not plain_missing, plain_missing
    assert not hasattr(ours, "input_")  # a NotOffered is an AttributeError for hasattr
    # The list names nothing ray's config lacks, and no alias shadows a real field.
    assert RLLIB_ONLY_ATTRIBUTES <= set(names)
    assert not set(ATTRIBUTE_ALIASES) & set(dir(type(ours)))


def test_old_attribute_names_and_dict_shims():
    config = IMPALAConfig().env_runners(num_env_runners=3).training(lr=0.01)
    with pytest.warns(DeprecationWarning, match="num_env_runners"):
        assert config.num_rollout_workers == 3
    assert config.get("lr") == 0.01 and config.get("no_such_key", 7) == 7
    assert config.get("num_rollout_workers") == 3
    assert dict(config.items()) == config.to_dict() and "gamma" in config.keys()
    assert not config.is_multi_agent and config.is_online and not config.is_offline
    theirs = RLlibConfig()
    assert theirs.is_multi_agent is False and theirs.is_online is True
