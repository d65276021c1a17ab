"""IMPALAConfig: RLlib's names, defaults and builder semantics; stricter validation; round trips."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import re
import sys
import types

import pytest

from impala_jax import IMPALAConfig, NotProvided
from impala_jax.core.loss_spec import COEFFICIENTS as LOSS_COEFFICIENTS
from impala_jax.rllib.config import DEFAULT_MODEL_CONFIG

# RLlib 2.60's builder keywords and the values a fresh RLlib IMPALAConfig() holds
# (test_tables_are_the_installed_rllibs_defaults checks them against the installed ray).
RLLIB_TABLES = """
## .training()
| `vtrace` | `true` |
| `vtrace_clip_rho_threshold` | `1.0` |
| `vtrace_clip_pg_rho_threshold` | `1.0` |
| `num_gpu_loader_threads` | `8` |
| `num_multi_gpu_tower_stacks` | `1` |
| `minibatch_buffer_size` | `1` |
| `replay_proportion` | `0.0` |
| `replay_buffer_num_slots` | `0` |
| `learner_queue_size` | `3` |
| `learner_queue_timeout` | `300` |
| `timeout_s_sampler_manager` | `0.0` |
| `timeout_s_aggregator_manager` | `0.0` |
| `broadcast_interval` | `1` |
| `grad_clip` | `40.0` |
| `opt_type` | `"adam"` |
| `lr_schedule` | `null` |
| `decay` | `0.99` |
| `momentum` | `0.0` |
| `epsilon` | `0.1` |
| `vf_loss_coeff` | `0.5` |
| `entropy_coeff` | `0.01` |
| `entropy_coeff_schedule` | `null` |
| `_separate_vf_optimizer` | `false` |
| `_lr_vf` | `0.0005` |
| `num_aggregation_workers` | `-1` |
| `max_requests_in_flight_per_aggregator_worker` | `-1` |
| `gamma` (inherited) | `0.99` |
| `lr` (inherited) | `0.0005` |
| `grad_clip_by` (inherited) | `"global_norm"` |
| `train_batch_size` (inherited) | `500` |
| `train_batch_size_per_learner` (inherited) | `null` |
| `num_epochs` (inherited) | `1` |
| `minibatch_size` (inherited) | `null` |
| `shuffle_batch_per_epoch` (inherited) | `false` |
| `learner_class` (inherited) | `null` |
## .env_runners()
| `env_runner_cls` | `null` |
| `num_env_runners` | `2` |
| `num_envs_per_env_runner` | `1` |
| `gym_env_vectorize_mode` | `"sync"` |
| `num_cpus_per_env_runner` | `1` |
| `num_gpus_per_env_runner` | `0` |
| `sample_timeout_s` | `60.0` |
| `max_requests_in_flight_per_env_runner` | `1` |
| `compress_observations` | `false` |
| `rollout_fragment_length` | `50` |
| `batch_mode` | `"truncate_episodes"` |
| `explore` | `true` |
| `observation_filter` | `"NoFilter"` |
## .learners()
| `num_learners` | `1` |
| `num_cpus_per_learner` | `"auto"` |
| `num_gpus_per_learner` | `0` |
| `num_aggregator_actors_per_learner` | `0` |
| `max_requests_in_flight_per_aggregator_actor` | `3` |
| `local_gpu_idx` | `0` |
| `learner_class` | `null` |
## .environment()
| `env` | `null` |
| `env_config` | `{}` |
| `observation_space` | `null` |
| `action_space` | `null` |
| `render_env` | `false` |
| `clip_rewards` | `null` |
| `normalize_actions` | `true` |
| `clip_actions` | `false` |
| `disable_env_checking` | `false` |
| `is_atari` | `null` |
| `action_mask_key` | `"action_mask"` |
## .debugging()
| `_env_runners_only` | `false` |
| `_skip_learners` | `false` |
| `log_level` (inherited) | `"WARN"` |
| `log_sys_usage` (inherited) | `true` |
| `fake_sampler` (inherited) | `false` |
| `seed` (inherited) | `null` |
## .evaluation()
| `evaluation_interval` | `null` |
| `evaluation_duration` | `10` |
| `evaluation_duration_unit` | `"episodes"` |
| `evaluation_sample_timeout_s` | `120.0` |
| `evaluation_parallel_to_training` | `false` |
| `evaluation_force_reset_envs_before_iteration` | `true` |
| `evaluation_config` | `null` |
| `evaluation_num_env_runners` | `0` |
| `custom_evaluation_function` | `null` |
## .reporting()
| `metrics_num_episodes_for_smoothing` | `100` |
| `min_time_s_per_iteration` | `10` |
| `min_train_timesteps_per_iteration` | `0` |
| `min_sample_timesteps_per_iteration` | `0` |
| `log_gradients` | `false` |
## .fault_tolerance()
| `restart_failed_env_runners` | `true` |
| `ignore_env_runner_failures` | `false` |
| `max_num_env_runner_restarts` | `1000` |
| `delay_between_env_runner_restarts_s` | `60.0` |
| `restart_failed_sub_environments` | `false` |
| `num_consecutive_env_runner_failures_tolerance` | `100` |
| `env_runner_health_probe_timeout_s` | `30.0` |
| `env_runner_restore_timeout_s` | `1800.0` |
## .checkpointing()
| `export_native_model_files` | `false` |
| `checkpoint_trainable_policies_only` | `false` |
## .rl_module()
| `model_config` | `{}` |
## model_config keys (RLlib's DefaultModelConfig) and defaults
| `fcnet_hiddens` | [256, 256] |
| `fcnet_activation` | "tanh" |
| `fcnet_use_layernorm` | False |
| `conv_filters` | None (a list of [out_channels, kernel, stride] when given) |
| `conv_activation` | "relu" |
| `head_fcnet_hiddens` | [] |
| `head_fcnet_activation` | "relu" |
| `free_log_std` | False |
| `log_std_clip_param` | 20.0 |
| `vf_share_layers` | True |
| `use_lstm` | False |
| `max_seq_len` | 20 |
| `lstm_cell_size` | 256 |
| `lstm_use_prev_action` | False |
| `lstm_use_prev_reward` | False |
"""

# Where impala_jax's fresh value deliberately differs from RLlib's (also in docs/config.md).
DIFFERENCES = {
    # RLlib stores {} and fills in DefaultModelConfig when it builds the module; impala_jax
    # stores the merged dict, so the config shows exactly what the networks are built from.
    ("rl_module", "model_config"): dict(DEFAULT_MODEL_CONFIG),
}

# impala_jax's own model_config keys and the old-stack keys RLlib's tuned examples still pass
# (not in RLlib's DefaultModelConfig).
EXTRA_MODEL_KEYS = {
    "encoder": "auto",
    "impala_cnn_channels": [16, 32, 32],
    "post_fcnet_hiddens": None,
    "post_fcnet_activation": "relu",
}


def _parse_value(text: str):
    text = text.strip().strip("`")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text.split(" (")[0])


def _parse_tables(text: str) -> dict[str, dict[str, object]]:
    """{section: {keyword: fresh value}}; section is a builder name or 'model_config'."""
    tables: dict[str, dict[str, object]] = {}
    section = None
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.match(r"## \.(\w+)\(\)", line)
            section = m.group(1) if m else ("model_config" if "model_config" in line else None)
            continue
        m = re.match(r"\|\s*`(\w+)`[^|]*\|\s*(.+?)\s*\|\s*$", line)
        if section and m:
            tables.setdefault(section, {})[m.group(1)] = _parse_value(m.group(2))
    return tables


TABLES = _parse_tables(RLLIB_TABLES)
BUILDER_KEYWORDS = [
    (s, k, v) for s, t in TABLES.items() if s != "model_config" for k, v in t.items()
]
BUILDERS = sorted(s for s in TABLES if s != "model_config") + ["resources"]


def test_reference_tables_parsed():
    assert len(BUILDER_KEYWORDS) >= 95
    assert set(TABLES) >= {"training", "env_runners", "learners", "environment", "model_config"}
    assert TABLES["training"]["lr"] == 0.0005 and TABLES["environment"]["env_config"] == {}


# impala_jax's to_dict() keys that RLlib's to_dict() stores under another name.
RLLIB_KEY = {
    "model_config": "_model_config",
    "is_atari": "_is_atari",
    "learner_class": "_learner_class",
    "rl_module_spec": "_rl_module_spec",
    "train_batch_size_per_learner": "_train_batch_size_per_learner",
    "custom_evaluation_function": "custom_eval_function",
    "callbacks_class": "callbacks",
}
# Fields whose fresh value differs from RLlib's on purpose (README "Differences from RLlib",
# docs/config.md): impala_jax's value, and RLlib's.
DIFFERENT_DEFAULTS = {
    "framework": ("jax", "torch"),
    "model_config": (dict(DEFAULT_MODEL_CONFIG), {}),
    "callbacks_class": (None, "ray.rllib.callbacks.callbacks.RLlibCallback"),
    # RLlib stores a PolicySpec (a 4-tuple in to_dict) and its default mapping function; None
    # means the same here (rllib/multi_agent.py).
    "policies": ({"default_policy": None}, {"default_policy": (None, None, None, None)}),
    "policy_mapping_fn": (None, "DEFAULT_POLICY_MAPPING_FN"),
}
# impala_jax's own fields (docs/config.md), which RLlib does not have; the loss coefficients say
# so in their declaration (core/loss_spec.py).
OWN_FIELDS = {"loss_reduction", "inference_backend", "rmsprop_initial_scale", "policy_lag"}
OWN_FIELDS |= {k.name for k in LOSS_COEFFICIENTS if not k.rllib}


@pytest.fixture(scope="module")
def rllib_fresh() -> dict:
    """A fresh RLlib IMPALAConfig().to_dict() of the installed ray (a test dependency)."""
    from ray.rllib.algorithms.impala import IMPALAConfig as RLlibIMPALAConfig

    return RLlibIMPALAConfig().to_dict()


def _rllib_value(rllib_fresh: dict, key: str):
    key = RLLIB_KEY.get(key, f"callbacks_{key}" if key.startswith("on_") else key)
    value = rllib_fresh[key]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return value.__name__ if callable(value) else value


def test_tables_are_the_installed_rllibs_defaults(rllib_fresh):
    for builder, keyword, fresh in BUILDER_KEYWORDS:
        assert _rllib_value(rllib_fresh, keyword) == fresh, (builder, keyword)


def test_every_default_is_the_installed_rllibs(rllib_fresh):
    """Field by field: every to_dict() value of a fresh config is RLlib's, except the documented
    differences and impala_jax's own fields."""
    fresh = IMPALAConfig().to_dict()
    assert OWN_FIELDS <= set(fresh) and set(DIFFERENT_DEFAULTS) <= set(fresh)
    compared = 0
    for key, value in fresh.items():
        if key in OWN_FIELDS:
            continue
        rllib = _rllib_value(rllib_fresh, key)
        if key in DIFFERENT_DEFAULTS:
            assert (value, rllib) == DIFFERENT_DEFAULTS[key], key
        else:
            assert value == rllib, (key, value, rllib)
            compared += 1
    assert compared >= 100


