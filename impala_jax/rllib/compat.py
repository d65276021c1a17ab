"""RLlib 2.60's builder surface that is about RLlib itself: `NotProvided`, `route` and
`RLlibBuilders`.

Every keyword one of RLlib's ``AlgorithmConfig`` / ``IMPALAConfig`` builder methods accepts is
accepted by the builder of the same name here (``tests/test_rllib_builders.py`` compares the
signatures). A keyword impala_jax implements is an explicit keyword of the builder in
``config.py``; the rest arrive as ``**rllib_kwargs`` and are sorted out by `route` against the
tables of ``compat_tables.py``:

- a keyword of ``UNSUPPORTED`` (multi-agent, offline data, connectors, torch/tf settings, Ray
  resources, ...): RLlib's default is accepted and changes nothing; any other value is a
  `NotImplementedError` naming the feature.
- a keyword of ``DEPRECATED``: those RLlib still honours (with a warning) set the new field and
  warn with a `DeprecationWarning`; those RLlib rejects are a `ValueError` naming the new
  spelling.
- a keyword of ``DECLARED`` (a loss coefficient impala_jax adds, declared in
  ``core/loss_spec.py``) sets its field: the builder takes it from its declaration alone.
- anything else is a `TypeError`, as an unknown keyword of any Python function.

`NotProvided` (the builders' "not given") lives here too, as the mixin's builders need it.
No JAX and no ray here: the config imports this module.
"""

from __future__ import annotations

import difflib
import logging
import warnings
from collections.abc import Mapping
from typing import Any

from impala_jax.core.loss_spec import COEFFICIENTS
from impala_jax.rllib.compat_tables import (
    ATTRIBUTE_ALIASES,
    DEPRECATED,
    DEPRECATED_VALUE,
    RLLIB_OBJECT,
    RLLIB_ONLY_ATTRIBUTES,
    UNSUPPORTED,
)

# Keywords declared outside config.py, by builder. RLlib's coefficients are also explicit
# keywords of training(), in RLlib's order; one impala_jax adds needs only its declaration.
DECLARED = {"training": tuple(c.name for c in COEFFICIENTS)}


class _NotProvidedType:
    """The type of `NotProvided`: "this keyword was not given", distinct from None."""

    _instance: _NotProvidedType | None = None

    def __new__(cls) -> _NotProvidedType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NotProvided"

    def __reduce__(self) -> str:
        return "NotProvided"  # pickles as the module-level singleton

    def __copy__(self) -> _NotProvidedType:
        return self

    def __deepcopy__(self, memo: dict) -> _NotProvidedType:
        return self


NotProvided = _NotProvidedType()


def is_rllib_default(value: Any, default: Any) -> bool:
    """True when `value` is RLlib's fresh value for the keyword (or None for an RLlib object)."""
    if default is RLLIB_OBJECT:
        return value is None
    try:
        return bool(value == default)
    except Exception:  # e.g. an array compared elementwise
        return False


def route(builder: str, kwargs: Mapping[str, Any], known: list[str]) -> dict[str, Any]:
    """The fields to set for RLlib-only (and `DECLARED`) keywords given to `builder`, after
    checking each.

    `known` are the builder's own keywords (for the TypeError's suggestion). RLlib defaults of
    unsupported keywords set nothing; deprecated spellings RLlib still honours map onto their
    field (with a DeprecationWarning); everything else raises.
    """
    fields: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in DECLARED.get(builder, ()):
            fields[name] = value
        elif name in UNSUPPORTED.get(builder, {}):
            default, reason = UNSUPPORTED[builder][name]
            if not is_rllib_default(value, default):
                shown = "None" if default is RLLIB_OBJECT else repr(default)
                raise NotImplementedError(
                    f"{builder}({name}={value!r}): {reason}. impala_jax accepts only RLlib's "
                    f"default ({shown}) here; see docs/config.md, 'RLlib keywords not offered'."
                )
        elif name in DEPRECATED.get(builder, {}):
            old = DEPRECATED[builder][name]
            if value == DEPRECATED_VALUE:
                continue
            if not old.honoured:
                raise ValueError(
                    f"{builder}({name}=..) is deprecated (RLlib 2.60 rejects it too); use "
                    f"{old.new} instead."
                )
            warnings.warn(
                f"{builder}({name}=..) is deprecated; use {old.new} instead.",
                DeprecationWarning,
                stacklevel=4,
            )
            if old.target is not None:
                fields[old.target] = value
        else:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise TypeError(f"{builder}() got an unexpected keyword argument {name!r}{hint}")
    return fields


