"""IMPALAConfig validation (rllib/checks.py): every problem named, with its value and the fix."""

from __future__ import annotations

import jax
import pytest

from impala_jax import IMPALAConfig
from impala_jax.core import optim

# (builder, kwargs, field named in the message, offending value as shown in the message)
INVALID = [
    ("training", {"lr": -0.1}, "lr", "-0.1"),
    ("training", {"lr": 0.0}, "lr", "0.0"),
    ("training", {"lr": [[0, 0.1], [100, -0.1]]}, "lr", "-0.1"),
    ("training", {"lr": [[10, 0.1], [100, 0.01]]}, "lr", "10"),
    ("training", {"lr": [[0, 0.1]]}, "lr", "[[0, 0.1]]"),
    ("training", {"lr": [[0, 0.1], [0, 0.01]]}, "lr", "[0, 0]"),
    ("training", {"lr": [[0, 0.1, 3], [5, 0.01]]}, "lr", "[0, 0.1, 3]"),
    ("training", {"lr_schedule": [[5, 0.1], [10, 0.0]]}, "lr_schedule", "5"),
    ("training", {"gamma": 1.5}, "gamma", "1.5"),
    ("training", {"gamma": -0.1}, "gamma", "-0.1"),
    ("training", {"opt_type": "sgd"}, "opt_type", "'sgd'"),
    ("training", {"entropy_coeff": -0.01}, "entropy_coeff", "-0.01"),
    ("training", {"entropy_coeff_schedule": [[0, 0.1], [9, -1]]}, "entropy_coeff_schedule", "-1"),
    ("training", {"vf_loss_coeff": -0.5}, "vf_loss_coeff", "-0.5"),
    ("training", {"grad_clip": -40.0}, "grad_clip", "-40.0"),
    ("training", {"vtrace_clip_rho_threshold": 0.0}, "vtrace_clip_rho_threshold", "0.0"),
    ("training", {"vtrace_clip_pg_rho_threshold": -1.0}, "vtrace_clip_pg_rho_threshold", "-1.0"),
    ("training", {"vtrace": "off"}, "vtrace", "'off'"),
    ("training", {"num_epochs": 0}, "num_epochs", "0"),
    ("training", {"train_batch_size_per_learner": 0}, "train_batch_size_per_learner", "0"),
    (
        "training",
        # 512 is rounded up to 11 fragments of 50, which 2-fragment minibatches do not split.
        {"train_batch_size_per_learner": 512, "minibatch_size": 100},
        "minibatch_size",
        "100",
    ),
    ("training", {"minibatch_size": 75}, "minibatch_size", "75"),
    ("training", {"minibatch_size": 1000}, "minibatch_size", "1000"),
    ("training", {"broadcast_interval": 0}, "broadcast_interval", "0"),
    ("training", {"learner_queue_size": 0}, "learner_queue_size", "0"),
    ("training", {"learner_queue_timeout": 0}, "learner_queue_timeout", "0"),
    ("training", {"replay_proportion": -0.5}, "replay_proportion", "-0.5"),
    ("training", {"replay_proportion": 0.5}, "replay_buffer_num_slots", "0"),
    ("training", {"decay": 1.0}, "decay", "1.0"),
    ("training", {"momentum": -0.9}, "momentum", "-0.9"),
    ("training", {"epsilon": 0.0}, "epsilon", "0.0"),
    ("training", {"num_gpu_loader_threads": 0}, "num_gpu_loader_threads", "0"),
    ("training", {"num_multi_gpu_tower_stacks": 0}, "num_multi_gpu_tower_stacks", "0"),
    ("training", {"minibatch_buffer_size": 0}, "minibatch_buffer_size", "0"),
    ("training", {"_separate_vf_optimizer": True}, "_separate_vf_optimizer", "True"),
    ("training", {"grad_clip_by": "l2"}, "grad_clip_by", "'l2'"),
    ("training", {"num_aggregation_workers": 2}, "num_aggregation_workers", "2"),
    (
        "training",
        {"max_requests_in_flight_per_aggregator_worker": 1},
        "max_requests_in_flight_per_aggregator_worker",
        "1",
    ),
    ("env_runners", {"num_env_runners": -1}, "num_env_runners", "-1"),
    ("env_runners", {"num_envs_per_env_runner": 0}, "num_envs_per_env_runner", "0"),
    ("env_runners", {"rollout_fragment_length": 0}, "rollout_fragment_length", "0"),
    ("env_runners", {"rollout_fragment_length": "long"}, "rollout_fragment_length", "'long'"),
    ("env_runners", {"batch_mode": "complete_episodes"}, "batch_mode", "'complete_episodes'"),
    ("env_runners", {"batch_mode": "whole"}, "batch_mode", "'whole'"),
    ("env_runners", {"gym_env_vectorize_mode": "threads"}, "gym_env_vectorize_mode", "'threads'"),
    ("env_runners", {"observation_filter": "MeanStdFilter"}, "observation_filter", "MeanStd"),
    ("env_runners", {"sample_timeout_s": 0}, "sample_timeout_s", "0"),
    ("learners", {"num_learners": -1}, "num_learners", "-1"),
    ("environment", {"clip_rewards": -1.0}, "clip_rewards", "-1.0"),
    ("environment", {"clip_rewards": "sign"}, "clip_rewards", "'sign'"),
    ("environment", {"render_env": True}, "render_env", "True"),
    ("evaluation", {"evaluation_duration": 0}, "evaluation_duration", "0"),
    ("evaluation", {"evaluation_duration": "auto"}, "evaluation_duration", "'auto'"),
    ("evaluation", {"evaluation_duration_unit": "hours"}, "evaluation_duration_unit", "'hours'"),
    (
        "evaluation",
        {"evaluation_parallel_to_training": True},
        "evaluation_parallel_to_training",
        "True",
    ),
    ("evaluation", {"evaluation_config": {"lrr": 0.1}}, "evaluation_config", "lrr"),
    ("evaluation", {"evaluation_config": {"explore": "no"}}, "evaluation_config", "'no'"),
    ("reporting", {"min_time_s_per_iteration": -1}, "min_time_s_per_iteration", "-1"),
    (
        "reporting",
        {"metrics_num_episodes_for_smoothing": 0},
        "metrics_num_episodes_for_smoothing",
        "0",
    ),
    ("fault_tolerance", {"max_num_env_runner_restarts": -1}, "max_num_env_runner_restarts", "-1"),
    (
        "fault_tolerance",
        {"delay_between_env_runner_restarts_s": -1.0},
        "delay_between_env_runner_restarts_s",
        "-1.0",
    ),
    ("debugging", {"seed": -3}, "seed", "-3"),
    ("debugging", {"log_level": "LOUD"}, "log_level", "'LOUD'"),
    ("rl_module", {"model_config": {"fcnet_hiddens": [64, 0]}}, "fcnet_hiddens", "[64, 0]"),
    ("rl_module", {"model_config": {"fcnet_hiddens": 64}}, "fcnet_hiddens", "64"),
    ("rl_module", {"model_config": {"fcnet_activation": "gelu2"}}, "fcnet_activation", "gelu2"),
    ("rl_module", {"model_config": {"use_lstm": 1}}, "use_lstm", "1"),
    ("rl_module", {"model_config": {"max_seq_len": 0}}, "max_seq_len", "0"),
    ("rl_module", {"model_config": {"encoder": "resnet50"}}, "encoder", "'resnet50'"),
    ("rl_module", {"model_config": {"impala_cnn_channels": []}}, "impala_cnn_channels", "[]"),
    ("rl_module", {"model_config": {"conv_filters": [[16, 8]]}}, "conv_filters", "[[16, 8]]"),
    ("rl_module", {"model_config": {"fcnet_hidens": [64]}}, "fcnet_hidens", "fcnet_hiddens"),
]


