"""The experiment file: runs it as a module and returns its ``config`` and ``stop``.

The ``section.field=value`` overrides are in ``overrides.py``, the stop criteria in
``stop_criteria.py``, what ``train()`` reports in ``result_schema.py`` and RLlib's
example-script arguments in ``rllib_script.py``.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from impala_jax.cli.errors import RunError
from impala_jax.cli.rllib_script import apply_example_args, rllib_example_args
from impala_jax.cli.stop_criteria import check_stop


def module_name(path: str | Path) -> str:
    """The file's module name for load_experiment: the name that imports it from sys.path
    (``experiments.custom_env`` in the repository root), else ``experiment_<stem>``."""
    path = Path(path).absolute()
    for entry in sys.path:
        try:
            parts = path.with_suffix("").relative_to(Path(entry or ".").absolute()).parts
        except ValueError:
            continue
        name = ".".join(parts)
        if parts and all(p.isidentifier() for p in parts) and _imports_file(name, path):
            return name
    return "experiment_" + re.sub(r"\W", "_", path.stem)


def _imports_file(name: str, path: Path) -> bool:
    """Whether ``import name`` would load ``path`` (not a module of that name elsewhere)."""
    try:
        spec = importlib.util.find_spec(name)
        return Path(spec.origin) == path
    except (ImportError, ValueError, AttributeError, TypeError):  # none, or a package's own
        return False


def load_experiment(path: str | Path, script_args: Sequence[str] = ()) -> tuple[Any, dict]:
    """Runs the experiment file; returns its ``config`` (a copy) and ``stop``.

    While the file runs, ``sys.argv`` is ``[path, *script_args]``: a file that parses its own
    arguments at module level (RLlib's tuned examples call ``parser.parse_args()``) sees the
    arguments given after ``--`` on the command line, never the CLI's. The module runs under
    ``module_name(path)``, not ``__main__``, so an ``if __name__ == "__main__":`` block
    (RLlib's ``run_rllib_example_script_experiment(config, args)``) does not run. The module
    stays registered in sys.modules under that name, so an env class it defines is stored in
    checkpoints as ``experiments.custom_env:Class`` (run from the repository root) and found
    again on resume and by ``IMPALA.from_checkpoint`` in a script started there.

    A module-level ``args`` from RLlib's ``add_rllib_example_script_args`` is applied as
    RLlib's example runner applies it (``apply_example_args``); its stop criteria are the stop
    when the file defines no ``stop``.
    """
    from impala_jax.rllib.config import IMPALAConfig

    path = Path(path)
    if not path.is_file():
        near = [str(p) for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        close = difflib.get_close_matches(str(path), near, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise RunError(f"experiment file {path} does not exist{hint}")
    name = module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    argv = sys.argv
    sys.argv = [str(path), *script_args]
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # the file's own argument parser: --help, or a rejected argument
        del sys.modules[name]
        if err.code in (0, None):
            raise
        raise RunError(
            f"experiment file {path} exited with status {err.code} while loading; if its own "
            "argument parser rejected an argument, pass the file's arguments after `--` "
            f"(it was given {list(script_args)})"
        ) from None
    except Exception as err:
        del sys.modules[name]
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise RunError(
            f"experiment file {path} failed to load: {type(err).__name__}: {err}{where}"
        ) from err
    finally:
        sys.argv = argv
    config = getattr(module, "config", None)
    if not isinstance(config, IMPALAConfig):
        raise RunError(
            f"experiment file {path} must define a module-level `config` (an IMPALAConfig); "
            f"found {type(config).__name__}"
        )
    stop = getattr(module, "stop", None)
    if stop is not None and not isinstance(stop, dict):
        raise RunError(f"experiment file {path}: `stop` must be a dict, not {type(stop).__name__}")
    config = config.copy(copy_frozen=False)
    example_args = rllib_example_args(module)
    if example_args is not None:
        example_stop = apply_example_args(config, example_args)
        if stop is None:
            stop = example_stop
    return config, check_stop(stop or {})