@pytest.mark.parametrize("builder,keyword,fresh", BUILDER_KEYWORDS)
def test_fresh_default_and_keyword_accepted(builder, keyword, fresh):
    config = IMPALAConfig()
    expected = DIFFERENCES.get((builder, keyword), fresh)
    assert config.to_dict()[keyword] == expected
    value = copy.deepcopy(expected)
    assert getattr(config, builder)(**{keyword: value}) is config
    assert config.to_dict()[keyword] == expected
    config.validate()


def test_fresh_attributes_named_like_rllib():
    config = IMPALAConfig()
    assert config.lr == 0.0005 and config.num_env_runners == 2 and config.gamma == 0.99
    assert config._separate_vf_optimizer is False and config._lr_vf == 0.0005
    assert config._env_runners_only is False and config.learner_class is None


def test_model_config_defaults():
    # The measured table lists the keys that shape impala_jax's networks; the defaults hold
    # every field of RLlib's DefaultModelConfig (initializers, fusionnet_*, ...) besides.
    assert TABLES["model_config"].items() <= DEFAULT_MODEL_CONFIG.items()
    assert {k: DEFAULT_MODEL_CONFIG[k] for k in EXTRA_MODEL_KEYS} == EXTRA_MODEL_KEYS
    assert IMPALAConfig().model_config == dict(DEFAULT_MODEL_CONFIG)


