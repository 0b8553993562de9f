"""Leaf modules that both perfkit and its reference engine may import (they import nothing else
from perfkit), and the optional stacks (:data:`EXTRAS`), which the core never imports: an entry
point that needs one calls :func:`require_extra` first (docs/DESIGN.md, "Optional stacks")."""

from __future__ import annotations

import importlib.util

#: the per-request record file both sides agree on (sglang's: ``SGLANG_PERF_LOG_DIR=DIR`` with
#: ``SGLANG_DIFFUSION_STAGE_LOGGING=1`` appends one JSON object a request to ``DIR/performance.log``;
#: the reference engine writes it, :mod:`perfkit.readings.records` reads it)
PERF_LOG_NAME = "performance.log"
#: what a summary.md is fitted into (characters): GitHub's 65,536-character comment limit less room
#: for a caller's header or footer; rows past it are left out, counted
SUMMARY_LIMIT = 60_000
#: extra name -> the top-level modules it brings (pyproject.toml's optional-dependencies)
EXTRAS = {"history": ("otava", "duckdb"), "ray": ("ray",), "lab": ("jupyterlab",)}


class MissingExtra(ImportError):
    """An optional stack is not installed; the message is one line ending in the ``pip install``
    that adds it (the CLI prints it and exits 2)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-imported module
        return False


def require_extra(extra: str, what: str) -> None:
    """Check, without importing them, that the modules of ``extra`` (a key of :data:`EXTRAS`)
    are importable; ``what`` needs it (e.g. ``perfkit history``).

    Raises:
        MissingExtra: a module is missing: ``<what> needs <modules>: pip install 'perfkit[<extra>]'``.
        KeyError: an unknown extra.
    """
    missing = [m for m in EXTRAS[extra] if not _importable(m)]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}: pip install 'perfkit[{extra}]'")
