"""Population-based training in one program: Breakout-MinAtar's figures, speed, and Ray Tune.

``make bench-pbt`` (``python -m benchmarks.pbt [--quick] [--parts P ...] [--seeds N]``), each
part in fresh processes:

- ``learning``: ``experiments/breakout_minatar_pbt.py`` (8 members, PBT every 250 K env steps)
  and the same 8 members with exploit off (the experiment without its scheduler: a random
  search in one program), 3 seeds of the whole experiment each, 5 M env steps per member (its
  return stop not used). Per experiment: the best member's return at the end (each member's
  mean over the episodes of its last interval), the median member's, and the env steps per
  member at which a member first reached 28.
- ``speed``: the population's total env steps/s after its first interval against one run of
  ``experiments/breakout_minatar.py`` after its first iteration, in alternating pairs; and the
  start-up of each, the wall time from launch to its first result less one interval's (one
  iteration's) steady time: what building and compiling cost.
- ``tune``: the same PBT (8 members, 250 K env steps, Tune's ``PopulationBasedTraining``)
  through the project's Ray Tune path (``tune.Tuner("IMPALA", ...)``, one trial per member)
  against the one-program population, each to 1 M env steps per member, wall time from
  launch, in 2 alternating pairs (the median of the pairs' ratios). The one program runs as
  ``--devices 2`` does, its members spread over two CPU devices (one per core); Tune runs two
  trials at once on ``ray.init(num_cpus=2)``. Tune's scheduler runs asynchronously (its
  default, ``synch=False``): with ``synch=True`` its controller spun without running a trial
  once they neared the stop (2026-12-07, ray 2.60: ten minutes, ``pbt_policy_*.txt``
  rewritten without end).

A full run writes ``results/pbt.json`` and the table between the ``pbt`` markers of
benchmarks/README.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import common

README = Path(__file__).with_name("README.md")
START, END = "<!-- pbt:start -->", "<!-- pbt:end -->"
PBT_EXPERIMENT = common.REPO / "experiments" / "breakout_minatar_pbt.py"
ONE_EXPERIMENT = common.REPO / "experiments" / "breakout_minatar.py"
GOAL = 28.0
STEPS, QUICK_STEPS = 5_000_000, 1_000_000
TUNE_STEPS = 1_000_000
SEEDS, QUICK_SEEDS = 3, 1
SPEED_S = 60.0  # steady seconds measured per process in the speed part


def load_module(path: Path):
    """The experiment file's module, run by the CLI's loader (its config, scheduler, ...)."""
    import sys

    from impala_jax.cli.experiment import module_name

    common.load_experiment(path)
    return sys.modules[module_name(path)]


def _population(seed: int, exploit: bool):
    """The PBT experiment's population, seeded; exploit off: ``quantile_fraction=0`` (nobody is
    copied), the same intervals and results."""
    import dataclasses

    from impala_jax import Population

    module = load_module(PBT_EXPERIMENT)
    config = module.config.copy(copy_frozen=False).debugging(seed=seed)
    scheduler = module.scheduler
    if not exploit:
        scheduler = dataclasses.replace(scheduler, quantile_fraction=0.0)
    return Population(config, module.num_members, scheduler)


def learning_child(seed: int, exploit: bool, steps: int, launched: float) -> dict:
    population = _population(seed, exploit)
    curve = []
    while not curve or curve[-1][0] < steps:
        results = population.train()
        returns = [r["env_runners"]["episode_return_mean"] for r in results]
        finite = [x for x in returns if x == x]
        best = max(finite) if finite else float("nan")
        median = statistics.median(finite) if finite else float("nan")
        done = results[0]["num_env_steps_sampled_lifetime"]
        curve.append([done, round(time.time() - launched, 2), round(best, 3), round(median, 3)])
    reached = next((d for d, _, best, _ in curve if best >= GOAL), None)
    return {
        "exploit": exploit,
        "seed": seed,
        "curve": curve,
        "best_final": curve[-1][2],
        "median_final": curve[-1][3],
        "steps_to_goal": reached,
        "copies": len(population.lineage),
        "wall_s_from_launch": time.time() - launched,
    }


def speed_child(kind: str, launched: float) -> dict:
    """Env steps/s after the first result, and the start-up, of a population or one run."""
    if kind == "population":
        population = _population(0, exploit=True)
        step = lambda: population.train()[0]["num_env_steps_sampled_lifetime"] * 8  # noqa: E731
        first = step()
        first_s = time.time() - launched
        done, t0, calls = first, time.time(), 0
        while time.time() - t0 < SPEED_S:
            done, calls = step(), calls + 1
        steady = (time.time() - t0) / calls
        rate = (done - first) / (time.time() - t0)
    else:
        config, _ = common.load_experiment(ONE_EXPERIMENT)
        config.reporting(min_time_s_per_iteration=0)
        with config.build() as algo:
            first = algo.train()["num_env_steps_sampled_lifetime"]
            first_s = time.time() - launched
            done, t0, calls = first, time.time(), 0
            while time.time() - t0 < SPEED_S:
                done, calls = algo.train()["num_env_steps_sampled_lifetime"], calls + 1
            steady = (time.time() - t0) / calls
            rate = (done - first) / (time.time() - t0)
    return {"kind": kind, "env_steps_per_s": rate, "startup_s": first_s - steady}


def tune_child(steps: int, launched: float) -> dict:
    """The experiment's PBT through Ray Tune: one trial per member, to ``steps`` each."""
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    module = load_module(PBT_EXPERIMENT)
    ours = module.scheduler

    def as_tune(domain):  # the experiment's loguniform, as Tune's own
        assert domain.kind == "loguniform", domain
        return tune.loguniform(domain.low, domain.high)

    scheduler = PopulationBasedTraining(
        time_attr=ours.time_attr,
        perturbation_interval=ours.perturbation_interval,
        hyperparam_mutations={k: as_tune(v) for k, v in ours.hyperparam_mutations.items()},
    )
    config = module.config.copy(copy_frozen=False)
    config.training(lr=as_tune(config.lr), entropy_coeff=as_tune(config.entropy_coeff))
    config.reporting(min_time_s_per_iteration=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            "IMPALA",
            param_space=config,
            tune_config=tune.TuneConfig(
                scheduler=scheduler,
                num_samples=module.num_members,
                metric="env_runners/episode_return_mean",
                mode="max",
            ),
            run_config=tune.RunConfig(
                stop={"num_env_steps_sampled_lifetime": steps},
                storage_path=str(Path("/tmp") / f"impala_jax_bench_pbt_{int(launched)}"),
                verbose=0,
            ),
        )
        grid = tuner.fit()
        errors = len(grid.errors)
    finally:
        ray.shutdown()
    return {"kind": "tune", "wall_s_from_launch": time.time() - launched, "errors": errors}


