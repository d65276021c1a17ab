"""A checkpoint records its config's class, so ``IMPALA.from_checkpoint`` rebuilds a user's
subclass of ``IMPALAConfig`` as that subclass (RLlib's Checkpointable restores its
"class_and_ctor_args" the same way); a checkpoint without the record holds an IMPALAConfig."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from impala_jax import IMPALA, IMPALAConfig
from impala_jax.runtime.process import checkpoint
from tests.test_algorithm import small_config


class MyConfig(IMPALAConfig):
    """A user's subclass, as RLlib users write them to add a method or change a default."""

    def shorter(self) -> MyConfig:
        return self.training(lr=1e-4)


def my_config() -> MyConfig:
    return MyConfig.from_dict(small_config().to_dict())


@pytest.mark.timeout(120)
def test_a_subclass_of_the_config_is_restored_as_itself(tmp_path):
    with my_config().build() as algo:
        algo.train()
        path = algo.save_to_path(tmp_path / "ckpt")
    _, meta = checkpoint.load(path)
    assert meta["config_class"] == "tests.test_checkpoint_class:MyConfig"
    with IMPALA.from_checkpoint(path) as restored:
        assert type(restored.config) is MyConfig
        assert restored.config.to_dict() == my_config().to_dict()
        assert restored.config.copy(copy_frozen=False).shorter().lr == 1e-4


@pytest.mark.timeout(120)
def test_a_checkpoint_without_the_class_restores_an_impala_config(tmp_path):
    with my_config().build() as algo:
        path = Path(algo.save_to_path(tmp_path / "ckpt"))
    old = tmp_path / "old"
    shutil.copytree(path, old)
    state = json.loads((old / checkpoint.STATE_FILE).read_text())
    del state["config_class"]
    (old / checkpoint.STATE_FILE).write_text(json.dumps(state))
    (old / checkpoint.MANIFEST_FILE).unlink()  # as a checkpoint written before manifests
    with IMPALA.from_checkpoint(old) as restored:
        assert type(restored.config) is IMPALAConfig
