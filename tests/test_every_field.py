"""Every IMPALAConfig field, set to a non-default value, changes what impala_jax does or is a
clear error naming the field: no setting is silently accepted.

``FIELDS`` holds one row per field of ``IMPALAConfig().to_dict()``. A field added later and
missing here fails ``test_every_field_has_a_row`` by name. Kinds of rows:

- ``Error(value)``: ``validate()`` (or the builder call) raises, naming the field.
- ``Spec(value, fn)``: what the compiled learner closes over (``specs.*``) differs from the
  same config without the value.
- ``Built(build, value, check)``: the value is set on one of the shared builds ``BUILDS``
  (each built and trained once, with all its rows' values at once) and ``check`` reads the
  effect off the algorithm, its result, its files.
- ``Evaluated(value, check)``: an evaluation with the value, acting with build A's policy.
- ``Covered(test)``: a test elsewhere injects what the field reacts to (a hang, a crash, a NaN)
  or calls what it names (a callback); that test must exist and its module mention the field.
- ``Accepted(value, why)``: an RLlib value accepted on purpose although it changes nothing
  here, so that RLlib scripts run unchanged; each is a reviewed decision, listed with its reason.

``also`` sets other fields a value needs to mean something (``decay`` with RMSProp).
"""

from __future__ import annotations

import ast
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import numpy as np
import pytest

from impala_jax import IMPALAConfig
from impala_jax.rllib import specs
from impala_jax.rllib.config import _FIELD_TO_BUILDER
from impala_jax.runtime.acting.evaluation import Evaluator
from impala_jax.runtime.acting.host_actor import HostActor
from impala_jax.runtime.envs.vec_env import make_vec_env
from impala_jax.runtime.process import checkpoint
from tests.fake_envs import SeededFault, make_return_env
from tests.test_algorithm import small_config

REPO = Path(__file__).resolve().parents[1]
MULTI_AGENT_TEST = "tests/test_multi_agent.py"


@dataclasses.dataclass
class Error:
    value: Any
    also: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Spec:
    value: Any
    fn: Callable
    also: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Built:
    build: str
    value: Any
    check: Callable  # (Observed) -> bool


@dataclasses.dataclass
class Evaluated:
    value: Any
    check: Callable  # (evaluation result, Evaluator) -> bool
    also: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Covered:
    test: str  # "tests/module.py::test_name"


@dataclasses.dataclass
class Accepted:
    value: Any
    why: str


@dataclasses.dataclass
class Observed:
    algo: Any
    result: dict
    checkpoint: Path | None
    logger_level: int  # of the impala_jax logger, right after this build

    @property
    def runner(self):
        return self.algo.env_runner_group.local_runner

    @property
    def learner_results(self) -> dict:
        return self.result["learners"]["default_policy"]


def loss(c):
    return specs.loss_spec(c)


def optimizer(c):
    return specs.optimizer_spec(c)


def step(c):
    return specs.step_spec(c, 1)


def leaves(tree) -> list:
    return jax.tree.leaves(tree)


def _num_threads(o: Observed) -> int:
    return o.runner.groups[0].env._env.config["num_threads"]


def _custom_evaluation(algorithm, eval_workers):
    return {"custom": 1.0}


def _hook(**kwargs):
    pass


def gym_cartpole(config):
    return gym.make("CartPole-v1")


CALLBACKS_TEST = "tests/test_callbacks.py::test_hooks_kwargs_and_metrics_lockstep"


RMSPROP = {"opt_type": "rmsprop"}
SEPARATE_VF = {"_separate_vf_optimizer": True, "model_config": {"vf_share_layers": False}}

# Builds shared by the Built rows: name -> (base config, train() calls).
BUILDS: dict[str, tuple[Callable[[], IMPALAConfig], int]] = {
    # Lockstep CartPole (small_config: 4 envs, T=8, 64-step batches), trained one iteration.
    "A": (lambda: small_config(), 1),
    # Pendulum with space overrides: only built (its action space does not fit the env).
    "S": (lambda: small_config("Pendulum-v1"), 0),
    # One runner thread, two learner devices, loader threads.
    "T": (lambda: small_config(num_env_runners=1), 1),
}

