"""Ray Tune for impala_jax: the Trainable around `IMPALA`, its resource request, its names.

This is the one module that imports ray (``pip install "impala_jax[tune]"``). ``import impala_jax``
does not import it: ``tune_hook`` registers it once ray.tune is imported, so RLlib's spelling
works unchanged::

    from impala_jax import IMPALAConfig          # the only change from RLlib
    from ray import tune

    config = IMPALAConfig().environment("CartPole-v1").training(lr=tune.grid_search([1e-4, 2e-4]))
    tune.Tuner("IMPALA", param_space=config).fit()

- ``"IMPALA"`` and ``"impala_jax"`` name `IMPALATrainable` in Tune's registry. RLlib registers
  its own ``"IMPALA"`` whenever Tune asks it for an algorithm by name; impala_jax puts its
  Trainable back after that (`guard_rllib_registry`), and ``"impala_jax"`` is a name RLlib
  never writes.
- ``param_space=config`` works because IMPALAConfig is registered as a virtual subclass of
  Tune's ``_Config`` (the interface RLlib's AlgorithmConfig uses): Tune calls ``to_dict()``.
  Search spaces may stand anywhere in the builder calls, inside ``model_config`` and
  schedules too: Tune resolves nested dicts and lists, and each trial builds its resolved dict.
- A trial is one process: runner threads, loader threads and the learner live in the Trainable's
  actor. Its resource request is therefore a single bundle (`trial_resources`) that adds up
  what RLlib would spread over actors; see the function for the sum and where it differs.
- Each trial process gets its own JAX settings (`trial_jax_environment`) before JAX starts: a
  trial without GPUs runs on the CPU (with ``num_learners`` CPU devices when that is > 1); a GPU
  trial sees only the GPUs Ray gave it and allocates memory as it goes instead of taking 75% of
  the device, so fractional-GPU trials can share one.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import ray
from ray import tune
from ray.tune.registry import register_trainable

from impala_jax.rllib.config import IMPALAConfig

__all__ = ["TUNE_NAME", "IMPALATrainable", "register", "trial_resources"]

# Tune's names for IMPALATrainable: RLlib's, and one RLlib cannot overwrite.
RLLIB_NAME = "IMPALA"
TUNE_NAME = "impala_jax"

_LOG = logging.getLogger("impala_jax")


def _config_from(config: Mapping[str, Any]) -> IMPALAConfig:
    """The trial's IMPALAConfig: a resolved ``to_dict()`` (or part of one) over the defaults."""
    if isinstance(config, IMPALAConfig):
        return config.copy(copy_frozen=False)
    return IMPALAConfig.from_dict(dict(config))


def _learner_cpus(c: IMPALAConfig) -> float:
    # RLlib's "auto": one CPU per learner without a GPU, none with one.
    if c.num_cpus_per_learner != "auto":
        return c.num_cpus_per_learner
    return 1 if c.num_gpus_per_learner == 0 else 0


def trial_resources(config: Mapping[str, Any]) -> dict[str, float]:
    """The CPUs and GPUs one trial of `config` (a config dict or an IMPALAConfig) asks for.

    RLlib (``Algorithm.default_resource_request``) asks for one bundle per actor: the main
    process, each env runner, each evaluation env runner and each learner. impala_jax runs all
    of them as threads of the trial's one process, so it asks for one bundle with the sum:

    - the main process and the learners together, ``max(num_cpus_for_main_process,
      num_cpus_per_learner * max(1, num_learners))``: the learner step runs on the main
      thread, as RLlib's does with ``num_learners=0`` (where RLlib takes the same max);
    - ``num_cpus_per_env_runner`` for each of ``num_env_runners`` runner threads and each of
      ``evaluation_num_env_runners`` evaluation threads (``evaluation_config`` may override
      the per-runner figure), as RLlib;
    - one CPU per aggregator thread (``num_aggregator_actors_per_learner`` per learner), as
      RLlib counts its aggregator actors;
    - GPUs: ``num_gpus_per_learner * max(1, num_learners)``; the env runners act on the first
      learner device (``num_gpus_per_env_runner`` must stay 0).

    So RLlib's docstring example (1 env runner, ``num_learners=1``) asks for 2 CPUs here and 3
    in RLlib, and fits a 2-core machine. Reads only the config: no devices are touched.
    """
    c = _config_from(config)
    learners = max(1, c.num_learners)
    cpus = max(c.num_cpus_for_main_process, _learner_cpus(c) * learners)
    cpus += c.num_env_runners * c.num_cpus_per_env_runner
    if c.evaluation_interval and c.evaluation_num_env_runners:
        per_runner = (c.evaluation_config or {}).get(
            "num_cpus_per_env_runner", c.num_cpus_per_env_runner
        )
        cpus += c.evaluation_num_env_runners * per_runner
    cpus += c.num_aggregator_actors_per_learner * learners
    return {"CPU": float(cpus), "GPU": float(c.num_gpus_per_learner * learners)}


