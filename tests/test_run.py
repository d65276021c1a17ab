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

from impala_jax import IMPALAConfig, run
from impala_jax.cli import display, loggers
from impala_jax.cli.args import parse_args
from impala_jax.cli.run_dir import checkpoints
from impala_jax.rllib.results import lookup

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "experiments" / "cartpole.py")
RLLIB_EXAMPLE = str(ROOT / "tests" / "rllib_examples" / "cartpole_impala.py")
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
    # RLlib's spelling of the step budget counts the same steps.
    runner_budget = {"env_runners/num_env_steps_sampled_lifetime": 2000}
    assert display.eta_s(result, runner_budget, 100.0) == 10.0
    result["env_runners"] = {"num_env_steps_sampled_lifetime": 1000}
    assert display.budget_fraction(result, runner_budget) == 0.5
    assert display.budget_fraction(result, {}) is None


def test_arguments_after_a_double_dash_go_to_the_experiment_file(capsys):
    args = parse_args(
        [CARTPOLE, "training.lr=1e-3", "--stop", "training_iteration=2", "--", "--x=1", "a=b"]
    )
    assert args.overrides == ["training.lr=1e-3"] and args.stop == ["training_iteration=2"]
    assert args.script_args == ["--x=1", "a=b"]
    assert parse_args([CARTPOLE]).script_args == []
    with pytest.raises(SystemExit) as exit_:
        parse_args([CARTPOLE, "--num-env-runners=2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --num-env-runners=2" in err and "after `--`" in err


def test_a_stop_key_that_can_never_appear_fails_before_anything_is_built(tmp_path, capsys):
    argv = [CARTPOLE, *TINY, "--logdir", str(tmp_path), "--stop"]
    assert run.main([*argv, "env_runners/episode_return=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "never reports" in err
    assert "(did you mean env_runners/episode_return_m" in err
    assert "env_runners/episode_return_mean" in err.split("did you mean", 1)[1]
    assert run.main([*argv, "evaluation/env_runners/episode_return_mean=1"]) == 2
    assert "evaluation_interval" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


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


def test_a_csv_rewrite_and_a_curve_draw_are_whole_or_nothing(tmp_path, monkeypatch):
    # Both write a temporary sibling and rename it (write_atomic's rule): a failed rename
    # leaves the old file and no temporary one behind.
    from impala_jax.cli import curve

    csv_log = loggers.CSVLogger(tmp_path)
    csv_log.write({"training_iteration": 1})
    csv_log.write({"training_iteration": 2, "evaluation": {"r": 5.0}})  # a new key: rewrite
    before = (tmp_path / "progress.csv").read_bytes()
    assert before.splitlines(keepends=True)[0].endswith(b"\r\n")  # csv's own line ends
    curve.draw(tmp_path / "learning_curve.png", [(1.0, 1.0, 0.0, 2.0, 1.0)], {}, "")
    drawn = (tmp_path / "learning_curve.png").read_bytes()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        csv_log.write({"training_iteration": 3, "new": 1.0})
    with pytest.raises(OSError, match="disk full"):
        curve.draw(tmp_path / "learning_curve.png", [(2.0, 2.0, 0.0, 2.0, 1.0)], {}, "")
    assert (tmp_path / "progress.csv").read_bytes() == before
    assert (tmp_path / "learning_curve.png").read_bytes() == drawn
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learning_curve.png", "progress.csv"]


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


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.02)


def test_the_curve_is_drawn_by_a_process_of_its_own_after_its_interval(tmp_path):
    # The first draw waits interval_s like every later one; the drawing process draws it, and
    # the training process never imports matplotlib (its import held the GIL the runner needs).
    code = f"""
import sys, time
from impala_jax.cli import loggers
curve = loggers.CurvePlotter(__import__("pathlib").Path({str(tmp_path)!r}), interval_s=600)
r = {{"num_env_steps_sampled_lifetime": 100, "env_runners": {{"episode_return_mean": 1.0}}}}
curve.write(r)
time.sleep(2.0)
assert not curve.path.exists()
curve._last_draw -= 600  # the interval has passed
curve.write(r)
deadline = time.monotonic() + 60
while not curve.path.exists():
    assert time.monotonic() < deadline, "no curve 60 s after the draw request"
    time.sleep(0.02)
assert not curve._dirty
curve.path.unlink()
curve.close()  # nothing new since the draw, but the file is gone: drawn again
assert curve.path.exists() and curve._proc is None
assert "matplotlib" not in sys.modules
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # no fallback warning


def test_close_leaves_the_final_curve_to_the_drawing_process(tmp_path):
    # Points written after the last draw request: the drawing process's final curve holds them,
    # and close() does not draw it a second time in the training process.
    code = f"""
import sys
from impala_jax.cli import loggers
curve = loggers.CurvePlotter(__import__("pathlib").Path({str(tmp_path)!r}), interval_s=600)
for i in range(1, 4):
    returns = {{"episode_return_mean": i}}
    curve.write({{"num_env_steps_sampled_lifetime": 100 * i, "env_runners": returns}})
assert curve._dirty
curve.close()
assert curve.path.exists() and not curve._dirty
assert "matplotlib" not in sys.modules
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # no fallback warning


def _points(n: int) -> list[dict]:
    return [
        {"num_env_steps_sampled_lifetime": 100 * i, "env_runners": {"episode_return_mean": i}}
        for i in range(1, n + 1)
    ]


def test_a_training_process_that_dies_still_leaves_its_curve(tmp_path):
    # Every point goes to the drawing process as it comes: at the end of its input (the
    # training process gone, without close()) it draws them all.
    code = f"""
import os
from impala_jax.cli import loggers
curve = loggers.CurvePlotter(__import__("pathlib").Path({str(tmp_path)!r}), interval_s=600)
for r in {_points(3)!r}:
    curve.write(r)
os._exit(0)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / loggers.CURVE_FILE  # written whole (os.replace) or not at all
    _wait_for(path.exists, "the orphaned drawing process's curve")
    import matplotlib.image

    assert matplotlib.image.imread(path).ndim == 3


def test_the_drawing_process_skips_a_line_cut_short_and_draws_the_rest(tmp_path):
    # A training process that died mid-write leaves half a line at the end of the input.
    import matplotlib.image

    from impala_jax.cli import curve

    lines = ['{"point": [100, 1, 0, 2, NaN]}\n', '{"point": [200, 2, 1, 3, NaN]}\n', '{"poi']
    path = tmp_path / "curve.png"
    curve.serve(lines, path, {}, "cut")
    assert matplotlib.image.imread(path).ndim == 3


@pytest.mark.parametrize("failure", ["exits", "cannot start", "hangs"])
def test_a_failed_drawing_process_leaves_the_curve_to_the_training_process(
    tmp_path, monkeypatch, caplog, failure
):
    import matplotlib.image

    if failure == "cannot start":
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    elif failure == "exits":  # a drawing process that fails at once, with an error message
        monkeypatch.setattr(loggers.curve, "__file__", str(tmp_path / "missing.py"))
    else:  # one that never reads its input: close() waits its bound, then draws here
        monkeypatch.setattr(loggers, "PLOTTER_CLOSE_WAIT_S", 1.0)
        script = tmp_path / "hang.py"
        script.write_text("import time\ntime.sleep(600)\n")
        monkeypatch.setattr(loggers.curve, "__file__", str(script))
    curve = loggers.CurvePlotter(tmp_path, interval_s=600)
    for r in _points(2):
        curve.write(r)
    started = time.monotonic()
    curve.close()
    assert time.monotonic() - started < 30
    assert curve._proc is None
    assert matplotlib.image.imread(curve.path).ndim == 3
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "impala_jax.cli.loggers"]
    assert "drawn in the training process instead" in warning
    why = {
        "cannot start": ["could not start"],
        # Gone before or after the points were written to it.
        "exits": ["failed (exit code 2)", "stopped reading its input"],
        "hangs": ["did not finish the curve within 1 s"],
    }[failure]
    assert any(w in warning for w in why), warning
    if failure == "exits":
        assert "missing.py" in warning  # the process's own error output


def test_after_its_drawing_process_fails_the_curve_is_drawn_in_full_here(tmp_path, monkeypatch):
    # A plotter process that wrote a (stand-in) curve at a draw request, then failed: the
    # file it left must not stand as the final curve.
    import matplotlib.image

    script = tmp_path / "draws_once.py"
    script.write_text(
        "import json, sys\n"
        "spec = json.loads(sys.argv[1])\n"
        "for line in sys.stdin:\n"
        "    if json.loads(line).get('draw'):\n"
        "        open(spec['path'], 'w').write('not a png')\n"
        "        sys.exit(3)\n"
    )
    monkeypatch.setattr(loggers.curve, "__file__", str(script))
    curve = loggers.CurvePlotter(tmp_path, interval_s=600)
    for r in _points(2):
        curve.write(r)
    curve.draw()
    _wait_for(lambda: curve.path.exists(), "the stand-in curve")
    curve.close()  # nothing new since the draw request, but the process failed
    assert curve._proc is None
    assert matplotlib.image.imread(curve.path).ndim == 3


def test_closing_on_a_stuck_drawing_process_with_a_full_pipe_keeps_its_bound(
    tmp_path, monkeypatch, caplog
):
    # More unread input than the pipe holds (but under the backlog bound) at close(): the
    # rest is written within PLOTTER_CLOSE_WAIT_S too, never by a blocking write.
    import matplotlib.image

    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(loggers.curve, "__file__", str(script))
    monkeypatch.setattr(loggers, "PLOTTER_CLOSE_WAIT_S", 1.0)
    curve = loggers.CurvePlotter(tmp_path, interval_s=600)
    for r in _points(3000):  # ~150 KB of points
        curve.write(r)
    assert curve._proc is not None and len(curve._pending) > 0
    started = time.monotonic()
    curve.close()
    assert time.monotonic() - started < 30
    assert matplotlib.image.imread(curve.path).ndim == 3
    assert any("within 1 s" in r.getMessage() for r in caplog.records)


def test_a_stuck_drawing_process_never_blocks_the_training_loop(tmp_path, monkeypatch, caplog):
    # Its input is written without blocking; past the backlog bound it is stopped and the
    # curve drawn here.
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(loggers.curve, "__file__", str(script))
    monkeypatch.setattr(loggers, "PLOTTER_BACKLOG_BYTES", 100_000)  # above the pipe's 64 KiB
    curve = loggers.CurvePlotter(tmp_path, interval_s=600)
    started = time.monotonic()
    for r in _points(5000):  # ~250 KB of points
        curve.write(r)
    assert time.monotonic() - started < 30
    assert curve._proc is None
    assert any("left" in r.getMessage() and "unread" in r.getMessage() for r in caplog.records)
    curve.close()
    assert curve.path.exists()


def test_wandb_missing_message(monkeypatch):
    assert loggers.wandb_missing_message() is None  # the test extra installs wandb
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an absent package looks like
    assert "pip install" in loggers.wandb_missing_message()


def wandb_records(path: Path):
    """The records of a W&B run file (``run-ID.wandb``), read with wandb's own protobufs.

    The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then 32 KiB
    blocks of chunks, each a 7-byte header (crc32c, little-endian uint16 length, type: 1 full,
    2 first, 3 middle, 4 last) and its bytes; a block's tail shorter than a header is padding.
    """
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_json_safe():
    assert loggers.json_safe({"env": IMPALAConfig, "t": (1, 2)}) == {
        "env": "impala_jax.rllib.config:IMPALAConfig",
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
@pytest.mark.slow
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


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_cli_runs_an_rllib_example_with_its_arguments_and_real_wandb_offline(tmp_path):
    """RLlib's tuned-example form through the CLI: its own parser gets the arguments after
    `--`, RLlib's default stop applies (episode_return_mean, which Pendulum does not report in
    four iterations, waits; env_runners/num_env_steps_sampled_lifetime stops the run), and
    --wandb logs through the real wandb package, offline, into the run directory."""
    wandb_env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path),
        **{f"WANDB_{d}_DIR": str(tmp_path / d.lower()) for d in ("CONFIG", "CACHE", "DATA")},
    }
    logdir = tmp_path / "runs"
    proc = subprocess.run(
        cli(
            RLLIB_EXAMPLE,
            "environment.env=Pendulum-v1",  # 200-step episodes: none ends in this run
            "--wandb",
            "--wandb-project",
            "proj",
            "--logdir",
            str(logdir),
            "--",
            "--stop-timesteps=200",
            "--hidden=6",
        ),
        capture_output=True,
        text=True,
        env=dict(env(), **wandb_env),
        cwd=ROOT,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stopped: env_runners/num_env_steps_sampled_lifetime=256 >= 200" in proc.stdout
    (run_dir,) = logdir.iterdir()
    lines = results(run_dir)
    assert len(lines) == 4
    assert all(
        r["env_runners"]["episode_return_mean"] != r["env_runners"]["episode_return_mean"]
        for r in lines
    )  # NaN throughout: no episode finished
    record = json.loads((run_dir / "run.json").read_text())
    assert record["script_args"] == ["--stop-timesteps=200", "--hidden=6"]
    assert record["stop"] == {
        "env_runners/episode_return_mean": 450.0,
        "env_runners/num_env_steps_sampled_lifetime": 200,
        "training_iteration": 200,
    }
    params = json.loads((run_dir / "params.json").read_text())
    assert params["env"] == "Pendulum-v1" and params["model_config"]["fcnet_hiddens"] == [6]

    # The W&B offline run: its id and project, the config, and one history row per result.
    (run_file,) = run_dir.glob(f"wandb/offline-run-*/run-{record['wandb_id']}.wandb")
    history, run_record = [], None
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            # wandb-core stores a key in `nested_key` (one element: the slash key) or `key`.
            history.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in rec.history.item
                }
            )
        elif kind == "run":
            run_record = rec.run
    assert run_record.run_id == record["wandb_id"] and run_record.project == "proj"
    config = {
        i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in run_record.config.update
    }
    assert config["lr"] == params["lr"] and config["env"] == "Pendulum-v1"
    assert config["model_config"]["fcnet_hiddens"] == [6]
    assert len(history) == len(lines)
    for row, result in zip(history, lines, strict=True):
        for key in (
            "num_env_steps_sampled_lifetime",
            "env_runners/num_env_steps_sampled_lifetime",
            "training_iteration",
            "learners/default_policy/total_loss",
        ):
            assert row[key] == pytest.approx(lookup(result, key)), key
        assert not any(k.startswith("config/") for k in row)  # the config is not a scalar


def _scalars_as_tensorboard_reads_them(run_dir: Path) -> dict[str, list[int]]:
    """Every event file in write order, with TensorBoard's purge: a SessionLog START at step s
    (tensorboardX's purge_step on resume) drops what earlier files logged at steps >= s."""
    from tensorboardX.proto import event_pb2

    steps: dict[str, list[int]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            if pos + 12 + length + 4 > len(data):
                break  # a record cut short by the kill: TensorBoard skips it too
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == 1:  # START
                steps = {tag: [s for s in got if s < event.step] for tag, got in steps.items()}
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_cli_sigkill_mid_run_then_resume_leaves_one_clean_history(tmp_path):
    freq = 2
    argv = [*TINY, "--stop", "num_env_steps_sampled_lifetime=1e9", "--logdir", str(tmp_path)]
    proc = subprocess.Popen(
        cli(CARTPOLE, *argv, "--checkpoint-freq", str(freq)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(5)]
        assert all(line.startswith("iter ") for line in lines), lines
        proc.kill()  # SIGKILL: no handler runs, whatever was being written stays as it was
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    (run_dir,) = tmp_path.iterdir()
    killed_at = results(run_dir)[-1]["training_iteration"]
    (saved_at, _), *_ = checkpoints(run_dir)[-1:]
    assert killed_at - saved_at <= freq  # lost no more than --checkpoint-freq iterations
    # A kill can cut the last line of either file: make sure one is cut.
    with open(run_dir / "result.json", "a") as f:
        f.write('{"training_iteration": 99, "env_runn')
    with open(run_dir / "progress.csv", "a") as f:
        f.write("1.5,")

    until = killed_at + 3
    proc = subprocess.run(
        cli("--resume", str(run_dir), "--stop", f"training_iteration={until}", "--quiet"),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    history = results(run_dir)  # every line parses
    assert [r["training_iteration"] for r in history] == list(range(1, until + 1))
    steps = [r["num_env_steps_sampled_lifetime"] for r in history]
    assert steps == sorted(set(steps))
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["training_iteration"]) for r in rows] == list(range(1, until + 1))
    assert all(None not in r.values() for r in rows)
    board = _scalars_as_tensorboard_reads_them(run_dir)
    curve = board["env_runners/episode_return_mean"]
    assert curve == sorted(set(curve)), curve  # one point per step, none from the killed life
    assert board["training_iteration"] == steps


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_cli_exits_without_teardown_unless_callbacks_run(tmp_path):
    # exit_without_teardown: the exit handlers run (an experiment file's atexit too), the
    # run's files are complete, and the interpreter's teardown (0.7-0.9 s) is skipped; with
    # callbacks, which may hold files open, the whole teardown runs as usual.
    marks = tmp_path / "marks"
    marks.mkdir()
    text = f"""
import atexit
import runpy

config = runpy.run_path({CARTPOLE!r})["config"]
MARKS = {str(marks)!r}


class Teardown:
    def __del__(self, open=open):  # module globals are cleared by the interpreter's teardown
        open(MARKS + "/teardown", "w").close()


TEARDOWN = Teardown()
atexit.register(lambda: open(MARKS + "/atexit", "w").close())
"""
    experiment = tmp_path / "exp.py"
    experiment.write_text(text)
    for callbacks, teardown in (
        ([], False),
        (["callbacks.callbacks_class=impala_jax.rllib.callbacks.RLlibCallback"], True),
    ):
        for f in marks.iterdir():
            f.unlink()
        logdir = tmp_path / f"logs{len(callbacks)}"
        proc = subprocess.run(
            cli(
                str(experiment),
                *TINY,
                *callbacks,
                "--stop",
                "training_iteration=3",
                "--logdir",
                str(logdir),
                "--quiet",
            ),
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=200,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "stopped: training_iteration=3" in proc.stdout
        (run_dir,) = logdir.iterdir()
        assert [r["training_iteration"] for r in results(run_dir)] == [1, 2, 3]
        assert checkpoints(run_dir)[-1][0] == 3
        assert (run_dir / "learning_curve.png").stat().st_size > 0
        assert sorted(f.name for f in marks.iterdir()) == sorted(
            ["atexit", *(["teardown"] if teardown else [])]
        ), (callbacks, proc.stderr)


def test_the_display_says_when_no_runner_samples(capsys):
    shown = display.Display("plain", None, "run", {})
    shown.runners_down("No EnvRunner is sampling; the learner waits for a restart.\n  ...")
    assert shown.status.startswith("waiting: no env runner is sampling")
    assert "No EnvRunner is sampling" in capsys.readouterr().err
    quiet = display.Display("silent", None, "run", {})
    quiet.runners_down("No EnvRunner is sampling")
    assert capsys.readouterr().err == ""


@pytest.mark.timeout(120)
def test_the_cli_shows_why_no_runner_samples(tmp_path, capsys):
    # Both first-generation runners fail (env seeds 0-3); their replacements, 3 s later, work.
    experiment = tmp_path / "down.py"
    experiment.write_text(
        "from tests.fake_envs import SeededFault\n"
        "from tests.test_algorithm import small_config\n"
        "config = (small_config(SeededFault, num_env_runners=2, num_envs_per_env_runner=2)\n"
        "    .environment(env_config={'from_seed': 0, 'until_seed': 4})\n"
        "    .training(train_batch_size_per_learner=16)\n"
        "    .fault_tolerance(delay_between_env_runner_restarts_s=3.0))\n"
    )
    argv = [str(experiment), "--stop", "training_iteration=1", "--logdir", str(tmp_path / "r")]
    assert run.main(argv) == 0
    err = capsys.readouterr().err
    assert "No EnvRunner is sampling; the learner waits for a restart" in err, err
    assert "EnvRunner 0 failed at" in err and "injected runner failure" in err


def test_the_cli_trains_an_on_device_experiment(tmp_path):
    """experiments/cartpole_gymnax.py through main(), one iteration: the CLI's wiring holds for
    an engine without host runners (a run on device has no env_runner_group)."""
    experiment = str(ROOT / "experiments" / "cartpole_gymnax.py")
    argv = [experiment, *TINY, "training.replay_buffer_num_slots=16", "--quiet"]
    argv += ["--stop", "training_iteration=1", "--logdir", str(tmp_path), "--compile-cache", "none"]
    assert run.main(argv) == 0
    (run_dir,) = tmp_path.iterdir()
    results = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == [1]
