"""Ray Tune's ``PopulationBasedTraining``, frozen, for a population trained in one program.

The fields, their names and defaults are Tune 2.60's (``ray.tune.schedulers.pbt``), and so are
the validation rules; `from_tune` reads a real Tune scheduler. Where the one-program population
cannot do what Tune does, the field raises a ValueError that names it, its value and the fix:

- ``time_attr`` is only ``"num_env_steps_sampled_lifetime"``: the compiled program counts env
  steps, so ``perturbation_interval`` and ``burn_in_period`` are env steps.
- ``synch`` is only True: all members are perturbed at once (Tune's synchronous mode).
- ``custom_explore_fn`` and Python callables as mutations cannot run inside a compiled program.
- Nested dicts of mutations are not supported: our hyperparameters are flat names.

The exploit and explore math is ``impala_jax/core/pbt.py``; `as_domain` turns each mutation into
its plain data. Ray is optional: it is imported only to read a Tune search space, and only when
one is passed (so ray was imported already).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from impala_jax.core.pbt import Domain, Mutation
from impala_jax.rllib.values import is_int, is_real, is_search_space

TIME_ATTR = "num_env_steps_sampled_lifetime"
MODES = ("max", "min")
_SUPPORTED = "use tune.uniform/loguniform/randint/choice or a list"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PopulationBasedTraining:
    """Population-based training (Jaderberg et al. 2017, arXiv:1711.09846) with Tune's fields."""

    # The result key that measures progress. Tune's default is "time_total_s"; here it is the
    # only supported one, env steps, which the compiled program counts.
    time_attr: str = TIME_ATTR
    # The result key ranked by; Tune's is None (set later by TuneConfig), ours RLlib's return.
    metric: str = "env_runners/episode_return_mean"
    # "max" or "min": whether a higher or a lower metric is better (Tune: None until set).
    mode: str = "max"
    # Env steps between perturbations, > 0 (Tune's default, 60.0, is seconds: none here).
    perturbation_interval: float
    # No perturbation before this many env steps (Tune's default).
    burn_in_period: float = 0.0
    # Name -> a list/tuple of values (shifted between), a Tune search space or a core Domain
    # (resampled or multiplied); at least one.
    hyperparam_mutations: Mapping[str, Any]
    # The bottom quantile copies the top one, each this fraction of the population, in [0, 0.5].
    quantile_fraction: float = 0.25
    # Chance that an explored value is resampled rather than shifted or multiplied (Tune's).
    resample_probability: float = 0.25
    # A Domain's value is multiplied by one of these, drawn uniformly (Tune's).
    perturbation_factors: tuple[float, ...] = (1.2, 0.8)
    # Tune's Python hook after explore; must be None here (it cannot run on device).
    custom_explore_fn: Callable | None = None
    # Must be True: the population is perturbed all at once (Tune's default is False).
    synch: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.hyperparam_mutations, Mapping):
            object.__setattr__(self, "hyperparam_mutations", dict(self.hyperparam_mutations))
        if isinstance(self.perturbation_factors, Sequence) and not isinstance(
            self.perturbation_factors, str
        ):
            object.__setattr__(self, "perturbation_factors", tuple(self.perturbation_factors))
        problems = _problems(self)
        if problems:
            raise ValueError("PopulationBasedTraining: " + " ".join(problems))

    @property
    def mutations(self) -> dict[str, Mutation]:
        """name -> `Domain` or tuple of floats, the static argument of ``core.pbt.explore``."""
        return {
            name: as_domain(value, f"hyperparam_mutations[{name!r}]")
            for name, value in self.hyperparam_mutations.items()
        }

    @property
    def metric_op(self) -> float:
        """Tune's ``_metric_op``: scores are ``metric_op * metric``, so higher is better."""
        return 1.0 if self.mode == "max" else -1.0


