"""Population-based training: core/pbt.py by hand, against Ray Tune's own code, under jit; and
rllib/pbt_spec.py's fields, checks and conversion of a Tune scheduler."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from impala_jax.core import pbt
from impala_jax.core.pbt import Domain, ExploreDraws

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402
from ray.tune.schedulers import PopulationBasedTraining as TunePBT  # noqa: E402
from ray.tune.schedulers.pbt import _explore as tune_explore  # noqa: E402

from impala_jax.rllib import pbt_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NAN = float("nan")
# Eight members: a NaN (no score yet) and ties. The seven scored ones in Tune's ascending,
# stable order: 1 (m1), 1 (m4), 2 (m6), 3 (m0), 5 (m3), 5 (m7), 7 (m5); ceil(7 * 0.25) = 2.
SCORES = jnp.array([3.0, 1.0, NAN, 5.0, 1.0, 7.0, 2.0, 5.0])


def _members(mask) -> list[int]:
    return [int(i) for i in np.flatnonzero(np.asarray(mask))]


# ---------------------------------------------------------------- quantiles and exploit by hand


def test_quantiles_by_hand():
    bottom, top = pbt.quantiles(SCORES, 0.25)
    assert _members(bottom) == [1, 4]  # the two 1s, member order
    assert _members(top) == [5, 7]  # 5 (m7, the later of the tied 5s) and 7 (m5)


@pytest.mark.parametrize(
    "scores, fraction, bottom, top",
    [
        ([2.0, 2.0, 2.0, 2.0], 0.25, [0], [3]),  # all tied: member order decides
        ([float("inf"), -float("inf"), 0.0, NAN], 0.25, [1], [0]),  # Tune keeps infinities
        ([1.0, 2.0, 3.0], 0.5, [0], [2]),  # ceil(1.5) = 2 > 3 / 2: capped at floor(1.5)
        # In float64 100 * 0.07 is 7.000000000000001, so Tune takes 8 (float32 would say 7).
        (list(range(100)), 0.07, list(range(8)), list(range(92, 100))),
        ([1.0, 2.0, 3.0, 4.0], 0.0, [], []),
        ([5.0, NAN, NAN], 0.5, [], []),  # one scored member: no quantiles
        ([NAN, NAN], 0.25, [], []),
    ],
)
def test_quantile_sizes_and_ties(scores, fraction, bottom, top):
    got_bottom, got_top = pbt.quantiles(jnp.asarray(scores, jnp.float32), fraction)
    assert (_members(got_bottom), _members(got_top)) == (bottom, top)


def test_exploit_from_draws_by_hand():
    # Tune's upper quantile is [m7, m5] (ascending); floor(draw * 2) indexes it.
    draws = jnp.array([0.99, 0.1, 0.5, 0.5, 0.9, 0.0, 0.5, 0.5])
    source, copied = pbt.exploit_from_draws(SCORES, 0.25, draws)
    assert _members(copied) == [1, 4]
    np.testing.assert_array_equal(source, [0, 7, 2, 3, 5, 5, 6, 7])
    assert source.dtype == jnp.int32


# ---------------------------------------------------------------------------- explore by hand

FACTORS = (1.2, 0.8, 0.5)
MUTATIONS = {
    "num_sgd_iter": (1.0, 2.0, 4.0, 8.0),
    "lr": Domain("loguniform", 1e-5, 1e-2),
    "batch": Domain("randint", 16, 512),
}
COPIED = jnp.array([True, True, True, True, True, True, False, True])


def _draws(resample_u, shift_right=(False,) * 8, factor_index=(0,) * 8, resampled=(0.0,) * 8):
    return ExploreDraws(
        resample_u=jnp.asarray(resample_u, jnp.float32),
        shift_right=jnp.asarray(shift_right),
        factor_index=jnp.asarray(factor_index, jnp.int32),
        resampled=jnp.asarray(resampled, jnp.float32),
    )


def test_explore_list_by_hand():
    values = {"num_sgd_iter": jnp.array([2.0, 2.0, 1.0, 8.0, 3.0, 4.0, 2.0, 2.0])}
    draws = _draws(
        resample_u=[0.26, 0.9, 0.25, 0.9, 0.9, 0.24, 0.0, 0.9],  # resample when < 0.25
        shift_right=[False, True, False, True, True, False, False, False],
        resampled=[8, 8, 8, 8, 1, 4, 8, 8],
    )
    mutations = {"num_sgd_iter": MUTATIONS["num_sgd_iter"]}
    new, ops = pbt.apply_explore(values, {"num_sgd_iter": draws}, mutations, COPIED, 0.25, FACTORS)
    # m0 left, m1 right, m2 left at the left end, m3 right at the right end, m4's 3 is not in
    # the list (resampled whatever its coin), m5 resampled by its coin, m6 not copied, m7 left.
    np.testing.assert_array_equal(new["num_sgd_iter"], [1, 4, 1, 8, 1, 4, 2, 1])
    L, R, S = pbt.SHIFT_LEFT, pbt.SHIFT_RIGHT, pbt.RESAMPLE
    np.testing.assert_array_equal(ops["num_sgd_iter"], [L, R, L, R, S, S, pbt.NONE, L])


def test_explore_list_matches_a_float32_neighbour():
    # 0.3f + 0.6f is one float32 ulp from 0.9f: still the list's 0.9, so it shifts.
    value = jnp.float32(0.3) + jnp.float32(0.6)
    assert value != jnp.float32(0.9)
    draws = {"x": _draws([0.9], shift_right=[False], factor_index=[0], resampled=[2.0])}
    new, ops = pbt.apply_explore(
        {"x": value[None]}, draws, {"x": (0.1, 0.9, 2.0)}, jnp.array([True]), 0.25, FACTORS
    )
    np.testing.assert_allclose(new["x"], [0.1])
    assert int(ops["x"][0]) == pbt.SHIFT_LEFT


def test_explore_domains_by_hand():
    values = {
        "lr": jnp.full((8,), 1e-3, jnp.float32),
        "batch": jnp.array([33.0, 33.0, 5.0, 7.0, 3.0, 33.0, 33.0, 100.0]),
    }
    coins = [0.25, 0.9, 0.9, 0.26, 0.9, 0.24, 0.9, 0.9]  # resample when < 0.25
    factors = [0, 1, 2, 2, 0, 0, 1, 1]
    draws = {
        "lr": _draws(coins, factor_index=factors, resampled=[5e-4] * 8),
        "batch": _draws(coins, factor_index=factors, resampled=[123.0] * 8),
    }
    domains = {k: MUTATIONS[k] for k in ("lr", "batch")}
    new, ops = pbt.apply_explore(values, draws, domains, COPIED, 0.25, FACTORS)
    lr = np.float32(1e-3) * np.float32([1.2, 0.8, 0.5, 0.5, 1.2, 1.0, 1.0, 0.8])
    lr[5], lr[6] = 5e-4, 1e-3  # m5 resampled, m6 not copied
    np.testing.assert_array_equal(new["lr"], lr)
    # 33 * 1.2 = 39.6 -> 40, 33 * 0.8 = 26.4 -> 26; halves round to even as Python's round:
    # 5 * 0.5 = 2.5 -> 2, 7 * 0.5 = 3.5 -> 4; 3 * 1.2 = 3.6 -> 4; 100 * 0.8 = 80.
    np.testing.assert_array_equal(new["batch"], [40, 26, 2, 4, 4, 123, 33, 80])
    F0, S = pbt.FACTOR_0, pbt.RESAMPLE
    expected_ops = [F0, F0 + 1, F0 + 2, F0 + 2, F0, S, pbt.NONE, F0 + 1]
    np.testing.assert_array_equal(ops["lr"], expected_ops)
    np.testing.assert_array_equal(ops["batch"], expected_ops)


def test_tune_choice_is_multiplied_not_shifted():
    """Tune's quirk, kept: tune.choice is a Domain, so its value is multiplied by a factor."""
    choice = pbt_spec.as_domain(tune.choice([1, 10, 100]), "c")
    assert choice == Domain("choice", categories=(1.0, 10.0, 100.0), integer=True)
    draws = {"c": _draws([0.9, 0.9], [False, False], [0, 1], [100.0, 100.0])}
    new, ops = pbt.apply_explore(
        {"c": jnp.array([10.0, 10.0])}, draws, {"c": choice}, jnp.array([True, True]), 0.25, FACTORS
    )
    np.testing.assert_array_equal(new["c"], [12, 8])  # not 100 or 1
    assert [pbt.operation_name(int(c), FACTORS) for c in ops["c"]] == ["* 1.2", "* 0.8"]


