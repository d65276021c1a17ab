"""The loss's settings, each declared once, as a field of `LossSpec` named as its config field.

JAX-free, so that the config imports it without JAX. A coefficient (a number the loss weighs,
discounts or clips by) is a field made by `coefficient`: its default is the config's default
(RLlib 2.60's, where RLlib has the field), its range is what ``validate()`` checks and its doc
is its row in ``docs/config.md``. ``rllib/config.py`` makes each one a ``training()`` keyword
and ``rllib/checks.py`` checks it; ``tests/test_loss_spec.py`` names the file and line of any
other piece that is missing (the docs row, the coverage row).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# LossSpec fields the learner applies itself instead of passing them to ``impala_loss``:
# gamma becomes ``discount_t`` and loss_reduction scales the loss (core/update.py).
LEARNER_FIELDS = ("gamma", "loss_reduction")


@dataclasses.dataclass(frozen=True)
class Coefficient:
    """One coefficient's declaration: its config field, default, range and meaning."""

    name: str
    default: float
    low: float
    high: float | None  # None: unbounded above
    open_low: bool  # True: the value must be > low, not >= low
    schedule: bool  # True: may also be a schedule [[timestep, value], ...]
    rllib: bool  # False: impala_jax's own field, which RLlib's IMPALAConfig lacks
    doc: str

    @property
    def rule(self) -> str:
        """The range in words, as ``validate()`` and ``docs/config.md`` say it."""
        if self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low}, {self.high}]"
        return f"{'>' if self.open_low else '>='} {self.low}"

    def contains(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        return above and (self.high is None or value <= self.high)


def coefficient(
    default: float,
    low: float,
    doc: str,
    *,
    high: float | None = None,
    open_low: bool = False,
    schedule: bool = False,
    rllib: bool = True,
) -> Any:
    """A `LossSpec` field declaring a coefficient (see `Coefficient`)."""
    declared = dict(low=low, high=high, open_low=open_low, schedule=schedule, rllib=rllib, doc=doc)
    return dataclasses.field(default=default, metadata={"coefficient": declared})


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """The loss's static settings, each field named as the config field it comes from."""

    gamma: float = coefficient(0.99, 0, "discount", high=1)
    vf_loss_coeff: float = coefficient(0.5, 0, "weight of the value loss")
    # A float, or ((t, v), ...): a schedule in env steps the learner reads (optim.py).
    entropy_coeff: Any = coefficient(0.01, 0, "weight of the entropy bonus", schedule=True)
    vtrace_clip_rho_threshold: float = coefficient(
        1.0, 0, "rho-bar of V-trace (paper eq. 1)", open_low=True
    )
    vtrace_clip_pg_rho_threshold: float = coefficient(
        1.0, 0, "rho-bar of the policy-gradient advantage", open_low=True
    )
    # RLlib's environment(clip_rewards=...), or True for Atari envs (rllib/specs.py).
    clip_rewards: Any = None
    # "mean" over the (mini)batch's valid rows (RLlib's) or their "sum" (the IMPALA paper's code):
    # the sum's gradient is N = valid rows times the mean's, which is what the paper's RMSProp
    # constants (epsilon, grad_clip) were set for. See docs/config.md, "Loss reduction".
    loss_reduction: str = "mean"
    # True: V-trace. False: no off-policy correction, every importance weight taken as 1 (the
    # IMPALA paper's "no-correction" baseline); RLlib's validate() rejects False.
    vtrace: bool = True

    def loss_keywords(self, **values: Any) -> dict[str, Any]:
        """``impala_loss``'s keywords: every field but `LEARNER_FIELDS`, ``values`` winning
        (the current value of a schedule)."""
        keywords = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in LEARNER_FIELDS
        }
        return keywords | values


COEFFICIENTS: tuple[Coefficient, ...] = tuple(
    Coefficient(f.name, f.default, **f.metadata["coefficient"])
    for f in dataclasses.fields(LossSpec)
    if "coefficient" in f.metadata
)
