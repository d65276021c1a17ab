"""The config's rules for an env written in JAX (``"gymnax:<id>"``, a gymnax ``Environment``),
which trains on device.

Acting, env stepping and the update run in one compiled program there
(runtime/ondevice/device_engine.py): a field that shapes host threads, queues or per-step Python
calls either has no meaning there or cannot be honoured, and each such value is an error naming the
field. Fields that only size host transport (``num_gpu_loader_threads``, ``learner_queue_size``) are
accepted and noted at build, as there is no host batch to move.
"""

from __future__ import annotations

from typing import Any

from impala_jax.rllib.callbacks import EPISODE_HOOKS, overrides, resolve

# Hooks called per env step or per fragment, which the compiled rollout cannot call.
_PER_STEP_HOOKS = (*EPISODE_HOOKS, "on_episode_created", "on_episode_step", "on_sample_end")

# (field, allowed, why): the value each host-only field must keep on device.
_HOST_ONLY = (
    (
        "broadcast_interval",
        lambda v: v == 1,
        "1: on device the acting params are set by policy_lag",
    ),
    ("gym_env_vectorize_mode", lambda v: v == "sync", "'sync': the envs step inside the program"),
    ("num_cpus_per_env_runner", lambda v: v == 1, "1: there is no env thread pool to size"),
    (
        "inference_backend",
        lambda v: v in ("auto", "jax"),
        "'auto' or 'jax': actions are sampled inside the program",
    ),
    (
        "restart_failed_sub_environments",
        lambda v: v is False,
        "False: an env in JAX cannot crash alone",
    ),
    ("fake_sampler", lambda v: v is False, "False: sampling is part of the update's program"),
    ("_env_runners_only", lambda v: v is False, "False: sampling and the update are one program"),
    ("_skip_learners", lambda v: v is False, "False: sampling and the update are one program"),
)


def check_device_fields(v: Any) -> None:
    """Adds to ``v`` (checks.py's validator: ``value``, ``ok``, ``fail``) a problem for every
    field that cannot take its value with the config's env."""
    # Imported here: the config imports this module, and importing the config stays free of
    # gymnasium and NumPy (the command line reports a missing one in a line of its own).
    from impala_jax.runtime.envs.env_registry import is_jax_env

    if not v.ok("env", "env_config", "policy_lag"):
        return
    if not is_jax_env(v.value("env"), v.value("env_config")):
        if v.value("policy_lag") is not None:
            v.fail(
                "policy_lag",
                "sets the policy lag of an env written in JAX (e.g. 'gymnax:<id>'), which trains "
                "on device; runner threads act with the newest params they have: leave it None",
            )
        return
    v.integer("policy_lag", 0, none_ok=True)
    for name, allowed, why in _HOST_ONLY:
        v.check(name, allowed, f"{why} (env {v.value('env')!r} trains on device)")
    if v.ok("minibatch_buffer_size", "num_epochs"):
        if v.value("minibatch_buffer_size") > 1 and v.value("num_epochs") > 1:
            v.fail(
                "minibatch_buffer_size",
                "expected 1 on device, where each batch's num_epochs passes run inside the "
                "update's program; raise num_epochs alone",
            )
    for hook in _PER_STEP_HOOKS:
        if v.ok(hook) and v.value(hook):
            v.fail(hook, "expected None: per-step hooks cannot run inside the compiled rollout")
    if v.ok("callbacks_class"):
        per_step = [
            h
            for cls in _classes(v.value("callbacks_class"))
            for h in _PER_STEP_HOOKS
            if overrides(cls, h)
        ]
        if per_step:
            v.fail(
                "callbacks_class",
                f"overrides {sorted(set(per_step))}, which cannot run inside the compiled rollout "
                "on device; keep them for host envs, or log from on_train_result",
            )


def _classes(value: Any) -> list:
    values = value if isinstance(value, list | tuple) else [value] if value else []
    out = []
    for item in values:
        try:
            item = resolve(item, "callbacks_class")
        except ValueError:
            continue  # reported by the callbacks' own check
        if isinstance(item, type):
            out.append(item)
    return out
