"""The frozen config -> the specs the layers below take instead of it: the static specs the
compiled learner step closes over, the specs of the runners, their fault tolerance, the
evaluation, the policy and the callbacks, and the batch layout (`batch_layout`) that the
config's checks and derived sizes read too. runtime/ and core/ never read the config object
(tests/test_layers.py); every read of it is here."""

from __future__ import annotations

import dataclasses
import math

from impala_jax.core.losses import LossSpec
from impala_jax.core.optim import OptimizerSpec
from impala_jax.core.update import StepSpec
from impala_jax.rllib.callbacks import CALLBACK_KEYWORDS, CallbacksSpec
from impala_jax.runtime.acting.env_runner import RunnerSpec
from impala_jax.runtime.acting.env_runner_group import FaultToleranceSpec
from impala_jax.runtime.acting.evaluation import EvaluationSpec
from impala_jax.runtime.acting.policy import PolicySpec
from impala_jax.runtime.engine import DeviceSpec, HostEngineSpec
from impala_jax.runtime.envs.vec_env import EnvSpec
from impala_jax.runtime.learning.buffers import LoaderSpec
from impala_jax.runtime.learning.parallel import learner_device_count


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """How one update's batch is made of fragments (see `batch_layout`)."""

    fragment_length: int  # T
    columns: int  # new fragments per learner device per update
    replay_columns: int  # replayed fragments mixed in per device (mixin replay)
    num_devices: int  # learner devices: num_learners, or 0 for one of each process


def batch_layout(config) -> BatchLayout:
    """The per-update batch: `train_batch_size_per_learner` rounded up to whole fragments.

    RLlib's IMPALA packs whole fragments until a package holds at least
    `train_batch_size_per_learner` env steps, so e.g. 512 with fragments of 50 trains on
    11 x 50 = 550 steps per learner; impala_jax does the same, per learner device.
    """
    T = config.get_rollout_fragment_length()
    columns = -(-config.train_batch_size_per_learner // T)
    replay_columns = 0
    if config.replay_proportion > 0 and config.replay_buffer_num_slots > 0:
        # "replayed with a p:1 proportion to new data": p * columns replayed columns per step.
        replay_columns = max(1, round(config.replay_proportion * columns))
    devices = learner_device_count(config.num_learners)
    return BatchLayout(T, columns, replay_columns, devices)


def optimizer_spec(config) -> OptimizerSpec:
    return OptimizerSpec(
        opt_type=config.opt_type,
        lr=config.resolved_lr,
        grad_clip=config.grad_clip,
        grad_clip_by=config.grad_clip_by,
        decay=config.decay,
        momentum=config.momentum,
        epsilon=config.epsilon,
        rmsprop_initial_scale=config.rmsprop_initial_scale,
        separate_vf_optimizer=config._separate_vf_optimizer,
        lr_vf=config._lr_vf,
        # Never apply a non-finite update on device; train() stops the run instead.
        max_consecutive_non_finite=2**31 - 1,
    )


def loss_spec(config) -> LossSpec:
    """Each LossSpec field from the config field of its name, but for the two derived ones."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(LossSpec)}
    fields["entropy_coeff"] = config.resolved_entropy_coeff  # optim.piecewise_linear checks it
    fields["clip_rewards"] = clip_rewards(config)
    return LossSpec(**fields)


def step_spec(config, num_devices: int) -> StepSpec:
    """The learner's static batch layout; `config.validate()` has already checked it."""
    layout = batch_layout(config)
    T, columns, replay_columns = layout.fragment_length, layout.columns, layout.replay_columns
    replay_slots = 0
    if replay_columns:
        replay_slots = math.ceil(config.replay_buffer_num_slots / num_devices)
    total = columns + replay_columns
    if config.minibatch_size is None:
        mb = total
    else:
        global_mb = config.minibatch_size // T
        mb = global_mb // num_devices
        if global_mb % num_devices or mb == 0 or total % mb:
            raise ValueError(
                f"training(minibatch_size={config.minibatch_size}) does not split the per-device "
                f"batch of {total} fragments of {T} steps ({columns} new + {replay_columns} "
                f"replayed) over {num_devices} learner device(s) into equal minibatches."
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
        log_gradients=bool(config.log_gradients),
    )


def clip_rewards(config):
    if config.clip_rewards is None:
        # RLlib clips Atari rewards by default; is_atari=None: detected from the env id.
        is_atari = config.is_atari
        if is_atari is None:
            from impala_jax.runtime.envs.env_registry import is_atari_id

            is_atari = is_atari_id(config.env)
        return True if is_atari else None
    return config.clip_rewards


def device_spec(config) -> DeviceSpec:
    """An on-device run's rollout (runtime/ondevice/device_engine.py)."""
    return DeviceSpec(
        env=str(config.env),
        num_envs=config.num_envs_per_env_runner * max(1, config.num_env_runners),
        rollout_fragment_length=config.get_rollout_fragment_length(),
        policy_lag=config.policy_lag or 0,
        explore=bool(config.explore),
        normalize_actions=bool(config.normalize_actions),
        clip_actions=bool(config.clip_actions),
    )


def host_engine_spec(config, step: StepSpec, num_devices: int) -> HostEngineSpec:
    """How the host engine feeds a learner of ``num_devices`` devices taking ``step``'s batch."""
    trained_columns = (step.columns + step.replay_columns) * num_devices
    return HostEngineSpec(
        minibatch_buffer_size=config.minibatch_buffer_size,
        num_epochs=config.num_epochs,
        fake_sampler=bool(config.fake_sampler),
        sample_only=bool(config._env_runners_only or config._skip_learners),
        env_steps_trained_per_update=trained_columns * config.get_rollout_fragment_length(),
    )


def _by_name(spec_class, config, **derived):
    """``spec_class`` with each field from the config field of its name, but for ``derived``."""
    fields = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(spec_class)
        if f.name not in derived
    }
    return spec_class(**fields, **derived)


