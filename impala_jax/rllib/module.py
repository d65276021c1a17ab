"""The policy for inference: ``IMPALA.get_module()`` with RLlib's RLModule method names, and
the bodies of ``IMPALA.compute_actions`` / ``compute_single_action`` (`Actions`).

RLlib's default IMPALA module maps ``{"obs": [B, ...]}`` to ``{"action_dist_inputs": [B, D]}``
in ``forward_inference`` and ``forward_exploration``, and adds ``vf_preds`` in ``forward_train``.
This one does the same on the newest published params, with numpy in and out; it also samples
(``compute_actions``) with the action distribution the runners use.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import gymnasium as gym
import jax
import numpy as np

from impala_jax.core.policy import act

DEFAULT_MODULE_ID = "default_policy"  # RLlib's DEFAULT_MODULE_ID


class Module:
    """A view of the current policy: it reads the ParamStore at each call, so it follows
    training (and ``set_weights`` / restores) without being fetched again."""

    def __init__(self, networks, distribution, param_store):
        self.networks = networks
        self.distribution = distribution
        self._param_store = param_store
        self._apply = jax.jit(networks.apply)
        self._act = jax.jit(partial(act, networks, distribution), static_argnames="explore")

    @staticmethod
    def _obs(batch: Mapping) -> np.ndarray:
        if not isinstance(batch, Mapping) or "obs" not in batch:
            raise TypeError(
                "the module takes a batch dict {'obs': array [B, ...]}, as RLlib's RLModule "
                f"forward methods do; got {type(batch).__name__}."
            )
        return np.asarray(batch["obs"])

    def _forward(self, batch: Mapping) -> tuple[np.ndarray, np.ndarray]:
        params, _ = self._param_store.get()
        dist_inputs, values = self._apply(params, self._obs(batch))
        return np.asarray(dist_inputs), np.asarray(values)

    def forward_inference(self, batch: Mapping) -> dict:
        return {"action_dist_inputs": self._forward(batch)[0]}

    def forward_exploration(self, batch: Mapping) -> dict:
        return {"action_dist_inputs": self._forward(batch)[0]}

    def forward_train(self, batch: Mapping) -> dict:
        dist_inputs, values = self._forward(batch)
        return {"action_dist_inputs": dist_inputs, "vf_preds": values}

    def compute_values(self, batch: Mapping) -> np.ndarray:
        return self._forward(batch)[1]

    def compute_actions(self, batch: Mapping, explore: bool = False, seed: int = 0) -> np.ndarray:
        """Actions in the policy's space (Box actions before rescaling to the env's bounds):
        the distribution's mode, or a sample when ``explore``."""
        params, _ = self._param_store.get()
        action, _, _ = self._act(params, self._obs(batch), jax.random.key(seed), explore=explore)
        return np.asarray(action)

    def get_state(self) -> dict:
        """The params as host numpy arrays (RLlib's ``RLModule.get_state()``: the weights)."""
        return jax.device_get(self._param_store.get()[0])


class Actions:
    """Env actions from the runners' actor (``policy``: acting.policy.Policy) on the newest
    published params, mapped to the env's action space by ``adapter``; ``key`` starts the stream
    of exploration keys."""

    def __init__(self, policy, param_store, adapter, key):
        self._policy = policy
        self._param_store = param_store
        self._adapter = adapter
        self._key = key

    def _next_key(self):
        self._key, key = jax.random.split(self._key)
        return key

    def compute_actions(self, obs, explore: bool = False) -> np.ndarray:
        if self._policy.recurrent:
            raise ValueError(
                "compute_actions is for feedforward policies; a recurrent one (use_lstm) needs "
                "its state: compute_single_action(obs, state=..., prev_action=..., "
                "prev_reward=...), starting from get_initial_state()."
            )
        params, _ = self._param_store.get()
        obs = np.asarray(obs)
        if explore:
            action, _, _ = self._policy.act(params, obs, self._next_key())
        else:
            action, _ = self._policy.act_greedy(params, obs)
        action = np.asarray(action)
        return self._adapter(action, len(obs))

    def compute_single_action(
        self, obs, state=None, prev_action=None, prev_reward=None, explore: bool = False
    ):
        if not self._policy.recurrent:
            if state is not None or prev_action is not None or prev_reward is not None:
                raise ValueError(
                    "state / prev_action / prev_reward are for recurrent policies "
                    "(model_config use_lstm=True); this one is feedforward."
                )
            return self.compute_actions(np.asarray(obs)[None], explore=explore)[0]
        params, _ = self._param_store.get()
        state = self.initial_state() if state is None else state
        action_space = self._policy.action_space
        discrete = isinstance(action_space, gym.spaces.Discrete)
        if prev_action is None:
            prev_action = 0 if discrete else np.zeros(action_space.shape, np.float32)
        prev_action = np.asarray(prev_action, np.int32 if discrete else np.float32)
        carry = (
            jax.tree.map(lambda x: np.asarray(x)[None], state),
            prev_action[None],
            np.asarray([prev_reward or 0.0], np.float32),
            np.zeros(1, bool),
        )
        obs = np.asarray(obs)[None]
        if explore:
            action, dist_inputs, _, state_out = self._policy.act(
                params, obs, self._next_key(), carry
            )
        else:
            action, dist_inputs, state_out = self._policy.act_greedy(params, obs, carry)
        action = self._adapter(np.asarray(action), 1)[0]
        state_out = jax.tree.map(lambda x: np.asarray(x)[0], state_out)
        return action, state_out, {"action_dist_inputs": np.asarray(dist_inputs)[0]}

    def module(self) -> Module:
        """The policy as a `Module` (feedforward policies only)."""
        if self._policy.recurrent:
            raise ValueError(
                "get_module() serves feedforward policies (forward_inference on observations "
                "alone); a recurrent one (use_lstm) acts through compute_single_action(obs, "
                "state=..., prev_action=..., prev_reward=...) from get_initial_state()."
            )
        return Module(self._policy.networks, self._policy.distribution, self._param_store)

    def initial_state(self):
        """A recurrent policy's state for one env at an episode's start; ``{}`` for a
        feedforward policy."""
        if not self._policy.recurrent:
            return {}
        return jax.tree.map(lambda x: x[0], self._policy.act.initial_state(1))
