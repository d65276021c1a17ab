"""A newcomer's first hour (issue 44): the CLI without the venv, the experiments' stated goals,
the notebooks, the curve and the live panel, custom-env checkpoints, the CLI's messages."""

from __future__ import annotations

import ast
import io
import json
import math
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from impala_jax import run
from impala_jax.cli.args import parse_args
from impala_jax.cli.errors import RunError
from impala_jax.cli.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.py"))


def cli_without(package: str, *argv: str) -> subprocess.CompletedProcess:
    """``python -m impala_jax.run ARGV`` in a Python where ``package`` does not import."""
    code = (
        f"import runpy, sys; sys.modules[{package!r}] = None; "
        "sys.argv = ['impala_jax.run', *sys.argv[1:]]; "
        "runpy.run_module('impala_jax.run', run_name='__main__', alter_sys=True)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("package", ["jax", "numpy"])
def test_cli_without_the_dependencies_says_so_in_one_line(package):
    proc = cli_without(package, "experiments/cartpole.py")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"no module named '{package}'" in lines[0]
    assert ".venv/bin/python -m impala_jax.run" in lines[0] and "make install" in lines[0]


def test_readme_runs_the_cli_with_the_venv_python():
    readme = (ROOT / "README.md").read_text()
    bare = re.findall(r"(?<![\w/])python -m impala_jax\.run", readme)
    # Only the module table may name the entry point without a Python.
    assert len(bare) <= 1, bare
    assert ".venv/bin/python -m impala_jax.run" in readme


# --- item 5: each experiment's stated goal is its stop -------------------------------------

GOAL = re.compile(
    r"Goal: (?:each trial |the best member )?a return of (?P<goal>-?[\d.]+) "
    r"within (?P<budget>[\d.]+) M env steps"
    r"(?:.*?measured: (?P<measured>-?[\d.]+) at (?P<at>[\d.]+) M env steps)?",
    re.S,
)


def stated_goal(path: Path) -> re.Match:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    goal_text = doc[doc.index("Goal:") :] if "Goal:" in (doc or "") else ""
    match = GOAL.match(" ".join(goal_text.split()))
    assert match, f"{path.name}: its docstring states no 'Goal: a return of R within N M env steps'"
    return match


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_each_experiment_states_its_stop_as_its_goal(path):
    match = stated_goal(path)
    _, stop = load_experiment(path)
    assert stop["env_runners/episode_return_mean"] == float(match["goal"])
    assert stop["num_env_steps_sampled_lifetime"] == float(match["budget"]) * 1e6
    if match["measured"] is not None:  # a measured run reached the goal within the budget
        assert float(match["measured"]) >= float(match["goal"])
        assert float(match["at"]) <= float(match["budget"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cartpole_reaches_its_goal_within_its_budget(tmp_path, capsys):
    """`make run`, and CartPole's learning test (tests/test_learning.py holds the others): the
    run stops at a return of 450 within 3 M env steps, as its result history shows too."""
    assert run.main(["experiments/cartpole.py", "--logdir", str(tmp_path), "--quiet"]) == 0
    assert "stopped: env_runners/episode_return_mean=" in capsys.readouterr().out
    (history,) = tmp_path.rglob("result.json")
    results = [json.loads(line) for line in history.read_text().splitlines()]
    returns = [r["env_runners"].get("episode_return_mean", math.nan) for r in results]
    assert max(r for r in returns if r == r) >= 450, returns
    assert results[-1]["num_env_steps_sampled_lifetime"] <= 3_000_000


# --- item 9: notebooks ------------------------------------------------------------------------


def test_the_notebooks_extra_and_make_notebook():
    setup = (ROOT / "setup.cfg").read_text()
    extra = re.search(r"^notebooks =\n((?:    .*\n)+)", setup, re.M)
    assert extra and "jupyterlab" in extra[1] and "nbconvert" in extra[1]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^notebook: ", makefile, re.M) and "jupyter lab" in makefile
    assert "make notebook" in (ROOT / "README.md").read_text()


def test_sweep_notebook_takes_a_relative_sweep_from_the_repository_root(tmp_path, monkeypatch):
    nb = json.loads((ROOT / "notebooks" / "sweep_analysis.ipynb").read_text())
    cell = "".join(nb["cells"][1]["source"])
    source = "\n".join(line for line in cell.splitlines() if not line.startswith("%"))
    (tmp_path / "setup.cfg").write_text("")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "runs" / "cartpole_sweep_1" / "tune").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks")  # where Jupyter runs the notebook's kernel
    monkeypatch.delenv("PWD", raising=False)
    monkeypatch.setenv("IMPALA_JAX_SWEEP", "runs/cartpole_sweep_1")
    ray = types.ModuleType("ray")
    ray.tune = types.ModuleType("ray.tune")
    monkeypatch.setitem(sys.modules, "ray", ray)
    namespace: dict = {}
    exec(compile(source, "sweep_analysis.ipynb", "exec"), namespace)
    assert namespace["experiment"].resolve() == tmp_path / "runs" / "cartpole_sweep_1" / "tune"


# --- item 10: the curve and the live panel ---------------------------------------------------


def _curve_axes(last_step: float):
    from matplotlib.figure import Figure

    from impala_jax.cli.curve import plot_curve

    steps = [last_step * (i + 1) / 20 for i in range(20)]
    # Up, then down to near the bottom at the end: the corner a legend inside the axes takes.
    means = [60 + 390 * math.sin(math.pi * i / 19) for i in range(20)]
    points = [(s, m, 50.0, 500.0, float("nan")) for s, m in zip(steps, means, strict=True)]
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    stop = {"env_runners/episode_return_mean": 450, "num_env_steps_sampled_lifetime": 3e6}
    plot_curve(ax, points, stop)
    fig.canvas.draw()
    return fig, ax, points


def test_curve_x_axis_follows_the_data_not_the_budget():
    _, ax, _ = _curve_axes(400_000)
    assert 400_000 <= ax.get_xlim()[1] <= 500_000
    _, ax, _ = _curve_axes(2_900_000)  # near the budget: the budget line shows
    assert ax.get_xlim()[1] >= 3e6


def test_curve_legend_covers_no_point():
    fig, ax, points = _curve_axes(400_000)
    legend = ax.get_legend().get_window_extent()
    for step, mean, *_ in points:
        x, y = ax.transData.transform((step, mean))
        assert not legend.contains(x, y)


def test_live_panel_and_lines_fit_80_columns():
    from rich.console import Console

    from impala_jax.cli.display import Display

    stop = {"env_runners/episode_return_mean": -300, "num_env_steps_sampled_lifetime": 10_000_000}
    run_dir = Path("runs") / ("a_long_experiment_name_" * 3 + "2026-01-01_12-00-00")
    display = Display("plain", run_dir, "a_long_experiment_name" * 2, stop)
    result = {
        "training_iteration": 12_345,
        "num_env_steps_sampled_lifetime": 9_876_543,
        "time_total_s": 3_600.0,
        "env_runners": {
            "episode_return_mean": -1234.56,
            "episode_return_min": -1500.0,
            "episode_return_max": -1000.0,
        },
        "perf": {"env_steps_sampled_per_s": 123_456.0, "env_steps_trained_per_s": 123_456.0},
    }
    display.update(result)
    display._first = (display._first[0] - 100.0, 0)  # a rate, hence an ETA
    display.update(result)
    assert len(display.line(result)) <= 80, display.line(result)
    for status in (display.status, "waiting: no env runner is sampling (restarts pending)"):
        display.status = status
        console = Console(file=io.StringIO(), width=200, record=True)
        console.print(display)
        widths = [len(line.rstrip()) for line in console.export_text().splitlines()]
        assert max(widths) <= 80, console.export_text()


# --- item 11: a class in an experiment file is stored by an importable path -----------------


def test_custom_env_checkpoint_path_imports_in_a_fresh_python():
    code = (
        "from impala_jax.cli.experiment import load_experiment\n"
        "from impala_jax.runtime.process.checkpoint import jsonable\n"
        "config, _ = load_experiment('experiments/custom_env.py')\n"
        "print(jsonable(config.to_dict())['env'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    env = out.stdout.strip().splitlines()[-1]
    assert env == "experiments.custom_env:CorridorEnv"
    # A user's script in the repository root, as IMPALA.from_checkpoint resolves the env.
    code = (
        "import sys\n"
        "from impala_jax.runtime.envs.env_registry import choose_env\n"
        f"print(choose_env({env!r}).target.__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "CorridorEnv"


# --- item 12: the CLI's messages --------------------------------------------------------------


@pytest.mark.timeout(300)
def test_stop_line_and_resume_line_count_the_same_env_steps(tmp_path, capsys):
    common = ["--logdir", str(tmp_path), "--quiet", "--name", "steps"]
    assert run.main(["experiments/cartpole.py", "--stop", "training_iteration=3", *common]) == 0
    out = capsys.readouterr().out
    stopped = re.search(r"iteration 3, ([\d,]+) env steps", out)
    run_dir = next(tmp_path.glob("steps_*"))
    assert run.main(["--resume", str(run_dir), "--stop", "training_iteration=4", "--quiet"]) == 0
    captured = capsys.readouterr()
    resumed = re.search(r"resumed from .* \(iteration 3, ([\d,]+) env steps\)", captured.err)
    assert stopped and resumed, (out, captured)
    assert stopped[1] == resumed[1]


class _SamplesOnAlgo:
    """Reports a result, then samples one more batch before its checkpoint is written (the
    runner threads sample on), as an asynchronous run does."""

    def __init__(self):
        self.num_env_steps_sampled_lifetime = 0

    def train(self):
        self.num_env_steps_sampled_lifetime += 2560
        return {
            "training_iteration": self.num_env_steps_sampled_lifetime // 2560,
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime,
        }

    def save(self, path):
        from impala_jax.runtime.process.checkpoint import STATE_FILE

        self.num_env_steps_sampled_lifetime += 2560
        path.mkdir(parents=True)
        counters = {"num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime}
        (path / STATE_FILE).write_text(json.dumps({"counters": counters}))
        return path


def test_stop_line_counts_the_env_steps_its_checkpoint_holds(tmp_path, capsys):
    from impala_jax.cli.display import Display

    stop = {"training_iteration": 2}
    args = types.SimpleNamespace(checkpoint_freq=0, keep_checkpoints=3, on_checkpoint_error="warn")
    display = Display("quiet", tmp_path, "steps", stop)
    interrupt = types.SimpleNamespace(signum=None)
    assert run._loop(_SamplesOnAlgo(), args, stop, tmp_path, display, interrupt, [], 0) == 0
    assert "(iteration 2, 7,680 env steps" in capsys.readouterr().out  # what --resume reports


def test_a_mistyped_experiment_path_or_flag_gets_a_suggestion(capsys):
    with pytest.raises(RunError, match=r"did you mean experiments/cartpole\.py\?"):
        load_experiment("experiments/cartpol.py")
    with pytest.raises(SystemExit):
        parse_args(["experiments/cartpole.py", "--chekpoint-freq", "5"])
    assert "did you mean --checkpoint-freq?" in capsys.readouterr().err


def test_help_is_short_plain_text_and_its_examples_parse(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 80 and max(map(len, lines)) <= 80
    assert "`" not in text
    examples = text.split("examples:", 1)[1].split("\n\n", 1)[0]
    for command in examples.replace("\\\n", " ").strip().splitlines():
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "impala_jax.run"], command
        parse_args(argv[3:])


def test_no_stale_text():
    quickstart = (ROOT / "notebooks" / "quickstart.ipynb").read_text()
    assert "orbax" not in quickstart
    readme = (ROOT / "README.md").read_text()
    assert 'pip install "impala_jax[tune]"' not in readme
    for section in re.findall(r'see "([^"]+)" below', readme):  # points down, to a heading
        at = readme.index(f'see "{section}" below')
        assert re.search(rf"^#+ {re.escape(section)}$", readme[at:], re.M), section
    # The sweep's docstring cites cartpole.py's learning rates as they are.
    cartpole = ast.parse((ROOT / "experiments" / "cartpole.py").read_text())
    lr = next(
        ast.literal_eval(k.value)
        for node in ast.walk(cartpole)
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg == "lr"
    )
    sweep_doc = ast.get_docstring(ast.parse((ROOT / "experiments/cartpole_sweep.py").read_text()))
    cited = {float(x) for x in re.findall(r"cartpole\.py[^.]*?(\d+\.\d+)", sweep_doc)}
    cited |= {float(x) for x in re.findall(r"from (\d+\.\d+) to (\d+\.\d+)", sweep_doc)[0]}
    assert cited <= {rate for _, rate in lr}, (cited, lr)
