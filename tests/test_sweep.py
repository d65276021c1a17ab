"""CLI sweeps (impala_jax/cli/sweep.py) and the notebook that analyses one.

One real sweep runs in a subprocess (2 grid trials of 2 iterations on a local Ray with the
machine's CPUs, ~40 s on 2 cores) and is shared: the CLI's output and run directory are checked
on it, its best checkpoint is restored, and notebooks/sweep_analysis.ipynb is executed on it.
A second, cheaper sweep whose trials cannot build checks the exit status of failed trials; a
plain run checks that ray is never imported without a search space. The rest runs in-process
and starts no Ray.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from impala_jax import IMPALA, IMPALAConfig, run
from impala_jax.cli import sweep

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "sweep_analysis.ipynb"
CARTPOLE = str(ROOT / "experiments" / "cartpole.py")
LRS = (0.001, 0.0005)

TINY_SWEEP = f"""
from ray import tune
from impala_jax import IMPALAConfig

config = (
    IMPALAConfig()
    .environment("CartPole-v1")
    .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
    .training(lr=tune.grid_search({list(LRS)}), train_batch_size_per_learner=64,
              minibatch_size=None)
    .rl_module(model_config={{"fcnet_hiddens": [8]}})
    .reporting(min_time_s_per_iteration=0)
    .debugging(seed=0)
)
stop = {{"training_iteration": 2}}
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "impala_jax.run", *args, "--compile-cache", "none"]


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def printed(pattern: str, out: str) -> str:
    match = re.search(pattern, out, re.MULTILINE)
    assert match, f"{pattern!r} not in output:\n{out}"
    return match.group(1)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """The CLI's sweep of TINY_SWEEP: (completed process, run directory or None)."""
    tmp = tmp_path_factory.mktemp("sweep")
    experiment = write(tmp / "tiny_sweep.py", TINY_SWEEP)
    proc = subprocess.run(
        cli(experiment, "--logdir", str(tmp / "runs")),
        capture_output=True,
        text=True,
        env=env(),
        cwd=tmp,
        timeout=240,
    )
    found = re.search(r"^run directory: (.+)$", proc.stdout, re.MULTILINE)
    return proc, Path(found.group(1)) if found else None


