"""Stop criteria: parsed from ``--stop KEY=VALUE`` or an experiment's ``stop``, checked against
what ``train()`` can report for the config before anything is built, and met by a result."""

from __future__ import annotations

import difflib

from impala_jax.cli.errors import RunError
from impala_jax.cli.overrides import parse_value
from impala_jax.cli.result_schema import CONFIG_PREFIX, NOT_STOP_KEYS, result_schema
from impala_jax.rllib.results import lookup


def check_stop(stop: dict) -> dict:
    """``stop`` as a plain dict; RunError unless every key is a string and every value a number."""
    out = {}
    for key, value in stop.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise RunError(f"stop criterion {key!r}: {value!r} is not a number")
        out[key] = value
    return out


def parse_stop(items: list[str]) -> dict:
    """The ``--stop KEY=VALUE`` arguments as a stop dict."""
    stop = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise RunError(f"--stop {item!r} is not of the form KEY=VALUE")
        try:
            stop[key.strip()] = parse_value(text.strip())
        except RunError as err:
            raise RunError(f"--stop {item!r}: {err}") from None
    return check_stop(stop)


def stop_reached(result: dict, stop: dict) -> str | None:
    """The first criterion met (Tune's rule: value >= threshold), as text; None if none is."""
    for key, threshold in stop.items():
        value = lookup(result, key)
        if value is not None and value >= threshold:  # NaN never stops a run
            return f"{key}={value:g} >= {threshold:g}"
    return None


def check_stop_keys(stop: dict, config) -> list[str]:
    """Raises RunError for stop keys ``train()`` can never report for ``config``.

    A key that is merely absent so far (no episode has finished yet, no evaluation has run)
    is fine: the run waits for it. Returns notes for keys accepted only because the
    configured callbacks may log them.
    """
    schema = result_schema(config)
    keys = sorted(schema.keys)
    impossible, notes = [], []
    for key in stop:
        if key in NOT_STOP_KEYS or key.startswith(CONFIG_PREFIX):
            raise RunError(f"stop key {key}: not a result that training moves (bookkeeping)")
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.75)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        if not schema.can_appear(key):
            impossible.append(key + hint)
        elif not schema.known(key):
            notes.append(
                f"stop key {key} is not a result impala_jax reports{hint}; kept because "
                "callbacks are configured and may log it"
            )
    if impossible:
        why = ""
        if any(k.startswith("evaluation/") for k in impossible) and not config.evaluation_interval:
            why = "; evaluation/... keys need evaluation(evaluation_interval=N)"
        raise RunError(
            f"stop key(s) that train() never reports for this config: {', '.join(impossible)}"
            f"{why}; impala_jax.cli.result_schema.result_schema(config).keys lists every key"
        )
    return notes
