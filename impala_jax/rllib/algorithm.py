"""IMPALA: builds the parts from a frozen config and runs iterations; orchestration only.

Elsewhere: the iteration loop and training_step (training_loop), the engine that samples and
updates (runtime/engine: host runners or on device), the policy and its actor (runtime/acting),
evaluation, the update (runtime/learner, core/), the warnings (diagnostics), the result dict
(results), checkpoints (checkpointable), inference (module), processes (distributed).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import signal
import threading
import warnings
import weakref

import jax
import numpy as np

from impala_jax.core.types import Trajectory
from impala_jax.rllib import diagnostics, specs
from impala_jax.rllib.callbacks import Callbacks
from impala_jax.rllib.checkpointable import Checkpointable
from impala_jax.rllib.checks import start_together
from impala_jax.rllib.metrics_logger import MetricsLogger
from impala_jax.rllib.module import DEFAULT_MODULE_ID, Actions, Module
from impala_jax.rllib.training_loop import TrainingLoop
from impala_jax.runtime.acting.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from impala_jax.runtime.acting.evaluation import Evaluator
from impala_jax.runtime.acting.host_actor import hold_one_blas_thread, release_blas_threads
from impala_jax.runtime.acting.host_engine import AgreedHostEngine, HostEngine
from impala_jax.runtime.acting.policy import make_policy
from impala_jax.runtime.acting.user_code import UserCodeError
from impala_jax.runtime.engine import Engine
from impala_jax.runtime.envs.env_registry import is_jax_env, make_jax_env
from impala_jax.runtime.envs.vec_env import ActionAdapter, make_vec_env
from impala_jax.runtime.learning import parallel, program_cache
from impala_jax.runtime.learning.learner import Learner, run_keys
from impala_jax.runtime.metrics import deep_merge
from impala_jax.runtime.ondevice.device_engine import DeviceEngine
from impala_jax.runtime.process import collectives, roles
from impala_jax.runtime.process.jax_setup import use_compile_cache

# Algorithms not stopped by their users: stopped at interpreter exit, before daemon runner
# threads are killed inside envpool's C++ (which aborts the process).
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_live_algorithms() -> None:
    for algo in list(_LIVE):
        algo.stop()


class IMPALA(TrainingLoop, Checkpointable):
    """The algorithm. ``IMPALAConfig().environment("CartPole-v1").build()`` returns one.

    Its ``training_step`` and iteration loop are ``TrainingLoop``'s (rllib/training_loop.py);
    ``engine`` is what samples and updates: runner threads or lockstep on the host, or one
    program on device for an env written in JAX (runtime/engine.py)."""

    def __init__(self, config):
        if not getattr(config, "_is_frozen", False):
            config = config.copy()
            try:
                config.validate()
            except ValueError as err:
                start_together(config, err)
            config.freeze()
        self.config = config
        self._stopped = False
        use_compile_cache()
        # What stop() touches exists from the start: a failed __init__ is still stoppable.
        self.learner = None
        self.engine: Engine | None = None
        # RLlib's EnvRunnerGroup: the host engine's runners (None on device: no runners).
        self.env_runner_group: EnvRunnerGroup | None = None
        self._evaluator: Evaluator | None = None
        self._holds_blas = False  # host_actor.hold_one_blas_thread, released by stop()
        # RLlib's algo.callbacks (the callbacks_class instances) and algo.metrics, the logger of
        # the algorithm-level hooks (its values: top-level keys of the next result).
        self._callbacks = Callbacks.from_spec(specs.callbacks_spec(config))
        self.callbacks = self._callbacks.objects
        self.metrics = MetricsLogger()
        _LIVE.add(self)
        level = config.log_level.upper()
        logging.getLogger("impala_jax").setLevel("WARNING" if level == "WARN" else level)
        # An env written in JAX trains on device: sampling is part of the update's program.
        self._on_device = is_jax_env(config.env, config.env_config)
        seed = config.seed if config.seed is not None else 0
        learner_key, actor_key = run_keys(seed)
        self._seed = seed

        # Over several processes (impala_jax.runtime.process.distributed): each samples its own
        # envs, counts are agreed before every update (AgreedHostEngine) and process 0 writes and
        # evaluates.
        self._processes = jax.process_count()
        self._primary = jax.process_index() == 0
        self._T = config.get_rollout_fragment_length()
        # The learner key stays shared; the envs' seeds and the actions' key are the process's.
        seed, actor_key = roles.process_seed_and_key(seed, actor_key)
        error = None
        try:  # what can fail on one process alone, before the first collective
            devices, local = parallel.learner_devices(config.num_learners)
            self._build_policy(seed, local[0])  # the probe env: one this host cannot make
        except Exception as err:
            error = err
        start_together(config, error)
        columns = self._build_learner(devices, len(local), learner_key)
        self._build_engine(seed, local[0], columns, actor_key)
        self._init_loop(self.engine, self.learner)
        self._checks = diagnostics.TrainingChecks()  # the learner warnings, once per build
        self._dead_policy = diagnostics.DeadPolicyCheck()  # reported once per build
        self.engine.start()
        try:
            self._callbacks.call("on_algorithm_init", algorithm=self, metrics_logger=self.metrics)
        except BaseException:
            self.stop()
            raise

    def _build_policy(self, seed: int, actor_device) -> None:
        """The spaces (from a probe env unless the config sets them), the networks from the
        config's network factory, and the actor that runs them (runtime/acting)."""
        config = self.config
        probe = make_vec_env(
            config.env, 1, seed, config.env_config, "sync", num_workers=config.num_env_runners
        )
        obs_space = config.observation_space or probe.observation_space
        act_space = config.action_space or probe.action_space
        probe.close()
        self.observation_space, self.action_space = obs_space, act_space
        policy = make_policy(specs.policy_spec(config), obs_space, act_space, actor_device)
        self.policy = policy
        self.networks, self.distribution = policy.networks, policy.distribution
        self.recurrent = policy.recurrent
        self._act, self._act_greedy = policy.act, policy.act_greedy
        if policy.host_actor:
            hold_one_blas_thread()
            self._holds_blas = True
        self._adapter = ActionAdapter(
            act_space, config.normalize_actions, config.clip_actions, str(config.env)
        )

    def _build_learner(self, devices: list, num_local: int, learner_key) -> int:
        """The Learner, its step compiling from here on; returns this process's batch columns."""
        config, policy = self.config, self.policy
        self.opt_spec = specs.optimizer_spec(config)
        loss_spec = specs.loss_spec(config)
        self.step_spec = specs.step_spec(config, len(devices))
        columns = self.step_spec.columns * num_local

        def example_batch(params) -> Trajectory:  # from the params' shapes (Learner)
            self.action_dtype = policy.action_dtype(params)
            return policy.example_batch(self._T, columns, self.action_dtype)

        # The learner step compiles in a thread of its own from the start of the Learner's
        # construction, beside the initial state's and the policy's compilation and the envs'
        # creation below, not after them.
        warm_up = not (config._env_runners_only or config._skip_learners or self._on_device)
        # The learner's traced programs kept on disk where it can (program_cache); never for
        # a custom network factory, whose code the cache's key does not cover.
        spaces = (self.observation_space, self.action_space)
        describe = program_cache.model_description
        program_key = None if policy.custom else describe(config.model_config, *spaces)
        self.learner = Learner(
            self.networks,
            self.distribution,
            self.opt_spec,
            loss_spec,
            self.step_spec,
            devices,
            learner_key,
            program_key=program_key,
            example=example_batch if warm_up else None,
        )
        if not warm_up:
            self.action_dtype = policy.action_dtype(self.learner.state.params)
        return columns

    def _build_engine(self, seed: int, actor_device, columns: int, actor_key) -> None:
        """The engine that samples and updates, the evaluator and what compute_actions acts
        with."""
        config = self.config
        if self._on_device:
            env = make_jax_env(config.env, config.env_config)
            spec = specs.device_spec(config)
            # The run's seed on every process: each makes its part of the one run's envs.
            engine = DeviceEngine(spec, env, self.policy, self.learner, actor_device, [self._seed])
        else:
            self.env_runner_group = EnvRunnerGroup(
                specs.runner_spec(config),
                specs.loader_spec(config),
                specs.fault_tolerance_spec(config),
                self._act,
                self._act_greedy,
                self.learner.state.params,
                actor_device=actor_device,
                observation_space=self.observation_space,
                seed=seed,
                batch_columns=columns,
                action_space=self.action_space,
            )
            spec = specs.host_engine_spec(config, self.step_spec, self.learner.num_devices)
            host_engine = AgreedHostEngine if self._processes > 1 else HostEngine
            engine = host_engine(spec, self.env_runner_group, self.learner)
        self.engine = engine
        self.param_store = engine.param_store
        self._evaluator = Evaluator(
            specs.evaluation_spec(config), self._act, self._act_greedy, engine.param_store, seed
        )
        self._actions = Actions(self.policy, engine.param_store, self._adapter, actor_key)

    def train(self) -> dict:
        """One iteration (RLlib's min_time_s / min_*_timesteps_per_iteration semantics), with
        an evaluation every ``evaluation_interval`` iterations."""
        if self._stopped:
            raise RuntimeError("this IMPALA was stopped; build a new one from its config.")
        interval = self.config.evaluation_interval
        try:
            if interval and (self._iteration + 1) % interval == 0:
                result = self._evaluated_iteration()
            else:
                (result,) = self._iterate()
            # RLlib calls it after the result is compiled: what it logs lands in the next one.
            self._callbacks.call(
                "on_train_result", algorithm=self, metrics_logger=self.metrics, result=result
            )
        except (EnvRunnerFailure, UserCodeError):
            self.stop()  # threads end; checkpoints already written stay as they are
            raise
        return result

    def _evaluated_iteration(self) -> dict:
        """One training iteration with its evaluation, in parallel when so configured. Over
        several processes process 0 evaluates (the params are the same everywhere) and the
        others receive its evaluation."""
        if not self._primary:
            (result,) = self._iterate()
        elif self.config.evaluation_parallel_to_training:
            # RLlib's _run_one_training_iteration_and_evaluation_in_parallel: the training step
            # runs in a thread while this one evaluates the params the iteration started with.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="training") as pool:
                future = pool.submit(self._iterate)
                evaluation = self.evaluate(parallel_train_future=future)
                (result,) = future.result()
            result["evaluation"] = evaluation
        else:
            (result,) = self._iterate()
            result["evaluation"] = self.evaluate()
        if self._processes > 1:
            result["evaluation"] = collectives.broadcast_json(
                result.get("evaluation"),
                "process 0's evaluation",
                extra_s=self.config.evaluation_sample_timeout_s or 0,
            )
        return result

    def _check_learner(self, learners: list[dict]) -> None:
        """A non-finite loss stops the run; the learner warnings (diagnostics.py)."""
        (learner,) = learners
        message = diagnostics.non_finite_message(learner)
        if message:
            self.stop()
            raise FloatingPointError(message)
        config, updates, size = self.config, self._num_updates, self._num_parameters
        early = self._early_learners[0]
        for message in self._checks.warnings(learner, config, updates, size, early):
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _finish_result(self, result: dict, learner: dict) -> dict:
        """The dead-policy report, and what the algorithm's hooks logged (diagnostics.py)."""
        returned = result["env_runners"].get("episode_return_mean")
        message = self._dead_policy.message(learner, returned, self.config)
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return deep_merge(result, self.metrics.reduce())

    def evaluate(self, parallel_train_future=None) -> dict:
        """``evaluation_duration`` episodes (or timesteps) with the current params, or
        ``custom_evaluation_function(self, eval_workers)``; see evaluation.py.

        Runs in its own thread on its own envs (at most ``evaluation_sample_timeout_s``), with
        ``evaluation_config`` applied; it acts greedily unless that config sets
        ``explore=True``. ``parallel_train_future`` (RLlib's argument): the training step
        running meanwhile, which ``evaluation_duration="auto"`` evaluates as long as.
        """
        done = parallel_train_future.done if parallel_train_future is not None else None
        self._callbacks.call("on_evaluate_start", algorithm=self, metrics_logger=self.metrics)
        results = self._evaluator.evaluate(self, training_done=done)
        self._callbacks.call(
            "on_evaluate_end",
            algorithm=self,
            metrics_logger=self.metrics,
            evaluation_metrics=results,
        )
        return results

    def compute_actions(self, observations, *, explore: bool | None = None) -> np.ndarray:
        """Env actions for a batch of observations with the newest params; ``explore=None``
        follows the config's ``explore`` (True: sampled actions), as RLlib's does."""
        return self._actions.compute_actions(observations, explore=self._explore(explore))

    def compute_single_action(
        self,
        observation=None,
        state=None,
        *,
        prev_action=None,
        prev_reward=None,
        explore: bool | None = None,
    ):
        """One env's action; ``explore=None`` follows the config's ``explore`` (True: a sampled
        action, False: the most likely one), as RLlib's does. A recurrent policy (use_lstm)
        returns ``(action, state_out, extra)`` as RLlib's does: pass ``state``
        (``get_initial_state()`` at an episode's start, then each call's ``state_out``) and the
        previous action and reward (None: 0, as at an episode's start);
        ``extra["action_dist_inputs"]`` holds the distribution's inputs."""
        if observation is None:
            raise ValueError("compute_single_action needs an observation.")
        return self._actions.compute_single_action(
            observation, state, prev_action, prev_reward, self._explore(explore)
        )

    def _explore(self, explore: bool | None) -> bool:
        return bool(self.config.explore if explore is None else explore)

    def get_initial_state(self):
        """A recurrent policy's state for one env at an episode's start (RLlib's
        ``get_initial_state``); ``{}`` for a feedforward policy."""
        return self._actions.initial_state()

    @property
    def iteration(self) -> int:
        """``train()`` calls so far, restored ones included (RLlib's ``Algorithm.iteration``)."""
        return self._iteration

    def get_config(self):
        """The frozen config this algorithm was built from."""
        return self.config

    def get_module(self, module_id: str = DEFAULT_MODULE_ID) -> Module | None:
        """The policy for inference (RLlib's ``forward_inference`` / ``forward_exploration``);
        None for an unknown module id, as in RLlib."""
        if module_id != DEFAULT_MODULE_ID:
            return None
        return self._actions.module()

    def get_weights(self, policies: list[str] | None = None) -> dict:
        """``{"default_policy": params}``, the learner's params as host numpy arrays."""
        unknown = set(policies or ()) - {DEFAULT_MODULE_ID}
        if unknown:
            raise KeyError(
                f"get_weights: no module {sorted(unknown)}; the one module is "
                f"{DEFAULT_MODULE_ID!r}."
            )
        return {DEFAULT_MODULE_ID: jax.device_get(self.learner.state.params)}

    def set_weights(self, weights: dict) -> None:
        """Sets the learner's params from ``{"default_policy": params}`` (as ``get_weights``
        returns) and publishes them to the runners; the optimizer state is kept."""
        if DEFAULT_MODULE_ID not in weights:
            raise KeyError(
                f"set_weights: expected a dict with key {DEFAULT_MODULE_ID!r} "
                f"(as get_weights() returns), got keys {sorted(weights)}."
            )
        self.learner.set_params(weights[DEFAULT_MODULE_ID])
        self.engine.publish()

    def stop(self) -> None:
        """Ends every thread and closes every env; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.engine is not None:
            self.engine.stop()
        if self.learner is not None:
            self.learner.wait_for_warm_up()
        if self._evaluator is not None:
            self._evaluator.close()
        if self._holds_blas:
            self._holds_blas = False
            release_blas_threads()

    def __del__(self):
        # The garbage collector runs a finalizer wherever it happens to run, so a signal
        # handler can fire inside it (Ray's SIGTERM handler raises SystemExit in a trial's
        # process as it ends): passed on to the main thread, never printed as an error here.
        try:
            self.stop()
        except Exception:
            pass
        except (SystemExit, KeyboardInterrupt) as interrupt:
            pass_on_interrupt(interrupt)


def pass_on_interrupt(interrupt: BaseException) -> None:
    """Sends the signal whose handler raised ``interrupt`` inside a finalizer, where nothing can
    propagate, once more a moment later: its handler then runs in the main thread, outside."""
    signum = signal.SIGINT if isinstance(interrupt, KeyboardInterrupt) else signal.SIGTERM
    if callable(signal.getsignal(signum)):
        resend = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        resend.daemon = True
        resend.start()