@pytest.mark.parametrize(
    "builder,kwargs,field,shown", INVALID, ids=[f"{b}-{next(iter(k))}" for b, k, *_ in INVALID]
)
def test_invalid_config_is_value_error(builder, kwargs, field, shown):
    with pytest.raises(ValueError) as info:
        getattr(IMPALAConfig(), builder)(**kwargs).validate()
    message = str(info.value)
    assert field in message and shown in message, message


def test_num_learners_beyond_devices():
    too_many = len(jax.devices()) + 1
    config = IMPALAConfig().learners(num_learners=too_many)
    with pytest.raises(ValueError, match=rf"num_learners={too_many}.*JAX device"):
        config.validate()
    IMPALAConfig().learners(num_learners=len(jax.devices())).validate()


def test_setter_time_rejections_leave_config_unchanged():
    config = IMPALAConfig()
    with pytest.raises(ValueError, match="num_aggregator_actors_per_learner"):
        config.training(lr=0.1, num_aggregation_workers=1)
    with pytest.raises(ValueError, match="max_requests_in_flight_per_aggregator_actor"):
        config.training(max_requests_in_flight_per_aggregator_worker=4)
    with pytest.raises(ValueError, match="grad_clip_by"):
        config.training(grad_clip_by="max")
    with pytest.raises(ValueError, match="rollout_fragment_length"):
        config.env_runners(rollout_fragment_length=0)
    with pytest.raises(ValueError, match="fcnet_hidens.*fcnet_hiddens"):
        config.rl_module(model_config={"fcnet_hidens": [64]})
    assert config == IMPALAConfig()
    config.training(num_aggregation_workers=-1, max_requests_in_flight_per_aggregator_worker=-1)


