"""One run over two processes (jax.distributed, gloo on 127.0.0.1) vs the same run in one.

``--parts host``: CartPole-v1 from ``experiments/cartpole.py`` with two learner devices and the
same 256 envs and global batch on both sides: one process with two forced CPU devices (two
runner threads of 128 envs, or lockstep over 256), or two processes with one device each (one
runner of 128 envs, or lockstep over 128, each). ``--parts device``: on device,
``experiments/cartpole_gymnax.py`` with two learner devices: one process with two forced
devices on both cores, or two processes of one device each, each pinned to a core of its own
(``taskset``), and the same two unpinned (``device_unpinned``: the collectives' cost without a
core's scheduler between each process's compute and its gloo thread); the same 256 envs, split
over the devices, either way. Every run is the CLI from
launch to exit, for a fixed training time; the rate is env steps sampled per second over the
iterations after the first few (compilation left out), read from process 0's result.json
(global counts). Cases alternate; ``two_vs_one_per_pair`` holds each repetition's ratio.
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
HOST = [
    "learners.num_learners=2",
    "training.train_batch_size_per_learner=1280",
    "training.minibatch_size=640",
]
# The device part: the experiment as it is on two learner devices, and the same updates on one
# device (the same global batch and minibatches) as a second one-process reference: two forced
# CPU devices in one process can deadlock in XLA's all-reduce rendezvous on a loaded machine
# (tests/conftest.py), so a failed run counts as missing, not as zero.
DEVICE_EXPERIMENT = common.REPO / "experiments" / "cartpole_gymnax.py"
DEVICE_TWO = ["learners.num_learners=2"]
DEVICE_ONE = [
    "learners.num_learners=1",
    "training.train_batch_size_per_learner=5120",
    "training.minibatch_size=1280",
]
DEVICE_RUN_S, QUICK_DEVICE_RUN_S = 60, 40  # the first iteration compiles for ~20 s
COMMON = [
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


def _missing_if_failed(run) -> float:
    try:
        return run()
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"a run failed, counted as missing: {str(err)[:300]}", file=sys.stderr)
        return float("nan")


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def _run(
    overrides: list[str],
    processes: int,
    run_s: float,
    experiment: Path = common.CARTPOLE_EXPERIMENT,
    pinned: bool = False,
    devices: int | None = None,
) -> float:
    """``pinned``: process i runs on core i alone (``taskset``); ``devices``: CPU devices per
    process (default: two in one process, one in each of two)."""
    with tempfile.TemporaryDirectory(prefix="impala_jax_processes_") as tmp:
        logdir = Path(tmp) / "runs"
        base = [sys.executable, "-m", "impala_jax.run", str(experiment)]
        base += overrides + COMMON + ["--logdir", str(logdir), "--stop", f"time_total_s={run_s}"]
        if processes == 1:
            commands = [base]
        else:
            flags = ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
            commands = [base + flags + ["--process-id", str(i)] for i in range(processes)]
        if pinned:
            commands = [["taskset", "-c", str(i)] + cmd for i, cmd in enumerate(commands)]
        env = _env(devices or (2 if processes == 1 else 1))
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
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        parts={"nargs": "+", "choices": ["host", "device"], "default": ["host", "device"]},
        reps={"type": int, "default": None, "help": "repetitions (default 2, --quick 1)"},
    )
    run_s, reps = (QUICK_RUN_S, 1) if args.quick else (RUN_S, 2)
    reps = args.reps or reps
    cases = {}
    if "host" in args.parts:
        for name, (one, two) in CASES.items():
            cases[f"{name}_one_process"] = lambda one=one: _run(HOST + one, 1, run_s)
            cases[f"{name}_two_processes"] = lambda two=two: _run(HOST + two, 2, run_s)
    if "device" in args.parts:
        device_s = QUICK_DEVICE_RUN_S if args.quick else DEVICE_RUN_S
        for name, overrides, processes, devices, pinned in (
            ("device_one_process", DEVICE_TWO, 1, 2, False),
            ("device_one_device_one_process", DEVICE_ONE, 1, 1, False),
            ("device_two_processes", DEVICE_TWO, 2, 1, True),
            ("device_two_processes_unpinned", DEVICE_TWO, 2, 1, False),
        ):
            cases[name] = lambda o=overrides, p=processes, d=devices, pin=pinned: (
                _missing_if_failed(
                    lambda: _run(o, p, device_s, DEVICE_EXPERIMENT, pinned=pin, devices=d)
                )
            )
    rates = common.interleaved(cases, reps)
    summary = {}
    # (label, one process's case, two processes' case)
    pairs = [
        (n.replace("_one_process", ""), n, n.replace("_one_process", "_two_processes"))
        for n in cases
    ]
    pairs += [
        ("device_one_device", "device_one_device_one_process", "device_two_processes"),
        ("device_unpinned", "device_one_process", "device_two_processes_unpinned"),
    ]
    for label, one_name, two_name in pairs:
        if one_name == two_name or one_name not in cases or two_name not in cases:
            continue
        ones, twos = rates[one_name], rates[two_name]
        per_pair = [b / a for a, b in zip(ones, twos, strict=True) if a == a and b == b]
        ones, twos = [x for x in ones if x == x], [x for x in twos if x == x]
        if not ones or not twos:
            continue
        summary[label] = {
            "one_process_env_steps_per_s": common.median(ones),
            "two_processes_env_steps_per_s": common.median(twos),
            "two_vs_one": common.median(twos) / common.median(ones),
            "two_vs_one_per_pair": per_pair,
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
    # Both parts: processes.json (make bench); one part: a file of its own beside it.
    parts = sorted(set(args.parts))
    name = "processes" if len(parts) == 2 else f"processes_{parts[0]}"
    common.write_result(name, payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
