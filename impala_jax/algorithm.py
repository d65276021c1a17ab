"""IMPALA: builds the parts from a frozen config and runs iterations; orchestration only.

The runners' lives are in env_runner_group (EnvRunnerGroup), evaluation in evaluation, the
learner's static specs in specs, the math in vtrace/losses/optim, the two compiled programs in
env_runner (act) and learner (learner_step), the checkpoint format in checkpoint.
"""

from __future__ import annotations

import atexit
import time
import weakref

import gymnasium as gym
import jax
import numpy as np

from impala_jax import checkpoint, parallel, specs
from impala_jax.buffers import MinibatchBuffer
from impala_jax.distributions import make_distribution
from impala_jax.env_runner import make_act_fns
from impala_jax.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from impala_jax.envs import ActionAdapter, make_vec_env
from impala_jax.evaluation import Evaluator
from impala_jax.learner import Learner
from impala_jax.metrics import EpisodeStats, Timers, merge_timers
from impala_jax.networks import make_networks
from impala_jax.types import Trajectory

# Learner updates in a row with non-finite gradients (each skipped) before train() gives up.
MAX_CONSECUTIVE_NON_FINITE = 10


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
        # What stop() touches exists from the start: a failed __init__ is still stoppable.
        self.learner = None
        self.env_runner_group: EnvRunnerGroup | None = None
        self._evaluator: Evaluator | None = None
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

        self.opt_spec = specs.optimizer_spec(config)
        loss_spec = specs.loss_spec(config)
        self.step_spec = specs.step_spec(config, len(devices))
        self.learner = Learner(
            self.networks,
            self.distribution,
            self.opt_spec,
            loss_spec,
            self.step_spec,
            devices,
            learner_key,
        )
        group = EnvRunnerGroup(
            config,
            self._act,
            self._act_greedy,
            self.learner.state.params,
            actor_device=devices[0],
            observation_space=obs_space,
            seed=seed,
            batch_columns=self.step_spec.columns * len(devices),
        )
        self.env_runner_group = group
        self.param_store = group.param_store
        self._evaluator = Evaluator(config, self._act, self._act_greedy, group.param_store, seed)

        self.batch_env_steps = self.step_spec.columns * len(devices) * T
        self._episodes = EpisodeStats(config.metrics_num_episodes_for_smoothing)
        self._timers = Timers()
        self._iteration = 0
        self._time_total = 0.0
        self._env_steps_trained = 0
        self._num_updates = 0
        self._last_lag: list = []
        self._last_learner_metrics: dict = {}
        if not (config._env_runners_only or config._skip_learners):
            self.learner.warm_up(self._example_batch(group.batcher.columns, group.action_dtype))
        self._minibatch_buffer = None
        if config.minibatch_buffer_size > 1 and config.num_epochs > 1:
            self._minibatch_buffer = MinibatchBuffer(
                config.minibatch_buffer_size, config.num_epochs, group.next_batch
            )
        group.start(self.learner.put_batch)

    def _example_batch(self, columns: int, action_dtype) -> Trajectory:
        """Zeros shaped and typed like one learner batch, to compile the learner step early."""
        T, B, obs_space = self._T, columns, self.observation_space
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

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        return self.env_runner_group.num_env_steps_sampled_lifetime

    def training_step(self) -> None:
        cfg = self.config
        source = self._minibatch_buffer or self.env_runner_group
        batch, versions = source.next_batch()
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
            return self._train()
        except EnvRunnerFailure:
            self.stop()
            raise

    def _train(self) -> dict:
        cfg = self.config
        group = self.env_runner_group
        started = time.perf_counter()
        sampled0 = self.num_env_steps_sampled_lifetime
        trained0 = self._env_steps_trained
        group.begin_iteration()
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
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        result = self._result(elapsed, sampled0, trained0, learner)
        interval = cfg.evaluation_interval
        if interval and self._iteration % interval == 0:
            result["evaluation"] = self.evaluate()
        return result

    def _result(self, elapsed: float, sampled0: int, trained0: int, learner: dict) -> dict:
        """RLlib's nested result dict, plus impala_jax's perf/ and fault_tolerance/."""
        group = self.env_runner_group
        new_episodes = group.drain_episodes()
        self._episodes.add(new_episodes)
        sampled = self.num_env_steps_sampled_lifetime - sampled0
        trained = self._env_steps_trained - trained0
        env_runners = self._episodes.result(len(new_episodes), sampled)
        timers = merge_timers([self._timers.drain()] + group.drain_timers())
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
                "learner_queue_size": group.queue_size(),
            },
            "fault_tolerance": group.fault_tolerance_metrics(),
        }

    def evaluate(self) -> dict:
        """``evaluation_duration`` episodes (or timesteps) with the current params.

        Runs in this thread on its own envs, with ``evaluation_config`` applied; it acts
        greedily unless that config sets ``explore=True``.
        """
        return self._evaluator.evaluate()

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

    def get_state(self) -> dict:
        learner, replay = self.learner.state_arrays()
        return {
            "learner": learner,
            "replay": replay,
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
        self.learner.load_state_arrays(state["learner"], state.get("replay"))
        c = state["counters"]
        self._iteration = c["training_iteration"]
        self._time_total = c["time_total_s"]
        self.env_runner_group.set_num_env_steps_sampled_lifetime(
            c["num_env_steps_sampled_lifetime"]
        )
        self._env_steps_trained = c["num_env_steps_trained_lifetime"]
        self._num_updates = c["num_updates_lifetime"]
        self._episodes.num_episodes_lifetime = c["num_episodes_lifetime"]
        self.env_runner_group.publish(self.learner.state.params)

    def save(self, path) -> str:
        state = self.get_state()
        arrays = {f"learner_{i:05d}": x for i, x in enumerate(state["learner"])}
        arrays.update({f"replay_{i:05d}": x for i, x in enumerate(state["replay"])})
        meta = {
            "format": checkpoint.FORMAT,
            "config": checkpoint.jsonable(self.config.to_dict()),
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

    def __enter__(self) -> IMPALA:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass
