"""The model_config defaults and the names they may take; imported by the config and networks.

Plain constants, no JAX: `impala_jax.config` must stay importable without starting JAX. Each key
is explained in ``docs/config.md`` (the ``.rl_module()`` table).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

__all__ = ["ACTIVATIONS", "DEFAULT_MODEL_CONFIG", "ENCODERS"]

# RLlib's DefaultModelConfig keys and defaults, plus impala_jax's two encoder keys (marked).
DEFAULT_MODEL_CONFIG: Mapping[str, Any] = types.MappingProxyType(
    {
        "fcnet_hiddens": [256, 256],  # MLP encoder layer sizes
        "fcnet_activation": "tanh",
        "fcnet_use_layernorm": False,
        "conv_filters": None,  # None: the encoder's own layers; else [[out, kernel, stride], ...]
        "conv_activation": "relu",
        "head_fcnet_hiddens": [],  # hidden layers of the policy and value heads
        "head_fcnet_activation": "relu",
        "free_log_std": False,  # Gaussian actions: state-independent log-std parameter
        "log_std_clip_param": 20.0,
        "vf_share_layers": True,  # policy and value share the encoder
        "use_lstm": False,  # accepted for RLlib's sake; True is rejected (no LSTM yet)
        "max_seq_len": 20,
        "lstm_cell_size": 256,
        "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False,
        # impala_jax: "auto" = "mlp" for 1-D observations, "nature_cnn" for images.
        "encoder": "auto",
        # impala_jax: channels of the paper's deep ResNet ("impala_cnn"), one stack per entry.
        "impala_cnn_channels": [16, 32, 32],
    }
)
ENCODERS = ("auto", "mlp", "nature_cnn", "impala_cnn")
ACTIVATIONS = ("tanh", "relu", "swish", "silu", "elu", "sigmoid", "linear", None)  # any case
