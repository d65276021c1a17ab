"""On device (issue 46): gymnax CartPole in one compiled program beside envpool's, same config.

Both paths train ``experiments/cartpole.py``'s config; the device path only changes its env to
``gymnax:CartPole-v1``, so acting, env stepping and the V-trace update run as one program per
learner step (runtime/ondevice/device_engine.py), where the envpool path steps envpool's CartPole-v1
with runner threads. Every measurement is a fresh ``python -m benchmarks.on_device --child PATH``
process: cold with an empty compilation cache of its own, then warm, a second process on the same
cache. Per round the order is envpool cold, device cold, envpool warm, device warm, so a burst of
load from another process hits both paths alike.

Each process reports the env steps/s of training over a fixed window of ``train()`` iterations
after the first (which compiles), the process's CPU seconds (every thread) per env step over
the same window, and the seconds from its launch to the end of the first iteration whose mean
return reaches 450 (the experiment's cap on env steps counts as not reaching it). The figures
are medians over processes; the goal's ratio is device / envpool of the median throughputs.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time

from benchmarks import common

PATHS = {"envpool": None, "device": "gymnax:CartPole-v1"}
SEEDS = 8  # the seed group's size (rllib/seed_group.py): its aggregate env steps/s
ROUNDS, QUICK_ROUNDS = 3, 1
WINDOW, QUICK_WINDOW = 8, 4  # iterations of 0.25 s (the experiment's min_time_s_per_iteration)
TARGET = 450.0
RUN_TIMEOUT_S = 120.0
# A child stops looking for 450 this long after its launch and reports what it has.
CHILD_BUDGET_S = RUN_TIMEOUT_S - 20.0
GOAL_RATIO = 1.5


# A learner-light variant of the same experiment: one update per batch and no replay, so acting
# and env stepping, not the learner's minibatch updates, bound the training rate.
LIGHT = {"minibatch_size": 2560, "replay_proportion": 0.0}


def child(
    path: str, seed: int, window: int, compile_cache: str, launched: float, light: bool = False
) -> dict:
    """One training process (run as ``--child``): the window's throughput and time to 450."""
    from impala_jax.runtime.process.jax_setup import enable_compile_cache, initialize_lapack

    # As the command line does before it builds: the cache first, then jaxlib's LAPACK.
    enable_compile_cache(compile_cache)
    initialize_lapack()
    config, stop = common.load_experiment()
    if PATHS[path]:
        config.environment(PATHS[path])
    config.debugging(seed=seed)
    if light:
        config.training(**LIGHT)
    cap = stop["num_env_steps_sampled_lifetime"]
    algo = config.build()
    built_s = time.time() - launched
    reached_s = reached_steps = None
    window_out: dict = {}
    try:
        iteration, result = 0, algo.train()
        while True:
            iteration += 1
            steps = result["num_env_steps_sampled_lifetime"]
            if reached_s is None and result["env_runners"]["episode_return_mean"] >= TARGET:
                reached_s, reached_steps = time.time() - launched, steps
            if iteration == 1:  # the first iteration compiles: the window starts after it
                cpu0, wall0, steps0 = time.process_time(), time.perf_counter(), steps
            elif iteration == 1 + window:
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                window_out = {
                    "window_env_steps": steps - steps0,
                    "window_wall_s": wall,
                    "env_steps_per_s": (steps - steps0) / wall,
                    "cpu_us_per_env_step": cpu / (steps - steps0) * 1e6,
                    "cores_used": cpu / wall,
                }
            timed_out = time.time() - launched > CHILD_BUDGET_S
            # The learner-light variant measures throughput only: it ends with its window.
            if window_out and (light or reached_s is not None or steps >= cap or timed_out):
                break
            result = algo.train()
    finally:
        algo.stop()
    return {
        "path": path,
        "env": config.env,
        "seed": seed,
        "build_s_from_launch": built_s,
        "reached_450": reached_s is not None,
        "wall_s_to_450": reached_s if reached_s is not None else math.inf,
        "env_steps_to_450": reached_steps,
        "final_return_mean": result["env_runners"]["episode_return_mean"],
        **window_out,
    }