FIELDS: dict[str, Any] = {
    # .environment()
    "env": Built("A", "CartPole-v1", lambda o: o.algo.observation_space.shape == (4,)),
    "env_config": Built(
        "A",
        {"max_episode_steps": 12},
        lambda o: o.result["env_runners"]["episode_len_mean"] <= 12,
    ),
    "observation_space": Built(
        "S",
        gym.spaces.Box(-10.0, 10.0, (3,), np.float32),
        lambda o: o.algo.observation_space.low[0] == -10.0,
    ),
    "action_space": Built(
        "S",
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        lambda o: o.algo.networks.dist_size == 4,  # mean and log-std of 2 dims, not 1
    ),
    "render_env": Error(True),
    "clip_rewards": Spec(0.5, loss),
    "normalize_actions": Built("S", False, lambda o: o.runner.groups[0].adapter.normalize is False),
    "clip_actions": Built("S", True, lambda o: o.runner.groups[0].adapter.clip is True),
    "disable_env_checking": Covered(
        "tests/test_fault_tolerance.py::test_nan_updates_in_a_row_stop_training"
    ),
    "is_atari": Spec(True, loss),  # Atari rewards are clipped when clip_rewards is None
    "action_mask_key": Error("mask"),
    # .env_runners()
    "env_runner_cls": Error("my_pkg.MyRunner"),
    "num_env_runners": Built(
        "T", 1, lambda o: o.result["fault_tolerance"]["num_healthy_workers"] == 1
    ),
    "num_envs_per_env_runner": Built(
        "A", 4, lambda o: sum(g.env.num_envs for g in o.runner.groups) == 4
    ),
    "gym_env_vectorize_mode": Evaluated(
        # CartPole from a creator: gymnasium.vector, not envpool
        "async",
        lambda r, ev: isinstance(ev._groups[0].env._env, gym.vector.AsyncVectorEnv),
        also={
            "env": "tests.test_every_field:gym_cartpole",
            "num_cpus_per_env_runner": 1,
            "evaluation_duration": 1,
        },
    ),
    "num_cpus_per_env_runner": Built("A", 2, lambda o: _num_threads(o) == 2),
    "num_gpus_per_env_runner": Error(1),
    "sample_timeout_s": Covered(
        "tests/test_fault_tolerance.py::test_hung_runner_is_replaced_and_training_progresses"
    ),
    "max_requests_in_flight_per_env_runner": Error(2),
    "compress_observations": Error(True),
    # The default ("auto") acts with NumPy for build A's MLP on the CPU; "jax" jits act.
    "inference_backend": Built("A", "jax", lambda o: not isinstance(o.algo._act, HostActor)),
    "rollout_fragment_length": Built("A", 8, lambda o: o.runner.T == 8),
    "batch_mode": Error("complete_episodes"),
    "explore": Built("A", False, lambda o: o.runner.explore is False),
    "observation_filter": Error("MeanStdFilter"),
    # On device only ("gymnax:" envs); with a host env it is an error.
    "policy_lag": Covered("tests/test_on_device.py::test_lag_k_is_the_reported_lag_and_moves_rho"),
    # .training()
    "vtrace": Spec(False, loss),
    "vtrace_clip_rho_threshold": Spec(2.0, loss),
    "vtrace_clip_pg_rho_threshold": Spec(2.0, loss),
    "num_gpu_loader_threads": Built(
        "T", 2, lambda o: len(o.algo.env_runner_group._loader.threads) == 2
    ),
    "num_multi_gpu_tower_stacks": Built(
        "T", 2, lambda o: o.algo.env_runner_group._loader.slots.maxsize == 2
    ),
    "minibatch_buffer_size": Spec(2, step, also={"num_epochs": 2}),
    "replay_proportion": Spec(0.5, step, also={"replay_buffer_num_slots": 4}),
    "replay_buffer_num_slots": Spec(
        8, step, also={"replay_proportion": 0.5, "replay_buffer_num_slots": 4}
    ),
    "learner_queue_size": Built("T", 5, lambda o: o.algo.env_runner_group._queue._q.maxsize == 5),
    "learner_queue_timeout": Covered(
        "tests/test_algorithm.py::test_queue_timeout_is_a_clear_error"
    ),
    "timeout_s_sampler_manager": Error(1.0),
    "timeout_s_aggregator_manager": Error(1.0),
    "broadcast_interval": Built(
        # 2 updates (min_train_timesteps_per_iteration), published after the 2nd only
        "A",
        2,
        lambda o: o.algo.param_store.version == 1,
    ),
    "grad_clip": Spec(1.0, optimizer),
    "opt_type": Spec("rmsprop", optimizer),
    "lr_schedule": Spec([[0, 1e-3], [1000, 1e-4]], optimizer),
    "decay": Spec(0.9, optimizer, also=RMSPROP),
    "momentum": Spec(0.5, optimizer, also=RMSPROP),
    "epsilon": Spec(0.01, optimizer, also=RMSPROP),
    "rmsprop_initial_scale": Spec(0.0, optimizer, also=RMSPROP),
    "vf_loss_coeff": Spec(0.1, loss),
    "loss_reduction": Spec("sum", loss),
    "entropy_coeff": Spec(0.1, loss),
    "entropy_coeff_schedule": Spec([[0, 0.01], [1000, 0.0]], loss),
    "_separate_vf_optimizer": Spec(
        True, optimizer, also={"model_config": SEPARATE_VF["model_config"]}
    ),
    "_lr_vf": Spec(1e-3, optimizer, also=SEPARATE_VF),
    "num_aggregation_workers": Error(2),
    "max_requests_in_flight_per_aggregator_worker": Error(2),
    "gamma": Spec(0.9, loss),
    "lr": Spec(1e-2, optimizer),
    "grad_clip_by": Spec("value", optimizer),
    "train_batch_size": Spec(128, step, also={"train_batch_size_per_learner": None}),
    "train_batch_size_per_learner": Built(
        # 2 updates of 64 env steps each (the default, train_batch_size=500, would train 504)
        "A",
        64,
        lambda o: o.result["num_env_steps_trained_lifetime"] == 128,
    ),
    "num_epochs": Spec(2, step),
    "minibatch_size": Spec(32, step),
    "shuffle_batch_per_epoch": Spec(True, step),
    "learner_class": Error("my_pkg.MyLearner"),
    # .learners()
    "num_learners": Built("T", 2, lambda o: o.algo.learner.num_devices == 2),
    "num_cpus_per_learner": Covered(
        "tests/test_ray_tune.py::test_trial_resources_add_up_one_process"
    ),
    "num_gpus_per_learner": Error(1),  # JAX has no GPU in the tests (conftest: cpu)
    "num_aggregator_actors_per_learner": Covered(
        "tests/test_buffers.py::test_aggregators_in_a_run_and_not_in_lockstep"
    ),
    "max_requests_in_flight_per_aggregator_actor": Covered(
        "tests/test_buffers.py::test_aggregators_in_a_run_and_not_in_lockstep"
    ),
    "local_gpu_idx": Error(1),
    # .rl_module()
    "model_config": Built(
        "S",
        {"fcnet_hiddens": [8]},
        lambda o: any(np.shape(x) == (3, 8) for x in leaves(o.algo.learner.state.params)),
    ),
    "rl_module_spec": Covered(
        "tests/test_rl_module_spec.py::test_a_factory_is_stored_and_round_trips"
    ),
    # .evaluation()
    "evaluation_interval": Built("A", 1, lambda o: "evaluation" in o.result),
    "evaluation_duration": Built(
        "A", 3, lambda o: o.result["evaluation"]["env_runners"]["num_episodes"] == 3
    ),
    "evaluation_duration_unit": Evaluated(
        "timesteps",
        lambda r, ev: 20 <= r["env_runners"]["num_env_steps_sampled"] < 24,
        also={"evaluation_duration": 20},
    ),
    "evaluation_sample_timeout_s": Covered(
        "tests/test_evaluation.py::test_timeout_returns_what_it_has_with_a_warning"
    ),
    "evaluation_parallel_to_training": Covered(
        "tests/test_evaluation.py::test_parallel_auto_evaluates_while_training_and_as_long"
    ),
    "evaluation_force_reset_envs_before_iteration": Covered(
        "tests/test_evaluation.py::test_timesteps_and_force_reset"
    ),
    "evaluation_config": Evaluated(
        {"env_config": {"max_episode_steps": 3}},
        lambda r, ev: r["env_runners"]["episode_len_mean"] <= 3,
        also={"evaluation_duration": 2},
    ),
    "evaluation_num_env_runners": Evaluated(
        2,
        lambda r, ev: ev.num_env_runners == 2 and sum(g.env.num_envs for g in ev._groups) == 8,
        also={"evaluation_duration": 2},
    ),
    "custom_evaluation_function": Evaluated(_custom_evaluation, lambda r, ev: r == {"custom": 1.0}),
    # .reporting()
    "metrics_num_episodes_for_smoothing": Built(
        "A",
        1,
        lambda o: (
            o.result["env_runners"]["num_episodes"] > 1
            and o.result["env_runners"]["episode_return_min"]
            == o.result["env_runners"]["episode_return_max"]
        ),
    ),
    "min_time_s_per_iteration": Built(
        # 256 sampled steps take far less than 1 s; the default would run 10 s
        "T",
        1.0,
        lambda o: 1.0 <= o.result["time_this_iter_s"] < 10,
    ),
    "min_train_timesteps_per_iteration": Built(
        "A", 128, lambda o: o.result["num_env_steps_trained_lifetime"] >= 128
    ),
    "min_sample_timesteps_per_iteration": Built(
        "T", 256, lambda o: o.result["num_env_steps_sampled_lifetime"] >= 256
    ),
    "log_gradients": Built(
        "A",
        True,
        lambda o: (
            {"gradients_encoder_global_norm", "gradients_pi_global_norm"} <= set(o.learner_results)
        ),
    ),
    # .fault_tolerance()
    "restart_failed_env_runners": Covered(
        "tests/test_fault_tolerance.py::test_all_runners_failing_raise_with_the_original_traceback"
    ),
    "ignore_env_runner_failures": Covered(
        "tests/test_fault_tolerance.py::test_one_always_failing_runner_is_ignored"
    ),
    "max_num_env_runner_restarts": Covered(
        "tests/test_fault_tolerance.py::test_failed_runner_is_replaced_until_restarts_run_out"
    ),
    "delay_between_env_runner_restarts_s": Covered(
        "tests/test_fault_tolerance.py::"
        "test_while_every_runner_waits_for_its_restart_the_wait_says_why"
    ),
    "restart_failed_sub_environments": Covered(
        "tests/test_fault_tolerance.py::test_flaky_envs_are_restarted_and_training_goes_on"
    ),
    "num_consecutive_env_runner_failures_tolerance": Covered(
        "tests/test_every_field.py::test_consecutive_env_failures_tolerance"
    ),
    "env_runner_health_probe_timeout_s": Error(5.0),
    "env_runner_restore_timeout_s": Error(5.0),
    # .checkpointing()
    "export_native_model_files": Built(
        "A", True, lambda o: (o.checkpoint / checkpoint.NATIVE_PARAMS_FILE).is_file()
    ),
    "checkpoint_trainable_policies_only": Error(True),
    # .debugging()
    "_env_runners_only": Covered("tests/test_algorithm.py::test_stop_ends_threads_and_debug_modes"),
    "_skip_learners": Built("T", True, lambda o: o.result["num_env_steps_trained_lifetime"] == 0),
    "log_level": Built("A", "DEBUG", lambda o: o.logger_level == logging.DEBUG),
    "log_sys_usage": Built("A", False, lambda o: "cpu_util_percent" not in o.result["perf"]),
    "fake_sampler": Built(
        # 2 updates, one sampled batch of 64 env steps
        "A",
        True,
        lambda o: (
            o.result["num_env_steps_sampled_lifetime"] == 64
            and o.result["num_env_steps_trained_lifetime"] == 128
        ),
    ),
    "seed": Covered(
        "tests/test_algorithm.py::test_the_seed_fixes_a_lockstep_run_and_another_changes_it"
    ),
    # .resources()
    "num_cpus_for_main_process": Covered(
        "tests/test_ray_tune.py::test_trial_resources_add_up_one_process"
    ),
    "placement_strategy": Error("SPREAD"),
    "num_gpus": Accepted(0, "old-stack resource; RLlib's example scripts always set num_gpus=0"),
    # .framework(), .api_stack()
    "framework": Accepted("torch", "RLlib scripts name their framework; impala_jax runs JAX"),
    "enable_rl_module_and_learner": Error(False),
    "enable_env_runner_and_connector_v2": Error(False),
    # .multi_agent() (tests/test_multi_agent.py)
    "policies": Covered(f"{MULTI_AGENT_TEST}::test_one_shared_policy_over_every_agent"),
    "policy_mapping_fn": Covered(
        f"{MULTI_AGENT_TEST}::test_a_mapping_to_an_unknown_policy_names_it"
    ),
    "policies_to_train": Covered(
        f"{MULTI_AGENT_TEST}::test_a_policy_not_in_policies_to_train_never_changes"
    ),
    "count_steps_by": Covered(f"{MULTI_AGENT_TEST}::test_runner_threads_and_agent_step_counting"),
    "policy_map_capacity": Accepted(
        10, "RLlib's cache of policies held in memory; here every policy is on the device"
    ),
    "policy_states_are_swappable": Accepted(
        True, "RLlib's policy-cache hint; here every policy is on the device"
    ),
    "observation_fn": Error(_hook),
    # .callbacks()
    "callbacks_class": Covered("tests/test_callbacks.py::test_per_event_callables_and_class_list"),
    "on_algorithm_init": Covered(CALLBACKS_TEST),
    "on_train_result": Covered(CALLBACKS_TEST),
    "on_checkpoint_loaded": Covered(
        "tests/test_callbacks.py::test_per_event_callables_and_class_list"
    ),
    "on_episode_start": Covered(CALLBACKS_TEST),
    "on_episode_end": Covered(CALLBACKS_TEST),
    "on_evaluate_start": Covered(CALLBACKS_TEST),
    "on_evaluate_end": Covered(CALLBACKS_TEST),
    "on_episode_created": Error(_hook),
    "on_episode_step": Error(_hook),
    "on_sample_end": Error(_hook),
    "on_environment_created": Error(_hook),
    "on_env_runners_recreated": Error(_hook),
    "on_evaluate_offline_start": Error(_hook),
    "on_evaluate_offline_end": Error(_hook),
    "on_offline_eval_runners_recreated": Error(_hook),
}