def test_names_without_mutation_pass_through():
    values = {"lr": jnp.full((8,), 1e-3), "gamma": jnp.full((8,), 0.99)}
    new, ops = pbt.explore(
        jax.random.key(0), values, {"lr": MUTATIONS["lr"]}, COPIED, 0.25, FACTORS
    )
    assert new["gamma"] is values["gamma"] and set(ops) == {"lr"}


def test_operation_names_are_tunes():
    names = [pbt.operation_name(code, FACTORS) for code in range(7)]
    assert names == ["", "resample", "shift left", "shift right", "* 1.2", "* 0.8", "* 0.5"]
    assert pbt.FACTOR_1 == pbt.FACTOR_0 + 1


# ------------------------------------------------------------------------------ against Tune


def _tune_quantiles(scores: list[float], fraction: float) -> tuple[list[int], list[int]]:
    """Tune's own ``_quantiles`` on members 0..M-1 with these last scores."""

    class Trial:  # the one thing _quantiles asks of a trial
        def is_finished(self):
            return False

    scheduler = TunePBT(
        metric="m", mode="max", hyperparam_mutations={"a": [1]}, quantile_fraction=fraction
    )
    trials = [Trial() for _ in scores]
    states = [SimpleNamespace(last_score=s) for s in scores]
    scheduler._trial_state = dict(zip(trials, states, strict=True))
    lower, upper = scheduler._quantiles()
    return [trials.index(t) for t in lower], [trials.index(t) for t in upper]