def raise_deprecated_builder(name: str) -> None:
    """RLlib 2.60's `rollouts()` and `exploration()`: removed, as there."""
    raise ValueError(
        f"AlgorithmConfig.{name}(..) is deprecated (RLlib 2.60 rejects it too); use "
        f".env_runners(..) instead."
    )


_LOG = logging.getLogger("impala_jax")
_SAID: set[str] = set()


def _say_once(message: str) -> None:
    """Logs `message` at INFO the first time only (RLlib's scripts call framework() per run)."""
    if message not in _SAID:
        _SAID.add(message)
        _LOG.info(message)


class NotOffered(AttributeError, NotImplementedError):
    """An RLlib config attribute impala_jax does not offer; an AttributeError, so ``hasattr``
    and ``getattr(config, name, default)`` behave as for any missing attribute."""


class RLlibBuilders:
    """RLlib's builder methods that are about RLlib itself (mixed into `IMPALAConfig`).

    `resources`, `api_stack` and `framework` set fields (see docs/config.md); the rest are
    features impala_jax does not offer. Each takes RLlib 2.60's keywords: RLlib's defaults are
    accepted and change nothing, anything else raises (see `route`), so ``config.multi_agent()``
    or ``.offline_data(output=None)`` in an RLlib script is harmless and a real multi-agent or
    offline setting is a clear error.
    """

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the config does not have.
        if name in ATTRIBUTE_ALIASES:
            new = ATTRIBUTE_ALIASES[name]
            warnings.warn(
                f"config.{name} is RLlib's old name; use config.{new}", DeprecationWarning, 2
            )
            return getattr(self, new)
        if name in RLLIB_ONLY_ATTRIBUTES:
            raise NotOffered(
                f"IMPALAConfig.{name} is part of RLlib's AlgorithmConfig that impala_jax does not "
                "offer (impala_jax is one single-agent, online process without RLlib's "
                "connectors, offline data or Ray actors); see docs/config.md, 'Differences from "
                "RLlib'."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # RLlib's dict shims ("pretend we are a dict"), over to_dict().
    def get(self, key: str, default: Any = None) -> Any:
        key = ATTRIBUTE_ALIASES.get(key, key)
        return self.to_dict().get(key, default)

    def keys(self):
        return self.to_dict().keys()

    def items(self):
        return self.to_dict().items()

    def values(self):
        return self.to_dict().values()

    @property
    def is_online(self) -> bool:
        return True

    @property
    def is_offline(self) -> bool:
        return False

    @property
    def uses_new_env_runners(self) -> bool:
        return True

    def resources(
        self,
        *,
        num_cpus_for_main_process=NotProvided,
        num_gpus=NotProvided,
        placement_strategy=NotProvided,
        **rllib_kwargs: Any,
    ) -> Any:
        """Accepted for RLlib compatibility; impala_jax runs in one process."""
        return self._set(locals(), "resources")

    def api_stack(
        self,
        enable_rl_module_and_learner=NotProvided,
        enable_env_runner_and_connector_v2=NotProvided,
    ) -> Any:
        """RLlib's API stack switches: impala_jax is the new stack only, so only True is valid."""
        return self._set(locals(), "api_stack")

    def framework(self, framework=NotProvided, **rllib_kwargs: Any) -> Any:
        """RLlib's deep-learning framework: recorded, but impala_jax always runs JAX."""
        if framework is not NotProvided and framework != "jax":
            _say_once(
                f"framework={framework!r} is recorded for RLlib compatibility; impala_jax always "
                "runs JAX (jax.jit on JAX's default backend: the GPU when present, else the CPU)."
            )
        return self._set(locals(), "framework")

    def offline_data(self, **rllib_kwargs: Any) -> Any:
        """RLlib's offline input/output settings: not offered."""
        return self._set({"rllib_kwargs": rllib_kwargs}, "offline_data")

    def python_environment(self, **rllib_kwargs: Any) -> Any:
        """RLlib's per-process environment variables: not offered (one process)."""
        return self._set({"rllib_kwargs": rllib_kwargs}, "python_environment")

    def experimental(self, **rllib_kwargs: Any) -> Any:
        """RLlib's experimental switches: only their defaults are accepted."""
        return self._set({"rllib_kwargs": rllib_kwargs}, "experimental")

    def rollouts(self, *args: Any, **kwargs: Any) -> Any:
        """Removed in RLlib (an error there too): use ``env_runners(..)``."""
        raise_deprecated_builder("rollouts")

    def exploration(self, *args: Any, **kwargs: Any) -> Any:
        """Removed in RLlib (an error there too): use ``env_runners(explore=..)``."""
        raise_deprecated_builder("exploration")
