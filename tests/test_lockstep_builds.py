"""Lockstep (``num_env_runners=0``) with a fixed seed repeats bit for bit however often it is
built: twice in one process, in a fresh process, and with the compilation cache and the
program cache (impala_jax.runtime.learning.program_cache) cold or warm (issue 44, item 3)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = 3
CACHE_ENV = "IMPALA_JAX_COMPILE_CACHE"


def config() -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=10)
        .training(
            train_batch_size_per_learner=80,
            minibatch_size=40,
            num_epochs=2,
            shuffle_batch_per_epoch=True,
            lr=1e-3,
        )
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .reporting(min_time_s_per_iteration=0)
        .debugging(seed=7)
    )


def fingerprint() -> dict:
    """What must repeat exactly: each iteration's env steps, return and learner metrics (as
    repr, every bit), and a digest of the final params' bytes; plus how the step was resolved
    (the program cache's "exported" / "loaded", None without it), which may differ."""
    iterations = []
    with config().build() as algo:
        for _ in range(ITERATIONS):
            result = algo.train()
            learner = result["learners"]["default_policy"]
            iterations.append(
                {
                    "env_steps": result["num_env_steps_sampled_lifetime"],
                    "return": repr(result["env_runners"].get("episode_return_mean")),
                    "learner": {k: repr(v) for k, v in sorted(learner.items())},
                }
            )
        params = jax.device_get(algo.learner.state.params)
        source = getattr(algo.learner._step, "source", None)
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return {"iterations": iterations, "params": digest.hexdigest(), "source": source}


def child_main(cache: str, builds: str) -> None:
    """The fingerprints of ``builds`` builds in a fresh process, printed as JSON; ``cache``:
    the compilation cache's folder, or "none"."""
    if cache != "none":
        from impala_jax.runtime.process.jax_setup import enable_compile_cache

        enable_compile_cache(cache)
    print(json.dumps([fingerprint() for _ in range(int(builds))]))


def in_fresh_process(cache: str, builds: int = 1) -> list[dict]:
    code = (
        "import sys; from tests.test_lockstep_builds import child_main; child_main(*sys.argv[1:])"
    )
    env = {**os.environ, CACHE_ENV: cache}
    out = subprocess.run(
        [sys.executable, "-c", code, cache, str(builds)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def same(a: dict, b: dict) -> bool:
    return (a["iterations"], a["params"]) == (b["iterations"], b["params"])


@pytest.fixture(scope="module")
def reference():
    """The first build in this process, without the caches."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, "none")
        return fingerprint()


@pytest.mark.timeout(200)
def test_two_builds_in_one_process_are_bit_identical(reference, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "none")
    again = fingerprint()
    assert again["iterations"] == reference["iterations"]
    assert again["params"] == reference["params"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_fresh_process_repeats_the_first(reference):
    (fresh,) = in_fresh_process("none")
    assert same(fresh, reference)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cold_and_warm_compile_cache_repeat_it(reference, tmp_path):
    cache = str(tmp_path / "xla")
    # Cold, then warm in the same process (the stored programs loaded), then in a new one.
    cold, warm_here = in_fresh_process(cache, builds=2)
    (warm,) = in_fresh_process(cache)
    assert (cold["source"], warm_here["source"], warm["source"]) == ("exported", "loaded", "loaded")
    assert same(cold, reference)
    assert same(warm_here, reference)
    assert same(warm, reference)
