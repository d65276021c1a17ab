"""`RLModuleSpec`: the network plug point, Brax's ``network_factory`` under RLlib's name.

``config.rl_module(rl_module_spec=RLModuleSpec(factory=my_factory))`` makes the learner and the
actors build their networks with ``my_factory(model_config, observation_space, action_space)``,
which returns an ``impala_jax.core.networks.Networks`` (``init(key) -> params``,
``apply(params, obs, with_features=False) -> (dist_inputs, value[, features])``, ``dist_size``),
as ``core/networks.py`` states them. ``factory`` may also be its import path ``"pkg.mod:fn"``
(what a checkpoint stores); None means impala_jax's own networks, chosen from ``model_config``.
No JAX here: the config imports this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from impala_jax.rllib.values import is_search_space
from impala_jax.runtime.acting.network_factory import OWN_FACTORY, is_own_factory, resolve_factory

# impala_jax's own network factory, as `IMPALAConfig.get_default_rl_module_spec()` names it.
DEFAULT_FACTORY = OWN_FACTORY

_HOW = (
    "pass impala_jax.RLModuleSpec(factory=fn) with fn(model_config, observation_space, "
    "action_space) -> impala_jax.core.networks.Networks (or its import path 'pkg.mod:fn'), or "
    "leave rl_module_spec=None and describe the network with rl_module(model_config=...)"
)


@dataclasses.dataclass(frozen=True)
class RLModuleSpec:
    """What the learner and the actors build their networks from.

    Given to ``rl_module(rl_module_spec=...)`` only ``factory`` is set (the model config and the
    spaces are the config's own fields); ``get_default_rl_module_spec()`` fills in the rest.
    """

    model_config: Mapping[str, Any] | None = None  # the merged model_config
    factory: Any = None  # None: impala_jax's; fn(model_config, obs_space, act_space); "pkg.mod:fn"
    observation_space: Any = None  # None: taken from the env
    action_space: Any = None

    def __repr__(self) -> str:
        given = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        ]
        return f"RLModuleSpec({', '.join(given)})"


def as_rl_module_spec(value: Any) -> Any:
    """The setter of ``rl_module_spec``: None, a search space, or an `RLModuleSpec` (a dict of
    its fields, as ``to_dict()`` writes it, becomes one). Anything else raises ValueError."""
    if value is None or is_search_space(value):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(RLModuleSpec)})
        if unknown:
            raise ValueError(
                f"rl_module_spec={value!r}: unknown key(s) {unknown}; a dict takes the fields of "
                f"impala_jax.RLModuleSpec, e.g. {{'factory': 'pkg.mod:fn'}}."
            )
        value = RLModuleSpec(**value)
    if not isinstance(value, RLModuleSpec):
        if type(value).__module__.startswith("ray.rllib") or hasattr(value, "module_class"):
            why = "RLlib's RLModuleSpec names a torch RLModule; impala_jax builds JAX networks"
        else:
            why = "expected None or an impala_jax.RLModuleSpec"
        raise ValueError(f"rl_module_spec={value!r}: {why}; {_HOW}.")
    for name, fix in (
        ("model_config", "rl_module(model_config=...)"),
        ("observation_space", "environment(observation_space=...)"),
        ("action_space", "environment(action_space=...)"),
    ):
        if getattr(value, name) is not None:
            raise ValueError(
                f"rl_module_spec={value!r}: its {name} is not read; leave it None and set it with "
                f".{fix} (the spec given here only names the network factory)."
            )
    return value


def spec_to_dict(spec: RLModuleSpec) -> dict[str, Any]:
    """``to_dict()``'s form of a given spec: its factory (the other fields are always None)."""
    return {"factory": spec.factory}


def factory_problem(factory: Any) -> str | None:
    """Why `factory` cannot be a network factory, or None (an import path is imported)."""
    try:
        resolve_factory(factory)
    except ValueError as err:
        return f"its {err}; {_HOW}"
    return None


def rl_module_spec_problem(spec: Any, model_config: Mapping[str, Any]) -> str | None:
    """`validate()`'s check of a set ``rl_module_spec``: its factory is importable and callable,
    and a custom one is not asked for a recurrent policy."""
    if not isinstance(spec, RLModuleSpec):
        return None
    problem = factory_problem(spec.factory)
    if problem is None and not is_own_factory(spec.factory) and model_config.get("use_lstm"):
        return (
            "a custom network factory builds feed-forward networks, but model_config['use_lstm'] "
            "is True: recurrent policies use impala_jax's own LSTM core; set use_lstm=False, or "
            "leave rl_module_spec=None"
        )
    return problem
