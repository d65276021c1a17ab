"""A sweep across a two-node Ray cluster (ray.cluster_utils.Cluster: two raylets on this
machine), each node with room for one trial, so Tune must place a trial on each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from impala_jax import IMPALAConfig

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def record_node(*, result: dict, **kwargs) -> None:
    """on_train_result: the Ray node the trial runs on."""
    result["node_id"] = ray.get_runtime_context().get_node_id()


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_sweep_places_trials_on_both_nodes_of_a_cluster(tmp_path):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), old) if p)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2
        config = (
            IMPALAConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=16)
            .training(lr=tune.grid_search([1e-4, 1e-3]), train_batch_size_per_learner=128)
            .learners(num_learners=0)
            .reporting(min_time_s_per_iteration=0.5)
            .callbacks(on_train_result=record_node)
        )
        grid = tune.Tuner(
            "IMPALA",
            param_space=config,
            # Shared storage: on a real cluster a path every node mounts (or cloud storage).
            run_config=tune.RunConfig(
                stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0
            ),
        ).fit()
        assert all(r.error is None for r in grid)
        assert sorted(r.config["lr"] for r in grid) == [1e-4, 1e-3]
        assert {r.metrics["node_id"] for r in grid} == nodes
        assert all(r.checkpoint is None or Path(r.checkpoint.path).exists() for r in grid)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
