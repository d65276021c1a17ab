"""Multi-agent IMPALA: several policies' learner steps in one compiled program, the multi-agent
runners' speed, and RLlib's tuned multi-agent example.

``python -m benchmarks.multi_agent [--quick] [--parts learner speed tuned]``:

- ``learner``: M = 1, 2, 8, 32 same-shaped CartPole-sized policies (RLlib's default fcnet, an
  MLP of 256-256 tanh; 4 floats in, 2 actions), each with a batch of 20 columns of T = 50
  (1,000 env steps per policy), updated by one ``PolicyStackLearner`` program, against M
  separate single-policy ``Learner.update`` calls on the same batches (what a Python loop over
  M modules costs), and against one policy's ``Learner.update``. Device batches are put once
  and reused: this times the compiled steps, not the host-to-device copies. The three are
  timed interleaved (common.interleaved), so load from other work hits them alike. Goal (the
  multi-agent issue): 8 policies in one program cost at most 2x one policy's step.

- ``speed``: RLlib's multi-agent CartPole (2 agents, 2 policies, one runner thread of 16 envs,
  T = 50, 1,000 env steps = 2,000 agent steps per update) against single-agent CartPole on the
  same gymnasium env (not envpool: the same env code either side; 32 envs, T = 50, 2,000 env
  steps per update): the same poles, the same agent steps per update. Fresh processes in
  alternating order, env and agent steps/s over the iterations after the first.
- ``tuned``: RLlib's ``multi_agent_cartpole_impala.py`` with its import swapped
  (tests/rllib_examples/), run as a user runs it (``python -m impala_jax.run FILE --seed S``),
  seeds 0-2: env steps and seconds to its stop (350 per agent, 2.5 M env steps).

Writes ``results/multi_agent_<parts>.json``; prints the tables.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

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


SPEED_ITERATIONS = 7  # per process; the first (compiling) not counted
TUNED = common.REPO / "tests" / "rllib_examples" / "multi_agent_cartpole_impala.py"
TUNED_STOP = 700.0


def speed_child(kind: str) -> dict:
    """One process of the ``speed`` part (``kind`` "multi" or "single"): its median env steps/s
    and agent steps/s over the iterations after the first."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    from impala_jax import IMPALAConfig

    config = (
        IMPALAConfig()
        .env_runners(num_env_runners=1, rollout_fragment_length=T)
        .training(lr=0.0005, vf_loss_coeff=0.01, entropy_coeff=0.0, grad_clip=30.0)
        .rl_module(model_config={"vf_share_layers": True})
        .reporting(min_time_s_per_iteration=3)
        .debugging(seed=0)
    )
    agents = 2 if kind == "multi" else 1
    if kind == "multi":
        config.environment(MultiAgentCartPole, env_config={"num_agents": agents})
        config.env_runners(num_envs_per_env_runner=16).training(train_batch_size_per_learner=1000)
        config.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_by_agent)
    else:
        config.environment(_gym_cartpole)
        config.env_runners(num_envs_per_env_runner=32).training(train_batch_size_per_learner=2000)
    rates = []
    with config.build() as algo:
        for i in range(SPEED_ITERATIONS):
            result = algo.train()
            if i:
                rates.append(
                    result["env_runners"]["num_env_steps_sampled"] / result["time_this_iter_s"]
                )
    rate = statistics.median(rates)
    return {"kind": kind, "env_steps_per_s": rate, "agent_steps_per_s": rate * agents}


def _by_agent(agent_id, episode, **kwargs):
    return f"p{agent_id}"


def _gym_cartpole(env_config):
    import gymnasium as gym

    return gym.make("CartPole-v1")


def _launch(args: list[str], timeout: float) -> dict:
    """A child process's last JSON line, or why there is none."""
    try:
        proc = common.run_python(args, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s", "args": args}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-800:], "args": args}
    return {**json.loads(lines[-1]), "ok": True}


def speed_part(pairs: int) -> dict:
    runs = []
    for i in range(pairs):
        for kind in ("multi", "single") if i % 2 == 0 else ("single", "multi"):
            run = _launch(["-m", "benchmarks.multi_agent", "--child", kind], 600)
            runs.append(run)
            print("speed", kind, {k: run.get(k) for k in ("env_steps_per_s", "error")}, flush=True)
    ok = [r for r in runs if r.get("ok")]
    multi = [r["agent_steps_per_s"] for r in ok if r["kind"] == "multi"]
    single = [r["agent_steps_per_s"] for r in ok if r["kind"] == "single"]
    out = {"runs": runs}
    if multi and single:
        out["multi_agent_steps_per_s"] = statistics.median(multi)
        out["single_env_steps_per_s"] = statistics.median(single)
        out["ratio"] = out["multi_agent_steps_per_s"] / out["single_env_steps_per_s"]
    return out


def tuned_part(seeds: int) -> dict:
    """RLlib's tuned multi-agent file through the CLI, as a user runs it, per seed."""
    runs = []
    for seed in range(seeds):
        started = time.time()
        with tempfile.TemporaryDirectory() as logdir:
            args = ["-m", "impala_jax.run", "--quiet", "--logdir", logdir, "--seed", str(seed)]
            try:
                proc = common.run_python([*args, str(TUNED)], 1800)
            except subprocess.TimeoutExpired:
                runs.append({"seed": seed, "ok": False, "error": "timed out after 1800 s"})
                continue
            result = _last_result(logdir)
        row = {
            "seed": seed,
            "ok": proc.returncode == 0 and result is not None,
            "wall_s_from_launch": time.time() - started,
            "return": result and result["env_runners"].get("episode_return_mean"),
            "env_steps": result and result["num_env_steps_sampled_lifetime"],
        }
        row["reached"] = bool(row["return"] and row["return"] >= TUNED_STOP)
        runs.append(row)
        print("tuned", row, flush=True)
    return {"runs": runs, "stop": TUNED_STOP, "reached": sum(r.get("reached", False) for r in runs)}


def _last_result(logdir: str) -> dict | None:
    files = sorted(Path(logdir).glob("*/result.json"))
    if not files:
        return None
    lines = files[-1].read_text().splitlines()
    return json.loads(lines[-1]) if lines else None


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        parts={"nargs": "+", "choices": ["learner", "speed", "tuned"], "default": ["learner"]},
        child={"default": None, "help": "internal: one speed process, multi or single"},
    )
    if args.child:
        print(json.dumps(speed_child(args.child)))
        return {}
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
    if "speed" in args.parts:
        payload["speed"] = speed = speed_part(1 if args.quick else 3)
        if "ratio" in speed:
            print(
                f"multi-agent CartPole {speed['multi_agent_steps_per_s']:,.0f} agent steps/s, "
                f"single-agent {speed['single_env_steps_per_s']:,.0f} env steps/s: "
                f"{speed['ratio']:.2f}x"
            )
    if "tuned" in args.parts:
        payload["tuned"] = tuned = tuned_part(1 if args.quick else 3)
        print(
            f"RLlib's tuned file reached {TUNED_STOP} in {tuned['reached']} of {len(tuned['runs'])}"
        )
    name = "multi_agent_" + "_".join(args.parts) + ("_quick" if args.quick else "")
    path = common.write_result(name, payload, args.quick)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