def policy_spec(config) -> PolicySpec:
    factory = getattr(config.get_default_rl_module_spec(), "factory", None)
    return _by_name(PolicySpec, config, network_factory=factory)


def callbacks_spec(config, env_runner_config=None) -> CallbacksSpec:
    """The callbacks of ``config``; its episode callbacks see ``env_runner_config`` (default:
    ``config``) as ``env_runner.config``."""
    return CallbacksSpec(
        callbacks_class=config.callbacks_class,
        hooks={hook: getattr(config, hook) for hook in CALLBACK_KEYWORDS},
        env_runner_config=config if env_runner_config is None else env_runner_config,
    )


def runner_spec(config) -> RunnerSpec:
    return _by_name(
        RunnerSpec,
        config,
        env=_by_name(EnvSpec, config, num_workers=config.num_env_runners),
        rollout_fragment_length=config.get_rollout_fragment_length(),
        callbacks=callbacks_spec(config),
    )


def loader_spec(config) -> LoaderSpec:
    return _by_name(LoaderSpec, config)


def fault_tolerance_spec(config) -> FaultToleranceSpec:
    return _by_name(FaultToleranceSpec, config)


def evaluation_config(config):
    """The config evaluation runs with: ``evaluation_config``'s overrides applied, and
    ``explore=False`` unless they set it (RLlib's evaluation acts greedily by default)."""
    eval_config = config.copy(copy_frozen=False)
    overrides = dict(config.evaluation_config or {})
    overrides.setdefault("explore", False)
    eval_config.update_from_dict(overrides)
    return eval_config.freeze()


def evaluation_spec(config) -> EvaluationSpec:
    """How and how long to evaluate from ``config``; the envs, ``explore`` and the callbacks
    from its evaluation config. Episode callbacks see the training config as
    ``env_runner.config``, as they always have."""
    eval_config = evaluation_config(config)
    return _by_name(
        EvaluationSpec,
        config,
        env=_by_name(EnvSpec, eval_config, num_workers=eval_config.evaluation_num_env_runners),
        explore=eval_config.explore,
        callbacks=callbacks_spec(eval_config, env_runner_config=config),
    )
