"""End to end: env steps/s of training next to raw envpool stepping of the same envs, same run.

``--env cartpole`` trains with ``experiments/cartpole.py``'s config; ``--env pong`` trains Atari
Pong (envpool ``Pong-v5``, frameskip 4) with a small CPU config. After a warm-up iteration
(compilation), rounds alternate: raw envpool stepping of the same number of envs with random
actions (one ``envpool.make(..., num_envs=N)``, synchronous ``step``, on envpool's default
threads and on the runner's: the faster is the machine's ceiling and the goal's reference), the
same envs stepped through envpool's C++ binding as impala_jax's runner steps them
(``_send``/``_recv``, without envpool's Python layer, on the runner's envpool threads: reported
beside it, so that the runner's use of the binding is not counted as beating envpool), then the
compute-only loop (below), then ``train()`` iterations. Ratios are taken per round and their
medians reported, with the per-stage time breakdown from the result dicts' ``timers`` and
``perf``.

The compute-only reference runs the algorithm's own programs on synthetic data of the training
shapes, no envs and no threads: per learner batch, ``batch / num_envs`` calls of its ``act``
(jitted, or NumPy's: ``inference_backend``) on one ``[num_envs, *obs]`` array (each result
fetched to the host, as a runner does) and one learner step (all its minibatch updates) on a
throwaway copy of the learner state. Its env steps/s is what the machine's compute allows with
nothing else running; with raw envpool stepping it gives the machine's ceiling,
``min(raw envpool, compute-only)``, and every end-to-end figure is also reported as a fraction
of that ceiling, measured in the same round.

Each reference and the training iterations are also timed in CPU seconds of the whole process
(every thread: envpool's, XLA's, the runner's), per env step. Two throughputs follow from them,
at 100 % of the process's cores: training's own CPU per env step, and the pieces' alone (the
binding's stepping plus the compute-only loop, with none of the runner's bookkeeping). A figure
that training cannot reach at its CPU cost, or that the pieces alone cannot reach, is bounded
by this machine's cores, not by how the work is scheduled.

While raw envpool runs, the paused algorithm's runner thread fills the bounded learner queue
and then blocks, so after a short settling pause the raw figure is not shared with it; the
first iteration after each pause is run but not counted.
"""

from __future__ import annotations

import math
import os
import resource
import time

import numpy as np

from benchmarks import common

# Which thread owns each stage (timers are per stage, summed over the threads that record it).
STAGES = {
    "env_recv_s": "runner",
    "env_send_s": "runner",
    "inference_s": "runner",
    "queue_put_wait_s": "runner",
    "stack_s": "loader",
    "transfer_s": "loader",
    "learner_wait_s": "main",
    "learner_dispatch_s": "main",
    "broadcast_s": "main",
    "learner_fetch_s": "main",
}


def pong_config(quick: bool, envs=16, threads=1, encoder="nature_cnn", batch=160):
    """The CPU default: 1 runner x 16 envs, T=20, batch 160, Nature CNN. A GPU run (gpu.sh)
    gives more envs, envpool threads, the deep IMPALA CNN and the paper's batch (32 x 20)."""
    from impala_jax import IMPALAConfig

    return (
        IMPALAConfig()
        .environment("Pong-v5")
        .env_runners(
            num_env_runners=1,
            num_envs_per_env_runner=envs,
            num_cpus_per_env_runner=threads,
            rollout_fragment_length=20,
        )
        .training(lr=6e-4, train_batch_size_per_learner=batch, entropy_coeff=0.01, grad_clip=40.0)
        .learners(num_learners=0)
        .rl_module(model_config={"encoder": encoder})
        .reporting(min_time_s_per_iteration=2.0)
        .debugging(seed=0)
    )


def cpu_s() -> float:
    """CPU seconds of this process so far, every thread's."""
    t = os.times()
    return t.user + t.system


def make_envpool(env_id: str, num_envs: int, num_threads: int):
    """One synchronous envpool batch of ``num_envs``, reset."""
    import envpool

    env = envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        seed=12345,
        num_threads=num_threads,
    )
    env.reset()
    return env


