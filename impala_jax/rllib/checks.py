"""Validation of a whole `IMPALAConfig`: `validate()`'s checks, and the first collective of a build.

`IMPALAConfig.validate()` is the entry point: it calls `validate_config`, which collects every
problem and raises one ValueError naming each field, its value and the fix. The checks RLlib
makes as soon as a builder is called are in ``setter_checks.py``. The config is passed in: this
module never imports ``config.py``. What each rule is, and where it is stricter than RLlib, is
listed in ``docs/config.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from impala_jax.core.loss_spec import COEFFICIENTS as LOSS_COEFFICIENTS
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG
from impala_jax.core.optim_rules import GRAD_CLIP_BY, OPT_TYPES, SCHEDULE_FORM, schedule_problem
from impala_jax.rllib.callbacks import CALLBACK_KEYWORDS, UNSUPPORTED_HOOKS
from impala_jax.rllib.compat_tables import NOT_HERE
from impala_jax.rllib.device_checks import check_device_fields
from impala_jax.rllib.model_config_checks import model_config_problems
from impala_jax.rllib.module_spec import rl_module_spec_problem
from impala_jax.rllib.multi_agent_checks import check_multi_agent_fields
from impala_jax.rllib.setter_checks import FRAMEWORKS, callbacks_class_problem
from impala_jax.rllib.values import find_search_space, is_int, is_real, is_schedule

LOSS_REDUCTIONS = ("mean", "sum")
LOG_LEVELS = ("DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL")

_UNSET = object()  # Validator.fail(): no value given, report the field's own


def start_together(config: Any, error: BaseException | None) -> None:
    """Raises ``error``; over several processes, the first collective: one process's error
    (or configs that differ) raises on every one, so that none waits for a peer that quit."""
    # Imported here: they import JAX.
    from impala_jax.runtime.learning import parallel
    from impala_jax.runtime.process import agreement, checkpoint

    if parallel.joined_processes() > 1:
        agreement.check_same_config(checkpoint.jsonable(config.to_dict()), error)
    if error is not None:
        raise error


def validate_config(config: Any, field_to_builder: Mapping[str, str]) -> None:
    """Raises one ValueError listing every invalid field of `config`, its value and the fix
    (with the builder that sets it, from `field_to_builder`)."""
    _Validator(config, field_to_builder).run()


class _Validator:
    """Collects every problem of one config; a field already found bad is not checked again."""

    def __init__(self, config: Any, field_to_builder: Mapping[str, str]):
        self.c = config
        self.field_to_builder = field_to_builder
        self.errors: list[str] = []
        self.bad: set[str] = set()

    def value(self, name: str) -> Any:
        return self.c._raw(name)

    def ok(self, *names: str) -> bool:
        """True when every field is concrete (not a search space) and not already bad."""
        return not any(n in self.bad or find_search_space(self.value(n)) for n in names)

    def fail(self, name: str, message: str, value: Any = _UNSET) -> None:
        value = self.value(name) if value is _UNSET else value
        field = name.split("[")[0]
        how = f".{self.field_to_builder[field]}({field}=...)"
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
            lambda v: (none_ok and v is None) or (is_int(v) and v >= low),
            f"an int >= {low}" + (" or None" if none_ok else ""),
        )

    def real(self, name: str, low: float, *, open_low: bool = False, none_ok: bool = False) -> None:
        self.check(
            name,
            lambda v: (
                (none_ok and v is None) or (is_real(v) and (v > low if open_low else v >= low))
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
        self._rl_module_spec()
        self._evaluation()
        self._callbacks()
        self._rest()
        self._not_here()
        check_device_fields(self)
        check_multi_agent_fields(self)
        if self.errors:
            raise ValueError("Invalid IMPALAConfig:\n  " + "\n  ".join(self.errors))

    def _environment(self) -> None:
        c = self
        c.check(
            "env",
            lambda v: v is None or isinstance(v, str) or callable(v) or _is_gymnax_instance(v),
            "an env id such as 'CartPole-v1', an import path 'pkg.mod:Env', an env class, a "
            "creator function or an instance of a gymnax Environment",
        )
        c.check("env_config", lambda v: isinstance(v, Mapping), "a dict")
        for name in ("observation_space", "action_space"):
            c.check(
                name, lambda v: v is None or hasattr(v, "contains"), "None or a gymnasium space"
            )
        c.check("render_env", lambda v: v is False, "False (impala_jax does not render envs)")
        c.check(
            "clip_rewards",
            lambda v: v is None or isinstance(v, bool) or (is_real(v) and v > 0),
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
            "inference_backend",
            lambda v: v in ("auto", "jax", "numpy"),
            "'auto', 'jax' or 'numpy'",
        )
        c.check(
            "rollout_fragment_length",
            lambda v: v == "auto" or (is_int(v) and v > 0),
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
        c.check(
            "vtrace",
            lambda v: isinstance(v, bool),
            "True (V-trace) or False (no off-policy correction: every importance weight "
            "taken as 1, the IMPALA paper's baseline)",
        )
        for k in LOSS_COEFFICIENTS:  # as declared; a schedule one is checked by _schedule below
            if not k.schedule:
                c.check(k.name, lambda v, k=k: is_real(v) and k.contains(v), f"a number {k.rule}")
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
        c.check("decay", lambda v: is_real(v) and 0 <= v < 1, "a number in [0, 1)")
        c.real("momentum", 0)
        c.real("epsilon", 0, open_low=True)
        c.real("rmsprop_initial_scale", 0)
        c.choice("loss_reduction", LOSS_REDUCTIONS)
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
            if is_schedule(value):
                problem = schedule_problem(value)
                if problem:
                    c.fail(name, f"invalid schedule: {problem}; expected {SCHEDULE_FORM}")
                elif schedule is not None:
                    c.fail(
                        name,
                        f"{name} is a schedule and {schedule_name} is also set; give the "
                        f"schedule once",
                    )
            else:
                c.check(
                    name,
                    lambda v: is_real(v) and (v > 0 if open_low else v >= 0),
                    f"a float {float_rule} or a schedule [[0, v0], [t1, v1], ...]",
                )
        if c.ok(schedule_name) and schedule is not None:
            problem = schedule_problem(schedule)
            if problem:
                c.fail(schedule_name, f"invalid schedule: {problem}; expected {SCHEDULE_FORM}")

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
        replay = ("replay_proportion", "replay_buffer_num_slots")
        if not c.ok(*sizes, *replay) or not is_int(cfg.num_learners):
            return
        if cfg.num_learners < 0 or not is_int(cfg.train_batch_size_per_learner):
            return
        if not c.ok("minibatch_size") or cfg.minibatch_size is None:
            return
        from impala_jax.rllib.specs import batch_layout  # here: specs imports the core (JAX)

        layout = batch_layout(cfg)
        T, devices = layout.fragment_length, layout.num_devices
        total = layout.columns * devices * T
        if cfg.minibatch_size % T:
            c.fail("minibatch_size", f"must be a multiple of rollout_fragment_length={T}")
        elif cfg.minibatch_size > total:
            c.fail(
                "minibatch_size",
                f"must be <= the effective total train batch ({total} = {layout.columns} "
                f"fragments of {T} steps per learner * {devices} learner device(s))",
            )
        else:
            # One compiled step splits each device's batch (new + replayed fragments) into
            # equal minibatches: RLlib cycles through a remainder, impala_jax cannot.
            per_device = layout.columns + layout.replay_columns
            fragments = cfg.minibatch_size // T
            good = [m * T * devices for m in range(1, per_device + 1) if per_device % m == 0]
            if fragments % devices or per_device % (fragments // devices):
                c.fail(
                    "minibatch_size",
                    f"each of the {devices} learner device(s) trains on {per_device} fragments "
                    f"of {T} steps per update ({layout.columns} new + {layout.replay_columns} "
                    f"replayed), which must split into equal minibatches; use one of {good}",
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
            lambda v: v == "auto" or (is_real(v) and v >= 0),
            "'auto' or a number >= 0",
        )
        c.real("num_gpus_per_learner", 0)
        c.integer("num_aggregator_actors_per_learner", 0)
        c.integer("max_requests_in_flight_per_aggregator_actor", 1)
        if (
            c.ok("num_aggregator_actors_per_learner", "num_env_runners")
            and self.c.num_aggregator_actors_per_learner
            and self.c.num_env_runners == 0
        ):
            c.fail(
                "num_aggregator_actors_per_learner",
                "needs runner threads: with num_env_runners=0 the main thread samples and "
                "batches in lockstep; set num_env_runners >= 1 or leave it at 0",
            )
        c.integer("local_gpu_idx", 0)

    def _not_here(self) -> None:
        """Fields RLlib has that mean nothing in one process yet: a non-default value is an
        error, never silently accepted (see NOT_HERE)."""
        for name, (default, why) in NOT_HERE.items():
            if self.ok(name) and self.value(name) != default:
                self.fail(name, f"{why}; leave it at {default!r}")
        if self.ok("num_gpus_per_learner") and is_real(self.c.num_gpus_per_learner):
            if self.c.num_gpus_per_learner > 0:
                import jax  # here, not at import: importing the config must not start JAX

                if jax.default_backend() != "gpu":
                    self.fail(
                        "num_gpus_per_learner",
                        f"asks for GPU learners, but JAX's backend is {jax.default_backend()!r} "
                        "(no GPU visible to JAX); install the CUDA build of JAX, or set "
                        "num_gpus_per_learner=0 to learn on the default device",
                    )

    def _model_config(self) -> None:
        if not self.ok("model_config"):
            return
        mc = self.c.model_config
        unknown = [k for k in mc if k not in DEFAULT_MODEL_CONFIG]
        if unknown:
            self.fail(
                "model_config", f"unknown key(s) {unknown}; valid: {sorted(DEFAULT_MODEL_CONFIG)}"
            )
            return
        problems = model_config_problems(mc)
        for field, expected, value in problems:
            self.fail(field, expected, value)
        if mc.get("use_lstm") is True and not problems and self.ok("rollout_fragment_length"):
            try:
                T = self.c.get_rollout_fragment_length()
            except Exception:  # a bad fragment length is reported by its own check
                return
            if mc["max_seq_len"] > T + 1:
                self.fail(
                    "model_config['max_seq_len']",
                    f"longer than a fragment's {T + 1} rows (rollout_fragment_length={T}, "
                    f"plus the bootstrap row): a chunk cannot outgrow the fragment, so values "
                    f"above {T + 1} would all mean the same; set max_seq_len <= {T + 1} "
                    f"({T + 1}: backprop through each whole fragment)",
                    mc["max_seq_len"],
                )

    def _rl_module_spec(self) -> None:
        if self.ok("rl_module_spec", "model_config"):
            problem = rl_module_spec_problem(self.value("rl_module_spec"), self.c.model_config)
            if problem:
                self.fail("rl_module_spec", problem)

    def _evaluation(self) -> None:
        c, cfg = self, self.c
        c.integer("evaluation_interval", 0, none_ok=True)
        c.check(
            "evaluation_duration",
            lambda v: v == "auto" or (is_int(v) and v >= 1),
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

    def _callbacks(self) -> None:
        c = self
        if c.ok("callbacks_class"):
            problem = callbacks_class_problem(c.value("callbacks_class"))
            if problem:
                c.fail("callbacks_class", problem)
        for hook in CALLBACK_KEYWORDS:
            if hook in UNSUPPORTED_HOOKS:
                c.check(hook, lambda v: v is None, f"None: {UNSUPPORTED_HOOKS[hook]}")
            else:
                c.check(
                    hook,
                    lambda v: all(
                        callable(f) or (isinstance(f, str) and f)
                        for f in (v if isinstance(v, list | tuple) else [v] if v else [])
                    ),
                    "None, a callable, its import path 'pkg.mod:fn', or a list of them",
                )

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
        c.real("num_gpus", 0)
        c.choice("framework", FRAMEWORKS)
        for name in ("enable_rl_module_and_learner", "enable_env_runner_and_connector_v2"):
            c.check(name, lambda v: v is True, "True: the old API stack is not offered")


def _is_gymnax_instance(env: Any) -> bool:
    # Imported here, as in device_checks: importing the config stays free of gymnasium.
    from impala_jax.runtime.envs.jax_envs import is_gymnax_env

    return not isinstance(env, type) and is_gymnax_env(env)
