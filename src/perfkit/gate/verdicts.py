"""Verdict files and exit codes: ``RUN/<notebook>/verdict.json`` (``{investigation, status, rows:
[Check...], ...}``; the gate's adds ``cases``, ``compared_with``, ``warnings``) read back for the
summary, the report and the suite's exit code. The exit codes are the leaf
:mod:`perfkit.common.exitcodes`' (0 pass or inconclusive, 1 a check failed, 2 an error or
nothing compared), re-exported here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from perfkit.checks import CHECK_COLUMNS, Check, check_table, overall_status
from perfkit.common import jsonsafe
from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, STATUS_WORD  # noqa: F401
from perfkit.common.jsonsafe import finite as jsonable  # NaN/inf -> null, recursively
from perfkit.gate.baseline.files import atomic_write_text
from perfkit.investigations import registry

log = logging.getLogger(__name__)


#: the notebook that gates the run (after every investigation's notebook)
GATE = "baseline_gate"
VERDICT_FILE = "verdict.json"
RUN_FILE = "run.json"


def notebooks() -> tuple[str, ...]:
    """Notebook names in run order: every registered investigation, then the gate."""
    return (*registry.names(), GATE)


def write_verdict(
    out: str | Path, investigation: str, rows: Iterable[Check | Mapping[str, Any]], **extra: Any
) -> dict[str, Any]:
    """Write ``out/verdict.json``: {investigation, status, rows, ...extra}. Returns the document."""
    df = check_table(rows)
    doc = {
        "scenario": investigation,
        "status": overall_status(df),
        "rows": jsonable(df.to_dict("records")),
        **jsonable(extra),
    }
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p / VERDICT_FILE, jsonsafe.dumps(doc, indent=2, default=str) + "\n")
    return doc


def read_verdict(path: str | Path) -> dict[str, Any] | None:
    """The verdict document at ``path`` (a verdict.json or its directory); None when absent.
    An unreadable file is an ``error`` verdict naming the file (never a crash, never a pass)."""
    p = Path(path)
    if p.is_dir():
        p = p / VERDICT_FILE
    if not p.exists():
        return None
    try:
        doc = json.loads(p.read_text())
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON object was expected, got {type(doc).__name__}")
        rows = doc.get("rows", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("rows: a list of objects was expected")
        if not isinstance(doc.get("status", ""), str):
            raise ValueError(f"status: a string was expected, got {doc['status']!r}")
        return doc
    except (OSError, ValueError) as exc:
        log.error("unreadable verdict %s: %s", p, exc)
        return {"status": "error", "error": f"unreadable verdict file {p}: {exc}", "rows": []}


def collect_verdicts(run_dir: str | Path) -> pd.DataFrame:
    """All verdict rows of a run (investigations, then the gate), with a ``notebook`` column;
    the gate's copies of the investigations' rows dropped."""
    frames = []
    for name in notebooks():
        doc = read_verdict(Path(run_dir) / name)
        if doc and doc.get("rows"):
            df = check_table(doc["rows"])
            df.insert(0, "notebook", name)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["notebook", *CHECK_COLUMNS])
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(subset=["case", "metric"], keep="first").reset_index(drop=True)


#: the gate row that says a baseline compared nothing (perfkit.gate.baseline.check_overlap)
NOTHING_COMPARED = ("baseline", "cases compared")


def _nothing_compared_rows(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The failing :data:`NOTHING_COMPARED` rows of ``verdicts`` (empty when there are none)."""
    if verdicts.empty or not {"case", "metric", "status"} <= set(verdicts.columns):
        return verdicts.iloc[:0]
    hit = (verdicts["case"] == NOTHING_COMPARED[0]) & (verdicts["metric"] == NOTHING_COMPARED[1])
    return verdicts[hit & (verdicts["status"] == "fail")]


def nothing_compared(verdicts: pd.DataFrame) -> bool:
    """Whether a baseline was given and no case of the run was in it (misuse: exit 2)."""
    return not _nothing_compared_rows(verdicts).empty


def nothing_measured_reason(verdicts: pd.DataFrame) -> str | None:
    """Why a run compared nothing (for the summary and the console), or None when it did:
    the baseline held no case of the run, or every check was skipped (with their reasons)."""
    if verdicts.empty or "status" not in verdicts:
        return None
    hit = _nothing_compared_rows(verdicts)
    if not hit.empty:
        return f"nothing compared: {hit['reason'].iloc[0]}"
    if overall_status(verdicts) != "skipped":
        return None
    rows = verdicts.to_dict("records")
    reasons = list(
        dict.fromkeys(f"{r.get('case')} {r.get('metric')}: {r.get('reason') or 'skipped'}" for r in rows)
    )
    more = f" (+{len(reasons) - 5} more)" if len(reasons) > 5 else ""
    return "nothing measured, every check was skipped: " + "; ".join(reasons[:5]) + more


def exit_code_for(notebooks: Iterable[Any], verdicts: pd.DataFrame) -> int:
    """One rule for every command: 2 when a notebook errored or a baseline compared nothing
    (misuse, not a regression), 1 when a check failed, else 0."""
    if nothing_compared(verdicts) or overall_status(verdicts) == "skipped":
        return EXIT_ERROR  # nothing compared, or every check skipped: misuse, never a pass
    for n in notebooks:
        st = n.status if not isinstance(n, Mapping) else n.get("status")
        if st == "error":
            return EXIT_ERROR
    if not verdicts.empty and (verdicts["status"] == "fail").any():
        return EXIT_REGRESSION
    return EXIT_OK


def status_word(code: int, verdicts: pd.DataFrame) -> str:
    """The run's status word: :data:`STATUS_WORD`'s, but ``inconclusive`` for exit 0 with a
    check noise could flip (none failed; not called a pass)."""
    if code == EXIT_OK and overall_status(verdicts) == "inconclusive":
        return "inconclusive"
    return STATUS_WORD.get(code, "error")
