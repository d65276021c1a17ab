"""Multi-agent IMPALA: RLlib's ``config.multi_agent(...)``, several policies in one run.

``IMPALAConfig().multi_agent(policies=..., policy_mapping_fn=...)`` builds a
``MultiAgentIMPALA``: the env is a multi-agent env (RLlib's ``MultiAgentEnv`` protocol or a
PettingZoo parallel env, runtime/multiagent/envs.py), each agent's steps form its own V-trace
trajectory (runtime/multiagent/lanes.py, docs/semantics.md), and the policies, which share one
architecture, are updated together by one compiled program over a stacked policy axis
(runtime/learning/policy_stack.py). What RLlib does per module (the loss, schedules,
gradient clipping, replay) is done per policy inside that program; a policy's ``config``
overrides of a few numbers (``PER_POLICY``) are traced per policy.

Results carry RLlib's multi-agent keys: ``env_runners/module_episode_returns_mean/<id>``,
``env_runners/agent_episode_returns_mean/<agent>``, ``learners/<id>/...`` and
``learners/__all_modules__/...``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from impala_jax.core.policy import make_act_fns
from impala_jax.rllib import diagnostics, specs
from impala_jax.rllib.algorithm import IMPALA
from impala_jax.rllib.callbacks import EPISODE_HOOKS
from impala_jax.rllib.module import Actions, Module
from impala_jax.runtime.acting.evaluation import EVAL_SEED_OFFSET
from impala_jax.runtime.acting.policy import make_policy
from impala_jax.runtime.envs.vec_env import ActionAdapter
from impala_jax.runtime.learning import program_cache
from impala_jax.runtime.learning.policy_stack import PolicyStackLearner
from impala_jax.runtime.metrics import deep_merge
from impala_jax.runtime.multiagent.engine import MultiAgentEngine, MultiAgentSpec
from impala_jax.runtime.multiagent.envs import make_multi_agent_env
from impala_jax.runtime.multiagent.evaluation import MultiAgentEvaluationSpec, MultiAgentEvaluator
from impala_jax.runtime.multiagent.lanes import RecurrentLayout
from impala_jax.runtime.multiagent.sampler import EpisodeView, MultiAgentSampler, StackedActor

DEFAULT_POLICY = "default_policy"


def policy_specs(config) -> dict[str, dict]:
    """``{policy id: {"observation_space", "action_space", "config"}}`` from ``policies``
    (None, an RLlib ``PolicySpec`` or a 4-tuple ``(cls, obs_space, act_space, config)``)."""
    out = {}
    for pid, spec in config.policies.items():
        if spec is None:
            out[pid] = {"observation_space": None, "action_space": None, "config": {}}
        elif isinstance(spec, list | tuple):
            _, obs_space, act_space, overrides = spec
            out[pid] = {
                "observation_space": obs_space,
                "action_space": act_space,
                "config": dict(overrides or {}),
            }
        else:  # RLlib's PolicySpec (a dataclass-like object)
            out[pid] = {
                "observation_space": getattr(spec, "observation_space", None),
                "action_space": getattr(spec, "action_space", None),
                "config": dict(getattr(spec, "config", None) or {}),
            }
    return out


def trained(config, policy_ids: list[str]) -> tuple[bool, ...]:
    chosen = config.policies_to_train
    return tuple(chosen is None or pid in chosen for pid in policy_ids)


def per_policy_hparams(config, policy_ids: list[str]) -> dict[str, np.ndarray]:
    """The overridden numbers as ``{name: [M]}``: each policy's own value or the config's."""
    specs_ = policy_specs(config)
    names = sorted({k for pid in policy_ids for k in specs_[pid]["config"]})
    return {
        name: np.asarray(
            [specs_[pid]["config"].get(name, getattr(config, name)) for pid in policy_ids],
            np.float32,
        )
        for name in names
    }


class PolicyView:
    """One policy's params out of the stacked ParamStore: what ``Module`` and ``Actions`` read."""

    def __init__(self, store, index: int):
        self._store, self._index = store, index

    def get(self) -> tuple[Any, int]:
        params, version = self._store.get()
        return jax.tree.map(lambda x: x[self._index], params), version


