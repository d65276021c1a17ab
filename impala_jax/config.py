"""IMPALAConfig: RLlib's builder outside, a validated frozen copy inside.

The public face mirrors ``ray.rllib.algorithms.impala.IMPALAConfig`` (ray 2.60): the same builder
methods, keyword names and defaults (``/work/shared/reference/rllib_impala_defaults.md``), the same
mutate-and-return-self semantics. ``build()`` validates, freezes a copy and hands it to ``IMPALA``.

Every field is a keyword of exactly one builder method (``learner_class`` of two) and an attribute
of the same name. The comment beside each default in ``__init__`` says what the field means in
impala_jax and where the default comes from: "RLlib" means RLlib 2.60's fresh value; anything
else is marked. ``docs/config.md`` is the user-facing version of the same table.

Any value may be a Ray Tune search space (``{"grid_search": [...]}`` or an object from a
``ray.tune`` module) until a trial resolves it: ``validate()`` skips such values, ``to_dict()`` /
``from_dict()`` carry them unchanged, and ``build()`` refuses them.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import difflib
import inspect
import numbers
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_MODEL_CONFIG", "IMPALAConfig", "NotProvided", "RLModuleSpec"]


class _NotProvidedType:
    """The type of `NotProvided`: "this keyword was not given", distinct from None."""

    _instance: _NotProvidedType | None = None

    def __new__(cls) -> _NotProvidedType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NotProvided"

    def __reduce__(self) -> str:
        return "NotProvided"  # pickles as the module-level singleton

    def __copy__(self) -> _NotProvidedType:
        return self

    def __deepcopy__(self, memo: dict) -> _NotProvidedType:
        return self


NotProvided = _NotProvidedType()

# RLlib's DefaultModelConfig keys and defaults, plus impala_jax's two encoder keys (marked).
DEFAULT_MODEL_CONFIG: Mapping[str, Any] = types.MappingProxyType(
    {
        "fcnet_hiddens": [256, 256],  # MLP encoder layer sizes
        "fcnet_activation": "tanh",
        "fcnet_use_layernorm": False,
        "conv_filters": None,  # None: the encoder's own layers; else [[out, kernel, stride], ...]
        "conv_activation": "relu",
        "head_fcnet_hiddens": [],  # hidden layers of the policy and value heads
        "head_fcnet_activation": "relu",
        "free_log_std": False,  # Gaussian actions: state-independent log-std parameter
        "log_std_clip_param": 20.0,
        "vf_share_layers": True,  # policy and value share the encoder
        "use_lstm": False,  # accepted for RLlib's sake; True is rejected (no LSTM yet)
        "max_seq_len": 20,
        "lstm_cell_size": 256,
        "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False,
        # impala_jax: "auto" = "mlp" for 1-D observations, "nature_cnn" for images.
        "encoder": "auto",
        # impala_jax: channels of the paper's deep ResNet ("impala_cnn"), one stack per entry.
        "impala_cnn_channels": [16, 32, 32],
    }
)
ENCODERS = ("auto", "mlp", "nature_cnn", "impala_cnn")
ACTIVATIONS = ("tanh", "relu", "swish", "silu", "elu", "sigmoid", "linear", None)  # any case
OPT_TYPES = ("adam", "rmsprop")
GRAD_CLIP_BY = ("value", "norm", "global_norm")
LOG_LEVELS = ("DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass(frozen=True)
class RLModuleSpec:
    """What the learner and the actors build their networks from."""

    model_config: Mapping[str, Any]  # the merged model_config
    factory: str = "impala_jax.networks.make_networks"  # import path of the network factory
    observation_space: Any = None  # None: taken from the env
    action_space: Any = None


def _is_search_space(value: Any) -> bool:
    """A Ray Tune value a trial has not resolved yet (what ``tune.grid_search`` etc. return)."""
    if isinstance(value, dict):
        return len(value) == 1 and "grid_search" in value
    return type(value).__module__.startswith("ray.tune")


def _find_search_space(value: Any) -> bool:
    if _is_search_space(value):
        return True
    if isinstance(value, Mapping):
        return any(_find_search_space(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_find_search_space(v) for v in value)
    return False


def _plain(value: Any) -> Any:
    """A deep copy with tuples turned into lists, so that to_dict() is JSON-shaped."""
    if _is_search_space(value) and not isinstance(value, dict):
        return value  # carried unchanged
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _copy.deepcopy(value)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_schedule(x: Any) -> bool:
    return isinstance(x, list | tuple)


def _schedule_problem(value: Any) -> str | None:
    """Why `value` is not a valid [[timestep, value], ...] schedule, or None."""
    if not isinstance(value, list | tuple) or len(value) < 2:
        return "a schedule needs at least 2 [timestep, value] pairs"
    for point in value:
        if not isinstance(point, list | tuple) or len(point) != 2:
            return f"entry {point!r} is not a [timestep, value] pair"
        if not (_is_real(point[0]) and point[0] >= 0 and _is_real(point[1])):
            return f"entry {point!r} needs a timestep >= 0 and a numeric value"
        if point[1] < 0:
            return f"entry {point!r} has a negative value"
    if value[0][0] != 0:
        return f"the first timestep must be 0, not {value[0][0]!r}"
    steps = [p[0] for p in value]
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        return f"timesteps {steps} must be strictly increasing"
    return None


def _merge_model_config(value: Any) -> Any:
    """`value` merged over DEFAULT_MODEL_CONFIG (a search space is kept as it is)."""
    if _is_search_space(value):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"model_config={value!r}: expected a dict with keys from "
            f"{sorted(DEFAULT_MODEL_CONFIG)}."
        )
    unknown = [k for k in value if k not in DEFAULT_MODEL_CONFIG]
    if unknown:
        raise ValueError(
            f"model_config has unknown key(s) {unknown}; valid keys: "
            f"{sorted(DEFAULT_MODEL_CONFIG)}."
        )
    merged = _copy.deepcopy(dict(DEFAULT_MODEL_CONFIG))
    merged.update(_copy.deepcopy(dict(value)))
    return merged


def _check_deprecated_aggregation(name: str, replacement: str) -> Any:
    def check(value: Any) -> None:
        if value != -1:
            raise ValueError(
                f"{name}={value!r}: {name} is deprecated (as in RLlib); leave it at -1 and use "
                f"{replacement} instead."
            )

    return check


def _check_grad_clip_by(value: Any) -> None:
    if not _is_search_space(value) and value not in GRAD_CLIP_BY:
        raise ValueError(f"grad_clip_by={value!r}: expected one of {GRAD_CLIP_BY}.")


def _check_rollout_fragment_length(value: Any) -> None:
    if _is_search_space(value) or value == "auto":
        return
    if not (_is_int(value) and value > 0):
        raise ValueError(
            f"rollout_fragment_length={value!r}: expected an int > 0 or 'auto' (the train batch "
            f"divided over all envs)."
        )


def _check_model_config(value: Any) -> None:
    _merge_model_config(value)


# Checks RLlib makes as soon as the builder is called; everything else waits for validate().
_SETTER_CHECKS = {
    "num_aggregation_workers": _check_deprecated_aggregation(
        "num_aggregation_workers", "learners(num_aggregator_actors_per_learner=..)"
    ),
    "max_requests_in_flight_per_aggregator_worker": _check_deprecated_aggregation(
        "max_requests_in_flight_per_aggregator_worker",
        "learners(max_requests_in_flight_per_aggregator_actor=..)",
    ),
    "grad_clip_by": _check_grad_clip_by,
    "rollout_fragment_length": _check_rollout_fragment_length,
    "model_config": _check_model_config,
}


class IMPALAConfig:
    """Builds an `IMPALA` algorithm; RLlib's ``IMPALAConfig`` semantics (see module docstring)."""

    def __init__(self, algo_class: Any = None):
        # Not a field: the class build() instantiates; None = impala_jax.algorithm.IMPALA.
        self.algo_class = algo_class
        self._is_frozen = False

        # .environment()
        self.env = None  # gymnasium/envpool id, import path "pkg.mod:Cls", class or creator fn
        self.env_config = {}  # kwargs for the env (envpool options or gymnasium.make kwargs)
        self.observation_space = None  # None: taken from the env
        self.action_space = None  # None: taken from the env
        self.render_env = False  # True is rejected: impala_jax does not render
        self.clip_rewards = None  # None/False: off; True: sign; float c: clip to [-c, c] (loss)
        self.normalize_actions = True  # Box actions: policy acts in [-1, 1], rescaled to bounds
        self.clip_actions = False  # Box actions: clip to the bounds before stepping
        self.disable_env_checking = False  # skip the env-spec sanity check at build
        self.is_atari = None  # None: detect from the env id
        self.action_mask_key = "action_mask"  # Dict obs key holding a mask of allowed actions

        # .env_runners()
        self.env_runner_cls = None  # None: impala_jax.env_runner.EnvRunner (a host thread)
        self.num_env_runners = 2  # actor threads; 0 = sample in the main thread, in lockstep
        self.num_envs_per_env_runner = 1  # envs in each runner's vectorised env
        self.gym_env_vectorize_mode = "sync"  # gymnasium.vector mode for non-envpool envs
        self.num_cpus_per_env_runner = 1  # envpool worker threads per runner
        self.num_gpus_per_env_runner = 0  # no effect: actors run on the default JAX device
        self.sample_timeout_s = 60.0  # a runner silent this long counts as failed
        self.max_requests_in_flight_per_env_runner = 1  # fragments a runner may queue ahead
        self.compress_observations = False  # no effect: fragments stay in memory as arrays
        self.rollout_fragment_length = 50  # T, steps per fragment; "auto": see get_rollout_...
        self.batch_mode = "truncate_episodes"  # the only mode: fragments cut across episodes
        self.explore = True  # True: sample actions; False: take the most likely action
        self.observation_filter = "NoFilter"  # the only filter supported so far

        # .training()
        self.vtrace = True  # must stay True: IMPALA here always uses V-trace
        self.vtrace_clip_rho_threshold = 1.0  # rho-bar in the paper, eq. 1
        self.vtrace_clip_pg_rho_threshold = 1.0  # rho-bar for the policy-gradient advantage
        self.num_gpu_loader_threads = 8  # host threads stacking fragments and copying to devices
        self.num_multi_gpu_tower_stacks = 1  # device-resident prefetch slots for train batches
        self.minibatch_buffer_size = 1  # train batches kept for reuse when num_epochs > 1
        self.replay_proportion = 0.0  # mixin replay: p replayed fragments per new one; 0 = off
        self.replay_buffer_num_slots = 0  # replay capacity in fragments (T steps each)
        self.learner_queue_size = 3  # bound of the queue between batcher and learner
        self.learner_queue_timeout = 300  # seconds the learner waits for a batch before erroring
        self.timeout_s_sampler_manager = 0.0  # seconds one poll for fragments waits; 0 = no wait
        self.timeout_s_aggregator_manager = 0.0  # same, for the batcher threads
        self.broadcast_interval = 1  # learner updates between param publications to actors
        self.grad_clip = 40.0  # clip threshold; None = no clipping
        self.opt_type = "adam"  # "adam" or "rmsprop" (implemented here; RLlib ignores it)
        self.lr_schedule = None  # [[timestep, lr], ...]; overrides a float lr
        self.decay = 0.99  # RMSProp decay
        self.momentum = 0.0  # RMSProp momentum
        self.epsilon = 0.1  # RMSProp epsilon (Adam keeps optax's default)
        self.vf_loss_coeff = 0.5  # weight of the value loss
        self.entropy_coeff = 0.01  # float or [[timestep, value], ...]
        self.entropy_coeff_schedule = None  # [[timestep, value], ...]; overrides a float
        self._separate_vf_optimizer = False  # value params get their own optimizer with _lr_vf
        self._lr_vf = 0.0005  # the value optimizer's learning rate
        self.num_aggregation_workers = -1  # deprecated (as in RLlib): must stay -1
        self.max_requests_in_flight_per_aggregator_worker = -1  # deprecated: must stay -1
        self.gamma = 0.99  # discount
        self.lr = 0.0005  # float or [[timestep, lr], ...], linear in env steps sampled
        self.grad_clip_by = "global_norm"  # "value", "norm" (per tensor) or "global_norm"
        self.train_batch_size = 500  # env steps per update when train_batch_size_per_learner unset
        self._train_batch_size_per_learner = None  # env steps per learner device per update
        self.num_epochs = 1  # passes over each train batch
        self.minibatch_size = None  # env steps per SGD step; None = the whole batch
        self.shuffle_batch_per_epoch = False  # shuffle fragments between epochs
        self.learner_class = None  # None: impala_jax.learner.Learner

        # .learners()
        self.num_learners = 1  # learner devices (data parallel); 0 = 1 device, no collectives
        self.num_cpus_per_learner = "auto"  # no effect: learners are JAX devices
        self.num_gpus_per_learner = 0  # no effect: learners use JAX's default backend
        self.num_aggregator_actors_per_learner = 0  # batcher threads per learner; 0 = loaders do it
        self.max_requests_in_flight_per_aggregator_actor = 3  # fragments queued per batcher thread
        self.local_gpu_idx = 0  # index into jax.devices() of the first learner device

        # .rl_module()
        self._model_config = _merge_model_config({})  # RLlib: {}; here defaults merged in

        # .evaluation()
        self.evaluation_interval = None  # evaluate every N train() calls; None or 0 = never
        self.evaluation_duration = 10  # episodes or timesteps per evaluation; "auto" if parallel
        self.evaluation_duration_unit = "episodes"  # "episodes" or "timesteps"
        self.evaluation_sample_timeout_s = 120.0  # evaluation that takes longer stops early
        self.evaluation_parallel_to_training = False  # needs evaluation_num_env_runners > 0
        self.evaluation_force_reset_envs_before_iteration = True  # evaluate from fresh episodes
        self.evaluation_config = None  # dict of field overrides for evaluation, e.g. explore
        self.evaluation_num_env_runners = 0  # eval runner threads; 0 = the main thread evaluates
        self.custom_evaluation_function = None  # fn(algo) -> metrics dict, replaces the default

        # .reporting()
        self.metrics_num_episodes_for_smoothing = 100  # episodes in the return/length averages
        self.min_time_s_per_iteration = 10  # train() runs at least this many seconds
        self.min_train_timesteps_per_iteration = 0  # ... and trains at least this many steps
        self.min_sample_timesteps_per_iteration = 0  # ... and samples at least this many steps
        self.log_gradients = False  # report per-parameter gradient norms

        # .fault_tolerance()
        self.restart_failed_env_runners = True  # restart a crashed runner thread
        self.ignore_env_runner_failures = False  # keep training with fewer runners instead
        self.max_num_env_runner_restarts = 1000  # restarts per runner before giving up
        self.delay_between_env_runner_restarts_s = 60.0  # wait before a restart
        self.restart_failed_sub_environments = False  # reset a crashed env, keep the runner
        self.num_consecutive_env_runner_failures_tolerance = 100  # then train() raises
        self.env_runner_health_probe_timeout_s = 30.0  # a runner thread silent this long is hung
        self.env_runner_restore_timeout_s = 1800.0  # give up on a restart after this long

        # .checkpointing()
        self.export_native_model_files = False  # also write params as a flax msgpack file
        self.checkpoint_trainable_policies_only = False  # no effect: one policy

        # .debugging()
        self._env_runners_only = False  # sample and report, never learn
        self._skip_learners = False  # same, but batches still go through the batcher
        self.log_level = "WARN"  # level of the impala_jax logger
        self.log_sys_usage = True  # report CPU and memory use in the results
        self.fake_sampler = False  # reuse the first train batch forever (learner benchmarking)
        self.seed = None  # root PRNG and env seed; None = drawn at build

        # .resources() (not in the measured table; RLlib's values, no effect here)
        self.num_cpus_for_main_process = 1
        self.placement_strategy = "PACK"

    def environment(
        self,
        env=NotProvided,
        *,
        env_config=NotProvided,
        observation_space=NotProvided,
        action_space=NotProvided,
        render_env=NotProvided,
        clip_rewards=NotProvided,
        normalize_actions=NotProvided,
        clip_actions=NotProvided,
        disable_env_checking=NotProvided,
        is_atari=NotProvided,
        action_mask_key=NotProvided,
    ) -> IMPALAConfig:
        """Sets the environment; ``env`` may be given positionally, as in RLlib."""
        return self._set(locals())

    def env_runners(
        self,
        *,
        env_runner_cls=NotProvided,
        num_env_runners=NotProvided,
        num_envs_per_env_runner=NotProvided,
        gym_env_vectorize_mode=NotProvided,
        num_cpus_per_env_runner=NotProvided,
        num_gpus_per_env_runner=NotProvided,
        sample_timeout_s=NotProvided,
        max_requests_in_flight_per_env_runner=NotProvided,
        compress_observations=NotProvided,
        rollout_fragment_length=NotProvided,
        batch_mode=NotProvided,
        explore=NotProvided,
        observation_filter=NotProvided,
    ) -> IMPALAConfig:
        """Sets the actors: how many runner threads, envs each, and fragment length."""
        return self._set(locals())

    def training(
        self,
        *,
        vtrace=NotProvided,
        vtrace_clip_rho_threshold=NotProvided,
        vtrace_clip_pg_rho_threshold=NotProvided,
        num_gpu_loader_threads=NotProvided,
        num_multi_gpu_tower_stacks=NotProvided,
        minibatch_buffer_size=NotProvided,
        replay_proportion=NotProvided,
        replay_buffer_num_slots=NotProvided,
        learner_queue_size=NotProvided,
        learner_queue_timeout=NotProvided,
        timeout_s_sampler_manager=NotProvided,
        timeout_s_aggregator_manager=NotProvided,
        broadcast_interval=NotProvided,
        grad_clip=NotProvided,
        opt_type=NotProvided,
        lr_schedule=NotProvided,
        decay=NotProvided,
        momentum=NotProvided,
        epsilon=NotProvided,
        vf_loss_coeff=NotProvided,
        entropy_coeff=NotProvided,
        entropy_coeff_schedule=NotProvided,
        _separate_vf_optimizer=NotProvided,
        _lr_vf=NotProvided,
        num_aggregation_workers=NotProvided,
        max_requests_in_flight_per_aggregator_worker=NotProvided,
        gamma=NotProvided,
        lr=NotProvided,
        grad_clip_by=NotProvided,
        train_batch_size=NotProvided,
        train_batch_size_per_learner=NotProvided,
        num_epochs=NotProvided,
        minibatch_size=NotProvided,
        shuffle_batch_per_epoch=NotProvided,
        learner_class=NotProvided,
    ) -> IMPALAConfig:
        """Sets the loss, optimizer, batch sizes and the learner pipeline."""
        return self._set(locals())

    def learners(
        self,
        *,
        num_learners=NotProvided,
        num_cpus_per_learner=NotProvided,
        num_gpus_per_learner=NotProvided,
        num_aggregator_actors_per_learner=NotProvided,
        max_requests_in_flight_per_aggregator_actor=NotProvided,
        local_gpu_idx=NotProvided,
        learner_class=NotProvided,
    ) -> IMPALAConfig:
        """Sets the learner devices (data parallel over ``num_learners`` JAX devices)."""
        return self._set(locals())

    def rl_module(self, *, model_config=NotProvided) -> IMPALAConfig:
        """Sets the network; ``model_config`` is merged over `DEFAULT_MODEL_CONFIG`."""
        return self._set(locals())

    def evaluation(
        self,
        *,
        evaluation_interval=NotProvided,
        evaluation_duration=NotProvided,
        evaluation_duration_unit=NotProvided,
        evaluation_sample_timeout_s=NotProvided,
        evaluation_parallel_to_training=NotProvided,
        evaluation_force_reset_envs_before_iteration=NotProvided,
        evaluation_config=NotProvided,
        evaluation_num_env_runners=NotProvided,
        custom_evaluation_function=NotProvided,
    ) -> IMPALAConfig:
        """Sets when and how the policy is evaluated."""
        return self._set(locals())

    def reporting(
        self,
        *,
        metrics_num_episodes_for_smoothing=NotProvided,
        min_time_s_per_iteration=NotProvided,
        min_train_timesteps_per_iteration=NotProvided,
        min_sample_timesteps_per_iteration=NotProvided,
        log_gradients=NotProvided,
    ) -> IMPALAConfig:
        """Sets what one ``train()`` call covers and how results are smoothed."""
        return self._set(locals())

    def fault_tolerance(
        self,
        *,
        restart_failed_env_runners=NotProvided,
        ignore_env_runner_failures=NotProvided,
        max_num_env_runner_restarts=NotProvided,
        delay_between_env_runner_restarts_s=NotProvided,
        restart_failed_sub_environments=NotProvided,
        num_consecutive_env_runner_failures_tolerance=NotProvided,
        env_runner_health_probe_timeout_s=NotProvided,
        env_runner_restore_timeout_s=NotProvided,
    ) -> IMPALAConfig:
        """Sets what happens when an env or a runner thread fails."""
        return self._set(locals())

    def checkpointing(
        self,
        *,
        export_native_model_files=NotProvided,
        checkpoint_trainable_policies_only=NotProvided,
    ) -> IMPALAConfig:
        """Sets what a checkpoint holds."""
        return self._set(locals())

    def debugging(
        self,
        *,
        _env_runners_only=NotProvided,
        _skip_learners=NotProvided,
        log_level=NotProvided,
        log_sys_usage=NotProvided,
        fake_sampler=NotProvided,
        seed=NotProvided,
    ) -> IMPALAConfig:
        """Sets the seed, the log level and debugging switches."""
        return self._set(locals())

    def resources(
        self,
        *,
        num_cpus_for_main_process=NotProvided,
        placement_strategy=NotProvided,
    ) -> IMPALAConfig:
        """Accepted for RLlib compatibility; impala_jax runs in one process."""
        return self._set(locals())

    def _set(self, arguments: dict[str, Any]) -> IMPALAConfig:
        """Copies every argument that was given onto the attribute of the same name."""
        given = {k: v for k, v in arguments.items() if k != "self" and v is not NotProvided}
        self._raise_if_frozen(", ".join(given) or "nothing")
        for name, value in given.items():
            if name in _SETTER_CHECKS:
                _SETTER_CHECKS[name](value)
        for name, value in given.items():
            setattr(self, name, value)
        return self

    def _raise_if_frozen(self, what: str) -> None:
        if self.__dict__.get("_is_frozen", False):
            raise AttributeError(
                f"Cannot set {what}: this IMPALAConfig is frozen (build() and freeze() freeze "
                f"it). Make an editable copy with config.copy(copy_frozen=False)."
            )

    def __setattr__(self, name: str, value: Any) -> None:
        self._raise_if_frozen(name)
        if not name.startswith("_") and name not in _FIELD_TO_BUILDER and name != "algo_class":
            close = difflib.get_close_matches(name, list(_FIELD_TO_BUILDER), n=3)
            raise AttributeError(
                f"IMPALAConfig has no field {name!r}"
                + (f"; did you mean {' or '.join(map(repr, close))}?" if close else ".")
            )
        object.__setattr__(self, name, value)

    @property
    def is_frozen(self) -> bool:
        """True after freeze() (build() hands IMPALA a frozen copy)."""
        return self._is_frozen

    @property
    def train_batch_size_per_learner(self) -> Any:
        """Env steps per learner device per update; falls back to `train_batch_size` (RLlib)."""
        raw = self._train_batch_size_per_learner
        return self.train_batch_size if raw is None else raw

    @train_batch_size_per_learner.setter
    def train_batch_size_per_learner(self, value: Any) -> None:
        self._train_batch_size_per_learner = value

    @property
    def model_config(self) -> Any:
        """The merged model config: `DEFAULT_MODEL_CONFIG` updated by the user's dict."""
        return self._model_config

    @model_config.setter
    def model_config(self, value: Any) -> None:
        self._model_config = _merge_model_config(value)

    def _resolved(self, *names: str) -> None:
        for name in names:
            if _find_search_space(self._raw(name)):
                raise ValueError(
                    f"{name}={self._raw(name)!r} is a Ray Tune search space that no trial has "
                    f"resolved yet; derived sizes need a concrete value."
                )

    def _raw(self, name: str) -> Any:
        if name == "train_batch_size_per_learner":
            return self._train_batch_size_per_learner
        return getattr(self, name)

    @property
    def total_train_batch_size(self) -> int:
        """Env steps per update over all learners: per-learner batch * max(1, num_learners)."""
        self._resolved("train_batch_size", "train_batch_size_per_learner", "num_learners")
        return self.train_batch_size_per_learner * max(1, self.num_learners)

    @property
    def replay_ratio(self) -> float:
        """RLlib's formula: 1 / replay_proportion when it is > 0, else 0.0."""
        self._resolved("replay_proportion")
        return (1 / self.replay_proportion) if self.replay_proportion > 0 else 0.0

    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """T, the fragment length; resolves "auto".

        "auto" (RLlib's rule, without RLlib's per-worker remainder, since T is a compiled shape
        here): the total train batch divided over all envs,
        ``total_train_batch_size // (max(1, num_env_runners) * num_envs_per_env_runner)``,
        at least 1. `worker_index` is accepted for RLlib's signature and has no effect.
        """
        if self.rollout_fragment_length != "auto":
            self._resolved("rollout_fragment_length")
            return self.rollout_fragment_length
        self._resolved("num_env_runners", "num_envs_per_env_runner")
        envs = max(1, self.num_env_runners) * self.num_envs_per_env_runner
        return max(1, self.total_train_batch_size // envs)

    def _resolve_schedule(self, name: str, schedule_name: str) -> Any:
        value, schedule = getattr(self, name), getattr(self, schedule_name)
        if schedule is None:
            return _plain(value) if _is_schedule(value) else value
        if _is_schedule(value):
            raise ValueError(
                f"{name}={value!r} and {schedule_name}={schedule!r} are both schedules; give the "
                f"schedule once, either as {name}=[[0, v0], ...] or as {schedule_name}."
            )
        return _plain(schedule)

    @property
    def resolved_lr(self) -> Any:
        """The lr in effect: `lr_schedule` if set, else `lr` (a float or [[t, v], ...])."""
        return self._resolve_schedule("lr", "lr_schedule")

    @property
    def resolved_entropy_coeff(self) -> Any:
        """`entropy_coeff_schedule` if set, else `entropy_coeff` (a float or [[t, v], ...])."""
        return self._resolve_schedule("entropy_coeff", "entropy_coeff_schedule")

    def get_default_learner_class(self) -> str:
        return "impala_jax.learner.Learner"

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(
            model_config=_copy.deepcopy(self.model_config),
            observation_space=self.observation_space,
            action_space=self.action_space,
        )

    def freeze(self) -> IMPALAConfig:
        """Forbids every further change; `copy(copy_frozen=False)` gives an editable copy."""
        object.__setattr__(self, "_is_frozen", True)
        return self

    def copy(self, copy_frozen: bool | None = None) -> IMPALAConfig:
        """A deep copy; frozen if `copy_frozen` is True, editable if False, as self if None."""
        new = _copy.deepcopy(self)
        if copy_frozen is not None:
            object.__setattr__(new, "_is_frozen", bool(copy_frozen))
        return new

    def build(self) -> Any:
        """Validates, freezes a copy and returns ``IMPALA(frozen_copy)``."""
        unresolved = [n for n in _FIELD_TO_BUILDER if _find_search_space(self._raw(n))]
        if unresolved:
            raise ValueError(
                f"Cannot build with unresolved Ray Tune search spaces in {unresolved}; pass the "
                f"config to tune.Tuner(param_space=...) or set concrete values."
            )
        self.validate()
        if self.env is None:
            raise ValueError(
                'env=None: no environment is set; call .environment("CartPole-v1") (or another '
                "gymnasium/envpool id, an env class or a creator function) before build()."
            )
        frozen = self.copy(copy_frozen=True)
        algo_class = self.algo_class
        if algo_class is None:
            from impala_jax.algorithm import IMPALA as algo_class
        return algo_class(frozen)

    def build_algo(self) -> Any:
        """Alias of `build()` (RLlib's newer name)."""
        return self.build()

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``train_batch_size_per_learner`` raw); lists, not tuples."""
        return {name: _plain(self._raw(name)) for name in _FIELD_TO_BUILDER}

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> IMPALAConfig:
        return cls().update_from_dict(config_dict)

    def update_from_dict(self, config_dict: Mapping[str, Any]) -> IMPALAConfig:
        """Sets each key through its builder method, so the builders' checks apply."""
        unknown = [k for k in config_dict if k not in _FIELD_TO_BUILDER]
        if unknown:
            hints = {k: difflib.get_close_matches(k, list(_FIELD_TO_BUILDER), n=3) for k in unknown}
            raise ValueError(
                f"Unknown IMPALAConfig field(s) {unknown} (close matches: {hints}). Every key must "
                f"be a keyword of one of the builder methods; see docs/config.md."
            )
        by_builder: dict[str, dict[str, Any]] = {}
        for name, value in config_dict.items():
            by_builder.setdefault(_FIELD_TO_BUILDER[name], {})[name] = value
        for builder, kwargs in by_builder.items():
            getattr(self, builder)(**kwargs)
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IMPALAConfig):
            return NotImplemented
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        default = IMPALAConfig().to_dict()
        changed = {k: v for k, v in self.to_dict().items() if v != default[k]}
        frozen = ", frozen" if self._is_frozen else ""
        return f"IMPALAConfig({changed}{frozen})"

    def validate(self) -> None:
        """Raises one ValueError listing every invalid field, its value and the fix."""
        _Validator(self).run()


