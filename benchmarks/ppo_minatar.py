"""PPO on a gymnax env with PureJaxRL's published MinAtar settings: the MinAtar table's baseline.

PureJaxRL is not a package one can install (it is a repository of single-file scripts), so
this is PPO written here from its published settings, not PureJaxRL's code. The settings are
those of PureJaxRL's ``examples/brax_minatar.ipynb`` (its "PPO Gymnax MinAtar" run): separate
actor and critic MLPs of 64-64 relu units on the flattened observation (orthogonal init, gains
sqrt 2 / 0.01 / 1), 64 envs x 128 steps, 4 epochs of 8 minibatches, Adam (eps 1e-5) at lr 5e-3
annealed linearly to 0 over the run, global-norm clip 0.5, gamma 0.99, GAE lambda 0.95, clip
0.2 on the ratio and the value, entropy 0.01, value 0.5, advantages normalised per minibatch.

As PureJaxRL does, the whole update (rollout, GAE, epochs) is one jitted program over a scan.
Here it runs in chunks of ``CHUNK`` updates from Python, so that the returns and the wall time
since launch can be read between chunks; a chunk boundary changes no number.

``python -m benchmarks.ppo_minatar --env Breakout-MinAtar --seed 0 --steps 10000000
[--launched T] [--goal 20]`` prints one JSON line: the curve (env steps, seconds since launch,
mean return of the episodes ended in the chunk), env steps/s after the first chunk (which
compiles), and the seconds from launch to the first chunk whose mean return reaches ``--goal``.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple

SETTINGS = {
    "lr": 5e-3,
    "num_envs": 64,
    "num_steps": 128,
    "epochs": 4,
    "minibatches": 8,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "hidden": 64,
}
CHUNK = 8  # updates per jitted call: 65,536 env steps with the settings above


class Rollout(NamedTuple):
    obs: object
    action: object
    log_prob: object
    value: object
    reward: object
    done: object


def make_update(env_name: str, total_steps: int, settings: dict = SETTINGS):
    """(init(key) -> state, run_chunk(state) -> (state, (returns sum, episodes)))."""
    import flax.linen as nn
    import gymnax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    s = settings
    env, params = gymnax.make(env_name)
    n_actions = env.action_space(params).n
    batch = s["num_envs"] * s["num_steps"]
    updates = total_steps // batch
    minibatch = batch // s["minibatches"]

    class ActorCritic(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x.reshape((x.shape[0], -1)).astype(jnp.float32)

            def mlp(out, gain):
                h = x
                for _ in range(2):
                    h = nn.Dense(s["hidden"], kernel_init=nn.initializers.orthogonal(2**0.5))(h)
                    h = nn.relu(h)
                return nn.Dense(out, kernel_init=nn.initializers.orthogonal(gain))(h)

            return mlp(n_actions, 0.01), mlp(1, 1.0)[:, 0]

    net = ActorCritic()

    def lr(count):  # linear to 0 over the run, one step per minibatch
        done = count // (s["minibatches"] * s["epochs"])
        return s["lr"] * (1.0 - done / updates)

    tx = optax.chain(optax.clip_by_global_norm(s["max_grad_norm"]), optax.adam(lr, eps=1e-5))
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key):
        k_net, k_env, key = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(k_env, s["num_envs"]), params)
        weights = net.init(k_net, obs)
        zeros = jnp.zeros(s["num_envs"])
        return (weights, tx.init(weights), env_state, obs, zeros, key)

    def log_prob_entropy(logits, action):
        logp = jax.nn.log_softmax(logits)
        chosen = jnp.take_along_axis(logp, action[:, None], axis=1)[:, 0]
        return chosen, -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    def loss_fn(weights, mb: Rollout, adv, target):
        logits, value = net.apply(weights, mb.obs)
        log_prob, entropy = log_prob_entropy(logits, mb.action)
        v_clipped = mb.value + jnp.clip(value - mb.value, -s["clip_eps"], s["clip_eps"])
        v_loss = 0.5 * jnp.maximum((value - target) ** 2, (v_clipped - target) ** 2).mean()
        ratio = jnp.exp(log_prob - mb.log_prob)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        clipped = jnp.clip(ratio, 1 - s["clip_eps"], 1 + s["clip_eps"])
        pi_loss = -jnp.minimum(ratio * adv, clipped * adv).mean()
        return pi_loss + s["vf_coef"] * v_loss - s["ent_coef"] * entropy.mean()

    def env_step(carry, _):
        weights, env_state, obs, ep_ret, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        logits, value = net.apply(weights, obs)
        action = jax.random.categorical(k_act, logits)
        log_prob, _ = log_prob_entropy(logits, action)
        keys = jax.random.split(k_step, s["num_envs"])
        next_obs, env_state, reward, terminated, truncated, _ = step(
            keys, env_state, action, params
        )
        done = terminated | truncated  # PureJaxRL's gymnax returned one done flag
        ep_ret = ep_ret + reward
        ended = (jnp.sum(jnp.where(done, ep_ret, 0.0)), jnp.sum(done))
        ep_ret = jnp.where(done, 0.0, ep_ret)
        out = Rollout(obs, action, log_prob, value, reward, done.astype(jnp.float32))
        return (weights, env_state, next_obs, ep_ret, key), (out, ended)

    def gae(rollout: Rollout, last_value):
        def back(carry, t):
            adv, next_value = carry
            nonterminal = 1.0 - t.done
            delta = t.reward + s["gamma"] * next_value * nonterminal - t.value
            adv = delta + s["gamma"] * s["gae_lambda"] * nonterminal * adv
            return (adv, t.value), adv

        _, adv = jax.lax.scan(back, (jnp.zeros_like(last_value), last_value), rollout, reverse=True)
        return adv, adv + rollout.value

    def update(state, _):
        weights, opt_state, env_state, obs, ep_ret, key = state
        carry = (weights, env_state, obs, ep_ret, key)
        carry, (rollout, ended) = jax.lax.scan(env_step, carry, None, s["num_steps"])
        weights, env_state, obs, ep_ret, key = carry
        _, last_value = net.apply(weights, obs)
        adv, target = gae(rollout, last_value)

        def epoch(carry, _):
            weights, opt_state, key = carry
            key, k_perm = jax.random.split(key)
            flat = jax.tree.map(lambda x: x.reshape((batch, *x.shape[2:])), (rollout, adv, target))
            order = jax.random.permutation(k_perm, batch)
            shaped = jax.tree.map(
                lambda x: x[order].reshape((s["minibatches"], minibatch, *x.shape[1:])), flat
            )

            def sgd(carry, mb):
                weights, opt_state = carry
                grads = jax.grad(loss_fn)(weights, *mb)
                changes, opt_state = tx.update(grads, opt_state, weights)
                return (optax.apply_updates(weights, changes), opt_state), None

            (weights, opt_state), _ = jax.lax.scan(sgd, (weights, opt_state), shaped)
            return (weights, opt_state, key), None

        (weights, opt_state, key), _ = jax.lax.scan(
            epoch, (weights, opt_state, key), None, s["epochs"]
        )
        returns = (jnp.sum(ended[0]), jnp.sum(ended[1]))
        return (weights, opt_state, env_state, obs, ep_ret, key), returns

    @jax.jit
    def run_chunk(state):
        state, (ret_sum, episodes) = jax.lax.scan(update, state, None, CHUNK)
        return state, (jnp.sum(ret_sum), jnp.sum(episodes))

    del np  # imported with the others so the JAX import cost counts toward the start-up
    return jax.jit(init), run_chunk, batch * CHUNK, updates // CHUNK


def run(env_name: str, seed: int, steps: int, launched: float, goal: float | None) -> dict:
    import jax

    init, run_chunk, chunk_steps, chunks = make_update(env_name, steps)
    state = init(jax.random.key(seed))
    curve, reached_s = [], None
    pending_sum = pending_n = 0.0
    for i in range(chunks):
        state, (ret_sum, episodes) = run_chunk(state)
        ret_sum, episodes = float(ret_sum), float(episodes)
        now = time.time() - launched
        if i == 0:
            first_s = now
        pending_sum, pending_n = pending_sum + ret_sum, pending_n + episodes
        if pending_n:  # a chunk with no episode ended carries over to the next
            mean = pending_sum / pending_n
            curve.append([(i + 1) * chunk_steps, round(now, 2), round(mean, 3)])
            pending_sum = pending_n = 0.0
            if goal is not None and reached_s is None and mean >= goal:
                reached_s = now
    total_s = time.time() - launched
    trained = (chunks - 1) * chunk_steps
    return {
        "algo": "ppo",
        "env": env_name,
        "seed": seed,
        "env_steps": chunks * chunk_steps,
        "settings": SETTINGS,
        "wall_s_from_launch": total_s,
        "first_chunk_s_from_launch": first_s,
        "env_steps_per_s": trained / (total_s - first_s) if chunks > 1 else float("nan"),
        "wall_s_to_goal": reached_s,
        "curve": curve,
    }


def main(argv=None) -> dict:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="Breakout-MinAtar")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--launched", type=float, default=None, help="launch time.time()")
    parser.add_argument("--goal", type=float, default=None)
    args = parser.parse_args(argv)
    launched = args.launched if args.launched is not None else time.time()
    out = run(args.env, args.seed, args.steps, launched, args.goal)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