def test_model_config_defaults_are_rllibs_default_model_config():
    default_model_config = pytest.importorskip(
        "ray.rllib.core.rl_module.default_model_config"
    ).DefaultModelConfig
    rllib = dataclasses.asdict(default_model_config())
    assert dict(DEFAULT_MODEL_CONFIG) == dict(rllib, **EXTRA_MODEL_KEYS)


def test_fresh_properties():
    config = IMPALAConfig()
    assert config.train_batch_size_per_learner == 500
    assert config.to_dict()["train_batch_size_per_learner"] is None
    assert config.total_train_batch_size == 500
    assert config.replay_ratio == 0.0
    assert config.get_rollout_fragment_length() == 50
    assert config.resolved_lr == 0.0005 and config.resolved_entropy_coeff == 0.01
    assert config.get_default_learner_class() == "impala_jax.runtime.learning.learner.Learner"
    spec = config.get_default_rl_module_spec()
    assert spec.factory == "impala_jax.core.networks.make_networks"
    assert spec.model_config == config.model_config


def test_builder_sets_only_what_was_given_and_returns_self():
    config = IMPALAConfig()
    before = config.to_dict()
    assert config.training(lr=0.001) is config
    after = config.to_dict()
    assert {k for k in before if before[k] != after[k]} == {"lr"}
    config.training(gamma=0.9)
    assert config.lr == 0.001 and config.gamma == 0.9