def seeds_child(window: int, compile_cache: str, launched: float) -> dict:
    """``SEEDS`` seeds of the device path in one program (run as ``--child seeds``): their
    aggregate env steps/s over the window, and how many of them reached 450 by its end."""
    from impala_jax import SeedGroup
    from impala_jax.runtime.process.jax_setup import enable_compile_cache, initialize_lapack

    enable_compile_cache(compile_cache)
    initialize_lapack()
    config, stop = common.load_experiment()
    config.environment(PATHS["device"])
    reached: set = set()
    steps = 0
    with SeedGroup(config, range(SEEDS)) as group:
        built_s = time.time() - launched
        for iteration in range(1 + window):
            if iteration == 1:  # after the first, which compiles
                cpu0, wall0, steps0 = time.process_time(), time.perf_counter(), steps
            results = group.train()
            steps = results[0]["num_env_steps_sampled_lifetime"]
            reached |= {
                r["seed"] for r in results if r["env_runners"]["episode_return_mean"] >= TARGET
            }
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "path": "seeds",
        "seeds": SEEDS,
        "build_s_from_launch": built_s,
        "env_steps_per_s": SEEDS * (steps - steps0) / wall,
        "cpu_us_per_env_step": cpu / (SEEDS * (steps - steps0)) * 1e6,
        "cores_used": cpu / wall,
        "seeds_reaching_450": len(reached),
        "env_steps_per_seed": steps,
    }


