"""Ray Tune: RLlib's sweep example verbatim, the Trainable's save/restore, stops, retries, PBT.

Trials are real Ray actors on a local Ray instance told its CPUs (2). The configs are small
(lockstep sampling: one CPU per trial) so that two trials run side by side on 2 cores.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from impala_jax import IMPALAConfig

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from impala_jax.rllib.ray_tune import TUNE_NAME, IMPALATrainable, trial_resources  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_local():
    # Trials import test helpers (tests.test_ray_tune:...) by module path: workers inherit
    # PYTHONPATH from the process that starts Ray.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), old) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def small(**training) -> IMPALAConfig:
    """CartPole in lockstep (no runner threads): one CPU per trial, ~1 s iterations."""
    return (
        IMPALAConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=16)
        .training(train_batch_size_per_learner=128, **training)
        .learners(num_learners=0)
        .reporting(min_time_s_per_iteration=0.5)
        .debugging(seed=0)
    )


def _python(code: str, env: dict | None = None, timeout: float = 240) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


class _Collect(tune.Callback):
    """Every result of every trial as the driver received it, by trial id (a trial's
    result.json can miss rows written just before its actor died or paused)."""

    def __init__(self):
        self.rows: dict[str, list[dict]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.setdefault(trial.trial_id, []).append(result)


def _run(tmp_path, param_space, trainable=TUNE_NAME, collect=None, **run_config):
    stop = run_config.pop("stop", {"training_iteration": 2})
    tune_config = run_config.pop("tune_config", None)
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            stop=stop,
            storage_path=str(tmp_path),
            name="exp",
            verbose=0,
            callbacks=[collect] if collect is not None else None,
            **run_config,
        ),
    )
    return tuner.fit()


def _saved_counters(result) -> dict[int, dict]:
    """The counters of each checkpoint the trial kept, by training_iteration."""
    counters = {}
    for path in Path(result.path).glob("checkpoint_*"):
        state = json.loads((path / "state.json").read_text())
        counters[state["counters"]["training_iteration"]] = state["counters"]
    return counters


# --- import and registration ---------------------------------------------------------------


def test_import_impala_jax_imports_no_ray_and_no_jax():
    out = _python(
        """
        import sys
        import impala_jax
        from impala_jax import IMPALAConfig
        IMPALAConfig().environment("CartPole-v1").training(lr=1e-3).to_dict()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "jax", "jaxlib")))
        """
    )
    assert out.strip() == "[]"


@pytest.mark.parametrize("order", ["impala_jax first", "ray.tune first"])
def test_tune_names_are_impala_jax_in_either_import_order(order):
    imports = ["import impala_jax", "from ray import tune"]
    if order == "ray.tune first":
        imports.reverse()
    out = _python(
        "\n".join(imports)
        + """
from ray.tune.registry import get_trainable_cls
from ray.tune.tune import _Config
from impala_jax.rllib.ray_tune import IMPALATrainable
before = get_trainable_cls("IMPALA") is IMPALATrainable
# Asking Tune for another RLlib algorithm by name registers all of RLlib's, "IMPALA" too.
get_trainable_cls("PPO")
print(before, get_trainable_cls("IMPALA") is IMPALATrainable,
      get_trainable_cls("impala_jax") is IMPALATrainable,
      isinstance(impala_jax.IMPALAConfig(), _Config))
"""
    )
    assert out.split() == ["True"] * 4


@pytest.mark.slow
def test_rllib_docstring_tune_example_runs_verbatim(tmp_path):
    """The second example of RLlib's IMPALAConfig doc, only the import line swapped, run as a
    new user runs it: a fresh process, Tune starting Ray itself on this machine's CPUs."""
    from ray.rllib.algorithms.impala import IMPALAConfig as RLlibIMPALAConfig

    # The installed RLlib's docstring: its `.. testcode::` blocks, each dedented.
    blocks = inspect.getdoc(RLlibIMPALAConfig).split(".. testcode::")[1:]
    (example,) = [textwrap.dedent(b).strip() for b in blocks if "from ray import tune" in b]
    example = example.replace("from ray.rllib.algorithms.impala", "from impala_jax", 1)
    assert "grid_search([0.0001, 0.0002])" in example and '"IMPALA"' in example
    # HOME: Tune's default storage (~/ray_results) goes to tmp_path.
    _python(example, env={"HOME": str(tmp_path)}, timeout=400)

    from ray.tune import ExperimentAnalysis

    (experiment,) = (tmp_path / "ray_results").iterdir()
    analysis = ExperimentAnalysis(str(experiment))
    trials = sorted(analysis.trials, key=lambda t: t.config["lr"])
    assert [t.status for t in trials] == ["TERMINATED", "TERMINATED"]
    assert [t.config["lr"] for t in trials] == [0.0001, 0.0002]
    assert all(t.config["grad_clip"] == 20.0 for t in trials)
    for t in trials:
        result = t.last_result
        assert result["training_iteration"] == 1
        # The trial ran impala_jax (its learner reports the lr it applied).
        assert result["learners"]["default_policy"]["curr_lr"] == pytest.approx(t.config["lr"])
        assert result["num_env_steps_trained_lifetime"] > 0


