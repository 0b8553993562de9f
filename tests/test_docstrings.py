"""Module docstrings tell the truth (issue 32, item 5): every name a module docstring points at
with a Sphinx role (``:func:``, ``:class:``, ``:data:``, ``:mod:``, ``:meth:``, ``:attr:``) exists —
in the module itself, as a dotted path from ``perfkit`` or another package, or as a field of a
dataclass or pydantic model, or an attribute its class sets. Found stale on main: gate/baseline listed four functions that had
moved or gone, suite listed six."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from types import ModuleType
from typing import Any

import perfkit

ROLE = re.compile(r":(func|class|data|mod|meth|attr):`~?([\w.]+)`")


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has(obj: Any, name: str) -> bool:
    if hasattr(obj, name):
        return True
    fields = {**getattr(obj, "__dataclass_fields__", {}), **getattr(obj, "model_fields", {})}
    if name in fields or name in getattr(obj, "__annotations__", {}):
        return True
    # an instance attribute its class sets (``self.cpu_seconds = 0.0``)
    return inspect.isclass(obj) and f"self.{name} =" in inspect.getsource(obj)


def _resolves(module: ModuleType, role: str, name: str) -> bool:
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    if role == "mod":
        return (
            _import(importlib.util.resolve_name(name, package) if name.startswith(".") else name) is not None
        )
    parts = name.split(".")
    if _walk(module, parts):  # a name in the module (or reached through one it imports)
        return True
    for i in range(len(parts), 0, -1):  # a dotted path from a package: the longest importable prefix
        found = _import(".".join(parts[:i]))
        if found is not None:
            return _walk(found, parts[i:])
    return False


def _walk(obj: Any, parts: list[str]) -> bool:
    for p in parts:
        if not _has(obj, p):
            return False
        obj = getattr(obj, p, None)
        if obj is None:  # a field without a class-level value: it exists, look no deeper
            return True
    return True


def test_every_name_a_module_docstring_points_at_exists():
    stale = []
    for info in pkgutil.walk_packages(perfkit.__path__, "perfkit."):
        module = importlib.import_module(info.name)
        for role, name in ROLE.findall(module.__doc__ or ""):
            if not _resolves(module, role, name):
                stale.append(f"{info.name}: :{role}:`{name}`")
    assert not stale, "module docstrings name what does not exist:\n" + "\n".join(stale)
