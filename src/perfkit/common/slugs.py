"""Text from outside made safe where perfkit writes it: :func:`slug` (case ids) and
:func:`md_text` (Markdown: notebooks, summary.md, every ``*.md`` perfkit writes); and
:func:`did_you_mean` (the hint after an unknown name)."""

from __future__ import annotations

import difflib
import re
from typing import Any


def did_you_mean(key: Any, known: Any, cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` with ``x`` the name of ``known`` closest to ``key``, else ""."""
    m = difflib.get_close_matches(str(key), list(known), n=1, cutoff=cutoff)
    return f" (did you mean {m[0]!r}?)" if m else ""


def slug(s: Any) -> str:
    """``s`` with only letters, digits, ``.`` and ``-`` (case ids: ``"12GiB + 32GiB"`` ->
    ``"12GiB-32GiB"``)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "", str(s).replace(" + ", "-").replace(" ", "")) or "x"


#: Markdown's markup characters as character references (brackets escaped): shown, never markup
_MD = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "`": "&#96;",
        "|": "&#124;",
        "\\": "&#92;",
        "[": "\\[",
        "]": "\\]",
    }
)
_NEWLINES = re.compile(r"\r\n|[\r\n\x0b\x0c\x85\u2028\u2029]")


def clip(text: Any, n: int = 200) -> str | None:
    """``text`` cut to ``n`` characters at a word boundary, with "…" when cut (None for empty)."""
    t = str(text or "").strip()
    if len(t) <= n:
        return t or None
    return t[:n].rsplit(" ", 1)[0].rstrip() + " …"


def md_text(text: Any, *, cell: bool = False, code: bool = False, limit: int | None = None) -> str:
    """Text perfkit did not write as Markdown that shows it as it is, markup never live; line
    breaks a space (``cell``: ``<br>``); None is ""; ``code``: in ``<code>``; ``limit``: :func:`clip` it."""
    t = "" if text is None else str(text).strip()
    if limit is not None:
        t = clip(t, limit) or ""  # leading blanks would open a code block
    t = _NEWLINES.sub("\n", t.translate(_MD)).replace("\n", "<br>" if cell else " ")
    return f"<code>{t}</code>" if code else t


def md_code(text: Any) -> str:
    """``text`` in code font: a code span when it holds no backtick, line break or ``|``, else
    :func:`md_text` ``code=True``."""
    t = "" if text is None else str(text)
    if t and t.strip() == t and not any(c in t for c in "`|\r\n"):
        return f"`{t}`"
    return md_text(t, code=True)
