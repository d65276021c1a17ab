"""`validate()`'s checks of the ``multi_agent()`` fields, and of what a multi-agent run does
not offer yet (rllib/multi_agent.py). Called by checks.py with its validator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from impala_jax.rllib.callbacks import EPISODE_HOOKS
from impala_jax.rllib.values import is_int

# The numbers a policy's own config may override, traced per policy (rllib/multi_agent.py).
PER_POLICY = (
    "lr",
    "entropy_coeff",
    "vf_loss_coeff",
    "gamma",
    "grad_clip",
    "vtrace_clip_rho_threshold",
    "vtrace_clip_pg_rho_threshold",
)
COUNT_STEPS_BY = ("env_steps", "agent_steps")


def _spec_problem(spec: Any) -> str | None:
    """Why one ``policies`` value cannot be used, or None."""
    if spec is None:
        return None
    if isinstance(spec, list | tuple):
        if len(spec) != 4:
            return "a policy spec tuple is (cls or None, obs_space, action_space, config)"
        cls, _, _, overrides = spec
    elif all(hasattr(spec, a) for a in ("policy_class", "observation_space", "config")):
        cls, overrides = spec.policy_class, spec.config
    else:
        return f"expected None, a PolicySpec or a 4-tuple, got {type(spec).__name__}"
    if cls is not None:
        return (
            "a policy class is RLlib's own; impala_jax builds every policy from "
            "rl_module(model_config=...): give None"
        )
    if overrides is not None and not isinstance(overrides, Mapping):
        return f"a policy's config must be a dict, got {type(overrides).__name__}"
    extra = sorted(set(overrides or {}) - set(PER_POLICY))
    if extra:
        return (
            f"a policy's config may override only {', '.join(PER_POLICY)} (traced per policy in "
            f"the one program); got {extra}"
        )
    bad = [k for k, v in (overrides or {}).items() if not isinstance(v, int | float)]
    if bad:
        return f"per-policy overrides are numbers (no schedules yet); {bad} are not"
    return None


def check_multi_agent_fields(v) -> None:
    """Adds ``v``'s (checks._Validator) errors for the multi-agent fields."""
    policies = v.value("policies")
    if v.ok("policies"):
        if not isinstance(policies, Mapping) or not policies:
            v.fail("policies", "expected a non-empty set of policy ids or a dict id -> spec")
        else:
            for pid, spec in policies.items():
                if not isinstance(pid, str) or not pid or "/" in pid:
                    v.fail("policies", f"policy id {pid!r} must be a non-empty str without '/'")
                    break
                problem = _spec_problem(spec)
                if problem:
                    v.fail("policies", f"policy {pid!r}: {problem}")
                    break
    v.choice("count_steps_by", COUNT_STEPS_BY)
    v.integer("policy_map_capacity", 1)
    v.boolean("policy_states_are_swappable")
    v.check("observation_fn", lambda f: f is None, "None (RLlib's old-stack observation_fn)")
    v.check(
        "policy_mapping_fn",
        lambda f: f is None or callable(f),
        "None or fn(agent_id, episode, **kwargs) -> policy id",
    )
    _policies_to_train(v, policies)
    if v.c.is_multi_agent:
        _not_with_multi_agent(v)


def _policies_to_train(v, policies: Any) -> None:
    chosen = v.value("policies_to_train")
    if not v.ok("policies_to_train") or chosen is None:
        return
    if callable(chosen):
        v.fail(
            "policies_to_train",
            "a callable (policy id, batch) -> bool is not offered yet; give the ids to train",
        )
    elif not isinstance(chosen, list | tuple | set | frozenset) or not all(
        isinstance(p, str) for p in chosen
    ):
        v.fail("policies_to_train", "expected None or a collection of policy ids")
    elif isinstance(policies, Mapping) and set(chosen) - set(policies):
        unknown = sorted(set(chosen) - set(policies))
        v.fail("policies_to_train", f"{unknown} are not among the policies {sorted(policies)}")


# What a multi-agent run does not offer yet: field -> (the value it needs, why).
_SINGLE_AGENT_ONLY = {
    "custom_evaluation_function": (
        None,
        "a custom evaluation of multi-agent runs is not offered yet",
    ),
    "fake_sampler": (False, "the fake sampler replays single-agent batches"),
    "_env_runners_only": (False, "multi-agent runs always train"),
    "_skip_learners": (False, "multi-agent runs always train"),
    "minibatch_buffer_size": (1, "the host minibatch buffer holds single-agent batches"),
    "policy_lag": (None, "policy_lag is for on-device runs"),
    "restart_failed_sub_environments": (
        False,
        "a failed multi-agent runner is rebuilt whole (restart_failed_env_runners)",
    ),
}


def _not_with_multi_agent(v) -> None:
    for name, (needed, why) in _SINGLE_AGENT_ONLY.items():
        value = v.value(name)
        if v.ok(name) and value != needed:
            v.fail(name, f"{why}; with multi_agent() it must be {needed!r}")
    for hook in EPISODE_HOOKS:
        if v.ok(hook) and v.value(hook) is not None:
            v.fail(hook, "episode callbacks of multi-agent runs are not offered yet")
    batch = v.value("train_batch_size_per_learner")
    if is_int(batch) and batch <= 0:
        v.fail("train_batch_size_per_learner", "expected a positive batch size")