def raw_envpool(env_id: str, num_envs: int, seconds: float, env=None, num_threads: int = 0):
    """(env steps/s, CPU s per env step, env): random actions on one synchronous envpool batch
    of ``num_envs`` on ``num_threads`` envpool threads (0: envpool's default)."""
    if env is None:
        env = make_envpool(env_id, num_envs, num_threads)
    n_actions = env.action_space.n
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, n_actions, num_envs).astype(np.int32) for _ in range(64)]
    steps = 0
    started, cpu = time.perf_counter(), cpu_s()
    while (elapsed := time.perf_counter() - started) < seconds:
        for a in actions[:8]:
            env.step(a)
        steps += 8
        actions.append(actions.pop(0))
    return steps * num_envs / elapsed, (cpu_s() - cpu) / (steps * num_envs), env


def raw_binding(env, num_envs: int, seconds: float) -> tuple[float, float]:
    """(env steps/s, CPU s per env step) of random actions on ``env`` stepped through envpool's
    C++ binding, as impala_jax's runner steps it (envs.EnvpoolVecEnv): raw_envpool's loop
    without envpool's Python send and recv."""
    from impala_jax.runtime.envs.vec_env import _binding_layout

    layout = _binding_layout(env)
    if layout is None:
        return float("nan"), float("nan")
    rng = np.random.default_rng(1)
    actions = [rng.integers(0, env.action_space.n, num_envs) for _ in range(8)]
    ids = np.arange(num_envs, dtype=np.int32)
    steps = 0
    started, cpu = time.perf_counter(), cpu_s()
    while (elapsed := time.perf_counter() - started) < seconds:
        for a in actions:
            env._send([ids.copy(), ids, a.astype(layout.action_dtype, order="C")])
            env._recv()
        steps += len(actions)
    return steps * num_envs / elapsed, (cpu_s() - cpu) / (steps * num_envs)


