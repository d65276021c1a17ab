"""The experiment file, its overrides and its stop criteria, in-process."""

from __future__ import annotations

import pytest

from impala_jax import IMPALAConfig, experiment
from impala_jax.experiment import RunError


def config():
    return IMPALAConfig().environment("CartPole-v1")


def test_parse_value():
    assert experiment.parse_value("3e-4") == 3e-4
    assert experiment.parse_value("[64, 64]") == [64, 64]
    assert experiment.parse_value("None") is None
    assert experiment.parse_value("CartPole-v1") == "CartPole-v1"
    assert experiment.parse_value("pkg.mod:Env") == "pkg.mod:Env"
    with pytest.raises(RunError, match="not a Python literal"):
        experiment.parse_value("[1, 2")


def test_overrides_go_through_the_builders():
    c = config().rl_module(model_config={"encoder": "mlp", "fcnet_hiddens": [4]})
    experiment.apply_overrides(
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
        experiment.apply_overrides(config(), [override])
    assert "\n" not in str(err.value)


def test_stop_parsing_and_criteria():
    stop = experiment.parse_stop(["env_runners/episode_return_mean=450", "time_total_s=60"])
    assert stop == {"env_runners/episode_return_mean": 450, "time_total_s": 60}
    with pytest.raises(RunError, match="not a number"):
        experiment.parse_stop(["training_iteration=soon"])
    with pytest.raises(RunError, match="KEY=VALUE"):
        experiment.parse_stop(["training_iteration"])
    result = {"env_runners": {"episode_return_mean": float("nan")}, "time_total_s": 10.0}
    assert experiment.stop_reached(result, stop) is None  # NaN (no episode yet) never stops
    result["env_runners"]["episode_return_mean"] = 451.0
    assert experiment.stop_reached(result, stop) == "env_runners/episode_return_mean=451 >= 450"
    assert experiment.missing_stop_keys(result, {"env_runners/episode_return": 1}) == [
        "env_runners/episode_return"
    ]
    assert (
        experiment.missing_stop_keys(result, {"evaluation/env_runners/episode_return_mean": 1})
        == []
    )


def test_one_line():
    err = ValueError("Invalid IMPALAConfig:\n  gamma=3: bad.\n  lr=-1: bad.")
    assert experiment.one_line(err) == "Invalid IMPALAConfig: gamma=3: bad.; lr=-1: bad."


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