def test_environment_takes_env_positionally():
    config = IMPALAConfig().environment("CartPole-v1", env_config={"a": 1})
    assert config.env == "CartPole-v1" and config.env_config == {"a": 1}
    assert IMPALAConfig().environment(env="Pong-v5").env == "Pong-v5"


@pytest.mark.parametrize("builder", BUILDERS)
def test_unknown_keyword_is_type_error(builder):
    with pytest.raises(TypeError):
        getattr(IMPALAConfig(), builder)(no_such_keyword=1)


def test_builders_take_keywords_only():
    with pytest.raises(TypeError):
        IMPALAConfig().training(0.1)
    with pytest.raises(TypeError):
        IMPALAConfig().environment("CartPole-v1", {"a": 1})


def test_unknown_attribute_assignment_suggests_the_field():
    with pytest.raises(AttributeError, match="'lr'"):
        IMPALAConfig().lrr = 0.1


def test_not_provided_is_a_readable_singleton():
    assert repr(NotProvided) == "NotProvided"
    assert copy.deepcopy(NotProvided) is NotProvided
    assert type(NotProvided)() is NotProvided


def test_doc_example_1():
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(lr=0.0003, train_batch_size_per_learner=512)
        .learners(num_learners=1)
    )
    # As RLlib: 512 is not a multiple of the default fragment length 50, so whole fragments
    # are packed until the batch holds at least 512 steps: 11 x 50.
    config.validate()
    assert config.train_batch_size_per_learner == 512
    assert config.effective_train_batch_size_per_learner == 550
    assert config.effective_total_train_batch_size == 550
    config.env_runners(rollout_fragment_length="auto")
    config.validate()
    assert config.get_rollout_fragment_length() == 512
    assert config.effective_train_batch_size_per_learner == 512
    config.env_runners(rollout_fragment_length=64).validate()
    assert config.lr == 0.0003 and config.train_batch_size_per_learner == 512


def test_doc_example_2_grid_search():
    # Exactly what ray.tune.grid_search returns (ray is not installed here).
    tune = types.SimpleNamespace(grid_search=lambda v: {"grid_search": list(v)})
    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(lr=tune.grid_search([0.0001, 0.0002]), grad_clip=20.0)
        .learners(num_learners=1)
    )
    assert config.lr == {"grid_search": [0.0001, 0.0002]}
    assert config.grad_clip == 20.0
    config.validate()
    assert IMPALAConfig.from_dict(config.to_dict()).lr == {"grid_search": [0.0001, 0.0002]}
    with pytest.raises(ValueError, match="lr"):
        config.build()


def test_ray_tune_objects_are_opaque():
    domain_type = type("Float", (), {"__module__": "ray.tune.search.sample"})
    domain = domain_type()
    config = IMPALAConfig().training(lr=domain, gamma={"grid_search": [0.9, 0.99]})
    config.rl_module(model_config={"fcnet_hiddens": {"grid_search": [[64], [128]]}})
    config.validate()
    d = config.to_dict()
    assert d["lr"] is domain and d["gamma"] == {"grid_search": [0.9, 0.99]}
    again = IMPALAConfig.from_dict(d)
    assert again.lr is domain and again.to_dict() == d
    with pytest.raises(ValueError, match="search space"):
        config.environment("CartPole-v1").build()