# Builder of every field, read off the signatures (training before learners: learner_class).
_BUILDERS = (
    "environment",
    "env_runners",
    "training",
    "learners",
    "rl_module",
    "evaluation",
    "reporting",
    "fault_tolerance",
    "checkpointing",
    "debugging",
    "resources",
)
_FIELD_TO_BUILDER: dict[str, str] = {}
for _builder in _BUILDERS:
    for _name in list(inspect.signature(getattr(IMPALAConfig, _builder)).parameters)[1:]:
        _FIELD_TO_BUILDER.setdefault(_name, _builder)


class _Validator:
    """Collects every problem of one config; a field already found bad is not checked again."""

    def __init__(self, config: IMPALAConfig):
        self.c = config
        self.errors: list[str] = []
        self.bad: set[str] = set()

    def value(self, name: str) -> Any:
        return self.c._raw(name)

    def ok(self, *names: str) -> bool:
        """True when every field is concrete (not a search space) and not already bad."""
        return not any(n in self.bad or _find_search_space(self.value(n)) for n in names)

    def fail(self, name: str, message: str, value: Any = NotProvided) -> None:
        value = self.value(name) if value is NotProvided else value
        field = name.split("[")[0]
        how = f".{_FIELD_TO_BUILDER[field]}({field}=...)"
        self.errors.append(f"{name}={value!r}: {message} (set with {how}).")
        self.bad.add(name)

    def check(self, name: str, predicate: Any, expected: str) -> None:
        if not self.ok(name):
            return
        try:
            good = bool(predicate(self.value(name)))
        except Exception:  # a predicate that cannot even be evaluated means a wrong type
            good = False
        if not good:
            self.fail(name, f"expected {expected}")

    def boolean(self, *names: str) -> None:
        for name in names:
            self.check(name, lambda v: isinstance(v, bool), "True or False")

    def integer(self, name: str, low: int, none_ok: bool = False) -> None:
        self.check(
            name,
            lambda v: (none_ok and v is None) or (_is_int(v) and v >= low),
            f"an int >= {low}" + (" or None" if none_ok else ""),
        )

    def real(self, name: str, low: float, *, open_low: bool = False, none_ok: bool = False) -> None:
        self.check(
            name,
            lambda v: (
                (none_ok and v is None) or (_is_real(v) and (v > low if open_low else v >= low))
            ),
            f"a number {'>' if open_low else '>='} {low}" + (" or None" if none_ok else ""),
        )

    def choice(self, name: str, options: tuple, note: str = "") -> None:
        self.check(name, lambda v: v in options, f"one of {options}{note}")

    def run(self) -> None:
        self._environment()
        self._env_runners()
        self._training()
        self._batch_sizes()
        self._learners()
        self._model_config()
        self._evaluation()
        self._rest()
        if self.errors:
            raise ValueError("Invalid IMPALAConfig:\n  " + "\n  ".join(self.errors))

    def _environment(self) -> None:
        c = self
        c.check(
            "env",
            lambda v: v is None or isinstance(v, str) or callable(v),
            "an env id such as 'CartPole-v1', an import path 'pkg.mod:Env', an env class or a "
            "creator function",
        )
        c.check("env_config", lambda v: isinstance(v, Mapping), "a dict")
        for name in ("observation_space", "action_space"):
            c.check(
                name, lambda v: v is None or hasattr(v, "contains"), "None or a gymnasium space"
            )
        c.check("render_env", lambda v: v is False, "False (impala_jax does not render envs)")
        c.check(
            "clip_rewards",
            lambda v: v is None or isinstance(v, bool) or (_is_real(v) and v > 0),
            "None/False (off), True (sign) or a float > 0 (clip to [-c, c])",
        )
        c.boolean("normalize_actions", "clip_actions", "disable_env_checking")
        c.check("is_atari", lambda v: v is None or isinstance(v, bool), "None (detect) or a bool")
        c.check("action_mask_key", lambda v: isinstance(v, str), "a string")

    def _env_runners(self) -> None:
        c = self
        for name in ("env_runner_cls", "learner_class"):
            c.check(
                name,
                lambda v: v is None or isinstance(v, str | type),
                "None (impala_jax's own), a class or its import path",
            )
        c.integer("num_env_runners", 0)
        c.integer("num_envs_per_env_runner", 1)
        c.check(
            "gym_env_vectorize_mode",
            lambda v: v.lower() in ("sync", "async"),
            "'sync' or 'async' (case-insensitive)",
        )
        c.real("num_cpus_per_env_runner", 0)
        c.real("num_gpus_per_env_runner", 0)
        c.real("sample_timeout_s", 0, open_low=True)
        c.integer("max_requests_in_flight_per_env_runner", 1)
        c.boolean("compress_observations", "explore")
        c.check(
            "rollout_fragment_length",
            lambda v: v == "auto" or (_is_int(v) and v > 0),
            "an int > 0 or 'auto'",
        )
        c.check(
            "batch_mode",
            lambda v: v == "truncate_episodes",
            "'truncate_episodes': impala_jax only supports truncate_episodes (fragments of T "
            "steps that cut across episodes); 'complete_episodes' is not supported",
        )
        c.check(
            "observation_filter",
            lambda v: v == "NoFilter",
            "'NoFilter': MeanStdFilter and other filters are not supported yet",
        )

    def _training(self) -> None:
        c, cfg = self, self.c
        c.check("vtrace", lambda v: v is True, "True: impala_jax always uses V-trace")
        c.real("vtrace_clip_rho_threshold", 0, open_low=True)
        c.real("vtrace_clip_pg_rho_threshold", 0, open_low=True)
        c.integer("num_gpu_loader_threads", 1)
        c.integer("num_multi_gpu_tower_stacks", 1)
        c.integer("minibatch_buffer_size", 1)
        c.real("replay_proportion", 0)
        c.integer("replay_buffer_num_slots", 0)
        if c.ok("replay_proportion", "replay_buffer_num_slots") and cfg.replay_proportion > 0:
            if cfg.replay_buffer_num_slots < 1:
                c.fail(
                    "replay_buffer_num_slots",
                    f"replay_proportion={cfg.replay_proportion!r} > 0 turns replay on and needs "
                    f"replay_buffer_num_slots >= 1",
                )
        c.integer("learner_queue_size", 1)
        c.real("learner_queue_timeout", 0, open_low=True)
        c.real("timeout_s_sampler_manager", 0)
        c.real("timeout_s_aggregator_manager", 0)
        c.integer("broadcast_interval", 1)
        c.real("grad_clip", 0, open_low=True, none_ok=True)
        c.choice("grad_clip_by", GRAD_CLIP_BY)
        c.choice("opt_type", OPT_TYPES)
        c.check("decay", lambda v: _is_real(v) and 0 <= v < 1, "a number in [0, 1)")
        c.real("momentum", 0)
        c.real("epsilon", 0, open_low=True)
        c.real("vf_loss_coeff", 0)
        c.check("gamma", lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]")
        self._schedule("lr", "lr_schedule", "> 0", open_low=True)
        self._schedule("entropy_coeff", "entropy_coeff_schedule", ">= 0", open_low=False)
        c.boolean("_separate_vf_optimizer", "shuffle_batch_per_epoch")
        c.check(
            "num_aggregation_workers", lambda v: v == -1, "-1 (deprecated; use num_aggregator_...)"
        )
        c.check(
            "max_requests_in_flight_per_aggregator_worker", lambda v: v == -1, "-1 (deprecated)"
        )
        if c.ok("_separate_vf_optimizer") and cfg._separate_vf_optimizer:
            c.real("_lr_vf", 0, open_low=True)
            if c.ok("model_config") and cfg.model_config.get("vf_share_layers") is True:
                c.fail(
                    "_separate_vf_optimizer",
                    "a separate value optimizer needs separate value layers; also set "
                    "rl_module(model_config={'vf_share_layers': False})",
                )
        c.integer("num_epochs", 1)

    def _schedule(self, name: str, schedule_name: str, float_rule: str, open_low: bool) -> None:
        c = self
        value, schedule = self.value(name), self.value(schedule_name)
        if c.ok(name):
            if _is_schedule(value):
                problem = _schedule_problem(value)
                if problem:
                    c.fail(name, f"invalid schedule: {problem}; expected [[0, v0], [t1, v1], ...]")
                elif schedule is not None:
                    c.fail(
                        name,
                        f"{name} is a schedule and {schedule_name} is also set; give the "
                        f"schedule once",
                    )
            else:
                c.check(
                    name,
                    lambda v: _is_real(v) and (v > 0 if open_low else v >= 0),
                    f"a float {float_rule} or a schedule [[0, v0], [t1, v1], ...]",
                )
        if c.ok(schedule_name) and schedule is not None:
            problem = _schedule_problem(schedule)
            if problem:
                c.fail(schedule_name, f"invalid schedule: {problem}; expected [[0, v0], ...]")

    def _batch_sizes(self) -> None:
        c, cfg = self, self.c
        c.integer("train_batch_size", 1)
        c.integer("train_batch_size_per_learner", 1, none_ok=True)
        c.integer("minibatch_size", 1, none_ok=True)
        sizes = (
            "train_batch_size",
            "train_batch_size_per_learner",
            "rollout_fragment_length",
            "num_learners",
            "num_env_runners",
            "num_envs_per_env_runner",
        )
        if not c.ok(*sizes) or not _is_int(cfg.num_learners) or cfg.num_learners < 0:
            return
        t = cfg.get_rollout_fragment_length()
        per_learner = cfg.train_batch_size_per_learner
        name = (
            "train_batch_size_per_learner"
            if cfg._train_batch_size_per_learner is not None
            else "train_batch_size"
        )
        if per_learner % t:
            divisor = max(d for d in range(1, t + 1) if per_learner % d == 0)
            if cfg.rollout_fragment_length == "auto":
                how = (
                    f"rollout_fragment_length='auto' gives {t} (total batch // all envs), which "
                    f"does not divide it; set rollout_fragment_length={divisor}"
                )
            else:
                how = (
                    f"use a multiple of rollout_fragment_length={t} (e.g. "
                    f"{max(t, per_learner // t * t)}) or set rollout_fragment_length={divisor}"
                )
            c.fail(
                name, f"the per-learner train batch must split into fragments: {how}", per_learner
            )
        if c.ok("minibatch_size") and cfg.minibatch_size is not None:
            total = cfg.total_train_batch_size
            if cfg.minibatch_size % t:
                c.fail("minibatch_size", f"must be a multiple of rollout_fragment_length={t}")
            elif cfg.minibatch_size > total:
                c.fail(
                    "minibatch_size",
                    f"must be <= the total train batch ({total} = train_batch_size_per_learner "
                    f"* max(1, num_learners))",
                )

    def _learners(self) -> None:
        c = self
        c.integer("num_learners", 0)
        if c.ok("num_learners"):
            import jax  # here, not at import: importing the config must not start JAX

            available = len(jax.devices())
            if self.c.num_learners > available:
                c.fail(
                    "num_learners",
                    f"only {available} JAX device(s) are present ({jax.default_backend()}); use "
                    f"num_learners <= {available}",
                )
        c.check(
            "num_cpus_per_learner",
            lambda v: v == "auto" or (_is_real(v) and v >= 0),
            "'auto' or a number >= 0",
        )
        c.real("num_gpus_per_learner", 0)
        c.integer("num_aggregator_actors_per_learner", 0)
        c.integer("max_requests_in_flight_per_aggregator_actor", 1)
        c.integer("local_gpu_idx", 0)

    def _model_config(self) -> None:
        c = self
        if not c.ok("model_config"):
            return
        mc = self.c.model_config
        unknown = [k for k in mc if k not in DEFAULT_MODEL_CONFIG]
        if unknown:
            c.fail(
                "model_config", f"unknown key(s) {unknown}; valid: {sorted(DEFAULT_MODEL_CONFIG)}"
            )
            return

        def key(k: str, predicate: Any, expected: str) -> None:
            v = mc.get(k, DEFAULT_MODEL_CONFIG[k])
            if _find_search_space(v):
                return
            try:
                good = bool(predicate(v))
            except Exception:
                good = False
            if not good:
                c.fail(f"model_config['{k}']", f"expected {expected}", v)

        def ints(v: Any) -> bool:
            return isinstance(v, list | tuple) and all(_is_int(x) and x > 0 for x in v)

        def filters(v: Any) -> bool:
            return v is None or (
                isinstance(v, list | tuple)
                and len(v) > 0
                and all(isinstance(f, list | tuple) and len(f) == 3 and ints(f) for f in v)
            )

        key("fcnet_hiddens", ints, "a list of positive ints")
        key("head_fcnet_hiddens", ints, "a list of positive ints (may be empty)")
        key("impala_cnn_channels", lambda v: ints(v) and len(v) > 0, "a non-empty list of ints > 0")
        for k in ("fcnet_activation", "conv_activation", "head_fcnet_activation"):
            key(
                k,
                lambda v: (v.lower() if isinstance(v, str) else v) in ACTIVATIONS,
                f"one of {ACTIVATIONS} (None = linear)",
            )
        key("conv_filters", filters, "None or a list of [out_channels, kernel, stride] (ints > 0)")
        key("encoder", lambda v: v in ENCODERS, f"one of {ENCODERS}")
        for k in ("fcnet_use_layernorm", "free_log_std", "vf_share_layers"):
            key(k, lambda v: isinstance(v, bool), "True or False")
        for k in ("lstm_use_prev_action", "lstm_use_prev_reward"):
            key(k, lambda v: isinstance(v, bool), "True or False")
        key("log_std_clip_param", lambda v: _is_real(v) and v > 0, "a number > 0")
        key("use_lstm", lambda v: v is False, "False: LSTM policies are not supported yet")
        key("max_seq_len", lambda v: _is_int(v) and v > 0, "an int > 0")
        key("lstm_cell_size", lambda v: _is_int(v) and v > 0, "an int > 0")

    def _evaluation(self) -> None:
        c, cfg = self, self.c
        c.integer("evaluation_interval", 0, none_ok=True)
        c.check(
            "evaluation_duration",
            lambda v: v == "auto" or (_is_int(v) and v >= 1),
            "an int >= 1, or 'auto' with evaluation_parallel_to_training=True",
        )
        c.choice("evaluation_duration_unit", ("episodes", "timesteps"))
        c.real("evaluation_sample_timeout_s", 0, open_low=True)
        c.boolean("evaluation_parallel_to_training", "evaluation_force_reset_envs_before_iteration")
        c.integer("evaluation_num_env_runners", 0)
        c.check(
            "custom_evaluation_function",
            lambda v: v is None or callable(v),
            "None or a function algo -> metrics dict",
        )
        parallel = ("evaluation_parallel_to_training", "evaluation_num_env_runners")
        if c.ok(*parallel) and cfg.evaluation_parallel_to_training:
            if cfg.evaluation_num_env_runners < 1:
                c.fail(
                    "evaluation_parallel_to_training",
                    "parallel evaluation needs its own runner threads; also set "
                    "evaluation(evaluation_num_env_runners=1) or more",
                )
        if c.ok("evaluation_duration", *parallel) and cfg.evaluation_duration == "auto":
            if not cfg.evaluation_parallel_to_training:
                c.fail(
                    "evaluation_duration",
                    "'auto' only works with evaluation_parallel_to_training=True; give an int",
                )
        if c.ok("evaluation_config") and cfg.evaluation_config is not None:
            self._evaluation_config(cfg.evaluation_config)

    def _evaluation_config(self, overrides: Any) -> None:
        if not isinstance(overrides, Mapping):
            self.fail("evaluation_config", "expected None or a dict of field overrides")
            return
        trial = self.c.copy(copy_frozen=False)
        trial.evaluation_config = None
        try:
            trial.update_from_dict(overrides)
            trial.validate()
        except ValueError as e:
            problems = str(e).removeprefix("Invalid IMPALAConfig:").strip().replace("\n  ", "; ")
            self.fail("evaluation_config", f"the evaluation config would be invalid: {problems}")

    def _rest(self) -> None:
        c = self
        c.integer("metrics_num_episodes_for_smoothing", 1)
        c.real("min_time_s_per_iteration", 0, none_ok=True)
        c.integer("min_train_timesteps_per_iteration", 0, none_ok=True)
        c.integer("min_sample_timesteps_per_iteration", 0, none_ok=True)
        c.integer("max_num_env_runner_restarts", 0)
        c.real("delay_between_env_runner_restarts_s", 0)
        c.integer("num_consecutive_env_runner_failures_tolerance", 0)
        c.real("env_runner_health_probe_timeout_s", 0, open_low=True)
        c.real("env_runner_restore_timeout_s", 0, open_low=True)
        c.boolean(
            "log_gradients",
            "restart_failed_env_runners",
            "ignore_env_runner_failures",
            "restart_failed_sub_environments",
            "export_native_model_files",
            "checkpoint_trainable_policies_only",
            "_env_runners_only",
            "_skip_learners",
            "log_sys_usage",
            "fake_sampler",
        )
        c.check("log_level", lambda v: v.upper() in LOG_LEVELS, f"one of {LOG_LEVELS}")
        c.integer("seed", 0, none_ok=True)
        c.real("num_cpus_for_main_process", 0)