@pytest.mark.parametrize("num_members", [1, 2, 3, 5, 8, 13, 40])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.15, 0.25, 1 / 3, 0.5])
def test_quantiles_and_exploit_match_tune(num_members, fraction):
    rng = np.random.default_rng(num_members)
    # Few distinct values (ties), some NaN (unscored) and infinities; float32 so both agree.
    pool = np.float32([NAN, -np.inf, np.inf, -1.5, 0.0, 0.25, 2.0, 7.0])
    batch = pool[rng.integers(0, len(pool), (30, num_members))]
    bottom, top = jax.jit(jax.vmap(lambda s: pbt.quantiles(s, fraction)))(batch)
    # Each bottom member draws the middle of one interval of [0, 1) per top slot k.
    draws = jnp.asarray(rng.random((30, num_members)), jnp.float32)
    exploit = jax.jit(jax.vmap(lambda s, d: pbt.exploit_from_draws(s, fraction, d)))
    source, copied = exploit(batch, draws)
    for row in range(len(batch)):
        lower, upper = _tune_quantiles([float(s) for s in batch[row]], fraction)
        assert _members(bottom[row]) == sorted(lower)
        assert _members(top[row]) == sorted(upper)
        assert _members(copied[row]) == sorted(lower)
        for i in range(num_members):
            if i in lower:  # random.choice(upper) is upper[floor(u * len(upper))]
                assert source[row, i] == upper[int(draws[row, i] * len(upper))]
            else:
                assert source[row, i] == i


def test_exploit_draws_top_members_uniformly_and_independently():
    keys = jax.random.split(jax.random.key(0), 4000)
    source, copied = jax.jit(jax.vmap(lambda k: pbt.exploit(k, SCORES, 0.25)))(keys)
    assert np.all(np.asarray(copied) == np.asarray(pbt.quantiles(SCORES, 0.25)[0]))
    pairs = np.asarray(source)[:, [1, 4]]  # the two bottom members' sources
    for combo in [(5, 5), (5, 7), (7, 5), (7, 7)]:
        frequency = np.mean(np.all(pairs == combo, axis=1))
        assert abs(frequency - 0.25) < 5 * np.sqrt(0.25 * 0.75 / len(keys))


def _categories(names: list[str], values: np.ndarray, continuous: bool) -> list:
    """One outcome per member: the operation, and the value unless it is a continuous draw."""
    return [
        (n, None if continuous and n == "resample" else round(float(v), 7))
        for n, v in zip(names, values, strict=True)
    ]


def _assert_same_frequencies(ours: list, theirs: list, name: str):
    count = len(ours)
    for outcome in set(ours) | set(theirs):
        f_ours, f_theirs = ours.count(outcome) / count, theirs.count(outcome) / count
        p = (f_ours + f_theirs) / 2
        bound = 4 * np.sqrt(2 * p * (1 - p) / count) + 1e-9
        assert abs(f_ours - f_theirs) <= bound, (name, outcome, f_ours, f_theirs)