# --- resources -----------------------------------------------------------------------------


def test_trial_resources_add_up_one_process():
    example = IMPALAConfig().env_runners(num_env_runners=1).learners(num_learners=1)
    assert trial_resources(example) == {"CPU": 2.0, "GPU": 0.0}  # RLlib asks for 3
    assert trial_resources(IMPALAConfig()) == {"CPU": 3.0, "GPU": 0.0}
    assert trial_resources(small()) == {"CPU": 1.0, "GPU": 0.0}
    gpus = IMPALAConfig().learners(num_learners=2, num_gpus_per_learner=1)
    assert trial_resources(gpus) == {"CPU": 3.0, "GPU": 2.0}  # main 1 (learners "auto": 0)
    cpus = IMPALAConfig().learners(num_learners=2, num_cpus_per_learner=2)
    assert trial_resources(cpus) == {"CPU": 6.0, "GPU": 0.0}  # max(1, 2 x 2) + 2 runners
    main = IMPALAConfig().resources(num_cpus_for_main_process=4)
    assert trial_resources(main) == {"CPU": 6.0, "GPU": 0.0}
    threads = IMPALAConfig().env_runners(num_cpus_per_env_runner=0.5)
    assert trial_resources(threads) == {"CPU": 2.0, "GPU": 0.0}
    evaluation = IMPALAConfig().evaluation(
        evaluation_interval=1,
        evaluation_num_env_runners=2,
        evaluation_config={"num_cpus_per_env_runner": 2},
    )
    assert trial_resources(evaluation) == {"CPU": 7.0, "GPU": 0.0}
    no_eval = IMPALAConfig().evaluation(evaluation_num_env_runners=2)  # interval None: none
    assert trial_resources(no_eval) == {"CPU": 3.0, "GPU": 0.0}
    aggregators = IMPALAConfig().learners(num_aggregator_actors_per_learner=2)
    assert trial_resources(aggregators) == {"CPU": 5.0, "GPU": 0.0}
    # A dict (what Tune hands over) reads the same as the config.
    assert trial_resources(example.to_dict()) == trial_resources(example)
    assert trial_resources({"num_env_runners": 4}) == {"CPU": 5.0, "GPU": 0.0}


@pytest.mark.slow
def test_resource_request_is_one_bundle_and_too_big_fails_fast(ray_local):
    pgf = IMPALATrainable.default_resource_request(small().to_dict())
    assert pgf.bundles == [{"CPU": 1.0}]
    assert pgf.strategy == "PACK"
    with pytest.raises(ValueError) as err:
        IMPALATrainable.default_resource_request({"num_env_runners": 4})
    message = str(err.value)
    assert "asks for 5 CPU, 0 GPU" in message and "num_env_runners=4" in message
    assert "ray.init(num_cpus=...)" in message


@pytest.mark.slow
def test_too_big_trial_fails_the_sweep_instead_of_pending(ray_local, tmp_path):
    with pytest.raises(Exception, match="asks for 5 CPU"):
        _run(tmp_path, small().env_runners(num_env_runners=4))


@pytest.mark.parametrize("field, value", [("placement_strategy", "SPREAD")])
def test_placement_strategy_other_than_pack_is_an_error(field, value):
    with pytest.raises(ValueError, match="one placement-group bundle"):
        IMPALAConfig().resources(**{field: value}).validate()


