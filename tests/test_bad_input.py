"""Misuse across config, environment, checkpoints and CLI: one clear error each.

Every case must raise the given exception type with a message naming what is wrong (each
fragment listed), and nothing written before may be lost.
"""

from __future__ import annotations

import contextlib
import io
import json

import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.runtime.envs.vec_env import ActionAdapter, make_vec_env
from tests import fake_envs
from tests.test_algorithm import small_config


def cfg(**training):
    return small_config().training(**training)


# (id, thunk, exception, fragments the message must contain)
CONFIG_CASES = [
    ("lr_negative", lambda: cfg(lr=-1.0).validate(), ValueError, ["lr", "-1"]),
    ("lr_zero", lambda: cfg(lr=0.0).validate(), ValueError, ["lr", "0"]),
    ("lr_wrong_type", lambda: cfg(lr="fast").validate(), ValueError, ["lr", "fast"]),
    ("gamma_above_one", lambda: cfg(gamma=1.5).validate(), ValueError, ["gamma", "1.5"]),
    ("opt_type_sgd", lambda: cfg(opt_type="sgd").validate(), ValueError, ["opt_type", "sgd"]),
    ("entropy_negative", lambda: cfg(entropy_coeff=-0.1).validate(), ValueError, ["entropy_coeff"]),
    (
        "vf_coeff_negative",
        lambda: cfg(vf_loss_coeff=-1.0).validate(),
        ValueError,
        ["vf_loss_coeff"],
    ),
    ("grad_clip_negative", lambda: cfg(grad_clip=-5.0).validate(), ValueError, ["grad_clip"]),
    (
        "rho_threshold_negative",
        lambda: cfg(vtrace_clip_rho_threshold=-1.0).validate(),
        ValueError,
        ["vtrace_clip_rho_threshold"],
    ),
    ("num_epochs_zero", lambda: cfg(num_epochs=0).validate(), ValueError, ["num_epochs"]),
    (
        "batch_zero",
        lambda: cfg(train_batch_size_per_learner=0).validate(),
        ValueError,
        ["train_batch_size_per_learner"],
    ),
    (
        # 100 steps are rounded up to 13 fragments of 8, which 2-fragment minibatches cannot split.
        "minibatch_not_splitting_rounded_batch",
        lambda: cfg(train_batch_size_per_learner=100, minibatch_size=16).validate(),
        ValueError,
        ["minibatch_size", "16", "13 fragments"],
    ),
    (
        "old_api_stack",
        lambda: small_config().api_stack(enable_rl_module_and_learner=False),
        NotImplementedError,
        ["enable_rl_module_and_learner", "old API stack"],
    ),
    (
        "multi_agent_policies_to_train",
        lambda: small_config().multi_agent(policies={"p0"}, policies_to_train=["p1"]).validate(),
        ValueError,
        ["policies_to_train", "p1", ".multi_agent(policies_to_train=...)"],
    ),
    (
        "rllib_keyword_not_offered",
        lambda: small_config().env_runners(env_to_module_connector=lambda env: None),
        NotImplementedError,
        ["env_to_module_connector", "ConnectorV2"],
    ),
    (
        "framework_typo",
        lambda: small_config().framework("troch"),
        ValueError,
        ["framework", "troch"],
    ),
    (
        "initializer_unknown",
        lambda: (
            small_config()
            .rl_module(model_config={"fcnet_kernel_initializer": "glorot_unifrom"})
            .validate()
        ),
        ValueError,
        ["fcnet_kernel_initializer", "glorot_unifrom"],
    ),
    (
        "minibatch_not_fragments",
        lambda: cfg(minibatch_size=30).validate(),
        ValueError,
        ["minibatch_size", "30"],
    ),
    (
        "runners_negative",
        lambda: small_config().env_runners(num_env_runners=-1).validate(),
        ValueError,
        ["num_env_runners"],
    ),
    (
        "learners_negative",
        lambda: small_config().learners(num_learners=-1).validate(),
        ValueError,
        ["num_learners"],
    ),
    (
        "more_learners_than_devices",
        lambda: small_config().learners(num_learners=len(jax.devices()) + 1).validate(),
        ValueError,
        ["num_learners", "device"],
    ),
    (
        "broadcast_zero",
        lambda: cfg(broadcast_interval=0).validate(),
        ValueError,
        ["broadcast_interval"],
    ),
    (
        "queue_zero",
        lambda: cfg(learner_queue_size=0).validate(),
        ValueError,
        ["learner_queue_size"],
    ),
    ("vtrace_not_bool", lambda: cfg(vtrace="off").validate(), ValueError, ["vtrace"]),
    (
        "schedule_not_from_zero",
        lambda: cfg(lr=[[100, 1e-3], [200, 1e-4]]).validate(),
        ValueError,
        ["lr", "0"],
    ),
    (
        "schedule_in_both_spellings",
        lambda: cfg(lr=[[0, 1e-3], [10, 1e-4]], lr_schedule=[[0, 1e-3], [10, 0.0]]).validate(),
        ValueError,
        ["lr_schedule"],
    ),
    (
        "fragment_length_zero",
        lambda: small_config().env_runners(rollout_fragment_length=0),
        ValueError,
        ["rollout_fragment_length"],
    ),
    ("grad_clip_by_unknown", lambda: cfg(grad_clip_by="l2"), ValueError, ["grad_clip_by", "l2"]),
    (
        "deprecated_aggregation",
        lambda: cfg(num_aggregation_workers=2),
        ValueError,
        ["num_aggregation_workers", "num_aggregator_actors_per_learner"],
    ),
    (
        "model_config_wrong_type",
        lambda: small_config().rl_module(model_config={"fcnet_hiddens": "64"}).validate(),
        ValueError,
        ["fcnet_hiddens"],
    ),
    (
        "model_config_unknown_key",
        lambda: small_config().rl_module(model_config={"fcnet_hiden": [64]}),
        ValueError,
        ["fcnet_hiden"],
    ),
    ("no_env", lambda: IMPALAConfig().build(), ValueError, ["env"]),
    (
        "evaluation_duration_zero",
        lambda: small_config().evaluation(evaluation_duration=0).validate(),
        ValueError,
        ["evaluation_duration"],
    ),
    (
        "replay_without_slots",
        lambda: cfg(replay_proportion=0.5, replay_buffer_num_slots=0).validate(),
        ValueError,
        ["replay_buffer_num_slots"],
    ),
    (
        "separate_vf_optimizer_shared_layers",
        lambda: cfg(_separate_vf_optimizer=True).validate(),
        ValueError,
        ["vf_share_layers"],
    ),
    ("unknown_keyword", lambda: cfg(learning_rate=1e-3), TypeError, ["learning_rate"]),
    (
        "frozen_config",
        lambda: small_config().freeze().training(lr=1e-3),
        AttributeError,
        ["frozen"],
    ),
]

