"""Does CartPole stay solved? Per seed: the 100-episode mean for 1 M env steps after it first
reaches 450, with experiments/cartpole.py's config.

Each seed trains (``train()`` in this process, one build per seed) until the mean first reaches
450, then 1 M env steps more; the seed holds when the lowest mean over those steps is at least
400. A seed that has not reached 450 within 3 M env steps (the experiment's own cap) counts as
not holding. Beside the return, each iteration's policy entropy, value explained variance,
gradient norm, update size, importance weights and KL between the behaviour and the learner's
policy are kept, so a drop can be read against what came before it
(``results/stability.json``).
"""

from __future__ import annotations

import time

from benchmarks import common

SEEDS = [0, 1, 2, 3, 4]
QUICK_SEEDS = [0]
TARGET, FLOOR, HOLD_STEPS, CAP = 450.0, 400.0, 1_000_000, 3_000_000
TRACE_KEYS = (
    "entropy",
    "vf_explained_var",
    "mean_vf_loss",
    "gradients_default_optimizer_global_norm",
    "update_rms_to_lr_ratio",
    "max_rho",
    "mean_kl",
)


def one_seed(seed: int, hold_steps: int) -> dict:
    config, _ = common.load_experiment()
    config = config.copy(copy_frozen=False)
    config.debugging(seed=seed)
    algo = config.build()
    trace, reached_at, started = [], None, time.perf_counter()
    try:
        while True:
            result = algo.train()
            steps = result["num_env_steps_sampled_lifetime"]
            ret = result["env_runners"].get("episode_return_mean", float("nan"))
            learner = result["learners"]["default_policy"]
            trace.append({"env_steps": steps, "return_mean": ret})
            trace[-1].update({k: learner.get(k) for k in TRACE_KEYS})
            if reached_at is None and ret >= TARGET:
                reached_at = steps
            if reached_at is None and steps >= CAP:
                break
            if reached_at is not None and steps >= reached_at + hold_steps:
                break
    finally:
        algo.stop()
    after = [t["return_mean"] for t in trace if reached_at and t["env_steps"] > reached_at]
    lowest = min(after) if after else float("nan")
    return {
        "seed": seed,
        "reached_450_at_env_steps": reached_at,
        "lowest_mean_after": lowest,
        "final_mean": trace[-1]["return_mean"],
        "held": reached_at is not None and lowest >= FLOOR,
        "seconds": time.perf_counter() - started,
        "trace": trace,
    }


def main(argv=None) -> dict:
    args = common.parse_args(argv, __doc__.split("\n")[0])
    seeds = QUICK_SEEDS if args.quick else SEEDS
    hold = HOLD_STEPS // 4 if args.quick else HOLD_STEPS
    runs = [one_seed(s, hold) for s in seeds]
    rows = [
        [
            r["seed"],
            r["reached_450_at_env_steps"] or "no",
            r["lowest_mean_after"],
            r["final_mean"],
            r["held"],
            r["seconds"],
        ]
        for r in runs
    ]
    headers = ["seed", "450 at env step", f"lowest in next {hold:,}", "final", "held", "s"]
    print(common.table(rows, headers))
    held = sum(r["held"] for r in runs)
    payload = {
        "method": "experiments/cartpole.py per seed, train() until the 100-episode mean "
        f"reaches {TARGET:.0f}, then {hold:,} env steps more; held = lowest mean over them "
        f">= {FLOOR:.0f}",
        "seeds": runs,
        "held": held,
        "of": len(runs),
        "goal": f"the mean stays >= {FLOOR:.0f} for {HOLD_STEPS:,} env steps after 450 on 5 of 5",
        "goal_met": held == len(runs) and len(runs) == 5,
    }
    common.write_result("stability", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
