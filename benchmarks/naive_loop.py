"""The reference impala_jax's time to 450 is measured against: the simplest IMPALA loop.

One thread, no queues: envpool's CartPole-v1 stepped in lockstep with a jitted MLP policy
(the same family as experiments/cartpole.py: [64, 64] tanh, shared layers), then one jitted
V-trace actor-critic update with adam on the fragment just sampled, and again. Written here
from the paper's equations (Espeholt et al. 2018, eq. 1; the rows after a final observation
masked as types.py explains), not from impala_jax's modules. Its constants were tuned for its
own best time to 450 on this machine (2 cores), seconds from launch per seed: 256 envs x 5
steps at lr 5e-3: 11.3, 13.4, 13.3, 14.3 (chosen); lr 3e-3: 13.7, 16.5; 128 envs at lr 5e-3:
14.2, 12.5, 13.1, at lr 1e-2: 20.3, 11.5, 10.5; fragments of 10 at lr 3e-3: 22.4, 19.1. vf
0.25, entropy 0, grad clip 40 throughout.

``python -m benchmarks.naive_loop --seed S [--compile-cache DIR|none]`` prints one JSON line:
the seconds from process start to a 100-episode mean return of 450, and the env steps.
"""

from __future__ import annotations

import argparse
import json
import time

_STARTED = time.perf_counter()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--T", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--max-env-steps", type=float, default=3e6)
    parser.add_argument("--compile-cache", default="none")
    args = parser.parse_args(argv)

    import jax

    if args.compile_cache != "none":
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    import envpool
    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np
    import optax

    gamma, vf_coeff, T, n = 0.99, 0.25, args.T, args.num_envs

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(2):
                x = jnp.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(2**0.5))(x))
            logits = nn.Dense(2, kernel_init=nn.initializers.orthogonal(0.01))(x)
            return logits, nn.Dense(1)(x)[..., 0]

    net = Net()
    key = jax.random.key(args.seed)
    params = net.init(key, jnp.zeros((1, 4)))
    opt = optax.chain(optax.clip_by_global_norm(40.0), optax.adam(args.lr))
    opt_state = opt.init(params)

    @jax.jit
    def act(params, obs, key):
        key, sub = jax.random.split(key)
        logits, _ = net.apply(params, obs)
        return jax.random.categorical(sub, logits), logits, key

    def loss(params, obs, action, mu_logits, reward, terminated, valid):
        logits, values = net.apply(params, obs)  # [T+1, n, 2], [T+1, n]
        logp = jax.nn.log_softmax(logits[:-1])
        pi_a = jnp.take_along_axis(logp, action[..., None], -1)[..., 0]
        mu_a = jnp.take_along_axis(jax.nn.log_softmax(mu_logits), action[..., None], -1)[..., 0]
        rho = jnp.where(valid, jnp.exp(jax.lax.stop_gradient(pi_a) - mu_a), 0.0)
        rho_bar, c = jnp.minimum(rho, 1.0), jnp.minimum(rho, 1.0)
        v = jax.lax.stop_gradient(values)
        discount = gamma * (1.0 - terminated)
        delta = rho_bar * (reward + discount * v[1:] - v[:-1])

        def backward(acc, xs):  # vs_s - V(x_s) = delta_s + gamma_s c_s (vs_{s+1} - V(x_{s+1}))
            d, g, cc = xs
            acc = d + g * cc * acc
            return acc, acc

        _, diff = jax.lax.scan(backward, jnp.zeros(n), (delta, discount, c), reverse=True)
        vs = v[:-1] + diff
        vs_next = jnp.concatenate([vs[1:], v[-1:]])
        adv = rho_bar * (reward + discount * vs_next - v[:-1])
        count = jnp.maximum(valid.sum(), 1.0)
        pg = -(pi_a * adv * valid).sum() / count
        vf = 0.5 * (((vs - values[:-1]) ** 2) * valid).sum() / count
        return pg + vf_coeff * vf

    @jax.jit
    def update(params, opt_state, batch):
        grads = jax.grad(loss)(params, *batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    env = envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=args.seed)
    obs, _ = env.reset()
    prev_done = np.zeros(n, bool)
    ep_return, ep_len, finished = np.zeros(n), np.zeros(n), []
    steps, mean = 0, float("nan")
    while steps < args.max_env_steps:
        rows = {k: [] for k in ("obs", "action", "logits", "reward", "terminated", "valid")}
        for _ in range(T):
            action, logits, key = act(params, obs, key)
            action = np.asarray(action)
            rows["obs"].append(obs)
            rows["action"].append(action)
            rows["logits"].append(np.asarray(logits))
            rows["valid"].append(~prev_done)
            obs, reward, terminated, truncated, _ = env.step(action)
            real = ~prev_done
            ep_return += reward * real
            ep_len += real
            done = terminated | truncated
            finished.extend(ep_return[done].tolist())
            ep_return[done], ep_len[done] = 0.0, 0
            rows["reward"].append(reward.astype(np.float32))
            rows["terminated"].append(terminated.astype(np.float32))
            prev_done = done
            steps += n
        rows["obs"].append(obs)
        batch = tuple(np.stack(rows[k]) for k in rows)
        batch = batch[:5] + (batch[5].astype(np.float32),)
        params, opt_state = update(params, opt_state, batch)
        finished = finished[-100:]
        mean = float(np.mean(finished)) if finished else float("nan")
        if len(finished) >= 1 and mean >= args.target:
            break
    out = {
        "seed": args.seed,
        "reached": bool(mean >= args.target),
        "wall_s": time.perf_counter() - _STARTED,
        "env_steps": steps,
        "return_mean": mean,
    }
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
