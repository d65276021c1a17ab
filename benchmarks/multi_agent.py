"""Multi-agent IMPALA: several policies' learner steps in one compiled program.

``python -m benchmarks.multi_agent [--quick] [--parts learner]``:

- ``learner``: M = 1, 2, 8, 32 same-shaped CartPole-sized policies (RLlib's default fcnet, an
  MLP of 256-256 tanh; 4 floats in, 2 actions), each with a batch of 20 columns of T = 50
  (1,000 env steps per policy), updated by one ``PolicyStackLearner`` program, against M
  separate single-policy ``Learner.update`` calls on the same batches (what a Python loop over
  M modules costs), and against one policy's ``Learner.update``. Device batches are put once
  and reused: this times the compiled steps, not the host-to-device copies. The three are
  timed interleaved (common.interleaved), so load from other work hits them alike. Goal (the
  multi-agent issue): 8 policies in one program cost at most 2x one policy's step.

Writes ``results/multi_agent_learner.json``; prints the table.
"""

from __future__ import annotations

import functools
import time

from benchmarks import common

T = 50
COLUMNS = 20  # per policy: T * COLUMNS = 1,000 env steps
POLICIES = (1, 2, 8, 32)
QUICK_POLICIES = (1, 2, 8)
GOAL_POLICIES, GOAL_RATIO = 8, 2.0
SAMPLE_S = 0.5  # a timing sample: many calls of a fast step, one of a slow one


def specs() -> tuple:
    """``(networks, distribution, optimizer, loss, step)`` of one CartPole-sized policy."""
    import gymnasium as gym
    import numpy as np

    from impala_jax.core.distributions import make_distribution
    from impala_jax.core.losses import LossSpec
    from impala_jax.core.networks import make_networks
    from impala_jax.core.optim import OptimizerSpec
    from impala_jax.core.update import StepSpec
    from impala_jax.rllib.model_config_checks import merge_model_config

    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    act_space = gym.spaces.Discrete(2)
    model = merge_model_config({})  # RLlib's default fcnet: 256-256, tanh
    return (
        make_networks(model, obs_space, act_space),
        make_distribution(act_space),
        # experiments/cartpole.py's optimizer and loss settings, as benchmarks/learner.py's.
        OptimizerSpec(lr=0.003, grad_clip=40.0),
        LossSpec(0.99, 0.5, 0.0, 1.0, 1.0, None),
        StepSpec(COLUMNS, 0, 0, COLUMNS, 1, False),
    )


def make_batch(seed: int):
    """One policy's host batch ``[T(+1), COLUMNS]``, CartPole-shaped, episodes ending at 2%."""
    import numpy as np

    from impala_jax.core.types import Trajectory

    rng = np.random.default_rng(seed)
    b = COLUMNS
    done = rng.random((T, b)) < 0.02
    return Trajectory(
        obs=rng.normal(size=(T + 1, b, 4)).astype(np.float32),
        action=rng.integers(0, 2, (T, b)).astype(np.int32),
        behaviour_logits=rng.normal(size=(T, b, 2)).astype(np.float32),
        reward=rng.normal(size=(T, b)).astype(np.float32),
        terminated=done,
        truncated=np.zeros((T, b), bool),
        valid=np.ones((T, b), np.float32),
        param_version=np.zeros(b, np.int32),
    )


def _timed_first(fn) -> tuple[object, float]:
    """``fn()``'s result, waited for, and its seconds (a first call: compilation included)."""
    import jax

    started = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - started


