"""Overhead of a Ray Tune trial over a plain ``train()`` loop: time to 450 on CartPole-v1.

Both sides are whole processes launched from here, alternating seed by seed, with the same
config (``experiments/cartpole.py``), the same stop and the same primed compilation cache:

- direct: a process that builds ``IMPALA`` and calls ``train()`` until the stop is reached;
- Tune: a process that starts a local Ray (``num_cpus`` = the machine's), runs
  ``tune.Tuner("impala_jax", param_space=config, stop=...)`` with one trial and exits.

Wall-clock runs from launch to exit. The Tune side also reports its trial's own training time
(``time_total_s``), so the overhead splits into Ray/Tune start-up and the trial's slower or
faster training.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common

SEEDS = [0, 1, 2]
QUICK_SEEDS = [0]
RUN_TIMEOUT_S = 240
_STARTED = time.perf_counter()  # a child's stages are timed from its module's import


def _child(mode: str, seed: int, out: str) -> None:
    """One measured run; writes its figures as JSON to `out`."""
    from impala_jax.cli.experiment import load_experiment
    from impala_jax.cli.stop_criteria import stop_reached

    config, stop = load_experiment(common.CARTPOLE_EXPERIMENT)
    stages = {"imports_s": time.perf_counter() - _STARTED}
    config.debugging(seed=seed)
    if mode == "direct":
        from impala_jax.runtime.process.jax_setup import enable_compile_cache

        enable_compile_cache(os.environ["IMPALA_JAX_COMPILE_CACHE"])
        with config.build() as algo:
            while True:
                result = algo.train()
                if stop_reached(result, stop):
                    break
    else:
        import ray
        from ray import tune

        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        stages["ray_init_s"] = time.perf_counter() - t0
        try:
            with tempfile.TemporaryDirectory(prefix="bench_tune_") as storage:
                grid = tune.Tuner(
                    "impala_jax",
                    param_space=config,
                    run_config=tune.RunConfig(stop=stop, storage_path=storage, verbose=0),
                ).fit()
                stages["tuner_fit_s"] = time.perf_counter() - t0 - stages["ray_init_s"]
                result = grid[0].metrics
                if grid[0].error is not None:
                    raise grid[0].error
        finally:
            t1 = time.perf_counter()
            ray.shutdown()
            stages["ray_shutdown_s"] = time.perf_counter() - t1
    with open(out, "w") as f:
        json.dump(
            {
                "env_steps": result["num_env_steps_sampled_lifetime"],
                "return": result["env_runners"]["episode_return_mean"],
                "train_s": result["time_total_s"],
                "iterations": result["training_iteration"],
                **stages,
            },
            f,
        )


def one_run(mode: str, seed: int, cache: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_tune_overhead_") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "benchmarks.tune_overhead", "--child", mode]
        cmd += ["--seed", str(seed), "--out", out]
        env = {**os.environ, "IMPALA_JAX_COMPILE_CACHE": cache}
        started = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=common.REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0 or not os.path.exists(out):
            return {"mode": mode, "seed": seed, "ok": False, "error": proc.stderr[-1500:]}
        with open(out) as f:
            figures = json.load(f)
    reached = figures["return"] >= 450
    return {"mode": mode, "seed": seed, "ok": reached, "wall_s": wall, **figures}


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        child={"choices": ["direct", "tune"], "default": None, "help": argparse.SUPPRESS},
        seed={"type": int, "default": 0, "help": argparse.SUPPRESS},
        out={"default": None, "help": argparse.SUPPRESS},
    )
    if args.child:
        _child(args.child, args.seed, args.out)
        return {}
    seeds = QUICK_SEEDS if args.quick else SEEDS
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_xla_cache_") as cache:
        one_run("direct", seeds[0], cache)  # primes the compilation cache for both sides
        for seed in seeds:
            for mode in ("direct", "tune"):  # interleaved, seed by seed
                runs.append(one_run(mode, seed, cache))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "error"}))
    rows = [
        [
            r["seed"],
            r["mode"],
            r["ok"],
            r.get("wall_s", float("nan")),
            r.get("train_s", float("nan")),
            r.get("env_steps", 0),
        ]
        for r in runs
    ]
    print(common.table(rows, ["seed", "mode", "450", "wall s", "train s", "env steps"]))

    def med(mode: str, key: str) -> float:
        return common.median([r.get(key, float("inf")) for r in runs if r["mode"] == mode])

    direct_wall, tune_wall = med("direct", "wall_s"), med("tune", "wall_s")
    payload = {
        "method": __doc__.strip(),
        "runs": runs,
        "median_wall_s_direct": direct_wall,
        "median_wall_s_tune": tune_wall,
        "median_train_s_direct": med("direct", "train_s"),
        "median_train_s_tune": med("tune", "train_s"),
        "median_overhead_s": tune_wall - direct_wall,
        "median_ratio_tune_to_direct": tune_wall / direct_wall,
        "median_ray_init_s": med("tune", "ray_init_s"),
        "median_tuner_fit_s": med("tune", "tuner_fit_s"),
        "median_ray_shutdown_s": med("tune", "ray_shutdown_s"),
        "all_reached_450": all(r["ok"] for r in runs),
    }
    common.write_result("tune_overhead", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