def test_explore_matches_tunes_explore():
    """Tune's ``_explore`` on 4000 seeded calls against one `explore` of 4000 members."""
    count = 4000
    tune_mutations = {
        "mid": [1, 2, 4, 8],
        "end": [1, 2, 4, 8],  # at the right end: right shifts are Tune's "(noop)"
        "off": [1, 2, 4, 8],  # 3 is not in the list: always resampled
        "lr": tune.loguniform(1e-4, 1e-2),
        "c": tune.choice([1, 10, 100]),  # ints: multiplied, then rounded
        "n": tune.randint(10, 20),
    }
    config = {"mid": 2, "end": 8, "off": 3, "lr": 1e-3, "c": 10, "n": 15}
    random.seed(0)
    np.random.seed(0)
    theirs = [tune_explore(config, tune_mutations, 0.25, (1.2, 0.8), None) for _ in range(count)]
    mutations = {k: pbt_spec.as_domain(v, k) for k, v in tune_mutations.items()}
    values = {k: jnp.full((count,), v, jnp.float32) for k, v in config.items()}
    copied = jnp.ones((count,), bool)
    new, ops = jax.jit(lambda k, v: pbt.explore(k, v, mutations, copied, 0.25, (1.2, 0.8)))(
        jax.random.key(0), values
    )
    for name in tune_mutations:
        continuous = name == "lr"
        names = [pbt.operation_name(int(c), (1.2, 0.8)) for c in ops[name]]
        ours = _categories(names, np.asarray(new[name], np.float64), continuous)
        their_names = [o[name].replace(" (noop)", "") for _, o in theirs]
        their_values = np.float32([c[name] for c, _ in theirs])  # as float32, as ours
        _assert_same_frequencies(ours, _categories(their_names, their_values, continuous), name)


TUNE_DOMAINS = {
    "uniform": tune.uniform(-2.0, 3.0),
    "loguniform": tune.loguniform(1e-5, 1e-1),
    "randn": tune.randn(1.0, 2.0),
    "quniform": tune.quniform(0.1, 1.0, 0.1),
    "qloguniform": tune.qloguniform(1e-4, 1e-2, 1e-4),
    "qrandn": tune.qrandn(0.0, 1.0, 0.5),
    "randint": tune.randint(3, 11),
    "lograndint": tune.lograndint(1, 1000),
    "qrandint": tune.qrandint(8, 64, 8),  # upper bound inclusive
    "qrandint_q1": tune.qrandint(3, 11, 1),  # ... except with q = 1
    "qlograndint": tune.qlograndint(10, 1000, 10),
    "choice": tune.choice([0.1, 1.0, 10.0]),
}


@pytest.mark.parametrize("name", list(TUNE_DOMAINS))
def test_sample_matches_tunes_sampler(name):
    tune_domain, count = TUNE_DOMAINS[name], 4000
    theirs = np.float32(tune_domain.sample(size=count, random_state=np.random.default_rng(0)))
    domain = pbt_spec.as_domain(tune_domain, name)
    ours = np.asarray(pbt.sample(jax.random.key(0), domain, (count,)))
    assert ours.dtype == np.float32 and ours.shape == (count,)
    if domain.q is not None:
        np.testing.assert_allclose(ours, np.round(ours / domain.q) * domain.q, rtol=1e-6)
    # Two-sample Kolmogorov-Smirnov at the 0.1% level; it is monotone-invariant, so it checks
    # the log-values of loguniform too. Discrete supports make it conservative.
    # Six significant digits: a float32 multiple of q may sit an ulp from Tune's float64 one.
    ours, theirs = (np.float32([f"{x:.6g}" for x in v]) for v in (ours, theirs))
    grid = np.union1d(ours, theirs)
    cdf = [np.searchsorted(np.sort(x), grid, side="right") / count for x in (ours, theirs)]
    assert np.max(np.abs(cdf[0] - cdf[1])) < 1.95 * np.sqrt(2 / count)
    if name in ("randint", "qrandint", "qrandint_q1", "choice", "qlograndint"):
        assert set(np.unique(ours)) == set(np.unique(theirs))  # the same support, both ends
    if name in ("uniform", "loguniform", "randint", "lograndint"):
        assert domain.low <= ours.min() and ours.max() <= domain.high
        assert theirs.min() >= domain.low


def test_sample_shapes_and_integers():
    ours = pbt.sample(jax.random.key(1), Domain("lograndint", 1, 5), (3, 7))
    assert ours.shape == (3, 7) and np.all(np.asarray(ours) == np.round(ours))
    assert np.asarray(ours).max() <= 4  # [low, high)
    assert pbt.sample(jax.random.key(1), Domain("uniform", 0, 1)).shape == ()


# ----------------------------------------------------------------------------------- jit, M


