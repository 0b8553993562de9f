"""What a test reads in an executed notebook: its HTML outputs as the report formats them."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat

#: exponent notation in a number (1.6e-02, -3.9e-13, 2E5)
EXPONENT = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?[eE][-+]?\d+\b")
#: a number with more than three decimals (0.0163, 72.954829)
LONG_DECIMALS = re.compile(r"(?<![\w.])-?\d[\d,]*\.\d{4,}\b")
MISSING_WORDS = re.compile(r"\b(NaN|None|nan)\b")


def outputs(nb_path: str | Path, mime: str) -> list[str]:
    """Every ``mime`` output of an executed notebook, in order."""
    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []) or []:
            data = o.get("data") or {}
            if mime in data:
                out.append(data[mime])
            elif mime == "stream" and o.get("output_type") == "stream":
                out.append(o.get("text", ""))
    return out


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in ("style", "script"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def visible_text(html: str) -> str:
    """The text a reader sees in an HTML fragment: tags, style and script blocks (pandas
    Styler's generated ids) dropped; an unescaped ``<=`` in a cell stays text."""
    p = _Text()
    p.feed(html)
    p.close()
    return " ".join(p.parts)


def html_problems(nb_path: str | Path) -> list[str]:
    """What breaks the table rules in the notebook's HTML outputs: a pandas table with its index
    column, "NaN"/"None" text, exponent notation, a number with more than 3 decimals."""
    problems = []
    for h in outputs(nb_path, "text/html"):
        text = visible_text(h)
        if 'class="dataframe"' in h:
            problems.append("raw pandas table (index column)")
        for rx, what in (
            (MISSING_WORDS, "missing word"),
            (EXPONENT, "exponent"),
            (LONG_DECIMALS, "decimals"),
        ):
            m = rx.search(text)
            if m:
                problems.append(f"{what}: {m.group()!r} in {text[max(0, m.start() - 60) : m.end() + 20]!r}")
    return problems
