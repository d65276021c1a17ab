"""The frozen config -> the static specs the compiled learner step closes over."""

from __future__ import annotations

import math

from impala_jax.learner import LossSpec, StepSpec
from impala_jax.optim import OptimizerSpec


def optimizer_spec(config) -> OptimizerSpec:
    return OptimizerSpec(
        opt_type=config.opt_type,
        lr=config.resolved_lr,
        grad_clip=config.grad_clip,
        grad_clip_by=config.grad_clip_by,
        decay=config.decay,
        momentum=config.momentum,
        epsilon=config.epsilon,
        separate_vf_optimizer=config._separate_vf_optimizer,
        lr_vf=config._lr_vf,
        # Never apply a non-finite update on device; train() stops the run instead.
        max_consecutive_non_finite=2**31 - 1,
    )


def loss_spec(config) -> LossSpec:
    return LossSpec(
        gamma=config.gamma,
        vf_loss_coeff=config.vf_loss_coeff,
        entropy_coeff=config.resolved_entropy_coeff,  # optim.piecewise_linear validates it
        clip_rho_threshold=config.vtrace_clip_rho_threshold,
        clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
        clip_rewards=clip_rewards(config),
    )


def step_spec(config, num_devices: int) -> StepSpec:
    T = config.get_rollout_fragment_length()
    columns = config.train_batch_size_per_learner // T
    replay_columns = 0
    replay_slots = 0
    if config.replay_proportion > 0 and config.replay_buffer_num_slots > 0:
        # "replayed with a p:1 proportion to new data": p * columns replayed columns per step.
        replay_columns = max(1, round(config.replay_proportion * columns))
        replay_slots = math.ceil(config.replay_buffer_num_slots / num_devices)
    total = columns + replay_columns
    if config.minibatch_size is None:
        mb = total
    else:
        global_mb = config.minibatch_size // T
        if global_mb % num_devices:
            raise ValueError(
                f"training(minibatch_size={config.minibatch_size}) is {global_mb} fragments of "
                f"{T} steps, which does not split over {num_devices} learner devices; use a "
                f"multiple of {T * num_devices}."
            )
        mb = global_mb // num_devices
        if total % mb:
            raise ValueError(
                f"training(minibatch_size={config.minibatch_size}) does not divide the per-device "
                f"batch of {total} fragments ({columns} new + {replay_columns} replayed); choose "
                f"a minibatch_size whose fragment count divides {total}."
            )
    return StepSpec(
        columns=columns,
        replay_columns=replay_columns,
        replay_slots=replay_slots,
        minibatch_columns=mb,
        # With a minibatch buffer, epochs are passes over the host-side ring of batches
        # (buffers.MinibatchBuffer); otherwise they run inside the one compiled step.
        num_epochs=1 if config.minibatch_buffer_size > 1 else config.num_epochs,
        shuffle=bool(config.shuffle_batch_per_epoch),
    )


def clip_rewards(config):
    if config.clip_rewards is None:
        return True if config.is_atari else None  # RLlib clips Atari rewards by default
    return config.clip_rewards
