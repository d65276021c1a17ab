"""Several seeds of one on-device run side by side, in one compiled program.

``SeedGroup(config, seeds=[0, 1, 2, 3])`` for an env written in JAX (``"gymnax:<id>"``): every
seed's learner state, replay slots, envs and acting params carry a leading seed axis, and each
step is the on-device program of ``IMPALA`` (runtime/device_runner.py) mapped over that axis
(``jax.vmap``): one dispatch and one compiled program train all seeds, each from what
``debugging(seed=s)`` gives a run alone (its learner key, its envs' keys). ``train()`` returns one
result per seed, with ``IMPALA.train()``'s keys and a ``seed`` key. It is for studies that run
many seeds of a small problem (a learning curve with its spread, a sweep's repeats); a run's
checkpoints, evaluation and callbacks are ``IMPALA``'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from impala_jax.core import optim
from impala_jax.core.types import LEARNER_AXIS
from impala_jax.rllib import specs
from impala_jax.runtime import acting, parallel
from impala_jax.runtime.device_runner import (
    acting_ring,
    device_program,
    device_rollout,
    ended_episodes,
    initial_envs,
    rollout_description,
    rollout_plan,
)
from impala_jax.runtime.jax_envs import is_jax_env, make_jax_env
from impala_jax.runtime.learner import Learner
from impala_jax.runtime.metrics import EpisodeStats, train_result, trainable_info

_SPLIT = P(None, LEARNER_AXIS)  # [S, B or slots, ...]: seeds whole, the batch axis split


class SeedGroup:
    """``len(seeds)`` runs of ``config`` trained together on device; see the module docstring."""

    def __init__(self, config, seeds: Sequence[int]):
        seeds = [int(s) for s in seeds]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"SeedGroup(seeds={seeds!r}): expected distinct ints, at least one.")
        if not is_jax_env(config.env):
            raise ValueError(
                f"SeedGroup: environment(env={config.env!r}) steps on the host; seeds side by "
                "side need an env written in JAX ('gymnax:<id>'). Run one IMPALA per seed."
            )
        config = config.copy()
        config.validate()
        config.freeze()
        self.config, self.seeds = config, seeds
        env = make_jax_env(config.env, config.env_config)
        devices, local = parallel.learner_devices(config.num_learners)
        factory = getattr(config.get_default_rl_module_spec(), "factory", None)
        policy = acting.make_policy(
            config, env.observation_space, env.action_space, local[0], factory
        )
        self.step_spec = specs.step_spec(config, len(devices))
        # IMPALA's keys per seed: the learner's from the seed's split, the envs' from the seed.
        learner_keys = [jax.random.split(jax.random.key(s))[0] for s in seeds]
        self._learner = learner = Learner(
            policy.networks,
            policy.distribution,
            specs.optimizer_spec(config),
            specs.loss_spec(config),
            self.step_spec,
            devices,
            learner_keys[0],
            initial_state=False,  # the seeds' states are made below, all in one program
        )
        replicated = jax.sharding.NamedSharding(learner.mesh, parallel.REPLICATED)
        init = jax.jit(jax.vmap(learner.init_state), out_shardings=(replicated, None))
        self._state, replay_keys = init(jax.numpy.stack(learner_keys))
        self.num_envs, self._rollouts, self.env_steps_per_update = rollout_plan(config, learner)
        self._T = config.get_rollout_fragment_length()
        carries = [initial_envs(env, s, 0, self.num_envs) for s in seeds]
        self._carry = parallel.put(_stack(carries), learner.mesh, _SPLIT, may_alias=False)
        self._replay = ()
        if self.step_spec.replay_columns:
            action_dtype = policy.action_dtype(learner.abstract_state.params)
            example = policy.example_batch(self._T, self.step_spec.columns, action_dtype)
            slots = [learner.replay_slots(k, example) for k in replay_keys]
            self._replay = parallel.put(_stack(slots), learner.mesh, _SPLIT, may_alias=False)
        self._lag = config.policy_lag or 0
        self._ring = acting_ring(self._state.params, self._lag, seeds=True)
        rollout = device_rollout(config, env, policy)
        self._program = device_program(
            rollout,
            learner,
            self._rollouts,
            self._lag,
            seeds=True,
            description=rollout_description(config, env),
        )
        self._episodes = [EpisodeStats(config.metrics_num_episodes_for_smoothing) for _ in seeds]
        self._pending: list = []
        self._updates = 0
        self._iteration = 0
        self._time_total = 0.0
        self._num_parameters = sum(
            int(np.prod(x.shape)) for x in jax.tree.leaves(learner.abstract_state.params)
        )

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps of each seed (all seeds step together)."""
        return self._updates * self.env_steps_per_update

    def _update(self) -> dict:
        sampled = optim.env_steps_operand(
            self.num_env_steps_sampled_lifetime + self.env_steps_per_update
        )
        out = self._program(self._state, self._replay, self._carry, self._ring, sampled)
        self._state, self._replay, self._carry, self._ring, metrics, episodes = out
        self._pending.append(episodes)
        self._updates += 1
        return metrics

    def train(self) -> list[dict]:
        """One iteration of every seed (``min_time_s_per_iteration`` and
        ``min_sample_timesteps_per_iteration`` as in ``IMPALA.train()``): a result per seed."""
        cfg, started = self.config, time.perf_counter()
        sampled0, updates0 = self.num_env_steps_sampled_lifetime, self._updates
        lags = []
        while True:
            lags.append(min(self._lag, self._updates))
            metrics = self._update()
            elapsed = time.perf_counter() - started
            sampled = self.num_env_steps_sampled_lifetime - sampled0
            if elapsed >= (cfg.min_time_s_per_iteration or 0) and sampled >= (
                cfg.min_sample_timesteps_per_iteration or 0
            ):
                break
        metrics = jax.device_get(metrics)
        episodes, self._pending = jax.device_get(self._pending), []
        elapsed = time.perf_counter() - started
        self._iteration += 1
        self._time_total += elapsed
        updates = self._updates - updates0
        columns = self.step_spec.columns * self._learner.num_devices
        trained_per_update = (
            columns + self.step_spec.replay_columns * self._learner.num_devices
        ) * self._T
        results = []
        for i, seed in enumerate(self.seeds):
            new = ended_episodes(episodes, seed=i)
            self._episodes[i].add(new)
            learner = {k: float(np.asarray(v)[i]) for k, v in metrics.items()}
            result = train_result(
                env_runners=self._episodes[i].result(len(new), sampled),
                episode_metrics={},
                learner=learner,
                timers={},
                lag=np.repeat(np.asarray(lags, np.int32), columns),
                sampled=sampled,
                trained=updates * trained_per_update,
                elapsed=elapsed,
                num_env_steps_sampled_lifetime=self.num_env_steps_sampled_lifetime,
                num_env_steps_trained_lifetime=self._updates * trained_per_update,
                num_updates_lifetime=self._updates,
                num_episodes_lifetime=self._episodes[i].num_episodes_lifetime,
                num_trainable_parameters=self._num_parameters,
                num_training_step_calls=updates,
                training_iteration=self._iteration,
                time_total_s=self._time_total,
                batch_size_per_learner=self.step_spec.columns * self._T,
                total_batch_size=columns * self._T,
                learner_queue_size=0,
                sys_usage={},
                fault_tolerance={},
                trainable=trainable_info(self._iteration, self._time_total, {}),
            )
            result["seed"] = seed
            results.append(result)
        return results

    def get_weights(self, seed: int) -> dict:
        """``{"default_policy": params}`` of one seed of the group, as host arrays."""
        if seed not in self.seeds:
            raise KeyError(f"get_weights({seed!r}): the group's seeds are {self.seeds}.")
        i = self.seeds.index(seed)
        params = jax.tree.map(lambda x: x[i], jax.device_get(self._state.params))
        return {"default_policy": params}

    def stop(self) -> None:
        """Releases the group's device arrays; idempotent."""
        self._state = self._replay = self._carry = self._ring = None
        self._pending = []

    def __enter__(self) -> SeedGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _stack(trees: list):
    """``trees`` stacked on a new leading (seed) axis."""
    return jax.tree.map(lambda *xs: jax.numpy.stack(xs), *trees)
