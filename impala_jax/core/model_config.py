"""The model_config defaults and the names they may take; imported by the config and networks.

Plain constants, no JAX: `impala_jax.rllib.config` must stay importable without starting JAX.
Each key is explained in ``docs/config.md`` (the ``.rl_module()`` table).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ACTIVATIONS",
    "BIAS_INITIALIZERS",
    "DEFAULT_MODEL_CONFIG",
    "ENCODERS",
    "INITIALIZER_KWARGS",
    "INITIALIZER_PREFIXES",
    "canonical_initializer",
]

# Every field of RLlib 2.60's DefaultModelConfig with its default, plus impala_jax's two encoder
# keys (marked). The initializer keys: None = impala_jax's own init (see networks.py).
DEFAULT_MODEL_CONFIG: Mapping[str, Any] = types.MappingProxyType(
    {
        "fcnet_hiddens": [256, 256],  # MLP encoder layer sizes
        "fcnet_activation": "tanh",
        "fcnet_kernel_initializer": None,  # MLP encoder weights
        "fcnet_kernel_initializer_kwargs": None,
        "fcnet_bias_initializer": None,
        "fcnet_bias_initializer_kwargs": None,
        "fcnet_use_layernorm": False,
        "conv_filters": None,  # None: the encoder's own layers; else [[out, kernel, stride], ...]
        "conv_activation": "relu",
        "conv_kernel_initializer": None,  # CNN encoder weights (convs and its dense layer)
        "conv_kernel_initializer_kwargs": None,
        "conv_bias_initializer": None,
        "conv_bias_initializer_kwargs": None,
        "head_fcnet_hiddens": [],  # hidden layers of the policy and value heads
        "head_fcnet_activation": "relu",
        "head_fcnet_kernel_initializer": None,  # every layer of both heads
        "head_fcnet_kernel_initializer_kwargs": None,
        "head_fcnet_bias_initializer": None,
        "head_fcnet_bias_initializer_kwargs": None,
        "head_fcnet_use_layernorm": False,  # LayerNorm after each hidden head layer
        "free_log_std": False,  # Gaussian actions: state-independent log-std parameter
        "log_std_clip_param": 20.0,
        "vf_share_layers": True,  # policy and value share the encoder
        "use_lstm": False,  # True: an LSTM core between encoder and heads (recurrent.py)
        "max_seq_len": 20,
        "lstm_cell_size": 256,
        "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False,
        "lstm_kernel_initializer": None,
        "lstm_kernel_initializer_kwargs": None,
        "lstm_bias_initializer": None,
        "lstm_bias_initializer_kwargs": None,
        # RLlib's network that fuses the encoders of multi-part observations; there is none
        # here, so only the defaults are accepted.
        "fusionnet_hiddens": [256, 256],
        "fusionnet_activation": "tanh",
        "fusionnet_kernel_initializer": None,
        "fusionnet_kernel_initializer_kwargs": None,
        "fusionnet_bias_initializer": None,
        "fusionnet_bias_initializer_kwargs": None,
        # RLlib's old-stack ModelConfig keys, which its tuned examples still pass (Pong):
        # dense layers after the encoder, shared by the policy and value heads. None: a CNN
        # encoder's own dense layer (Nature 512, IMPALA 256), nothing after the MLP; a list
        # replaces a CNN's own (networks.py `_make_encoder`).
        "post_fcnet_hiddens": None,
        "post_fcnet_activation": "relu",
        # impala_jax: "auto" = "mlp" for 1-D observations, "nature_cnn" for images.
        "encoder": "auto",
        # impala_jax: channels of the paper's deep ResNet ("impala_cnn"), one stack per entry.
        "impala_cnn_channels": [16, 32, 32],
    }
)
ENCODERS = ("auto", "mlp", "nature_cnn", "impala_cnn")
ACTIVATIONS = ("tanh", "relu", "swish", "silu", "elu", "sigmoid", "linear", None)  # any case
INITIALIZER_PREFIXES = ("fcnet", "conv", "head_fcnet", "lstm", "fusionnet")

# Initializer names RLlib passes to torch.nn.init (with its trailing "_") or to
# tf.keras.initializers (snake_case or CamelCase), and the keyword arguments each takes in that
# framework; networks.py maps them onto jax.nn.initializers with the same distribution.
INITIALIZER_KWARGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        # torch.nn.init
        "xavier_uniform": ("gain",),
        "xavier_normal": ("gain",),
        "kaiming_uniform": ("a", "mode", "nonlinearity"),
        "kaiming_normal": ("a", "mode", "nonlinearity"),
        "orthogonal": ("gain",),
        "normal": ("mean", "std"),
        "uniform": ("a", "b"),
        "trunc_normal": ("mean", "std", "a", "b"),
        "constant": ("val", "value"),  # torch's val, tf's value
        "zeros": (),
        "ones": (),
        # tf.keras.initializers
        "glorot_uniform": (),
        "glorot_normal": (),
        "he_uniform": (),
        "he_normal": (),
        "lecun_uniform": (),
        "lecun_normal": (),
        "random_normal": ("mean", "stddev"),
        "random_uniform": ("minval", "maxval"),
        "truncated_normal": ("mean", "stddev"),
        "variance_scaling": ("scale", "mode", "distribution"),
    }
)
# Initializers that need no fan (defined for 1-D bias vectors, as in torch and tf).
BIAS_INITIALIZERS = (
    "normal",
    "uniform",
    "trunc_normal",
    "constant",
    "zeros",
    "ones",
    "random_normal",
    "random_uniform",
    "truncated_normal",
)
_ALIASES = {"zero": "zeros", "one": "ones"}


def canonical_initializer(name: str) -> str | None:
    """The key of INITIALIZER_KWARGS for a torch or tf initializer name, or None if unknown.

    "xavier_uniform_" (torch, in-place), "GlorotUniform" and "glorot_uniform" (tf) all resolve;
    RLlib itself insists on torch's trailing "_" with framework torch, impala_jax takes both.
    """
    if not isinstance(name, str):
        return None
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    snake = snake.rstrip("_").lower()
    snake = _ALIASES.get(snake, snake)
    return snake if snake in INITIALIZER_KWARGS else None
