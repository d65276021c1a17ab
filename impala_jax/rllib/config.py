"""IMPALAConfig: RLlib's builder outside, a validated frozen copy inside.

The public face mirrors ``ray.rllib.algorithms.impala.IMPALAConfig`` (ray 2.60): the same builder
methods, keyword names and defaults (RLlib 2.60's fresh values, so that RLlib scripts behave the
same), the same mutate-and-return-self semantics. ``build()`` validates, freezes a copy and hands
it to ``IMPALA``.

Every field is a keyword of exactly one builder method (``learner_class`` of two) and an attribute
of the same name. The comment beside each default in ``__init__`` says what the field means in
impala_jax and where the default comes from: "RLlib" means RLlib 2.60's fresh value; anything
else is marked. ``docs/config.md`` is the user-facing version of the same table.
Validation lives in ``checks.py`` (``setter_checks.py`` for the checks a builder makes at once,
``model_config_checks.py`` for the model_config keys), RLlib's keywords not offered here in
``compat.py`` and ``compat_tables.py``, the network plug point in ``module_spec.py`` and the
model_config defaults in ``core/model_config.py``.

Any value may be a Ray Tune search space (``{"grid_search": [...]}`` or an object from a
``ray.tune`` module) until a trial resolves it: ``validate()`` skips such values, ``to_dict()`` /
``from_dict()`` carry them unchanged, and ``build()`` refuses them.
"""

from __future__ import annotations

import copy as _copy
import difflib
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from impala_jax.core.loss_spec import COEFFICIENTS as LOSS_COEFFICIENTS
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG
from impala_jax.rllib.callbacks import CALLBACK_KEYWORDS
from impala_jax.rllib.checks import start_together, validate_config
from impala_jax.rllib.compat import DECLARED, NotProvided, RLlibBuilders, route
from impala_jax.rllib.model_config_checks import merge_model_config
from impala_jax.rllib.module_spec import (
    DEFAULT_FACTORY,
    RLModuleSpec,
    as_rl_module_spec,
    spec_to_dict,
)
from impala_jax.rllib.setter_checks import SETTER_CHECKS
from impala_jax.rllib.values import find_search_space, is_schedule, is_search_space

__all__ = ["DEFAULT_MODEL_CONFIG", "IMPALAConfig", "NotProvided", "RLModuleSpec"]


_LOG = logging.getLogger("impala_jax")
# A keyword whose attribute has another name (RLlib's: `framework` would shadow the method).
_ATTRIBUTE = {"framework": "framework_str"}


def _plain(value: Any) -> Any:
    """A deep copy with tuples turned into lists, so that to_dict() is JSON-shaped."""
    if is_search_space(value) and not isinstance(value, dict):
        return value  # carried unchanged
    if isinstance(value, RLModuleSpec):
        return _plain(spec_to_dict(value))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _copy.deepcopy(value)


