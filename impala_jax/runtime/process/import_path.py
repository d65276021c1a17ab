"""Objects named by import path: how checkpoints and configs hold a class or function (a
callbacks class, a network factory, the config's class) without pickling it; and bare
packages, which stand in for a heavy package while a few of its submodules import."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from pathlib import Path
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


def bare_package(name: str, path: Path) -> types.ModuleType:
    """An empty package ``name`` whose submodules are found in ``path``: it stands in for a
    package while some of its submodules import, without running its ``__init__``."""
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    package.__spec__.submodule_search_locations = [str(path)]
    return package


def take_out(stand_ins: dict) -> None:
    """Removes stand-in packages (``bare_package``) from sys.modules and from their parents;
    the submodules imported under them stay."""
    for name, package in stand_ins.items():
        if sys.modules.get(name) is package:
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is package:
            delattr(sys.modules[parent], child)