def _problems(p: PopulationBasedTraining) -> list[str]:
    """Each invalid field as "field=value: why (fix)."; Tune's rules, and the one-program ones."""
    problems = []

    def check(name: str, good: bool, why: str) -> None:
        if not good:
            problems.append(f"{name}={getattr(p, name)!r}: {why}.")

    check(
        "time_attr",
        p.time_attr == TIME_ATTR,
        "the population is perturbed inside one compiled program, which counts env steps "
        f"(pass time_attr={TIME_ATTR!r}; perturbation_interval and burn_in_period are then "
        "env steps)",
    )
    check("metric", isinstance(p.metric, str) and p.metric != "", "must name a result key")
    check("mode", p.mode in MODES, "must be 'max' or 'min'")
    interval = p.perturbation_interval
    good = is_real(interval) and math.isfinite(interval) and interval > 0
    check("perturbation_interval", good, "must be a number of env steps > 0")
    check("burn_in_period", is_real(p.burn_in_period), "must be a number of env steps")
    fraction = p.quantile_fraction
    check(
        "quantile_fraction",
        is_real(fraction) and 0 <= fraction <= 0.5,
        "must be between 0 and 0.5 (0: no exploitation)",
    )
    check("resample_probability", is_real(p.resample_probability), "must be a number")
    factors = p.perturbation_factors
    good = isinstance(factors, tuple) and len(factors) > 0 and all(map(is_real, factors))
    check("perturbation_factors", good, "must be a non-empty tuple of numbers, e.g. (1.2, 0.8)")
    check(
        "custom_explore_fn",
        p.custom_explore_fn is None,
        "a Python function cannot run inside the compiled program that perturbs the "
        f"population (express the exploration as hyperparam_mutations: {_SUPPORTED})",
    )
    check(
        "synch",
        p.synch is True,
        "the population trains in one program and is perturbed all at once (pass synch=True)",
    )
    return problems + _mutation_problems(p.hyperparam_mutations)


def _mutation_problems(mutations: Any) -> list[str]:
    if not isinstance(mutations, Mapping) or not mutations:
        return [
            f"hyperparam_mutations={mutations!r}: must be a dict of at least one name -> "
            f"mutation ({_SUPPORTED}), as Tune requires without custom_explore_fn."
        ]
    problems = []
    for name, value in mutations.items():
        try:
            if not isinstance(name, str):
                raise ValueError(f"hyperparam_mutations key {name!r}: must be a str.")
            as_domain(value, f"hyperparam_mutations[{name!r}]")
        except ValueError as error:
            problems.append(f"{error}")
    return problems


def from_tune(scheduler: Any) -> PopulationBasedTraining:
    """Ours from a ``ray.tune.schedulers.PopulationBasedTraining``; raises where it asks for
    what the one-program population cannot do (see the module docstring). Its metric and mode,
    when left None for TuneConfig to set, take our defaults."""
    defaults = PopulationBasedTraining.__dataclass_fields__
    return PopulationBasedTraining(
        time_attr=scheduler._time_attr,
        metric=scheduler._metric or defaults["metric"].default,
        mode=scheduler._mode or defaults["mode"].default,
        perturbation_interval=scheduler._perturbation_interval,
        burn_in_period=scheduler._burn_in_period,
        hyperparam_mutations=scheduler._hyperparam_mutations,
        quantile_fraction=scheduler._quantile_fraction,
        resample_probability=scheduler._resample_probability,
        perturbation_factors=tuple(scheduler._perturbation_factors),
        custom_explore_fn=scheduler._custom_explore_fn,
        synch=scheduler._synch,
    )


