"""V-trace: ``impala_jax.core.vtrace.vtrace`` vs ``rlax.vtrace_td_error_and_advantage``, vmapped.

Both are jitted and compiled before timing; each timing sample is a burst of calls ended by
``block_until_ready``; the two implementations alternate sample by sample, and the figure per
size is the median of the samples and the median of the per-sample time ratios.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import rlax

from benchmarks import common
from impala_jax.core.vtrace import vtrace

SIZES = [(20, 32), (20, 256), (20, 1024), (50, 256), (100, 1024), (20, 4096)]
QUICK_SIZES = [(20, 32), (20, 1024), (20, 4096)]


def inputs(T: int, B: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))
    v_tm1, v_t, r_t = f(T, B), f(T, B), f(T, B)
    discount_t = jnp.asarray(0.99 * (rng.random((T, B)) > 0.05), jnp.float32)
    rho_tm1 = jnp.asarray(np.exp(0.3 * rng.normal(size=(T, B))), jnp.float32)
    return v_tm1, v_t, r_t, discount_t, rho_tm1


def make_fns():
    """Both jitted, both returning (vs, pg_advantages) as [T, B]."""

    def ours(v_tm1, v_t, r_t, discount_t, rho_tm1):
        out = vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1)
        return out.vs, out.pg_advantages

    per_column = jax.vmap(
        lambda *xs: rlax.vtrace_td_error_and_advantage(*xs, lambda_=1.0), in_axes=1, out_axes=1
    )

    def reference(v_tm1, v_t, r_t, discount_t, rho_tm1):
        out = per_column(v_tm1, v_t, r_t, discount_t, rho_tm1)
        return out.errors + v_tm1, out.pg_advantage

    return jax.jit(ours), jax.jit(reference)


def main(argv=None) -> dict:
    args = common.parse_args(argv, __doc__.split("\n")[0])
    sizes = QUICK_SIZES if args.quick else SIZES
    reps = 15 if args.quick else 31
    ours, reference = make_fns()
    rows, results = [], []
    for T, B in sizes:
        xs = inputs(T, B)
        # Same answer first: a benchmark of two different computations would be meaningless.
        for a, b in zip(ours(*xs), reference(*xs), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
        calls = {f: functools.partial(f, *xs) for f in (ours, reference)}
        n = max(common.calls_for(c, jax.block_until_ready, 0.02) for c in calls.values())
        timed = {
            name: functools.partial(common.seconds_per_call, calls[f], jax.block_until_ready, n)
            for name, f in (("impala_jax", ours), ("rlax", reference))
        }
        samples = common.interleaved(timed, reps)
        ratios = [r / o for o, r in zip(samples["impala_jax"], samples["rlax"], strict=True)]
        entry = {
            "T": T,
            "B": B,
            "calls_per_sample": n,
            "samples": reps,
            "impala_jax_us": 1e6 * common.median(samples["impala_jax"]),
            "rlax_us": 1e6 * common.median(samples["rlax"]),
            # > 1: impala_jax is faster. The goal is >= 1 at every size.
            "speedup_vs_rlax": common.median(ratios),
        }
        results.append(entry)
        rows.append(
            [f"{T}x{B}", entry["impala_jax_us"], entry["rlax_us"], entry["speedup_vs_rlax"]]
        )
    print(common.table(rows, ["T x B", "impala_jax us", "rlax us", "rlax/impala_jax"]))
    worst = min(r["speedup_vs_rlax"] for r in results)
    payload = {
        "method": "jitted, compiled first, bursts of calls ended by block_until_ready, "
        "implementations alternated per sample; medians",
        "sizes": results,
        "min_speedup_vs_rlax": worst,
        "goal": "impala_jax no slower than rlax at every size (speedup >= 1)",
        "goal_met": worst >= 1.0,
    }
    common.write_result("vtrace", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
