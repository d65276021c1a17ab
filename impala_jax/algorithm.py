"""IMPALA: builds the runners, buffers and learner from a frozen config and runs iterations.

Orchestration only: the math is in vtrace/losses/optim, the compiled code in env_runner (act)
and learner (learner_step).
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from typing import Any

import gymnasium as gym
import jax
import numpy as np

from impala_jax import checkpoint, parallel
from impala_jax.buffers import Batcher, LearnerQueue, LearnerQueueTimeout, Loader, stack
from impala_jax.distributions import make_distribution
from impala_jax.env_runner import (
    EnvOutputError,
    EnvRunner,
    ParamStore,
    RunnerThread,
    make_act_fns,
)
from impala_jax.envs import ActionAdapter, make_vec_env
from impala_jax.learner import Learner, LossSpec, StepSpec
from impala_jax.metrics import EpisodeStats, Timers, merge_timers
from impala_jax.networks import make_networks
from impala_jax.optim import OptimizerSpec
from impala_jax.types import LearnerState, Trajectory

# Learner updates in a row with non-finite gradients (each skipped) before train() gives up.
MAX_CONSECUTIVE_NON_FINITE = 10


def _step_spec(config, num_devices: int) -> StepSpec:
    T = config.get_rollout_fragment_length()
    columns = config.train_batch_size_per_learner // T
    replay_columns = 0
    replay_slots = 0
    if config.replay_proportion > 0 and config.replay_buffer_num_slots > 0:
        # "replayed with a p:1 proportion to new data": p * columns replayed columns per step.
        replay_columns = max(1, round(config.replay_proportion * columns))
        replay_slots = math.ceil(config.replay_buffer_num_slots / num_devices)
    total = columns + replay_columns
    if config.minibatch_size is None:
        mb = total
    else:
        global_mb = config.minibatch_size // T
        if global_mb % num_devices:
            raise ValueError(
                f"training(minibatch_size={config.minibatch_size}) is {global_mb} fragments of "
                f"{T} steps, which does not split over {num_devices} learner devices; use a "
                f"multiple of {T * num_devices}."
            )
        mb = global_mb // num_devices
        if total % mb:
            raise ValueError(
                f"training(minibatch_size={config.minibatch_size}) does not divide the per-device "
                f"batch of {total} fragments ({columns} new + {replay_columns} replayed); choose "
                f"a minibatch_size whose fragment count divides {total}."
            )
    return StepSpec(
        columns=columns,
        replay_columns=replay_columns,
        replay_slots=replay_slots,
        minibatch_columns=mb,
        # With a minibatch buffer, epochs are passes over the host-side ring of batches
        # (MinibatchBuffer below); otherwise they run inside the one compiled step.
        num_epochs=1 if config.minibatch_buffer_size > 1 else config.num_epochs,
        shuffle=bool(config.shuffle_batch_per_epoch),
    )


class MinibatchBuffer:
    """RLlib's minibatch buffer: ``size`` device batches, each used ``num_epochs`` times.

    Batches are served round-robin, so reuse of one batch is interleaved with the others
    instead of back to back; a slot whose batch is used up takes the next new batch.
    """

    def __init__(self, size: int, num_epochs: int, next_batch):
        self._next = next_batch
        self._num_epochs = num_epochs
        self._slots: list = [None] * size
        self._uses_left = [0] * size
        self._idx = 0

    def get(self):
        i = self._idx
        if self._uses_left[i] <= 0:
            self._slots[i] = None  # release the device batch before fetching the next
            self._slots[i] = self._next()
            self._uses_left[i] = self._num_epochs
        self._uses_left[i] -= 1
        self._idx = (i + 1) % len(self._slots)
        return self._slots[i]


def _clip_rewards(config):
    if config.clip_rewards is None:
        return True if config.is_atari else None  # RLlib clips Atari rewards by default
    return config.clip_rewards


# Algorithms not stopped by their users: stopped at interpreter exit, before daemon runner
# threads are killed inside envpool's C++ (which aborts the process).
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_live_algorithms() -> None:
    for algo in list(_LIVE):
        algo.stop()


class IMPALA:
    """The algorithm. ``IMPALAConfig().environment("CartPole-v1").build()`` returns one."""

    def __init__(self, config):
        if not getattr(config, "_is_frozen", False):
            config = config.copy()
            config.validate()
            config.freeze()
        self.config = config
        self._stopped = False
        self._stop = threading.Event()
        # What stop() touches exists from the start: a failed __init__ is still stoppable.
        self.learner = None
        self._runners: list[EnvRunner] = []  # live runners: their steps and episodes count
        self._threads: dict[int, RunnerThread] = {}  # runner slot -> its thread
        self._loader = None
        self._eval_runner = None
        _LIVE.add(self)
        seed = config.seed if config.seed is not None else 0
        learner_key, self._actor_key = jax.random.split(jax.random.key(seed))
        self._seed = seed

        devices = parallel.learner_devices(config.num_learners)
        T = config.get_rollout_fragment_length()
        self._T = T

        probe = make_vec_env(config.env, 1, seed, config.env_config, "sync")
        obs_space = config.observation_space or probe.observation_space
        act_space = config.action_space or probe.action_space
        probe.close()
        self.observation_space, self.action_space = obs_space, act_space
        self.networks = make_networks(config.model_config, obs_space, act_space)
        self.distribution = make_distribution(act_space, config.model_config)
        self._act, self._act_greedy = make_act_fns(self.networks, self.distribution)
        self._adapter = ActionAdapter(
            act_space, config.normalize_actions, config.clip_actions, str(config.env)
        )

        lr = config.resolved_lr
        self.opt_spec = OptimizerSpec(
            opt_type=config.opt_type,
            lr=lr,
            grad_clip=config.grad_clip,
            grad_clip_by=config.grad_clip_by,
            decay=config.decay,
            momentum=config.momentum,
            epsilon=config.epsilon,
            separate_vf_optimizer=config._separate_vf_optimizer,
            lr_vf=config._lr_vf,
            # Never apply a non-finite update on device; train() stops the run instead.
            max_consecutive_non_finite=2**31 - 1,
        )
        loss_spec = LossSpec(
            gamma=config.gamma,
            vf_loss_coeff=config.vf_loss_coeff,
            entropy_coeff=config.resolved_entropy_coeff,  # optim.piecewise_linear validates it
            clip_rho_threshold=config.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
            clip_rewards=_clip_rewards(config),
        )
        self.step_spec = _step_spec(config, len(devices))
        self.learner = Learner(
            self.networks,
            self.distribution,
            self.opt_spec,
            loss_spec,
            self.step_spec,
            devices,
            learner_key,
        )
        self._actor_device = devices[0]
        self.param_store = ParamStore(self.learner.state.params, self._actor_device)
        action_dtype = self._warm_up_act(obs_space)

        self.batch_env_steps = self.step_spec.columns * len(devices) * T
        self._episodes = EpisodeStats(config.metrics_num_episodes_for_smoothing)
        self._timers = Timers()
        self._iteration = 0
        self._time_total = 0.0
        self._env_steps_trained = 0
        self._env_steps_sampled_base = 0  # steps sampled by runners of earlier lives (restore)
        self._num_updates = 0
        self._last_lag: list = []
        self._last_learner_metrics: dict = {}

        self._batcher = Batcher(self.step_spec.columns * len(devices))
        if not (config._env_runners_only or config._skip_learners):
            self.learner.warm_up(self._example_batch(obs_space, action_dtype))
        self._pending_restarts: dict[int, float] = {}  # runner slot -> when to restart it
        self._retired_episodes: list = []
        self._num_restarts = 0
        self._num_failures = 0
        self._consecutive_failures = 0
        self._num_env_restarts_base = 0
        self._num_dropped_episodes_base = 0
        self._last_failure: RunnerThread | None = None
        self._queue = None
        self._minibatch_buffer = None
        if config.minibatch_buffer_size > 1 and config.num_epochs > 1:
            self._minibatch_buffer = MinibatchBuffer(
                config.minibatch_buffer_size, config.num_epochs, self._next_batch
            )
        if config.num_env_runners == 0:
            self._runners.append(self._make_runner(0))
        else:
            self._queue = LearnerQueue(config.learner_queue_size)
            for i in range(config.num_env_runners):
                self._start_runner(i, seed=self._seed + i * config.num_envs_per_env_runner)
            self._loader = Loader(
                self._queue,
                self._batcher,
                self.learner.put_batch,
                num_threads=config.num_gpu_loader_threads,
                num_slots=config.num_multi_gpu_tower_stacks,
                stop=self._stop,
            )

    def _warm_up_act(self, obs_space) -> np.dtype:
        """Compiles ``act`` for the runners' batch shapes before any runner thread starts, so
        compilation never counts against ``sample_timeout_s``. Returns the action dtype."""
        params, _ = self.param_store.get()
        size = EnvRunner.group_sizes(self.config.num_envs_per_env_runner)[0]
        obs = np.zeros((size, *obs_space.shape), obs_space.dtype)
        action, _, _ = jax.block_until_ready(self._act(params, obs, self._actor_key))
        return action.dtype

    def _example_batch(self, obs_space, action_dtype) -> Trajectory:
        """Zeros shaped and typed like one learner batch, to compile the learner step early."""
        T, B = self._T, self._batcher.columns
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        action_shape = () if discrete else self.action_space.shape
        return Trajectory(
            obs=np.zeros((T + 1, B, *obs_space.shape), obs_space.dtype),
            action=np.zeros((T, B, *action_shape), action_dtype),
            behaviour_logits=np.zeros((T, B, self.networks.dist_size), np.float32),
            reward=np.zeros((T, B), np.float32),
            terminated=np.zeros((T, B), bool),
            truncated=np.zeros((T, B), bool),
            valid=np.zeros((T, B), np.float32),
            param_version=np.zeros(B, np.int32),
        )

    def _make_runner(self, index: int, seed: int | None = None) -> EnvRunner:
        config = self.config
        return EnvRunner(
            config,
            index,
            self._act,
            self._act_greedy,
            self.param_store,
            # envpool seeds env i with seed + i: runners are spaced by their env count.
            seed=self._seed + index * config.num_envs_per_env_runner if seed is None else seed,
            explore=config.explore,
        )

    def _start_runner(self, index: int, seed: int) -> None:
        cfg = self.config
        runner = self._make_runner(index, seed)
        runner.heartbeat = time.monotonic()
        # The thread must not hold a reference to self: `del algo` has to reach __del__.
        thread = RunnerThread(
            runner,
            self._queue.put,
            restart_envs=cfg.restart_failed_sub_environments,
            tolerance=cfg.num_consecutive_env_runner_failures_tolerance,
        )
        self._runners.append(runner)
        self._threads[index] = thread
        thread.start()

    def _retire(self, runner: EnvRunner) -> None:
        """Keeps a runner's counts and finished episodes when it leaves the live set."""
        self._runners.remove(runner)
        self._env_steps_sampled_base += runner.env_steps
        self._num_env_restarts_base += runner.num_env_restarts
        self._num_dropped_episodes_base += runner.num_dropped_episodes + int(
            sum(np.count_nonzero(g.episode_len) for g in runner.groups)
        )
        self._retired_episodes.extend(runner.episodes.drain())

    # ---------------------------------------------------------------- training

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self._env_steps_sampled_base + sum(r.env_steps for r in self._runners)

    def _next_batch(self):
        """(device batch, host param versions): sampled here in lockstep, or from the loader."""
        if self._loader is None:
            ready: list = []
            while not ready:
                for traj in self._sample_locally():
                    ready.extend(self._batcher.add(traj))
            host = stack(ready[0])
            with self._timers.time("transfer"):
                return self.learner.put_batch(host), host.param_version
        timeout = self.config.learner_queue_timeout
        waited = 0.0
        with self._timers.time("learner_wait"):
            while True:
                self._check_threads()
                # Short waits, so failed or hung runners are handled while the learner waits.
                item = self._loader.get(timeout=min(0.5, timeout))
                if item is not None:
                    return item
                waited += min(0.5, timeout)
                if waited >= timeout:
                    raise LearnerQueueTimeout(
                        f"the learner waited {timeout:g} s for a batch "
                        f"(training(learner_queue_timeout={timeout:g})); the env runners are "
                        "slower than that or stalled: raise learner_queue_timeout for slow envs."
                    )

    def _sample_locally(self) -> list:
        """Lockstep sampling; env failures restart the envs when that is configured."""
        runner = self._runners[0]
        for attempt in range(self.config.num_consecutive_env_runner_failures_tolerance + 1):
            try:
                return runner.sample()
            except EnvOutputError:
                raise
            except Exception:
                if not self.config.restart_failed_sub_environments:
                    raise
                if attempt == self.config.num_consecutive_env_runner_failures_tolerance:
                    raise
                runner.restart_envs()
        raise AssertionError("unreachable")

    def _check_threads(self) -> None:
        """Failed or hung runners: restart, ignore or raise, as ``fault_tolerance`` says."""
        cfg = self.config
        now = time.monotonic()
        for index, thread in list(self._threads.items()):
            hung = (
                thread.error is None
                and thread.is_alive()
                and not thread.waiting_on_queue
                and now - thread.runner.heartbeat > cfg.sample_timeout_s
            )
            if thread.error is None and not hung:
                continue
            if hung:
                thread.error = TimeoutError(
                    f"EnvRunner {index} produced nothing for {cfg.sample_timeout_s:g} s "
                    f"(env_runners(sample_timeout_s={cfg.sample_timeout_s:g})): marked unhealthy, "
                    "its late data is dropped."
                )
                thread.error_traceback = repr(thread.error)
            # An abandoned thread drops whatever it still produces and closes its envs.
            thread.stop_event.set()
            del self._threads[index]
            self._retire(thread.runner)
            self._num_failures += 1
            self._consecutive_failures += 1
            self._last_failure = thread
            fatal = isinstance(thread.error, EnvOutputError)
            if (
                not fatal
                and cfg.restart_failed_env_runners
                and (
                    self._num_restarts + len(self._pending_restarts)
                    < cfg.max_num_env_runner_restarts
                )
            ):
                self._pending_restarts[index] = now + cfg.delay_between_env_runner_restarts_s
            elif fatal or not cfg.ignore_env_runner_failures:
                self._raise_runner_failure(thread, "and fault_tolerance() does not recover it")
            if self._consecutive_failures > cfg.num_consecutive_env_runner_failures_tolerance:
                self._raise_runner_failure(
                    thread,
                    f"after {self._consecutive_failures} consecutive failures "
                    "(fault_tolerance(num_consecutive_env_runner_failures_tolerance="
                    f"{cfg.num_consecutive_env_runner_failures_tolerance}))",
                )
        for index, due in list(self._pending_restarts.items()):
            if now >= due:
                del self._pending_restarts[index]
                self._num_restarts += 1
                # A fresh seed block per restart, after every first-generation runner's block.
                n = cfg.num_envs_per_env_runner
                seed = self._seed + (cfg.num_env_runners + self._num_restarts) * n
                self._start_runner(index, seed)
        if not self._threads and not self._pending_restarts:
            self._raise_runner_failure(self._last_failure, "and no healthy EnvRunner is left")

    def _raise_runner_failure(self, thread: RunnerThread | None, why: str) -> None:
        if thread is None:
            raise RuntimeError(f"no EnvRunner is running {why}.")
        self.stop()
        raise RuntimeError(
            f"EnvRunner {thread.runner.index} failed {why}: {thread.error}\n"
            f"original traceback:\n{thread.error_traceback}"
        ) from thread.error

    def training_step(self) -> None:
        cfg = self.config
        batch, versions = (
            self._minibatch_buffer.get if self._minibatch_buffer else self._next_batch
        )()
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
                self.param_store.publish(self.learner.state.params)

    def train(self) -> dict:
        """One iteration (RLlib's min_time_s / min_*_timesteps_per_iteration semantics)."""
        if self._stopped:
            raise RuntimeError("this IMPALA was stopped; build a new one from its config.")
        cfg = self.config
        started = time.perf_counter()
        sampled0 = self.num_env_steps_sampled_lifetime
        trained0 = self._env_steps_trained
        failures0 = self._num_failures
        while True:
            self.training_step()
            elapsed = time.perf_counter() - started
            if (
                elapsed >= (cfg.min_time_s_per_iteration or 0)
                and self.num_env_steps_sampled_lifetime - sampled0
                >= (cfg.min_sample_timesteps_per_iteration or 0)
                and self._env_steps_trained - trained0
                >= (cfg.min_train_timesteps_per_iteration or 0)
            ):
                break
        with self._timers.time("learner_fetch"):
            # The one device->host fetch of the iteration; it also waits for the last step.
            learner = {k: float(v) for k, v in jax.device_get(self._last_learner_metrics).items()}
        if self._num_failures == failures0:
            self._consecutive_failures = 0
        bad = learner.get("num_consecutive_non_finite_updates", 0)
        if bad >= MAX_CONSECUTIVE_NON_FINITE:
            self.stop()
            raise FloatingPointError(
                f"the last {int(bad)} learner updates all had non-finite gradients and were "
                "skipped; training stopped. The params are those of the last finite update and "
                "checkpoints already written are intact. Check the env's rewards and "
                "observations, or lower training(lr=...) / set training(grad_clip=...)."
            )
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        result = self._result(elapsed, sampled0, trained0, learner)
        interval = cfg.evaluation_interval
        if interval and self._iteration % interval == 0:
            result["evaluation"] = self.evaluate()
        return result

    def _result(self, elapsed: float, sampled0: int, trained0: int, learner: dict) -> dict:
        new_episodes, self._retired_episodes = self._retired_episodes, []
        for runner in self._runners:
            new_episodes.extend(runner.episodes.drain())
        self._episodes.add(new_episodes)
        sampled = self.num_env_steps_sampled_lifetime - sampled0
        trained = self._env_steps_trained - trained0
        env_runners = self._episodes.result(len(new_episodes), sampled)
        timers = merge_timers(
            [self._timers.drain()]
            + [r.timers.drain() for r in self._runners]
            + ([self._loader.timers.drain()] if self._loader else [])
        )
        lag = np.concatenate(self._last_lag) if self._last_lag else np.zeros(1)
        self._last_lag = []
        learner.update(num_env_steps_trained=trained, num_updates_lifetime=self._num_updates)
        return {
            "env_runners": env_runners,
            "learners": {"default_policy": learner},
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime,
            "num_env_steps_trained_lifetime": self._env_steps_trained,
            "num_episodes_lifetime": self._episodes.num_episodes_lifetime,
            "training_iteration": self._iteration,
            "time_this_iter_s": elapsed,
            "time_total_s": self._time_total,
            "timers": {f"{k}_s": v for k, (v, _) in sorted(timers.items())},
            "perf": {
                "env_steps_sampled_per_s": sampled / elapsed,
                "env_steps_trained_per_s": trained / elapsed,
                "policy_lag_mean": float(lag.mean()),
                "policy_lag_max": int(lag.max()),
                "learner_queue_size": self._queue.qsize() if self._queue else 0,
            },
            "fault_tolerance": {
                "num_healthy_workers": sum(
                    t.is_alive() and t.error is None for t in self._threads.values()
                ),
                "num_remote_worker_restarts": self._num_restarts,
                "num_env_runner_failures": self._num_failures,
                "num_env_restarts": self._num_env_restarts_base
                + sum(r.num_env_restarts for r in self._runners),
                "num_dropped_episodes": self._num_dropped_episodes_base
                + sum(r.num_dropped_episodes for r in self._runners),
            },
        }

    # ---------------------------------------------------------------- evaluation, inference

    def evaluate(self) -> dict:
        """``evaluation_duration`` episodes (or timesteps) with the current params.

        Runs in this thread on its own envs, with ``evaluation_config`` applied; it acts
        greedily unless that config sets ``explore=True``.
        """
        cfg = self.config
        if self._eval_runner is None:
            eval_cfg = cfg.copy(copy_frozen=False)
            overrides = dict(cfg.evaluation_config or {})
            overrides.setdefault("explore", False)
            eval_cfg.update_from_dict(overrides)
            num_envs = max(1, cfg.evaluation_num_env_runners) * eval_cfg.num_envs_per_env_runner
            eval_cfg.env_runners(num_envs_per_env_runner=num_envs)
            self._eval_runner = EnvRunner(
                eval_cfg,
                -1,
                self._act,
                self._act_greedy,
                self.param_store,
                seed=self._seed + 1_000_003,
                explore=eval_cfg.explore,
            )
        runner = self._eval_runner
        runner.episodes.drain()
        episodes: list = []
        steps0 = runner.env_steps
        unit, duration = cfg.evaluation_duration_unit, cfg.evaluation_duration
        while True:
            runner.sample()
            episodes.extend(runner.episodes.drain())
            if unit == "episodes" and len(episodes) >= duration:
                break
            if unit == "timesteps" and runner.env_steps - steps0 >= duration:
                break
        stats = EpisodeStats(max(1, len(episodes)))
        stats.add(episodes)
        return {"env_runners": stats.result(len(episodes), runner.env_steps - steps0)}

    def compute_actions(self, obs, explore: bool = False) -> np.ndarray:
        """Env actions for a batch of observations with the newest params."""
        params, _ = self.param_store.get()
        obs = np.asarray(obs)
        if explore:
            self._actor_key, key = jax.random.split(self._actor_key)
            action, _, _ = self._act(params, obs, key)
        else:
            action, _ = self._act_greedy(params, obs)
        action = np.asarray(action)
        return self._adapter(action, len(obs))

    def compute_single_action(self, obs, explore: bool = False):
        return self.compute_actions(np.asarray(obs)[None], explore=explore)[0]

    # ---------------------------------------------------------------- state, checkpoints

    def get_state(self) -> dict:
        state = jax.device_get(self.learner.state)
        state = state.replace(key=np.asarray(jax.random.key_data(self.learner.state.key)))
        leaves = jax.tree.leaves(state)
        replay = jax.device_get(jax.tree.leaves(self.learner.replay))
        return {
            "learner": [np.asarray(x) for x in leaves],
            "replay": [np.asarray(x) for x in replay],
            "counters": {
                "training_iteration": self._iteration,
                "time_total_s": self._time_total,
                "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime,
                "num_env_steps_trained_lifetime": self._env_steps_trained,
                "num_updates_lifetime": self._num_updates,
                "num_episodes_lifetime": self._episodes.num_episodes_lifetime,
            },
        }

    def set_state(self, state: dict) -> None:
        template = self.learner.state.replace(key=jax.random.key_data(self.learner.state.key))
        treedef = jax.tree.structure(template)
        expected = [np.shape(x) for x in jax.tree.leaves(template)]
        got = [np.shape(x) for x in state["learner"]]
        if expected != got:
            raise ValueError(
                "the checkpoint's learner arrays do not match this config's network and "
                f"optimizer ({len(got)} arrays vs {len(expected)}, or different shapes); restore "
                "it with the config it was saved with (IMPALA.from_checkpoint(path))."
            )
        restored: LearnerState = jax.tree.unflatten(treedef, list(state["learner"]))
        restored = restored.replace(key=jax.random.wrap_key_data(np.asarray(restored.key)))
        replay = None
        if state.get("replay") and self.step_spec.replay_columns:
            leaves = list(state["replay"])
            n = self.learner.num_devices
            if len(leaves[-1]) == n and len(leaves[0]) == self.step_spec.replay_slots * n:
                replay = leaves
            # Replay slots are per device: onto another device count they start empty.
        self.learner.state = parallel.put(restored, self.learner.mesh, parallel.REPLICATED)
        if replay is not None:
            self.learner.init_replay_from_leaves(replay)
        c = state["counters"]
        self._iteration = c["training_iteration"]
        self._time_total = c["time_total_s"]
        self._env_steps_sampled_base = c["num_env_steps_sampled_lifetime"] - sum(
            r.env_steps for r in self._runners
        )
        self._env_steps_trained = c["num_env_steps_trained_lifetime"]
        self._num_updates = c["num_updates_lifetime"]
        self._episodes.num_episodes_lifetime = c["num_episodes_lifetime"]
        self.param_store.publish(self.learner.state.params)

    def save(self, path) -> str:
        state = self.get_state()
        arrays = {f"learner_{i:05d}": x for i, x in enumerate(state["learner"])}
        arrays.update({f"replay_{i:05d}": x for i, x in enumerate(state["replay"])})
        meta = {
            "format": checkpoint.FORMAT,
            "config": _jsonable(self.config.to_dict()),
            "counters": state["counters"],
        }
        return str(checkpoint.save(path, arrays, meta))

    def restore(self, path) -> None:
        arrays, meta = checkpoint.load(path)
        learner = [arrays[k] for k in sorted(arrays) if k.startswith("learner_")]
        replay = [arrays[k] for k in sorted(arrays) if k.startswith("replay_")]
        self.set_state({"learner": learner, "replay": replay, "counters": meta["counters"]})

    @classmethod
    def from_checkpoint(cls, path) -> IMPALA:
        from impala_jax.config import IMPALAConfig

        _, meta = checkpoint.load(path)
        algo = IMPALAConfig.from_dict(meta["config"]).build()
        algo.restore(path)
        return algo

    # ---------------------------------------------------------------- lifetime

    def stop(self) -> None:
        """Ends every thread and closes every env; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self.learner is not None:
            self.learner.wait_for_warm_up()
        threads = list(self._threads.values())
        for thread in threads:
            thread.stop_event.set()
        for thread in threads:
            thread.join(timeout=10)  # each runner thread closes its own envs on its way out
        if self._loader is not None:
            for thread in self._loader.threads:
                thread.join(timeout=10)
        if not threads:
            for runner in self._runners:
                runner.close()
        if self._eval_runner is not None:
            self._eval_runner.close()

    def __enter__(self) -> IMPALA:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass


def _jsonable(value: Any):
    """The config as JSON: a class or function env is stored by its import path."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if callable(value):
        return f"{value.__module__}:{value.__qualname__}"
    return value
