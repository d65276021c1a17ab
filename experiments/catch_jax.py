"""Your own env written in JAX: a Catch game as a gymnax Environment, trained on device.

``Catch`` below subclasses gymnax's ``Environment`` and defines what gymnax asks of an env:
``default_params``, ``reset_env``, ``step_env`` (one env, no autoreset), ``observation_space``
and ``action_space``; gymnax's ``is_truncated`` cuts an episode at ``max_steps_in_episode``.
That is how impala_jax recognises an env written in JAX: ``environment(Catch)`` (or
``Catch()``, ``"experiments.catch_jax:Catch"``, or a name given to ``register_env``) steps it
inside the program that acts and updates, as ``"gymnax:<id>"`` does (docs/config.md, "Envs
written in JAX"). ``env_config`` sets fields of its ``EnvParams``. Keep the class importable
(module level): checkpoints store it by its import path, ``experiments.catch_jax:Catch`` from
the repository root.

The game (bsuite's Catch, Osband et al. 2020): a ball falls from a random column of the top
row, one row per step; the paddle on the bottom row moves left, stays or moves right. The
episode ends when the ball reaches the bottom row: +1 when the paddle is under it, else -1.
Every episode lasts ``rows - 1`` steps, so early returns are not biased towards short ones.
Observation: [ball column, ball row, paddle column], scaled to [0, 1]. A random policy
returns about -0.6; the optimum is 1.

Goal: a return of 0.9 within 1 M env steps (the stop below); measured: 0.96 at 0.42 M env steps
(seed 0, 2 s of training on a 2-core CPU, 7 s when it compiles from scratch; seeds 1-3 reach 0.9
by 0.38 M).
"""

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from impala_jax import IMPALAConfig


@struct.dataclass
class CatchState(environment.EnvState):
    ball_x: jax.Array
    ball_y: jax.Array
    paddle_x: jax.Array


@struct.dataclass
class CatchParams(environment.EnvParams):
    rows: int = 10
    columns: int = 5
    max_steps_in_episode: int = 100


class Catch(environment.Environment):
    """One game; pure functions of (key, state, action, params), no autoreset."""

    @property
    def default_params(self) -> CatchParams:
        return CatchParams()

    def reset_env(self, key, params):
        ball_key, paddle_key = jax.random.split(key)
        state = CatchState(
            time=0,
            ball_x=jax.random.randint(ball_key, (), 0, params.columns),
            ball_y=jnp.int32(0),
            paddle_x=jax.random.randint(paddle_key, (), 0, params.columns),
        )
        return self._obs(state, params), state

    def step_env(self, key, state, action, params):
        paddle_x = jnp.clip(state.paddle_x + action - 1, 0, params.columns - 1)
        state = state.replace(time=state.time + 1, ball_y=state.ball_y + 1, paddle_x=paddle_x)
        terminated = state.ball_y >= params.rows - 1
        caught = jnp.where(state.ball_x == paddle_x, 1.0, -1.0)
        reward = jnp.where(terminated, caught, 0.0)
        return self._obs(state, params), state, reward, terminated, {}

    def _obs(self, state, params):
        xs = jnp.array([state.ball_x, state.ball_y, state.paddle_x], jnp.float32)
        return xs / jnp.array([params.columns - 1, params.rows - 1, params.columns - 1])

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (3,), jnp.float32)

    def action_space(self, params):
        return spaces.Discrete(3)  # 0: left, 1: stay, 2: right


config = (
    IMPALAConfig()
    .environment(Catch, env_config={"rows": 10, "columns": 5})
    .env_runners(num_env_runners=1, num_envs_per_env_runner=16, rollout_fragment_length=20)
    .training(lr=3e-3, train_batch_size_per_learner=320, entropy_coeff=0.01)
    .learners(num_learners=0)
    .rl_module(model_config={"fcnet_hiddens": [32]})
    .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=16_000)
    .debugging(seed=0)
)

stop = {"env_runners/episode_return_mean": 0.9, "num_env_steps_sampled_lifetime": 1_000_000}
