"""Module docstrings tell the truth (issue 32, item 5): every name a module docstring points at
with a Sphinx role (``:func:``, ``:class:``, ``:data:``, ``:mod:``, ``:meth:``, ``:attr:``) exists —
in the module itself, as a dotted path from ``perfkit`` or another package, or as a field of a
dataclass or pydantic model, or an attribute its class sets. Found stale on main: gate/baseline listed four functions that had
moved or gone, suite listed six."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
from types import ModuleType
from typing import Any

import pytest

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


# --------------------------------------------------------------------------- the public API


def test_the_public_api_exists_with_docstrings_giving_returns_and_raises():
    """perfkit's module docstring lists its API (:func:`perfkit.run_suite`, ...): each name is
    in ``__all__``, callable, and documents what it returns and raises."""
    listed = set(re.findall(r":func:`(\w+)`", perfkit.__doc__ or ""))
    api = [n for n in perfkit.__all__ if n != "__version__"]
    assert sorted(api) == sorted(listed) == ["compare", "load_bundle", "run_ab", "run_suite"]
    for name in api:
        fn = getattr(perfkit, name)
        assert callable(fn), name
        assert "Returns" in fn.__doc__ or "Raises" in fn.__doc__, name
        assert "Raises" in fn.__doc__ or name == "load_bundle", name


def test_import_perfkit_is_cheap():
    """``import perfkit`` imports none of pandas, numpy, torch, matplotlib nor a perfkit module
    but its version's: the API imports what it needs when called."""
    import subprocess
    import sys

    code = (
        "import sys, perfkit\n"
        "heavy = {'pandas', 'numpy', 'torch', 'matplotlib', 'jinja2', 'pydantic'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith('perfkit.')))"
    )
    # the version comes from a leaf module (perfkit.common.version): nothing else
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "['perfkit.common', 'perfkit.common.version']"


def test_the_public_api_on_recorded_bundles():
    """load_bundle, compare and a replayed run_ab on the committed H200 recordings: the values the
    library gives (nothing mocked)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    b = perfkit.load_bundle(root / "examples/h200/bundles/cold_warm")
    assert b.investigation == "cold_warm" and len(b.requests) == 6
    case = "ltx-2b_25f_512x768_30s_w17"
    rows = perfkit.compare(root / "examples/h200/bundles/cold_warm", root / "baselines/h200.json", case=case)
    assert set(rows["case"]) == {case}
    # the bundle's steady state as its run's gate reads it (cold request left out): the run passed
    assert rows["status"].value_counts().to_dict() == {"pass": 16, "skipped": 2}
    # a bundle compared under a case the baseline lacks: a failing "cases compared" row
    other = perfkit.compare(root / "examples/h200/bundles/cold_warm", root / "baselines/h200.json", case="x")
    assert "fail" in set(other.loc[other["metric"] == "cases compared", "status"])
    side = root / "examples/h200/ab-live/ab-2pct"
    res = perfkit.run_ab(side / "a", side / "b", replay=True, threshold=0.01)
    recorded = json.loads((side / "ab.json").read_text())
    assert (res.verdict, res.exit_code) == (recorded["verdict"], recorded["exit_code"]) == ("regression", 1)
    with pytest.raises(ValueError, match="out is required"):
        perfkit.run_ab(side / "a", side / "b")