def _set(config: IMPALAConfig, values: dict) -> IMPALAConfig:
    for name, value in values.items():
        getattr(config, _FIELD_TO_BUILDER[name])(**{name: value})
    return config


def _rows(kind):
    return [
        pytest.param(name, row, id=name) for name, row in FIELDS.items() if isinstance(row, kind)
    ]


def test_every_field_has_a_row():
    fields = set(IMPALAConfig().to_dict())
    missing = sorted(fields - set(FIELDS))
    unknown = sorted(set(FIELDS) - fields)
    assert not missing, (
        f"config fields without a row in tests/test_every_field.py FIELDS: {missing}; give each "
        "a non-default value and how its effect is observed, or the error it raises"
    )
    assert not unknown, f"FIELDS rows for fields the config no longer has: {unknown}"


def test_rows_set_non_default_values():
    defaults = IMPALAConfig().to_dict()
    same = [
        name
        for name, row in FIELDS.items()
        if not isinstance(row, Covered) and _plain(row.value) == defaults.get(name)
    ]
    assert not same, f"rows whose value is the default, which proves nothing: {same}"


@pytest.mark.parametrize(("name", "row"), _rows(Accepted))
def test_accepted_rllib_values_validate(name, row):
    _set(small_config(), {name: row.value}).validate()


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    return value


