"""Objects named by import path: how checkpoints and configs hold a class or function (a
callbacks class, a network factory, the config's class) without pickling it."""

from __future__ import annotations

import importlib
from typing import Any


def split_import_path(path: str) -> tuple[str, str] | None:
    """``("pkg.mod", "Name.attr")`` of ``"pkg.mod:Name.attr"`` (as ``checkpoint.jsonable``
    writes it) or of RLlib's ``"pkg.mod.Name"``; None when `path` names nothing importable (a
    lambda or a class defined inside a function: its qualname holds ``<locals>``)."""
    module, sep, qualname = path.partition(":")
    if not sep:
        module, _, qualname = path.rpartition(".")
    if not module or not qualname or "<" in qualname:
        return None
    return module, qualname


def import_object(module: str, qualname: str) -> Any:
    """Imports `module` and follows `qualname`'s attributes (ImportError or AttributeError)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
