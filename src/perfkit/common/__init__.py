"""Leaf modules that both perfkit and its reference engine (:mod:`perfkit.refengine`) may import:
LTX frame rules, the per-request record format, the reference engine's presets, provenance.
They import nothing else from perfkit.

Here too the plugin boundary of the optional stacks (:data:`EXTRAS`): the core
(``pip install perfkit``: investigations, engine, gate, report, A/B, suite, bisect, wheelhouse)
never imports them; each entry point that needs one calls :func:`require_extra` first."""

from __future__ import annotations

import importlib.util

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
    """Check that the modules of ``extra`` (a key of :data:`EXTRAS`) are importable, without
    importing them.

    Args:
        extra: ``history``, ``ray`` or ``lab``.
        what: what needs it, for the message (e.g. ``perfkit history``).

    Raises:
        MissingExtra: a module is missing: ``<what> needs <modules>: pip install 'perfkit[<extra>]'``.
        KeyError: an unknown extra.
    """
    missing = [m for m in EXTRAS[extra] if not _importable(m)]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}: pip install 'perfkit[{extra}]'")