def compute_only(algo, seconds: float) -> tuple[float, float]:
    """(env steps/s, CPU s per env step) of the algorithm's ``act`` and learner step alone, on
    zeros of the training shapes (see the module docstring); the learner's own state is not
    touched."""
    import jax

    from impala_jax.runtime.acting.env_runner import actor_key

    if algo.recurrent:
        raise ValueError("compute_only times feedforward policies (CartPole, Pong)")
    config = algo.config
    envs = config.num_envs_per_env_runner
    group = algo.env_runner_group
    T = config.get_rollout_fragment_length()
    example = algo.policy.example_batch(T, group.batcher.columns, algo.action_dtype)
    example = example._replace(valid=np.ones_like(example.valid))
    batch_steps = example.valid.size
    acts_per_batch = max(1, batch_steps // envs)
    space = algo.observation_space
    obs = np.zeros((envs, *space.shape), space.dtype)
    params, _ = algo.param_store.get()
    key = actor_key(1, params, algo._act)  # a Generator for the NumPy actor (host_actor.py)
    learner = algo.learner
    state, replay = learner.throwaway_copy()
    device_batch = learner.put_batch(example)
    learner.wait_for_warm_up()
    step = learner._compiled or learner._step  # the program update() runs
    zero = np.zeros((2,), np.float32)  # a host value, as update() passes it

    def one_batch(state, replay, key):
        for _ in range(acts_per_batch):
            action, _, key = algo._act(params, obs, key)
            np.asarray(action)  # a runner fetches every action to step its envs
        state, replay, metrics = step(state, device_batch, replay, zero)
        return state, replay, key, metrics

    state, replay, key, metrics = one_batch(state, replay, key)  # compiled already; warm it
    jax.block_until_ready(metrics)
    batches, started, cpu = 0, time.perf_counter(), cpu_s()
    while time.perf_counter() - started < seconds or batches == 0:
        state, replay, key, metrics = one_batch(state, replay, key)
        jax.block_until_ready(metrics)
        batches += 1
    steps = batches * batch_steps
    return steps / (time.perf_counter() - started), (cpu_s() - cpu) / steps


def measure(
    config, env_id: str, rounds: int, iters: int, raw_s: float, settle_s: float, budget_s: float
):
    started = time.perf_counter()
    algo = config.build()
    build_s = time.perf_counter() - started
    num_envs = max(1, config.num_env_runners) * config.num_envs_per_env_runner
    try:
        started = time.perf_counter()
        warm = algo.train()  # compiles act and the learner step
        warmup_s = time.perf_counter() - started
        # Raw envpool runs on envpool's default thread count (0: one per core) and, where that
        # differs, on the runner's (envs.make_vec_env's rule); the faster is the reference.
        # On 2 cores the default's two threads beside the stepping thread fall for seconds at a
        # time from ~800 K to ~350 K CartPole env steps/s (at 2.5x the CPU per env step), where
        # one thread holds 710-820 K (2026-12-05): a reference that halves at random would make
        # the ratio a count of its slow rounds.
        runner_threads = max(1, math.ceil(config.num_cpus_per_env_runner))
        default_threads = runner_threads if runner_threads > 1 else 0
        env = None
        runner_env = make_envpool(env_id, num_envs, runner_threads)
        per_round, results = [], []
        for r in range(rounds):
            if r and time.perf_counter() - started > budget_s:
                break  # a slow learner (a CNN on CPU) gets fewer rounds, not a timeout
            time.sleep(settle_s)
            cpu = {}  # CPU s per env step
            raw_default, cpu_default, env = raw_envpool(
                env_id, num_envs, raw_s, env, default_threads
            )
            raw_runner, cpu_runner = raw_default, cpu_default
            if default_threads != runner_threads:
                raw_runner, cpu_runner, _ = raw_envpool(
                    env_id, num_envs, raw_s, runner_env, runner_threads
                )
            raw = max(raw_default, raw_runner)
            cpu["raw_envpool"] = cpu_default if raw == raw_default else cpu_runner
            # The binding on the runner's threads: its CPU per env step is what the runner's
            # stepping costs.
            binding, cpu["raw_binding"] = raw_binding(runner_env, num_envs, raw_s)
            compute, cpu["compute_only"] = compute_only(algo, raw_s)
            ceiling = min(raw, compute)
            # The first iteration after the pause carries the runner's blocked put and a full
            # queue: it is run but not counted.
            algo.train()
            c4 = cpu_s()
            its = [algo.train() for _ in range(iters)]
            c5 = cpu_s()
            results.extend(its)
            sampled = sum(x["env_runners"]["num_env_steps_sampled"] for x in its)
            cpu["train"] = (c5 - c4) / sampled
            trained = sum(x["learners"]["default_policy"]["num_env_steps_trained"] for x in its)
            wall = sum(x["time_this_iter_s"] for x in its)
            per_round.append(
                {
                    "round": r,
                    "raw_envpool_steps_per_s": raw,
                    "raw_envpool_default_threads_steps_per_s": raw_default,
                    "raw_envpool_runner_threads_steps_per_s": raw_runner,
                    "ratio_sampled_to_raw_default_threads": sampled / wall / raw_default,
                    "train_env_steps_sampled_per_s": sampled / wall,
                    "train_env_steps_trained_per_s": trained / wall,
                    "ratio_sampled_to_raw": sampled / wall / raw,
                    "raw_binding_steps_per_s": binding,
                    "ratio_sampled_to_raw_binding": sampled / wall / binding,
                    "compute_only_steps_per_s": compute,
                    "ceiling_steps_per_s": ceiling,
                    "ceiling_bound_by": "envpool" if raw <= compute else "compute",
                    "ratio_sampled_to_ceiling": sampled / wall / ceiling,
                    "episode_return_mean": its[-1]["env_runners"]["episode_return_mean"],
                    "cpu_us_per_env_step": {k: v * 1e6 for k, v in cpu.items()},
                    "train_cores_used": (c5 - c4) / wall,
                }
            )
        env.close()
        runner_env.close()
    finally:
        algo.stop()
    wall = sum(x["time_this_iter_s"] for x in results)
    timers: dict[str, float] = {}
    for x in results:
        for k, v in x["timers"].items():
            timers[k] = timers.get(k, 0.0) + v
    breakdown = {
        k: {"thread": STAGES.get(k, "?"), "seconds_per_wall_second": v / wall}
        for k, v in sorted(timers.items())
    }
    perf = {
        k: common.median([x["perf"][k] for x in results])
        for k in results[0]["perf"]
        if isinstance(results[0]["perf"][k], int | float)
    }
    pick = lambda key: [p[key] for p in per_round]
    cores = len(os.sched_getaffinity(0))
    cpu_us = {
        k: common.median([p["cpu_us_per_env_step"][k] for p in per_round])
        for k in per_round[0]["cpu_us_per_env_step"]
    }
    raw_median = common.median(pick("raw_envpool_steps_per_s"))
    # Env steps/s with every core busy at the measured CPU cost per env step.
    at_full_cores = {
        "train": cores / cpu_us["train"] * 1e6,
        "pieces": cores / (cpu_us["raw_binding"] + cpu_us["compute_only"]) * 1e6,
    }
    return {
        "env_id": env_id,
        "num_envs": num_envs,
        "num_env_runners": config.num_env_runners,
        "rollout_fragment_length": config.get_rollout_fragment_length(),
        "train_batch_size_per_learner": config.train_batch_size_per_learner,
        "build_s": build_s,
        "warmup_iteration_s": warmup_s,
        "warmup_iteration_timers": warm["timers"],
        "rounds": per_round,
        "train_env_steps_per_s": common.median(pick("train_env_steps_sampled_per_s")),
        "train_env_steps_trained_per_s": common.median(pick("train_env_steps_trained_per_s")),
        "raw_envpool_steps_per_s": raw_median,
        "ratio_to_raw": common.median(pick("ratio_sampled_to_raw")),
        "envpool_threads": {"default": default_threads, "runner": runner_threads},
        "ratio_to_raw_default_threads": common.median(pick("ratio_sampled_to_raw_default_threads")),
        "raw_binding_steps_per_s": common.median(pick("raw_binding_steps_per_s")),
        "ratio_to_raw_binding": common.median(pick("ratio_sampled_to_raw_binding")),
        "compute_only_steps_per_s": common.median(pick("compute_only_steps_per_s")),
        "ceiling_steps_per_s": common.median(pick("ceiling_steps_per_s")),
        "ratio_to_ceiling": common.median(pick("ratio_sampled_to_ceiling")),
        "cores": cores,
        "cpu_us_per_env_step": cpu_us,
        "train_cores_used": common.median(pick("train_cores_used")),
        "steps_per_s_at_full_cores": at_full_cores,
        "ratio_to_raw_at_full_cores": {k: v / raw_median for k, v in at_full_cores.items()},
        "stage_breakdown": breakdown,
        "perf_median": perf,
        "peak_rss_mib_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        env={"choices": ["cartpole", "pong"], "default": "cartpole"},
        pong_envs={"type": int, "default": 16, "help": "Pong envs (one runner)"},
        pong_threads={"type": int, "default": 1, "help": "envpool threads for them (and raw)"},
        pong_encoder={"default": "nature_cnn", "choices": ["nature_cnn", "impala_cnn"]},
        pong_batch={"type": int, "default": 160, "help": "train_batch_size_per_learner"},
        split={
            "default": "auto",
            "choices": ["auto", "on", "off"],
            "help": "the runner's two alternating env groups: as the cores decide, forced on/off",
        },
        name={"default": None, "help": "result name (default end_to_end_<env>)"},
        budget_s={"type": float, "default": None, "help": "seconds of rounds at most"},
    )
    if args.split != "auto":
        from impala_jax.runtime.acting.env_runner import EnvRunner

        EnvRunner.split_min_cpus = 0 if args.split == "on" else 10**6
    if args.env == "cartpole":
        config, _ = common.load_experiment()
        env_id = "CartPole-v1"
        # Six iterations of 0.25 s per round, as long as each reference runs: with two (0.5 s)
        # the rounds' ratios spread 0.36-0.70 in one run (2026-12-04).
        rounds, iters, raw_s = (2, 1, 1.0) if args.quick else (6, 6, 1.5)
        budget_s = 60.0
    else:
        config = pong_config(
            args.quick, args.pong_envs, args.pong_threads, args.pong_encoder, args.pong_batch
        )
        env_id = "Pong-v5"
        rounds, iters, raw_s = (1, 1, 2.0) if args.quick else (3, 1, 3.0)
        budget_s = 30.0 if args.quick else 60.0
    budget_s = args.budget_s or budget_s
    out = measure(config, env_id, rounds, iters, raw_s, settle_s=0.3, budget_s=budget_s)
    frameskip = 4 if args.env == "pong" else 1
    rows = [
        [
            r["round"],
            r["raw_envpool_steps_per_s"] * frameskip,
            r["train_env_steps_sampled_per_s"] * frameskip,
            r["train_env_steps_trained_per_s"] * frameskip,
            r["ratio_sampled_to_raw"],
            r["ratio_sampled_to_raw_binding"],
            r["compute_only_steps_per_s"] * frameskip,
            r["ratio_sampled_to_ceiling"],
            r["ceiling_bound_by"],
        ]
        for r in out["rounds"]
    ]
    unit = "frames/s" if frameskip > 1 else "steps/s"
    print(
        common.table(
            rows,
            [
                "round",
                f"raw envpool {unit}",
                f"train {unit}",
                f"trained {unit}",
                "/ raw",
                "/ raw binding",
                f"compute-only {unit}",
                "/ ceiling",
                "bound by",
            ],
        )
    )
    cpu_us, full = out["cpu_us_per_env_step"], out["ratio_to_raw_at_full_cores"]
    print(
        f"CPU us per env step (whole process): raw envpool {cpu_us['raw_envpool']:.2f}, "
        f"binding {cpu_us['raw_binding']:.2f}, compute-only {cpu_us['compute_only']:.2f}, "
        f"training {cpu_us['train']:.2f} on {out['train_cores_used']:.2f} of "
        f"{out['cores']} cores. With every core busy: training's cost allows "
        f"{full['train']:.2f} of raw envpool, the pieces alone {full['pieces']:.2f}."
    )
    breakdown = out["stage_breakdown"]
    print(
        common.table(
            [[k, v["thread"], v["seconds_per_wall_second"]] for k, v in breakdown.items()],
            ["stage", "thread", "s per wall s"],
        )
    )
    if args.env == "cartpole":
        steps = out["train_env_steps_per_s"]
        # Issue 12's goal was 300 K env steps/s and 0.4 of raw; issue 14 asks 0.6 of raw.
        out["goal"] = ">= 0.6 of raw envpool at the same env count (and >= 300,000 env steps/s)"
        out["goal_met"] = out["ratio_to_raw"] >= 0.6
        out["goal_met_300k"] = steps >= 300_000
        name = "end_to_end_cartpole"
    else:
        out["frameskip"] = frameskip
        out["train_env_frames_per_s"] = out["train_env_steps_per_s"] * frameskip
        out["raw_envpool_frames_per_s"] = out["raw_envpool_steps_per_s"] * frameskip
        out["config"] = (
            f"1 runner x {args.pong_envs} envs on {args.pong_threads} envpool threads, T=20, "
            f"batch {args.pong_batch}, {args.pong_encoder}, split {args.split}"
        )
        out["goal"] = ">= 0.7 of the machine's ceiling, min(raw envpool, compute-only)"
        out["goal_met"] = out["ratio_to_ceiling"] >= 0.7
        name = "end_to_end_pong"
    out["split"] = args.split
    common.write_result(args.name or name, out, args.quick)
    return out


if __name__ == "__main__":
    main()
