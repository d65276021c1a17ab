"""The learner's metrics, declared once: what each one is, how the learner devices combine it,
and the key ``train()`` reports it under in ``learners/default_policy/`` (RLlib's name where
RLlib reports the same quantity).

Everything else is derived from ``METRICS``: ``update.py`` reweights and reduces each metric by
its ``reduce`` and renames it by its ``key`` and ``sum_key`` (``device_shares``); the diagnostics
read results through ``read_metric``; the CLI's result schema lists ``REPORTED``. A new metric is
computed in ``losses.py`` or ``update.py`` and declared here, nowhere else: a loss metric that is
not declared fails the learner step's trace, and tests/test_learner_metrics.py fails on any
metric the learner step returns and ``METRICS`` lacks, or the reverse.

No JAX here: the CLI checks stop keys against the schema before JAX is imported (its XLA flags
must be set first). ``reporting(log_gradients=True)``'s per-group norms,
``gradients_<group>_global_norm``, are named by the network's parameter groups, not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# How the learner devices combine a metric, each device having computed it on its share of the
# (mini)batch. The step's minibatch updates are combined first, on each device (update.py's
# _combine_updates): a ROW_MEAN weighted by each update's valid rows, a DEVICE_MAX by its
# maximum, anything else by its mean over the updates that had valid rows.
# A mean over the device's valid rows: weighted by the device's share of all valid rows (every
# device's mean weight is 1), the devices' mean is the mean over every row of the batch.
ROW_MEAN = "row_mean"
# The devices' plain mean: a statistic of each device's own rows, or a value every device
# computes alike (from the averaged gradient, or over every device's rows already).
DEVICE_MEAN = "device_mean"
DEVICE_MAX = "device_max"
# Read from the optimizer state or a schedule after the update: the same on every device.
STATE = "state"


@dataclasses.dataclass(frozen=True)
class Metric:
    """One learner metric. ``name``: as the loss or the update step computes it; ``key``: the
    result key where it differs (RLlib's name); ``sum_key``: also reported as its sum over the
    batch's valid rows, under this key (a ``ROW_MEAN`` only); ``optional``: reported for some
    configs only (``doc`` says which)."""

    name: str
    reduce: str
    doc: str
    key: str = ""
    sum_key: str = ""
    optional: bool = False

    @property
    def reported(self) -> tuple[str, ...]:
        """The result keys of this metric."""
        return (self.key or self.name,) + ((self.sum_key,) if self.sum_key else ())


METRICS = (
    # What losses.impala_loss returns (arXiv:1802.01561, section 4.2), over valid rows.
    Metric(
        "total_loss",
        ROW_MEAN,
        "pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy, a mean whatever "
        "loss_reduction",
    ),
    Metric(
        "pi_loss",
        ROW_MEAN,
        "-log pi(a|x) times the V-trace advantage: its mean, and its sum as RLlib reports it",
        key="mean_pi_loss",
        sum_key="pi_loss",
    ),
    Metric(
        "vf_loss",
        ROW_MEAN,
        "0.5 (v_s - V(x))^2: its mean, and its sum as RLlib reports it",
        key="mean_vf_loss",
        sum_key="vf_loss",
    ),
    Metric("entropy", ROW_MEAN, "the target policy's entropy"),
    Metric("mean_kl", ROW_MEAN, "KL(behaviour policy || target policy)"),
    Metric("mean_vs", ROW_MEAN, "the V-trace value targets v_s"),
    Metric(
        "vf_explained_var",
        DEVICE_MEAN,
        "1 - Var[v_s - V(x)] / Var[v_s] over each device's rows, floored at -1 (RLlib's)",
    ),
    Metric("mean_rho", ROW_MEAN, "the importance weight pi/mu, before clipping"),
    Metric(
        "clipped_rho_fraction",
        ROW_MEAN,
        "the share of rows whose weight exceeds vtrace_clip_rho_threshold by more than 1 % "
        "(losses.CLIPPED_RHO_TOLERANCE: on-policy rounding is not clipping)",
    ),
    Metric("max_rho", DEVICE_MAX, "the largest importance weight, before clipping"),
    # What update.py's learner step adds.
    Metric(
        "entropy_fraction_of_max",
        ROW_MEAN,
        "entropy over its maximum (ln n for Discrete(n)); none for a Box action space",
        optional=True,
    ),
    Metric(
        "encoder_dead_unit_fraction",
        DEVICE_MEAN,
        "the share of the encoder's output units <= 0 for every observation of the batch "
        "(every device's); feedforward policies only",
        optional=True,
    ),
    Metric(
        "encoder_feature_std",
        DEVICE_MEAN,
        "the encoder's output units' std across the batch's observations, averaged over the "
        "units; feedforward policies only",
        optional=True,
    ),
    Metric(
        "gradients_default_optimizer_global_norm",
        DEVICE_MEAN,
        "the global norm of the gradient averaged over devices, before clipping",
    ),
    Metric("update_to_param_norm_ratio", DEVICE_MEAN, "||update|| / ||params||"),
    Metric(
        "update_rms_to_lr_ratio",
        DEVICE_MEAN,
        "the update's root mean square over the params, over the learning rate",
    ),
    Metric("curr_lr", STATE, "the learning rate at the step's env steps (a schedule's value)"),
    Metric("curr_entropy_coeff", STATE, "entropy_coeff at the step's env steps"),
    Metric(
        "num_non_finite_updates",
        STATE,
        "updates skipped for a non-finite gradient, over the run",
    ),
    Metric(
        "num_consecutive_non_finite_updates",
        STATE,
        "updates skipped for a non-finite gradient since the last finite one",
    ),
)

BY_NAME = {metric.name: metric for metric in METRICS}
# Result key -> its metric.
REPORTED = {key: metric for metric in METRICS for key in metric.reported}


def declared(name: str) -> Metric:
    """The metric the loss or the update step computes as ``name``; KeyError if undeclared."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"learner metric {name!r} is not declared in impala_jax/core/learner_metrics.py"
        ) from None


def keys_reduced_by(reduce: str) -> tuple[str, ...]:
    """The result keys of the metrics the devices combine by ``reduce``."""
    return tuple(key for key, metric in REPORTED.items() if metric.reduce == reduce)


def device_shares(metrics: dict, weight: Any, total_valid: Any) -> dict:
    """The loss's ``metrics`` (by ``name``) as one device's shares, under their result keys.

    A ``ROW_MEAN`` times ``weight``, the device's share of all valid rows (1 on average over the
    devices), so that the devices' mean is the mean over every row; a metric with a ``sum_key``
    is also reported as that share times ``total_valid``, the valid rows on every device, whose
    devices' mean is the sum. A name not declared here is a KeyError (at trace time).
    """
    out = {}
    for name, value in metrics.items():
        metric = declared(name)
        share = value * weight if metric.reduce == ROW_MEAN else value
        out[metric.key or name] = share
        if metric.sum_key:
            out[metric.sum_key] = share * total_valid
    return out


def read_metric(learner: Mapping, key: str, default: Any = None) -> Any:
    """``learner[key]``, ``default`` where this config does not report it; ``learner`` is a
    result's ``learners/default_policy``. ``key`` must be a declared result key, so a renamed
    metric fails where it is read rather than leaving the reader with its default for good."""
    if key not in REPORTED:
        raise KeyError(
            f"{key!r} is not a result key declared in impala_jax/core/learner_metrics.py"
        )
    return learner.get(key, default)
