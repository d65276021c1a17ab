"""IMPALA: builds the parts from a frozen config and runs iterations; orchestration only.

Elsewhere: the policy and its actor (runtime/acting), the runners (runtime/env_runner_group),
evaluation, the update (runtime/learner, core/), the warnings (diagnostics), the result dict
(runtime/metrics), checkpoints (checkpointable), inference (module), processes (distributed).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import signal
import threading
import time
import warnings
import weakref

import jax
import numpy as np

from impala_jax.core.types import Trajectory
from impala_jax.rllib import diagnostics, specs
from impala_jax.rllib.checkpointable import Checkpointable
from impala_jax.rllib.checks import start_together
from impala_jax.rllib.module import DEFAULT_MODULE_ID, Actions, Module
from impala_jax.runtime import acting, checkpoint, distributed, parallel, program_cache
from impala_jax.runtime.buffers import MinibatchBuffer
from impala_jax.runtime.callbacks import Callbacks, UserCodeError
from impala_jax.runtime.device_runner import DeviceRunnerGroup
from impala_jax.runtime.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from impala_jax.runtime.evaluation import Evaluator
from impala_jax.runtime.host_actor import hold_one_blas_thread, release_blas_threads
from impala_jax.runtime.jax_envs import is_jax_env, make_jax_env
from impala_jax.runtime.jax_setup import use_compile_cache
from impala_jax.runtime.learner import Learner
from impala_jax.runtime.metrics import (
    EpisodeStats,
    SysUsage,
    Timers,
    merge_timers,
    train_result,
    trainable_info,
)
from impala_jax.runtime.metrics_logger import MetricsLogger, deep_merge
from impala_jax.runtime.vec_env import ActionAdapter, make_vec_env

# Algorithms not stopped by their users: stopped at interpreter exit, before daemon runner
# threads are killed inside envpool's C++ (which aborts the process).
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_live_algorithms() -> None:
    for algo in list(_LIVE):
        algo.stop()


class IMPALA(Checkpointable):
    """The algorithm. ``IMPALAConfig().environment("CartPole-v1").build()`` returns one."""

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
        self.env_runner_group: EnvRunnerGroup | None = None
        self._evaluator: Evaluator | None = None
        self._holds_blas = False  # host_actor.hold_one_blas_thread, released by stop()
        # RLlib's algo.callbacks (the callbacks_class instances) and algo.metrics, the logger of
        # the algorithm-level hooks (its values: top-level keys of the next result).
        self._callbacks = Callbacks.from_config(config)
        self.callbacks = self._callbacks.objects
        self.metrics = MetricsLogger()
        _LIVE.add(self)
        level = config.log_level.upper()
        logging.getLogger("impala_jax").setLevel("WARNING" if level == "WARN" else level)
        self._fake_batch = None
        # An env written in JAX trains on device: sampling is part of the update's program.
        self._on_device = is_jax_env(config.env)
        seed = config.seed if config.seed is not None else 0
        learner_key, actor_key = jax.random.split(jax.random.key(seed))
        self._seed = seed

        # Over several processes (impala_jax.runtime.distributed): each samples its own envs,
        # counts are agreed before every update (_next_batch) and process 0 writes and evaluates.
        self._processes = jax.process_count()
        self._primary = jax.process_index() == 0
        self._sampled_base = 0  # restored env steps of all processes (several processes)
        self._global_sampled = 0  # every process's env steps, as of the last agreement
        self._T = config.get_rollout_fragment_length()
        # The learner key stays shared; the envs' seeds and the actions' key are the process's.
        seed, actor_key = distributed.process_seed_and_key(seed, actor_key)
        error = None
        try:  # what can fail on one process alone, before the first collective
            devices, local = parallel.learner_devices(config.num_learners)
            self._build_policy(seed, local[0])  # the probe env: one this host cannot make
        except Exception as err:
            error = err
        start_together(config, error)
        columns = self._build_learner(devices, len(local), learner_key)
        self._build_runners(seed, local[0], columns, actor_key)
        self._init_counters(len(devices))
        self.env_runner_group.start(self.learner.put_batch)
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
        factory = getattr(config.get_default_rl_module_spec(), "factory", None)
        policy = acting.make_policy(config, obs_space, act_space, actor_device, factory)
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

    def _build_runners(self, seed: int, actor_device, columns: int, actor_key) -> None:
        """The env runners, the evaluator and what compute_actions acts with."""
        config = self.config
        if self._on_device:
            group = DeviceRunnerGroup(
                config,
                make_jax_env(config.env, config.env_config),
                self.policy,
                self.learner,
                actor_device,
                seed,
                example=lambda: self.policy.example_batch(self._T, columns, self.action_dtype),
            )
        else:
            group = EnvRunnerGroup(
                config,
                self._act,
                self._act_greedy,
                self.learner.state.params,
                actor_device=actor_device,
                observation_space=self.observation_space,
                seed=seed,
                batch_columns=columns,
                action_space=self.action_space,
            )
        self.env_runner_group = group
        self.param_store = group.param_store
        self._evaluator = Evaluator(config, self._act, self._act_greedy, group.param_store, seed)
        self._actions = Actions(self.policy, group.param_store, self._adapter, actor_key)
        self._minibatch_buffer = None
        if config.minibatch_buffer_size > 1 and config.num_epochs > 1:
            self._minibatch_buffer = MinibatchBuffer(
                config.minibatch_buffer_size, config.num_epochs, group.next_batch
            )

    def _init_counters(self, num_devices: int) -> None:
        config = self.config
        self._sys_usage = SysUsage() if config.log_sys_usage else None
        self.batch_env_steps = self.step_spec.columns * num_devices * self._T
        self._episodes = EpisodeStats(config.metrics_num_episodes_for_smoothing)
        self._timers = Timers()
        self._iteration = 0
        self._time_total = 0.0
        self._env_steps_trained = 0
        self._num_updates = 0
        self._checks = diagnostics.TrainingChecks()  # the learner warnings, once per build
        self._dead_policy = diagnostics.DeadPolicyCheck()  # reported once per build
        self._last_lag: list = []
        self._last_learner_metrics: dict = {}
        self._iterations_since_restore = 0  # Tune's bookkeeping keys, as RLlib's results have
        self._time_since_restore = 0.0
        self._result_config = checkpoint.jsonable(config.to_dict())
        # RLlib's single-agent `policies` entry, which RLlib's own result checks read.
        self._result_config.setdefault("policies", {DEFAULT_MODULE_ID: (None, None, None, None)})
        self._num_parameters = sum(
            int(np.prod(np.shape(x))) for x in jax.tree.leaves(self.learner.state.params)
        )

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled so far; over several processes, by all of them (as of the last
        update: the count every process agreed on)."""
        if self._processes > 1:
            return self._global_sampled
        return self.env_runner_group.num_env_steps_sampled_lifetime

    def _next_batch(self, source):
        """The next batch; over several processes, only once every process has its own, with
        the env steps of all of them counted (distributed.agreed_next_batch)."""
        if self._processes == 1:
            return source.next_batch()

        def local_env_steps() -> int:
            return self.env_runner_group.num_env_steps_sampled_lifetime

        def agreed(total: int) -> None:
            self._global_sampled = self._sampled_base + total

        return distributed.agreed_next_batch(
            source.next_batch, local_env_steps, agreed, EnvRunnerFailure
        )

    def training_step(self) -> None:
        cfg = self.config
        if self._on_device:  # sampling and the update in one program (device_runner.py)
            with self._timers.time("learner_dispatch"):
                self._last_learner_metrics, versions = self.env_runner_group.update(self.learner)
            self._count_update(versions)
            return
        source = self._minibatch_buffer or self.env_runner_group
        if cfg.fake_sampler and self._fake_batch is not None:
            batch, versions = self._fake_batch  # debugging(fake_sampler=True): no sampling
        else:
            batch, versions = self._next_batch(source)
            if cfg.fake_sampler:
                self._fake_batch = (batch, versions)
        if cfg._env_runners_only or cfg._skip_learners:
            return
        with self._timers.time("learner_dispatch"):
            self._last_learner_metrics = self.learner.update(
                batch, self.num_env_steps_sampled_lifetime
            )
        self._count_update(versions)

    def _count_update(self, versions) -> None:
        """Books one update: its policy lag, the env steps trained, the params published."""
        cfg = self.config
        self._last_lag.append(self.param_store.version - versions)
        self._num_updates += 1
        self._env_steps_trained += self.batch_env_steps + (
            self.step_spec.replay_columns * self.learner.num_devices * self._T
        )
        if self._num_updates % cfg.broadcast_interval == 0:
            with self._timers.time("broadcast"):
                self.env_runner_group.publish(self.learner.state.params)

    def train(self) -> dict:
        """One iteration (RLlib's min_time_s / min_*_timesteps_per_iteration semantics)."""
        if self._stopped:
            raise RuntimeError("this IMPALA was stopped; build a new one from its config.")
        try:
            result = self._train()
            # RLlib calls it after the result is compiled: what it logs lands in the next one.
            self._callbacks.call(
                "on_train_result", algorithm=self, metrics_logger=self.metrics, result=result
            )
        except (EnvRunnerFailure, UserCodeError):
            self.stop()  # threads end; checkpoints already written stay as they are
            raise
        return result

    def _train(self) -> dict:
        cfg = self.config
        interval = cfg.evaluation_interval
        evaluate_now = bool(interval) and (self._iteration + 1) % interval == 0
        if evaluate_now and self._processes > 1:
            # Process 0 evaluates (the params are the same everywhere); the others receive it.
            if self._primary:
                result = self._evaluated_iteration()
            else:
                result = self._training_iteration()
            result["evaluation"] = distributed.broadcast_json(
                result.get("evaluation"),
                "process 0's evaluation",
                extra_s=cfg.evaluation_sample_timeout_s or 0,
            )
            return result
        if evaluate_now:
            return self._evaluated_iteration()
        return self._training_iteration()

    def _evaluated_iteration(self) -> dict:
        """One training iteration with its evaluation (in parallel when so configured)."""
        if self.config.evaluation_parallel_to_training:
            # RLlib's _run_one_training_iteration_and_evaluation_in_parallel: the training step
            # runs in a thread while this one evaluates the params the iteration started with.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="training") as pool:
                future = pool.submit(self._training_iteration)
                evaluation = self.evaluate(parallel_train_future=future)
                result = future.result()
            result["evaluation"] = evaluation
            return result
        result = self._training_iteration()
        result["evaluation"] = self.evaluate()
        return result

    def _training_iteration(self) -> dict:
        cfg = self.config
        group = self.env_runner_group
        started = time.perf_counter()
        sampled0 = self.num_env_steps_sampled_lifetime
        trained0 = self._env_steps_trained
        group.begin_iteration()
        num_steps = 0
        while True:
            self.training_step()
            num_steps += 1
            elapsed = time.perf_counter() - started
            done = (
                elapsed >= (cfg.min_time_s_per_iteration or 0)
                and self.num_env_steps_sampled_lifetime - sampled0
                >= (cfg.min_sample_timesteps_per_iteration or 0)
                and self._env_steps_trained - trained0
                >= (cfg.min_train_timesteps_per_iteration or 0)
            )
            if self._processes > 1:
                # Process 0 decides, so every process runs the same number of updates.
                done = bool(distributed.broadcast(np.bool_(done), "process 0's end of iteration"))
            if done:
                break
        with self._timers.time("learner_fetch"):
            # The one device->host fetch of the iteration; it also waits for the last step.
            learner = {k: float(v) for k, v in jax.device_get(self._last_learner_metrics).items()}
        group.end_iteration()
        message = diagnostics.non_finite_message(learner)
        if message:
            self.stop()
            raise FloatingPointError(message)
        for message in self._checks.warnings(learner, cfg, self._num_updates, self._num_parameters):
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        result = self._result(elapsed, sampled0, trained0, learner, num_steps)
        returned = result["env_runners"].get("episode_return_mean")
        message = self._dead_policy.message(learner, returned, cfg)
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return deep_merge(result, self.metrics.reduce())  # what the algorithm's hooks logged

    def _result(
        self, elapsed: float, sampled0: int, trained0: int, learner: dict, num_steps: int
    ) -> dict:
        """RLlib's nested result dict, plus impala_jax's perf/ and fault_tolerance/."""
        group = self.env_runner_group
        new_episodes, episode_metrics = group.drain_episodes_and_metrics()
        if self._processes > 1:
            # Every process's episodes, in process order: the same window everywhere.
            rows = np.asarray(new_episodes, np.float64).reshape(-1, 2)
            rows = distributed.allgather_rows(rows, "the iteration's episodes")
            new_episodes = [(float(r), int(n)) for r, n in rows]
        self._episodes.add(new_episodes)
        sampled = self.num_env_steps_sampled_lifetime - sampled0
        env_runners = self._episodes.result(len(new_episodes), sampled)
        timers = merge_timers([self._timers.drain()] + group.drain_timers())
        lag = np.concatenate(self._last_lag) if self._last_lag else np.zeros(1)
        self._last_lag = []
        self._iterations_since_restore += 1
        self._time_since_restore += elapsed
        return train_result(
            env_runners=env_runners,
            episode_metrics=episode_metrics,
            learner=learner,
            timers=timers,
            lag=lag,
            sampled=sampled,
            trained=self._env_steps_trained - trained0,
            elapsed=elapsed,
            num_env_steps_sampled_lifetime=self.num_env_steps_sampled_lifetime,
            num_env_steps_trained_lifetime=self._env_steps_trained,
            num_updates_lifetime=self._num_updates,
            num_episodes_lifetime=self._episodes.num_episodes_lifetime,
            num_trainable_parameters=self._num_parameters,
            num_training_step_calls=num_steps,
            training_iteration=self._iteration,
            time_total_s=self._time_total,
            # train_batch_size_per_learner rounded up to whole fragments (config.py).
            batch_size_per_learner=self.step_spec.columns * self._T,
            total_batch_size=self.batch_env_steps,
            learner_queue_size=group.queue_size(),
            sys_usage=self._sys_usage.result() if self._sys_usage is not None else {},
            fault_tolerance=group.fault_tolerance_metrics(),
            trainable=trainable_info(
                self._iterations_since_restore, self._time_since_restore, self._result_config
            ),
        )

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
        self.env_runner_group.publish(self.learner.state.params)

    def stop(self) -> None:
        """Ends every thread and closes every env; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.env_runner_group is not None:
            self.env_runner_group.stop()
        if self.learner is not None:
            self.learner.wait_for_warm_up()
        if self._evaluator is not None:
            self._evaluator.close()
        if self._holds_blas:
            self._holds_blas = False
            release_blas_threads()

    def __enter__(self) -> IMPALA:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

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
