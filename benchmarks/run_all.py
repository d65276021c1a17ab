"""``make bench``: every benchmark in its own subprocess, then ``results/summary.json``.

``python -m benchmarks.run_all [--quick] [--only NAME ...] [--table]``. A subprocess per
benchmark keeps JAX state, XLA flags and peak memory apart; each has a hard timeout, and a
benchmark that fails is reported as such without stopping the others. A full run (not
``--quick``) also rewrites the table of current figures at the top of ``benchmarks/README.md``,
between its two ``figures`` markers; ``--table`` only does that, from the results on disk.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from benchmarks import common

README = Path(__file__).with_name("README.md")
FIGURES_START = "<!-- figures:start -->"
FIGURES_END = "<!-- figures:end -->"

# (result name, module arguments, timeout s)
BENCHMARKS = [
    ("vtrace", ["-m", "benchmarks.vtrace"], 180),
    ("learner", ["-m", "benchmarks.learner"], 560),
    ("end_to_end_cartpole", ["-m", "benchmarks.end_to_end", "--env", "cartpole"], 180),
    ("time_to_450", ["-m", "benchmarks.time_to_450"], 600),
    ("on_device", ["-m", "benchmarks.on_device"], 600),
    ("stability", ["-m", "benchmarks.stability"], 600),
    ("end_to_end_pong", ["-m", "benchmarks.end_to_end", "--env", "pong"], 300),
    ("tune_overhead", ["-m", "benchmarks.tune_overhead"], 600),
    ("processes", ["-m", "benchmarks.processes"], 600),
    ("pbt_speed", ["-m", "benchmarks.pbt", "--parts", "speed"], 900),
    (
        "multi_agent_learner_speed",
        ["-m", "benchmarks.multi_agent", "--parts", "learner", "speed"],
        1200,
    ),
]


def _ceiling(e2e: dict) -> str:
    """``; 0.xx of the ceiling min(raw, compute-only)`` where the result has one."""
    if "ratio_to_ceiling" not in e2e:
        return ""
    bound = e2e["rounds"][0]["ceiling_bound_by"]
    return (
        f"; {e2e['ratio_to_ceiling']:.2f} of the ceiling "
        f"({e2e['ceiling_steps_per_s']:,.0f} env steps/s, bound by {bound}; compute-only "
        f"{e2e['compute_only_steps_per_s']:,.0f})"
    )


def _light(device: dict) -> str:
    """``; learner-light ...`` where the on-device result has the variant."""
    light = device.get("learner_light")
    if not light:
        return ""
    return (
        f"; learner-light variant (1 update per batch, no replay): "
        f"{light['ratio_device_to_envpool']:.2f}x ({light['device']:,.0f} vs "
        f"{light['envpool']:,.0f})"
    )


def _cpu_bound(e2e: dict) -> str:
    """``; with every core busy ...`` where the result has the CPU per env step."""
    if "ratio_to_raw_at_full_cores" not in e2e:
        return ""
    full = e2e["ratio_to_raw_at_full_cores"]
    return (
        f"; with all {e2e['cores']} cores busy, training's CPU per env step "
        f"({e2e['cpu_us_per_env_step']['train']:.2f} us) allows {full['train']:.2f} of raw, "
        f"the pieces alone {full['pieces']:.2f}"
    )


def summarize(results: dict) -> list[dict]:
    """One row per goal: the measured value, the reference it is compared with, met or not."""
    rows = []
    vt = results.get("vtrace")
    if vt:
        rows.append(
            {
                "benchmark": "vtrace",
                "goal": "V-trace no slower than rlax at every size",
                "value": f"min speedup {vt['min_speedup_vs_rlax']:.2f}x over "
                + ", ".join(f"{s['T']}x{s['B']}" for s in vt["sizes"]),
                "met": vt["goal_met"],
            }
        )
    e2e = results.get("end_to_end_cartpole")
    if e2e:
        rows.append(
            {
                "benchmark": "end_to_end_cartpole",
                "goal": "CartPole training >= 0.6 of raw envpool at the same env count",
                "value": f"{e2e['train_env_steps_per_s']:,.0f} env steps/s, "
                f"{e2e['ratio_to_raw']:.2f} of raw envpool "
                f"({e2e['raw_envpool_steps_per_s']:,.0f}) at {e2e['num_envs']} envs"
                + (
                    f"; {e2e['ratio_to_raw_binding']:.2f} of envpool through its binding"
                    if "ratio_to_raw_binding" in e2e
                    else ""
                )
                + _ceiling(e2e)
                + _cpu_bound(e2e),
                "met": e2e["goal_met"],
            }
        )
    t450 = results.get("time_to_450")
    if t450:
        if "ratio_to_naive_cold" in t450:
            rows.append(
                {
                    "benchmark": "time_to_450",
                    "goal": "time to 450 from launch, median: cold <= 0.5x the naive loop, "
                    "warm <= 4 s",
                    "value": f"{t450['median_wall_s_to_450_cold']:.1f} s cold, "
                    f"{t450['median_wall_s_to_450']:.1f} s warm, "
                    f"{t450['median_env_steps']:,.0f} env steps; "
                    f"{t450['ratio_to_naive_cold']:.2f}x cold "
                    f"({t450['naive_cold']['median_wall_s_to_450']:.1f} s naive), "
                    f"{t450['ratio_to_naive_warm']:.2f}x warm "
                    f"({t450['naive_warm']['median_wall_s_to_450']:.1f} s naive)",
                    "met": t450["goal_met_time"],
                }
            )
        rows.append(
            {
                "benchmark": "time_to_450",
                "goal": "peak memory of the CartPole process < 1 GiB",
                "value": f"{t450['max_peak_rss_mib']:.0f} MiB (max over seeds)",
                "met": t450["goal_met_memory"],
            }
        )
    device = results.get("on_device")
    if device:
        dev, host = device["device"], device["envpool"]
        rows.append(
            {
                "benchmark": "on_device",
                "goal": "CartPole training on device (gymnax) >= 1.5x the envpool path, "
                "same config, same run",
                "value": f"{device['ratio_device_to_envpool']:.2f}x: "
                f"{dev['env_steps_per_s']:,.0f} vs {host['env_steps_per_s']:,.0f} env steps/s, "
                f"{dev['cpu_us_per_env_step']:.2f} vs {host['cpu_us_per_env_step']:.2f} CPU us "
                f"per env step; 450 in {dev['median_wall_s_to_450_cold']:.1f} s cold, "
                f"{dev['median_wall_s_to_450_warm']:.1f} s warm "
                f"(envpool {host['median_wall_s_to_450_cold']:.1f} s, "
                f"{host['median_wall_s_to_450_warm']:.1f} s)" + _light(device),
                "met": device["goal_met"],
            }
        )
        group = device.get("seed_group") or {}
        if group.get("ok"):
            rows.append(
                {
                    "benchmark": "on_device",
                    "goal": f"{group['seeds']} CartPole seeds in one program on device (report)",
                    "value": f"{group['env_steps_per_s']:,.0f} env steps/s in all, "
                    f"{group['ratio_to_one_device_run']:.2f}x one device run",
                    "met": None,
                }
            )
    stability = results.get("stability")
    if stability:
        rows.append(
            {
                "benchmark": "stability",
                "goal": "CartPole stays >= 400 for 1 M env steps after 450, 5 of 5 seeds",
                "value": f"{stability['held']} of {stability['of']} seeds held (lowest means "
                + ", ".join(f"{r['lowest_mean_after']:.0f}" for r in stability["seeds"])
                + ")",
                "met": stability["goal_met"],
            }
        )
    lr = results.get("learner")
    if lr:
        for case in lr["cases"]:
            two = case.get("two_vs_one_device_speedup")
            rows.append(
                {
                    "benchmark": "learner",
                    "goal": f"learner {case['case']} T x B = {case['T']}x{case['B']} (report)",
                    "value": f"{case['one_device']['samples_per_s']:,.0f} samples/s on 1 device"
                    + (f", 2 forced devices {two:.2f}x of 1" if two else ""),
                    "met": None,
                }
            )
    pong = results.get("end_to_end_pong")
    if pong:
        rows.append(
            {
                "benchmark": "end_to_end_pong",
                "goal": "Pong-v5, Nature CNN, >= 0.7 of the machine's ceiling",
                "value": f"{pong['train_env_frames_per_s']:,.0f} frames/s training, "
                f"{pong['ratio_to_raw']:.3f} of raw envpool "
                f"({pong['raw_envpool_frames_per_s']:,.0f}) at {pong['num_envs']} envs"
                + _ceiling(pong)
                + _cpu_bound(pong),
                "met": pong.get("goal_met"),
            }
        )
    tune_overhead = results.get("tune_overhead")
    if tune_overhead:
        rows.append(
            {
                "benchmark": "tune_overhead",
                "goal": "Ray Tune trial vs a plain train() loop, CartPole to 450 (report)",
                "value": f"{tune_overhead['median_wall_s_tune']:.1f} s vs "
                f"{tune_overhead['median_wall_s_direct']:.1f} s from launch "
                f"(+{tune_overhead['median_overhead_s']:.1f} s); training "
                f"{tune_overhead['median_train_s_tune']:.1f} s vs "
                f"{tune_overhead['median_train_s_direct']:.1f} s",
                "met": None,
            }
        )
    processes = results.get("processes")
    if processes:
        rows.append(
            {
                "benchmark": "processes",
                "goal": "one run over two processes vs one process, same envs (report)",
                "value": ", ".join(
                    f"{name}: {c['two_processes_env_steps_per_s']:,.0f} vs "
                    f"{c['one_process_env_steps_per_s']:,.0f} env steps/s "
                    f"({c['two_vs_one']:.2f}x)"
                    for name, c in processes["cases"].items()
                ),
                "met": None,
            }
        )
    speed = results.get("pbt_speed")
    if speed:
        rows.append(_population_row(speed))
    multi = results.get("multi_agent_learner_speed")
    if multi:
        rows.extend(_multi_agent_rows(multi))
    return rows


def _multi_agent_rows(multi: dict) -> list[dict]:
    """The stacked learner step against one policy's, and multi-agent sampling's speed."""
    rows = []
    learner = multi.get("learner")
    if learner:
        by_m = {r["policies"]: r for r in learner["rows"]}
        value = ", ".join(
            f"{m}: {r['stack_over_one_policy']:.1f}x "
            f"(separate {r['separate_over_one_policy']:.1f}x)"
            for m, r in sorted(by_m.items())
        )
        rows.append(
            {
                "benchmark": "multi_agent_learner_speed",
                "goal": "the learner step of 8 same-shaped policies in one program <= 2x one "
                "policy's (fcnet 256-256, 1,000 env steps each)",
                "value": f"one program / one policy's step, by policies {value}",
                "met": learner["goal_met"],
            }
        )
    speed = multi.get("speed")
    if speed and "ratio" in speed:
        rows.append(
            {
                "benchmark": "multi_agent_learner_speed",
                "goal": "multi-agent CartPole agent steps/s beside single-agent CartPole's env "
                "steps/s, the same gymnasium env and steps per update (report)",
                "value": f"{speed['multi_agent_steps_per_s']:,.0f} vs "
                f"{speed['single_env_steps_per_s']:,.0f} ({speed['ratio']:.2f}x)",
                "met": None,
            }
        )
    return rows


def _population_row(speed: dict) -> dict:
    """A population of 8 (Breakout-MinAtar PBT) against one run: env steps/s and start-up."""
    runs = [r for r in speed["speed"] if r.get("ok")]
    pop = [r for r in runs if r["kind"] == "population"]
    one = [r for r in runs if r["kind"] == "one"]
    rate = [common.median([r["env_steps_per_s"] for r in rs]) for rs in (pop, one)]
    start = [common.median([r["startup_s"] for r in rs]) for rs in (pop, one)]
    return {
        "benchmark": "pbt_speed",
        "goal": "a population of 8 in one program: >= 0.9x one run's env steps/s in all, "
        "start-up <= 1.5x one run's",
        "value": f"{rate[0]:,.0f} vs {rate[1]:,.0f} env steps/s ({rate[0] / rate[1]:.2f}x); "
        f"start-up {start[0]:.1f} s vs {start[1]:.1f} s ({start[0] / start[1]:.2f}x)",
        "met": rate[0] >= 0.9 * rate[1] and start[0] <= 1.5 * start[1],
    }


def load_results(runs: dict | None = None) -> dict:
    """Every benchmark's last result on disk, except those whose run just failed."""
    runs = runs or {}
    results = {}
    for name, _, _ in BENCHMARKS:
        path = common.RESULTS / f"{name}.json"
        if path.exists() and runs.get(name, {}).get("ok", True):
            results[name] = json.loads(path.read_text())
    return results


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def figures_table(results: dict) -> str:
    """The README's table: one row per goal of ``summarize(results)``, dated by its result."""
    met = {True: "yes", False: "no", None: "-"}
    lines = ["| goal | measured | met | date |", "|---|---|---|---|"]
    for row in summarize(results):
        result = results[row["benchmark"]]
        date = str(result.get("date", ""))[:10] + (" (quick)" if result.get("quick") else "")
        lines.append(
            f"| {_cell(row['goal'])} | {_cell(row['value'])} | {met[row['met']]} | {date} |"
        )
    machines = {
        (m.get("cpu_count"), m.get("jax"), m.get("jax_backend"))
        for m in (r.get("machine") for r in results.values())
        if m
    }
    if len(machines) == 1:
        cores, jax_version, backend = machines.pop()
        lines.append("")
        lines.append(f"Machine: {cores} CPU cores, jax {jax_version}, {backend} backend.")
    elif machines:
        lines.append("")
        lines.append("Machines differ between these results: see each result's `machine`.")
    return "\n".join(lines)