def as_domain(value: Any, field: str) -> Mutation:
    """A mutation as plain data: a list/tuple -> tuple of floats (shifted between), a Tune
    search space or a `Domain` -> `Domain` (resampled or multiplied). Raises a ValueError that
    names `field` for anything else."""
    if isinstance(value, Domain):
        return value
    if isinstance(value, dict):
        if "grid_search" in value:
            why = f"tune.grid_search is not a distribution to explore ({_SUPPORTED})"
        else:
            why = "nested mutations are not supported (give each hyperparameter its own key)"
        raise ValueError(f"{field}={value!r}: {why}.")
    if isinstance(value, list | tuple):
        if not value or not all(is_real(x) or isinstance(x, bool) for x in value):
            why = "a list must hold numbers (hyperparameters are float32 arrays here)"
            raise ValueError(f"{field}={value!r}: {why}.")
        return tuple(float(x) for x in value)
    if is_search_space(value):
        return _from_tune_domain(value, field)
    if callable(value):
        why = "a Python function cannot be sampled inside a compiled program"
        raise ValueError(f"{field}={value!r}: {why} ({_SUPPORTED}).")
    raise ValueError(f"{field}={value!r}: not a mutation ({_SUPPORTED}).")


def _from_tune_domain(value: Any, field: str) -> Domain:
    """A Tune ``Float``, ``Integer`` or ``Categorical`` domain as a `Domain`."""
    from ray.tune.search import sample as ts  # a Tune value was passed: ray is imported already

    sampler, q = value.get_sampler(), None
    if isinstance(sampler, ts.Quantized):
        sampler, q = sampler.get_sampler(), sampler.q
    if isinstance(sampler, ts.Categorical._Uniform):
        categories = value.categories
        if not all(map(is_real, categories)):
            why = "tune.choice needs numbers (no str, no bool): hyperparameters are float32"
            raise ValueError(f"{field}={_show(value)}: {why}.")
        integer = all(map(is_int, categories))  # Tune rounds a product when the value is an int
        return _domain(field, kind="choice", categories=categories, integer=integer)
    if isinstance(sampler, ts.Integer._Uniform | ts.Integer._LogUniform):
        kind = "randint" if isinstance(sampler, ts.Integer._Uniform) else "lograndint"
        return _domain(field, kind=kind, low=value.lower, high=value.upper, q=q)
    if isinstance(sampler, ts.Float._Uniform | ts.Float._LogUniform):
        kind = "uniform" if isinstance(sampler, ts.Float._Uniform) else "loguniform"
        return _domain(field, kind=kind, low=value.lower, high=value.upper, q=q)
    if isinstance(sampler, ts.Float._Normal):
        return _domain(field, kind="normal", mean=sampler.mean, sd=sampler.sd, q=q)
    why = "tune.sample_from, grid and custom search spaces cannot be sampled on device"
    raise ValueError(f"{field}={_show(value)}: {why} ({_SUPPORTED}).")


def _show(value: Any) -> str:
    """A Tune search space as its class, domain and sampler (its repr is only an address)."""
    try:
        return f"{type(value).__name__}({value.domain_str}, {value.get_sampler()})"
    except Exception:  # a custom Domain may lack either; its repr is the best left
        return repr(value)


def _domain(field: str, **fields: Any) -> Domain:
    try:
        return Domain(**fields)
    except ValueError as error:
        raise ValueError(f"{field}: {error}.") from None


# Ray Tune's search-space functions for a population in one program, without importing ray
# (an import of ray.tune costs over a second at start-up): each returns the core Domain that
# `as_domain` makes of Tune's object of the same name.


def uniform(low: float, high: float) -> Domain:
    """``tune.uniform(low, high)``."""
    return Domain(kind="uniform", low=float(low), high=float(high))


def loguniform(low: float, high: float) -> Domain:
    """``tune.loguniform(low, high)``."""
    return Domain(kind="loguniform", low=float(low), high=float(high))


def randn(mean: float = 0.0, sd: float = 1.0) -> Domain:
    """``tune.randn(mean, sd)``."""
    return Domain(kind="normal", mean=float(mean), sd=float(sd))


def randint(low: int, high: int) -> Domain:
    """``tune.randint(low, high)``: integers in [low, high)."""
    return Domain(kind="randint", low=float(low), high=float(high))


def choice(categories: Sequence[float]) -> Domain:
    """``tune.choice(categories)``; PBT multiplies its values as Tune does (core/pbt.py)."""
    values = tuple(categories)
    return Domain(kind="choice", categories=values, integer=all(is_int(v) for v in values))
