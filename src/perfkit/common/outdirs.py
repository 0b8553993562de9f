"""Output directories of perfkit's commands: a new ``<base>/<YYYYmmdd-HHMMSS>`` that no other run
holds, and the rule for a ``--out`` the user gave (never a file, never a run's outputs)."""

from __future__ import annotations

import contextlib
import datetime as _dt
from pathlib import Path


def stamped_dir(base: str | Path, suffix: str = "", *, create: bool = False) -> Path:
    """A directory ``base/<YYYYmmdd-HHMMSS><suffix>`` that does not exist yet (``-2``, ``-3``, …
    when taken); ``create``: made here, exclusively (two runs in one second never share one)."""
    base = Path(base)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S") + suffix
    if create:
        base.mkdir(parents=True, exist_ok=True)
    out, n = base / stamp, 1
    while True:
        if create:
            with contextlib.suppress(FileExistsError):
                out.mkdir()
                return out
        elif not out.exists():
            return out
        n += 1
        out = base / f"{stamp}-{n}"


def given_out_problem(out: str | Path) -> str | None:
    """Why a given ``--out`` cannot take outputs (``"is a file"``, ``"exists and is not empty"``), or None."""
    p = Path(out)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        return "is a file" if not p.is_dir() else "exists and is not empty"
    return None