ENV_CASES = [
    (
        "env_nowhere",
        lambda: small_config("CartPole-v9").build(),
        ValueError,
        ["CartPole-v9", "CartPole-v1"],
    ),
    (
        "dict_observation_space",
        lambda: small_config(fake_envs.DictObsEnv).build(),
        ValueError,
        ["observation space"],
    ),
    (
        "multidiscrete_action_space",
        lambda: small_config(fake_envs.MultiDiscreteActionEnv).build(),
        ValueError,
        ["action space"],
    ),
    (
        "wrong_observation_shape",
        lambda: small_config(fake_envs.WrongShapeEnv).build(),
        ValueError,
        ["shape", "(3,)"],
    ),
    (
        "constructor_raises",
        lambda: small_config(fake_envs.RaisingConstructorEnv).build(),
        ValueError,
        ["constructor", "license"],
    ),
    ("env_not_callable", lambda: make_vec_env(42, 1, 0), ValueError, ["42"]),
    (
        "import_path_missing",
        lambda: make_vec_env("nosuch.module:Env", 1, 0),
        ValueError,
        ["nosuch.module", "cannot import"],
    ),
    (
        "envpool_unknown_option",
        lambda: make_vec_env("CartPole-v1", 1, 0, {"bogus": 1}),
        ValueError,
        ["env_config", "bogus"],
    ),
    (
        "nan_reward",
        lambda: small_config(fake_envs.NaNRewardEnv).build().train(),
        ValueError,
        ["non-finite reward", "disable_env_checking"],
    ),
    (
        "discrete_action_out_of_range",
        lambda: ActionAdapter(fake_envs.NaNRewardEnv.action_space, True, False, "e")(
            np.array([0, 2]), 2
        ),
        ValueError,
        ["outside", "2"],
    ),
    (
        "box_action_out_of_range",
        lambda: ActionAdapter(
            __import__("gymnasium").spaces.Box(-1, 1, (1,), np.float32), False, False, "e"
        )(np.array([[3.0]], np.float32), 1),
        ValueError,
        ["outside", "clip_actions"],
    ),
    (
        "action_wrong_shape",
        lambda: ActionAdapter(fake_envs.NaNRewardEnv.action_space, True, False, "e")(
            np.array([[0, 1]]), 2
        ),
        ValueError,
        ["shape"],
    ),
    (
        "minibatch_not_splitting_over_devices",
        lambda: (
            small_config()
            .training(minibatch_size=8, train_batch_size_per_learner=32)
            .learners(num_learners=2)
            .build()
        ),
        ValueError,
        ["minibatch_size"],
    ),
]