def test_trial_jax_environment_cpu_trial_gets_its_learner_devices():
    out = _python(
        """
        from impala_jax.rllib.ray_tune import trial_jax_environment
        trial_jax_environment(gpus=0, num_learners=2)
        import jax
        print(jax.default_backend(), len(jax.devices()))
        """,
        env={"JAX_PLATFORMS": "", "XLA_FLAGS": "", "IMPALA_JAX_COMPILE_CACHE": "none"},
    )
    assert out.split() == ["cpu", "2"]


def test_trial_jax_environment_gpu_trial_does_not_preallocate():
    out = _python(
        """
        import os
        from impala_jax.rllib.ray_tune import trial_jax_environment
        trial_jax_environment(gpus=1, num_learners=1)
        print(os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"], os.environ.get("JAX_PLATFORMS"))
        """,
        env={"JAX_PLATFORMS": "", "IMPALA_JAX_COMPILE_CACHE": "none"},
    )
    assert out.split() == ["false"]  # JAX_PLATFORMS left empty: JAX may pick the GPU


# --- the Trainable --------------------------------------------------------------------------


@pytest.mark.slow
def test_validate_save_restore(ray_local):
    from ray.tune.utils import validate_save_restore

    assert validate_save_restore(IMPALATrainable, config=small().to_dict())


def test_trainable_restore_continues_with_same_weights_and_counters(tmp_path):
    first = IMPALATrainable(config=small().to_dict())
    try:
        for _ in range(2):
            last = first.train()
        saved = first.save(str(tmp_path / "ckpt"))
        weights = first.algo.get_weights()
    finally:
        first.stop()
    second = IMPALATrainable(config=small().to_dict())
    try:
        second.restore(saved)
        np.testing.assert_equal(second.algo.get_weights(), weights)
        state = second.algo.get_state()["counters"]
        assert state["training_iteration"] == 2
        assert state["num_env_steps_sampled_lifetime"] == last["num_env_steps_sampled_lifetime"]
        result = second.train()
        assert result["training_iteration"] == 3
        assert result["num_env_steps_sampled_lifetime"] > last["num_env_steps_sampled_lifetime"]
        # A checkpoint Tune hands out is an impala_jax checkpoint.
        from impala_jax.rllib.algorithm import IMPALA

        outside = IMPALA.from_checkpoint(saved)
        try:
            np.testing.assert_equal(outside.get_weights(), weights)
        finally:
            outside.stop()
    finally:
        second.stop()


def test_reset_config_applies_the_new_config():
    trainable = IMPALATrainable(config=small(lr=1e-3).to_dict())
    try:
        assert trainable.reset_config(small(lr=3e-4).to_dict()) is True
        result = trainable.train()
        assert result["learners"]["default_policy"]["curr_lr"] == pytest.approx(3e-4)
    finally:
        trainable.stop()


# --- Tune features --------------------------------------------------------------------------


@pytest.mark.slow
def test_stop_on_a_slash_path(ray_local, tmp_path):
    # Nothing else would stop it: it ends because env_runners/episode_return_mean >= 1.
    collect = _Collect()
    grid = _run(tmp_path, small(), collect=collect, stop={"env_runners/episode_return_mean": 1})
    (result,) = grid
    assert result.error is None
    (rows,) = collect.rows.values()
    assert rows[-1]["env_runners"]["episode_return_mean"] >= 1
    assert all("episode_return_mean" not in r["env_runners"] for r in rows[:-1])


@pytest.mark.slow
def test_checkpoint_config_keeps_the_best_n(ray_local, tmp_path):
    grid = _run(
        tmp_path,
        small(),
        stop={"training_iteration": 4},
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=1,
            num_to_keep=2,
            checkpoint_score_attribute="num_env_steps_sampled_lifetime",
            checkpoint_score_order="max",
            checkpoint_at_end=True,
        ),
    )
    (result,) = grid
    assert result.error is None
    kept = sorted(p.name for p in Path(result.path).glob("checkpoint_*"))
    assert len(kept) == 2
    assert result.checkpoint is not None
    from impala_jax.rllib.algorithm import IMPALA

    algo = IMPALA.from_checkpoint(result.checkpoint)
    try:
        assert algo.get_state()["counters"]["training_iteration"] == 4
    finally:
        algo.stop()