def test_schedule_spelling_wins_over_float():
    config = IMPALAConfig().training(lr=0.1, lr_schedule=[[0, 0.01], [100, 0.001]])
    config.validate()
    assert config.resolved_lr == [[0, 0.01], [100, 0.001]]
    config.training(entropy_coeff_schedule=[(0, 0.02), (50, 0.0)])
    assert config.resolved_entropy_coeff == [[0, 0.02], [50, 0.0]]


def test_schedule_in_lr_itself():
    config = IMPALAConfig().training(lr=[[0, 0.01], [100, 0.001]], entropy_coeff=[[0, 0.1], [9, 0]])
    config.validate()
    assert config.resolved_lr == [[0, 0.01], [100, 0.001]]
    assert config.resolved_entropy_coeff == [[0, 0.1], [9, 0]]


@pytest.mark.parametrize("name", ["lr", "entropy_coeff"])
def test_schedule_given_twice_is_an_error(name):
    config = IMPALAConfig().training(
        **{name: [[0, 0.01], [100, 0.001]], f"{name}_schedule": [[0, 0.02], [10, 0.0]]}
    )
    with pytest.raises(ValueError, match=f"{name}_schedule"):
        config.validate()
    with pytest.raises(ValueError, match=f"{name}_schedule"):
        getattr(config, f"resolved_{name}")


def test_train_batch_size_per_learner_falls_back_and_stores_raw():
    config = IMPALAConfig().training(train_batch_size=1000)
    assert config.train_batch_size_per_learner == 1000
    assert config.to_dict()["train_batch_size_per_learner"] is None
    config.training(train_batch_size_per_learner=200)
    assert config.train_batch_size_per_learner == 200 and config.train_batch_size == 1000
    assert config._train_batch_size_per_learner == 200


def test_total_train_batch_size():
    config = IMPALAConfig().training(train_batch_size_per_learner=200)
    assert config.total_train_batch_size == 200
    assert config.learners(num_learners=0).total_train_batch_size == 200
    assert config.learners(num_learners=2).total_train_batch_size == 400


@pytest.mark.parametrize("proportion,ratio", [(0.0, 0.0), (0.5, 2.0), (4.0, 0.25)])
def test_replay_ratio(proportion, ratio):
    assert IMPALAConfig().training(replay_proportion=proportion).replay_ratio == ratio


@pytest.mark.parametrize(
    "batch,learners,runners,envs,expected",
    [
        (500, 1, 2, 1, 250),
        (512, 1, 1, 16, 32),
        (512, 1, 0, 16, 32),  # no runner threads counts as one
        (512, 2, 2, 16, 32),  # total batch 1024 over 32 envs
        (10, 1, 4, 8, 1),  # at least 1
        (2500, 1, 4, 3, 208),  # floor, as a compiled T must be one number
    ],
)
def test_rollout_fragment_length_auto(batch, learners, runners, envs, expected):
    config = (
        IMPALAConfig()
        .training(train_batch_size_per_learner=batch)
        .learners(num_learners=learners)
        .env_runners(
            num_env_runners=runners, num_envs_per_env_runner=envs, rollout_fragment_length="auto"
        )
    )
    assert config.get_rollout_fragment_length() == expected
    assert config.get_rollout_fragment_length(worker_index=3) == expected


def _rich_config() -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment("CartPole-v1", env_config={"max_episode_steps": 200}, clip_rewards=1.0)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=25)
        .training(
            lr=[(0, 1e-3), (1000, 1e-4)],
            entropy_coeff_schedule=[[0, 0.01], [500, 0.0]],
            gamma={"grid_search": [0.9, 0.99]},
            train_batch_size_per_learner=100,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64], "encoder": "mlp"})
        .evaluation(evaluation_interval=2, evaluation_config={"explore": False})
        .debugging(seed=7)
    )


def test_to_dict_round_trip():
    config = _rich_config()
    d = config.to_dict()
    assert IMPALAConfig.from_dict(d).to_dict() == d
    assert IMPALAConfig().update_from_dict(d).to_dict() == d
    assert IMPALAConfig.from_dict(d) == config
    assert json.loads(json.dumps(d)) == d
    assert d["lr"] == [[0, 1e-3], [1000, 1e-4]]
    assert d["model_config"]["fcnet_hiddens"] == [64, 64]
    assert d["model_config"]["fcnet_activation"] == "tanh"
    assert set(d) >= {k for _, k, _ in BUILDER_KEYWORDS}


