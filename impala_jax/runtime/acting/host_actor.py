"""The policy's ``act`` in NumPy, for small MLP policies whose actors run on a CPU: a second
backend of ``core/policy.py``'s contract, beside the jitted one.

On the CPU backend XLA's dot is slower for an actor's small shapes than one thread of NumPy's
BLAS (benchmarks/README.md, "The NumPy actor"). A runner spends most of its time in ``act``,
so ``HostActor`` runs the same forward pass and the same distributions with NumPy, on a host
copy of the params taken once per published version. ``HostActor.act(params, obs, rng, explore)`` is
``core.policy.act``'s contract, and the actor has the jitted actor's signatures
(``make_act_fns``): ``actor(params, obs, key) -> (action, dist_inputs, key)`` and
``actor.greedy(params, obs) -> (action, dist_inputs)``, where the key is a
``numpy.random.Generator`` (``HostActor.key``) that the call advances; a JAX key
(``compute_actions``) seeds a Generator for that one call. Actions are the jitted act's dtypes
(int32, float32); sampling draws from NumPy's PCG64, so a run's actions differ from the jitted
actor's for the same seed, but a seed still fixes them (lockstep mode).

The forward pass mirrors ``networks.py``'s ``mlp`` encoder, RLlib's ``post_fcnet_hiddens``, the
policy head and the observation preprocessing for the model_config keys checked by
``host_actor_unsupported``; ``tests/test_host_actor.py`` compares it with ``networks.apply``
over those keys. Anything else (CNN encoders, recurrent policies) keeps the jitted ``act``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import jax
import numpy as np

from impala_jax.core.distributions import Categorical, DiagGaussian
from impala_jax.core.networks import resolve_encoder

# A fixed first word for the Generator's seed, so an actor's stream is not the one a user's
# np.random.default_rng(seed) gives for the same seed.
_ACTOR_STREAM = 0x1A7C7


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow for large |x|


# networks._ACTIVATIONS, in NumPy (flax's elu, swish/silu and sigmoid; the same names).
_ACTIVATIONS = {
    "tanh": lambda x: np.tanh(x, out=x),
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "swish": lambda x: x * _sigmoid(x),
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "linear": None,
    None: None,
}

# "auto" acts with NumPy up to this many multiply-adds per call (envs x the dense layers'
# in x out): below it one BLAS thread beats XLA's dot (benchmarks/README.md, "The NumPy actor").
AUTO_MAX_MACS = 2_000_000

# flax.linen.LayerNorm's default epsilon.
_LAYERNORM_EPSILON = 1e-6


def host_actor_unsupported(
    model_config: Mapping[str, Any], observation_space: gym.Space, distribution
) -> str | None:
    """Why ``HostActor`` cannot run this policy, or None when it can. ``model_config`` is a
    full one (every DefaultModelConfig key set, as a built config's)."""
    if model_config["use_lstm"]:
        return "the policy is recurrent (use_lstm=True)"
    encoder = resolve_encoder(model_config["encoder"], observation_space)
    if encoder != "mlp":
        return f"the encoder is {encoder!r}, not 'mlp'"
    if not isinstance(distribution, Categorical | DiagGaussian):
        return f"its action distribution is {distribution!r}"
    for field in ("fcnet_activation", "post_fcnet_activation", "head_fcnet_activation"):
        name = model_config[field]
        if (name.lower() if isinstance(name, str) else name) not in _ACTIVATIONS:
            return f"{field}={name!r} has no NumPy counterpart here"
    return None


def act_macs(model_config: Mapping[str, Any], observation_space: gym.Space, dist_size, envs):
    """Multiply-adds of one ``act`` call on ``envs`` observations: the dense layers' in x out."""
    if isinstance(observation_space, gym.spaces.Discrete):
        width = int(observation_space.n)
    else:
        width = int(np.prod(observation_space.shape))
    per_row = 0
    layers = ("fcnet_hiddens", "post_fcnet_hiddens", "head_fcnet_hiddens")
    for size in [*(s for k in layers for s in model_config[k] or ()), dist_size]:
        per_row += width * int(size)
        width = int(size)
    return envs * per_row


def _activation(name):
    return _ACTIVATIONS[name.lower() if isinstance(name, str) else name]


def _layer_norm(p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = np.maximum((x * x).mean(axis=-1, keepdims=True) - mean * mean, 0.0)
    return (x - mean) / np.sqrt(var + _LAYERNORM_EPSILON) * p["scale"] + p["bias"]


def _dense_stack(p: Mapping, layers: int, activation, layernorm: bool, x: np.ndarray):
    """networks.MLP: ``layers`` x (Dense_i -> [LayerNorm_i] -> activation)."""
    for i in range(layers):
        dense = p[f"Dense_{i}"]
        x = x @ dense["kernel"]
        x += dense["bias"]  # in place: each temporary costs as much as the op at these sizes
        if layernorm:
            x = _layer_norm(p[f"LayerNorm_{i}"], x)
        if activation is not None:
            x = activation(x)
    return x


class HostActor:
    """``act`` and ``greedy`` in NumPy for the MLP policies ``host_actor_unsupported`` allows.

    ``jitted`` is the jitted ``act`` it stands in for: the action dtype the learner compiles
    for comes from its abstract evaluation (policy.Policy.action_dtype); the dtypes agree.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        observation_space: gym.Space,
        distribution,
        jitted,
    ):
        reason = host_actor_unsupported(model_config, observation_space, distribution)
        if reason is not None:
            raise ValueError(f"HostActor cannot run this policy: {reason}.")
        c = model_config
        self.jitted = jitted
        self._distribution = distribution
        self._gaussian = isinstance(distribution, DiagGaussian)
        self._encoder = (len(c["fcnet_hiddens"]), _activation(c["fcnet_activation"]))
        self._encoder_layernorm = bool(c["fcnet_use_layernorm"])
        post = c["post_fcnet_hiddens"] or ()  # None: no layers after the MLP
        self._post = (len(post), _activation(c["post_fcnet_activation"]))
        self._head = (len(c["head_fcnet_hiddens"]), _activation(c["head_fcnet_activation"]))
        self._head_layernorm = bool(c["head_fcnet_use_layernorm"])
        self._free_log_std = bool(c["free_log_std"]) and self._gaussian
        clip = c["log_std_clip_param"]
        self._head_clip = None if clip is None else float(clip)
        self._obs_space = observation_space
        # (params object, its host copy): one entry, replaced whole, so threads need no lock.
        self._host_params: tuple[Any, dict] | None = None

    @staticmethod
    def key(seed: int) -> np.random.Generator:
        """The key an actor passes to ``act``: a Generator that each call advances."""
        return np.random.default_rng([_ACTOR_STREAM, int(seed)])

    def _host(self, params) -> dict:
        cached = self._host_params
        if cached is not None and cached[0] is params:
            return cached[1]
        # np.asarray of a CPU array is a view of its buffer (the ParamStore's own copy, never
        # donated); the view keeps that buffer alive after the store publishes the next one.
        host = _tree_asarray(params)
        self._host_params = (params, host)
        return host

    def _preprocess(self, obs) -> np.ndarray:
        space = self._obs_space
        obs = np.asarray(obs)
        if isinstance(space, gym.spaces.Discrete):
            if obs.ndim != 1:
                raise ValueError(
                    f"Expected Discrete observations of shape [N], got {obs.shape} for {space}."
                )
            index = obs.astype(np.int64) - int(space.start)
            return (index[:, None] == np.arange(int(space.n))).astype(np.float32)
        if tuple(obs.shape[1:]) != tuple(space.shape):
            raise ValueError(
                f"Expected observations of shape [N, {', '.join(map(str, space.shape))}], got "
                f"{obs.shape} for {space}."
            )
        x = obs.astype(np.float32) / np.float32(255.0) if obs.dtype == np.uint8 else obs
        x = x.astype(np.float32, copy=False)
        return x.reshape(x.shape[0], -1)

    def dist_inputs(self, params, obs) -> np.ndarray:
        """networks.apply(params, obs)[0]: the policy head's output, float32 [N, dist_size]."""
        p = self._host(params)
        x = self._preprocess(obs)
        encoder = p["encoder"]
        if self._post[0]:  # PostLayers: the MLP under "encoder", the post layers under "post"
            x = _dense_stack(encoder["encoder"], *self._encoder, self._encoder_layernorm, x)
            x = _dense_stack(encoder["post"], *self._post, False, x)
        else:
            x = _dense_stack(encoder, *self._encoder, self._encoder_layernorm, x)
        pi = p["pi"]
        if self._head[0]:
            x = _dense_stack(pi["MLP_0"], *self._head, self._head_layernorm, x)
        out = x @ pi["Dense_0"]["kernel"] + pi["Dense_0"]["bias"]
        if not self._gaussian:
            return out.astype(np.float32, copy=False)
        if self._free_log_std:
            mean, log_std = out, np.broadcast_to(pi["log_std"], out.shape)
        else:
            mean, log_std = np.split(out, 2, axis=-1)
        if self._head_clip is not None:
            log_std = np.clip(log_std, -self._head_clip, self._head_clip)
        return np.concatenate([mean, log_std], axis=-1).astype(np.float32, copy=False)

    def _sample(self, rng: np.random.Generator, dist_inputs: np.ndarray) -> np.ndarray:
        d = self._distribution
        if self._gaussian:
            # DiagGaussian.sample: mean + exp(clipped log_std) * eps.
            mean, log_std = np.split(dist_inputs, 2, axis=-1)
            c = d.log_std_clip_param
            eps = rng.standard_normal(mean.shape, dtype=np.float32)
            return (mean + np.exp(np.clip(log_std, -c, c)) * eps).astype(np.float32)
        # Categorical: the exponential race, argmax(logits - log E), E ~ Exp(1) per entry (the
        # Gumbel-max trick with -log E as the Gumbel noise), cheaper than an inverse CDF at
        # these sizes. A masked logit (finfo.min) loses to any other; E is kept above 0.
        e = rng.standard_exponential(dist_inputs.shape, dtype=np.float32)
        np.maximum(e, np.finfo(np.float32).tiny, out=e)
        np.log(e, out=e)
        np.subtract(dist_inputs, e, out=e)
        return e.argmax(axis=-1).astype(np.int32)

    def _mode(self, dist_inputs: np.ndarray) -> np.ndarray:
        if self._gaussian:
            mean, _ = np.split(dist_inputs, 2, axis=-1)
            return mean.astype(np.float32)
        return np.argmax(dist_inputs, axis=-1).astype(np.int32)

    def act(self, params, obs, rng: np.random.Generator | None, explore: bool = True):
        """``core.policy.act`` for a feedforward policy, in NumPy: ``(action, dist_inputs,
        None)``, a sample drawn from ``rng`` (``explore``) or the distribution's mode."""
        dist_inputs = self.dist_inputs(params, obs)
        action = self._sample(rng, dist_inputs) if explore else self._mode(dist_inputs)
        return action, dist_inputs, None

    def __call__(self, params, obs, key):
        """(action, dist_inputs, key): a sampled action per row; ``key`` advanced."""
        _yield_gil()
        if not isinstance(key, np.random.Generator):  # a JAX key (compute_actions)
            key = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        action, dist_inputs, _ = self.act(params, obs, key)
        return action, dist_inputs, key

    def greedy(self, params, obs):
        """(mode action, dist_inputs): ``explore=False``."""
        _yield_gil()
        action, dist_inputs, _ = self.act(params, obs, None, explore=False)
        return action, dist_inputs


# One BLAS thread while any algorithm acts with NumPy: with more, BLAS's threads spin beside
# envpool's and the learner's on a small machine. Process-wide, as BLAS's thread count is.
_blas_lock = threading.Lock()
_blas_holders = 0
_blas_limiter = None


def hold_one_blas_thread() -> None:
    """Limits NumPy's BLAS to one thread until every holder has called
    ``release_blas_threads``."""
    global _blas_holders, _blas_limiter
    with _blas_lock:
        if _blas_holders == 0:
            from threadpoolctl import threadpool_limits

            _blas_limiter = threadpool_limits(limits=1, user_api="blas")
        _blas_holders += 1


def release_blas_threads() -> None:
    """Ends one ``hold_one_blas_thread``; the last restores BLAS's own thread count."""
    global _blas_holders, _blas_limiter
    with _blas_lock:
        _blas_holders -= 1
        if _blas_holders == 0 and _blas_limiter is not None:
            _blas_limiter.restore_original_limits()
            _blas_limiter = None


# Per thread: True while acting for envs whose every step releases the GIL (no_gil_yield).
_acting = threading.local()


@contextlib.contextmanager
def no_gil_yield():
    """Acting in this thread inside the block does not yield the GIL (_yield_gil): for a
    runner whose envs release it on every step anyway (envpool, while its threads step)."""
    previous = getattr(_acting, "env_releases_gil", False)
    _acting.env_releases_gil = True
    try:
        yield
    finally:
        _acting.env_releases_gil = previous


def _yield_gil() -> None:
    """Lets a thread waiting for the GIL take it, since NumPy at an actor's sizes hardly
    releases it (``os.sched_yield``); not for envs that release it every step (no_gil_yield)."""
    if not getattr(_acting, "env_releases_gil", False):
        os.sched_yield()


def _tree_asarray(tree):
    if isinstance(tree, Mapping):
        return {k: _tree_asarray(v) for k, v in tree.items()}
    return np.asarray(tree)
