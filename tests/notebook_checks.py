"""What a test reads in an executed notebook: its HTML outputs as the report formats them."""

from __future__ import annotations

import re
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


def html_problems(nb_path: str | Path) -> list[str]:
    """What breaks the table rules in the notebook's HTML outputs: a pandas table with its index
    column, "NaN"/"None" text, exponent notation, a number with more than 3 decimals."""
    problems = []
    for h in outputs(nb_path, "text/html"):
        # the text a reader sees: style blocks (pandas Styler's generated ids) and tags dropped
        text = re.sub(r"<(style|script)\b.*?</\1>", " ", h, flags=re.S | re.I)
        text = re.sub(r"<[^>]+>", " ", text)
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