def test_explore_and_exploit_compile_once_with_traced_inputs():
    mutations = MUTATIONS

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(key, scores, values):
        source, copied = pbt.exploit(key, scores, 0.25)
        values = {k: v[source] for k, v in values.items()}
        return pbt.explore(key, values, mutations, copied, 0.25, (1.2, 0.8))

    values = {"num_sgd_iter": jnp.full((8,), 2.0), "lr": jnp.full((8,), 1e-3)}
    values["batch"] = jnp.arange(8, dtype=jnp.float32) * 32 + 32
    for seed in range(3):
        new, ops = step(jax.random.key(seed), SCORES + seed, values)
    unchanged = ~np.asarray(pbt.quantiles(SCORES, 0.25)[0])
    for name in values:
        np.testing.assert_array_equal(np.asarray(new[name])[unchanged], values[name][unchanged])
        assert np.all(np.asarray(ops[name])[unchanged] == pbt.NONE)
        assert np.all(np.asarray(ops[name])[~unchanged] != pbt.NONE)


def test_one_member_never_exploits():
    scores = jnp.array([1.0])
    bottom, top = pbt.quantiles(scores, 0.5)
    source, copied = jax.jit(lambda k, s: pbt.exploit(k, s, 0.5))(jax.random.key(0), scores)
    assert not bottom.any() and not top.any() and not copied.any() and int(source[0]) == 0
    lr = {"lr": MUTATIONS["lr"]}
    new, ops = pbt.explore(jax.random.key(0), {"lr": jnp.array([1e-3])}, lr, copied, 0.25, FACTORS)
    assert float(new["lr"][0]) == pytest.approx(1e-3) and int(ops["lr"][0]) == pbt.NONE


def test_512_members():
    scores = jax.random.normal(jax.random.key(0), (512,))
    source, copied = jax.jit(lambda k, s: pbt.exploit(k, s, 0.25))(jax.random.key(1), scores)
    _, top = pbt.quantiles(scores, 0.25)
    assert int(copied.sum()) == 128 and bool(jnp.all(top[source[copied]]))
    values = {"lr": jnp.full((512,), 1e-3)}
    new, _ = pbt.explore(jax.random.key(2), values, {"lr": MUTATIONS["lr"]}, copied, 0.25, FACTORS)
    assert new["lr"].shape == (512,)


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(kind="beta"), "kind must be one of"),
        (dict(kind="loguniform", low=0.0, high=1.0), "low > 0"),
        (dict(kind="uniform", low=1.0, high=1.0), "low < high"),
        (dict(kind="choice"), "non-empty categories"),
        (dict(kind="randint", low=1.5, high=4), "whole numbers"),
        (dict(kind="randint", low=1, high=4, q=8), "no multiple of q=8"),
        (dict(kind="uniform", low=0.05, high=1.0, q=0.1), "multiples of q"),
        (dict(kind="normal", sd=0.0), "sd > 0"),
    ],
)
def test_domain_rejects(fields, words):
    with pytest.raises(ValueError, match=words):
        Domain(**fields)


# ------------------------------------------------------------------------------- pbt_spec


def _spec(**fields):
    fields = {
        "perturbation_interval": 50_000,
        "hyperparam_mutations": {"lr": [1e-4, 1e-3]},
    } | fields
    return pbt_spec.PopulationBasedTraining(**fields)


def test_spec_defaults_are_tunes():
    ours, theirs = _spec(), TunePBT(hyperparam_mutations={"lr": [1e-4, 1e-3]})
    for name in ("burn_in_period", "quantile_fraction", "resample_probability"):
        assert getattr(ours, name) == getattr(theirs, f"_{name}")
    assert ours.perturbation_factors == tuple(theirs._perturbation_factors)
    assert ours.custom_explore_fn is None and ours.mode == "max" and ours.metric_op == 1.0
    assert _spec(mode="min").metric_op == -1.0


