"""The CLI: override and stop parsing in-process, and the real thing in a few subprocesses.

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
from impala_jax.run import RunError

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


def config():
    return IMPALAConfig().environment("CartPole-v1")


def test_parse_value():
    assert run.parse_value("3e-4") == 3e-4
    assert run.parse_value("[64, 64]") == [64, 64]
    assert run.parse_value("None") is None
    assert run.parse_value("CartPole-v1") == "CartPole-v1"
    assert run.parse_value("pkg.mod:Env") == "pkg.mod:Env"
    with pytest.raises(RunError, match="not a Python literal"):
        run.parse_value("[1, 2")


def test_overrides_go_through_the_builders():
    c = config().rl_module(model_config={"encoder": "mlp", "fcnet_hiddens": [4]})
    run.apply_overrides(
        c,
        [
            "training.lr=1e-3",
            "env_runners.num_envs_per_env_runner=8",
            "environment.env=Pendulum-v1",
            "rl_module.model_config.fcnet_hiddens=[32, 32]",
            "environment.env_config.max_episode_steps=50",
        ],
    )
    assert c.lr == 1e-3 and c.num_envs_per_env_runner == 8 and c.env == "Pendulum-v1"
    assert c.model_config["fcnet_hiddens"] == [32, 32]
    assert c.model_config["encoder"] == "mlp"  # a key override keeps the rest of the dict
    assert c.env_config == {"max_episode_steps": 50}


@pytest.mark.parametrize(
    "override,message",
    [
        ("training.lr", "section.field=value"),
        ("trainng.lr=1", "did you mean 'training'"),
        ("training.num_env_runners=2", "set by env_runners.num_env_runners"),
        ("training.lrr=1", "did you mean training.lr"),
        ("env_runners.rollout_fragment_length=-3", "rollout_fragment_length"),
        ("rl_module.model_config.fcnet_hidden=[1]", "fcnet_hidden"),
        ("training.lr=[1,", "not a Python literal"),
    ],
)
def test_override_errors(override, message):
    with pytest.raises(RunError, match=message) as err:
        run.apply_overrides(config(), [override])
    assert "\n" not in str(err.value)


def test_stop_parsing_and_criteria():
    stop = run.parse_stop(["env_runners/episode_return_mean=450", "time_total_s=60"])
    assert stop == {"env_runners/episode_return_mean": 450, "time_total_s": 60}
    with pytest.raises(RunError, match="not a number"):
        run.parse_stop(["training_iteration=soon"])
    with pytest.raises(RunError, match="KEY=VALUE"):
        run.parse_stop(["training_iteration"])
    result = {"env_runners": {"episode_return_mean": float("nan")}, "time_total_s": 10.0}
    assert run.stop_reached(result, stop) is None  # NaN (no episode yet) never stops
    result["env_runners"]["episode_return_mean"] = 451.0
    assert run.stop_reached(result, stop) == "env_runners/episode_return_mean=451 >= 450"
    assert run.missing_stop_keys(result, {"env_runners/episode_return": 1}) == [
        "env_runners/episode_return"
    ]
    assert run.missing_stop_keys(result, {"evaluation/env_runners/episode_return_mean": 1}) == []


def test_eta_and_budget():
    result = {"num_env_steps_sampled_lifetime": 1000, "training_iteration": 10, "time_total_s": 20}
    assert display.eta_s(result, {"env_runners/episode_return_mean": 1}, 100.0) is None
    assert display.eta_s(result, {"num_env_steps_sampled_lifetime": 2000}, 100.0) == 10.0
    assert display.eta_s(result, {"training_iteration": 15}, None) == 10.0
    assert display.eta_s(result, {"time_total_s": 25, "training_iteration": 100}, 1.0) == 5.0
    assert display.budget_fraction(result, {"num_env_steps_sampled_lifetime": 4000}) == 0.25
    assert display.budget_fraction(result, {}) is None


def test_one_line():
    err = ValueError("Invalid IMPALAConfig:\n  gamma=3: bad.\n  lr=-1: bad.")
    assert run.one_line(err) == "Invalid IMPALAConfig: gamma=3: bad.; lr=-1: bad."


def test_experiment_file_errors(tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        run.load_experiment(tmp_path / "nope.py")
    broken = tmp_path / "broken.py"
    broken.write_text("config = (\n")
    with pytest.raises(RunError, match="SyntaxError"):
        run.load_experiment(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(RunError, match="module-level `config`"):
        run.load_experiment(empty)
    bad_stop = tmp_path / "bad_stop.py"
    bad_stop.write_text(
        "from impala_jax import IMPALAConfig\nconfig = IMPALAConfig()\nstop = {'a': 'x'}\n"
    )
    with pytest.raises(RunError, match="not a number"):
        run.load_experiment(bad_stop)


def test_main_reports_config_errors_in_one_line(tmp_path, capsys):
    argv = [CARTPOLE, "training.gamma=3", "training.lr=-1", "--logdir", str(tmp_path)]
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("impala_jax.run: error: ") and "\n" not in err
    assert "gamma=3" in err and "lr=-1" in err
    assert not list(tmp_path.iterdir())  # nothing is created for a config that fails
    assert run.main(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_devices_sets_xla_flags_before_jax(monkeypatch):
    with pytest.raises(RunError, match="before JAX is imported"):
        run.set_jax_environment(2)  # this process imported JAX long ago
    monkeypatch.delitem(sys.modules, "jax")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --other")
    monkeypatch.setenv("JAX_PLATFORMS", "")
    run.set_jax_environment(4)
    assert os.environ["XLA_FLAGS"].split() == [
        "--other",
        "--xla_force_host_platform_device_count=4",
    ]
    assert os.environ["JAX_PLATFORMS"] == "cpu"


def test_checkpoint_pruning(tmp_path):
    class FakeAlgo:
        def save(self, path):
            Path(path).mkdir()
            (Path(path) / "state.json").write_text("{}")
            return str(path)

    for i in (2, 4, 6, 8):
        run.save_checkpoint(FakeAlgo(), tmp_path, i, keep=3)
    (tmp_path / ".checkpoint_000010.tmp-x").mkdir()  # a save cut short: never listed
    assert [i for i, _ in run.checkpoints(tmp_path)] == [4, 6, 8]


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
    ((interrupted_at, checkpoint),) = run.checkpoints(run_dir)[-1:]
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
    final = run.checkpoints(run_dir)
    assert final[-1][0] == after[-1]["training_iteration"] and len(final) <= 3