@pytest.mark.parametrize(("name", "row"), _rows(Error))
def test_unsupported_value_is_a_clear_error(name, row):
    config = _set(small_config(), row.also)
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=name):
        _set(config, {name: row.value})
        config.validate()


@pytest.mark.parametrize(("name", "row"), _rows(Spec))
def test_value_reaches_the_compiled_learner(name, row):
    without = _set(small_config(), row.also)
    with_value = _set(without.copy(), {name: row.value})
    with_value.validate()
    assert row.fn(with_value) != row.fn(without), f"{name}={row.value!r} changed nothing"


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Each build of BUILDS with every Built row's value set, trained, saved; left running
    for the checks and stopped at the end."""
    level = logging.getLogger("impala_jax").level
    out, algos = {}, []
    try:
        for build, (base, iterations) in BUILDS.items():
            config = _set(
                base(),
                {
                    n: r.value
                    for n, r in FIELDS.items()
                    if isinstance(r, Built) and r.build == build
                },
            )
            algo = config.build()
            algos.append(algo)
            logger_level = logging.getLogger("impala_jax").level
            result = {}
            for _ in range(iterations):
                result = algo.train()
            path = None
            if iterations:
                path = Path(algo.save_to_path(tmp_path_factory.mktemp(f"ckpt_{build}")))
            out[build] = Observed(algo, result, path, logger_level)
        yield out
    finally:
        for algo in algos:
            algo.stop()
        logging.getLogger("impala_jax").setLevel(level)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "row"), _rows(Built))
def test_value_changes_what_a_build_does(observed, name, row):
    assert row.check(observed[row.build]), f"{name}={row.value!r}: effect not observed"


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # async gymnasium.vector
@pytest.mark.parametrize(("name", "row"), _rows(Evaluated))
def test_value_changes_the_evaluation(observed, name, row):
    algo = observed["A"].algo
    config = algo.config.copy(copy_frozen=False)
    _set(config, dict(row.also, **{name: row.value}))
    config.validate()
    spec = specs.evaluation_spec(config.freeze())
    evaluator = Evaluator(spec, algo._act, algo._act_greedy, algo.param_store, seed=1)
    try:
        result = evaluator.evaluate(algo)
        assert row.check(result, evaluator), f"{name}={row.value!r}: {result}"
    finally:
        evaluator.close()


def mentions(function: ast.FunctionDef) -> set[str]:
    """The names a function's code uses: keywords, attributes, variables and whole string
    constants (dict keys, ``"field"`` arguments); not its docstring, comments or other
    bare strings."""
    bare = {id(node.value) for node in ast.walk(function) if isinstance(node, ast.Expr)}
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in bare:
                names.add(node.value)
    return names


@pytest.mark.parametrize(("name", "row"), _rows(Covered))
def test_covering_test_exists_and_sets_the_field(name, row):
    path, _, test_name = row.test.partition("::")
    tree = ast.parse((REPO / path).read_text())
    tests = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == test_name
    ]
    assert len(tests) == 1, f"{name}: {row.test} does not exist"
    assert name in mentions(tests[0]), f"{name}: {row.test} never sets or reads it in its code"


def test_mentions_skips_docstrings_and_bare_strings():
    tree = ast.parse(
        "def test_x(config):\n"
        '    """max_requests_in_flight_per_aggregator_actor in a docstring"""\n'
        '    "lr in a bare string"\n'
        '    config.training(gamma=0.9).fault_tolerance(**{"seed": 1})\n'
        "    return config.num_epochs\n"
    )
    found = mentions(tree.body[0])
    assert {"gamma", "seed", "num_epochs", "training", "config"} <= found
    assert not {"lr", "max_requests_in_flight_per_aggregator_actor"} & found


# -- what the shared rows cannot show ------------------------------------------------------


@pytest.mark.timeout(120)
def test_native_model_file_loads_back_into_the_network(observed):
    o = observed["A"]
    params = checkpoint.load_native_params(o.checkpoint)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected = o.algo.networks.apply(o.algo.learner.state.params, obs)
    got = o.algo.networks.apply(params, obs)
    for a, b in zip(leaves(expected), leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    # Also into a template of the same structure, as flax.serialization.from_bytes does.
    templated = checkpoint.load_native_params(o.checkpoint, target=o.algo.learner.state.params)
    assert jax.tree.structure(templated) == jax.tree.structure(o.algo.learner.state.params)


def test_gradient_norms_cost_nothing_when_off():
    assert specs.step_spec(small_config(), 1).log_gradients is False


def test_sys_usage_is_reported_by_default(observed):
    perf = observed["T"].result["perf"]
    assert 0.0 <= perf["cpu_util_percent"] <= 100.0
    assert 0.0 < perf["ram_util_percent"] < 100.0


def test_num_cpus_per_env_runner_on_gymnasium_envs():
    assert make_vec_env(make_return_env, 1, 0, {}, num_cpus=1).num_envs == 1
    with pytest.raises(ValueError, match="num_cpus_per_env_runner=2"):
        make_vec_env(make_return_env, 1, 0, {}, num_cpus=2)


@pytest.mark.timeout(120)
def test_consecutive_env_failures_tolerance():
    # Every env fails on its 4th step; restart_failed_sub_environments rebuilds them until
    # num_consecutive_env_runner_failures_tolerance failures in a row, then train() raises.
    config = (
        small_config(SeededFault, num_envs_per_env_runner=1, rollout_fragment_length=8)
        .environment(env_config={"from_seed": 0})
        .training(train_batch_size_per_learner=8)
        .fault_tolerance(
            restart_failed_sub_environments=True, num_consecutive_env_runner_failures_tolerance=2
        )
    )
    algo = config.build()
    try:
        with pytest.raises(RuntimeError, match="injected runner failure"):
            algo.train()
        assert algo.env_runner_group.runners[0].num_env_restarts == 2
    finally:
        algo.stop()