def _nodes_that_fit(request: Mapping[str, float]) -> tuple[bool, list[dict[str, float]]]:
    nodes = [
        {k: n["Resources"].get(k, 0.0) for k in ("CPU", "GPU")}
        for n in ray.nodes()
        if n.get("Alive")
    ]
    fits = any(all(node[k] >= v for k, v in request.items()) for node in nodes)
    return fits, nodes


def _autoscaling() -> bool:
    try:
        from ray.tune.execution.cluster_info import _is_ray_cluster
    except ImportError:
        return False
    return _is_ray_cluster()


class IMPALATrainable(tune.Trainable):
    """One Tune trial: ``setup`` builds `IMPALA` from the trial's config dict, ``step`` is one
    ``train()``, checkpoints are impala_jax's own (no pickle), ``cleanup`` stops every thread.

    A checkpoint directory Tune hands out holds an impala_jax checkpoint, so
    ``IMPALA.from_checkpoint(result.checkpoint)`` restores a trial outside Tune.
    """

    def setup(self, config: dict) -> None:
        c = _config_from(config)
        resources = trial_resources(c)
        trial_jax_environment(gpus=resources["GPU"], num_learners=max(1, c.num_learners))
        self.algo = c.build()

    def step(self) -> dict:
        return self.algo.train()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.algo.save_to_path(checkpoint_dir)

    def load_checkpoint(self, checkpoint: str) -> None:
        # Learner state, counters and episodes; the config stays this trial's own (PBT's
        # exploit restores another trial's checkpoint under a perturbed config).
        self.algo.restore_from_path(checkpoint)

    def reset_config(self, new_config: dict) -> bool:
        """Rebuilds in this process under `new_config` (Tune's ``reuse_actors``, PBT)."""
        self.algo.stop()
        self.algo = _config_from(new_config).build()
        self.config = new_config
        return True

    def cleanup(self) -> None:
        algo = getattr(self, "algo", None)
        if algo is not None:
            algo.stop()

    @classmethod
    def default_resource_request(cls, config: dict) -> tune.PlacementGroupFactory:
        """One bundle (`trial_resources`). On a fixed cluster (not autoscaling) a request no
        node can hold is an error now, instead of a trial that stays PENDING forever."""
        c = _config_from(config)
        request = trial_resources(c)
        # Tune asks here, in the driver, before it starts the trial: the last moment to hand
        # the trial an env registered with impala_jax.register_env.
        share_env(config)
        if ray.is_initialized() and not _autoscaling():
            fits, nodes = _nodes_that_fit(request)
            if not fits:
                raise ValueError(
                    f"An impala_jax trial of this config asks for {_describe(request)} in one "
                    f"process ({_why(c)}), but no node of this Ray cluster has that many: "
                    f"nodes have {[_describe(n) for n in nodes]}. Ask for less (e.g. "
                    f"env_runners(num_env_runners=...), learners(num_cpus_per_learner=...), "
                    f"resources(num_cpus_for_main_process=...)) or start Ray with more "
                    f"(ray.init(num_cpus=...), more nodes)."
                )
        return tune.PlacementGroupFactory([request], strategy=c.placement_strategy)