# ----------------------------------------------------------------------------- subprocesses


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_cli_sweep_runs_every_trial_and_restores_the_best(tiny_sweep):
    proc, run_dir = tiny_sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # One run directory: the run files and Tune's experiment with one directory per trial.
    assert run_dir.parent.name == "runs" and run_dir.name.startswith("tiny_sweep_")
    params = json.loads((run_dir / "params.json").read_text())
    assert params["lr"] == {"grid_search": list(LRS)}
    record = json.loads((run_dir / "run.json").read_text())
    assert record["sweep"]["swept"] == ["lr"] and record["stop"] == {"training_iteration": 2}
    trial_dirs = [p for p in (run_dir / "tune").iterdir() if p.is_dir()]
    assert len(trial_dirs) == 2, trial_dirs
    # The table: a header and one line per trial, with its lr, 2 iterations and a return.
    assert printed(r"^(trial +status +lr +iter +env_steps +env_runners/\S+)$", proc.stdout)
    rows = re.findall(r"^(\S+) +TERMINATED +([\d.e-]+) +2 +128 +([\d.]+|nan)$", proc.stdout, re.M)
    assert sorted(float(lr) for _, lr, _ in rows) == sorted(LRS), proc.stdout
    # The best trial's checkpoint is an impala_jax checkpoint of that trial.
    best = printed(r"^Best trial (\S+) \(", proc.stdout)
    path = Path(printed(r"^Best trial .*: checkpoint (.+)$", proc.stdout))
    assert path.is_dir() and path.is_relative_to(run_dir / "tune")
    best_lr = {name: float(lr) for name, lr, _ in rows}[best]
    with IMPALA.from_checkpoint(path) as algo:
        assert algo.iteration == 2
        assert algo.get_config().lr == best_lr


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_cli_sweep_with_failing_trials_exits_1_naming_them(tmp_path):
    experiment = write(
        tmp_path / "bad_sweep.py",
        """
        from impala_jax import IMPALAConfig

        # A grid written as Tune writes it, without importing ray; neither env exists.
        config = (
            IMPALAConfig()
            .environment({"grid_search": ["NoSuchEnv-v0", "NoSuchEnv-v1"]})
            .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        )
        stop = {"training_iteration": 1}
        """,
    )
    proc = subprocess.run(
        cli(experiment, "--logdir", str(tmp_path / "runs"), "--quiet"),
        capture_output=True,
        text=True,
        env=env(),
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errored = re.findall(r"^trial (\S+) errored: .*\(error file: (.+)\)$", proc.stdout, re.M)
    assert len(errored) == 2, proc.stdout
    run_dir = Path(printed(r"^run directory: (.+)$", proc.stdout))
    assert all(Path(error_file).is_file() for _, error_file in errored)
    assert all(Path(error_file).is_relative_to(run_dir / "tune") for _, error_file in errored)
    assert "NoSuchEnv-v0" in Path(errored[0][1]).read_text() + Path(errored[1][1]).read_text()
    assert "no best trial" in proc.stdout


@pytest.mark.timeout(120)
def test_plain_run_never_imports_ray(tmp_path):
    code = (
        "import sys\n"
        "from impala_jax import run\n"
        f"rc = run.main({[CARTPOLE]!r} + sys.argv[1:])\n"
        "print('exit', rc, 'ray imported:', 'ray' in sys.modules)\n"
    )
    tiny = [
        "env_runners.num_env_runners=0",
        "env_runners.num_envs_per_env_runner=4",
        "env_runners.rollout_fragment_length=8",
        "training.train_batch_size_per_learner=64",
        "training.minibatch_size=None",
        "reporting.min_time_s_per_iteration=0",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", code, *tiny, "--stop", "training_iteration=1", "--quiet"]
        + ["--logdir", str(tmp_path), "--compile-cache", "none"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=100,
    )
    assert "exit 0 ray imported: False" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------- notebook


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_sweep_analysis_notebook_plots_the_sweep(tiny_sweep, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    proc, run_dir = tiny_sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr

    monkeypatch.setenv("IMPALA_JAX_SWEEP", str(run_dir))  # the kernel inherits the environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # curves, final vs lr
    text = "".join(o.get("text", "") for o in outputs)
    assert "swept: lr" in text and "best trial" in text


# ------------------------------------------------------------------------------ in-process


@pytest.mark.timeout(60)
def test_swept_paths_and_their_description():
    from ray import tune

    config = (
        IMPALAConfig()
        .environment("CartPole-v1")
        .training(
            lr=[[0, tune.loguniform(1e-4, 1e-2)], [1000, 1e-5]],
            entropy_coeff=tune.grid_search([0.0, 0.01]),
        )
        .rl_module(model_config={"fcnet_hiddens": tune.choice([[64], [32]])})
    )
    paths = sweep.swept_paths(config.to_dict())
    assert sorted(paths) == ["entropy_coeff", "lr/0/1", "model_config/fcnet_hiddens"]
    assert sweep.describe_search_space(tune.loguniform(1e-4, 1e-2)) == {
        "search_space": "Float LogUniform (0.0001, 0.01)"
    }
    assert sweep.describe_search_space(tune.grid_search([1, 2])) == {"grid_search": [1, 2]}
    assert sweep.describe_search_space(tune.choice([[64], [32]])) == {
        "search_space": "Categorical Uniform [[64], [32]]"
    }
    # Ranked by the first stop key when it is a return, else by the mean return.
    assert sweep.sweep_metric({"evaluation/env_runners/episode_return_mean": 1, "x": 2}) == (
        "evaluation/env_runners/episode_return_mean"
    )
    assert sweep.sweep_metric({"training_iteration": 5}) == "env_runners/episode_return_mean"
    assert sweep.sweep_metric({}) == "env_runners/episode_return_mean"


class FakeTrial:
    def __init__(self, name, status, config, last_result):
        self.name, self.status, self.config, self.last_result = name, status, config, last_result

    def __str__(self):
        return self.name


@pytest.mark.timeout(60)
def test_trial_table_lines_up_one_line_per_trial():
    trials = [
        FakeTrial(
            "t_00000",
            "TERMINATED",
            {"lr": 0.001, "model_config": {"h": [64, 64]}},
            {
                "training_iteration": 12,
                "num_env_steps_sampled_lifetime": 30720,
                "env_runners": {"episode_return_mean": 450.25},
            },
        ),
        FakeTrial("t_00001", "ERROR", {"lr": 0.0005, "model_config": {"h": [32]}}, {}),
    ]
    lines = sweep.trial_table(trials, ["lr", "model_config/h"], "env_runners/episode_return_mean")
    metric = "env_runners/episode_return_mean"
    assert lines == [
        f"trial    status      lr      model_config/h  iter  env_steps  {metric}",
        "t_00000  TERMINATED  0.001   [64,64]         12    30720      450.2",
        "t_00001  ERROR       0.0005  [32]            0     0          nan",
    ]


@pytest.mark.timeout(60)
def test_sweep_without_ray_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    experiment = write(
        tmp_path / "grid.py",
        """
        from impala_jax import IMPALAConfig

        config = IMPALAConfig().environment("CartPole-v1").training(
            lr={"grid_search": [1e-3, 5e-4]}
        )
        """,
    )
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    logdir = tmp_path / "runs"
    rc = run.main([experiment, "--logdir", str(logdir), "--compile-cache", "none"])
    assert rc == 2
    assert 'pip install "impala_jax[tune]"' in capsys.readouterr().err
    assert not logdir.exists()  # nothing written


@pytest.mark.timeout(60)
def test_sweep_usage_errors_exit_2_before_anything_is_written(tmp_path, capsys):
    pytest.importorskip("ray.tune")
    logdir = tmp_path / "runs"
    experiment = write(
        tmp_path / "grid.py",
        """
        from impala_jax import IMPALAConfig

        config = IMPALAConfig().environment("CartPole-v1").training(
            lr={"grid_search": [1e-3, 5e-4]}
        )
        num_samples = 0
        """,
    )
    assert run.main([experiment, "--logdir", str(logdir), "--compile-cache", "none"]) == 2
    assert "num_samples=0" in capsys.readouterr().err
    # --resume of a sweep's run directory points to Tune's own restore.
    sweep_dir = tmp_path / "grid_2025-01-01_00-00-00"
    (sweep_dir / "tune").mkdir(parents=True)
    assert run.main(["--resume", str(sweep_dir), "--compile-cache", "none"]) == 2
    err = capsys.readouterr().err
    assert "resuming a sweep is not supported yet" in err and "tune.Tuner.restore" in err
    assert (
        run.main([experiment, "--wandb", "--logdir", str(logdir), "--compile-cache", "none"]) == 2
    )
    assert not logdir.exists()
    # A run without search spaces has no use for a Ray cluster.
    assert run.main([CARTPOLE, "--ray-address", "auto", "--compile-cache", "none"]) == 2
    assert "--ray-address is for sweeps" in capsys.readouterr().err