def fail_once(*, marker: str, at_iteration: int, result: dict, **kwargs) -> None:
    """on_train_result that raises the first time `at_iteration` is reached (one marker file)."""
    if result["training_iteration"] == at_iteration and not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError(f"injected failure at iteration {at_iteration}")


@pytest.mark.slow
def test_failure_config_retries_from_the_newest_checkpoint(ray_local, tmp_path):
    marker = str(tmp_path / "failed_once")
    config = small().callbacks(
        on_train_result=functools.partial(fail_once, marker=marker, at_iteration=3)
    )
    collect = _Collect()
    grid = _run(
        tmp_path,
        config,
        collect=collect,
        stop={"training_iteration": 4},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        failure_config=tune.FailureConfig(max_failures=1),
    )
    (result,) = grid
    assert os.path.exists(marker)  # the failure happened
    assert result.error is None  # and the retry finished the trial
    (rows,) = collect.rows.values()
    assert rows[-1]["training_iteration"] == 4
    # The retry: a new actor, restored from the newest checkpoint (iteration 2, or 1 if the
    # failure came before Tune had saved 2) with that checkpoint's counters.
    first_pid = rows[0]["pid"]
    restored = next(r for r in rows if r["pid"] != first_pid)
    assert restored["iterations_since_restore"] == 1
    resumed_from = restored["training_iteration"] - 1
    assert resumed_from in (1, 2)
    saved = _saved_counters(result)[resumed_from]
    sampled = restored["env_runners"]["num_env_steps_sampled"]
    assert restored["num_env_steps_sampled_lifetime"] == (
        saved["num_env_steps_sampled_lifetime"] + sampled
    )
    assert restored["num_env_steps_trained_lifetime"] > saved["num_env_steps_trained_lifetime"]
    steps = [r["num_env_steps_sampled_lifetime"] for r in rows if r["pid"] != first_pid]
    assert steps == sorted(steps)


@pytest.mark.slow
def test_population_based_training_perturbs_lr_and_exploits(ray_local, tmp_path):
    from ray.tune.schedulers import PopulationBasedTraining

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        # Neither initial lr is in the list: the first exploit always moves the target's lr.
        hyperparam_mutations={"lr": [5e-4, 7e-4, 2e-3]},
        synch=True,
    )
    config = small(lr=tune.grid_search([1e-4, 3e-3]))
    collect = _Collect()
    grid = _run(
        tmp_path,
        config,
        collect=collect,
        stop={"training_iteration": 4},
        tune_config=tune.TuneConfig(
            scheduler=pbt,
            metric="env_runners/episode_return_mean",
            mode="max",
            reuse_actors=True,
        ),
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0),
    )
    assert all(r.error is None for r in grid)
    # PBT's log: [target trial, clone trial, their iterations, clone's config, new config].
    log = (tmp_path / "exp" / "pbt_global.txt").read_text().splitlines()
    exploits = [json.loads(line) for line in log if line.strip()]
    assert exploits, "PBT never exploited"
    target, clone, _, _, clone_config, new = exploits[0]
    assert new["lr"] != clone_config["lr"]  # perturbed
    by_tag = {Path(r.path).name: r.metrics["trial_id"] for r in grid}
    target_rows = collect.rows[next(i for name, i in by_tag.items() if f"_{target}_" in name)]
    clone_rows = collect.rows[next(i for name, i in by_tag.items() if f"_{clone}_" in name)]
    after = next(i for i, r in enumerate(target_rows) if r["config"]["lr"] == new["lr"])
    assert after > 0 and target_rows[after - 1]["config"]["lr"] != new["lr"]
    first = target_rows[after]
    # The exploited trial continues from the clone's checkpoint, taken at a perturbation
    # interval (iteration 2 or 4): its iteration and counters follow the clone's, and its
    # learner applies the perturbed lr.
    resumed_at = first["training_iteration"] - 1
    assert resumed_at in (2, 4)
    cloned = next(r for r in clone_rows if r["training_iteration"] == resumed_at)
    sampled = first["env_runners"]["num_env_steps_sampled"]
    assert first["num_env_steps_sampled_lifetime"] == (
        cloned["num_env_steps_sampled_lifetime"] + sampled
    )
    assert first["learners"]["default_policy"]["curr_lr"] == pytest.approx(new["lr"])


