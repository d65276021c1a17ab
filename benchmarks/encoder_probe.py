"""Can an encoder see where a small ball is relative to a paddle? A supervised probe (issue 17).

Pong needs the policy to tell whether the ball is above or below the paddle, from a frame whose
objects cover a few pixels of a constant background. This probe asks exactly that, without RL:
synthetic Pong-like frame stacks (background 87, a 2 x 2 ball and a 6 x 2 paddle at 236, the grey
levels of envpool's Pong at 84 x 84), labelled by the ball's column against the paddle's (left,
under, right); impala_jax's own network (`impala_jax.core.networks.make_networks`, the encoder under
test and the policy head) is trained on them with softmax cross-entropy and Adam, 64 frames per
step, and the held-out accuracy is printed every `--every` steps. A chance-level accuracy after
hundreds of steps means the policy gradient, a far noisier signal, will not find the relation
soon either.

Measured (2026-12-03, 2 cores shared with a training run, Adam 5e-4, 4,096 training frames):

| encoder | frame | held-out accuracy at step 250 / 500 / 1,000+ |
|---|---|---|
| Nature CNN | 42 x 42 | 0.45-0.49 (chance) through step 600 |
| Nature CNN | 84 x 84 | 0.46-0.51 through step 1,000; 0.72 at 1,250 |
| IMPALA ResNet [16, 32, 32] | 42 x 42 | 0.96 / 0.99 / 0.98 |
| IMPALA ResNet [8, 16, 16] | 42 x 42 | 0.95 / 0.98 |

``python -m benchmarks.encoder_probe [--size 42] [--encoder impala_cnn] [--channels 8,16,16]
[--steps 500]`` prints one JSON line per evaluation.
"""

from __future__ import annotations

import argparse
import json
import time

BACKGROUND, FOREGROUND = 87, 236  # envpool Pong-v5 grey levels at 84 x 84


def frames(rng, n: int, size: int):
    """n frame stacks [n, 4, size, size] uint8 and labels 0 (ball left), 1 (under), 2 (right)."""
    import numpy as np

    x = np.full((n, 4, size, size), BACKGROUND, np.uint8)
    y = np.zeros(n, np.int32)
    for i in range(n):
        bx, by = rng.integers(0, size - 2), rng.integers(0, size - 6)
        px = rng.integers(3, size - 3)
        x[i, :, by : by + 2, bx : bx + 2] = FOREGROUND
        x[i, :, size - 2 :, px - 3 : px + 3] = FOREGROUND
        d = (bx + 1) - px
        y[i] = 0 if d < -1 else (2 if d > 1 else 1)
    return x, y


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=42, help="frame height and width")
    parser.add_argument("--encoder", default="impala_cnn", choices=["nature_cnn", "impala_cnn"])
    parser.add_argument("--channels", default="16,32,32", help="impala_cnn_channels")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import gymnasium as gym
    import jax
    import numpy as np
    import optax

    from impala_jax.core.networks import make_networks

    rng = np.random.default_rng(args.seed)
    x_train, y_train = frames(rng, 4096, args.size)
    x_test, y_test = frames(rng, 1024, args.size)
    model_config = {
        "encoder": args.encoder,
        "impala_cnn_channels": [int(c) for c in args.channels.split(",")],
    }
    space = gym.spaces.Box(0, 255, (4, args.size, args.size), np.uint8)
    nets = make_networks(model_config, space, gym.spaces.Discrete(3))
    params = jax.jit(nets.init)(jax.random.key(args.seed))
    opt = optax.adam(args.lr)
    opt_state = opt.init(params)

    def loss(p, x, y):
        logits, _ = nets.apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, s, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    @jax.jit
    def accuracy(p, x, y):
        return (nets.apply(p, x)[0].argmax(-1) == y).mean()

    rows, start = [], time.perf_counter()
    for i in range(args.steps + 1):
        idx = rng.integers(0, len(x_train), 64)
        params, opt_state, value = step(params, opt_state, x_train[idx], y_train[idx])
        if i % args.every == 0:
            row = {
                "step": i,
                "loss": round(float(value), 4),
                "test_accuracy": round(float(accuracy(params, x_test, y_test)), 4),
                "majority_class": round(float(np.bincount(y_test).max() / len(y_test)), 4),
                "seconds": round(time.perf_counter() - start, 1),
                **vars(args),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
