"""Recurrent policies (``model_config={"use_lstm": True}``): an LSTM core between encoder and heads.

`make_recurrent_networks(model_config, obs_space, action_space)` returns `RecurrentNetworks`:

- `init(key) -> params`: "encoder", "lstm", "pi", "vf" (and "vf_encoder", "vf_lstm" when
  `vf_share_layers=False`: the value function then has its own encoder and core, as RLlib's
  separate-encoder actor-critic). As in networks.py, every value-function parameter sits
  under a top-level key starting with "vf".
- `initial_state(batch) -> state`: zeros, a pytree of [batch, lstm_cell_size] arrays (c and h
  of each core).
- `step(params, state, obs, prev_action, prev_reward, reset) -> (dist_inputs, value, state)`:
  one row of B envs, for actors. `reset[b]` (bool) starts a new episode in env b: its state
  is zeroed before the row is processed, and its prev action and reward are zeroed too.
- `unroll(params, stored, obs, prev_action, prev_reward, reset, max_seq_len)` over ``[T+1, B]``
  rows, for the learner: `(dist_inputs [T+1, B, P], values [T+1, B])`. `stored` holds the
  actors' states at rows 0, L, 2L, ... (L = `max_seq_len`; ``T // L + 1`` of them, leading
  axis): each chunk of L rows starts from its stored state, which is RLlib's truncated
  backprop through time (gradients do not cross chunk borders). L >= T+1 is one chunk: full
  backprop through the fragment from its first stored state. Resets inside a chunk zero the
  state exactly as `step` does, so with the same params the unroll equals the step loop.

The core input is the encoder's features, then the previous action (one-hot for Discrete(n),
raw for a Box) when `lstm_use_prev_action`, then the previous reward when
`lstm_use_prev_reward`. The core is Flax's `OptimizedLSTMCell` with `lstm_cell_size` units;
`lstm_kernel_initializer` (both weight matrices) and `lstm_bias_initializer` take RLlib's
names, as the other initializer keys do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from impala_jax.core import networks
from impala_jax.core.initializers import make_initializer
from impala_jax.core.model_config import DEFAULT_MODEL_CONFIG

Params = dict[str, Any]
State = Any  # a pytree of [B, cell] arrays


class RecurrentNetworks(NamedTuple):
    """What recurrent actors and the learner use; see the module docstring."""

    init: Callable[[jax.Array], Params]
    initial_state: Callable[[int], State]
    step: Callable[..., tuple[jax.Array, jax.Array, State]]
    unroll: Callable[..., tuple[jax.Array, jax.Array]]
    dist_size: int
    cell_size: int
    max_seq_len: int  # model_config's: the learner's truncation length (see unroll)


def num_chunks(rollout_fragment_length: int, max_seq_len: int) -> int:
    """Stored states per fragment: one per chunk of ``max_seq_len`` of its T+1 rows."""
    return rollout_fragment_length // max_seq_len + 1


def prev_action_features(action_space: gym.Space) -> Callable[[jax.Array], jax.Array]:
    """[B] or [B, A] previous actions -> [B, F] float32 core inputs."""
    if isinstance(action_space, gym.spaces.Discrete):
        n = int(action_space.n)
        return lambda a: jax.nn.one_hot(a, n, dtype=jnp.float32)
    return lambda a: jnp.asarray(a, jnp.float32).reshape(a.shape[0], -1)


def _cell(config: Mapping[str, Any]) -> nn.OptimizedLSTMCell:
    inits = {}
    if config["lstm_kernel_initializer"] is not None:
        kernel = make_initializer(
            config["lstm_kernel_initializer"],
            config["lstm_kernel_initializer_kwargs"],
            "lstm_kernel_initializer",
        )
        inits.update(kernel_init=kernel, recurrent_kernel_init=kernel)
    if config["lstm_bias_initializer"] is not None:
        inits["bias_init"] = networks.part_inits(config, "lstm").bias
    return nn.OptimizedLSTMCell(int(config["lstm_cell_size"]), **inits)


def _make_core_inputs(config: Mapping[str, Any], action_space: gym.Space) -> Callable:
    """``core_inputs(features, prev_action, prev_reward, reset)``: a core's input rows, the
    encoder's features, then the previous action and reward where ``model_config`` asks for
    them, zeroed in rows that start an episode."""
    use_prev_action = bool(config["lstm_use_prev_action"])
    use_prev_reward = bool(config["lstm_use_prev_reward"])
    encode_action = prev_action_features(action_space)

    def core_inputs(features, prev_action, prev_reward, reset):
        keep = (~reset)[:, None].astype(jnp.float32)
        parts = [features]
        if use_prev_action:
            parts.append(encode_action(prev_action) * keep)
        if use_prev_reward:
            parts.append(jnp.asarray(prev_reward, jnp.float32)[:, None] * keep)
        return jnp.concatenate(parts, axis=-1)

    return core_inputs


def _zero_actions(action_space: gym.Space, batch: int) -> jax.Array:
    """``batch`` previous actions of zeros, shaped and typed as the actors carry them."""
    if isinstance(action_space, gym.spaces.Discrete):
        return jnp.zeros((batch,), jnp.int32)
    return jnp.zeros((batch, *action_space.shape), jnp.float32)


def make_recurrent_networks(
    model_config: Mapping[str, Any] | None, observation_space: gym.Space, action_space: gym.Space
) -> RecurrentNetworks:
    """The encoder(s), LSTM core(s) and heads of `model_config` for the given spaces."""
    config = {**DEFAULT_MODEL_CONFIG, **dict(model_config or {})}
    base = networks.parts(config, observation_space, action_space)
    cell_size = int(config["lstm_cell_size"])
    shared = base.vf_encoder is None
    cores = {"lstm": _cell(config)} if shared else {"lstm": _cell(config), "vf_lstm": _cell(config)}
    core_inputs = _make_core_inputs(config, action_space)

    def initial_state(batch: int) -> State:
        zeros = jnp.zeros((batch, cell_size), jnp.float32)
        return {name: (zeros, zeros) for name in cores}

    def encoders(params, obs):
        """Encoder features per core, for rows of any leading shape flattened to [N]."""
        x = base.preprocess(obs)
        out = {"lstm": base.encoder.apply({"params": params["encoder"]}, x)}
        if not shared:
            out["vf_lstm"] = base.vf_encoder.apply({"params": params["vf_encoder"]}, x)
        return out

    def cores_step(params, state, features, prev_action, prev_reward, reset):
        """One row through every core, resetting where an episode starts."""
        new_state, outputs = {}, {}
        for name, cell in cores.items():
            carry = jax.tree.map(lambda s: jnp.where(reset[:, None], 0.0, s), state[name])
            inputs = core_inputs(features[name], prev_action, prev_reward, reset)
            new_state[name], outputs[name] = cell.apply({"params": params[name]}, carry, inputs)
        return new_state, outputs

    def heads(params, outputs):
        dist_inputs = base.pi_head.apply({"params": params["pi"]}, outputs["lstm"])
        value_features = outputs["lstm"] if shared else outputs["vf_lstm"]
        return dist_inputs, base.vf_head.apply({"params": params["vf"]}, value_features)

    def init(key: jax.Array) -> Params:
        k_enc, k_vf_enc, k_pi, k_vf, *k_cores = jax.random.split(key, 4 + len(cores))
        x = base.preprocess(base.dummy_obs)
        params = {"encoder": base.encoder.init(k_enc, x)["params"]}
        if not shared:
            params["vf_encoder"] = base.vf_encoder.init(k_vf_enc, x)["params"]
        features = jax.eval_shape(lambda p: encoders(p, base.dummy_obs), params)
        batch = 1
        prev_action = _zero_actions(action_space, batch)
        reset = jnp.zeros((batch,), bool)
        state = initial_state(batch)
        for k, (name, cell) in zip(k_cores, cores.items(), strict=True):
            f = jnp.zeros(features[name].shape, features[name].dtype)
            inputs = core_inputs(f, prev_action, jnp.zeros((batch,)), reset)
            params[name] = cell.init(k, state[name], inputs)["params"]
        out = jnp.zeros((batch, cell_size), jnp.float32)  # the heads read the core's output
        params["pi"] = base.pi_head.init(k_pi, out)["params"]
        params["vf"] = base.vf_head.init(k_vf, out)["params"]
        return params

    def step(params, state, obs, prev_action, prev_reward, reset):
        features = encoders(params, obs)
        state, outputs = cores_step(params, state, features, prev_action, prev_reward, reset)
        dist_inputs, value = heads(params, outputs)
        return dist_inputs, value, state

    def unroll(params, stored, obs, prev_action, prev_reward, reset, max_seq_len: int):
        rows, batch = obs.shape[:2]
        # The encoders over all rows at once (one big matmul or conv), the cores row by row.
        flat = encoders(params, obs.reshape(rows * batch, *obs.shape[2:]))
        features = jax.tree.map(lambda f: f.reshape(rows, batch, -1), flat)
        # Row t starts a chunk when t % L == 0: its state is the stored one (no gradient
        # into it from the rows before), otherwise the carried one.
        chunk_start = jnp.arange(rows) % max_seq_len == 0
        chunk_index = jnp.arange(rows) // max_seq_len
        # jnp arrays: a batch on one CPU device holds host arrays (Learner.put_batch), which
        # a traced row index cannot index.
        stored = jax.lax.stop_gradient(jax.tree.map(jnp.asarray, stored))

        def body(state, xs):
            f, a, r, done, start, k = xs
            injected = jax.tree.map(lambda s: s[k], stored)
            state = jax.tree.map(lambda i, c: jnp.where(start, i, c), injected, state)
            state, outputs = cores_step(params, state, f, a, r, done)
            return state, outputs

        first = jax.tree.map(lambda s: s[0], stored)
        xs = (features, prev_action, prev_reward, reset, chunk_start, chunk_index)
        _, outputs = jax.lax.scan(body, first, xs)
        flat_outputs = jax.tree.map(lambda o: o.reshape(rows * batch, -1), outputs)
        dist_inputs, values = heads(params, flat_outputs)
        return dist_inputs.reshape(rows, batch, -1), values.reshape(rows, batch)

    return RecurrentNetworks(
        init=init,
        initial_state=initial_state,
        step=step,
        unroll=unroll,
        dist_size=base.dist_size,
        cell_size=cell_size,
        max_seq_len=int(config["max_seq_len"]),
    )
