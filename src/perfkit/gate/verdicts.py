"""Verdict files (``RUN/<notebook>/verdict.json``) read back for the summary, the report and the
exit code (:mod:`perfkit.common.exitcodes`' rule, re-exported); a notebook's gate word
(:func:`gate_result`) and last cell (:func:`finish`, raising :class:`GateFailed`). See
docs/lab.md and docs/suite.md."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, get_args

import pandas as pd

from perfkit.checks import CHECK_COLUMNS, Check, check_table, overall_status
from perfkit.common import jsonsafe
from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, STATUS_WORD  # noqa: F401
from perfkit.common.jsonsafe import finite as jsonable  # NaN/inf -> null, recursively
from perfkit.common.slugs import md_text
from perfkit.gate.baseline.files import atomic_write_text
from perfkit.investigations import registry

log = logging.getLogger(__name__)


GATE = "baseline_gate"
VERDICT_FILE = "verdict.json"
RUN_FILE = "run.json"


def notebooks() -> tuple[str, ...]:
    """Notebook names in run order: every registered investigation, then the gate."""
    return (*registry.names(), GATE)


def write_verdict(
    out: str | Path, investigation: str, rows: Iterable[Check | Mapping[str, Any]], **extra: Any
) -> dict[str, Any]:
    """Write and return ``out/verdict.json``: {scenario, status, rows, ...extra}."""
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
    """The verdict document at ``path`` (a verdict.json or its directory); None when absent, an
    ``error`` verdict naming the file when unreadable."""
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
    """All verdict rows of a run with a ``notebook`` column; the gate's copies of rows dropped."""
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


#: the gate row (case, metric) that says a baseline compared nothing
NOTHING_COMPARED = ("baseline", "cases compared")


def _nothing_compared_rows(verdicts: pd.DataFrame) -> pd.DataFrame:
    if verdicts.empty or not {"case", "metric", "status"} <= set(verdicts.columns):
        return verdicts.iloc[:0]
    hit = (verdicts["case"] == NOTHING_COMPARED[0]) & (verdicts["metric"] == NOTHING_COMPARED[1])
    return verdicts[hit & (verdicts["status"] == "fail")]


def nothing_compared(verdicts: pd.DataFrame) -> bool:
    """Whether a baseline was given and no case of the run was in it (misuse: exit 2)."""
    return not _nothing_compared_rows(verdicts).empty


def nothing_measured_reason(verdicts: pd.DataFrame) -> str | None:
    """Why a run compared nothing (no case in the baseline, every check skipped), or None."""
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
    """2 when a notebook errored, nothing was compared or every check skipped, 1 when a check
    failed, else 0."""
    statuses = [n.get("status") if isinstance(n, Mapping) else n.status for n in notebooks]
    if nothing_compared(verdicts) or overall_status(verdicts) == "skipped" or "error" in statuses:
        return EXIT_ERROR
    if not verdicts.empty and (verdicts["status"] == "fail").any():
        return EXIT_REGRESSION
    return EXIT_OK


def status_word(code: int, verdicts: pd.DataFrame) -> str:
    """:data:`STATUS_WORD`'s word for ``code``; ``inconclusive`` for exit 0 with an inconclusive check."""
    if code == EXIT_OK and overall_status(verdicts) == "inconclusive":
        return "inconclusive"
    return STATUS_WORD.get(code, "error")


FailOn = Literal["gate", "never"]
FAIL_ON = get_args(FailOn)
GATE_FAILED = "GateFailed"


class GateFailed(Exception):
    """The notebook ran to its end and its gate failed (or judged nothing), ``fail_on="gate"``."""


def _failed_rows(verdict: Mapping[str, Any], status: str = "fail") -> list[str]:
    rows = verdict.get("rows") or []
    return [
        f"{r.get('metric')} ({r.get('reason')})" if r.get("reason") else str(r.get("metric"))
        for r in rows
        if r.get("status") == status
    ]


_COUNT_WORDS = {
    "fail": "failed",
    "inconclusive": "inconclusive",
    "improved": "improved",
    "pass": "passed",
    "new": "new",
    "skipped": "skipped",
}


def check_counts(statuses: Iterable[Any]) -> str:
    """``"4 checks: 1 failed, 2 passed, 1 skipped"`` (in :data:`_COUNT_WORDS`'s order), ``"0 checks"``."""
    seen = [str(s) for s in statuses]
    n = len(seen)
    order = [*_COUNT_WORDS, *sorted(set(seen) - set(_COUNT_WORDS))]
    parts = [f"{seen.count(s)} {_COUNT_WORDS.get(s, s)}" for s in order if s in seen]
    return f"{n} check{'' if n == 1 else 's'}" + (": " + ", ".join(parts) if parts else "")


