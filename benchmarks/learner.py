"""Learner step: env steps (samples) per second of ``Learner.update`` on 1 and 2 devices.

Synthetic batches shaped like CartPole-v1 (4 floats, 2 actions, the experiment's 64x64 tanh MLP)
and like Atari (4x84x84 uint8 frames, 6 actions, the deep IMPALA CNN), time-major
``[T+1, B]`` as the runners deliver them. The device batch is put once and reused: this times
the compiled step, not the host-to-device copy (end_to_end.py times that).

Two CPU devices are forced with ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` in a
subprocess (collectives between forced CPU devices can hang on a loaded machine, so it runs
under a hard timeout and reports whatever it finished); inside it 1 and 2 devices alternate.
A second subprocess without the flag gives the plain 1-device figures.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time

from benchmarks import common

T = 20
# (name, model_config, columns B per batch)
CARTPOLE = ("cartpole_mlp", {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"})
# The same MLP with RLlib's default LSTM core after it (256 cells, prev action and reward off),
# unrolled over the whole fragment (max_seq_len = T): the cost of use_lstm.
CARTPOLE_LSTM = (
    "cartpole_lstm",
    {**CARTPOLE[1], "use_lstm": True, "lstm_cell_size": 256, "max_seq_len": T},
)
ATARI = ("atari_impala_cnn", {"encoder": "impala_cnn"})
CASES = (
    [(CARTPOLE, b) for b in (32, 64, 256)]
    + [(CARTPOLE_LSTM, b) for b in (32, 64, 256)]
    + [(ATARI, b) for b in (4, 16)]
)
QUICK_CASES = [(c, b) for c in (CARTPOLE, CARTPOLE_LSTM) for b in (64, 256)] + [(ATARI, 4)]
WORKER_TIMEOUT_S = 240
# A step slower than this is timed once, and larger batches of its kind are skipped.
SLOW_STEP_S = 5.0


def make_batch(kind: str, b: int, seed: int = 0):
    import numpy as np

    from impala_jax.core.types import Trajectory

    rng = np.random.default_rng(seed)
    if kind.startswith("cartpole"):
        obs = rng.normal(size=(T + 1, b, 4)).astype(np.float32)
        n_act = 2
    else:
        obs = rng.integers(0, 256, (T + 1, b, 4, 84, 84), dtype=np.uint8)
        n_act = 6
    done = rng.random((T, b)) < 0.02
    recurrent = {}
    if kind == "cartpole_lstm":
        cell, chunks = CARTPOLE_LSTM[1]["lstm_cell_size"], T // CARTPOLE_LSTM[1]["max_seq_len"] + 1
        state = rng.normal(size=(chunks, b, cell)).astype(np.float32)
        reset = np.concatenate([np.zeros((1, b), bool), done], axis=0)
        recurrent = {
            "core_state": {"lstm": (state, state)},
            "prev_action": rng.integers(0, n_act, (T + 1, b)).astype(np.int32),
            "prev_reward": rng.normal(size=(T + 1, b)).astype(np.float32),
            "reset": reset,
        }
    return Trajectory(
        obs=obs,
        action=rng.integers(0, n_act, (T, b)).astype(np.int32),
        behaviour_logits=rng.normal(size=(T, b, n_act)).astype(np.float32),
        reward=rng.normal(size=(T, b)).astype(np.float32),
        terminated=done,
        truncated=np.zeros((T, b), bool),
        valid=np.ones((T, b), np.float32),
        param_version=np.zeros(b, np.int32),
        **recurrent,
    )


def make_learner(kind: str, model_config: dict, b: int, num_devices: int):
    import gymnasium as gym
    import jax
    import numpy as np

    from impala_jax.core.distributions import make_distribution
    from impala_jax.core.losses import LossSpec
    from impala_jax.core.networks import make_networks
    from impala_jax.core.optim import OptimizerSpec
    from impala_jax.core.recurrent import make_recurrent_networks
    from impala_jax.core.update import StepSpec
    from impala_jax.rllib.model_config_checks import merge_model_config
    from impala_jax.runtime.learning.learner import Learner

    if kind.startswith("cartpole"):
        obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        act_space = gym.spaces.Discrete(2)
    else:
        obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        act_space = gym.spaces.Discrete(6)
    columns = b // num_devices
    step = StepSpec(
        columns=columns,
        replay_columns=0,
        replay_slots=0,
        minibatch_columns=columns,
        num_epochs=1,
        shuffle=False,
    )
    # experiments/cartpole.py's loss and optimizer settings.
    loss = LossSpec(0.99, 0.5, 0.0, 1.0, 1.0, None)
    model_config = merge_model_config(model_config)
    make = make_recurrent_networks if model_config["use_lstm"] else make_networks
    return Learner(
        make(model_config, obs_space, act_space),
        make_distribution(act_space),
        OptimizerSpec(lr=0.003, grad_clip=40.0),
        loss,
        step,
        jax.devices()[:num_devices],
        jax.random.key(0),
    )


def _cases(quick: bool, atari_batches: list[int] | None) -> list:
    cases = QUICK_CASES if quick else CASES
    if atari_batches:  # e.g. a GPU's 32 (the paper's 32 x 20) and larger
        cases = [c for c in cases if c[0] is not ATARI] + [(ATARI, b) for b in atari_batches]
    return cases


def worker(
    device_counts: list[int], quick: bool, skip: set[str], atari_batches: list[int] | None = None
) -> None:
    """Prints one JSON line per (case, devices) as soon as it is measured."""
    import jax

    reps = 5 if quick else 9
    for (kind, model_config), b in _cases(quick, atari_batches):
        if f"{kind}:{b}" in skip or kind in skip:
            continue
        cases = {}
        for n in device_counts:
            learner = make_learner(kind, model_config, b, n)
            batch = learner.put_batch(make_batch(kind, b))
            started = time.perf_counter()
            jax.block_until_ready(learner.update(batch, 0))  # compile
            compile_s = time.perf_counter() - started
            step = lambda lr=learner, bt=batch: lr.update(bt, 0)
            one = common.seconds_per_call(step, jax.block_until_ready, 1)
            cases[n] = (step, max(1, int(0.25 / one)), compile_s, one)
        slow = max(c[3] for c in cases.values()) > SLOW_STEP_S
        if slow:  # one more step each would take too long: the first timed step is the figure
            samples = {n: [c[3]] for n, c in cases.items()}
        else:
            samples = common.interleaved(
                {
                    n: functools.partial(common.seconds_per_call, c[0], jax.block_until_ready, c[1])
                    for n, c in cases.items()
                },
                reps,
            )
        for n, (_, calls, compile_s, _) in cases.items():
            sec = common.median(samples[n])
            line = {
                "case": kind,
                "T": T,
                "B": b,
                "env_steps_per_batch": T * b,
                "devices": n,
                "step_ms": 1e3 * sec,
                "samples_per_s": T * b / sec,
                "compile_s": compile_s,
                "calls_per_sample": calls,
                "samples": len(samples[n]),
            }
            if len(device_counts) > 1:
                line["per_sample_step_s"] = samples[n]
            print(json.dumps(line), flush=True)
        if slow:
            skip.add(kind)  # larger batches of this kind would only be slower


def _spawn(
    device_counts: list[int],
    forced: int | None,
    quick: bool,
    skip: set[str],
    platform: str = "cpu",
    atari_batches: str = "",
) -> tuple[list, str | None]:
    env = {"JAX_PLATFORMS": "cpu"} if platform == "cpu" else {}
    if forced:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={forced}"
    argv = ["-m", "benchmarks.learner", "--worker", ",".join(map(str, device_counts))]
    argv += ["--quick"] if quick else []
    argv += ["--skip", ",".join(sorted(skip))] if skip else []
    argv += ["--atari-batches", atari_batches] if atari_batches else []
    error = None
    try:
        proc = common.run_python(argv, WORKER_TIMEOUT_S, env)
        out = proc.stdout
        if proc.returncode:
            error = f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        error = f"timed out after {WORKER_TIMEOUT_S} s (finished cases are kept)"
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return lines, error


def main(argv=None) -> dict:
    args = common.parse_args(
        argv,
        __doc__.split("\n")[0],
        worker={"default": None, "help": "internal: device counts to measure, e.g. 1,2"},
        skip={"default": "", "help": "internal: cases to skip, kind or kind:B, comma-separated"},
        platform={
            "default": "cpu",
            "choices": ["cpu", "default"],
            "help": "cpu (forced, and 1 vs 2 forced CPU devices) or JAX's default (a GPU: one "
            "device, no forced-device run)",
        },
        atari_batches={"default": "", "help": "Atari batch columns B instead of 4,16: 32,128"},
    )
    batches = [int(b) for b in args.atari_batches.split(",") if b]
    if args.worker:
        skip = set(filter(None, args.skip.split(",")))
        worker([int(n) for n in args.worker.split(",")], args.quick, skip, batches)
        return {}
    one, error_one = _spawn([1], None, args.quick, set(), args.platform, args.atari_batches)
    # Cases too slow on one device are not repeated with two (they would only add minutes).
    slow = {f"{e['case']}:{e['B']}" for e in one if e["step_ms"] > 1e3 * SLOW_STEP_S}
    measured = {f"{e['case']}:{e['B']}" for e in one}
    not_measured = {f"{k}:{b}" for (k, _), b in _cases(args.quick, batches)} - measured
    both, error_two = [], "not run: one device of JAX's default platform"
    if args.platform == "cpu":
        both, error_two = _spawn([1, 2], 2, args.quick, slow | not_measured)
    rows, entries = [], []
    for e in one:
        match = {x["devices"]: x for x in both if (x["case"], x["B"]) == (e["case"], e["B"])}
        entry = {
            "case": e["case"],
            "T": T,
            "B": e["B"],
            "env_steps_per_batch": e["env_steps_per_batch"],
            "one_device": e,
            "forced_two_device_process": match,
        }
        if 1 in match and 2 in match:
            ratios = [
                a / b
                for a, b in zip(
                    match[1]["per_sample_step_s"], match[2]["per_sample_step_s"], strict=True
                )
            ]
            entry["two_vs_one_device_speedup"] = common.median(ratios)
        entries.append(entry)
        rows.append(
            [
                e["case"],
                f"{T}x{e['B']}",
                e["step_ms"],
                e["samples_per_s"],
                match.get(1, {}).get("samples_per_s", float("nan")),
                match.get(2, {}).get("samples_per_s", float("nan")),
                entry.get("two_vs_one_device_speedup", float("nan")),
            ]
        )
    print(
        common.table(
            rows,
            ["case", "T x B", "step ms", "samples/s 1 dev", "1 dev (forced 2)", "2 dev", "2/1"],
        )
    )
    payload = {
        "method": "Learner.update on a reused device batch, compiled first, bursts of steps "
        "ended by block_until_ready, median of samples; 1 vs 2 forced CPU devices alternate "
        "inside one subprocess",
        "cases": entries,
        "errors": {"one_device": error_one, "two_devices": error_two},
        "note_two_devices": "Two forced CPU devices share the same 2 cores, so no speedup is "
        "expected here; this checks the data-parallel path's overhead.",
    }
    common.write_result("learner", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