def launch(path: str, seed: int, window: int, compile_cache: str, light: bool = False) -> dict:
    """One child process, launch to exit; its JSON line, or why there is none."""
    args = ["-m", "benchmarks.on_device", "--child", path, "--seed", str(seed)]
    args += ["--window", str(window), "--compile-cache", compile_cache]
    args += ["--launched", repr(time.time())] + (["--light"] if light else [])
    try:
        proc = common.run_python(args, RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"path": path, "seed": seed, "ok": False, "error": f"over {RUN_TIMEOUT_S} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stdout + proc.stderr)[-800:]
        return {"path": path, "seed": seed, "ok": False, "error": tail}
    return {**json.loads(lines[-1]), "ok": True}


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["ok"]]
    pick = lambda key: [r[key] for r in ok]
    nan = float("nan")
    return {
        "processes": len(runs),
        "failed": len(runs) - len(ok),
        "env_steps_per_s": common.median(pick("env_steps_per_s")) if ok else nan,
        "cpu_us_per_env_step": common.median(pick("cpu_us_per_env_step")) if ok else nan,
        "cores_used": common.median(pick("cores_used")) if ok else nan,
        # A process that missed 450 (or failed) counts as infinitely slow.
        "median_wall_s_to_450_cold": common.median(
            [r.get("wall_s_to_450", math.inf) for r in runs if r["kind"] == "cold"]
        ),
        "median_wall_s_to_450_warm": common.median(
            [r.get("wall_s_to_450", math.inf) for r in runs if r["kind"] == "warm"]
        ),
        "median_env_steps_to_450": common.median(
            [r["env_steps_to_450"] for r in ok if r["env_steps_to_450"] is not None] or [nan]
        ),
    }


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        child={
            "choices": [*PATHS, "seeds"],
            "default": None,
            "help": "internal: one measurement",
        },
        seed={"type": int, "default": 0, "help": "with --child"},
        window={"type": int, "default": WINDOW, "help": "with --child"},
        light={"action": "store_true", "help": "with --child: the learner-light variant"},
        compile_cache={"default": "none", "help": "with --child"},
        launched={"type": float, "default": None, "help": "with --child: launch time.time()"},
    )
    if args.child:
        launched = args.launched if args.launched is not None else time.time()
        if args.child == "seeds":
            out = seeds_child(args.window, args.compile_cache, launched)
        else:
            out = child(
                args.child, args.seed, args.window, args.compile_cache, launched, args.light
            )
        print(json.dumps(out, default=str), flush=True)
        return out
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    window = QUICK_WINDOW if args.quick else WINDOW
    runs = []  # in launch order
    seed_runs = []  # the seed group's, one per round after the others
    light_runs = []  # the learner-light variant's, both paths per round
    for r in range(rounds):
        # One cache per path and round: its cold process fills it, its warm one reads it.
        with tempfile.TemporaryDirectory(prefix="bench_on_device_") as cache:
            for kind in ("cold", "warm"):
                for p in PATHS:
                    run = launch(p, r, window, f"{cache}/{p}")
                    runs.append({**run, "kind": kind, "round": r})
            run = launch("seeds", r, window, f"{cache}/seeds")
            seed_runs.append({**run, "kind": "cold", "round": r})
            for p in PATHS:  # the learner-light variant, on the warm caches
                run = launch(p, r, window, f"{cache}/{p}-light", light=True)
                light_runs.append({**run, "kind": "light", "round": r})
    rows = [
        [
            x["round"],
            x["path"],
            x["kind"],
            x["ok"],
            x.get("build_s_from_launch", math.nan),
            x.get("env_steps_per_s", math.nan),
            x.get("cpu_us_per_env_step", math.nan),
            x.get("cores_used", math.nan),
            x.get("wall_s_to_450", math.nan),
            x.get("env_steps_to_450") or 0,
        ]
        for x in runs
    ]
    headers = ["round", "path", "cache", "ok", "s built", "env steps/s", "CPU us/step", "cores"]
    print(common.table(rows, headers + ["s to 450", "env steps to 450"]))
    for run in (x for x in runs if not x["ok"]):
        print(f"FAILED {run['path']} {run['kind']} round {run['round']}: {run['error']}")
    paths = {p: summarise([x for x in runs if x["path"] == p]) for p in PATHS}
    ratio = paths["device"]["env_steps_per_s"] / paths["envpool"]["env_steps_per_s"]
    for p, s in paths.items():
        print(
            f"{p}: {s['env_steps_per_s']:,.0f} env steps/s, {s['cpu_us_per_env_step']:.2f} CPU "
            f"us per env step, 450 in {s['median_wall_s_to_450_cold']:.1f} s cold, "
            f"{s['median_wall_s_to_450_warm']:.1f} s warm (medians)"
        )
    print(f"device / envpool, median training env steps/s: {ratio:.2f}")
    seeds = summarise_seeds(seed_runs, paths["device"]["env_steps_per_s"])
    light = summarise_light(light_runs)
    print(
        f"learner-light variant ({LIGHT}): device {light['device']:,.0f} vs envpool "
        f"{light['envpool']:,.0f} env steps/s, {light['ratio_device_to_envpool']:.2f}x"
    )
    print(
        f"{SEEDS} seeds in one program: {seeds['env_steps_per_s']:,.0f} env steps/s in all, "
        f"{seeds['ratio_to_one_device_run']:.2f}x one device run; seeds at 450 by the "
        f"window's end: {seeds['seeds_reaching_450']}"
        if seeds["ok"]
        else f"{SEEDS} seeds in one program FAILED: {seed_runs[-1].get('error')}"
    )
    payload = {
        "method": "experiments/cartpole.py, envpool CartPole-v1 vs gymnax:CartPole-v1 on "
        "device; each measurement a fresh process, per round envpool cold, device cold, "
        "envpool warm, device warm (cold: an empty compilation cache, warm: the same cache "
        f"again); env steps/s and process CPU per env step over {window} iterations after the "
        "first; time from launch to a mean return of 450; medians over processes",
        "rounds": rounds,
        "window_iterations": window,
        "runs": runs,
        "envpool": paths["envpool"],
        "device": paths["device"],
        "ratio_device_to_envpool": ratio,
        "seed_group": seeds,
        "learner_light": light,
        "goal": f"training env steps/s on device >= {GOAL_RATIO} x the envpool path's, "
        "same config, same run",
        "goal_met": ratio >= GOAL_RATIO,
    }
    common.write_result("on_device", payload, args.quick)
    return payload


def summarise_light(runs: list[dict]) -> dict:
    """Median env steps/s per path of the learner-light variant, and their ratio."""
    rate = {
        p: common.median([r["env_steps_per_s"] for r in runs if r["ok"] and r["path"] == p])
        if any(r["ok"] and r["path"] == p for r in runs)
        else float("nan")
        for p in PATHS
    }
    return {
        "settings": LIGHT,
        "runs": runs,
        **rate,
        "ratio_device_to_envpool": rate["device"] / rate["envpool"],
    }


def summarise_seeds(runs: list[dict], device_rate: float) -> dict:
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return {"ok": False, "runs": runs}
    rate = common.median([r["env_steps_per_s"] for r in ok])
    return {
        "ok": True,
        "seeds": SEEDS,
        "runs": runs,
        "env_steps_per_s": rate,
        "cpu_us_per_env_step": common.median([r["cpu_us_per_env_step"] for r in ok]),
        "seeds_reaching_450": [r["seeds_reaching_450"] for r in ok],
        "ratio_to_one_device_run": rate / device_rate,
    }


if __name__ == "__main__":
    main()
