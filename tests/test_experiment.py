"""The experiment file, its overrides, its stop criteria and the result schema they are checked
against, and RLlib's example scripts with their own arguments; in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from impala_jax import IMPALAConfig
from impala_jax.cli import errors, experiment, overrides, result_schema, stop_criteria
from impala_jax.cli.errors import RunError

ROOT = Path(__file__).resolve().parents[1]


def config():
    return IMPALAConfig().environment("CartPole-v1")


def test_parse_value():
    assert overrides.parse_value("3e-4") == 3e-4
    assert overrides.parse_value("[64, 64]") == [64, 64]
    assert overrides.parse_value("None") is None
    assert overrides.parse_value("CartPole-v1") == "CartPole-v1"
    assert overrides.parse_value("pkg.mod:Env") == "pkg.mod:Env"
    with pytest.raises(RunError, match="not a Python literal"):
        overrides.parse_value("[1, 2")


def test_overrides_go_through_the_builders():
    c = config().rl_module(model_config={"encoder": "mlp", "fcnet_hiddens": [4]})
    overrides.apply_overrides(
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
        overrides.apply_overrides(config(), [override])
    assert "\n" not in str(err.value)


def test_stop_parsing_and_criteria():
    stop = stop_criteria.parse_stop(["env_runners/episode_return_mean=450", "time_total_s=60"])
    assert stop == {"env_runners/episode_return_mean": 450, "time_total_s": 60}
    with pytest.raises(RunError, match="not a number"):
        stop_criteria.parse_stop(["training_iteration=soon"])
    with pytest.raises(RunError, match="KEY=VALUE"):
        stop_criteria.parse_stop(["training_iteration"])
    result = {"env_runners": {"episode_return_mean": float("nan")}, "time_total_s": 10.0}
    assert stop_criteria.stop_reached(result, stop) is None  # NaN (no episode yet) never stops
    result["env_runners"]["episode_return_mean"] = 451.0
    assert stop_criteria.stop_reached(result, stop) == "env_runners/episode_return_mean=451 >= 450"
    assert stop_criteria.stop_reached({"time_total_s": 1.0}, stop) is None  # absent: not yet


def test_one_line():
    err = ValueError("Invalid IMPALAConfig:\n  gamma=3: bad.\n  lr=-1: bad.")
    assert errors.one_line(err) == "Invalid IMPALAConfig: gamma=3: bad.; lr=-1: bad."


def test_experiment_file_errors(tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        experiment.load_experiment(tmp_path / "nope.py")
    broken = tmp_path / "broken.py"
    broken.write_text("config = (\n")
    with pytest.raises(RunError, match="SyntaxError"):
        experiment.load_experiment(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(RunError, match="module-level `config`"):
        experiment.load_experiment(empty)
    bad_stop = tmp_path / "bad_stop.py"
    bad_stop.write_text(
        "from impala_jax import IMPALAConfig\nconfig = IMPALAConfig()\nstop = {'a': 'x'}\n"
    )
    with pytest.raises(RunError, match="not a number"):
        experiment.load_experiment(bad_stop)


# ---------------------------------------------------------------------------- stop keys


def test_stop_keys_not_reported_yet_are_fine_and_impossible_ones_fail_fast():
    c = config().env_runners(num_env_runners=0)
    # Pong on a CPU: no episode ends in the first iterations; RLlib's default step budget.
    stop = {
        "env_runners/episode_return_mean": 18,
        "env_runners/num_env_steps_sampled_lifetime": 1e6,
        "num_env_steps_sampled_lifetime": 1e6,
        "training_iteration": 10,
        "learners/default_policy/default_optimizer_learning_rate": 1,
    }
    assert stop_criteria.check_stop_keys(stop, c) == []
    with pytest.raises(RunError, match=r"env_runners/episode_return \(did you mean "):
        stop_criteria.check_stop_keys({"env_runners/episode_return": 1}, c)
    with pytest.raises(RunError, match="need evaluation"):
        stop_criteria.check_stop_keys({"evaluation/env_runners/episode_return_mean": 1}, c)
    c.evaluation(evaluation_interval=2)
    assert stop_criteria.check_stop_keys({"evaluation/env_runners/episode_return_mean": 1}, c) == []
    # Stages that only threaded runners have.
    with pytest.raises(RunError, match="timers/learner_wait_s"):
        stop_criteria.check_stop_keys({"timers/learner_wait_s": 1}, c)
    c.env_runners(num_env_runners=2)
    assert stop_criteria.check_stop_keys({"timers/learner_wait_s": 1}, c) == []
    with pytest.raises(RunError, match="not a result that training moves"):
        stop_criteria.check_stop_keys({"hostname": 1}, c)
    with pytest.raises(RunError, match="not a result that training moves"):
        stop_criteria.check_stop_keys({"config/lr": 1}, c)


def test_stop_keys_callbacks_may_log_are_kept_with_a_note():
    from impala_jax.rllib.callbacks import RLlibCallback

    class EpisodeMetrics(RLlibCallback):
        def on_episode_end(self, **kwargs):
            pass

    def on_train_result(**kwargs):
        pass

    keys = {"env_runners/my_metric": 1, "evaluation/env_runners/my_metric": 1}
    top = {"my_top": 1, "learners/default_policy/my_loss": 1}
    c = config().evaluation(evaluation_interval=1)
    assert result_schema.callback_prefixes(c) == ()
    with pytest.raises(RunError, match="my_metric"):
        stop_criteria.check_stop_keys(keys, c)
    c.callbacks(RLlibCallback)  # the no-op base class logs nothing
    assert result_schema.callback_prefixes(c) == ()
    # Episode hooks log under env_runners/ (evaluation/env_runners/ when evaluating).
    for episode_callbacks in ({"callbacks_class": EpisodeMetrics}, {"on_episode_end": print}):
        c = config().evaluation(evaluation_interval=1).callbacks(**episode_callbacks)
        notes = stop_criteria.check_stop_keys(keys, c)
        assert len(notes) == 2 and "env_runners/my_metric" in notes[0] and "callbacks" in notes[0]
        for key, value in top.items():
            with pytest.raises(RunError, match="never reports"):
                stop_criteria.check_stop_keys({key: value}, c)
    c.evaluation(evaluation_interval=None)  # no evaluation episodes: nothing logged there
    with pytest.raises(RunError, match="evaluation/env_runners/my_metric"):
        stop_criteria.check_stop_keys(keys, c)
    # An algorithm-level hook gets the algorithm's metrics logger and the result: anywhere.
    c.callbacks(on_train_result=on_train_result)
    assert len(stop_criteria.check_stop_keys({**keys, **top}, c)) == 4
    assert stop_criteria.check_stop_keys({"training_iteration": 3}, c) == []  # known: no note


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_result_schema_is_what_train_reports(num_env_runners):
    """Every key of real results is in the schema; every schema key is in the first result,
    except the episode means (NaN or absent before an episode ends) and evaluation keys, which
    are in the first evaluating result."""
    from impala_jax.rllib.results import flatten
    from tests.test_algorithm import small_config

    c = small_config(num_env_runners=num_env_runners).evaluation(
        evaluation_interval=2, evaluation_duration=1
    )
    schema = result_schema.result_schema(c)
    with c.build() as algo:
        first, second = algo.train(), algo.train()
    first_keys, second_keys = set(flatten(first)), set(flatten(second))
    # A key train() reports that the schema lacks: list it in result_schema.py's key lists.
    assert sorted(k for k in first_keys | second_keys if not schema.known(k)) == []
    assert any(k.startswith(result_schema.CONFIG_PREFIX) for k in first_keys)
    not_yet = schema.episode_keys | schema.evaluation_keys | schema.optional_keys
    assert "learners/default_policy/entropy_fraction_of_max" in first_keys  # CartPole: Discrete
    assert sorted(schema.keys - first_keys - not_yet) == []
    assert schema.evaluation_keys <= second_keys  # the first evaluating iteration has them all
    assert not any(k.startswith("evaluation/") for k in first_keys)
    assert schema.evaluation_keys and schema.episode_keys < schema.keys


# ---------------------------------------------------------------------------- RLlib's examples

EXAMPLE = ROOT / "tests" / "rllib_examples" / "cartpole_impala.py"


def test_rllib_example_script_loads_with_its_own_arguments(monkeypatch):
    import sys

    import ray.rllib.utils.test_utils as rllib_test_utils

    ran = []
    monkeypatch.setattr(
        rllib_test_utils, "run_rllib_example_script_experiment", lambda *a, **k: ran.append(a)
    )
    argv = list(sys.argv)
    c, stop = experiment.load_experiment(EXAMPLE)
    assert sys.argv == argv and ran == []  # the __main__ block did not run
    # RLlib's runner's default stop, from the parser's defaults.
    assert stop == {
        "env_runners/episode_return_mean": 450.0,
        "env_runners/num_env_steps_sampled_lifetime": 2000000,
        "training_iteration": 200,
    }
    assert c.num_env_runners == 0 and c.model_config["fcnet_hiddens"] == [8]
    c, stop = experiment.load_experiment(
        EXAMPLE,
        ["--num-env-runners=1", "--num-envs-per-env-runner", "2", "--num-learners=1"]
        + ["--stop-iters=3", "--hidden=5", "--evaluation-interval=2"],
    )
    assert sys.argv == argv and ran == []
    assert (c.num_env_runners, c.num_envs_per_env_runner, c.num_learners) == (1, 2, 1)
    assert c.model_config["fcnet_hiddens"] == [5]  # the script's own argument
    assert c.evaluation_interval == 2 and c.evaluation_duration == 10  # RLlib's default
    assert stop["training_iteration"] == 3
    assert stop_criteria.check_stop_keys(stop, c) == []


def test_rllib_example_script_argument_errors(capsys):
    with pytest.raises(RunError, match=r"use impala_jax.run's --checkpoint-freq"):
        experiment.load_experiment(EXAMPLE, ["--checkpoint-freq=5"])
    with pytest.raises(RunError, match="exited with status 2.*after `--`"):
        experiment.load_experiment(EXAMPLE, ["--no-such-arg"])
    assert "unrecognized arguments: --no-such-arg" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.py")), ids=lambda p: p.name)
def test_every_experiment_file_loads_and_validates(path):
    c, stop = experiment.load_experiment(path)
    c.validate()
    assert stop, f"{path.name} has no stop criteria"


# The command of benchmarks/README.md's Pong run k42 (pong.py with these overrides):
# experiments/pong_cpu.py must be that run's settings, not an approximation of them.
PONG_CPU_OVERRIDES = [
    "environment.env_config.img_height=42",
    "environment.env_config.img_width=42",
    "env_runners.num_env_runners=1",
    "env_runners.num_envs_per_env_runner=32",
    "env_runners.rollout_fragment_length=20",
    "env_runners.num_cpus_per_env_runner=1",
    "training.train_batch_size_per_learner=640",
    "training.minibatch_size=160",
    "training.num_epochs=2",
    "learners.num_learners=0",
    "rl_module.model_config.encoder=impala_cnn",
    "rl_module.model_config.impala_cnn_channels=[8,16,16]",
    "training.opt_type=adam",
    "training.lr=4e-4",
    "training.grad_clip=0.5",
    "training.loss_reduction=mean",
    "training.entropy_coeff=0.005",
]


def test_pong_cpu_is_the_measured_command():
    measured, _ = experiment.load_experiment(ROOT / "experiments" / "pong.py")
    overrides.apply_overrides(measured, PONG_CPU_OVERRIDES)
    pong_cpu, stop = experiment.load_experiment(ROOT / "experiments" / "pong_cpu.py")
    assert pong_cpu.to_dict() == measured.to_dict()
    assert stop["num_env_steps_sampled_lifetime"] == 2_000_000


def test_breakout_cpu_is_pong_cpu_with_only_the_game_changed():
    pong_cpu, _ = experiment.load_experiment(ROOT / "experiments" / "pong_cpu.py")
    breakout_cpu, stop = experiment.load_experiment(ROOT / "experiments" / "breakout_cpu.py")
    a, b = pong_cpu.to_dict(), breakout_cpu.to_dict()
    assert b["env"] == "Breakout-v5"
    assert {k for k in a if a[k] != b[k]} == {"env"}
    # A goal the measured run reached within its budget (its docstring's Goal line).
    assert stop == {
        "env_runners/episode_return_mean": 8,
        "num_env_steps_sampled_lifetime": 2_000_000,
    }
