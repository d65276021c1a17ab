"""Several seeds of one on-device run side by side, in one compiled program.

``SeedGroup(config, seeds=[0, 1, 2, 3])`` for an env written in JAX (``"gymnax:<id>"``, a gymnax
``Environment``) is the device engine (runtime/ondevice/device_engine.py) over a member axis: every
seed's learner state, replay slots, envs and acting params carry a leading seed axis, and one
dispatch of one compiled program trains all seeds, each from what ``debugging(seed=s)`` gives a run
alone (its learner key, its envs' keys). ``train()`` is ``IMPALA``'s iteration loop
(rllib/training_loop.py) and returns one result per seed, with ``IMPALA.train()``'s keys and a
``seed`` key. For many seeds of a small problem; checkpoints and evaluation are ``IMPALA``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from impala_jax.rllib import specs
from impala_jax.rllib.module import DEFAULT_MODULE_ID
from impala_jax.rllib.training_loop import TrainingLoop
from impala_jax.runtime.acting.policy import make_policy
from impala_jax.runtime.envs.env_registry import is_jax_env, make_jax_env
from impala_jax.runtime.learning import parallel
from impala_jax.runtime.learning.learner import Learner, run_keys
from impala_jax.runtime.ondevice.device_engine import DeviceEngine


class SeedGroup(TrainingLoop):
    """``len(seeds)`` runs of ``config`` trained together on device; see the module docstring."""

    def __init__(self, config, seeds: Sequence[int]):
        seeds = [int(s) for s in seeds]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"SeedGroup(seeds={seeds!r}): expected distinct ints, at least one.")
        if not is_jax_env(config.env, config.env_config):
            raise ValueError(
                f"SeedGroup: environment(env={config.env!r}) steps on the host; seeds side by "
                "side need an env written in JAX ('gymnax:<id>' or a gymnax Environment). Run one "
                "IMPALA per seed."
            )
        config = config.copy()
        config.validate()
        config.freeze()
        self.config, self.seeds = config, seeds
        env = make_jax_env(config.env, config.env_config)
        devices, local = parallel.learner_devices(config.num_learners)
        spaces = (env.observation_space, env.action_space)
        policy = make_policy(specs.policy_spec(config), *spaces, local[0])
        step = specs.step_spec(config, len(devices))
        keys = [run_keys(s)[0] for s in seeds]  # each seed's learner key, as IMPALA's
        optimizer, loss = specs.optimizer_spec(config), specs.loss_spec(config)
        nets = (policy.networks, policy.distribution)
        learner = Learner(*nets, optimizer, loss, step, devices, keys[0], initial_state=False)
        dtype = policy.action_dtype(learner.abstract_state.params)
        T = config.get_rollout_fragment_length()
        learner.init_group(keys, policy.example_batch(T, step.columns, dtype))
        spec = specs.device_spec(config)
        engine = DeviceEngine(spec, env, policy, learner, local[0], seeds, grouped=True)
        self._init_loop(engine, learner)

    def train(self) -> list[dict]:
        """One iteration of every seed (``IMPALA.train()``'s stop rule): a result per seed."""
        results = self._iterate()
        for seed, result in zip(self.seeds, results, strict=True):
            result["seed"] = seed
        return results

    def get_weights(self, seed: int) -> dict:
        """``{"default_policy": params}`` of one seed of the group, as host arrays."""
        if seed not in self.seeds:
            raise KeyError(f"get_weights({seed!r}): the group's seeds are {self.seeds}.")
        i = self.seeds.index(seed)
        params = jax.tree.map(lambda x: x[i], jax.device_get(self.learner.state.params))
        return {DEFAULT_MODULE_ID: params}

    def stop(self) -> None:
        """Releases the group's device arrays; idempotent."""
        if self.engine is not None:
            self.engine.stop()
        self.engine = self.learner = None
