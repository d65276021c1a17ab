"""``Population``: members side by side in one program; a search without exploit is each member
alone; PBT's exploit copies params, optimizer state and hyperparameters together."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from ray import tune

from impala_jax import IMPALAConfig, make_train
from impala_jax.core import pbt
from impala_jax.rllib.pbt_spec import PopulationBasedTraining
from impala_jax.rllib.population import Population

UPDATE = 640  # env steps per update of _small()


def _small(seed=3) -> IMPALAConfig:
    return (
        IMPALAConfig()
        .environment("gymnax:CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=20)
        .training(train_batch_size_per_learner=640, minibatch_size=320, lr=0.01)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=seed)
    )


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_without_exploit_member_i_is_its_config_run_alone():
    config = _small().training(lr=tune.grid_search([0.003, 0.03]), entropy_coeff=0.02)
    population = Population(config, num_members=2)
    # conftest's two CPU devices: one member on each (member_mesh), with no collective
    assert population.mesh is not None and population.mesh.devices.size == 2
    assert len(jax.tree.leaves(population._carry)[0].sharding.device_set) == 2
    for _ in range(3):
        results = population.train()
    assert [r["config"]["lr"] for r in results] == pytest.approx([0.003, 0.03])
    assert results[0]["num_env_steps_sampled_lifetime"] == 3 * UPDATE
    for i, lr in enumerate([0.003, 0.03]):
        alone = _small(seed=3 + i).training(lr=lr, entropy_coeff=0.02)
        final, _ = jax.jit(make_train(alone, 3 * UPDATE))(jax.random.key(3 + i))
        got = population.get_weights(i)["default_policy"]
        for x, y in zip(_leaves(got), _leaves(final.state.params), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_members_start_from_draws_of_their_search_spaces():
    config = _small().training(lr=tune.loguniform(1e-4, 1e-2), gamma=tune.choice([0.9, 0.99]))
    population = Population(config, num_members=6)
    values = population.hparams()
    lrs = [v["lr"] for v in values]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 6
    assert all(v["gamma"] in (pytest.approx(0.9), pytest.approx(0.99)) for v in values)


def _pbt_population():
    config = _small().training(lr=tune.grid_search([1e-4, 3e-3, 1e-2, 3e-2]))
    scheduler = PopulationBasedTraining(
        perturbation_interval=2 * UPDATE,
        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "entropy_coeff": [0.0, 0.01]},
        quantile_fraction=0.25,
        resample_probability=0.0,
    )
    return Population(config, num_members=4, scheduler=scheduler)


def test_exploit_copies_params_optimizer_state_and_hyperparameters_together():
    population = _pbt_population()
    before = population.hparams()
    results = population.train()
    assert population.env_steps_per_iteration == 2 * UPDATE
    copies = [r["pbt"] for r in results if "pbt" in r]
    assert len(copies) == 1  # ceil(4 * 0.25) = 1 bottom member
    event = copies[0]
    i, j = event["member"], event["copied_from"]
    scores = [r["env_runners"]["episode_return_mean"] for r in results]
    assert scores[i] == min(scores) and scores[j] == max(scores)
    state = population._carry.state
    for tree in (state.params, state.opt_state):
        for x in _leaves(tree):
            np.testing.assert_array_equal(x[i], x[j])
    after = population.hparams()
    ops = event["operations"]
    factor = {"* 1.2": 1.2, "* 0.8": 0.8}[ops["lr"]]
    assert after[i]["lr"] == pytest.approx(before[j]["lr"] * factor, rel=1e-6)
    assert ops["entropy_coeff"] in ("shift left", "shift right")
    assert after[i]["entropy_coeff"] in (0.0, pytest.approx(0.01))
    for k in set(range(4)) - {i}:
        assert after[k] == before[k]
    assert population.lineage == [event]


def test_the_whole_run_as_one_function_makes_the_iterations_updates():
    population = _pbt_population()
    train = population.train_function(2)
    carry, hparams, metrics, lineage = jax.jit(train)(*population.initial_inputs())
    for _ in range(2):
        population.train()
    for x, y in zip(
        _leaves(carry.state.params), _leaves(population._carry.state.params), strict=True
    ):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    expected = population.hparams()
    for name, values in jax.device_get(hparams).items():
        np.testing.assert_allclose(values, [e[name] for e in expected], rtol=1e-6)
    assert np.asarray(lineage.copied).shape == (2, 4)


def test_save_and_restore_the_whole_population(tmp_path):
    population = _pbt_population()
    population.train()
    population.save(tmp_path / "pop")
    expected = population.train()
    restored = _pbt_population()
    restored.restore(tmp_path / "pop")
    assert restored.iteration == 1 and restored.lineage == population.lineage[:1]
    got = restored.train()
    for a, b in zip(got, expected, strict=True):
        assert a["env_runners"] == b["env_runners"] and a["config"] == b["config"]


def test_what_a_population_cannot_trace_is_named():
    scheduler = PopulationBasedTraining(
        perturbation_interval=UPDATE, hyperparam_mutations={"train_batch_size_per_learner": [1]}
    )
    with pytest.raises(ValueError, match="train_batch_size_per_learner.*not a hyperparameter"):
        Population(_small(), 2, scheduler)
    batch = _small().training(train_batch_size_per_learner=tune.choice([640, 1280]))
    with pytest.raises(ValueError, match="train_batch_size_per_learner hold.*Ray Tune"):
        Population(batch, 2)
    with pytest.raises(ValueError, match="steps on the host"):
        Population(_small().environment("CartPole-v1"), 2)
    assert pbt.operation_name(pbt.RESAMPLE, (1.2, 0.8)) == "resample"


def test_grids_combine_as_tune_s_and_must_divide_the_population():
    config = _small().training(
        lr=tune.grid_search([0.001, 0.01]), gamma=tune.grid_search([0.9, 0.95, 0.99])
    )
    values = Population(config, num_members=6).hparams()
    pairs = {(round(v["lr"], 6), round(v["gamma"], 6)) for v in values}
    assert pairs == {(lr, g) for lr in (0.001, 0.01) for g in (0.9, 0.95, 0.99)}
    with pytest.raises(ValueError, match="6 combinations; num_members must be a multiple"):
        Population(config, num_members=4)


def test_the_cli_trains_a_population_experiment_file(tmp_path):
    from impala_jax import run

    experiment = tmp_path / "pop_cartpole.py"
    experiment.write_text(
        "from impala_jax import IMPALAConfig, PopulationBasedTraining\n"
        "config = (\n"
        "    IMPALAConfig().environment('gymnax:CartPole-v1')\n"
        "    .env_runners(num_env_runners=0, num_envs_per_env_runner=16,"
        " rollout_fragment_length=20)\n"
        "    .training(train_batch_size_per_learner=640, lr={'grid_search': [0.001, 0.01]})\n"
        "    .rl_module(model_config={'fcnet_hiddens': [16]})\n"
        ")\n"
        "num_members = 4\n"
        "scheduler = PopulationBasedTraining(perturbation_interval=1280,"
        " hyperparam_mutations={'lr': [0.001, 0.003, 0.01]})\n"
        "stop = {'num_env_steps_sampled_lifetime': 3840}\n"
    )
    code = run.main([str(experiment), "--logdir", str(tmp_path / "runs")])
    assert code == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    for i in range(4):
        lines = (run_dir / f"member_{i}" / "result.json").read_text().splitlines()
        assert len(lines) == 3  # 3 intervals of 1,280 env steps
        assert (run_dir / f"member_{i}" / "progress.csv").exists()
        assert list((run_dir / f"member_{i}").glob("events.out.tfevents.*"))
    assert (run_dir / "population_curves.png").stat().st_size > 1000
    assert isinstance(json.loads((run_dir / "lineage.json").read_text()), list)
    assert (run_dir / "checkpoint_population" / "population.npz").exists()
    results = [
        json.loads(x) for x in (run_dir / "member_0" / "result.json").read_text().splitlines()
    ]
    assert [r["num_env_steps_sampled_lifetime"] for r in results] == [1280, 2560, 3840]


def test_the_interval_program_is_kept_on_disk_and_makes_the_same_updates(tmp_path, monkeypatch):
    from impala_jax.runtime.learning import program_cache

    monkeypatch.setattr(program_cache, "directory", lambda: None)
    plain = _pbt_population()
    expected = [plain.train() for _ in range(2)]
    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    first, second = _pbt_population(), _pbt_population()
    first.train()
    assert first._interval.source == "exported" and list(tmp_path.glob("population_interval-*"))
    got = [second.train() for _ in range(2)]
    assert second._interval.source == "loaded"
    for a, b in zip(got, expected, strict=True):
        assert [r["env_runners"] for r in a] == [r["env_runners"] for r in b]
        assert [r["config"] for r in a] == [r["config"] for r in b]
    params = (_leaves(p._carry.state.params) for p in (second, plain))
    for x, y in zip(*params, strict=True):
        np.testing.assert_array_equal(x, y)


def _fake_interval(sign: float, exploit_now: bool = True):
    """An interval over 4 fake members whose return is 100 x their lr."""
    import jax.numpy as jnp

    from impala_jax.core.types import LearnerState
    from impala_jax.runtime.ondevice import population as program
    from impala_jax.runtime.ondevice.device_engine import TrainCarry

    def updates(carry, counters, hparams):
        n = counters.shape[0]
        metrics = {
            "num_episodes": jnp.ones(n),
            "episode_return_sum": jnp.full(n, 100 * hparams["lr"]),
        }
        return carry, metrics

    plan = program.PopulationPlan(
        updates_per_interval=1,
        mutations=(("lr", (0.1, 0.2, 0.3, 0.4)),),
        quantile_fraction=0.25,
        resample_probability=0.0,
        sign=sign,
    )
    state = LearnerState({"w": jnp.arange(4.0)}, (), jnp.zeros(4, jnp.int32), jnp.zeros(4))
    carry = TrainCarry(state, (), (), ())
    hparams = {"lr": jnp.asarray([0.1, 0.2, 0.3, 0.4])}
    interval = program.interval_function(updates, plan)
    return interval(
        carry, hparams, jnp.full(4, jnp.nan), jax.random.key(0), jnp.zeros((1, 2)), exploit_now
    )


@pytest.mark.parametrize("sign, copier, donor", [(1.0, 0, 3), (-1.0, 3, 0)])
def test_mode_decides_who_copies_whom(sign, copier, donor):
    # Regression caught: the mode's sign dropped or flipped (mode="min" ranked as "max").
    carry, _, _, _, _, lineage = _fake_interval(sign)
    assert np.asarray(lineage.copied).tolist() == [i == copier for i in range(4)]
    assert int(lineage.source[copier]) == donor
    assert float(carry.state.params["w"][copier]) == donor


def test_no_one_is_copied_before_the_burn_in_ends():
    # Regression caught: exploit_now (the burn-in) ignored.
    _, _, _, _, _, lineage = _fake_interval(1.0, exploit_now=False)
    assert not np.asarray(lineage.copied).any()


def test_members_spread_over_devices_make_one_device_s_updates(monkeypatch):
    # 4 members over conftest's 2 CPU devices, PBT on (copies cross devices), against the same
    # population on one device: the same copies and hyperparameters, params to float rounding.
    from impala_jax.runtime.ondevice import population as program

    spread = _pbt_population()
    assert spread.mesh is not None and spread.mesh.devices.size == 2
    # Each device runs its share by hand (a shard_map over the members) and every member's
    # learner has no mesh of its own: no nested manual axis "learner".
    U = spread.plan.updates_per_interval
    counters = jax.numpy.asarray(spread._counters_of(0, U))
    interval = getattr(spread._interval, "_fn", spread._interval)
    inputs = (spread._carry, spread._hparams, spread._score, spread._key)
    text = interval.lower(*inputs, counters, jax.numpy.asarray(True)).as_text()
    assert set(re.findall(r"manual_axes=\{[^}]*\}", text)) == {'manual_axes={"members"}'}
    monkeypatch.setattr(program, "member_mesh", lambda *a, **k: None)
    one = _pbt_population()
    got, expected = [spread.train() for _ in range(3)], [one.train() for _ in range(3)]
    assert spread.lineage == one.lineage and spread.lineage  # someone was copied
    for a, b in zip(got, expected, strict=True):
        assert [r["config"] for r in a] == [r["config"] for r in b]
        for x, y in zip(a, b, strict=True):
            assert x["env_runners"] == pytest.approx(y["env_runners"], rel=1e-5)
    params = (_leaves(p._carry.state.params) for p in (spread, one))
    for x, y in zip(*params, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_members_with_two_learner_devices_each_run_from_the_program_cache(tmp_path, monkeypatch):
    # num_learners=2: every member data-parallel over both devices, so the members are not
    # spread. A stored interval program is exported for 2 devices and once failed on the
    # population's arrays, made on one ("exported for 2 devices ... called with 1").
    from impala_jax.runtime.learning import program_cache

    monkeypatch.setattr(program_cache, "directory", lambda: tmp_path)
    config = _small().learners(num_learners=2).training(lr=tune.grid_search([0.003, 0.03]))
    first = Population(config, num_members=2)
    assert first.mesh is None
    first.train()
    second = Population(config, num_members=2)
    assert [r["env_runners"] for r in second.train()] == [
        r["env_runners"] for r in _first_results(config)
    ]
    assert second._interval.source == "loaded"


def _first_results(config):
    from impala_jax.runtime.learning import program_cache

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(program_cache, "directory", lambda: None)
        return Population(config, num_members=2).train()
