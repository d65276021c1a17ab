"""Craftax-1M: ``experiments/craftax_symbolic.py`` to 1 M env steps, per seed.

``python -m benchmarks.craftax [--seeds 0 1 2] [--steps 1000000] [--out PATH]``: one seed after
the other in this process (the experiment file with only its seed changed; its return stop is
not used: the benchmark wants the score at the budget). Per seed it records the curve (env
steps, seconds since the seed's build, mean return, % of max, Crafter score), the final
``episode_return_pct_of_max`` and ``crafter_score`` (over the last
``metrics_num_episodes_for_smoothing`` episodes, as the results report them), the success rate
of each achievement, the wall time from build to the budget and the env steps/s after the first
iteration (which compiles). Written to ``results/craftax_1m.json`` after each seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks import common

EXPERIMENT = common.REPO / "experiments" / "craftax_symbolic.py"
OUT = Path(__file__).with_name("results") / "craftax_1m.json"


def run_seed(seed: int, steps: int) -> dict:
    config, _ = common.load_experiment(EXPERIMENT)
    config.debugging(seed=seed)
    started = time.time()
    curve, first = [], None
    with config.build() as algo:
        while not curve or curve[-1][0] < steps:
            result = algo.train()
            runners = result["env_runners"]
            done = result["num_env_steps_sampled_lifetime"]
            point = [
                done,
                round(time.time() - started, 1),
                runners.get("episode_return_mean", float("nan")),
                runners.get("episode_return_pct_of_max", float("nan")),
                runners.get("crafter_score", float("nan")),
            ]
            curve.append(point)
            print(f"seed {seed}: {point}", flush=True)
            if first is None:
                first = (done, time.time())
    wall = time.time() - started
    rate = (curve[-1][0] - first[0]) / max(1e-9, time.time() - first[1])
    achievements = {k: round(v, 2) for k, v in runners.get("achievements", {}).items()}
    return {
        "seed": seed,
        "env_steps": curve[-1][0],
        "episode_return_mean": curve[-1][2],
        "episode_return_pct_of_max": curve[-1][3],
        "crafter_score": curve[-1][4],
        "wall_s": round(wall, 1),
        "env_steps_per_s": round(rate, 1),
        "achievements": {k: v for k, v in achievements.items() if v},
        "curve": curve,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    runs = []
    for seed in args.seeds:
        runs.append(run_seed(seed, args.steps))
        pct = [r["episode_return_pct_of_max"] for r in runs]
        summary = {
            "experiment": str(EXPERIMENT.relative_to(common.REPO)),
            "steps": args.steps,
            "mean_pct_of_max": statistics.mean(pct),
            "runs": runs,
        }
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"mean % of max over {len(runs)} seed(s): {summary['mean_pct_of_max']:.2f}")


if __name__ == "__main__":
    main()
