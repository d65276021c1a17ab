"""``make_train(config, num_env_steps)``: a run on device as one pure function of a PRNG key.

PureJaxRL's habit: ``train = make_train(config)`` returns ``train(key)``, whose whole loop is one
``lax.scan``, so a researcher can ``jax.jit(train)``, ``jax.vmap(train)`` over seeds, or call it
inside a program of their own. Here ``config`` is an ``IMPALAConfig`` whose env is written in
JAX (``"gymnax:<id>"`` or a gymnax ``Environment`` of one's own); ``num_env_steps`` sets the
number of updates (rounded up to whole updates of ``train_batch_size_per_learner`` x the
learner devices). The function is the device
engine's own program scanned (``DeviceEngine.train_function``): ``train(jax.random.key(seed))``
makes the updates ``IMPALA.train()`` makes with ``debugging(seed=seed)`` (tests/test_make_train.py).

It returns ``(TrainCarry(state, replay, envs, ring), metrics)``: the final learner state
(``state.params``), and per update each learner metric, ``episode_return_sum`` and
``num_episodes`` (the episodes that ended in it) and ``num_env_steps_sampled_lifetime``.

Hyperparameters as traced values: ``train(key, hparams)`` with ``hparams`` a dict from names
of ``impala_jax.core.hyperparams.TRACEABLE`` (lr, entropy_coeff, vf_loss_coeff, gamma, the two
V-trace clip thresholds, grad_clip, RMSProp's decay, epsilon and momentum, lr_vf, policy_lag)
to values, read in place of the config's: ``jax.vmap(train)(keys, {"lr": lrs})`` trains one
member per lr in one program. A scheduled lr or entropy_coeff takes the schedule's values
(shape ``[K]``, the timesteps stay the config's); a traced ``policy_lag`` k acts with the params
of k updates before, up to the config's ``policy_lag``, which sizes the ring. Anything else
(network and batch sizes, the optimizer type) shapes the program: a ValueError names it.
"""

from __future__ import annotations

import math

from impala_jax.runtime.envs.env_registry import is_jax_env


def make_train(config, num_env_steps: int):
    """``train(key, hparams=None) -> (TrainCarry, metrics)`` for ``config``'s run of
    ``num_env_steps``."""
    if not is_jax_env(config.env, config.env_config):
        raise ValueError(
            f"make_train(config): environment(env={config.env!r}) is not an env written in "
            "JAX; the training function runs on device, with envs such as "
            "environment('gymnax:CartPole-v1'). Host envs train with config.build().train()."
        )
    if not isinstance(num_env_steps, int) or num_env_steps <= 0:
        raise ValueError(
            f"make_train(config, num_env_steps={num_env_steps!r}): expected an int > 0, the "
            "env steps to train for."
        )
    algo = config.build()
    try:
        engine = algo.engine
        updates = math.ceil(num_env_steps / engine.env_steps_per_update)
        return engine.train_function(updates)
    finally:
        algo.stop()