def learner_part(policies: tuple[int, ...], reps: int) -> dict:
    """Seconds per step of the stack, of M separate Learners and of one, per M."""
    import jax
    import numpy as np

    from impala_jax.runtime.learning.learner import Learner
    from impala_jax.runtime.learning.policy_stack import PolicyStackLearner

    one_policy, devices = specs(), jax.devices()[:1]
    keys = list(jax.random.split(jax.random.key(0), max(policies)))
    batches = [make_batch(i) for i in range(max(policies))]
    separate, compile_one = [], None
    for key, batch in zip(keys, batches, strict=True):  # every Learner compiles its own step
        learner = Learner(*one_policy, devices, key)
        placed = learner.put_batch(batch)
        _, seconds = _timed_first(functools.partial(learner.update, placed, 0))
        compile_one = compile_one or seconds
        separate.append((learner, placed))
    block = jax.block_until_ready
    one_learner, one_batch = separate[0]
    one = functools.partial(one_learner.update, one_batch, 0)
    rows = []
    for m in policies:
        stack = PolicyStackLearner(*one_policy, devices, keys[:m])
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches[:m])
        placed, train = stack.put_batch(stacked), np.ones(m, bool)
        stack_step = functools.partial(stack.update, placed, 0, train)
        _, compile_s = _timed_first(stack_step)

        def separate_step(m=m):
            return [learner.update(batch, 0) for learner, batch in separate[:m]]

        steps = {"stack": stack_step, "separate": separate_step, "one_policy": one}
        cases = {
            name: functools.partial(
                common.seconds_per_call, fn, block, common.calls_for(fn, block, SAMPLE_S)
            )
            for name, fn in steps.items()
        }
        samples = common.interleaved(cases, reps)
        sec = {name: common.median(xs) for name, xs in samples.items()}
        # Ratios per repetition (the cases of one repetition ran back to back), then the median.
        ratio = {
            name: common.median([s / o for s, o in zip(xs, samples["one_policy"], strict=True)])
            for name, xs in samples.items()
        }
        row = {
            "policies": m,
            "stack_step_s": sec["stack"],
            "separate_step_s": sec["separate"],
            "one_policy_step_s": sec["one_policy"],
            "stack_over_one_policy": ratio["stack"],
            "separate_over_one_policy": ratio["separate"],
            "stack_over_separate": sec["stack"] / sec["separate"],
            "stack_compile_s": compile_s,
            "samples": samples,
        }
        print(_table([row], header=not rows), flush=True)
        rows.append(row)
        del stack
    return {"rows": rows, "one_policy_compile_s": compile_one}


def _table(rows: list[dict], header: bool = True) -> str:
    text = common.table(
        [
            [
                r["policies"],
                1e3 * r["stack_step_s"],
                1e3 * r["separate_step_s"],
                1e3 * r["one_policy_step_s"],
                r["stack_over_one_policy"],
                r["separate_over_one_policy"],
                r["stack_compile_s"],
            ]
            for r in rows
        ],
        [
            "policies M",
            "stack ms/step",
            "M separate ms/step",
            "one policy ms/step",
            "stack / one",
            "separate / one",
            "stack compile s",
        ],
    )
    return text if header else text.splitlines()[-1]


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        parts={"nargs": "+", "choices": ["learner"], "default": ["learner"]},
    )
    payload: dict = {"T": T, "columns_per_policy": COLUMNS, "model": "fcnet 256-256 tanh"}
    if "learner" in args.parts:
        policies = QUICK_POLICIES if args.quick else POLICIES
        learner = learner_part(policies, reps=3 if args.quick else 7)
        goal = next(r for r in learner["rows"] if r["policies"] == GOAL_POLICIES)
        learner["goal"] = (
            f"{GOAL_POLICIES} policies in one program cost at most {GOAL_RATIO}x one policy's step"
        )
        learner["goal_met"] = goal["stack_over_one_policy"] <= GOAL_RATIO
        payload["learner"] = learner
        print()
        print(_table(learner["rows"]))
        print(
            f"{learner['goal']}: {goal['stack_over_one_policy']:.2f}x "
            f"({'met' if learner['goal_met'] else 'not met'}); one policy's step compiles in "
            f"{learner['one_policy_compile_s']:.1f} s."
        )
    name = "multi_agent_" + "_".join(args.parts) + ("_quick" if args.quick else "")
    path = common.write_result(name, payload, args.quick)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
