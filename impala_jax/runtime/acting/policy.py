"""The policy the runners act with: its networks, which actor runs them, and the batch the
learner compiles for.

The networks come from the network factory (``rl_module_spec``'s ``factory``, Brax's
``network_factory``, resolved by network_factory.py): None for impala_jax's own
(``core.networks.make_networks``, or ``core.recurrent.make_recurrent_networks`` when
``model_config["use_lstm"]``), a callable
``factory(model_config, observation_space, action_space) -> Networks``, or its import path
``"pkg.mod:fn"``. Three actors can run them: the jitted JAX act, the NumPy host actor
(host_actor.py, which mirrors impala_jax's own MLP only) and the recurrent actor of an LSTM
policy. ``PolicySpec`` holds what this takes from the config (rllib/specs.py builds it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import jax
import numpy as np

from impala_jax.core.distributions import make_distribution
from impala_jax.core.networks import make_networks
from impala_jax.core.policy import RecurrentActor, initial_carry, make_act_fns
from impala_jax.core.recurrent import make_recurrent_networks, num_chunks
from impala_jax.core.types import Trajectory, empty_trajectory
from impala_jax.runtime.acting.host_actor import (
    AUTO_MAX_MACS,
    HostActor,
    act_macs,
    host_actor_unsupported,
)
from impala_jax.runtime.acting.network_factory import resolve_factory


def make_policy_networks(factory: Any, model_config, observation_space, action_space):
    """The policy's networks: from the factory ``factory`` names, else impala_jax's own."""
    custom = resolve_factory(factory)
    if custom is not None:
        return custom(model_config, observation_space, action_space)
    if model_config["use_lstm"]:
        return make_recurrent_networks(model_config, observation_space, action_space)
    return make_networks(model_config, observation_space, action_space)


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """The config fields the policy and the choice of its actor depend on, by their names."""

    model_config: Mapping[str, Any]  # a full one: every DefaultModelConfig key set
    inference_backend: str  # "auto", "jax" or "numpy"
    num_envs_per_env_runner: int  # the rows each act call takes
    network_factory: Any = None  # the rl_module_spec's factory (network_factory.py); None: ours


def use_host_actor(
    spec: PolicySpec, actor_device, observation_space, distribution, custom: bool
) -> bool:
    """Whether the runners act with NumPy (host_actor.py): ``inference_backend``. A custom
    network factory's networks always run as the jitted act."""
    backend = spec.inference_backend
    if backend == "jax":
        return False
    if custom:
        reason = "the networks come from a custom network factory (rl_module_spec)"
    else:
        reason = host_actor_unsupported(spec.model_config, observation_space, distribution)
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
    envs = spec.num_envs_per_env_runner
    macs = act_macs(spec.model_config, observation_space, distribution.param_size, envs)
    return actor_device.platform == "cpu" and macs <= AUTO_MAX_MACS


@dataclasses.dataclass(frozen=True)
class Policy:
    """The policy's networks and action distribution, and the actor that runs them:
    ``act(params, obs, key[, carry])`` and ``act_greedy(params, obs[, carry])``."""

    networks: Any
    distribution: Any
    act: Callable
    act_greedy: Callable
    observation_space: gym.Space
    action_space: gym.Space
    recurrent: bool  # model_config use_lstm: the actors carry a state (core.recurrent)
    custom: bool  # built by a user's network factory

    @property
    def host_actor(self) -> bool:
        """Whether the NumPy actor runs (it holds one BLAS thread: host_actor.py)."""
        return isinstance(self.act, HostActor)

    def action_dtype(self, params) -> np.dtype:
        """The dtype of the policy's actions, from its abstract evaluation (no compilation);
        ``params`` may be shapes alone."""
        space = self.observation_space
        obs = jax.ShapeDtypeStruct((1, *space.shape), space.dtype)
        key = jax.random.key(0)
        if self.recurrent:
            carry = initial_carry(self.act, 1, self.action_space)
            return jax.eval_shape(self.act, params, obs, key, carry)[0].dtype
        act = self.act.jitted if isinstance(self.act, HostActor) else self.act
        return jax.eval_shape(act, params, obs, key)[0].dtype

    def example_batch(self, T: int, columns: int, action_dtype) -> Trajectory:
        """Zeros shaped and typed like one learner batch of ``columns`` rollouts of length
        ``T``, to compile the learner step early."""
        B, space = columns, self.action_space
        action_shape = () if isinstance(space, gym.spaces.Discrete) else space.shape
        recurrent = {}
        if self.recurrent:
            recurrent = dict(
                core_state=self.act.initial_state(B),
                chunks=num_chunks(T, self.networks.max_seq_len),
            )
        return empty_trajectory(
            T,
            jax.ShapeDtypeStruct((B, *self.observation_space.shape), self.observation_space.dtype),
            jax.ShapeDtypeStruct((B, *action_shape), action_dtype),
            jax.ShapeDtypeStruct((B, self.networks.dist_size), np.float32),
            **recurrent,
        )


def make_policy(spec: PolicySpec, observation_space, action_space, actor_device) -> Policy:
    """The networks ``spec.network_factory`` builds for ``spec.model_config`` and the spaces, and
    the actor that runs them on ``actor_device`` (``inference_backend``: jitted JAX or NumPy)."""
    model_config = spec.model_config
    distribution = make_distribution(action_space, model_config)
    factory = resolve_factory(spec.network_factory)
    custom = factory is not None
    host = use_host_actor(spec, actor_device, observation_space, distribution, custom)
    networks = make_policy_networks(factory, model_config, observation_space, action_space)
    recurrent = bool(model_config["use_lstm"])
    if recurrent:
        actor = RecurrentActor(networks, distribution, networks.max_seq_len)
        act, act_greedy = actor, actor.greedy
    else:
        act, act_greedy = make_act_fns(networks, distribution)
        if host:
            actor = HostActor(model_config, observation_space, distribution, act)
            act, act_greedy = actor, actor.greedy
    return Policy(
        networks, distribution, act, act_greedy, observation_space, action_space, recurrent, custom
    )