class IMPALAConfig(RLlibBuilders):
    """Builds an `IMPALA` algorithm; RLlib's ``IMPALAConfig`` semantics (see module docstring)."""

    def __init__(self, algo_class: Any = None):
        # Not a field: the class build() instantiates; None = impala_jax.rllib.algorithm.IMPALA.
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
        self.action_mask_key = "action_mask"  # no Dict obs yet: others are a ValueError

        # .env_runners()
        self.env_runner_cls = None  # runtime.acting.env_runner.EnvRunner; others: ValueError
        self.num_env_runners = 2  # actor threads; 0 = sample in the main thread, in lockstep
        self.num_envs_per_env_runner = 1  # envs in each runner's vectorised env
        self.gym_env_vectorize_mode = "sync"  # gymnasium.vector mode for non-envpool envs
        self.num_cpus_per_env_runner = 1  # envpool num_threads per runner (ceil, >= 1)
        self.num_gpus_per_env_runner = 0  # actors act on the learner's device: others ValueError
        self.sample_timeout_s = 60.0  # a runner silent this long counts as failed
        self.max_requests_in_flight_per_env_runner = 1  # not supported yet: others ValueError
        self.compress_observations = False  # fragments stay arrays in memory: True is a ValueError
        # impala_jax's: the runners' policy inference. "auto": NumPy (host_actor.py) for a small
        # MLP policy acting on a CPU, else the jitted act; "jax" always jitted; "numpy" or error.
        self.inference_backend = "auto"
        self.rollout_fragment_length = 50  # T, steps per fragment; "auto": see get_rollout_...
        self.batch_mode = "truncate_episodes"  # the only mode: fragments cut across episodes
        self.explore = True  # True: sample actions; False: take the most likely action
        self.observation_filter = "NoFilter"  # the only filter supported so far
        # impala_jax's, on device only (envs written in JAX): act with params this many updates
        # old (0: the params being updated, exactly on-policy); None = 0 there, unset on host.
        self.policy_lag = None

        # .training()
        # The loss's coefficients (gamma, vf_loss_coeff, entropy_coeff, ...): core/loss_spec.py
        for coefficient in LOSS_COEFFICIENTS:
            setattr(self, coefficient.name, coefficient.default)
        self.vtrace = True  # False: no off-policy correction (core/losses.py); RLlib rejects it
        self.num_gpu_loader_threads = 8  # host threads stacking fragments and copying to devices
        self.num_multi_gpu_tower_stacks = 1  # device-resident prefetch slots for train batches
        self.minibatch_buffer_size = 1  # train batches kept for reuse when num_epochs > 1
        self.replay_proportion = 0.0  # mixin replay: p replayed fragments per new one; 0 = off
        self.replay_buffer_num_slots = 0  # replay capacity in fragments (T steps each)
        self.learner_queue_size = 3  # bound of the queue between batcher and learner
        self.learner_queue_timeout = 300  # seconds the learner waits for a batch before erroring
        self.timeout_s_sampler_manager = 0.0  # Ray actor manager only: others are a ValueError
        self.timeout_s_aggregator_manager = 0.0  # same
        self.broadcast_interval = 1  # learner updates between param publications to actors
        self.grad_clip = 40.0  # clip threshold; None = no clipping
        self.opt_type = "adam"  # "adam" or "rmsprop" (implemented here; RLlib ignores it)
        self.lr_schedule = None  # [[timestep, lr], ...]; overrides a float lr
        self.decay = 0.99  # RMSProp decay
        self.momentum = 0.0  # RMSProp momentum
        self.epsilon = 0.1  # RMSProp epsilon (Adam keeps optax's default)
        self.rmsprop_initial_scale = 1.0  # impala_jax's: RMSProp's mean square at step 0
        self.loss_reduction = "mean"  # impala_jax's: "mean" (RLlib's) or "sum" (the paper's)
        self.entropy_coeff_schedule = None  # [[timestep, value], ...]; overrides a float
        self._separate_vf_optimizer = False  # value params get their own optimizer with _lr_vf
        self._lr_vf = 0.0005  # the value optimizer's learning rate
        self.num_aggregation_workers = -1  # deprecated (as in RLlib): must stay -1
        self.max_requests_in_flight_per_aggregator_worker = -1  # deprecated: must stay -1
        self.lr = 0.0005  # float or [[timestep, lr], ...], linear in env steps sampled
        self.grad_clip_by = "global_norm"  # "value", "norm" (per tensor) or "global_norm"
        self.train_batch_size = 500  # env steps per update when train_batch_size_per_learner unset
        self._train_batch_size_per_learner = None  # env steps per learner device per update
        self.num_epochs = 1  # passes over each train batch
        self.minibatch_size = None  # env steps per SGD step; None = the whole batch
        self.shuffle_batch_per_epoch = False  # shuffle fragments between epochs
        self.learner_class = None  # runtime.learning.learner.Learner; others: ValueError

        # .learners()
        self.num_learners = 1  # learner devices (data parallel); 0 = 1 device, no collectives
        self.num_cpus_per_learner = "auto"  # CPUs a Tune trial asks for per learner (ray_tune)
        self.num_gpus_per_learner = 0  # 0: JAX's default backend; > 0 requires a GPU backend
        self.num_aggregator_actors_per_learner = 0  # host threads stacking batches; 0: loaders do
        self.max_requests_in_flight_per_aggregator_actor = 3  # stacked batches queued per one
        self.local_gpu_idx = 0  # learners are the first devices: others are a ValueError

        # .rl_module()
        self._model_config = merge_model_config({})  # RLlib: {}; here defaults merged in
        # None: impala_jax's networks; RLModuleSpec(factory=fn): fn builds them (module_spec.py)
        self._rl_module_spec = None

        # .evaluation()
        self.evaluation_interval = None  # evaluate every N train() calls; None or 0 = never
        self.evaluation_duration = 10  # episodes or timesteps per evaluation; "auto" if parallel
        self.evaluation_duration_unit = "episodes"  # "episodes" or "timesteps"
        self.evaluation_sample_timeout_s = 120.0  # evaluation that takes longer stops early
        self.evaluation_parallel_to_training = False  # needs evaluation_num_env_runners > 0
        self.evaluation_force_reset_envs_before_iteration = True  # evaluate from fresh episodes
        self.evaluation_config = None  # dict of field overrides for evaluation, e.g. explore
        self.evaluation_num_env_runners = 0  # eval runner threads; 0 = the main thread evaluates
        self.custom_evaluation_function = None  # fn(algorithm, eval_workers), RLlib's

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
        self.env_runner_health_probe_timeout_s = 30.0  # not supported yet: others ValueError
        self.env_runner_restore_timeout_s = 1800.0  # not supported yet: others ValueError

        # .multi_agent() (rllib/multi_agent.py): RLlib's values. One policy "default_policy"
        # that every agent maps to is the single-agent setup; anything else is multi-agent.
        self.policies = {"default_policy": None}  # ids, or {id: None | PolicySpec | 4-tuple}
        self.policy_mapping_fn = None  # fn(agent_id, episode, **kw) -> id; None: "default_policy"
        self.policies_to_train = None  # None: all; or the ids that update (the rest only act)
        self.count_steps_by = "env_steps"  # what train_batch_size counts: env or agent steps
        self.policy_map_capacity = 100  # RLlib's policy cache; every policy is held here: no effect
        self.policy_states_are_swappable = False  # RLlib's policy-cache hint: no effect here
        self.observation_fn = None  # RLlib's old-stack observation function: others ValueError

        # .checkpointing()
        self.export_native_model_files = False  # also write params as a flax msgpack file
        self.checkpoint_trainable_policies_only = False  # one policy: True is a ValueError

        # .debugging()
        self._env_runners_only = False  # sample and report, never learn
        self._skip_learners = False  # same, but batches still go through the batcher
        self.log_level = "WARN"  # level of the impala_jax logger
        self.log_sys_usage = True  # perf/cpu_util_percent, perf/ram_util_percent
        self.fake_sampler = False  # reuse the first train batch forever (learner benchmarking)
        self.seed = None  # root PRNG and env seed; None = drawn at build

        # .callbacks() (rllib/callbacks.py). RLlib: RLlibCallback; None here = no class.
        self.callbacks_class = None  # an RLlibCallback subclass, its import path, or a list
        # Per-event callables (RLlib's callbacks_on_*): a callable, an import path or a list;
        # those impala_jax does not call (callbacks.UNSUPPORTED_HOOKS) must stay None.
        for _hook in CALLBACK_KEYWORDS:
            setattr(self, _hook, None)

        # .resources() (RLlib's values)
        self.num_cpus_for_main_process = 1  # CPUs a Tune trial asks for its main process
        self.num_gpus = 1  # RLlib IMPALA's old-stack value; JAX picks the devices
        self.placement_strategy = "PACK"  # a trial is one bundle: others are a ValueError

        # .api_stack() and .framework(): RLlib's switches, fixed here (see docs/config.md).
        self.enable_rl_module_and_learner = True  # the new API stack is the only one here
        self.enable_env_runner_and_connector_v2 = True
        self.framework_str = "jax"  # keyword `framework`; RLlib: "torch". Always JAX here

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
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets the environment; ``env`` may be given positionally, as in RLlib."""
        return self._set(locals(), "environment")

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
        inference_backend=NotProvided,
        rollout_fragment_length=NotProvided,
        batch_mode=NotProvided,
        explore=NotProvided,
        observation_filter=NotProvided,
        policy_lag=NotProvided,
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets the actors: how many runner threads, envs each, and fragment length."""
        return self._set(locals(), "env_runners")

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
        rmsprop_initial_scale=NotProvided,
        vf_loss_coeff=NotProvided,
        loss_reduction=NotProvided,
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
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets the loss, optimizer, batch sizes and learner pipeline (and compat.DECLARED's)."""
        return self._set(locals(), "training")

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
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets the learner devices (data parallel over ``num_learners`` JAX devices)."""
        return self._set(locals(), "learners")

    def rl_module(
        self, *, model_config=NotProvided, rl_module_spec=NotProvided, **rllib_kwargs
    ) -> IMPALAConfig:
        """Sets the network; ``model_config`` is merged over `DEFAULT_MODEL_CONFIG`.

        ``rl_module_spec``: None (impala_jax's networks, chosen from ``model_config``) or
        ``impala_jax.RLModuleSpec(factory=fn)``, with ``fn(model_config, observation_space,
        action_space) -> impala_jax.core.networks.Networks`` or its import path ``"pkg.mod:fn"``.
        """
        return self._set(locals(), "rl_module")

    def multi_agent(
        self,
        *,
        policies=NotProvided,
        policy_map_capacity=NotProvided,
        policy_mapping_fn=NotProvided,
        policies_to_train=NotProvided,
        policy_states_are_swappable=NotProvided,
        observation_fn=NotProvided,
        count_steps_by=NotProvided,
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Several policies in one run (RLlib's ``multi_agent``, rllib/multi_agent.py):
        ``policies`` a set of ids or ``{id: None | PolicySpec | (cls, obs_space, act_space,
        config)}``, ``policy_mapping_fn(agent_id, episode, **kwargs) -> id`` called at each
        agent's first step of an episode, ``policies_to_train`` the ids that update."""
        if isinstance(policies, set | frozenset):
            # Sorted: a set's order changes with the process's string hashing, and a policy's
            # index is its place in the stack (and in every checkpoint).
            policies = sorted(policies, key=str)
        if isinstance(policies, list | tuple):
            policies = {pid: None for pid in policies}  # RLlib: {id: PolicySpec()}
        return self._set(locals(), "multi_agent")

    @property
    def is_multi_agent(self) -> bool:
        """RLlib's rule: more than one policy, or one whose id is not "default_policy"."""
        policies = self._raw("policies")
        return isinstance(policies, Mapping) and (
            len(policies) > 1 or "default_policy" not in policies
        )

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
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets when and how the policy is evaluated."""
        return self._set(locals(), "evaluation")

    def reporting(
        self,
        *,
        metrics_num_episodes_for_smoothing=NotProvided,
        min_time_s_per_iteration=NotProvided,
        min_train_timesteps_per_iteration=NotProvided,
        min_sample_timesteps_per_iteration=NotProvided,
        log_gradients=NotProvided,
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets what one ``train()`` call covers and how results are smoothed."""
        return self._set(locals(), "reporting")

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
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets what happens when an env or a runner thread fails."""
        return self._set(locals(), "fault_tolerance")

    def checkpointing(
        self,
        export_native_model_files=NotProvided,
        checkpoint_trainable_policies_only=NotProvided,
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets what a checkpoint holds; positional arguments are allowed, as in RLlib."""
        return self._set(locals(), "checkpointing")

    def debugging(
        self,
        *,
        _env_runners_only=NotProvided,
        _skip_learners=NotProvided,
        log_level=NotProvided,
        log_sys_usage=NotProvided,
        fake_sampler=NotProvided,
        seed=NotProvided,
        **rllib_kwargs,
    ) -> IMPALAConfig:
        """Sets the seed, the log level and debugging switches."""
        return self._set(locals(), "debugging")

    def callbacks(
        self,
        callbacks_class=NotProvided,
        *,
        on_algorithm_init=NotProvided,
        on_train_result=NotProvided,
        on_evaluate_start=NotProvided,
        on_evaluate_end=NotProvided,
        on_evaluate_offline_start=NotProvided,
        on_evaluate_offline_end=NotProvided,
        on_env_runners_recreated=NotProvided,
        on_offline_eval_runners_recreated=NotProvided,
        on_checkpoint_loaded=NotProvided,
        on_environment_created=NotProvided,
        on_episode_created=NotProvided,
        on_episode_start=NotProvided,
        on_episode_step=NotProvided,
        on_episode_end=NotProvided,
        on_sample_end=NotProvided,
    ) -> IMPALAConfig:
        """Sets RLlib-style callbacks; ``callbacks_class`` may be given positionally, as in RLlib.

        ``callbacks_class``: an ``RLlibCallback`` subclass (RLlib's or
        ``impala_jax.rllib.callbacks.RLlibCallback``), its import path, or a list of them;
        None = none.
        Each ``on_*``: a callable or a list of callables, called after the class's method.
        """
        return self._set(locals())

    def _set(self, arguments: dict[str, Any], builder: str | None = None) -> IMPALAConfig:
        """Copies every argument that was given onto the attribute of the same name.

        RLlib-only keywords (`**rllib_kwargs` of `builder`) go through `compat.route`:
        RLlib defaults set nothing, deprecated spellings set their new field, the rest raise.
        """
        extra = arguments.pop("rllib_kwargs", {})
        given = {k: v for k, v in arguments.items() if k != "self" and v is not NotProvided}
        if extra:
            own = [k for k in arguments if k != "self"]
            for name, value in route(builder, extra, own).items():
                given.setdefault(name, value)
        self._raise_if_frozen(", ".join(given) or "nothing")
        for name, value in given.items():
            if name in SETTER_CHECKS:
                SETTER_CHECKS[name](value)
        for name, value in given.items():
            setattr(self, _ATTRIBUTE.get(name, name), value)
        return self

    def _raise_if_frozen(self, what: str) -> None:
        if self.__dict__.get("_is_frozen", False):
            raise AttributeError(
                f"Cannot set {what}: this IMPALAConfig is frozen (build() and freeze() freeze "
                f"it). Make an editable copy with config.copy(copy_frozen=False)."
            )

    def __setattr__(self, name: str, value: Any) -> None:
        self._raise_if_frozen(name)
        if (
            not name.startswith("_")
            and name not in _FIELD_TO_BUILDER
            and name not in ("algo_class", *_ATTRIBUTE.values())
        ):
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
        self._model_config = merge_model_config(value)

    @property
    def rl_module_spec(self) -> Any:
        """None, or the user's `RLModuleSpec` naming the network factory (a dict becomes one)."""
        return self._rl_module_spec

    @rl_module_spec.setter
    def rl_module_spec(self, value: Any) -> None:
        self._rl_module_spec = as_rl_module_spec(value)

    def _resolved(self, *names: str) -> None:
        for name in names:
            if find_search_space(self._raw(name)):
                raise ValueError(
                    f"{name}={self._raw(name)!r} is a Ray Tune search space that no trial has "
                    f"resolved yet; derived sizes need a concrete value."
                )

    def _raw(self, name: str) -> Any:
        if name == "train_batch_size_per_learner":
            return self._train_batch_size_per_learner
        return getattr(self, _ATTRIBUTE.get(name, name))

    @property
    def total_train_batch_size(self) -> int:
        """Env steps per update over all learners: per-learner batch * learner devices
        (num_learners; 0: one, or one of each process over several)."""
        self._resolved("train_batch_size", "train_batch_size_per_learner", "num_learners")
        # Imported here: it imports JAX.
        from impala_jax.runtime.learning.parallel import learner_device_count

        return self.train_batch_size_per_learner * learner_device_count(self.num_learners)

    @property
    def effective_train_batch_size_per_learner(self) -> int:
        """Env steps each learner device trains on per update: `train_batch_size_per_learner`
        rounded up to whole fragments of T (RLlib packs whole fragments the same way)."""
        self._resolved("train_batch_size", "train_batch_size_per_learner", "num_learners")
        from impala_jax.rllib.specs import batch_layout  # here: specs imports the core (JAX)

        layout = batch_layout(self)
        return layout.columns * layout.fragment_length

    @property
    def effective_total_train_batch_size(self) -> int:
        """New env steps per update over all learner devices (replayed ones not counted)."""
        from impala_jax.rllib.specs import batch_layout  # here: specs imports the core (JAX)

        return self.effective_train_batch_size_per_learner * batch_layout(self).num_devices

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
            return _plain(value) if is_schedule(value) else value
        if is_schedule(value):
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
        return "impala_jax.runtime.learning.learner.Learner"

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        """What the networks are built from: the factory of ``rl_module_spec`` (impala_jax's
        own, `DEFAULT_FACTORY`, when none is set), the model config and the spaces."""
        given = self.rl_module_spec
        factory = given.factory if isinstance(given, RLModuleSpec) else None
        return RLModuleSpec(
            model_config=_copy.deepcopy(self.model_config),
            factory=DEFAULT_FACTORY if factory is None else factory,
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
        """Validates, freezes a copy and returns ``IMPALA(frozen_copy)`` (``MultiAgentIMPALA``
        for a multi-agent config, rllib/multi_agent.py)."""
        try:
            self._check_buildable()
        except ValueError as err:
            start_together(self, err)  # over several processes: raised on every one of them
        self._log_effective_batch()
        frozen = self.copy(copy_frozen=True)
        algo_class = self.algo_class
        if algo_class is None and self.is_multi_agent:  # rllib/multi_agent.py
            from impala_jax.rllib.multi_agent import MultiAgentIMPALA as algo_class
        elif algo_class is None:
            from impala_jax.rllib.algorithm import IMPALA as algo_class
        return algo_class(frozen)

    def _check_buildable(self) -> None:
        unresolved = [n for n in _FIELD_TO_BUILDER if find_search_space(self._raw(n))]
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

    def _log_effective_batch(self) -> None:
        """Says once, at INFO, when the batch size was rounded up to whole fragments."""
        requested = self.train_batch_size_per_learner
        effective = self.effective_train_batch_size_per_learner
        if requested != effective:
            raw = self._train_batch_size_per_learner
            name = "train_batch_size" if raw is None else "train_batch_size_per_learner"
            T = self.get_rollout_fragment_length()
            _LOG.info(
                "%s=%d is rounded up to whole fragments: %d env steps per learner (%d x "
                "rollout_fragment_length=%d), %d per update; results report it as "
                "learners/default_policy/effective_train_batch_size_per_learner.",
                *(name, requested, effective, effective // T, T),
                self.effective_total_train_batch_size,
            )

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
        validate_config(self, _FIELD_TO_BUILDER)


# Builder of every field: its signature or compat.DECLARED (training before learners: learner_class)
_BUILDERS = (
    "api_stack",
    "framework",
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
    "callbacks",
    "resources",
    "multi_agent",
)
_FIELD_TO_BUILDER: dict[str, str] = {}
for _builder in _BUILDERS:
    _params = list(inspect.signature(getattr(IMPALAConfig, _builder)).parameters.values())[1:]
    _names = [p.name for p in _params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for _name in [*_names, *DECLARED.get(_builder, ())]:
        _FIELD_TO_BUILDER.setdefault(_name, _builder)
