"""The data of RLlib compatibility: RLlib 2.60 keywords impala_jax does not offer, RLlib's
deprecated spellings and old attribute names, and fields with no meaning here yet.

``compat.py`` holds the code that reads these tables (``route``, ``RLlibBuilders``) and
``checks.py`` the check of ``NOT_HERE``:

- ``UNSUPPORTED``: builder -> keyword -> (RLlib's default, why it is not offered). RLlib's
  default value (what a fresh RLlib config holds) is accepted and changes nothing; any other
  value is a `NotImplementedError` naming the feature.
- ``DEPRECATED``: builder -> RLlib's deprecated keyword -> `DeprecatedKeyword`, treated as RLlib
  2.60 treats it: honoured with a `DeprecationWarning`, or rejected with a `ValueError`.
- ``ATTRIBUTE_ALIASES``, ``RLLIB_ONLY_ATTRIBUTES``: RLlib's attribute names read as their new
  fields, and those that are a clear error here.
- ``NOT_HERE``: impala_jax fields with one accepted value (yet), each with the reason.

No JAX and no ray here: the config imports this module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# RLlib's default is an object of RLlib's own (a class, a function, a PolicySpec dict, ...):
# None is accepted in its place.
RLLIB_OBJECT = object()


def _feature(reason: str, **defaults: Any) -> dict[str, tuple[Any, str]]:
    return {name: (default, reason) for name, default in defaults.items()}


_CONNECTORS = "ConnectorV2 pipelines are not offered: runners feed the network directly"
_RAY = "Ray resources and actors have no meaning here: impala_jax is one process"
_STATE = "env-runner state (connector states, filter statistics) is not offered"
_OLD_STACK = "the old API stack is not offered"
_OFFLINE_EVAL = "offline evaluation is not offered"
_TORCH_TF = "torch/tf settings have no meaning: impala_jax always runs JAX (XLA-compiled)"

UNSUPPORTED: dict[str, dict[str, tuple[Any, str]]] = {
    "env_runners": {
        **_feature(
            "no local Ray EnvRunner exists (num_env_runners=0 samples in the main thread)",
            create_local_env_runner=True,
            create_env_on_local_worker=False,
        ),
        **_feature(_RAY, custom_resources_per_env_runner={}),
        **_feature(
            "runner threads are checked at build", validate_env_runners_after_construction=True
        ),
        **_feature(
            _CONNECTORS,
            env_to_module_connector=None,
            module_to_env_connector=None,
            add_default_connectors_to_env_to_module_pipeline=True,
            add_default_connectors_to_module_to_env_pipeline=True,
            episode_lookback_horizon=1,
            episodes_to_numpy=True,
        ),
        **_feature(
            _STATE,
            merge_env_runner_states="training_only",
            broadcast_env_runner_states=True,
            use_env_runner_state_server=True,
            env_runner_state_server_max_concurrency=16,
            use_worker_filter_stats=True,
            update_worker_filter_stats=True,
        ),
        **_feature(
            _OLD_STACK,
            exploration_config={},
            sample_collector=RLLIB_OBJECT,
            remote_worker_envs=False,
            remote_env_batch_wait_ms=0,
            preprocessor_pref="deepmind",
            enable_tf1_exec_eagerly=False,
            sampler_perf_stats_ema_coef=None,
        ),
    },
    "evaluation": {
        **_feature(
            "evaluation_duration='auto' is not offered",
            evaluation_auto_duration_min_env_steps_per_sample=100,
            evaluation_auto_duration_max_env_steps_per_sample=2000,
        ),
        **_feature(
            "evaluation runner health handling is not offered",
            evaluation_unhealthy_workers_timeout_s=0.0,
            evaluation_error_after_n_consecutive_skips=None,
        ),
        **_feature(
            _OFFLINE_EVAL,
            off_policy_estimation_methods={},
            ope_split_batch_by_episode=True,
            offline_evaluation_interval=None,
            num_offline_eval_runners=0,
            offline_evaluation_type="eval_loss",
            offline_eval_runner_class=None,
            offline_loss_for_module_fn=None,
            offline_eval_batch_size_per_runner=256,
            dataset_num_iters_per_offline_eval_runner=1,
            offline_eval_rl_module_inference_only=False,
            num_cpus_per_offline_eval_runner=1,
            num_gpus_per_offline_eval_runner=0,
            custom_resources_per_offline_eval_runner={},
            offline_evaluation_timeout_s=120.0,
            max_requests_in_flight_per_offline_eval_runner=1,
            broadcast_offline_eval_runner_states=False,
            validate_offline_eval_runners_after_construction=True,
            restart_failed_offline_eval_runners=True,
            ignore_offline_eval_runner_failures=False,
            max_num_offline_eval_runner_restarts=1000,
            offline_eval_runner_health_probe_timeout_s=30.0,
            offline_eval_runner_restore_timeout_s=1800.0,
        ),
    },
    "learners": {
        **_feature(_RAY, custom_resources_per_learner={}, max_requests_in_flight_per_learner=3),
        **_feature(
            _CONNECTORS, learner_connector=None, add_default_connectors_to_learner_pipeline=True
        ),
        **_feature("custom Learner settings are not offered", learner_config_dict={}),
    },
    "training": {
        **_feature(
            "the old API stack's model and optimizer dicts are not offered; use "
            "rl_module(model_config=...) and training(lr=..., opt_type=...)",
            model=RLLIB_OBJECT,
            optimizer={},
        ),
        **_feature(
            _CONNECTORS, learner_connector=None, add_default_connectors_to_learner_pipeline=True
        ),
        **_feature("custom Learner settings are not offered", learner_config_dict={}),
    },
    "reporting": _feature(
        "custom per-episode metrics are not offered",
        keep_per_episode_custom_metrics=False,
        metrics_episode_collection_timeout_s=60.0,
        custom_stats_cls_lookup=RLLIB_OBJECT,
    ),
    "resources": {
        **_feature(_RAY, custom_resources_for_main_process={}),
        **_feature(
            "fake GPUs are not offered; to try several learner devices on a CPU, start Python "
            "with XLA_FLAGS=--xla_force_host_platform_device_count=N",
            _fake_gpus=False,
        ),
    },
    "rl_module": _feature(
        "per-module config overrides are not offered: impala_jax trains one policy",
        algorithm_config_overrides_per_module={},
    ),
    "framework": _feature(
        _TORCH_TF,
        eager_tracing=True,
        eager_max_retraces=20,
        tf_session_args=RLLIB_OBJECT,
        local_tf_session_args=RLLIB_OBJECT,
        torch_compile_learner=False,
        torch_compile_learner_what_to_compile="forward_train",
        torch_compile_learner_dynamo_mode=None,
        torch_compile_learner_dynamo_backend="inductor",
        torch_compile_worker=False,
        torch_compile_worker_dynamo_backend="onnxrt",
        torch_compile_worker_dynamo_mode=None,
        torch_ddp_kwargs={},
        torch_skip_nan_gradients=False,
    ),
    "offline_data": _feature(
        "offline RL (reading or writing recorded experiences) is not offered",
        input_="sampler",
        offline_data_class=None,
        input_read_method="read_parquet",
        input_read_method_kwargs={},
        input_read_schema={},
        input_read_episodes=False,
        input_read_sample_batches=False,
        input_read_batch_size=None,
        input_filesystem=None,
        input_filesystem_kwargs={},
        input_compress_columns=["obs", "new_obs"],
        materialize_data=False,
        materialize_mapped_data=True,
        map_batches_kwargs={},
        iter_batches_kwargs={},
        ignore_final_observation=False,
        prelearner_class=None,
        prelearner_buffer_class=None,
        prelearner_buffer_kwargs={},
        prelearner_module_synch_period=10,
        prelearner_use_recorded_module_states=False,
        dataset_num_iters_per_learner=None,
        input_config={},
        actions_in_input_normalized=False,
        postprocess_inputs=False,
        shuffle_buffer_size=0,
        output=None,
        output_config={},
        output_compress_columns=["obs", "new_obs"],
        output_max_file_size=64 * 1024 * 1024,
        output_max_rows_per_file=None,
        output_write_remaining_data=False,
        output_write_method="write_parquet",
        output_write_method_kwargs={},
        output_filesystem=None,
        output_filesystem_kwargs={},
        output_write_episodes=True,
        offline_sampling=False,
    ),
    "python_environment": _feature(
        "per-process environment variables are not offered (one process); set them before "
        "starting Python",
        extra_python_environs_for_driver={},
        extra_python_environs_for_worker={},
    ),
    "experimental": {
        **_feature("impala_jax always validates the config", _validate_config=True),
        **_feature(
            "checkpoints are always npz arrays plus JSON (never pickles)",
            _use_msgpack_checkpoints=False,
        ),
        **_feature(
            _TORCH_TF,
            _torch_grad_scaler_class=None,
            _torch_lr_scheduler_classes=None,
            _tf_policy_handles_more_than_one_loss=True,
        ),
        **_feature(
            _OLD_STACK,
            _disable_preprocessor_api=False,
            _disable_action_flattening=False,
            _disable_initialize_loss_from_dummy_batch=False,
        ),
    },
}


class DeprecatedKeyword(NamedTuple):
    new: str  # RLlib's new spelling, "builder(keyword=..)"
    target: str | None  # the field it sets when RLlib still honours it; None: RLlib raises
    honoured: bool = True  # False: RLlib 2.60 raises ValueError (error=True)


def _moved(new: str, target: str | None = None) -> DeprecatedKeyword:
    return DeprecatedKeyword(new, target, target is not None)


_FT = "fault_tolerance"
DEPRECATED: dict[str, dict[str, DeprecatedKeyword]] = {
    "environment": {"env_task_fn": _moved("a callback (env task functions were removed)")},
    "env_runners": {
        "enable_connectors": DeprecatedKeyword("nothing (connectors are always on)", None),
        "num_rollout_workers": _moved("env_runners(num_env_runners=..)"),
        "num_envs_per_worker": _moved("env_runners(num_envs_per_env_runner=..)"),
        "validate_workers_after_construction": _moved(
            "env_runners(validate_env_runners_after_construction=..)"
        ),
        "synchronize_filter": _moved("env_runners(update_worker_filter_stats=..)"),
        "ignore_worker_failures": _moved(f"{_FT}(ignore_env_runner_failures=..)"),
        "recreate_failed_workers": _moved(f"{_FT}(restart_failed_env_runners=..)"),
        "restart_failed_sub_environments": _moved(f"{_FT}(restart_failed_sub_environments=..)"),
        "num_consecutive_worker_failures_tolerance": _moved(
            f"{_FT}(num_consecutive_env_runner_failures_tolerance=..)"
        ),
        "worker_health_probe_timeout_s": _moved(f"{_FT}(env_runner_health_probe_timeout_s=..)"),
        "worker_restore_timeout_s": _moved(f"{_FT}(env_runner_restore_timeout_s=..)"),
    },
    "evaluation": {
        "always_attach_evaluation_results": _moved("nothing (results are always attached)"),
        "evaluation_num_workers": _moved(
            "evaluation(evaluation_num_env_runners=..)", "evaluation_num_env_runners"
        ),
    },
    "fault_tolerance": {
        "recreate_failed_env_runners": _moved(f"{_FT}(restart_failed_env_runners=..)"),
        "ignore_worker_failures": _moved(f"{_FT}(ignore_env_runner_failures=..)"),
        "recreate_failed_workers": _moved(f"{_FT}(restart_failed_env_runners=..)"),
        "max_num_worker_restarts": _moved(f"{_FT}(max_num_env_runner_restarts=..)"),
        "delay_between_worker_restarts_s": _moved(f"{_FT}(delay_between_env_runner_restarts_s=..)"),
        "num_consecutive_worker_failures_tolerance": _moved(
            f"{_FT}(num_consecutive_env_runner_failures_tolerance=..)"
        ),
        "worker_health_probe_timeout_s": _moved(f"{_FT}(env_runner_health_probe_timeout_s=..)"),
        "worker_restore_timeout_s": _moved(f"{_FT}(env_runner_restore_timeout_s=..)"),
    },
    "multi_agent": {
        "algorithm_config_overrides_per_module": _moved(
            "rl_module(algorithm_config_overrides_per_module=..)"
        ),
        "replay_mode": _moved("nothing (removed with the old stack)"),
        "policy_map_cache": _moved("nothing (removed with the old stack)"),
    },
    "resources": {
        "num_cpus_per_worker": _moved(
            "env_runners(num_cpus_per_env_runner=..)", "num_cpus_per_env_runner"
        ),
        "num_gpus_per_worker": _moved(
            "env_runners(num_gpus_per_env_runner=..)", "num_gpus_per_env_runner"
        ),
        "custom_resources_per_worker": _moved("env_runners(custom_resources_per_env_runner=..)"),
        "num_learner_workers": _moved("learners(num_learners=..)", "num_learners"),
        "num_cpus_per_learner_worker": _moved(
            "learners(num_cpus_per_learner=..)", "num_cpus_per_learner"
        ),
        "num_gpus_per_learner_worker": _moved(
            "learners(num_gpus_per_learner=..)", "num_gpus_per_learner"
        ),
        "local_gpu_idx": _moved("learners(local_gpu_idx=..)", "local_gpu_idx"),
        "num_cpus_for_local_worker": _moved(
            "resources(num_cpus_for_main_process=..)", "num_cpus_for_main_process"
        ),
    },
    "rl_module": {
        "model_config_dict": _moved("rl_module(model_config=..)", "model_config"),
        "_enable_rl_module_api": _moved("api_stack(enable_rl_module_and_learner=..)"),
    },
    "training": {
        "num_aggregator_actors_per_learner": _moved(
            "learners(num_aggregator_actors_per_learner=..)", "num_aggregator_actors_per_learner"
        ),
        "max_requests_in_flight_per_aggregator_actor": _moved(
            "learners(max_requests_in_flight_per_aggregator_actor=..)",
            "max_requests_in_flight_per_aggregator_actor",
        ),
        "num_sgd_iter": _moved("training(num_epochs=..)", "num_epochs"),
        "max_requests_in_flight_per_sampler_worker": _moved(
            "env_runners(max_requests_in_flight_per_env_runner=..)",
            "max_requests_in_flight_per_env_runner",
        ),
    },
}
# RLlib's value for "not given" of a deprecated keyword (its DEPRECATED_VALUE).
DEPRECATED_VALUE = -1


# RLlib 2.60's old attribute names, read as the fields they became (with a DeprecationWarning,
# as RLlib's deprecated properties do); ``callbacks_on_*`` are RLlib's names of the per-event
# callables, which impala_jax keeps as ``on_*``.
ATTRIBUTE_ALIASES: dict[str, str] = {
    "callbacks_on_algorithm_init": "on_algorithm_init",
    "callbacks_on_checkpoint_loaded": "on_checkpoint_loaded",
    "callbacks_on_env_runners_recreated": "on_env_runners_recreated",
    "callbacks_on_environment_created": "on_environment_created",
    "callbacks_on_episode_created": "on_episode_created",
    "callbacks_on_episode_end": "on_episode_end",
    "callbacks_on_episode_start": "on_episode_start",
    "callbacks_on_episode_step": "on_episode_step",
    "callbacks_on_evaluate_end": "on_evaluate_end",
    "callbacks_on_evaluate_offline_end": "on_evaluate_offline_end",
    "callbacks_on_evaluate_offline_start": "on_evaluate_offline_start",
    "callbacks_on_evaluate_start": "on_evaluate_start",
    "callbacks_on_offline_eval_runners_recreated": "on_offline_eval_runners_recreated",
    "callbacks_on_sample_end": "on_sample_end",
    "callbacks_on_train_result": "on_train_result",
    "delay_between_worker_restarts_s": "delay_between_env_runner_restarts_s",
    "evaluation_num_workers": "evaluation_num_env_runners",
    "ignore_worker_failures": "ignore_env_runner_failures",
    "max_num_worker_restarts": "max_num_env_runner_restarts",
    "metrics_smoothing_episodes": "metrics_num_episodes_for_smoothing",
    "min_sample_timesteps_per_reporting": "min_sample_timesteps_per_iteration",
    "min_time_s_per_reporting": "min_time_s_per_iteration",
    "min_train_timesteps_per_reporting": "min_train_timesteps_per_iteration",
    "num_consecutive_worker_failures_tolerance": "num_consecutive_env_runner_failures_tolerance",
    "num_cpus_for_local_worker": "num_cpus_for_main_process",
    "num_cpus_per_learner_worker": "num_cpus_per_learner",
    "num_cpus_per_worker": "num_cpus_per_env_runner",
    "num_envs_per_worker": "num_envs_per_env_runner",
    "num_gpus_per_learner_worker": "num_gpus_per_learner",
    "num_gpus_per_worker": "num_gpus_per_env_runner",
    "num_learner_workers": "num_learners",
    "num_rollout_workers": "num_env_runners",
    "recreate_failed_env_runners": "restart_failed_env_runners",
    "recreate_failed_workers": "restart_failed_env_runners",
    "worker_health_probe_timeout_s": "env_runner_health_probe_timeout_s",
    "worker_restore_timeout_s": "env_runner_restore_timeout_s",
}

# Every other public attribute and method of RLlib 2.60's IMPALAConfig that impala_jax does not
# have (its old-stack, offline, multi-agent, connector, torch and Ray-actor machinery): reading
# one is a clear error naming it, not a bare AttributeError. tests/test_rllib_builders.py checks
# this list against ray's IMPALAConfig.
RLLIB_ONLY_ATTRIBUTES: frozenset[str] = frozenset(
    """
    DEFAULT_AGENT_TO_MODULE_MAPPING_FN DEFAULT_POLICY_MAPPING_FN actions_in_input_normalized
    add_default_connectors_to_env_to_module_pipeline add_default_connectors_to_learner_pipeline
    add_default_connectors_to_module_to_env_pipeline algorithm_config_overrides_per_module
    always_attach_evaluation_results auto_wrap_old_gym_envs broadcast_env_runner_states
    broadcast_offline_eval_runner_states buffer_size build_env_to_module_connector build_learner
    build_learner_connector build_learner_group build_module_to_env_connector
    collect_metrics_timeout create_env_on_local_worker create_local_env_runner
    custom_async_evaluation_function custom_resources_for_main_process
    custom_resources_per_env_runner custom_resources_per_learner
    custom_resources_per_offline_eval_runner custom_resources_per_worker
    dataset_num_iters_per_eval_runner dataset_num_iters_per_learner eager_max_retraces
    eager_tracing enable_async_evaluation enable_connectors enable_tf1_exec_eagerly
    env_runner_state_server_max_concurrency env_task_fn episode_lookback_horizon
    episodes_to_numpy evaluation_auto_duration_max_env_steps_per_sample
    evaluation_auto_duration_min_env_steps_per_sample evaluation_error_after_n_consecutive_skips
    evaluation_num_episodes evaluation_unhealthy_workers_timeout_s exploration_config
    extra_python_environs_for_driver extra_python_environs_for_worker from_state
    get_config_for_module get_evaluation_config_object get_marl_module_spec
    get_multi_agent_setup get_multi_rl_module_spec get_rl_module_spec get_state
    get_torch_compile_worker_config ignore_final_observation ignore_offline_eval_runner_failures
    in_evaluation input_ input_compress_columns input_config input_evaluation input_filesystem
    input_filesystem_kwargs input_read_batch_size input_read_episodes input_read_method
    input_read_method_kwargs input_read_sample_batches input_read_schema input_spaces_jsonable
    iter_batches_kwargs keep_per_episode_custom_metrics learner_config_dict learning_starts
    local_tf_session_args map_batches_kwargs materialize_data materialize_mapped_data
    max_num_offline_eval_runner_restarts max_requests_in_flight_per_learner
    max_requests_in_flight_per_offline_eval_runner merge_env_runner_states
    metrics_episode_collection_timeout_s min_iter_time_s model monitor
    num_cpus_per_offline_eval_runner num_gpus_per_offline_eval_runner num_offline_eval_runners
    off_policy_estimation_methods offline_data_class offline_eval_batch_size_per_runner
    offline_eval_rl_module_inference_only offline_eval_runner_class
    offline_eval_runner_health_probe_timeout_s offline_eval_runner_restore_timeout_s
    offline_evaluation_duration offline_evaluation_interval
    offline_evaluation_parallel_to_training offline_evaluation_timeout_s offline_evaluation_type
    offline_loss_for_module_fn offline_sampling ope_split_batch_by_episode optimizer output
    output_compress_columns output_config output_filesystem output_filesystem_kwargs
    output_max_file_size output_max_rows_per_file output_write_episodes output_write_method
    output_write_method_kwargs output_write_remaining_data overrides policy_map_cache pop
    postprocess_inputs prelearner_buffer_class prelearner_buffer_kwargs prelearner_class
    prelearner_module_synch_period prelearner_use_recorded_module_states preprocessor_pref
    prioritized_replay prioritized_replay_alpha prioritized_replay_beta prioritized_replay_eps
    remote_env_batch_wait_ms remote_worker_envs replay_batch_size replay_mode
    replay_sequence_length restart_failed_offline_eval_runners sample_collector
    sampler_perf_stats_ema_coef serialize shuffle_buffer_size simple_optimizer stats_cls_lookup
    sync_filters_on_rollout_workers_timeout_s synchronize_filters tf_session_args
    timesteps_per_iteration torch_compile_learner torch_compile_learner_dynamo_backend
    torch_compile_learner_dynamo_mode torch_compile_learner_what_to_compile torch_compile_worker
    torch_compile_worker_dynamo_backend torch_compile_worker_dynamo_mode torch_ddp_kwargs
    torch_skip_nan_gradients update_worker_filter_stats use_env_runner_state_server
    use_worker_filter_stats validate_env_runners_after_construction
    validate_offline_eval_runners_after_construction
    validate_train_batch_size_vs_rollout_fragment_length validate_workers_after_construction
    worker_cls
    """.split()
)


# Fields with no meaning in impala_jax (yet): field -> (the one accepted value, why).
NOT_HERE: dict[str, tuple[Any, str]] = {
    "num_gpus_per_env_runner": (
        0,
        "the env runners act on the first learner device, whose GPU a Ray Tune trial already "
        "asks for through learners(num_gpus_per_learner=...)",
    ),
    "placement_strategy": (
        "PACK",
        "a Ray Tune trial of impala_jax is one process, one placement-group bundle, so there "
        "is nothing to pack or spread",
    ),
    "compress_observations": (
        False,
        "fragments stay in memory as arrays (no Ray object store in between), so there is "
        "nothing to compress",
    ),
    "checkpoint_trainable_policies_only": (
        False,
        "impala_jax has one policy, always trainable, and always checkpoints it",
    ),
    "timeout_s_sampler_manager": (
        0.0,
        "a Ray actor-manager timeout; runner threads hand fragments over through an in-memory "
        "queue that nobody polls",
    ),
    "timeout_s_aggregator_manager": (0.0, "a Ray actor-manager timeout; there are no actors"),
    "max_requests_in_flight_per_env_runner": (
        1,
        "not supported yet: a runner thread hands over one fragment at a time (back-pressure "
        "is training(learner_queue_size=...))",
    ),
    "local_gpu_idx": (0, "not supported yet: the learners are the first JAX devices"),
    "env_runner_health_probe_timeout_s": (
        30.0,
        "not supported yet: a runner thread is judged hung by env_runners(sample_timeout_s=...)",
    ),
    "env_runner_restore_timeout_s": (
        1800.0,
        "not supported yet: a runner thread restarts at once (after "
        "delay_between_env_runner_restarts_s)",
    ),
    "action_mask_key": (
        "action_mask",
        "not supported yet: action masking needs Dict observations, which impala_jax does not take",
    ),
    "env_runner_cls": (
        None,
        "not supported yet: runners are impala_jax.runtime.acting.env_runner.EnvRunner",
    ),
    "learner_class": (
        None,
        "not supported yet: the learner is impala_jax.runtime.learning.learner.Learner",
    ),
}
