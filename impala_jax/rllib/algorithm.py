"""IMPALA: builds the parts from a frozen config and runs iterations; orchestration only.

The runners' lives are in env_runner_group (EnvRunnerGroup), evaluation in evaluation, the
learner's static specs in specs, the math in vtrace/losses/optim, the two compiled programs in
env_runner (act) and learner (learner_step), state and checkpoints in checkpointable (the format
in checkpoint), the agreements between processes in distributed.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import math
import time
import warnings
import weakref

import gymnasium as gym
import jax
import numpy as np

from impala_jax.core.distributions import make_distribution
from impala_jax.core.networks import make_networks
from impala_jax.core.recurrent import RecurrentActor, make_recurrent_networks, num_chunks
from impala_jax.core.types import Trajectory
from impala_jax.rllib import specs
from impala_jax.rllib.checkpointable import Checkpointable
from impala_jax.rllib.module import DEFAULT_MODULE_ID, Module
from impala_jax.runtime import checkpoint, distributed, parallel, program_cache
from impala_jax.runtime.buffers import MinibatchBuffer
from impala_jax.runtime.callbacks import Callbacks, UserCodeError
from impala_jax.runtime.env_runner import initial_carry, make_act_fns
from impala_jax.runtime.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from impala_jax.runtime.envs import ActionAdapter, make_vec_env
from impala_jax.runtime.evaluation import Evaluator
from impala_jax.runtime.host_actor import (
    AUTO_MAX_MACS,
    HostActor,
    act_macs,
    hold_one_blas_thread,
    host_actor_unsupported,
    release_blas_threads,
)
from impala_jax.runtime.learner import Learner
from impala_jax.runtime.metrics import EpisodeStats, SysUsage, Timers, merge_timers, trainable_info
from impala_jax.runtime.metrics_logger import MetricsLogger, deep_merge

# Learner updates in a row with non-finite gradients (each skipped) before train() gives up.
MAX_CONSECUTIVE_NON_FINITE = 10
# After this many updates, one look at the optimizer's step size (stalled_step_message).
STEP_SIZE_CHECK_UPDATES = 10
# An update whose root mean square is below this fraction of lr is "orders of magnitude" small.
STALLED_STEP_RATIO = 1e-2
# RMSProp's mean square decaying from rmsprop_initial_scale for longer than this many updates is
# reported (the paper's epsilon 0.01 and 0.1 bound it at 458 and 229 updates at decay 0.99).
RMSPROP_WARM_UP_UPDATES = 1000
# A blind-encoder warning when at least this share of the encoder's units is dead (see below).
BLIND_DEAD_FRACTION = 0.9
# Env seeds of process p start at seed + p * this (far above any runner's restart blocks).
PROCESS_SEED_STRIDE = 1 << 24


def blind_encoder_message(learner: dict) -> str | None:
    """A warning when the policy's encoder gives (nearly) every observation the same features.

    ``encoder_dead_unit_fraction`` (learner._feature_metrics) is the share of its output units
    that are <= 0 for every observation of the batch. A dead ReLU passes no gradient to its own
    weights (only the layers below can revive it), and with most of them dead the value and the
    policy cannot tell frames apart (issue 17: Adam at lr 6e-4 on Pong's Nature CNN went there
    within 100 K env steps; a fresh one reads about 0.46 on Pong's near-identical frames).
    """
    dead = learner.get("encoder_dead_unit_fraction")
    if dead is None or not dead >= BLIND_DEAD_FRACTION:
        return None
    spread = learner.get("encoder_feature_std", float("nan"))
    return (
        f"encoder_dead_unit_fraction={dead:.2f}: {dead:.0%} of the policy encoder's output units "
        f"are <= 0 for every observation of the last batch (dead ReLUs; the features' std across "
        f"observations is {spread:.2g}). The network barely tells observations apart any more, "
        "and dead units rarely recover: the value and the policy stop learning from what they "
        "see. The updates were too large for this network: restart with a smaller "
        "training(lr=...) (or a gradient clip that binds). See docs/config.md, 'Loss reduction'."
    )


def stalled_step_message(learner: dict, config, num_parameters: int) -> str | None:
    """A warning when the latest update moved the params orders of magnitude less than lr.

    Adam and RMSProp move each parameter by about lr per step once the gradient dominates
    their denominator. With a mean loss (RLlib's, the default here) the gradient is T x B
    times smaller than the IMPALA paper's summed loss, so the paper's RMSProp epsilon (inside
    the square root, and the mean square starting at 1 as in TF1) can swamp it: the policy
    then never moves (issue 17: Pong's entropy stayed at ln 6 for 3 M frames).
    """
    ratio = learner.get("update_rms_to_lr_ratio")
    lr = learner.get("curr_lr", 0.0)
    if ratio is None or not lr > 0 or learner.get("num_consecutive_non_finite_updates", 0):
        return None  # no lr to compare with, or the last update was skipped (zero)
    if not ratio < STALLED_STEP_RATIO:
        return None
    grad_norm = learner.get("gradients_default_optimizer_global_norm", float("nan"))
    if config.grad_clip is not None and config.grad_clip_by == "global_norm":
        grad_norm = min(grad_norm, config.grad_clip)  # what reaches the optimizer
    grad_rms = grad_norm / max(num_parameters, 1) ** 0.5
    if config.opt_type == "rmsprop" and grad_rms / (grad_rms**2 + config.epsilon) ** 0.5 >= (
        STALLED_STEP_RATIO
    ):
        # The mean square starts at 1 (TF1) and decays as decay^k: the first updates are small
        # by design. Once it has decayed the step is about lr * g / sqrt(g^2 + epsilon) per
        # parameter, which is not orders of magnitude below lr here, so nothing is stalled
        # (issue 17, Pong: A2C's lr 7e-4 and epsilon 1e-5 with a mean loss read 5e-4 x lr at
        # update 12 and 0.02-0.05 x lr from update 200 on, and its value learned). A warm-up
        # that lasts thousands of updates is still reported (84 x 84 Pong, 320-row updates:
        # 3e-3 x lr at update 440, against 0.02-0.1 x lr from the start with 0.0).
        return rmsprop_warm_up_message(grad_rms, ratio, config)
    fixes = []
    if config.opt_type == "rmsprop":
        fixes.append(
            f"RMSProp adds epsilon={config.epsilon!r} to the mean square inside the square root "
            f"(and the mean square starts at 1, as in TF1): the gradient's root mean square per "
            f"parameter, {grad_rms:.2g}, is far below both"
        )
    if config.loss_reduction == "mean":
        fixes.append(
            "the loss is a mean over the batch's rows (RLlib's); constants tuned for a summed "
            "loss (the IMPALA paper's RMSProp lr, epsilon, grad_clip) need "
            "training(loss_reduction='sum')"
        )
    fixes.append("or use training(opt_type='adam') or a larger lr")
    return (
        f"The optimizer's updates are {ratio:.2g} x lr in root mean square after "
        f"{STEP_SIZE_CHECK_UPDATES}+ updates (lr={lr:.3g}, opt_type={config.opt_type!r}): the "
        "policy will barely move. " + "; ".join(fixes) + ". See docs/config.md, 'Loss reduction'."
    )


def rmsprop_warm_up_message(grad_rms: float, ratio: float, config) -> str | None:
    """A warning when RMSProp's mean square needs over RMSPROP_WARM_UP_UPDATES updates to decay
    from ``rmsprop_initial_scale`` to the gradient's scale (``g^2 + epsilon``, g the gradient's
    root mean square per parameter); until then every update is a fraction of its steady size."""
    steady = grad_rms**2 + config.epsilon
    initial = config.rmsprop_initial_scale
    if not initial > steady or config.decay == 0:
        return None
    updates = math.log(steady / initial) / math.log(config.decay)
    if updates <= RMSPROP_WARM_UP_UPDATES:
        return None
    whose = " (TF1's)" if initial == 1.0 else ""
    return (
        f"RMSProp's mean square starts at rmsprop_initial_scale={initial!r}{whose} and the "
        f"gradient's root mean square per parameter is {grad_rms:.2g}: at decay={config.decay!r} "
        f"it takes about {updates:,.0f} updates to decay to the gradient's scale, and until then "
        f"each update is a fraction of its steady size (now {ratio:.2g} x lr). "
        "training(rmsprop_initial_scale=0.0) starts at the gradient's scale (torch's and optax's "
        "RMSProp). See docs/config.md, 'Loss reduction'."
    )


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
            config.validate()
            config.freeze()
        self.config = config
        self._stopped = False
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
        seed = config.seed if config.seed is not None else 0
        learner_key, self._actor_key = jax.random.split(jax.random.key(seed))
        self._seed = seed

        # Over several processes (impala_jax.runtime.distributed): each samples its own envs, counts
        # are agreed before every update (_next_batch) and process 0 writes and evaluates.
        self._processes = jax.process_count()
        self._primary = jax.process_index() == 0
        if self._processes > 1:
            distributed.check_same_config(checkpoint.jsonable(config.to_dict()))
        self._sampled_base = 0  # restored env steps of all processes (several processes)
        self._global_sampled = 0  # every process's env steps, as of the last agreement
        devices = parallel.learner_devices(config.num_learners)
        # This process's learner devices: its batch columns and its actors' device.
        local = [d for d in devices if d.process_index == jax.process_index()]
        if not local:
            raise ValueError(
                f"learners(num_learners={config.num_learners}) uses none of this process's "
                f"devices (process {jax.process_index()} of {self._processes}); every process "
                "needs a learner device: num_learners = the devices of all processes."
            )
        if self._processes > 1:
            # Each process's envs get a seed block of their own (envpool seeds env i with
            # seed + i), and its actions their own key; the learner key stays shared.
            seed += jax.process_index() * PROCESS_SEED_STRIDE
            self._actor_key = jax.random.fold_in(self._actor_key, jax.process_index())
        T = config.get_rollout_fragment_length()
        self._T = T

        probe = make_vec_env(
            config.env, 1, seed, config.env_config, "sync", num_workers=config.num_env_runners
        )
        obs_space = config.observation_space or probe.observation_space
        act_space = config.action_space or probe.action_space
        probe.close()
        self.observation_space, self.action_space = obs_space, act_space
        self.distribution = make_distribution(act_space, config.model_config)
        self.recurrent = bool(config.model_config["use_lstm"])  # recurrent.py
        host_actor = self._use_host_actor(config, local[0], obs_space)
        if self.recurrent:
            self.networks = make_recurrent_networks(config.model_config, obs_space, act_space)
            actor = RecurrentActor(self.networks, self.distribution, self.networks.max_seq_len)
            self._act, self._act_greedy = actor, actor.greedy
        else:
            self.networks = make_networks(config.model_config, obs_space, act_space)
            self._act, self._act_greedy = make_act_fns(self.networks, self.distribution)
            if host_actor:
                actor = HostActor(config.model_config, obs_space, self.distribution, self._act)
                self._act, self._act_greedy = actor, actor.greedy
                hold_one_blas_thread()
                self._holds_blas = True
        self._adapter = ActionAdapter(
            act_space, config.normalize_actions, config.clip_actions, str(config.env)
        )

        self.opt_spec = specs.optimizer_spec(config)
        loss_spec = specs.loss_spec(config)
        self.step_spec = specs.step_spec(config, len(devices))
        columns = self.step_spec.columns * len(local)

        def example_batch(params) -> Trajectory:  # from the params' shapes (Learner)
            self.action_dtype = self._policy_action_dtype(obs_space, params)
            return self._example_batch(columns, self.action_dtype)

        # The learner step compiles in a thread of its own from the start of the Learner's
        # construction, beside the initial state's and the policy's compilation and the envs'
        # creation below, not after them.
        warm_up = not (config._env_runners_only or config._skip_learners)
        self.learner = Learner(
            self.networks,
            self.distribution,
            self.opt_spec,
            loss_spec,
            self.step_spec,
            devices,
            learner_key,
            # The learner's traced programs kept on disk where it can (program_cache).
            program_key=program_cache.model_description(config.model_config, obs_space, act_space),
            example=example_batch if warm_up else None,
        )
        if not warm_up:
            self.action_dtype = self._policy_action_dtype(obs_space, self.learner.state.params)
        group = EnvRunnerGroup(
            config,
            self._act,
            self._act_greedy,
            self.learner.state.params,
            actor_device=local[0],
            observation_space=obs_space,
            seed=seed,
            batch_columns=columns,
            action_space=act_space,
        )
        self.env_runner_group = group
        self.param_store = group.param_store
        self._evaluator = Evaluator(config, self._act, self._act_greedy, group.param_store, seed)
        self._sys_usage = SysUsage() if config.log_sys_usage else None

        self.batch_env_steps = self.step_spec.columns * len(devices) * T
        self._episodes = EpisodeStats(config.metrics_num_episodes_for_smoothing)
        self._timers = Timers()
        self._iteration = 0
        self._time_total = 0.0
        self._env_steps_trained = 0
        self._num_updates = 0
        self._step_size_checked = False  # stalled_step_message, once per build
        self._blind_warned = False  # blind_encoder_message, at most once per build
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
        self._minibatch_buffer = None
        if config.minibatch_buffer_size > 1 and config.num_epochs > 1:
            self._minibatch_buffer = MinibatchBuffer(
                config.minibatch_buffer_size, config.num_epochs, group.next_batch
            )
        group.start(self.learner.put_batch)
        try:
            self._callbacks.call("on_algorithm_init", algorithm=self, metrics_logger=self.metrics)
        except BaseException:
            self.stop()
            raise

    def _use_host_actor(self, config, actor_device, obs_space) -> bool:
        """Whether the runners act with NumPy (host_actor.py): ``inference_backend``."""
        backend = config.inference_backend
        if backend == "jax":
            return False
        reason = host_actor_unsupported(config.model_config, obs_space, self.distribution)
        if backend == "numpy" and reason is not None:
            raise ValueError(
                f"inference_backend='numpy': the NumPy actor cannot run this policy: {reason}. "
                "Use 'auto' (NumPy where it can, else the jitted act) or 'jax' (set with "
                ".env_runners(inference_backend=...))."
            )
        if reason is not None:
            return False
        if backend == "numpy":
            return True
        # "auto": NumPy on a CPU actor device for a small policy; an accelerator, or a policy
        # whose dots are large enough for XLA's threads to pay, keeps the jitted act.
        envs = config.num_envs_per_env_runner
        macs = act_macs(config.model_config, obs_space, self.distribution.param_size, envs)
        return actor_device.platform == "cpu" and macs <= AUTO_MAX_MACS

    def _policy_action_dtype(self, obs_space, params) -> np.dtype:
        """The dtype of the policy's actions, from its abstract evaluation (no compilation);
        ``params`` may be shapes alone."""
        obs = jax.ShapeDtypeStruct((1, *obs_space.shape), obs_space.dtype)
        key = jax.random.key(0)
        if self.recurrent:
            carry = initial_carry(self._act, 1, self.action_space)
            return jax.eval_shape(self._act, params, obs, key, carry)[0].dtype
        act = self._act.jitted if isinstance(self._act, HostActor) else self._act
        return jax.eval_shape(act, params, obs, key)[0].dtype

    def _example_batch(self, columns: int, action_dtype) -> Trajectory:
        """Zeros shaped and typed like one learner batch, to compile the learner step early."""
        T, B, obs_space = self._T, columns, self.observation_space
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        action_shape = () if discrete else self.action_space.shape
        recurrent = {}
        if self.recurrent:
            K = num_chunks(T, self.networks.max_seq_len)
            state = self._act.initial_state(B)
            recurrent = dict(
                core_state=jax.tree.map(lambda x: np.zeros((K, *x.shape), x.dtype), state),
                prev_action=np.zeros((T + 1, B, *action_shape), action_dtype),
                prev_reward=np.zeros((T + 1, B), np.float32),
                reset=np.zeros((T + 1, B), bool),
            )
        return Trajectory(
            obs=np.zeros((T + 1, B, *obs_space.shape), obs_space.dtype),
            action=np.zeros((T, B, *action_shape), action_dtype),
            behaviour_logits=np.zeros((T, B, self.networks.dist_size), np.float32),
            reward=np.zeros((T, B), np.float32),
            terminated=np.zeros((T, B), bool),
            truncated=np.zeros((T, B), bool),
            valid=np.zeros((T, B), np.float32),
            param_version=np.zeros(B, np.int32),
            **recurrent,
        )

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled so far; over several processes, by all of them (as of the last
        update: the count every process agreed on)."""
        if self._processes > 1:
            return self._global_sampled
        return self.env_runner_group.num_env_steps_sampled_lifetime

    def _next_batch(self, source):
        """The next batch; over several processes, only once every process has its own.

        The processes exchange whether their batch came and how many env steps they sampled
        (one allgather): a runner failure in one stops all with its error, where the others
        would wait in the update's collective, and the summed count is the same on all, so
        the learner's schedules see the same step on every process.
        """
        if self._processes == 1:
            return source.next_batch()
        error = None
        try:
            got = source.next_batch()
        except Exception as err:  # EnvRunnerFailure, a stalled queue: reported to all first
            got, error = None, err
        local = self.env_runner_group.num_env_steps_sampled_lifetime
        status = distributed.allgather(
            np.array([error is not None, local], np.int64), "every process's next train batch"
        )
        self._global_sampled = self._sampled_base + int(status[:, 1].sum())
        failed = [int(i) for i in np.flatnonzero(status[:, 0])]
        if failed:
            report = f"{type(error).__name__}: {error}" if error is not None else None
            reports = distributed.allgather_json(report, "the failure report")
            if error is not None:
                raise error
            first = failed[0]
            raise EnvRunnerFailure(
                f"process {first} of {self._processes} could not produce its train batch, so "
                f"every process stops: {reports[first]}"
            )
        return got

    def training_step(self) -> None:
        cfg = self.config
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
        bad = learner.get("num_consecutive_non_finite_updates", 0)
        if bad >= MAX_CONSECUTIVE_NON_FINITE:
            self.stop()
            raise FloatingPointError(
                f"the last {int(bad)} learner updates all had non-finite gradients and were "
                "skipped; training stopped. The params are those of the last finite update and "
                "checkpoints already written are intact. Check the env's rewards and "
                "observations, or lower training(lr=...) / set training(grad_clip=...)."
            )
        if not self._step_size_checked and self._num_updates >= STEP_SIZE_CHECK_UPDATES:
            self._step_size_checked = True
            message = stalled_step_message(learner, cfg, self._num_parameters)
            if message:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
        if not self._blind_warned and self._num_updates >= STEP_SIZE_CHECK_UPDATES:
            message = blind_encoder_message(learner)
            if message:
                self._blind_warned = True
                warnings.warn(message, RuntimeWarning, stacklevel=2)
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        result = self._result(elapsed, sampled0, trained0, learner, num_steps)
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
        trained = self._env_steps_trained - trained0
        env_runners = self._episodes.result(len(new_episodes), sampled)
        timers = merge_timers([self._timers.drain()] + group.drain_timers())
        lag = np.concatenate(self._last_lag) if self._last_lag else np.zeros(1)
        self._last_lag = []
        lifetime = self.num_env_steps_sampled_lifetime
        env_runners["num_env_steps_sampled_lifetime"] = lifetime
        deep_merge(env_runners, episode_metrics)  # what on_episode_* callbacks logged
        module_steps = {
            "num_module_steps_trained": trained,
            "num_module_steps_trained_lifetime": self._env_steps_trained,
        }
        learner.update(
            module_steps,
            num_env_steps_trained=trained,
            num_updates_lifetime=self._num_updates,
            default_optimizer_learning_rate=learner.get("curr_lr", float("nan")),
            # train_batch_size_per_learner rounded up to whole fragments (config.py).
            effective_train_batch_size_per_learner=self.step_spec.columns * self._T,
            effective_total_train_batch_size=self.batch_env_steps,
        )
        self._iterations_since_restore += 1
        self._time_since_restore += elapsed
        return {
            "env_runners": env_runners,
            "learners": {
                "default_policy": learner,
                "__all_modules__": dict(
                    module_steps,
                    num_env_steps_trained=trained,
                    num_env_steps_trained_lifetime=self._env_steps_trained,
                    num_trainable_parameters=self._num_parameters,
                ),
            },
            "num_env_steps_sampled_lifetime": lifetime,
            "num_env_steps_trained_lifetime": self._env_steps_trained,
            "num_episodes_lifetime": self._episodes.num_episodes_lifetime,
            "num_training_step_calls_per_iteration": num_steps,
            "training_iteration": self._iteration,
            "time_this_iter_s": elapsed,
            "time_total_s": self._time_total,
            "timers": {f"{k}_s": v for k, (v, _) in sorted(timers.items())},
            "perf": {
                "env_steps_sampled_per_s": sampled / elapsed,
                "env_steps_trained_per_s": trained / elapsed,
                "policy_lag_mean": float(lag.mean()),
                "policy_lag_max": int(lag.max()),
                "learner_queue_size": group.queue_size(),
                **(self._sys_usage.result() if self._sys_usage is not None else {}),
            },
            "fault_tolerance": group.fault_tolerance_metrics(),
            **trainable_info(
                self._iterations_since_restore, self._time_since_restore, self._result_config
            ),
        }

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

    def compute_actions(self, obs, explore: bool = False) -> np.ndarray:
        """Env actions for a batch of observations with the newest params."""
        if self.recurrent:
            raise ValueError(
                "compute_actions is for feedforward policies; a recurrent one (use_lstm) needs "
                "its state: compute_single_action(obs, state=..., prev_action=..., "
                "prev_reward=...), starting from get_initial_state()."
            )
        params, _ = self.param_store.get()
        obs = np.asarray(obs)
        if explore:
            self._actor_key, key = jax.random.split(self._actor_key)
            action, _, _ = self._act(params, obs, key)
        else:
            action, _ = self._act_greedy(params, obs)
        action = np.asarray(action)
        return self._adapter(action, len(obs))

    def compute_single_action(
        self, obs, state=None, prev_action=None, prev_reward=None, explore: bool = False
    ):
        """One env's action. A recurrent policy (use_lstm) returns ``(action, state_out,
        extra)`` as RLlib's does: pass ``state`` (``get_initial_state()`` at an episode's
        start, then each call's ``state_out``) and the previous action and reward (None: 0,
        as at an episode's start); ``extra["action_dist_inputs"]`` holds the distribution's
        inputs."""
        if not self.recurrent:
            if state is not None or prev_action is not None or prev_reward is not None:
                raise ValueError(
                    "state / prev_action / prev_reward are for recurrent policies "
                    "(model_config use_lstm=True); this one is feedforward."
                )
            return self.compute_actions(np.asarray(obs)[None], explore=explore)[0]
        params, _ = self.param_store.get()
        state = self.get_initial_state() if state is None else state
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        if prev_action is None:
            prev_action = 0 if discrete else np.zeros(self.action_space.shape, np.float32)
        prev_action = np.asarray(prev_action, np.int32 if discrete else np.float32)
        carry = (
            jax.tree.map(lambda x: np.asarray(x)[None], state),
            prev_action[None],
            np.asarray([prev_reward or 0.0], np.float32),
            np.zeros(1, bool),
        )
        obs = np.asarray(obs)[None]
        if explore:
            self._actor_key, key = jax.random.split(self._actor_key)
            action, dist_inputs, _, state_out = self._act(params, obs, key, carry)
        else:
            action, dist_inputs, state_out = self._act_greedy(params, obs, carry)
        action = self._adapter(np.asarray(action), 1)[0]
        state_out = jax.tree.map(lambda x: np.asarray(x)[0], state_out)
        return action, state_out, {"action_dist_inputs": np.asarray(dist_inputs)[0]}

    def get_initial_state(self):
        """A recurrent policy's state for one env at an episode's start (RLlib's
        ``get_initial_state``); ``{}`` for a feedforward policy."""
        if not self.recurrent:
            return {}
        return jax.tree.map(lambda x: x[0], self._act.initial_state(1))

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
        if self.recurrent:
            raise ValueError(
                "get_module() serves feedforward policies (forward_inference on observations "
                "alone); a recurrent one (use_lstm) acts through compute_single_action(obs, "
                "state=..., prev_action=..., prev_reward=...) from get_initial_state()."
            )
        return Module(self.networks, self.distribution, self.param_store)

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
        try:
            self.stop()
        except Exception:
            pass
