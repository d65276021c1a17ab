"""Multi-agent envs behind RLlib's dict protocol: RLlib ``MultiAgentEnv``s, PettingZoo parallel
envs, and any object with ``possible_agents`` whose ``step`` takes and returns dicts.

``MultiAgentEnvAdapter.step`` always returns ``"__all__"`` in ``terminateds`` and
``truncateds``, which is what `AgentLanes` reads an env episode's end from. Neither ray nor
pettingzoo is imported here: an object of their classes can only exist once its module is
imported, so their base classes are looked up in ``sys.modules``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from impala_jax.runtime.envs.env_registry import EnvContext, call_creator, registered_creator

ALL = "__all__"


def _loaded_class(module: str, name: str) -> type | None:
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _rllib_env_class() -> type | None:
    return _loaded_class("ray.rllib.env.multi_agent_env", "MultiAgentEnv")


def _is_subclass(cls: type, base: type | None) -> bool:
    return base is not None and issubclass(cls, base)


def _is_aec(env: Any) -> bool:
    """A PettingZoo AEC env: it steps one agent at a time (``env.step(action)``)."""
    cls = env if isinstance(env, type) else type(env)
    if _is_subclass(cls, _loaded_class("pettingzoo.utils.env", "AECEnv")):
        return True
    return callable(getattr(env, "agent_iter", None)) and callable(getattr(env, "last", None))


def is_multi_agent_env(env: Any) -> bool:
    """Whether ``env`` (a class or an instance) is a multi-agent env: an RLlib
    ``MultiAgentEnv``, a PettingZoo env, or an object with ``possible_agents``, ``step`` and
    ``reset`` (a class: one that declares ``possible_agents``)."""
    cls = env if isinstance(env, type) else type(env)
    if _is_subclass(cls, _rllib_env_class()) or _is_aec(env):
        return True
    if _is_subclass(cls, _loaded_class("pettingzoo.utils.env", "ParallelEnv")):
        return True
    if isinstance(env, type):
        # PettingZoo's envs set possible_agents in __init__ and only annotate it on the class.
        declared = any("possible_agents" in getattr(k, "__annotations__", {}) for k in cls.__mro__)
        return declared or hasattr(cls, "possible_agents")
    steps = callable(getattr(env, "step", None)) and callable(getattr(env, "reset", None))
    return steps and hasattr(env, "possible_agents")


def _space(env: Any, agent_id: Any, kind: str) -> Any:
    """Agent ``agent_id``'s observation or action space, as RLlib asks for it
    (``get_observation_space(aid)``, which reads ``observation_spaces``) or as PettingZoo
    defines it (``observation_space(aid)``)."""
    getter = getattr(env, f"get_{kind}_space", None)
    if callable(getter):
        return getter(agent_id)
    method = getattr(env, f"{kind}_space", None)
    if callable(method):  # a gymnasium Space is not callable: this is PettingZoo's method
        return method(agent_id)
    spaces = getattr(env, f"{kind}_spaces", None)
    if isinstance(spaces, Mapping) and agent_id in spaces:
        return spaces[agent_id]
    raise ValueError(
        f"{type(env).__name__} gives no {kind} space for agent {agent_id!r}: define "
        f"{kind}_spaces (a dict by agent id) or a method {kind}_space(agent_id)"
    )


class MultiAgentEnvAdapter:
    """A multi-agent env speaking RLlib's dict protocol, with ``"__all__"`` always present.

    RLlib envs that leave ``"__all__"`` out get False, as RLlib's ``MultiAgentEpisode`` reads
    them. Other envs (PettingZoo's parallel API) have no ``"__all__"``: the episode ends when no
    agent is left (``env.agents`` empty, or every agent the step returned is done). It is then
    terminated if every returned agent was, else truncated, so that an agent truncated in the
    last step keeps its bootstrap value (`AgentLanes` ORs ``"__all__"`` into each agent's flags).
    """

    def __init__(self, env: Any):
        if _is_aec(env):
            raise ValueError(
                f"{type(env).__name__} is a PettingZoo AEC env, which steps one agent at a time; "
                "convert it with pettingzoo.utils.conversions.aec_to_parallel(env) (or make its "
                "parallel_env())"
            )
        possible = getattr(env, "possible_agents", None)
        if not possible:
            raise ValueError(
                "multi-agent envs need possible_agents (the agents that may ever act), got "
                f"{possible!r} from {type(env).__name__}"
            )
        self.env = env
        self.possible_agents = list(possible)
        self._rllib = _is_subclass(type(env), _rllib_env_class())

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """``(obs, infos)``: the observations of the agents that act first."""
        result = self.env.reset(seed=seed, options=options)
        # PettingZoo before 1.22 returned the observations alone.
        if isinstance(result, tuple) and len(result) == 2:
            return dict(result[0]), dict(result[1] or {})
        return dict(result), {}

    def step(self, actions: Mapping[Any, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """``(obs, rewards, terminateds, truncateds, infos)``, with ``"__all__"``."""
        result = self.env.step(dict(actions))
        if not (isinstance(result, tuple) and len(result) == 5):
            raise ValueError(
                f"{type(self.env).__name__}.step returned {type(result).__name__} of length "
                f"{len(result) if isinstance(result, tuple) else '?'}; expected (obs, rewards, "
                "terminateds, truncateds, infos) dicts (RLlib's and PettingZoo's parallel API)"
            )
        obs, rewards, terminateds, truncateds, infos = (dict(d or {}) for d in result)
        if self._rllib or ALL in terminateds or ALL in truncateds:
            terminateds.setdefault(ALL, False)
            truncateds.setdefault(ALL, False)
        else:
            terminateds[ALL], truncateds[ALL] = self._episode_end(
                obs, rewards, terminateds, truncateds
            )
        return obs, rewards, terminateds, truncateds, infos

    def _episode_end(
        self, obs: dict, rewards: dict, terminateds: dict, truncateds: dict
    ) -> tuple[bool, bool]:
        """``("__all__" terminated, "__all__" truncated)`` of a PettingZoo-style step."""
        returned = set(obs) | set(rewards) | set(terminateds) | set(truncateds)
        alive = [a for a in returned if not (terminateds.get(a) or truncateds.get(a))]
        agents = getattr(self.env, "agents", None)
        done = (agents is not None and not agents) or (bool(returned) and not alive)
        if not done:
            return False, False
        terminated = all(terminateds.get(a, False) for a in returned)
        return terminated, not terminated

    def observation_space(self, agent_id: Any) -> Any:
        return _space(self.env, agent_id, "observation")

    def action_space(self, agent_id: Any) -> Any:
        return _space(self.env, agent_id, "action")

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def make_multi_agent_env(
    env: Any, env_config: Mapping[str, Any] | None = None
) -> MultiAgentEnvAdapter:
    """The adapted env ``environment(env=...)`` names: a name given to ``register_env``
    (impala_jax's or Ray Tune's), a class or a creator (called with an ``EnvContext`` of
    ``env_config``, as RLlib calls them), or an instance."""
    context = env_config if isinstance(env_config, EnvContext) else EnvContext(env_config or {})
    if isinstance(env, MultiAgentEnvAdapter):
        return env
    if isinstance(env, str):
        creator = registered_creator(env)
        if creator is None:
            raise ValueError(
                f"environment(env={env!r}): no env is registered under that name; register its "
                "creator with impala_jax.register_env or ray.tune.register_env, or pass the env "
                "class, a creator function or an instance"
            )
        made = call_creator(creator, context)
    elif isinstance(env, type) or (callable(env) and not is_multi_agent_env(env)):
        made = call_creator(env, context)
    else:
        made = env
    if not is_multi_agent_env(made):
        raise ValueError(
            f"environment(env={env!r}) made a {type(made).__name__}, which is not a multi-agent "
            "env: expected an RLlib MultiAgentEnv, a PettingZoo ParallelEnv, or an object with "
            "possible_agents whose step takes and returns dicts by agent id"
        )
    return MultiAgentEnvAdapter(made)
