"""Policy and value networks: `make_networks(model_config, obs_space, action_space)` -> init/apply.

Actors and the learner use only the returned `Networks(init, apply, dist_size)`:

- `init(key) -> params`, a plain dict with top-level keys
    "encoder"     the observation encoder (shared by policy and value when `vf_share_layers`),
    "pi"          the policy head, including the free `log_std` when `free_log_std`,
    "vf"          the value head,
    "vf_encoder"  the value function's own encoder, only when `vf_share_layers=False`.
  Every value-function parameter sits under a top-level key starting with "vf", and nothing else
  does: optim.py's separate vf optimizer (`_separate_vf_optimizer`) relies on that.
- `apply(params, obs [N, *obs_shape]) -> (dist_inputs [N, P], value [N])`, float32; P is
  `dist_size`: n logits for Discrete(n), mean and log_std concatenated ([mean | log_std], 2A) for
  a 1-D Box(A).

`model_config` takes RLlib's DefaultModelConfig keys (missing ones get RLlib's defaults) and
impala_jax's `encoder` ("auto" | "mlp" | "nature_cnn" | "impala_cnn") and `impala_cnn_channels`.
The `*_kernel_initializer` / `*_bias_initializer` keys take RLlib's names (torch.nn.init's, e.g.
"xavier_uniform_", or tf.keras.initializers', e.g. "GlorotUniform") with that framework's
keyword arguments in `*_initializer_kwargs` (initializers.py), or a JAX initializer
`init(key, shape, dtype)`; None keeps impala_jax's own init (below). `fcnet_*` set the MLP
encoder, `conv_*` every layer of the CNN encoders, `head_fcnet_*` every layer of the policy and
value heads.

Observations:
- uint8 input is cast to float32 and divided by 255 inside the network, so actors can ship raw
  uint8 frames (4x less host->device traffic); any other dtype is cast to float32 unscaled.
- Image observations (3-D Box) may be channel-first, as envpool's Atari (4, 84, 84) stacks are.
  Rule: the shape is channel-first when its first dim is <= 4 and its last dim is > 4 (a frame
  stack or colour depth of at most 4 in front of an image side); it is then transposed to NHWC.
- Discrete(n) observations are one-hot encoded and go through the MLP.
- `encoder="auto"` gives a 3-D Box the Nature CNN and flattens any other Box (a vector, or a
  2-D grid such as bsuite's Catch and DeepSea boards) for the MLP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from impala_jax.core.initializers import Initializer, make_initializer

# RLlib's DefaultModelConfig keys plus impala_jax's own: one table, documented in docs/config.md.
from impala_jax.core.model_config import (
    BIAS_INITIALIZERS,
    DEFAULT_MODEL_CONFIG,
    ENCODERS,
    canonical_initializer,
)

Params = dict[str, Any]

# Nature DQN's conv stack (Mnih et al. 2015, Methods): [out_channels, kernel, stride], VALID.
NATURE_CONV_FILTERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
NATURE_DENSE = 512
# IMPALA deep network (Espeholt et al. 2018, fig. 3, right): its final dense layer.
IMPALA_DENSE = 256

_ACTIVATIONS: dict[str | None, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": nn.relu,
    "elu": nn.elu,
    "swish": nn.swish,
    "silu": nn.silu,
    "sigmoid": nn.sigmoid,
    "linear": lambda x: x,
    None: lambda x: x,
}

# Orthogonal init with gain sqrt(2) for hidden layers, 0.01 for the policy output and 1.0 for the
# value output, zero biases: the customary choice for actor-critic agents (cleanrl's PPO/IMPALA
# scripts; Andrychowicz et al. 2021, "What matters in on-policy RL", found the small policy
# output scale important because the initial policy is then near uniform / zero-mean).
_HIDDEN_INIT = nn.initializers.orthogonal(np.sqrt(2.0))
_PI_INIT = nn.initializers.orthogonal(0.01)
_VF_INIT = nn.initializers.orthogonal(1.0)
_BIAS_INIT = nn.initializers.zeros


class Inits(NamedTuple):
    """The initializers of one part of the network (encoder or heads)."""

    kernel: Initializer = _HIDDEN_INIT  # hidden layers
    bias: Initializer = _BIAS_INIT
    pi_out: Initializer = _PI_INIT  # heads only: the output layers
    vf_out: Initializer = _VF_INIT


class Networks(NamedTuple):
    """What actors and the learner import: see the module docstring for the contract."""

    init: Callable[[jax.Array], Params]
    apply: Callable[..., tuple]  # apply(params, obs, with_features=False) -> (dist, value[, f])
    dist_size: int


def _activation(name: str | None, field: str) -> Callable[[jax.Array], jax.Array]:
    key = name.lower() if isinstance(name, str) else name
    if key not in _ACTIVATIONS:
        known = sorted(k for k in _ACTIVATIONS if k is not None)
        raise ValueError(f"{field}={name!r} is not a known activation; use one of {known}.")
    return _ACTIVATIONS[key]


class MLP(nn.Module):
    """Dense layers, each Dense -> [LayerNorm] -> activation (RLlib's MLP ordering)."""

    hiddens: Sequence[int]
    activation: Callable[[jax.Array], jax.Array]
    use_layernorm: bool = False
    inits: Inits = Inits()

    @nn.compact
    def __call__(self, x):
        for size in self.hiddens:
            x = nn.Dense(size, kernel_init=self.inits.kernel, bias_init=self.inits.bias)(x)
            if self.use_layernorm:
                x = nn.LayerNorm()(x)
            x = self.activation(x)
        return x


class PostLayers(nn.Module):
    """An encoder followed by RLlib's old-stack ``post_fcnet_hiddens`` dense layers."""

    encoder: nn.Module
    post: nn.Module

    def __call__(self, x):
        return self.post(self.encoder(x))


class NatureCNN(nn.Module):
    """Mnih et al. 2015: convs, flatten, then the dense layers `dense` (Nature's: one of 512);
    input NHWC float.

    `conv_filters`: (out_channels, (kh, kw), (sh, sw), padding) per layer; see `conv_layers`.
    `dense`: the layer sizes after the flatten, each with `dense_activation` and `dense_inits`
    (None: the convs' activation and initializers); empty: the flattened convs are the features.
    """

    conv_filters: Sequence[tuple]
    activation: Callable[[jax.Array], jax.Array]
    inits: Inits = Inits()
    dense: Sequence[int] = (NATURE_DENSE,)
    dense_activation: Callable[[jax.Array], jax.Array] | None = None
    dense_inits: Inits | None = None

    @nn.compact
    def __call__(self, x):
        kernel_init, bias_init = self.inits.kernel, self.inits.bias
        for out_channels, kernel, stride, padding in self.conv_filters:
            x = nn.Conv(
                out_channels,
                kernel,
                strides=stride,
                padding=padding,
                kernel_init=kernel_init,
                bias_init=bias_init,
            )(x)
            x = self.activation(x)
        x = x.reshape((x.shape[0], -1))
        return _dense_layers(
            x, self.dense, self.dense_activation or self.activation, self.dense_inits or self.inits
        )


def _dense_layers(x, sizes: Sequence[int], activation, inits: Inits):
    """The CNN encoders' dense layers after the flatten (inside a compact module)."""
    for size in sizes:
        x = activation(nn.Dense(size, kernel_init=inits.kernel, bias_init=inits.bias)(x))
    return x


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 SAME convs keeping the channel count."""

    inits: Inits = Inits()

    @nn.compact
    def __call__(self, x):
        channels, k, b = x.shape[-1], self.inits.kernel, self.inits.bias
        y = nn.relu(x)
        y = nn.Conv(channels, (3, 3), padding="SAME", kernel_init=k, bias_init=b)(y)
        y = nn.relu(y)
        y = nn.Conv(channels, (3, 3), padding="SAME", kernel_init=k, bias_init=b)(y)
        return x + y


class ImpalaCNN(nn.Module):
    """Espeholt et al. 2018, fig. 3 (right): per channel count a 3x3 conv, a 3x3 stride-2 max-pool
    and two residual blocks; then relu, flatten and the dense layers `dense` (the paper's: one
    of 256, relu). Input NHWC float."""

    channels: Sequence[int]
    inits: Inits = Inits()
    dense: Sequence[int] = (IMPALA_DENSE,)  # as NatureCNN's; the paper's activation is relu
    dense_activation: Callable[[jax.Array], jax.Array] | None = None
    dense_inits: Inits | None = None

    @nn.compact
    def __call__(self, x):
        k, b = self.inits.kernel, self.inits.bias
        for channels in self.channels:
            x = nn.Conv(channels, (3, 3), padding="SAME", kernel_init=k, bias_init=b)(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = ResidualBlock(self.inits)(x)
            x = ResidualBlock(self.inits)(x)
        x = nn.relu(x)
        x = x.reshape((x.shape[0], -1))
        return _dense_layers(
            x, self.dense, self.dense_activation or nn.relu, self.dense_inits or self.inits
        )


class PolicyHead(nn.Module):
    """head_fcnet_hiddens MLP, then a linear layer to the distribution inputs.

    For a Box action space the output is [mean | log_std]; with `free_log_std` the log_std is a
    state-independent parameter (init 0, i.e. std 1) and the layer outputs only the mean. The
    log_std is clipped to [-log_std_clip_param, log_std_clip_param], as RLlib's heads do.
    """

    hiddens: Sequence[int]
    activation: Callable[[jax.Array], jax.Array]
    num_outputs: int
    gaussian: bool
    free_log_std: bool
    log_std_clip: float | None
    use_layernorm: bool = False
    inits: Inits = Inits()

    @nn.compact
    def __call__(self, x):
        x = MLP(self.hiddens, self.activation, self.use_layernorm, self.inits)(x)
        out_init, bias_init = self.inits.pi_out, self.inits.bias
        if not self.gaussian:
            return nn.Dense(self.num_outputs, kernel_init=out_init, bias_init=bias_init)(x)
        if self.free_log_std:
            mean = nn.Dense(self.num_outputs, kernel_init=out_init, bias_init=bias_init)(x)
            log_std = self.param("log_std", nn.initializers.zeros, (self.num_outputs,))
            log_std = jnp.broadcast_to(log_std, mean.shape)
        else:
            out = nn.Dense(2 * self.num_outputs, kernel_init=out_init, bias_init=bias_init)(x)
            mean, log_std = jnp.split(out, 2, axis=-1)
        if self.log_std_clip is not None:
            log_std = jnp.clip(log_std, -self.log_std_clip, self.log_std_clip)
        return jnp.concatenate([mean, log_std], axis=-1)


class ValueHead(nn.Module):
    """head_fcnet_hiddens MLP, then a linear layer to one value, squeezed to [N]."""

    hiddens: Sequence[int]
    activation: Callable[[jax.Array], jax.Array]
    use_layernorm: bool = False
    inits: Inits = Inits()

    @nn.compact
    def __call__(self, x):
        x = MLP(self.hiddens, self.activation, self.use_layernorm, self.inits)(x)
        out = nn.Dense(1, kernel_init=self.inits.vf_out, bias_init=self.inits.bias)
        return out(x)[:, 0]


def is_channel_first(shape: Sequence[int]) -> bool:
    """True for a 3-D image shape laid out (C, H, W): first dim <= 4 < last dim."""
    return len(shape) == 3 and shape[0] <= 4 < shape[-1]


def resolve_encoder(encoder: str, observation_space: gym.Space) -> str:
    if encoder not in ENCODERS:
        raise ValueError(f"model_config['encoder']={encoder!r}: expected one of {ENCODERS}.")
    if isinstance(observation_space, gym.spaces.Discrete):
        if encoder not in ("auto", "mlp"):
            raise ValueError(
                f"encoder={encoder!r} needs image observations, got {observation_space}; "
                "Discrete observations are one-hot encoded for the 'mlp' encoder."
            )
        return "mlp"
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"Observation space {observation_space} is not supported: use a Box (1-D vector or "
            "3-D image) or a Discrete space."
        )
    shape = observation_space.shape
    if encoder == "auto":  # a 3-D image gets the CNN; anything else is flattened for the MLP
        return "nature_cnn" if len(shape) == 3 else "mlp"
    if encoder in ("nature_cnn", "impala_cnn") and len(shape) != 3:
        raise ValueError(
            f"encoder={encoder!r} needs 3-D image observations, got {observation_space}."
        )
    return encoder


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if np.isscalar(v) else (int(v[0]), int(v[1]))


def conv_layers(filters: Sequence[Sequence[Any]] | None) -> tuple:
    """RLlib's conv_filters -> ((out, (kh, kw), (sh, sw), padding), ...) for `NatureCNN`.

    Each entry is [out_channels, kernel, stride] or [out_channels, kernel, stride, padding],
    kernel and stride an int or a pair, padding "same" (RLlib's default) or "valid". None gives
    the Nature DQN stack, which uses VALID padding as in the paper.
    """
    if filters is None:
        return tuple((o, _pair(k), _pair(st), "VALID") for o, k, st in NATURE_CONV_FILTERS)
    layers = []
    for f in filters:
        if len(f) not in (3, 4) or (len(f) == 4 and str(f[3]).lower() not in ("same", "valid")):
            raise ValueError(
                f"conv_filters={filters!r}: expected [[out, kernel, stride(, 'same'|'valid')], "
                "...], kernel and stride an int or [h, w]."
            )
        padding = str(f[3]).upper() if len(f) == 4 else "SAME"
        layers.append((int(f[0]), _pair(f[1]), _pair(f[2]), padding))
    return tuple(layers)


def part_inits(config: Mapping[str, Any], prefix: str, head: bool = False) -> Inits:
    """The Inits of one part from its `<prefix>_kernel_initializer` / `_bias_initializer` keys;
    an unset key keeps impala_jax's default (for heads: also the two output layers')."""
    kernel, bias = (config[f"{prefix}_{k}_initializer"] for k in ("kernel", "bias"))
    out = Inits()
    if kernel is not None:
        k = make_initializer(
            kernel, config[f"{prefix}_kernel_initializer_kwargs"], f"{prefix}_kernel_initializer"
        )
        out = out._replace(kernel=k, pi_out=k, vf_out=k) if head else out._replace(kernel=k)
    if bias is not None:
        field = f"{prefix}_bias_initializer"
        if not callable(bias) and canonical_initializer(bias) not in BIAS_INITIALIZERS:
            raise ValueError(
                f"{field}={bias!r} needs a weight matrix (fan in/out); for a bias use one of "
                f"{list(BIAS_INITIALIZERS)}."
            )
        out = out._replace(bias=make_initializer(bias, config[f"{field}_kwargs"], field))
    return out


def _make_encoder(name: str, config: Mapping[str, Any]) -> nn.Module:
    """The encoder `name` with `post_fcnet_hiddens`: None keeps a CNN's own dense layer (Nature's
    512, IMPALA's 256) and adds nothing to the MLP; a list is the dense layers after a CNN's
    flatten (replacing its own, as in RLlib's old-stack vision network) or after the MLP."""
    post_sizes = config["post_fcnet_hiddens"]
    if post_sizes is None:
        return _make_base_encoder(name, config)
    post_activation = _activation(config["post_fcnet_activation"], "post_fcnet_activation")
    post_inits = part_inits(config, "fcnet")
    if name != "mlp":
        dense = {"dense": tuple(post_sizes), "dense_activation": post_activation}
        return _make_base_encoder(name, config, **dense, dense_inits=post_inits)
    encoder = _make_base_encoder(name, config)
    if not post_sizes:
        return encoder
    return PostLayers(encoder, MLP(tuple(post_sizes), post_activation, False, post_inits))


def _make_base_encoder(name: str, config: Mapping[str, Any], **dense) -> nn.Module:
    if name == "mlp":
        return MLP(
            tuple(config["fcnet_hiddens"]),
            _activation(config["fcnet_activation"], "fcnet_activation"),
            bool(config["fcnet_use_layernorm"]),
            part_inits(config, "fcnet"),
        )
    inits = part_inits(config, "conv")
    if name == "nature_cnn":
        activation = _activation(config["conv_activation"], "conv_activation")
        return NatureCNN(conv_layers(config["conv_filters"]), activation, inits, **dense)
    return ImpalaCNN(tuple(int(c) for c in config["impala_cnn_channels"]), inits, **dense)


def _make_preprocess(
    observation_space: gym.Space, flatten: bool = False
) -> Callable[[jax.Array], jax.Array]:
    """Observation batch [N, *obs_shape] -> float32 encoder input, checking the shape; images stay
    NHWC for the conv encoders unless ``flatten`` (the "mlp" encoder takes [N, features])."""
    if isinstance(observation_space, gym.spaces.Discrete):
        n, start = int(observation_space.n), int(observation_space.start)

        def preprocess(obs):
            if obs.ndim != 1:
                raise ValueError(
                    f"Expected Discrete observations of shape [N], got {obs.shape} for "
                    f"{observation_space}."
                )
            return jax.nn.one_hot(obs - start, n, dtype=jnp.float32)

        return preprocess

    shape = tuple(observation_space.shape)
    transpose = is_channel_first(shape)

    def preprocess(obs):
        if tuple(obs.shape[1:]) != shape or obs.ndim != len(shape) + 1:
            raise ValueError(
                f"Expected observations of shape [N, {', '.join(map(str, shape))}], got "
                f"{obs.shape} for {observation_space}."
            )
        if obs.dtype == jnp.uint8:
            x = obs.astype(jnp.float32) / 255.0
        else:
            x = obs.astype(jnp.float32)
        if len(shape) == 3 and not flatten:
            if transpose:
                x = jnp.transpose(x, (0, 2, 3, 1))
            return x
        return x.reshape((x.shape[0], -1))

    return preprocess


def _action_layout(action_space: gym.Space) -> tuple[int, bool]:
    """(number of head outputs before log_std, whether the action is Gaussian)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n), False
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return int(action_space.shape[0]), True
    raise ValueError(f"Action space {action_space} is not supported: use Discrete(n) or a 1-D Box.")


class NetworkParts(NamedTuple):
    """The Flax modules of one model_config for given spaces (networks and recurrent use them)."""

    preprocess: Callable[[jax.Array], jax.Array]
    encoder: nn.Module
    vf_encoder: nn.Module | None  # None: the value function shares `encoder` (vf_share_layers)
    pi_head: nn.Module
    vf_head: nn.Module
    dist_size: int
    dummy_obs: jax.Array  # [1, *obs_shape] in the dtype JAX holds the env's observations in


def parts(
    model_config: Mapping[str, Any], observation_space: gym.Space, action_space: gym.Space
) -> NetworkParts:
    """The encoder(s) and heads of a full model config (every DefaultModelConfig key set)."""
    fusion = {k: v for k, v in model_config.items() if k.startswith("fusionnet_")}
    if any(v != DEFAULT_MODEL_CONFIG[k] for k, v in fusion.items()):
        raise ValueError(
            f"model_config {fusion}: the fusionnet_* keys configure RLlib's network that fuses "
            "the encoders of multi-part observations, which impala_jax does not have (Box and "
            "Discrete observations only); leave them at their defaults."
        )
    encoder_name = resolve_encoder(model_config["encoder"], observation_space)
    num_outputs, gaussian = _action_layout(action_space)
    head_activation = _activation(model_config["head_fcnet_activation"], "head_fcnet_activation")
    head_hiddens = tuple(model_config["head_fcnet_hiddens"])
    free_log_std = bool(model_config["free_log_std"]) and gaussian
    log_std_clip = model_config["log_std_clip_param"]
    log_std_clip = None if log_std_clip is None else float(log_std_clip)
    shared = bool(model_config["vf_share_layers"])
    head_layernorm = bool(model_config["head_fcnet_use_layernorm"])
    head_inits = part_inits(model_config, "head_fcnet", head=True)
    pi_head = PolicyHead(
        head_hiddens,
        head_activation,
        num_outputs,
        gaussian,
        free_log_std,
        log_std_clip,
        head_layernorm,
        head_inits,
    )
    return NetworkParts(
        preprocess=_make_preprocess(observation_space, flatten=encoder_name == "mlp"),
        encoder=_make_encoder(encoder_name, model_config),
        vf_encoder=None if shared else _make_encoder(encoder_name, model_config),
        pi_head=pi_head,
        vf_head=ValueHead(head_hiddens, head_activation, head_layernorm, head_inits),
        dist_size=2 * num_outputs if gaussian else num_outputs,
        # The dtype the env delivers, as JAX holds it (int64 becomes int32 without x64).
        dummy_obs=jnp.zeros(
            (1, *observation_space.shape),
            jax.dtypes.canonicalize_dtype(observation_space.dtype),
        ),
    )


def make_networks(
    model_config: Mapping[str, Any] | None, observation_space: gym.Space, action_space: gym.Space
) -> Networks:
    """Builds the encoder(s) and heads described by `model_config` for the given spaces."""
    # Missing keys take RLlib's defaults; keys we do not use (other RLlib ones) are ignored.
    config = {**DEFAULT_MODEL_CONFIG, **dict(model_config or {})}
    if config["use_lstm"]:
        raise ValueError(
            "model_config['use_lstm']=True is a recurrent policy: build it with "
            "impala_jax.core.recurrent.make_recurrent_networks (IMPALA does so by itself)."
        )
    p = parts(config, observation_space, action_space)
    preprocess, encoder, vf_encoder = p.preprocess, p.encoder, p.vf_encoder
    pi_head, vf_head, dummy_obs = p.pi_head, p.vf_head, p.dummy_obs

    def init(key: jax.Array) -> Params:
        k_enc, k_pi, k_vf, k_vf_enc = jax.random.split(key, 4)
        x = preprocess(dummy_obs)
        # .get: an MLP encoder without hidden layers (fcnet_hiddens=[]) has no params.
        params = {"encoder": encoder.init(k_enc, x).get("params", {})}
        features = jax.eval_shape(lambda p: encoder.apply({"params": p}, x), params["encoder"])
        params["pi"] = pi_head.init(k_pi, jnp.zeros(features.shape, features.dtype))["params"]
        params["vf"] = vf_head.init(k_vf, jnp.zeros(features.shape, features.dtype))["params"]
        if vf_encoder is not None:
            params["vf_encoder"] = vf_encoder.init(k_vf_enc, x).get("params", {})
        return params

    def apply(params: Params, obs: jax.Array, with_features: bool = False):
        """(dist_inputs, value), and the policy encoder's output as a third element when
        ``with_features`` (the learner's feature diagnostics)."""
        x = preprocess(obs)
        features = encoder.apply({"params": params["encoder"]}, x)
        dist_inputs = pi_head.apply({"params": params["pi"]}, features)
        vf_features = features
        if vf_encoder is not None:
            vf_features = vf_encoder.apply({"params": params["vf_encoder"]}, x)
        value = vf_head.apply({"params": params["vf"]}, vf_features)
        if with_features:
            return dist_inputs, value, features
        return dist_inputs, value

    return Networks(init=init, apply=apply, dist_size=p.dist_size)
