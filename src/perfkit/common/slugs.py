"""Case-id-safe names: :func:`slug` (the suite's, the gate's and the scenarios' case ids)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["slug"]


def slug(s: Any) -> str:
    """``s`` with only letters, digits, ``.`` and ``-`` (case ids: ``"12GiB + 32GiB"`` ->
    ``"12GiB-32GiB"``)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "", str(s).replace(" + ", "-").replace(" ", "")) or "x"
