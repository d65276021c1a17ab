"""MinAtar (gymnax) on device against PPO with PureJaxRL's published settings, same machine.

``make bench-minatar`` (``python -m benchmarks.minatar [--quick] [--games G ...] [--seeds N]
[--steps N]``). Per game and seed two fresh processes, one after the other in alternating order
(IMPALA first for even seeds, PPO first for odd ones), so load from elsewhere hits both alike:

- IMPALA: the game's experiment file (``experiments/<game>_minatar.py``), only its seed changed,
  trained to ``--steps`` env steps (its stop criterion is not used: the table wants the whole
  curve);
- PPO: ``benchmarks/ppo_minatar.py`` (written here from PureJaxRL's published MinAtar settings,
  PureJaxRL itself not being an installable package).

Each reports its curve of (env steps, seconds since launch, mean return), its env steps/s after
its first iteration or chunk (which compiles), and its wall time from launch. The table gives,
per game and algorithm, the return at 2 M, 5 M and 10 M env steps (the last figure reported at or
before that step: IMPALA's ``episode_return_mean`` over its last 100 episodes, PPO's mean over
the episodes ended in its last chunk of 65,536 env steps; mean and range over seeds), the median
env steps/s, the median wall time from launch to the end, and for Breakout the median of the
per-pair ratios of the wall time from launch to a return of 20. A full run writes
``results/minatar.json`` and the table between the ``minatar`` markers of benchmarks/README.md;
a part (fewer games, seeds or steps) only ``results/minatar_part.json``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import common

README = Path(__file__).with_name("README.md")
START, END = "<!-- minatar:start -->", "<!-- minatar:end -->"
# game -> gymnax-blines' PPO return after 10 M env steps (gymnax's README, "PPO (R: ...)").
GOALS = {"Breakout": 28.0, "SpaceInvaders": 131.0, "Asterix": 15.0, "Freeway": 58.0}
EXPERIMENTS = {g: common.REPO / "experiments" / f"{g.lower()}_minatar.py" for g in GOALS}
EXPERIMENTS["SpaceInvaders"] = common.REPO / "experiments" / "space_invaders_minatar.py"
MARKS = (2_000_000, 5_000_000, 10_000_000)
BREAKOUT_MARK = 20.0  # the return whose wall time from launch the pair compares
STEPS, QUICK_STEPS = 10_000_000, 2_000_000
SEEDS, QUICK_SEEDS = 3, 1


def impala_child(game: str, seed: int, steps: int, launched: float) -> dict:
    """One IMPALA process (``--child``): the experiment with its seed, to ``steps`` env steps."""
    from impala_jax.runtime.process.jax_setup import initialize_lapack

    initialize_lapack()
    config, _ = common.load_experiment(EXPERIMENTS[game])
    config.debugging(seed=seed)
    curve, first_s = [], None
    with config.build() as algo:
        while not curve or curve[-1][0] < steps:
            result = algo.train()
            now = time.time() - launched
            done = result["num_env_steps_sampled_lifetime"]
            ret = result["env_runners"].get("episode_return_mean", float("nan"))
            curve.append([done, round(now, 2), round(float(ret), 3)])
            if first_s is None:
                first_s, first_steps = now, done
    total_s = time.time() - launched
    return {
        "algo": "impala",
        "env": f"{game}-MinAtar",
        "seed": seed,
        "env_steps": curve[-1][0],
        "wall_s_from_launch": total_s,
        "env_steps_per_s": (curve[-1][0] - first_steps) / (total_s - first_s),
        "curve": curve,
    }


def launch(algo: str, game: str, seed: int, steps: int) -> dict:
    """One process, launch to exit: its JSON line, or why there is none."""
    timeout = 120 + steps / 10_000  # 10 K env steps/s would be 5-15 x slower than measured
    if algo == "impala":
        args = ["-m", "benchmarks.minatar", "--child", game, "--seed", str(seed)]
    else:
        args = ["-m", "benchmarks.ppo_minatar", "--env", f"{game}-MinAtar", "--seed", str(seed)]
    args += ["--steps", str(steps), "--launched", repr(time.time())]
    try:
        proc = common.run_python(args, timeout)
    except subprocess.TimeoutExpired:
        return {"algo": algo, "game": game, "seed": seed, "ok": False, "error": f"{timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stdout + proc.stderr)[-800:]
        return {"algo": algo, "game": game, "seed": seed, "ok": False, "error": tail}
    return {**json.loads(lines[-1]), "game": game, "ok": True}


def at(curve: list, step: int) -> float:
    """The last return reported at or before ``step`` env steps (nan before the first)."""
    seen = [ret for done, _, ret in curve if done <= step * 1.001]
    return seen[-1] if seen else float("nan")


def first_time(curve: list, level: float) -> float:
    """Seconds from launch to the first report of a return >= ``level`` (inf if never)."""
    return next((t for _, t, ret in curve if ret >= level), float("inf"))


def summarise(runs: list[dict], steps: int) -> list[dict]:
    rows = []
    for game in dict.fromkeys(r["game"] for r in runs):
        pairs = {}
        for algo in ("impala", "ppo"):
            ok = [r for r in runs if r["game"] == game and r["algo"] == algo and r["ok"]]
            row = {"game": game, "algo": algo, "goal": GOALS[game], "seeds": len(ok)}
            for mark in (m for m in MARKS if m <= steps):
                values = [at(r["curve"], mark) for r in ok]
                row[f"return_{mark // 1_000_000}M"] = _spread(values)
            row["env_steps_per_s"] = _median([r["env_steps_per_s"] for r in ok])
            row["wall_s_from_launch"] = _median([r["wall_s_from_launch"] for r in ok])
            pairs[algo] = {r["seed"]: r for r in ok}
            rows.append(row)
        if game == "Breakout":
            common_seeds = sorted(set(pairs["impala"]) & set(pairs["ppo"]))
            ratios = [
                first_time(pairs["impala"][s]["curve"], BREAKOUT_MARK)
                / first_time(pairs["ppo"][s]["curve"], BREAKOUT_MARK)
                for s in common_seeds
            ]
            rows[-2]["wall_s_to_20_ratio_to_ppo"] = _median(ratios)
            for algo in ("impala", "ppo"):
                times = [first_time(pairs[algo][s]["curve"], BREAKOUT_MARK) for s in common_seeds]
                rows[-2 if algo == "impala" else -1]["wall_s_to_20"] = _median(times)
    return rows


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(values: list[float]) -> dict:
    finite = [v for v in values if v == v]
    if not finite:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"mean": statistics.fmean(finite), "min": min(finite), "max": max(finite)}


def markdown(rows: list[dict], steps: int, seeds: int) -> str:
    marks = [m for m in MARKS if m <= steps]
    head = ["game (goal)", "algo"] + [f"return at {m // 1_000_000} M" for m in marks]
    head += ["env steps/s", "wall s", "s to 20 (ratio)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['game']} ({r['goal']:g})", r["algo"]]
        for m in marks:
            s = r[f"return_{m // 1_000_000}M"]
            cells.append(f"{s['mean']:.1f} ({s['min']:.1f}-{s['max']:.1f})")
        cells += [f"{r['env_steps_per_s']:,.0f}", f"{r['wall_s_from_launch']:.0f}"]
        to20 = r.get("wall_s_to_20")
        ratio = r.get("wall_s_to_20_ratio_to_ppo")
        cells.append(
            "" if to20 is None else f"{to20:.1f}" + ("" if ratio is None else f" ({ratio:.2f})")
        )
        lines.append("| " + " | ".join(cells) + " |")
    date = time.strftime("%Y-%m-%d")
    lines.append(
        f"\n{seeds} seeds per game and algorithm, {steps:,} env steps each, {date}, "
        "`make bench-minatar`; mean (range) over seeds, medians for speed and time."
    )
    return "\n".join(lines)


def write_readme_table(text: str) -> None:
    common.replace_between_markers(README, START, END, text)


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        child={"choices": list(GOALS), "default": None, "help": "internal: one IMPALA run"},
        seed={"type": int, "default": 0, "help": "with --child"},
        steps={"type": int, "default": None, "help": "env steps per run"},
        seeds={"type": int, "default": None, "help": "seeds per game"},
        games={"nargs": "+", "choices": list(GOALS), "default": list(GOALS)},
        launched={"type": float, "default": None, "help": "with --child: launch time.time()"},
    )
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.child:
        launched = args.launched if args.launched is not None else time.time()
        out = impala_child(args.child, args.seed, steps, launched)
        print(json.dumps(out), flush=True)
        return out
    seeds = args.seeds or (QUICK_SEEDS if args.quick else SEEDS)
    runs = []
    for game in args.games:
        for seed in range(seeds):
            order = ("impala", "ppo") if seed % 2 == 0 else ("ppo", "impala")
            for algo in order:
                run = launch(algo, game, seed, steps)
                runs.append(run)
                brief = {k: run.get(k) for k in ("env_steps_per_s", "wall_s_from_launch")}
                print(algo, game, seed, "ok" if run["ok"] else run["error"], brief, flush=True)
    rows = summarise(runs, steps)
    table = markdown(rows, steps, seeds)
    print(table)
    payload = {"steps": steps, "seeds": seeds, "rows": rows, "runs": runs}
    full = not args.quick and args.games == list(GOALS) and steps == STEPS and seeds == SEEDS
    # A part (fewer games, seeds or steps) leaves the full run's file and table alone.
    name = "minatar" if full else "minatar_quick" if args.quick else "minatar_part"
    common.write_result(name, payload, args.quick)
    if full:
        write_readme_table(table)
    return payload


if __name__ == "__main__":
    main()