def test_from_tune_round_trip():
    mutations = {
        "lr": tune.loguniform(1e-5, 1e-2),
        "num_epochs": [1, 2, 4],
        "train_batch_size": tune.qrandint(256, 4096, 256),
        "entropy_coeff": tune.quniform(0.0, 0.05, 0.005),
    }
    scheduler = TunePBT(
        time_attr="num_env_steps_sampled_lifetime",
        metric="env_runners/episode_return_mean",
        mode="min",
        perturbation_interval=100_000,
        burn_in_period=200_000,
        hyperparam_mutations=mutations,
        quantile_fraction=0.5,
        resample_probability=0.1,
        perturbation_factors=(2.0, 0.5),
        synch=True,
    )
    ours = pbt_spec.from_tune(scheduler)
    assert (ours.mode, ours.perturbation_interval, ours.burn_in_period) == ("min", 100_000, 200_000)
    assert (ours.quantile_fraction, ours.resample_probability) == (0.5, 0.1)
    assert ours.perturbation_factors == (2.0, 0.5) and ours.synch
    assert ours.mutations == {
        "lr": Domain("loguniform", 1e-5, 1e-2),
        "num_epochs": (1.0, 2.0, 4.0),
        "train_batch_size": Domain("randint", 256, 4096, q=256),
        "entropy_coeff": Domain("uniform", 0.0, 0.05, q=0.005),
    }


def test_from_tune_with_tunes_defaults_says_what_to_pass():
    with pytest.raises(ValueError) as error:
        pbt_spec.from_tune(TunePBT(metric="m", mode="max", hyperparam_mutations={"a": [1, 2]}))
    message = str(error.value)
    assert "time_attr='time_total_s'" in message
    assert "pass time_attr='num_env_steps_sampled_lifetime'" in message
    assert "synch=False" in message and "pass synch=True" in message


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(time_attr="training_iteration"), "time_attr='training_iteration'"),
        (dict(mode="maximize"), "mode='maximize': must be 'max' or 'min'"),
        (dict(perturbation_interval=0), "perturbation_interval=0: must be .* > 0"),
        (dict(quantile_fraction=0.6), "quantile_fraction=0.6: must be between 0 and 0.5"),
        (dict(perturbation_factors=()), r"perturbation_factors=\(\): must be a non-empty"),
        (dict(custom_explore_fn=lambda c: c), "custom_explore_fn=.*hyperparam_mutations"),
        (dict(synch=False), r"synch=False: .*\(pass synch=True\)"),
        (dict(hyperparam_mutations={}), "hyperparam_mutations={}: must be a dict of at least"),
        (
            dict(hyperparam_mutations={"model": {"lr": [1, 2]}}),
            r"hyperparam_mutations\['model'\]=.*nested",
        ),
        (
            dict(hyperparam_mutations={"lr": lambda: 1e-3}),
            r"hyperparam_mutations\['lr'\]=<function.*use tune.uniform/loguniform/randint/choice",
        ),
        (
            dict(hyperparam_mutations={"lr": tune.sample_from(lambda c: 1e-3)}),
            r"hyperparam_mutations\['lr'\]=Function.*tune.sample_from.*or a list",
        ),
        (
            dict(hyperparam_mutations={"lr": tune.grid_search([1e-4, 1e-3])}),
            "tune.grid_search is not a distribution",
        ),
        (dict(hyperparam_mutations={"act": ["relu", "tanh"]}), "must hold numbers"),
        (dict(hyperparam_mutations={"x": tune.choice([True, False])}), "no bool"),
        (dict(hyperparam_mutations={"x": tune.uniform(3, 1)}), r"\['x'\]: .*low < high"),
    ],
)
def test_spec_rejects(fields, words):
    with pytest.raises(ValueError, match=words):
        _spec(**fields)


def test_spec_lists_every_problem_at_once():
    with pytest.raises(ValueError) as error:
        _spec(mode="up", synch=False, quantile_fraction=-1)
    assert all(f in str(error.value) for f in ("mode=", "synch=", "quantile_fraction="))


def test_importing_pbt_needs_no_ray():
    code = (
        "import sys, impala_jax.rllib.pbt_spec as s, impala_jax.core.pbt; "
        "s.PopulationBasedTraining(perturbation_interval=1, hyperparam_mutations={'a': [1]}); "
        "assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules), 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def test_the_search_space_functions_without_ray_are_tunes_domains():
    from ray import tune

    from impala_jax.rllib.pbt_spec import choice, loguniform, randint, randn, uniform

    pairs = [
        (loguniform(1e-4, 1e-2), tune.loguniform(1e-4, 1e-2)),
        (uniform(0.1, 0.5), tune.uniform(0.1, 0.5)),
        (randn(1.0, 2.0), tune.randn(1.0, 2.0)),
        (randint(0, 8), tune.randint(0, 8)),
        (choice([1, 2, 4]), tune.choice([1, 2, 4])),
        (choice([0.9, 0.99]), tune.choice([0.9, 0.99])),
    ]
    for ours, theirs in pairs:
        assert ours == pbt_spec.as_domain(theirs, "x")
