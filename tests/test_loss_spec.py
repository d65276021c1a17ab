"""A loss coefficient is declared once, in ``core/loss_spec.py``: the config's default, its
``training()`` keyword and its check come from the declaration, and the pieces that cannot
(the ``docs/config.md`` row, the coverage row, ``impala_loss``'s keyword) are checked against
it here, each failure naming the file and line to add."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from impala_jax import IMPALAConfig
from impala_jax.core.loss_spec import COEFFICIENTS, LEARNER_FIELDS, Coefficient, LossSpec
from impala_jax.rllib.config import _FIELD_TO_BUILDER

REPO = Path(__file__).resolve().parents[1]
NAMES = [k.name for k in COEFFICIENTS]


EACH = [pytest.param(k, id=k.name) for k in COEFFICIENTS]


def docs_row(k: Coefficient) -> str:
    """The row of ``k`` in docs/config.md's ``.training(*, ...)`` table."""
    own = "" if k.rllib else "impala_jax's own field: "
    schedule = " or a schedule" if k.schedule else ""
    return f"| `{k.name}` | `{k.default!r}` | {own}{k.doc}, {k.rule}{schedule} |"


def _lines(path: str) -> list[str]:
    return (REPO / path).read_text().splitlines()


def test_the_coefficients_are_the_loss_specs_fields_in_order():
    assert NAMES[:5] == [
        "gamma",
        "vf_loss_coeff",
        "entropy_coeff",
        "vtrace_clip_rho_threshold",
        "vtrace_clip_pg_rho_threshold",
    ]
    # Positional construction (tests, benchmarks) keeps its meaning.
    spec = LossSpec(0.9, 0.4, 0.03, 1.5, 2.0, True)
    assert (spec.gamma, spec.vtrace_clip_pg_rho_threshold, spec.clip_rewards) == (0.9, 2.0, True)
    assert LossSpec() == LossSpec(**{k.name: k.default for k in COEFFICIENTS})


@pytest.mark.parametrize("k", EACH)
def test_the_config_defaults_and_takes_each_coefficient(k):
    config = IMPALAConfig()
    assert _FIELD_TO_BUILDER.get(k.name) == "training", (
        f"{k.name} is declared in core/loss_spec.py but is no training() keyword "
        f"(rllib/compat.py DECLARED)"
    )
    assert config.to_dict()[k.name] == k.default
    value = [[0, 0.5], [100, 0.25]] if k.schedule else 0.5
    assert config.training(**{k.name: value}) is config and getattr(config, k.name) == value
    config.validate()
    assert IMPALAConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("k", EACH)
def test_validate_checks_each_coefficients_range(k):
    below = k.low if k.open_low else k.low - 1
    outside = [below, "0.5"] + ([k.high + 1] if k.high is not None else [])
    for value in outside:
        with pytest.raises(ValueError, match=re.escape(f"{k.name}={value!r}: expected")):
            IMPALAConfig().training(**{k.name: value}).validate()
    if not k.schedule:
        with pytest.raises(ValueError, match=re.escape(f"expected a number {k.rule} (set")):
            IMPALAConfig().training(**{k.name: below}).validate()


def test_impala_loss_takes_the_specs_names():
    from impala_jax.core import losses

    params = inspect.signature(losses.impala_loss).parameters
    keywords = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    line = inspect.getsourcelines(losses.impala_loss)[1]
    missing = sorted(set(LossSpec().loss_keywords()) - keywords)
    assert not missing, (
        f"impala_jax/core/losses.py:{line}: impala_loss takes no keyword {missing} (a LossSpec "
        f"field, which the learner passes through LossSpec.loss_keywords); add it there, or to "
        f"LEARNER_FIELDS if the learner applies it itself"
    )
    assert set(LEARNER_FIELDS) <= {f for f in LossSpec.__dataclass_fields__}


@pytest.mark.parametrize("k", EACH)
def test_each_coefficient_has_its_docs_row(k):
    assert "|" not in k.doc, f"core/loss_spec.py: {k.name}'s doc would split its table row"
    lines = _lines("docs/config.md")
    start = lines.index("### `.training(*, ...)`")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("###"))
    rows = {line.split("|")[1].strip(): i for i, line in enumerate(lines) if line.startswith("|")}
    row = rows.get(f"`{k.name}`")
    if row is None or not start < row < end:
        last = max(i for i in range(start, end) if lines[i].startswith("|"))
        pytest.fail(f"docs/config.md:{last + 1}: add the row after this line: {docs_row(k)}")
    assert lines[row] == docs_row(k), f"docs/config.md:{row + 1}: write it as {docs_row(k)}"


@pytest.mark.parametrize("k", EACH)
def test_each_coefficient_has_its_coverage_row(k):
    tree = ast.parse((REPO / "tests/test_every_field.py").read_text())
    fields = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "FIELDS"
    )
    keys = {key.value for key in fields.keys if isinstance(key, ast.Constant)}
    line = next(
        i
        for i, text in enumerate(_lines("tests/test_every_field.py"), 1)
        if "# .training()" in text
    )
    assert k.name in keys, (
        f"tests/test_every_field.py:{line}: add a FIELDS row after this line, e.g. "
        f'"{k.name}": Spec(<a non-default value>, loss),'
    )
