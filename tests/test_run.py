"""The CLI: error paths and the loggers in-process, and the real thing in a few subprocesses.

Subprocess runs cost ~6-10 s each (JAX import and compiles), so the end-to-end story is two of
them: a run stopped by SIGINT after its first result, then ``--resume`` of that run to a step
budget. Together they check the exit statuses, the interrupt checkpoint (restored by the
resume), counters that continue, and every file of the run directory. Error cases exit before
anything is built.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impala_jax import IMPALAConfig, display, loggers, run
from impala_jax.run_dir import checkpoints

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "experiments" / "cartpole.py")
TINY = [
    "env_runners.num_env_runners=0",
    "env_runners.num_envs_per_env_runner=4",
    "env_runners.rollout_fragment_length=8",
    "training.train_batch_size_per_learner=64",
    "training.minibatch_size=None",
    "reporting.min_time_s_per_iteration=0",
    "rl_module.model_config={'fcnet_hiddens': [8]}",
]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "impala_jax.run", *args]


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")


def results(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


def event_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of a TensorBoard event file, read record by record with tensorboardX's proto.

    A record is: uint64 length, uint32 crc, ``length`` bytes of an Event, uint32 crc.
    """
    from tensorboardX.proto import event_pb2

    data, pos, out = path.read_bytes(), 0, {}
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


# ---------------------------------------------------------------------------- in-process


def test_eta_and_budget():
    result = {"num_env_steps_sampled_lifetime": 1000, "training_iteration": 10, "time_total_s": 20}
    assert display.eta_s(result, {"env_runners/episode_return_mean": 1}, 100.0) is None
    assert display.eta_s(result, {"num_env_steps_sampled_lifetime": 2000}, 100.0) == 10.0
    assert display.eta_s(result, {"training_iteration": 15}, None) == 10.0
    assert display.eta_s(result, {"time_total_s": 25, "training_iteration": 100}, 1.0) == 5.0
    assert display.budget_fraction(result, {"num_env_steps_sampled_lifetime": 4000}) == 0.25
    assert display.budget_fraction(result, {}) is None