def _describe(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items())


def _why(c: IMPALAConfig) -> str:
    parts = [
        f"main process and learner: max(num_cpus_for_main_process={c.num_cpus_for_main_process}"
        f", num_cpus_per_learner={c.num_cpus_per_learner!r} x {max(1, c.num_learners)})",
        f"num_env_runners={c.num_env_runners} x num_cpus_per_env_runner="
        f"{c.num_cpus_per_env_runner}",
    ]
    if c.evaluation_interval and c.evaluation_num_env_runners:
        parts.append(f"evaluation_num_env_runners={c.evaluation_num_env_runners}")
    if c.num_aggregator_actors_per_learner:
        parts.append(f"num_aggregator_actors_per_learner={c.num_aggregator_actors_per_learner}")
    if c.num_gpus_per_learner:
        parts.append(f"num_gpus_per_learner={c.num_gpus_per_learner}")
    return "; ".join(parts)


def trial_jax_environment(gpus: float, num_learners: int) -> None:
    """JAX settings of a trial's process, set before JAX picks a backend.

    No GPU: the CPU backend, with `num_learners` host devices when > 1 (forced CPU devices, as
    ``impala_jax.run --devices``). GPUs: only those Ray assigned to this trial are visible, and
    memory is allocated on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``).
    """
    from impala_jax.runtime.process.jax_setup import (
        COMPILE_CACHE_ENV,
        DEFAULT_COMPILE_CACHE,
        enable_compile_cache,
        jax_started,
    )

    if jax_started():
        _LOG.warning(
            "JAX already picked its backend in this trial's process (pid %d) before the trial "
            "began; the trial's own JAX settings (CPU or its GPUs) do not apply.",
            os.getpid(),
        )
    elif gpus == 0:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if num_learners > 1:
            from impala_jax.runtime.process.jax_setup import force_host_devices

            force_host_devices(num_learners)
        if "jax" in sys.modules:  # imported but not started: its flags were read at import
            sys.modules["jax"].config.update("jax_platforms", "cpu")
    else:
        gpu_ids = ray.get_gpu_ids()
        if gpu_ids:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    enable_compile_cache(os.environ.get(COMPILE_CACHE_ENV, DEFAULT_COMPILE_CACHE))


def register() -> None:
    """IMPALAConfig as a Tune ``_Config``; IMPALATrainable as "IMPALA" and "impala_jax"."""
    from ray.tune.tune import _Config

    _Config.register(IMPALAConfig)
    register_trainable(RLLIB_NAME, IMPALATrainable)
    register_trainable(TUNE_NAME, IMPALATrainable)


def share_env(config: Mapping[str, Any]) -> None:
    """A trial's env named with impala_jax.register_env goes into Tune's registry too, which
    Ray ships to the trial's process (only then: Tune's registry outlives impala_jax's)."""
    from impala_jax.runtime.envs.env_registry import REGISTERED

    name = config.get("env")
    if not isinstance(name, str) or name not in REGISTERED:
        return
    try:
        tune.register_env(name, REGISTERED[name])
    except Exception as err:  # e.g. a creator that cannot be pickled
        _LOG.warning(
            "register_env(%r): Ray Tune cannot ship this creator to trials (%s: %s); trials in "
            "other processes will not find the name. Register an importable function instead.",
            name,
            type(err).__name__,
            err,
        )


def guard_rllib_registry() -> None:
    """RLlib's ``_register_all`` (run when Tune looks up an unknown name) writes RLlib's own
    ``"IMPALA"``: after it, impala_jax's is registered again."""
    import ray.rllib as rllib

    register_all = rllib._register_all
    if getattr(register_all, "_impala_jax", False):
        return

    def register_all_then_impala_jax() -> None:
        register_all()
        register()

    register_all_then_impala_jax._impala_jax = True
    rllib._register_all = register_all_then_impala_jax


# Importing this module registers too (a Tune worker unpickling IMPALATrainable imports it
# first, and ray.tune's import inside it comes before `register` exists).
register()
