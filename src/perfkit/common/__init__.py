"""Leaf modules that both perfkit and its reference engine may import (they import nothing else
from perfkit), and the optional stacks (:data:`EXTRAS`), which the core never imports: an entry
point that needs one calls :func:`require_extra` first (docs/DESIGN.md, "Optional stacks")."""

from __future__ import annotations

import importlib.util

#: sglang's per-request record file (one JSON object a request under ``SGLANG_PERF_LOG_DIR``)
PERF_LOG_NAME = "performance.log"
#: characters a summary.md is fitted into (GitHub's 65,536-character comment limit, less a margin)
SUMMARY_LIMIT = 60_000
#: extra name -> the top-level modules it brings (pyproject.toml's optional-dependencies)
EXTRAS = {"history": ("otava", "duckdb"), "ray": ("ray",), "lab": ("jupyterlab",)}


class MissingExtra(ImportError):
    """An optional stack is not installed; one line ending in the ``pip install`` that adds it."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-imported module
        return False


def require_extra(extra: str, what: str) -> None:
    """Check, without importing them, that the modules of ``extra`` are importable.

    Raises:
        MissingExtra: ``<what> needs <modules>: pip install 'perfkit[<extra>]'``; KeyError: unknown extra.
    """
    missing = [m for m in EXTRAS[extra] if not _importable(m)]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}: pip install 'perfkit[{extra}]'")
