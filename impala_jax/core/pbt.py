"""Population-based training's exploit and explore (Jaderberg et al. 2017, arXiv:1711.09846,
section 3.1 and appendix A.1), with the rules of Ray Tune 2.60's ``PopulationBasedTraining``.

A population of M members is held as arrays with a leading member axis, so one compiled program
can train every member and run this step on device. All members are perturbed at once, as
Tune's ``synch=True``:

- `quantiles` is Tune's ``_quantiles``: the bottom and top ``quantile_fraction`` of the members
  with a score.
- `exploit` is the lower-quantile branch of Tune's ``_checkpoint_or_exploit``: each bottom
  member copies a top member drawn uniformly (``random.choice(upper_quantile)``).
- `explore` is Tune's ``_explore``: each copied member's hyperparameters are resampled, shifted
  along a list, or multiplied by a perturbation factor.

Randomness is drawn apart from its use (`exploit_draws`, `explore_draws`), so the deterministic
halves (`exploit_from_draws`, `apply_explore`) can be checked against hand-computed draws.

Scores are "higher is better": for ``mode="min"`` the caller multiplies them by -1 first, as
Tune's ``_metric_op``. A hyperparameter is float32 [M]; an integer one holds whole numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Codes of `explore`'s operations, one int32 per member and hyperparameter; `operation_name`
# spells them as Tune's ``_explore`` does.
NONE = 0  # not copied this round: the value is untouched
RESAMPLE = 1  # a fresh draw (from the list, or from the Domain)
SHIFT_LEFT = 2  # list: the neighbour to the left (or the same value at the left end)
SHIFT_RIGHT = 3  # list: the neighbour to the right (or the same value at the right end)
FACTOR_0 = 4  # Domain: multiplied by perturbation_factors[0]; FACTOR_0 + i for factor i
FACTOR_1 = 5

KINDS = ("uniform", "loguniform", "normal", "choice", "randint", "lograndint")
_INTEGER_KINDS = ("randint", "lograndint")
_BOUNDED_KINDS = ("uniform", "loguniform", "randint", "lograndint")

# Relative tolerance of "is the value in the list": values are float32, the list was written in
# Python floats, so an entry computed in float32 may sit a few ulps (1.2e-7 each) away.
_MATCH_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Domain:
    """A search distribution as plain data, sampled as Tune's sampler of the same kind.

    ``kind``, with Tune's constructor and support:

    - ``"uniform"``: ``tune.uniform(low, high)``, [low, high).
    - ``"loguniform"``: ``tune.loguniform(low, high)``, uniform in log space. Tune 2.60 ignores
      (and deprecates) ``base``: log-uniform is the same distribution in every base.
    - ``"normal"``: ``tune.randn(mean, sd)``.
    - ``"choice"``: ``tune.choice(categories)``, each category equally likely.
    - ``"randint"``: ``tune.randint(low, high)``, integers in [low, high).
    - ``"lograndint"``: ``tune.lograndint(low, high)``, floor of a log-uniform draw in [low, high).

    ``q`` is Tune's ``Quantized``: a float kind's bounds must be multiples of ``q``, and its draw
    is rounded to a multiple of ``q`` (half to even); an integer kind draws a multiple of ``q``
    uniformly (or log-uniformly) by its index, with ``high`` inclusive unless ``q == 1``.

    ``integer``: `explore` rounds a multiplied value to a whole number, as Tune does when the
    member's value is a Python int. Always true for randint and lograndint; for ``choice``, set
    it when the categories are ints (`as_domain` does).
    """

    kind: str
    low: float | None = None
    high: float | None = None
    mean: float = 0.0
    sd: float = 1.0
    categories: tuple[float, ...] = ()
    integer: bool = False
    q: float | None = None

    def __post_init__(self) -> None:
        problem = _domain_problem(self)
        if problem:
            raise ValueError(f"{self!r}: {problem}")
        # Normalised once, so two equal domains hash equal as static arguments of a jit.
        object.__setattr__(self, "categories", tuple(float(c) for c in self.categories))
        if self.kind in _INTEGER_KINDS:
            object.__setattr__(self, "integer", True)


def _domain_problem(d: Domain) -> str | None:
    """What is wrong with `d`, as a sentence with the fix; None when it is valid."""
    if d.kind not in KINDS:
        return f"kind must be one of {KINDS}"
    if d.kind == "choice":
        if not d.categories or d.q is not None:
            return "choice needs a non-empty categories tuple and no q"
        return None
    if d.q is not None and not d.q > 0:
        return "q must be > 0 (or None for no quantization)"
    if d.kind == "normal":
        return None if d.sd > 0 else "normal needs sd > 0 (Tune asserts it)"
    if d.low is None or d.high is None or not d.low < d.high:
        return f"{d.kind} needs numbers low < high"
    if d.kind in ("loguniform", "lograndint") and not d.low > 0:
        return f"{d.kind} needs low > 0"
    whole = all(float(x).is_integer() for x in (d.low, d.high, d.q or 1))
    if d.kind in _INTEGER_KINDS and not whole:
        return f"{d.kind} needs whole numbers low, high and q"
    if d.q is None:
        return None
    on_grid = all(math.isclose(x / d.q, round(x / d.q)) for x in (d.low, d.high))
    if d.kind not in _INTEGER_KINDS and not on_grid:
        return f"low and high must be multiples of q={d.q} (Tune's Float.quantized)"
    low, high = _quantized_bounds(d)
    if high < low:
        return f"no multiple of q={d.q} lies between low={d.low} and high={d.high}"
    return None


def _grid_index(bound: float, q: float, round_inward: Callable[[float], float]) -> float:
    """``bound``'s index on the grid of multiples of q, rounded inwards unless it is on the grid
    within ``math.isclose`` (Tune's ``Quantized._grid_index``)."""
    if not math.isfinite(bound):
        return bound
    scaled = bound / q
    nearest = round(scaled)
    return nearest if math.isclose(scaled, nearest) else round_inward(scaled)


def _quantized_bounds(d: Domain) -> tuple[float, float]:
    """The grid indices (integer kinds) or values (float kinds) that Tune's Quantized draws
    between, both inclusive."""
    low, high = _grid_index(d.low, d.q, math.ceil), _grid_index(d.high, d.q, math.floor)
    return (low, high) if d.kind in _INTEGER_KINDS else (low * d.q, high * d.q)


def sample(key: jax.Array, domain: Domain, shape: Sequence[int] = ()) -> jax.Array:
    """Draws from `domain` as Tune's ``domain.sample()`` does; float32 of ``shape``."""
    shape = tuple(shape)
    if domain.kind == "choice":
        index = jax.random.randint(key, shape, 0, len(domain.categories))
        return jnp.asarray(domain.categories, jnp.float32)[index]
    if domain.kind in _INTEGER_KINDS:
        return _sample_integer(key, domain, shape)
    return _sample_float(key, domain, shape)


def _sample_float(key: jax.Array, d: Domain, shape: tuple[int, ...]) -> jax.Array:
    if d.kind == "normal":
        x = d.mean + d.sd * jax.random.normal(key, shape)
    else:
        low, high = _quantized_bounds(d) if d.q is not None else (d.low, d.high)
        if d.kind == "uniform":
            x = jax.random.uniform(key, shape, minval=low, maxval=high)
        else:
            log_x = jax.random.uniform(key, shape, minval=math.log(low), maxval=math.log(high))
            # exp in float32 may land a rounding step outside the bounds.
            x = jnp.clip(jnp.exp(log_x), low, high)
    if d.q is not None:
        # A float32 multiple of q may sit an ulp from Tune's float64 one: 9 * 0.1f is 0.90000004.
        x = jnp.round(x / d.q) * d.q
    return x.astype(jnp.float32)


def _sample_integer(key: jax.Array, d: Domain, shape: tuple[int, ...]) -> jax.Array:
    low, high, step = int(d.low), int(d.high), 1
    if d.q is not None:
        # Tune draws the grid index; its upper bound is inclusive except for q == 1.
        first, last = _quantized_bounds(d)
        low, high, step = int(first), int(last) + (0 if d.q == 1 else 1), d.q
    if d.kind == "randint":
        index = jax.random.randint(key, shape, low, high)
    else:
        log_x = jax.random.uniform(key, shape, minval=math.log(low), maxval=math.log(high))
        # Tune floors a float64 draw; float32's exp may round up onto ``high`` itself.
        index = jnp.clip(jnp.floor(jnp.exp(log_x)), low, high - 1)
    return (index * step).astype(jnp.float32)


def _quantile_sizes(num_members: int, quantile_fraction: float) -> np.ndarray:
    """int32 [M + 1]: Tune's quantile size for each count n of scored members, computed here in
    Python floats so that ``ceil(n * fraction)`` rounds exactly as Tune's does."""
    sizes = np.zeros(num_members + 1, np.int32)
    for n in range(2, num_members + 1):  # n <= 1 gives no quantiles
        size = math.ceil(n * quantile_fraction)
        sizes[n] = math.floor(n / 2) if size > n / 2 else size
    return sizes


def _ranks(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each member's place in Tune's ascending sort, and the number n of scored members.

    Tune drops NaN scores (``math.isnan``; infinities stay) and sorts the rest with Python's
    stable sort, so equal scores keep member order. Counting, for each member, the members that
    sort before it uses exactly Python's ``<`` and ``==``. Members with a NaN score take the
    places n..M-1 in member order, so the ranks are a permutation.

    Args:
      scores: float [M].

    Returns:
      ``(rank, n)``: int32 [M] and an int32 scalar.
    """
    scored = ~jnp.isnan(scores)
    member = jnp.arange(scores.shape[0])
    earlier = member[None, :] < member[:, None]  # [i, j]: j comes before i in member order
    before = (scores[None, :] < scores[:, None]) | ((scores[None, :] == scores[:, None]) & earlier)
    n = jnp.sum(scored, dtype=jnp.int32)
    rank_scored = jnp.sum(before & scored[None, :], axis=1, dtype=jnp.int32)
    rank_unscored = n + jnp.sum(earlier & ~scored[None, :], axis=1, dtype=jnp.int32)
    return jnp.where(scored, rank_scored, rank_unscored), n


def quantiles(scores: jax.Array, quantile_fraction: float) -> tuple[jax.Array, jax.Array]:
    """Tune's ``_quantiles``: the bottom and the top ``quantile_fraction`` of the scored members.

    With n members whose score is not NaN, each quantile holds ``ceil(n * quantile_fraction)``
    members, capped at ``floor(n / 2)``; ``n <= 1`` gives none.

    Args:
      scores: float [M], higher is better; NaN for a member without a score.
      quantile_fraction: in [0, 0.5], static.

    Returns:
      ``(bottom, top)``: bool [M] each, disjoint.
    """
    chex.assert_rank(scores, 1)
    rank, n = _ranks(scores)
    size = jnp.asarray(_quantile_sizes(scores.shape[0], quantile_fraction))[n]
    return rank < size, (rank >= n - size) & (rank < n)


def exploit_draws(key: jax.Array, num_members: int) -> jax.Array:
    """float [M] uniform in [0, 1): each member's draw of which top member it would copy."""
    return jax.random.uniform(key, (num_members,))


def exploit_from_draws(
    scores: jax.Array, quantile_fraction: float, draws: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`exploit` with its random draws given.

    Tune's upper quantile is the list ``trials[n - k:]`` of the k best in ascending order, and a
    bottom member copies ``upper_quantile[floor(draw * k)]``.

    Args:
      scores: float [M], higher is better; NaN for a member without a score.
      quantile_fraction: in [0, 0.5], static.
      draws: float [M] in [0, 1), as `exploit_draws`.

    Returns:
      ``(source, copied)``: int32 [M], the member whose parameters and hyperparameters member i
      takes (i itself unless copied), and bool [M], the bottom quantile.
    """
    chex.assert_rank([scores, draws], 1)
    chex.assert_equal_shape([scores, draws])
    num_members = scores.shape[0]
    rank, n = _ranks(scores)
    size = jnp.asarray(_quantile_sizes(num_members, quantile_fraction))[n]
    member = jnp.arange(num_members, dtype=jnp.int32)
    member_at_rank = jnp.zeros_like(member).at[rank].set(member)
    pick = jnp.clip(jnp.floor(draws * size).astype(jnp.int32), 0, jnp.maximum(size - 1, 0))
    chosen = member_at_rank[jnp.clip(n - size + pick, 0, num_members - 1)]
    copied = rank < size
    return jnp.where(copied, chosen, member), copied


def exploit(
    key: jax.Array, scores: jax.Array, quantile_fraction: float
) -> tuple[jax.Array, jax.Array]:
    """Each bottom-quantile member copies a top-quantile member drawn uniformly and
    independently; see `exploit_from_draws` for the arguments and results."""
    return exploit_from_draws(scores, quantile_fraction, exploit_draws(key, scores.shape[0]))


Mutation = Domain | tuple[float, ...]


class ExploreDraws(NamedTuple):
    """One hyperparameter's random draws for `apply_explore`, each [M]."""

    resample_u: jax.Array  # float in [0, 1): resample when < resample_probability
    shift_right: jax.Array  # bool: a list shift goes right, else left
    factor_index: jax.Array  # int32 in [0, len(perturbation_factors))
    resampled: jax.Array  # float32: a uniformly chosen list element, or a sample of the Domain


def explore_draws(
    key: jax.Array, num_members: int, mutations: Mapping[str, Mutation], num_factors: int
) -> dict[str, ExploreDraws]:
    """The draws of Tune's ``_explore`` for every member and mutation: ``random.random()`` for
    the resample coin, ``random.choice([-1, 1])``, ``random.choice(perturbation_factors)``, and
    ``random.choice(list)`` or ``domain.sample()``."""
    shape = (num_members,)
    draws = {}
    for i, (name, spec) in enumerate(mutations.items()):
        coin, shift, factor, fresh = jax.random.split(jax.random.fold_in(key, i), 4)
        if isinstance(spec, Domain):
            resampled = sample(fresh, spec, shape)
        else:
            choices = jnp.asarray(spec, jnp.float32)
            resampled = choices[jax.random.randint(fresh, shape, 0, len(spec))]
        draws[name] = ExploreDraws(
            resample_u=jax.random.uniform(coin, shape),
            shift_right=jax.random.bernoulli(shift, 0.5, shape),
            factor_index=jax.random.randint(factor, shape, 0, num_factors),
            resampled=resampled,
        )
    return draws


def _explore_list(
    value: jax.Array, draws: ExploreDraws, choices: tuple[float, ...], resample_probability: float
) -> tuple[jax.Array, jax.Array]:
    """Tune's case 1: resample, or when the value is not in the list; else shift by one,
    clamped at the ends."""
    table = jnp.asarray(choices, jnp.float32)
    match = jnp.isclose(value[:, None], table[None, :], rtol=_MATCH_RTOL, atol=0.0)  # [M, L]
    index = jnp.argmax(match, axis=1)  # the first match, as ``list.index``
    resample = (draws.resample_u < resample_probability) | ~jnp.any(match, axis=1)
    shifted = jnp.clip(index + jnp.where(draws.shift_right, 1, -1), 0, len(choices) - 1)
    new = jnp.where(resample, draws.resampled, table[shifted])
    shift_op = jnp.where(draws.shift_right, SHIFT_RIGHT, SHIFT_LEFT)
    return new, jnp.where(resample, RESAMPLE, shift_op)


def _explore_domain(
    value: jax.Array,
    draws: ExploreDraws,
    domain: Domain,
    resample_probability: float,
    perturbation_factors: tuple[float, ...],
) -> tuple[jax.Array, jax.Array]:
    """Tune's case 2: resample, else multiply by a factor; an integer rounds either result
    (``int(round(x))``, half to even as ``jnp.round``)."""
    resample = draws.resample_u < resample_probability
    factor = jnp.asarray(perturbation_factors, jnp.float32)[draws.factor_index]
    new = jnp.where(resample, draws.resampled, value * factor)
    if domain.integer:
        new = jnp.round(new)
    return new, jnp.where(resample, RESAMPLE, FACTOR_0 + draws.factor_index)


def apply_explore(
    values: Mapping[str, jax.Array],
    draws: Mapping[str, ExploreDraws],
    mutations: Mapping[str, Mutation],
    copied: jax.Array,
    resample_probability: float,
    perturbation_factors: tuple[float, ...],
) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """`explore` with its random draws given (`explore_draws`); see `explore`."""
    chex.assert_rank(copied, 1)
    new_values, operations = dict(values), {}
    for name, spec in mutations.items():
        value = values[name]
        chex.assert_shape(value, copied.shape)
        if isinstance(spec, Domain):
            args = (spec, resample_probability, tuple(perturbation_factors))
            new, op = _explore_domain(value, draws[name], *args)
        else:
            new, op = _explore_list(value, draws[name], tuple(spec), resample_probability)
        new_values[name] = jnp.where(copied, new, value).astype(value.dtype)
        operations[name] = jnp.where(copied, op, NONE).astype(jnp.int32)
    return new_values, operations


def explore(
    key: jax.Array,
    values: Mapping[str, jax.Array],
    mutations: Mapping[str, Mutation],
    copied: jax.Array,
    resample_probability: float,
    perturbation_factors: tuple[float, ...],
) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Tune's ``_explore`` on every copied member at once.

    Per member and mutation, as Tune:

    - A list or tuple of values (Tune's case 1): with ``resample_probability``, or when the
      value is not in the list (within a float32 tolerance), a uniformly chosen element;
      otherwise the left or right neighbour (each 1/2), clamped at the ends.
    - A `Domain` (case 2): with ``resample_probability`` a fresh sample, otherwise the value
      times a factor drawn uniformly from ``perturbation_factors``; integer domains round.
      The product is not clipped to the domain's bounds, as in Tune.

    Tune's ``tune.choice([...])`` is a Domain, not a list: it is resampled or *multiplied*, never
    shifted to a neighbour (Tune's own docstring warns of it), and so is it here.

    Args:
      key: PRNG key.
      values: name -> float32 [M], the members' hyperparameters after copying from their
        sources (``values[name][source]``); names without a mutation pass through.
      mutations: name -> `Domain` or tuple of values; static.
      copied: bool [M]; only these members change.
      resample_probability: static float.
      perturbation_factors: static tuple of floats.

    Returns:
      ``(new_values, operations)``: name -> float32 [M], and name -> int32 [M] of the codes
      `NONE`, `RESAMPLE`, `SHIFT_LEFT`, `SHIFT_RIGHT`, ``FACTOR_0 + i``.
    """
    num_factors = len(perturbation_factors)
    draws = explore_draws(key, copied.shape[0], mutations, num_factors)
    return apply_explore(
        values, draws, mutations, copied, resample_probability, perturbation_factors
    )


def operation_name(code: int, perturbation_factors: tuple[float, ...]) -> str:
    """Tune's description of an operation code ("resample", "shift left", "* 1.2"); "" for NONE.

    Tune adds " (noop)" to a shift that was clamped at an end; compare the values for that."""
    names = {NONE: "", RESAMPLE: "resample", SHIFT_LEFT: "shift left", SHIFT_RIGHT: "shift right"}
    if code in names:
        return names[code]
    return f"* {perturbation_factors[code - FACTOR_0]}"