def test_validation_reports_every_problem_at_once():
    config = IMPALAConfig().training(lr=-1.0, gamma=2.0, opt_type="sgd")
    with pytest.raises(ValueError) as info:
        config.validate()
    for part in ("lr=-1.0", "gamma=2.0", "opt_type='sgd'", ".training("):
        assert part in str(info.value)


@pytest.mark.parametrize(
    "builder,kwargs",
    [
        ("training", {"grad_clip": None}),
        ("training", {"lr": [[0, 1e-3], [1000, 0.0]]}),
        ("training", {"lr_schedule": [(0, 1e-3), (1000, 1e-4)]}),
        ("training", {"entropy_coeff": 0.0}),
        ("training", {"opt_type": "rmsprop", "decay": 0.0, "momentum": 0.9, "epsilon": 1e-5}),
        ("training", {"replay_proportion": 1.0, "replay_buffer_num_slots": 10}),
        ("training", {"minibatch_size": 100, "num_epochs": 2}),
        ("training", {"gamma": 1.0}),
        ("environment", {"clip_rewards": True}),
        ("environment", {"clip_rewards": 5.0}),
        ("env_runners", {"gym_env_vectorize_mode": "ASYNC", "num_env_runners": 0}),
        ("evaluation", {"evaluation_parallel_to_training": True, "evaluation_num_env_runners": 1}),
        ("evaluation", {"evaluation_config": {"explore": False}, "evaluation_interval": 1}),
        ("rl_module", {"model_config": {"fcnet_activation": "ReLU", "encoder": "impala_cnn"}}),
        ("rl_module", {"model_config": {"conv_filters": [[16, 8, 4], [32, 4, 2]]}}),
        ("debugging", {"seed": 0, "log_level": "info"}),
        ("learners", {"num_learners": 0}),
    ],
)
def test_valid_variations(builder, kwargs):
    getattr(IMPALAConfig(), builder)(**kwargs).validate()


def test_separate_vf_optimizer_needs_separate_layers_and_lr():
    config = IMPALAConfig().training(_separate_vf_optimizer=True)
    config.rl_module(model_config={"vf_share_layers": False})
    config.validate()
    config.training(_lr_vf=0.0)
    with pytest.raises(ValueError, match="_lr_vf=0.0"):
        config.validate()


def _config_accepts(**training) -> bool:
    try:
        IMPALAConfig().training(**training).validate()
    except ValueError:
        return False
    return True


def _raises_value_error(fn, *args, **kwargs) -> bool:
    try:
        fn(*args, **kwargs)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize(
    ("field", "name"),
    [("opt_type", n) for n in ("adam", "rmsprop", "sgd", "adamw", "RMSProp")]
    + [("grad_clip_by", n) for n in ("value", "norm", "global_norm", "l2", "Norm")],
)
def test_the_checks_and_the_optimizer_know_the_same_names(field, name):
    # One list of names (core/optim_rules.py): a name one side takes and the other refuses
    # would pass validate() and fail at build, or the reverse.
    built = not _raises_value_error(optim.OptimizerSpec, **{field: name})
    assert _config_accepts(**{field: name}) == built


@pytest.mark.parametrize(
    "value",
    [
        0.0,
        0.5,
        -0.01,
        float("nan"),
        [[0, 0.1], [10, 0.0]],
        [(0, 0.1), (5, 0.05), (9, 0.0)],
        [[0, 0.1]],  # one point: RLlib asks for two
        [[0, 0.1], [10, -0.1]],  # a negative value
        [[0, 0.1], [10, float("nan")]],
        [[5, 0.1], [10, 0.0]],  # first timestep not 0
        [[0, 0.1], [10, 0.2], [10, 0.3]],  # not increasing
        [[0, 0.1], [10]],
        [[0, 0.1, 3], [10, 0.2]],
        [["0", 0.1], [10, 0.2]],
        [[0, True], [10, 0.2]],
        [],
    ],
)
def test_the_checks_and_the_schedule_take_the_same_values(value):
    # entropy_coeff, whose number rule (>= 0) is the schedule's own; lr's adds > 0 on top.
    built = not _raises_value_error(optim.piecewise_linear, value, "entropy_coeff")
    assert _config_accepts(entropy_coeff=value) == built
    if isinstance(value, list):
        assert _config_accepts(lr=value) == built
        assert _config_accepts(entropy_coeff_schedule=value) == built


def test_a_schedule_error_names_the_field_the_value_and_the_fix():
    with pytest.raises(
        ValueError, match=r"entropy_coeff=\[\[0, 0.1\]\]: .*at least 2.*\[\[0, v0\]"
    ):
        optim.piecewise_linear([[0, 0.1]], "entropy_coeff")
    with pytest.raises(ValueError, match=r"lr=-0.1: expected a number >= 0"):
        optim.OptimizerSpec(lr=-0.1)
