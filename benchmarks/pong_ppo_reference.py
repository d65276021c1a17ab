"""A reference for how far 1 M env steps of Pong get on this machine: a minimal PPO loop.

Issue 17 asks impala_jax's Pong to reach a return above -18 within 1 M env steps on 2 CPU
cores. This loop answers whether a different, well-tried algorithm gets there on the same env
(envpool Pong-v5, the same preprocessing and frame size as the run it is compared with) and the
same network (impala_jax's Nature CNN, built by `impala_jax.core.networks.make_networks`). Nothing
else of impala_jax is used: one thread, envpool stepped in lockstep with a jitted policy, then
PPO's update (Schulman et al. 2017, arXiv:1707.06347, its Atari settings: GAE gamma 0.99,
lambda 0.95, 4 epochs of 4 minibatches, clip 0.1, value 0.5 (unclipped here), entropy 0.01,
Adam lr 2.5e-4 with epsilon 1e-5, global-norm clip 0.5, advantages normalised per minibatch).
Written here from the paper's equations. The batch is 32 envs x 32 steps (the paper's 8 x 128
holds as many rows; more envs per `act` call are faster on a CPU).

``python -m benchmarks.pong_ppo_reference [--env-steps N] [--size 42] [--out FILE]`` prints a
JSON line per 20 K env steps: entropy, the last 20 episodes' mean return, and throughput.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-steps", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=42, help="frame height and width")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--T", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entropy-coeff", type=float, default=0.01)
    parser.add_argument("--no-adv-norm", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import envpool
    import gymnasium as gym
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from impala_jax.core.networks import make_networks

    n, T = args.num_envs, args.T
    gamma, lam, clip, vf_coeff, ent_coeff = 0.99, 0.95, 0.1, 0.5, args.entropy_coeff
    epochs, n_mb = 4, 4
    env = envpool.make_gymnasium(
        "Pong-v5",
        num_envs=n,
        seed=args.seed,
        episodic_life=False,
        reward_clip=False,
        img_height=args.size,
        img_width=args.size,
    )
    obs_space = gym.spaces.Box(0, 255, env.observation_space.shape, np.uint8)
    net = make_networks({"encoder": "nature_cnn"}, obs_space, gym.spaces.Discrete(6))
    key = jax.random.key(args.seed)
    key, init_key = jax.random.split(key)
    params = net.init(init_key)
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(2.5e-4, eps=1e-5))
    opt_state = tx.init(params)

    @jax.jit
    def act(params, obs, key):
        key, sub = jax.random.split(key)
        logits, value = net.apply(params, obs)
        action = jax.random.categorical(sub, logits)
        logp = jax.nn.log_softmax(logits)[jnp.arange(obs.shape[0]), action]
        return action, logp, value, key

    def loss_fn(params, mb):
        logits, value = net.apply(params, mb["obs"])
        log_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(log_all, mb["action"][:, None], axis=1)[:, 0]
        w = mb["valid"]
        count = jnp.maximum(w.sum(), 1.0)
        adv = mb["adv"]
        if not args.no_adv_norm:
            mean = (adv * w).sum() / count
            std = jnp.sqrt((((adv - mean) * w) ** 2).sum() / count)
            adv = (adv - mean) / (std + 1e-8)
        ratio = jnp.exp(logp - mb["logp"])
        pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - clip, 1 + clip))
        pg_loss = (pg * w).sum() / count
        vf_loss = 0.5 * (((value - mb["ret"]) ** 2) * w).sum() / count
        entropy = (-(jnp.exp(log_all) * log_all).sum(-1) * w).sum() / count
        total = pg_loss + vf_coeff * vf_loss - ent_coeff * entropy
        kl = (((ratio - 1) - jnp.log(ratio)) * w).sum() / count
        return total, (entropy, kl)

    @jax.jit
    def update(params, opt_state, batch, key):
        rows = batch["obs"].shape[0]
        mb = rows // n_mb

        def epoch(carry, k):
            params, opt_state = carry
            perm = jax.random.permutation(k, rows).reshape(n_mb, mb)
            for rows_i in perm:  # unrolled: XLA:CPU runs conv gradients slowly in scan
                sub = jax.tree.map(lambda x, r=rows_i: x[r], batch)
                (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, sub)
                updates, opt_state = tx.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
            return (params, opt_state), aux

        keys = jax.random.split(key, epochs)
        for e in range(epochs):
            (params, opt_state), aux = epoch((params, opt_state), keys[e])
        return params, opt_state, aux

    def gae(rewards, values, next_value, dones):
        adv = np.zeros_like(rewards)
        last = np.zeros(n, np.float32)
        for t in reversed(range(T)):
            nv = next_value if t == T - 1 else values[t + 1]
            nonterminal = 1.0 - dones[t]
            delta = rewards[t] + gamma * nv * nonterminal - values[t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        return adv, adv + values

    obs, _ = env.reset()
    prev_done = np.zeros(n, bool)
    ep_ret, returns, log = np.zeros(n), [], []
    steps, started, next_report = 0, time.perf_counter(), 20_000
    entropy = kl = float("nan")
    while steps < args.env_steps:
        buf = {k: [] for k in ("obs", "action", "logp", "value", "reward", "done", "valid")}
        for _ in range(T):
            action, logp, value, key = act(params, obs, key)
            action = np.asarray(action)
            next_obs, reward, term, trunc, _ = env.step(action)
            done = np.logical_or(term, trunc)
            # envpool resets an env on the step after its last one; that step is not a
            # transition of the policy (its action is ignored) and is left out of the loss.
            valid = ~prev_done
            ep_ret += np.where(valid, reward, 0.0)
            for i in np.flatnonzero(done & valid):
                returns.append(ep_ret[i])
                ep_ret[i] = 0.0
            step = (obs, action, np.asarray(logp), np.asarray(value), reward, done, valid)
            for k, v in zip(buf, step, strict=True):
                buf[k].append(v)
            obs, prev_done = next_obs, done & valid
            steps += n
        _, _, next_value, _ = act(params, obs, key)
        values = np.asarray(buf["value"], np.float32)
        rewards = np.clip(np.asarray(buf["reward"], np.float32), -1, 1)
        # A fake (reset) step must not pass its value backwards: the step before it is done.
        dones = np.asarray(buf["done"], np.float32)
        adv, ret = gae(rewards, values, np.asarray(next_value), dones)
        batch = {
            "obs": np.asarray(buf["obs"]).reshape(T * n, *obs.shape[1:]),
            "action": np.asarray(buf["action"]).reshape(-1),
            "logp": np.asarray(buf["logp"], np.float32).reshape(-1),
            "adv": adv.reshape(-1),
            "ret": ret.reshape(-1),
            "valid": np.asarray(buf["valid"], np.float32).reshape(-1),
        }
        key, sub = jax.random.split(key)
        params, opt_state, (ent, kl_) = update(params, opt_state, batch, sub)
        entropy, kl = float(ent), float(kl_)
        if steps >= next_report:
            next_report += 20_000
            row = {
                "env_steps": steps,
                "seconds": round(time.perf_counter() - started, 1),
                "env_steps_per_s": round(steps / (time.perf_counter() - started), 1),
                "entropy": round(entropy, 4),
                "approx_kl": kl,
                "episodes": len(returns),
                "return_mean_last_20": float(np.mean(returns[-20:])) if returns else None,
            }
            log.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(log, f)
    return log


if __name__ == "__main__":
    main()