class MultiAgentIMPALA(IMPALA):
    """IMPALA over several policies; see the module docstring."""

    def _build_policy(self, seed: int, actor_device) -> None:
        config = self.config
        if self._processes > 1:
            raise ValueError(
                "multi_agent() over several processes is not offered yet; run one process "
                "(learners(num_learners=N) uses N devices of it)."
            )
        probe = make_multi_agent_env(config.env, config.env_config)
        try:
            self.agent_ids = list(probe.possible_agents)
            spaces = {
                a: (probe.observation_space(a), probe.action_space(a)) for a in self.agent_ids
            }
        finally:
            probe.close()
        self.policy_ids = list(config.policies)
        self._mapping_fn = config.policy_mapping_fn
        obs_space, act_space = _one_space_pair(spaces, policy_specs(config))
        self.observation_space, self.action_space = obs_space, act_space
        policy = make_policy(specs.policy_spec(config), obs_space, act_space, actor_device)
        self.policy = policy
        self.networks, self.distribution = policy.networks, policy.distribution
        self.recurrent = policy.recurrent
        self._act, self._act_greedy = make_act_fns(policy.networks, policy.distribution)
        self._adapter = ActionAdapter(
            act_space, config.normalize_actions, config.clip_actions, str(config.env)
        )
        # The most agents one policy acts for in an episode: a policy's columns per update.
        probe_episode = EpisodeView("probe", 0)
        counts = [0] * len(self.policy_ids)
        for agent in self.agent_ids:
            counts[self.map_agent(agent, probe_episode)] += 1
        self._agents_per_policy = max(counts)

    def map_agent(self, agent_id, episode: EpisodeView) -> int:
        """The index of the policy ``policy_mapping_fn`` picks for ``agent_id``."""
        fn = self._mapping_fn
        pid = DEFAULT_POLICY if fn is None else fn(agent_id, episode)
        try:
            return self.policy_ids.index(pid)
        except ValueError:
            raise ValueError(
                f"policy_mapping_fn returned {pid!r} for agent {agent_id!r}; the policies are "
                f"{self.policy_ids} (multi_agent(policies=...))."
            ) from None

    def _build_learner(self, devices: list, num_local: int, learner_key) -> int:
        config, policy = self.config, self.policy
        self.opt_spec = specs.optimizer_spec(config)
        loss_spec = specs.loss_spec(config)
        base = specs.step_spec(config, len(devices))
        k = self._agents_per_policy
        self._base_columns = base.columns * num_local
        self.step_spec = dataclasses.replace(
            base,
            columns=base.columns * k,
            replay_columns=base.replay_columns * k,
            replay_slots=base.replay_slots * k,
            minibatch_columns=base.minibatch_columns * k,
        )
        columns = self.step_spec.columns * num_local
        keys = list(jax.random.split(learner_key, len(self.policy_ids)))
        spaces = (self.observation_space, self.action_space)
        describe = program_cache.model_description
        program_key = None if policy.custom else describe(config.model_config, *spaces)

        def example_batch(params):
            self.action_dtype = policy.action_dtype(params)
            return policy.example_batch(self._T, columns, self.action_dtype)

        self.learner = PolicyStackLearner(
            self.networks,
            self.distribution,
            self.opt_spec,
            loss_spec,
            self.step_spec,
            devices,
            keys,
            hparams=per_policy_hparams(config, self.policy_ids) or None,
            program_key=program_key,
            example=example_batch,
        )
        return columns

    def _build_engine(self, seed: int, actor_device, columns: int, actor_key) -> None:
        config = self.config
        hooks = [h for h in EPISODE_HOOKS if self._callbacks.has(h)]
        if hooks:  # a callbacks_class's methods (the per-event callables fail validate())
            raise ValueError(
                f"callbacks(callbacks_class=...): {', '.join(hooks)} of multi-agent runs are "
                "not offered yet; the algorithm-level hooks (on_algorithm_init, "
                "on_train_result, ...) are."
            )
        actor = StackedActor.of(self._act, self._act_greedy, bool(config.explore))
        keys = jax.random.split(actor_key, max(1, config.num_env_runners) + 1)

        def make_sampler(index: int) -> MultiAgentSampler:
            seed_ = seed * 1_000_003 + index * 100_003
            n = config.num_envs_per_env_runner
            return self._sampler(config, n, actor, keys[index], seed_, index)

        spec = MultiAgentSpec(
            num_env_runners=config.num_env_runners,
            rollout_fragment_length=self._T,
            columns=columns,
            batch_steps=self._base_columns * self._T,
            count_steps_by=config.count_steps_by,
            train=trained(config, self.policy_ids),
            window=config.metrics_num_episodes_for_smoothing,
            max_queued_columns=2 * columns,
        )
        fault = specs.fault_tolerance_spec(config)
        self.engine = MultiAgentEngine(
            spec, fault, make_sampler, self.learner, actor_device, self.policy_ids
        )
        self.param_store = self.engine.param_store
        self._actions_by_policy = {
            pid: Actions(
                self.policy,
                PolicyView(self.param_store, i),
                self._adapter,
                jax.random.fold_in(actor_key, i),
            )
            for i, pid in enumerate(self.policy_ids)
        }
        self._evaluator = self._build_evaluator(seed, keys[-1])

    def _sampler(
        self, config, num_envs: int, actor, key, seed: int, index: int
    ) -> MultiAgentSampler:
        """``num_envs`` of ``config``'s envs, stepped by one sampler acting with ``actor``."""
        envs = [make_multi_agent_env(config.env, config.env_config) for _ in range(num_envs)]
        obs_like = np.zeros(self.observation_space.shape, self.observation_space.dtype)
        params = self.learner.abstract_state.params
        action_like = np.zeros(self.action_space.shape, self.policy.action_dtype(params))
        recurrent = None
        if self.recurrent:  # the lanes carry the policy's state (policy.act: RecurrentActor)
            recurrent = RecurrentLayout(self.policy.act.initial_state, self.networks.max_seq_len)
        return MultiAgentSampler(
            envs,
            self._T,
            obs_like,
            action_like,
            self.networks.dist_size,
            self.map_agent,
            actor,
            len(self.policy_ids),
            key,
            seed=seed,
            to_env=self._to_env,
            runner_index=index,
            recurrent=recurrent,
        )

    def _build_evaluator(self, seed: int, key) -> MultiAgentEvaluator:
        """The evaluation's sampler, from the evaluation config (``evaluation_config``
        applied; greedy unless it sets ``explore``), on envs seeded apart from training's."""
        config = specs.evaluation_config(self.config)
        actor = StackedActor.of(self._act, self._act_greedy, bool(config.explore))
        num_envs = max(1, config.evaluation_num_env_runners) * config.num_envs_per_env_runner
        made = [0]

        def make_sampler() -> MultiAgentSampler:
            made[0] += 1
            seed_ = EVAL_SEED_OFFSET + seed * 1_000_003 + made[0] * 10_007
            key_ = jax.random.fold_in(key, made[0])
            return self._sampler(config, num_envs, actor, key_, seed_, -made[0])

        spec = MultiAgentEvaluationSpec(
            evaluation_duration=config.evaluation_duration,
            evaluation_duration_unit=config.evaluation_duration_unit,
            evaluation_sample_timeout_s=float(config.evaluation_sample_timeout_s),
            window=config.metrics_num_episodes_for_smoothing,
        )
        return MultiAgentEvaluator(spec, make_sampler, self.param_store, self.policy_ids)

    def _to_env(self, actions: np.ndarray) -> list:
        """The env's actions for a batch of the policies' (Box actions rescaled and checked),
        as Python values: ints for a Discrete space, arrays for a Box."""
        env_actions = self._adapter(actions, len(actions))
        return env_actions.tolist() if env_actions.ndim == 1 else list(env_actions)

    def get_module(self, module_id: str = DEFAULT_POLICY) -> Module | None:
        """Policy ``module_id`` for inference; None for an unknown id, as in RLlib."""
        actions = getattr(self, "_actions_by_policy", {}).get(module_id)
        # Actions.module(): a clear ValueError for a recurrent policy, which acts with a state.
        return None if actions is None else actions.module()

    def get_initial_state(self, policy_id: str = DEFAULT_POLICY):
        """Policy ``policy_id``'s recurrent state for one agent at an episode's start (RLlib's
        ``get_initial_state``); ``{}`` for a feedforward policy."""
        if policy_id not in self._actions_by_policy:
            raise ValueError(
                f"get_initial_state(policy_id={policy_id!r}): the policies are {self.policy_ids}."
            )
        return self._actions_by_policy[policy_id].initial_state()

    def compute_single_action(self, observation=None, state=None, *, policy_id=None, **kwargs):
        """One agent's action from policy ``policy_id`` (RLlib's keyword; required here)."""
        if policy_id not in self._actions_by_policy:
            raise ValueError(
                f"compute_single_action(policy_id={policy_id!r}): the policies are "
                f"{self.policy_ids}."
            )
        explore = self._explore(kwargs.pop("explore", None))
        return self._actions_by_policy[policy_id].compute_single_action(
            observation, state, explore=explore, **kwargs
        )

    def compute_actions(self, observations, *, explore=None, policy_id=None):
        if policy_id not in self._actions_by_policy:
            raise ValueError(
                f"compute_actions(policy_id={policy_id!r}): the policies are {self.policy_ids}."
            )
        return self._actions_by_policy[policy_id].compute_actions(
            observations, explore=self._explore(explore)
        )

    def get_weights(self, policies: list[str] | None = None) -> dict:
        params = jax.device_get(self.learner.state.params)
        chosen = self.policy_ids if policies is None else list(policies)
        unknown = set(chosen) - set(self.policy_ids)
        if unknown:
            raise KeyError(
                f"get_weights: no module {sorted(unknown)}; the modules are {self.policy_ids}."
            )
        index = {pid: i for i, pid in enumerate(self.policy_ids)}
        return {pid: jax.tree.map(lambda x, i=index[pid]: x[i], params) for pid in chosen}

    def set_weights(self, weights: dict) -> None:
        unknown = set(weights) - set(self.policy_ids)
        if unknown:
            raise KeyError(
                f"set_weights: no module {sorted(unknown)}; the modules are {self.policy_ids}."
            )
        for pid, params in weights.items():
            self.learner.set_params(self.policy_ids.index(pid), params)
        self.engine.publish()

    def _learner_results(self, fetched: dict) -> list[dict]:
        """One member whose learner metrics are ``{policy id: {metric: float}}``."""
        return [
            {
                pid: {k: float(np.asarray(v)[i]) for k, v in fetched.items()}
                for i, pid in enumerate(self.policy_ids)
            }
        ]

    def _check_learner(self, learners: list[dict]) -> None:
        (modules,) = learners
        for pid, learner in modules.items():
            message = diagnostics.non_finite_message(learner)
            if message:
                self.stop()
                raise FloatingPointError(f"policy {pid!r}: {message}")

    def _finish_result(self, result: dict, learner: dict) -> dict:
        """What the algorithm's hooks logged (the dead-policy report reads one module)."""
        return deep_merge(result, self.metrics.reduce())


def _one_space_pair(spaces: Mapping, policy_specs_: Mapping) -> tuple:
    """The one (observation space, action space) every agent and policy shares: the policies
    are stacked in one program, so their networks must be the same shape."""
    pairs = {(repr(o), repr(a)) for o, a in spaces.values()}
    if len(pairs) > 1:
        shown = ", ".join(f"{agent!r}: {o}, {a}" for agent, (o, a) in spaces.items())
        raise ValueError(
            "multi_agent: the agents' observation and action spaces differ "
            f"({shown}); policies of different shapes are not offered yet (the policies are "
            "stacked in one compiled program)."
        )
    obs_space, act_space = next(iter(spaces.values()))
    for pid, spec in policy_specs_.items():
        for name, own, env_space in (
            ("observation_space", spec["observation_space"], obs_space),
            ("action_space", spec["action_space"], act_space),
        ):
            if own is not None and own != env_space:
                raise ValueError(
                    f"multi_agent(policies={{{pid!r}: ...}}): its {name} {own} is not the "
                    f"agents' {env_space}; policies of different shapes are not offered yet."
                )
    return obs_space, act_space
