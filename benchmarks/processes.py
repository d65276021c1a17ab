"""One run over two processes (jax.distributed, gloo on 127.0.0.1) vs the same run in one.

CartPole-v1 from ``experiments/cartpole.py`` with two learner devices and the same 256 envs
and global batch on both sides: one process with two forced CPU devices (two runner threads of
128 envs, or lockstep over 256), or two processes with one device each (one runner of 128 envs,
or lockstep over 128, each). Every run is the CLI from launch to exit, for a fixed training
time; the rate is env steps sampled per second over the iterations after the first few
(compilation left out), read from process 0's result.json (global counts). Cases alternate.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common

RUN_S = 25
QUICK_RUN_S = 10
SKIP_ITERATIONS = 3  # compilation and the first batches
CASES = {
    "threads": (
        ["env_runners.num_env_runners=2", "env_runners.num_envs_per_env_runner=128"],
        ["env_runners.num_env_runners=1", "env_runners.num_envs_per_env_runner=128"],
    ),
    "lockstep": (
        ["env_runners.num_env_runners=0", "env_runners.num_envs_per_env_runner=256"],
        ["env_runners.num_env_runners=0", "env_runners.num_envs_per_env_runner=128"],
    ),
}
COMMON = [
    "learners.num_learners=2",
    "training.train_batch_size_per_learner=1280",
    "training.minibatch_size=640",
    "--quiet",
    "--checkpoint-freq",
    "0",
    "--compile-cache",
    "none",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rate(logdir: Path) -> float:
    (run_dir,) = logdir.iterdir()
    rows = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    first, last = rows[min(SKIP_ITERATIONS, len(rows) - 2)], rows[-1]
    steps = last["num_env_steps_sampled_lifetime"] - first["num_env_steps_sampled_lifetime"]
    return steps / (last["time_total_s"] - first["time_total_s"])


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def _run(overrides: list[str], processes: int, run_s: float) -> float:
    with tempfile.TemporaryDirectory(prefix="impala_jax_processes_") as tmp:
        logdir = Path(tmp) / "runs"
        base = [sys.executable, "-m", "impala_jax.run", str(common.CARTPOLE_EXPERIMENT)]
        base += overrides + COMMON + ["--logdir", str(logdir), "--stop", f"time_total_s={run_s}"]
        if processes == 1:
            commands = [base]
        else:
            flags = ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
            commands = [base + flags + ["--process-id", str(i)] for i in range(processes)]
        env = _env(2 if processes == 1 else 1)
        procs = [
            subprocess.Popen(
                cmd,
                cwd=common.REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for cmd in commands
        ]
        try:
            for proc in procs:
                output, _ = proc.communicate(timeout=run_s + 120)
                if proc.returncode != 0:
                    raise RuntimeError(f"run failed ({proc.returncode}): {output[-2000:]}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        return _rate(logdir)


def main(argv=None) -> dict:
    args = common.parse_args(argv, __doc__.split("\n")[0])
    run_s, reps = (QUICK_RUN_S, 1) if args.quick else (RUN_S, 2)
    cases = {}
    for name, (one, two) in CASES.items():
        cases[f"{name}_one_process"] = lambda one=one: _run(one, 1, run_s)
        cases[f"{name}_two_processes"] = lambda two=two: _run(two, 2, run_s)
    rates = common.interleaved(cases, reps)
    summary = {}
    for name in CASES:
        one = common.median(rates[f"{name}_one_process"])
        two = common.median(rates[f"{name}_two_processes"])
        summary[name] = {
            "one_process_env_steps_per_s": one,
            "two_processes_env_steps_per_s": two,
            "two_vs_one": two / one,
        }
    rows = [
        [
            name,
            f"{s['one_process_env_steps_per_s']:,.0f}",
            f"{s['two_processes_env_steps_per_s']:,.0f}",
            f"{s['two_vs_one']:.2f}",
        ]
        for name, s in summary.items()
    ]
    print(common.table(rows, ["runners", "1 process", "2 processes", "2 / 1"]))
    payload = {"run_s": run_s, "rates": rates, "cases": summary}
    common.write_result("processes", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