def test_to_dict_is_a_copy():
    config = IMPALAConfig()
    config.to_dict()["model_config"]["fcnet_hiddens"].append(1)
    assert config.model_config["fcnet_hiddens"] == [256, 256]


def test_update_from_dict_sets_only_given_keys_through_the_builders():
    config = IMPALAConfig().training(lr=0.1)
    assert config.update_from_dict({"gamma": 0.5, "num_env_runners": 3}) is config
    assert (config.lr, config.gamma, config.num_env_runners) == (0.1, 0.5, 3)
    with pytest.raises(ValueError, match="grad_clip_by"):
        config.update_from_dict({"grad_clip_by": "max"})


def test_from_dict_unknown_key():
    with pytest.raises(ValueError, match=r"lrr.*'lr'"):
        IMPALAConfig.from_dict({"lrr": 0.1})


def test_model_config_merges_over_defaults():
    config = IMPALAConfig().rl_module(model_config={"fcnet_hiddens": [32]})
    assert config.model_config == dict(DEFAULT_MODEL_CONFIG, fcnet_hiddens=[32])
    config.rl_module(model_config={"fcnet_activation": "relu"})
    assert config.model_config["fcnet_hiddens"] == [256, 256]  # each call starts from defaults


def test_copy_semantics():
    config = _rich_config()
    clone = config.copy()
    assert clone == config and clone is not config and not clone.is_frozen
    clone.training(lr=0.5)
    clone.model_config["fcnet_hiddens"].append(8)
    assert config.lr == [(0, 1e-3), (1000, 1e-4)]
    assert config.model_config["fcnet_hiddens"] == [64, 64]
    assert config.copy(copy_frozen=True).is_frozen
    config.freeze()
    assert config.copy().is_frozen and config.copy(copy_frozen=True).is_frozen
    editable = config.copy(copy_frozen=False)
    assert not editable.is_frozen
    editable.training(lr=0.2)
    assert editable.lr == 0.2


def test_freeze_semantics():
    config = IMPALAConfig().freeze()
    assert config.is_frozen
    with pytest.raises(AttributeError, match=r"frozen.*copy\(copy_frozen=False\)"):
        config.lr = 0.1
    with pytest.raises(AttributeError, match="frozen"):
        config.training(lr=0.1)
    with pytest.raises(AttributeError, match="frozen"):
        config.environment("CartPole-v1")
    with pytest.raises(AttributeError, match="frozen"):
        config.update_from_dict({"gamma": 0.5})
    with pytest.raises(AttributeError, match="frozen"):
        config.train_batch_size_per_learner = 100
    assert config.lr == 0.0005 and config.env is None
    config.validate()  # reading and validating still work


def test_build_validates_freezes_and_hands_a_copy_to_impala(monkeypatch):
    received = []
    fake = types.ModuleType("impala_jax.rllib.algorithm")
    fake.IMPALA = lambda config: received.append(config) or "algo"
    monkeypatch.setitem(sys.modules, "impala_jax.rllib.algorithm", fake)
    config = IMPALAConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
    assert config.build() == "algo"
    assert config.build_algo() == "algo"
    got = received[0]
    assert got.is_frozen and got == config and got is not config
    assert not config.is_frozen
    config.training(lr=0.1)
    assert got.lr == 0.0005


def test_build_refuses_invalid_or_envless_configs(monkeypatch):
    fake = types.ModuleType("impala_jax.rllib.algorithm")
    fake.IMPALA = lambda config: pytest.fail("IMPALA must not be constructed")
    monkeypatch.setitem(sys.modules, "impala_jax.rllib.algorithm", fake)
    with pytest.raises(ValueError, match=r'env=None.*environment\("CartPole-v1"\)'):
        IMPALAConfig().build()
    with pytest.raises(ValueError, match="gamma"):
        IMPALAConfig().environment("CartPole-v1").training(gamma=2.0).build()


def test_lazy_impala_export(monkeypatch):
    import impala_jax

    fake = types.ModuleType("impala_jax.rllib.algorithm")
    fake.IMPALA = object()
    monkeypatch.setitem(sys.modules, "impala_jax.rllib.algorithm", fake)
    assert impala_jax.IMPALA is fake.IMPALA
    assert "IMPALA" in dir(impala_jax)
    with pytest.raises(AttributeError):
        impala_jax.NoSuchName  # noqa: B018
