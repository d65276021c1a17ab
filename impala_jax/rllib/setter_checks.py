"""The checks RLlib makes as soon as a builder is called (``SETTER_CHECKS``), one per field.

`IMPALAConfig`'s builders call ``SETTER_CHECKS[name](value)`` when a field is set; every other
rule waits for ``validate()`` (``checks.py``), which shares the framework names and the
callbacks-class rule written here. The value is passed in: this module never imports
``config.py``.
"""

from __future__ import annotations

from typing import Any

from impala_jax.core.optim_rules import GRAD_CLIP_BY
from impala_jax.rllib.callbacks import SUPPORTED_HOOKS, UNSUPPORTED_HOOKS, unsupported_overrides
from impala_jax.rllib.model_config_checks import merge_model_config
from impala_jax.rllib.module_spec import as_rl_module_spec
from impala_jax.rllib.values import find_search_space, is_int, is_search_space


def _check_deprecated_aggregation(name: str, replacement: str) -> Any:
    def check(value: Any) -> None:
        if value != -1:
            raise ValueError(
                f"{name}={value!r}: {name} is deprecated (as in RLlib); leave it at -1 and use "
                f"{replacement} instead."
            )

    return check


def _check_grad_clip_by(value: Any) -> None:
    if not is_search_space(value) and value not in GRAD_CLIP_BY:
        raise ValueError(f"grad_clip_by={value!r}: expected one of {GRAD_CLIP_BY}.")


def _check_rollout_fragment_length(value: Any) -> None:
    if is_search_space(value) or value == "auto":
        return
    if not (is_int(value) and value > 0):
        raise ValueError(
            f"rollout_fragment_length={value!r}: expected an int > 0 or 'auto' (the train batch "
            f"divided over all envs)."
        )


def _check_model_config(value: Any) -> None:
    merge_model_config(value)


def callbacks_class_problem(value: Any) -> str | None:
    """Why `value` is not a callbacks_class (RLlib checks it as soon as callbacks() is called)."""
    if value is None or find_search_space(value):
        return None
    for klass in value if isinstance(value, list | tuple) else [value]:
        if not (isinstance(klass, type) or (isinstance(klass, str) and klass)):
            return (
                "expected None, an RLlibCallback subclass (a class, not an instance), its import "
                "path 'pkg.mod:Cls', or a list of them"
            )
        if isinstance(klass, type) and unsupported_overrides(klass):
            hook = unsupported_overrides(klass)[0]
            return (
                f"{klass.__qualname__} overrides {hook}, which {UNSUPPORTED_HOOKS[hook]}; remove "
                f"it or move its logic to one of {', '.join(SUPPORTED_HOOKS)}"
            )
    return None


def _check_callbacks_class(value: Any) -> None:
    problem = callbacks_class_problem(value)
    if problem:
        raise ValueError(f"callbacks_class={value!r}: {problem} (set with .callbacks(...)).")


def _check_api_stack(name: str) -> Any:
    def check(value: Any) -> None:
        if value is not True and not is_search_space(value):
            raise NotImplementedError(
                f"api_stack({name}={value!r}): RLlib's old API stack is not offered; impala_jax "
                f"is the new stack only (RLModule and Learner, EnvRunners), so leave it True."
            )

    return check


FRAMEWORKS = ("jax", "torch", "tf2", "tf")


def _check_framework(value: Any) -> None:
    if value == "tfe":  # RLlib rejects it too
        raise ValueError("framework='tfe' is deprecated (as in RLlib); use 'tf2'.")
    if value not in FRAMEWORKS and not is_search_space(value):
        raise ValueError(
            f"framework={value!r}: expected one of {FRAMEWORKS} (impala_jax always runs JAX; "
            f"RLlib's names are accepted so that RLlib scripts run)."
        )


# Checks RLlib makes as soon as the builder is called; everything else waits for validate().
SETTER_CHECKS = {
    "enable_rl_module_and_learner": _check_api_stack("enable_rl_module_and_learner"),
    "enable_env_runner_and_connector_v2": _check_api_stack("enable_env_runner_and_connector_v2"),
    "framework": _check_framework,
    "num_aggregation_workers": _check_deprecated_aggregation(
        "num_aggregation_workers", "learners(num_aggregator_actors_per_learner=..)"
    ),
    "max_requests_in_flight_per_aggregator_worker": _check_deprecated_aggregation(
        "max_requests_in_flight_per_aggregator_worker",
        "learners(max_requests_in_flight_per_aggregator_actor=..)",
    ),
    "grad_clip_by": _check_grad_clip_by,
    "rollout_fragment_length": _check_rollout_fragment_length,
    "model_config": _check_model_config,
    "callbacks_class": _check_callbacks_class,
    "rl_module_spec": as_rl_module_spec,
}
