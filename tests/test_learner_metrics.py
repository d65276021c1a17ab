"""The learner's metrics are declared once (core/learner_metrics.py): the learner step reports
exactly the declared ones, under their result keys, and the CLI's result schema lists each."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from impala_jax.cli.result_schema import result_schema
from impala_jax.core import learner_metrics
from impala_jax.core.learner_metrics import METRICS, REPORTED, device_shares, read_metric
from tests.test_algorithm import small_config
from tests.test_learner import make_learner, random_batch
from tests.test_losses import loss_and_grads, make_batch

MODULE = "learners/default_policy/"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_devices", [1, 2])
def test_the_learner_step_reports_exactly_the_declared_metrics(num_devices):
    """A metric computed in core but not declared, or declared but not computed (or not
    renamed to its result keys), fails here. A Discrete MLP policy reports the optional ones
    too."""
    learner = make_learner(num_devices)
    metrics = jax.device_get(learner.update(learner.put_batch(random_batch(0)), env_steps=0))
    assert sorted(set(metrics) - set(REPORTED)) == [], "declare it in core/learner_metrics.py"
    assert sorted(set(REPORTED) - set(metrics)) == [], "compute it in core/losses.py or update.py"
    assert all(np.isfinite(v) for v in metrics.values()), metrics


def test_every_loss_metric_is_declared():
    _, metrics, _ = loss_and_grads(make_batch(0))
    assert sorted(n for n in metrics if n not in learner_metrics.BY_NAME) == []


@pytest.mark.parametrize("num_env_runners", [0, 2])
def test_every_declared_metric_is_in_the_result_schema(num_env_runners):
    schema = result_schema(small_config(num_env_runners=num_env_runners))
    for metric in METRICS:
        for key in metric.reported:
            assert MODULE + key in schema.keys, key
            assert (MODULE + key in schema.optional_keys) == metric.optional, key
    # With no update, none of them (the module's step counts stay).
    skipped = result_schema(small_config().debugging(_skip_learners=True))
    assert not {MODULE + k for k in REPORTED} & skipped.keys
    assert MODULE + "num_updates_lifetime" in skipped.keys


def test_device_shares_reweight_row_means_and_add_rllibs_sums():
    loss = {"pi_loss": 2.0, "vf_loss": 3.0, "max_rho": 5.0, "vf_explained_var": 0.5}
    shares = device_shares(loss, weight=0.5, total_valid=10)
    assert shares == {
        "mean_pi_loss": 1.0,
        "pi_loss": 10.0,
        "mean_vf_loss": 1.5,
        "vf_loss": 15.0,
        "max_rho": 5.0,  # a maximum and a statistic of the device's rows: not reweighted
        "vf_explained_var": 0.5,
    }
    with pytest.raises(KeyError, match="not declared in impala_jax/core/learner_metrics.py"):
        device_shares({"kl_penalty": 1.0}, weight=1.0, total_valid=1)


def test_reading_a_metric_needs_its_declared_key():
    learner = {"curr_lr": 1e-3}
    assert read_metric(learner, "curr_lr") == 1e-3
    assert read_metric(learner, "encoder_feature_std", 0.0) == 0.0  # declared, not reported
    with pytest.raises(KeyError, match="learner_metrics.py"):
        read_metric(learner, "curr_learning_rate")
    assert {m.reduce for m in METRICS} == {
        learner_metrics.ROW_MEAN,
        learner_metrics.DEVICE_MEAN,
        learner_metrics.DEVICE_MAX,
        learner_metrics.STATE,
    }