def record_layer_sizes(*, algorithm, result: dict, **kwargs) -> None:
    """on_train_result: the hidden layer sizes the trial's network really has."""
    params = algorithm.get_weights()["default_policy"]
    sizes = sorted({int(np.shape(x)[-1]) for x in _leaves(params) if np.ndim(x) == 2})
    result["layer_sizes"] = sizes


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.slow
def test_search_spaces_inside_model_config_and_schedules(ray_local, tmp_path):
    config = (
        small()
        .training(
            lr=[[0, tune.grid_search([1e-3, 2e-3])], [10_000, 1e-5]],
            vf_loss_coeff=tune.uniform(0.1, 0.5),
        )
        .rl_module(model_config={"fcnet_hiddens": tune.grid_search([[24], [40]])})
        .callbacks(on_train_result=record_layer_sizes)
    )
    grid = _run(tmp_path, config, stop={"training_iteration": 1})
    assert len(grid) == 4 and all(r.error is None for r in grid)
    seen = set()
    for result in grid:
        trial = result.config
        hidden = trial["model_config"]["fcnet_hiddens"]
        lr0 = trial["lr"][0][1]
        seen.add((hidden[0], lr0))
        assert hidden[0] in result.metrics["layer_sizes"]
        assert trial["model_config"]["fcnet_activation"] == "tanh"  # the defaults merged in
        assert 0.1 <= trial["vf_loss_coeff"] <= 0.5
        assert result.metrics["learners"]["default_policy"]["curr_lr"] <= lr0
    assert seen == {(24, 1e-3), (24, 2e-3), (40, 1e-3), (40, 2e-3)}


def test_cleanup_stops_every_thread_the_trial_started():
    import threading
    import time

    before = set(threading.enumerate())
    config = small().env_runners(num_env_runners=1, num_envs_per_env_runner=4)
    trainable = IMPALATrainable(config=config.to_dict())
    trainable.train()
    assert len(set(threading.enumerate()) - before) > 0  # runner and loader threads ran
    trainable.stop()  # Tune's stop() calls cleanup()
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(threading.enumerate()) - before == set()


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_bad_value_in_a_dict_param_space_fails_its_trial_naming_the_field(ray_local, tmp_path):
    # RLlib users hand Tune a plain dict; one grid point holds an invalid lr. That trial fails
    # with impala_jax's validation message (field, value, fix); the other trains, on an env
    # registered with impala_jax in the driver (the registry reaches the trials).
    import gymnasium as gym

    from impala_jax import register_env
    from impala_jax.runtime.envs.env_registry import REGISTERED

    register_env("cartpole_from_the_driver", lambda ctx: gym.make("CartPole-v1"))
    try:
        config = small().environment("cartpole_from_the_driver")
        space = dict(config.to_dict(), lr=tune.grid_search([1e-3, -1.0]))
        grid = _run(tmp_path, space, stop={"training_iteration": 1})
    finally:
        REGISTERED.pop("cartpole_from_the_driver", None)
    assert len(grid) == 2 and len(grid.errors) == 1
    message = str(grid.errors[0])
    assert "lr=-1.0: expected a float > 0" in message and ".training(lr=...)" in message
    (good,) = [r for r in grid if r.error is None]
    assert good.metrics["training_iteration"] == 1 and good.config["lr"] == 1e-3
    assert good.metrics["num_env_steps_sampled_lifetime"] > 0
    assert good.config["env"] == "cartpole_from_the_driver"


def _multi_agent_mapping(agent_id, episode, **kwargs):
    return f"p{agent_id}"


@pytest.mark.slow
def test_a_multi_agent_sweep_reports_per_policy_results(ray_local, tmp_path):
    """A grid over lr of RLlib's multi-agent CartPole (rllib/multi_agent.py), two policies per
    trial: each trial's results carry RLlib's per-module keys."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    config = (
        small(lr=tune.grid_search([1e-3, 5e-4]))
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_multi_agent_mapping)
    )
    collect = _Collect()
    grid = _run(tmp_path, config, collect=collect)
    assert len(grid) == 2 and all(r.error is None for r in grid)
    for rows in collect.rows.values():
        learners = rows[-1]["learners"]
        assert {"p0", "p1", "__all_modules__"} <= set(learners)
        assert learners["p0"]["default_optimizer_learning_rate"] == pytest.approx(
            rows[-1]["config"]["lr"]
        )