def test_main_reports_config_errors_in_one_line(tmp_path, capsys):
    argv = [CARTPOLE, "training.gamma=3", "training.lr=-1", "--logdir", str(tmp_path)]
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("impala_jax.run: error: ") and "\n" not in err
    assert "gamma=3" in err and "lr=-1" in err
    assert not list(tmp_path.iterdir())  # nothing is created for a config that fails
    assert run.main(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_json_and_csv_loggers_resume_cleanly(tmp_path):
    def result(i, **extra):
        return {"training_iteration": i, "env_runners": {"episode_return_mean": 1.0 * i}, **extra}

    json_log, csv_log = loggers.JsonLogger(tmp_path), loggers.CSVLogger(tmp_path)
    for i in (1, 2, 3):
        json_log.write(result(i))
        csv_log.write(result(i, **({"evaluation": {"r": 5.0}} if i == 3 else {})))
    json_log.close()
    # Resuming from the iteration-2 checkpoint drops what iteration 3 wrote, then appends.
    json_log, csv_log = loggers.JsonLogger(tmp_path, 2), loggers.CSVLogger(tmp_path, 2)
    json_log.write(result(3))
    csv_log.write(result(3))
    json_log.close()
    lines = results(tmp_path)
    assert [r["training_iteration"] for r in lines] == [1, 2, 3]
    assert lines[-1]["iterations_since_restore"] == 1 and lines[-1]["done"] is False
    with open(tmp_path / "progress.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert (
        "evaluation/r" in reader.fieldnames
        and "env_runners/episode_return_mean" in reader.fieldnames
    )
    assert [r["training_iteration"] for r in rows] == ["1", "2", "3"]


def test_tensorboard_and_curve(tmp_path):
    import matplotlib.image

    tb = loggers.TensorBoardLogger(tmp_path)
    curve = loggers.CurvePlotter(tmp_path, {"env_runners/episode_return_mean": 3}, interval_s=1e9)
    for i in (1, 2):
        r = {
            "num_env_steps_sampled_lifetime": 100 * i,
            "env_runners": {"episode_return_mean": float(i), "episode_return_min": 0.0},
            "done": False,
            "perf": {"lag": 1},
        }
        tb.write(r)
        curve.write(r)
    tb.close()
    curve.close()
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    scalars = event_scalars(event_file)
    assert scalars["env_runners/episode_return_mean"] == [(100, 1.0), (200, 2.0)]
    assert "done" not in scalars and "perf/lag" in scalars
    assert matplotlib.image.imread(tmp_path / "learning_curve.png").ndim == 3


def test_wandb_logger_with_a_fake_wandb(tmp_path, monkeypatch):
    import types

    logged = []

    class FakeRun:
        def define_metric(self, *args, **kwargs):
            pass

        def log(self, data):
            logged.append(data)

        def finish(self):
            logged.append("finished")

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: logged.append(kwargs) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert loggers.wandb_missing_message() is None
    w = loggers.WandbLogger(tmp_path, "name", {"lr": 1}, "proj", "abc")
    w.write({"num_env_steps_sampled_lifetime": 5, "env_runners": {"episode_return_mean": 2.0}})
    w.close()
    assert logged[0]["id"] == "abc" and logged[0]["resume"] == "allow"
    assert logged[1] == {
        "num_env_steps_sampled_lifetime": 5.0,
        "env_runners/episode_return_mean": 2.0,
    }
    assert logged[2] == "finished"
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an absent package looks like
    assert "pip install" in loggers.wandb_missing_message()


def test_json_safe():
    assert loggers.json_safe({"env": IMPALAConfig, "t": (1, 2)}) == {
        "env": "impala_jax.config:IMPALAConfig",
        "t": [1, 2],
    }


# ---------------------------------------------------------------------------- subprocesses


@pytest.mark.timeout(60)
def test_cli_override_error_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run(
        cli(CARTPOLE, "training.no_such_field=1", "--logdir", str(tmp_path)),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "training() has no field 'no_such_field'" in proc.stderr


@pytest.mark.timeout(300)
def test_cli_sigint_then_resume(tmp_path):
    # 1. A run with no reachable budget, interrupted after its first result line.
    proc = subprocess.Popen(
        cli(
            CARTPOLE,
            *TINY,
            "--stop",
            "num_env_steps_sampled_lifetime=1e9",
            "--logdir",
            str(tmp_path),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("iter "), first + proc.stderr.read()
        time.sleep(0.5)  # a few more iterations
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out + err
    assert (
        "interrupted by SIGINT" in out and "resume with: python -m impala_jax.run --resume" in out
    )
    (run_dir,) = tmp_path.iterdir()
    assert out.strip().endswith(f"run directory: {run_dir}")
    ((interrupted_at, checkpoint),) = checkpoints(run_dir)[-1:]
    before = results(run_dir)
    assert before[-1]["training_iteration"] == interrupted_at  # checkpoint of the last result
    steps_before = before[-1]["num_env_steps_sampled_lifetime"]

    # 2. Resume it to a step budget: the counters continue and the logs are appended to.
    budget = steps_before + 640
    proc = subprocess.run(
        cli("--resume", str(run_dir), "--stop", f"num_env_steps_sampled_lifetime={budget}"),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("iter ")
    assert "stopped: num_env_steps_sampled_lifetime=" in proc.stdout
    after = results(run_dir)
    assert after[: len(before)] == before
    resumed = after[len(before) :]
    assert resumed[0]["training_iteration"] == interrupted_at + 1
    assert resumed[0]["iterations_since_restore"] == 1
    assert resumed[0]["num_env_steps_sampled_lifetime"] > steps_before
    assert resumed[-1]["done"] is True and resumed[-1]["num_env_steps_sampled_lifetime"] >= budget
    assert all(not r["done"] for r in after[:-1])

    # 3. Every file of the run directory is there and readable.
    names = {p.name for p in run_dir.iterdir()}
    assert {"params.json", "run.json", "result.json", "progress.csv", "learning_curve.png"} <= names
    params = json.loads((run_dir / "params.json").read_text())
    assert params["env"] == "CartPole-v1" and params["num_envs_per_env_runner"] == 4
    assert IMPALAConfig.from_dict(params).train_batch_size_per_learner == 64
    record = json.loads((run_dir / "run.json").read_text())
    assert record["stop"] == {"num_env_steps_sampled_lifetime": budget} and len(record["argv"]) == 2
    with open(run_dir / "progress.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    for key in (
        "training_iteration",
        "num_env_steps_sampled_lifetime",
        "env_runners/episode_return_mean",
        "learners/default_policy/total_loss",
        "perf/env_steps_sampled_per_s",
    ):
        assert key in reader.fieldnames
    assert [int(r["training_iteration"]) for r in rows] == [r["training_iteration"] for r in after]
    scalars: dict = {}
    for event_file in run_dir.glob("events.out.tfevents.*"):
        for tag, points in event_scalars(event_file).items():
            scalars.setdefault(tag, []).extend(points)
    steps = [s for s, _ in scalars["learners/default_policy/total_loss"]]
    assert len(steps) == len(after) and max(steps) == after[-1]["num_env_steps_sampled_lifetime"]
    import matplotlib.image

    assert matplotlib.image.imread(run_dir / "learning_curve.png").shape[-1] in (3, 4)
    final = checkpoints(run_dir)
    assert final[-1][0] == after[-1]["training_iteration"] and len(final) <= 3