# The surfaces added later: recurrent configs and Tune's search spaces outside Tune. (LSTM with
# replay is valid: replayed fragments carry their core states, tests/test_recurrent.py.)
NEW_SURFACE_CASES = [
    (
        "lstm_max_seq_len_beyond_the_fragment",
        lambda: (
            small_config()
            .env_runners(rollout_fragment_length=8)
            .rl_module(model_config={"use_lstm": True, "max_seq_len": 20})
            .validate()
        ),
        ValueError,
        ["max_seq_len']=20", "rollout_fragment_length=8", "max_seq_len <= 9"],
    ),
    (
        "lstm_cell_size_zero",
        lambda: (
            small_config()
            .rl_module(model_config={"use_lstm": True, "lstm_cell_size": 0})
            .validate()
        ),
        ValueError,
        ["lstm_cell_size", "0"],
    ),
    (
        "search_space_built_outside_tune",
        lambda: cfg(lr={"grid_search": [1e-3, 1e-4]}).build(),
        ValueError,
        ["search spaces in ['lr']", "tune.Tuner(param_space=...)"],
    ),
]

ALL_CASES = CONFIG_CASES + ENV_CASES + NEW_SURFACE_CASES


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,thunk,error,fragments", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_misuse_gives_a_clear_error(name, thunk, error, fragments):
    with pytest.raises(error) as info:
        thunk()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    algo = small_config().build()
    algo.train()
    saved = algo.save(path / "good")
    yield algo, saved, path
    algo.stop()


def _state_unchanged(algo, before):
    after = algo.get_state()
    for a, b in zip(before["learner"], after["learner"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert before["counters"] == after["counters"]


def test_checkpoint_misuse_is_clear_and_loses_nothing(trained):
    algo, good, path = trained
    before = algo.get_state()
    (path / "foreign").mkdir()
    (path / "foreign" / "model.pt").write_text("not ours")
    cases = [
        (path / "missing", FileNotFoundError, "not an impala_jax checkpoint"),
        (path / "foreign", FileNotFoundError, "not an impala_jax checkpoint"),
    ]
    import shutil

    corrupt = path / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "state.json").write_text("{ truncated")
    cases.append((corrupt, ValueError, "corrupt"))
    foreign_format = path / "foreign_format"
    shutil.copytree(good, foreign_format)
    meta = json.loads((foreign_format / "state.json").read_text())
    meta["format"] = "someone-else/3"
    (foreign_format / "state.json").write_text(json.dumps(meta))
    (foreign_format / "manifest.json").unlink()  # as another program's would have none
    cases.append((foreign_format, ValueError, "another program"))
    for bad, error, fragment in cases:
        with pytest.raises(error, match=fragment):
            algo.restore(bad)
        _state_unchanged(algo, before)
    other = small_config().rl_module(model_config={"fcnet_hiddens": [8, 8]}).build()
    try:
        other_before = other.get_state()
        with pytest.raises(ValueError, match="do not match"):
            other.restore(good)
        _state_unchanged(other, other_before)
    finally:
        other.stop()


def _run_cli(argv):
    from impala_jax import run

    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            code = run.main(argv)
        except SystemExit as exit_:
            code = exit_.code
    text = out.getvalue() + (code if isinstance(code, str) else "")
    return code, text


CLI_CASES = [
    ("missing_file", ["{tmp}/nope.py"], ["nope.py"]),
    ("no_config", ["{tmp}/empty.py"], ["config"]),
    ("broken_file", ["{tmp}/broken.py"], ["broken.py"]),
    ("unknown_section", ["{tmp}/ok.py", "trainin.lr=1e-3"], ["trainin"]),
    ("unknown_field", ["{tmp}/ok.py", "training.learning_rate=1e-3"], ["learning_rate"]),
    ("invalid_value", ["{tmp}/ok.py", "training.lr=-1.0"], ["lr"]),
    ("malformed_override", ["{tmp}/ok.py", "training.lr"], ["training.lr"]),
    # Multi-process flags (the processes that built different configs: test_distributed.py).
    (
        "coordinator_missing",
        ["{tmp}/ok.py", "--num-processes", "2", "--process-id", "0"],
        ["--coordinator", "go together"],
    ),
    (
        "process_id_out_of_range",
        [
            "{tmp}/ok.py",
            "--coordinator",
            "127.0.0.1:1",
            "--num-processes",
            "2",
            "--process-id",
            "2",
        ],
        ["process_id=2", "[0, 2)"],
    ),
    (
        "num_processes_zero",
        [
            "{tmp}/ok.py",
            "--coordinator",
            "127.0.0.1:1",
            "--num-processes",
            "0",
            "--process-id",
            "0",
        ],
        ["num_processes=0"],
    ),
]


@pytest.mark.parametrize("name,argv,fragments", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_misuse_exits_nonzero_with_a_clear_message(tmp_path, name, argv, fragments):
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("config = (\n")
    (tmp_path / "ok.py").write_text(
        "from impala_jax import IMPALAConfig\nconfig = IMPALAConfig().environment('CartPole-v1')\n"
    )
    code, text = _run_cli([a.format(tmp=tmp_path) for a in argv] + ["--logdir", str(tmp_path)])
    assert code not in (0, None), text
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    assert not list(tmp_path.glob("ok_*")), "a failed start must not create a run directory"