def one_program_child(steps: int, launched: float) -> dict:
    population = _population(0, exploit=True)
    while population.train()[0]["num_env_steps_sampled_lifetime"] < steps:
        pass
    return {"kind": "one_program", "wall_s_from_launch": time.time() - launched}


def launch(args: list[str], timeout: float, devices: int = 1) -> dict:
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    try:
        proc = common.run_python(
            ["-m", "benchmarks.pbt", *args, "--launched", repr(time.time())], timeout, env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{timeout} s", "args": args}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-800:], "args": args}
    return {**json.loads(lines[-1]), "ok": True}


def learning(seeds: int, steps: int) -> list[dict]:
    runs = []
    for seed in range(seeds):
        for exploit in (True, False) if seed % 2 == 0 else (False, True):
            args = ["--child", "learning", "--seed", str(seed), "--steps", str(steps)]
            run = launch(args + ([] if exploit else ["--no-exploit"]), 300 + steps / 5_000)
            runs.append({**run, "exploit": exploit, "seed": seed})
            keys = ("best_final", "median_final", "steps_to_goal", "wall_s_from_launch")
            print("learning", exploit, seed, {k: run.get(k) for k in keys}, flush=True)
    return runs


def speed(pairs: int) -> list[dict]:
    runs = []
    for i in range(pairs):
        for kind in ("population", "one") if i % 2 == 0 else ("one", "population"):
            run = launch(["--child", f"speed-{kind}"], 600)
            runs.append(run)
            print("speed", kind, run.get("env_steps_per_s"), run.get("startup_s"), flush=True)
    return runs


def tune_comparison(steps: int, pairs: int) -> list[dict]:
    """One program and Ray Tune in ``pairs`` alternating pairs (A B B A ...): the machine's
    load drifts over minutes, and a pair's ratio is what the table reports (the median)."""
    runs = []
    for i in range(pairs):
        order = ("one-program", "tune") if i % 2 == 0 else ("tune", "one-program")
        for kind in order:
            devices = 2 if kind == "one-program" else 1
            run = launch(["--child", kind, "--steps", str(steps)], 3600, devices)
            runs.append({**run, "kind": kind, "pair": i, "devices": devices})
            print(kind, run.get("wall_s_from_launch"), run.get("error", ""), flush=True)
    return runs


def _median(xs) -> float:
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else float("nan")


def markdown(payload: dict) -> str:
    lines = []
    learn = [r for r in payload.get("learning", []) if r["ok"]]
    if learn:
        lines += [
            "| Breakout-MinAtar, 8 members | best member at the end | median member | "
            "env steps/member to 28 (experiments reaching it) |",
            "|---|---|---|---|",
        ]
        for exploit in (True, False):
            rs = [r for r in learn if r["exploit"] == exploit]
            best = [r["best_final"] for r in rs]
            reached = [r["steps_to_goal"] for r in rs if r["steps_to_goal"] is not None]
            middle = _median([r["median_final"] for r in rs])
            lines.append(
                f"| {'PBT' if exploit else 'exploit off'} | median {_median(best):.1f} "
                f"({min(best):.1f}-{max(best):.1f}) | {middle:.1f}"
                f" | {_median(reached) / 1e6:.2f} M ({len(reached)} of {len(rs)}) |"
            )
        lines.append(
            f"\n{len(learn) // 2} seeds of each experiment, {payload['steps']:,} env steps per "
            "member; median (range) over seeds, best member's final return first."
        )
    fast = [r for r in payload.get("speed", []) if r["ok"]]
    if fast:
        pop = [r for r in fast if r["kind"] == "population"]
        one = [r for r in fast if r["kind"] == "one"]
        rate = _median([r["env_steps_per_s"] for r in pop]) / _median(
            [r["env_steps_per_s"] for r in one]
        )
        start = _median([r["startup_s"] for r in pop]) / _median([r["startup_s"] for r in one])
        lines.append(
            f"Speed ({len(pop)} alternating pairs): the population's env steps/s in all "
            f"{_median([r['env_steps_per_s'] for r in pop]):,.0f} against one run's "
            f"{_median([r['env_steps_per_s'] for r in one]):,.0f} ({rate:.2f} x); start-up "
            f"{_median([r['startup_s'] for r in pop]):.1f} s against "
            f"{_median([r['startup_s'] for r in one]):.1f} s ({start:.2f} x)."
        )
    ratios, walls = [], {"one-program": [], "tune": []}
    for i in {r.get("pair", 0) for r in payload.get("tune", [])}:
        pair = {
            r["kind"]: r["wall_s_from_launch"]
            for r in payload["tune"]
            if r.get("pair", 0) == i and r["ok"]
        }
        if len(pair) == 2:
            ratios.append(pair["one-program"] / pair["tune"])
            for kind, wall in pair.items():
                walls[kind].append(wall)
    if ratios:
        lines.append(
            f"The same PBT to {payload['tune_steps']:,} env steps per member "
            f"({len(ratios)} alternating pairs, medians): one program "
            f"{_median(walls['one-program']):.0f} s, Ray Tune (one trial per member) "
            f"{_median(walls['tune']):.0f} s; per pair {_median(ratios):.2f} x "
            f"({min(ratios):.2f}-{max(ratios):.2f})."
        )
    lines.append(f"{time.strftime('%Y-%m-%d')}, `make bench-pbt`.")
    return "\n".join(lines)


def write_readme_table(text: str) -> None:
    common.replace_between_markers(README, START, END, text)


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        child={"default": None, "help": "internal: one process of a part"},
        seed={"type": int, "default": 0, "help": "with --child learning"},
        no_exploit={"action": "store_true", "help": "with --child learning"},
        steps={"type": int, "default": None, "help": "env steps per member"},
        seeds={"type": int, "default": None, "help": "seeds of each experiment"},
        parts={"nargs": "+", "choices": ["learning", "speed", "tune"], "default": None},
        launched={"type": float, "default": None, "help": "with --child: launch time.time()"},
    )
    launched = args.launched if args.launched is not None else time.time()
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.child:
        if args.child == "learning":
            out = learning_child(args.seed, not args.no_exploit, steps, launched)
        elif args.child.startswith("speed-"):
            out = speed_child(args.child.removeprefix("speed-"), launched)
        elif args.child == "tune":
            out = tune_child(steps, launched)
        else:
            out = one_program_child(steps, launched)
        print(json.dumps(out), flush=True)
        return out
    parts = args.parts or ["learning", "speed", "tune"]
    seeds = args.seeds or (QUICK_SEEDS if args.quick else SEEDS)
    tune_steps = args.steps or (QUICK_STEPS // 2 if args.quick else TUNE_STEPS)
    payload = {"steps": steps, "tune_steps": tune_steps, "seeds": seeds}
    if "learning" in parts:
        payload["learning"] = learning(seeds, steps)
    if "speed" in parts:
        payload["speed"] = speed(1 if args.quick else 2)
    if "tune" in parts:
        payload["tune"] = tune_comparison(tune_steps, 1 if args.quick else 2)
    text = markdown(payload)
    print(text)
    name = "pbt" if len(parts) == 3 else "pbt_" + "_".join(parts)
    if args.quick and len(parts) == 3:
        name = "pbt_quick"
    common.write_result(name, payload, args.quick)
    if not args.quick and len(parts) == 3:
        write_readme_table(text)
    return payload


if __name__ == "__main__":
    main()
