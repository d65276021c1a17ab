"""``IMPALA.get_module()``: the policy for inference, with RLlib's RLModule method names.

RLlib's default IMPALA module maps ``{"obs": [B, ...]}`` to ``{"action_dist_inputs": [B, D]}``
in ``forward_inference`` and ``forward_exploration``, and adds ``vf_preds`` in ``forward_train``.
This one does the same on the newest published params, with numpy in and out; it also samples
(``compute_actions``) with the action distribution the runners use.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

DEFAULT_MODULE_ID = "default_policy"  # RLlib's DEFAULT_MODULE_ID


class Module:
    """A view of the current policy: it reads the ParamStore at each call, so it follows
    training (and ``set_weights`` / restores) without being fetched again."""

    def __init__(self, networks, distribution, param_store):
        self.networks = networks
        self.distribution = distribution
        self._param_store = param_store
        self._apply = jax.jit(networks.apply)
        self._sample = jax.jit(distribution.sample)

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
        dist_inputs = jax.numpy.asarray(self._forward(batch)[0])
        if explore:
            return np.asarray(self._sample(jax.random.key(seed), dist_inputs))
        return np.asarray(self.distribution.mode(dist_inputs))

    def get_state(self) -> dict:
        """The params as host numpy arrays (RLlib's ``RLModule.get_state()``: the weights)."""
        return jax.device_get(self._param_store.get()[0])