def verdict_line(name: str, verdict: Mapping[str, Any] | None) -> str:
    """One sentence on a verdict document:
    ``"<name> gate: fail: 4 checks: 1 failed, 3 passed; failed: latency_drift (0.091 > 0.05)"``."""
    word = gate_result("ok", verdict)
    if verdict is None:
        return f"{name} gate: not gated (no verdict written)"
    rows = verdict.get("rows") or []
    counts = check_counts(r.get("status") for r in rows if isinstance(r, Mapping))
    failed = _failed_rows(verdict)
    if word == "fail":
        shown = "; ".join(failed[:5]) + (f" (+{len(failed) - 5} more)" if len(failed) > 5 else "")
        return f"{name} gate: fail: {counts}" + (f"; failed: {shown}" if shown else "")
    if word == "inconclusive":
        shown = "; ".join(_failed_rows(verdict, "inconclusive"))
        return f"{name} gate: inconclusive: {counts}; noise could flip: {shown}"
    if word == "not gated":
        why = "no check rows" if not rows else f"{counts} (nothing measured)"
        return f"{name} gate: not gated: {why}; not a pass"
    if word == "error":
        return f"{name} gate: error: {verdict.get('error') or 'unreadable verdict'}"
    return f"{name} gate: pass: {counts}"


def gate_result(status: str, verdict: Mapping[str, Any] | None, ename: str | None = None) -> str:
    """The gate word of one notebook run: ``pass``, ``fail``, ``inconclusive``, ``not gated``,
    ``error`` or ``skipped`` (docs/suite.md); ``ename`` :data:`GATE_FAILED` without a verdict
    (the A/B notebook) is ``fail``."""
    if status in ("error", "skipped"):
        return status
    if verdict is None:
        return "fail" if ename == GATE_FAILED else "not gated"
    st = verdict.get("status")
    if st in ("error", "fail", "inconclusive"):
        return st
    rows = verdict.get("rows") or []
    if st == "skipped" or all(isinstance(r, Mapping) and r.get("status") == "skipped" for r in rows):
        return "not gated"  # no rows, or every check skipped: nothing compared is not a pass
    return "pass"


def exit_code(word: str, verdict: Mapping[str, Any] | None) -> int:
    """The exit code of one notebook run's gate word: 0 pass or inconclusive, 1 fail, 2 error;
    ``not gated``: 2 with a verdict, 0 without (the history notebook)."""
    if word == "not gated" and verdict is None:
        return EXIT_OK
    return {"pass": EXIT_OK, "inconclusive": EXIT_OK, "fail": EXIT_REGRESSION}.get(word, EXIT_ERROR)


def finish(name: str, verdict: Mapping[str, Any] | None, fail_on: str = "gate", where: str = "") -> str:
    """The last cell of a gated notebook: show the gate's sentence, return the gate word. Raises
    :class:`GateFailed` when the gate failed or judged nothing and ``fail_on == "gate"``;
    ValueError when ``fail_on`` is not one of :data:`FAIL_ON`."""
    _check_fail_on(fail_on)
    word = gate_result("ok", verdict)
    line = verdict_line(name, verdict)
    at = f" (verdict: {where})" if where else ""
    _show(f"**{md_text(line)}** {md_text(at)}".rstrip())
    if word in ("pass", "inconclusive") or fail_on == "never":
        if word not in ("pass", "inconclusive"):
            _show(f"`fail_on` is {fail_on!r}: this notebook does not fail the run.")
        return word
    raise GateFailed(
        f"{line}{at}. Every output above is rendered; papermill exits 1 on this exception "
        "(pass -p fail_on never to explore without failing the run)."
    )


def finish_code(name: str, code: int, text: str, fail_on: str = "gate") -> int:
    """:func:`finish` for a notebook whose gate is an exit code (the A/B notebook). Raises
    :class:`GateFailed` when ``code`` is not 0 and ``fail_on == "gate"``; ValueError as finish."""
    _check_fail_on(fail_on)
    line = f"{name} gate: {'pass' if code == 0 else 'fail'} (exit code {code}): {text}"
    _show(f"**{line}**")
    if code == 0 or fail_on == "never":
        return code
    raise GateFailed(f"{line}. papermill exits 1 on this exception (pass -p fail_on never to explore).")


def _check_fail_on(fail_on: str) -> None:
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on: must be one of {', '.join(map(repr, FAIL_ON))}, got {fail_on!r}")


def _show(markdown: str) -> None:
    """Markdown in a notebook, a log line elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - IPython is a dependency of the notebooks
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        log.info("%s", markdown)
        return
    display(Markdown(markdown))