def replace_figures(text: str, table: str) -> str:
    """``text`` with what lies between the two figures markers replaced by ``table``."""
    start, end = text.find(FIGURES_START), text.find(FIGURES_END)
    if start < 0 or end < start:
        raise ValueError(f"no {FIGURES_START} ... {FIGURES_END} pair to rewrite")
    return f"{text[: start + len(FIGURES_START)]}\n{table}\n{text[end:]}"


def write_figures(results: dict, path: Path = README) -> None:
    path.write_text(replace_figures(path.read_text(), figures_table(results)))


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        only={"nargs": "*", "default": None, "help": "run only these benchmarks"},
        table={
            "action": "store_true",
            "help": "run nothing: rewrite README.md's figures from the results on disk",
        },
    )
    if args.table:
        results = load_results()
        write_figures(results)
        return results
    runs = {}
    for name, module_args, timeout in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        argv_ = module_args + (["--quick"] if args.quick else [])
        try:
            proc = common.run_python(argv_, timeout, {"JAX_PLATFORMS": "cpu"})
            ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
            print(proc.stdout, end="", flush=True)
        except subprocess.TimeoutExpired:
            ok, tail = False, f"timed out after {timeout} s"
        elapsed = time.perf_counter() - started
        runs[name] = {"ok": ok, "seconds": elapsed, **({} if ok else {"error": tail})}
        if not ok:
            print(f"   FAILED: {tail[-800:]}", flush=True)
    # Benchmarks not run this time (--only) keep their last results in the summary.
    results = load_results(runs)
    rows = summarize(results)
    print("\n== summary")
    for row in rows:
        met = {True: "MET", False: "NOT MET", None: "-"}[row["met"]]
        print(f"{met:>7}  {row['goal']}: {row['value']}")
    payload = {
        "goals": rows,
        "runs": runs,
        "dates": {name: r.get("date") for name, r in results.items()},
    }
    common.write_result("summary", payload, args.quick)
    # Quick figures, or results written elsewhere (benchmarks/gpu.sh), leave the README alone.
    if not args.quick and common.RESULTS == README.parent / "results":
        write_figures(results)
    return payload


if __name__ == "__main__":
    main()
