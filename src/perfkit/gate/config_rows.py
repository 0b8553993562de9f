"""Gate rows for what the engine really ran, per launch (docs/suite.md, "What the gate
checks"): ``compile_active[<launch>]`` (torch.compile asked for but not in force fails unless
``invariants.compile_inactive_ok``) and ``recompile_limit[<launch>]`` (a request that hit torch's
recompile limit fails; an engine that reports no flag, as sglang, gives a ``skipped`` row).
"""

from __future__ import annotations

from typing import Any, Mapping

from perfkit.bundle import WARMUP_INDEX, ResultBundle, table_rows
from perfkit.checks import Check
from perfkit.reported import is_reported


def _text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def _request_label(row: Mapping[str, Any]) -> str:
    idx = row.get("index")
    role = "the startup warmup" if idx == WARMUP_INDEX else f"request {idx}"
    frames = row.get("effective_num_frames")
    if frames is None:
        frames = row.get("num_frames")
    return f"{role} ({frames} frames)" if _text(frames) else role


def engine_checks(bundles: Mapping[str, ResultBundle], invariants: Mapping[str, Any]) -> list[Check]:
    """Check rows (case = investigation name) for every launch of every bundle; see the module doc.

    Args:
        bundles: investigation -> its bundle.
        invariants: the merged invariants; ``compile_inactive_ok`` (bool) is read.
    """
    inactive_ok = bool(invariants.get("compile_inactive_ok", False))
    rows: list[Check] = []
    for investigation, b in bundles.items():
        launches = b.table("launches")
        requests = b.table("requests")
        for ln in table_rows(launches):  # missing values as None
            if _text(ln.get("reused_from")):
                continue  # judged in the bundle that measured it
            label = _text(ln.get("launch"))
            asked, active = ln.get("compile_requested"), ln.get("compile_active")
            if asked:
                metric = f"compile_active[{label}]"
                if active:
                    rows.append(
                        Check(investigation, metric, 1.0, 1.0, 1.0, "pass", "compile asked and active")
                    )
                elif active is False:
                    why = _text(ln.get("compile_disabled_reason")) or "the engine gave no reason"
                    status = "pass" if inactive_ok else "fail"
                    tail = " (expected: invariants.compile_inactive_ok)" if inactive_ok else ""
                    why = f"compile asked but not active: {why}{tail}"
                    rows.append(Check(investigation, metric, 1.0, 0.0, 1.0, status, why))
            if not active:
                continue
            mine = requests[requests["launch"] == label] if not requests.empty else requests
            flags = list(mine["recompile_limit_hit"]) if "recompile_limit_hit" in mine.columns else []
            hit = mine[[is_reported(f) and bool(f) for f in flags]] if flags else mine.iloc[:0]
            metric = f"recompile_limit[{label}]"
            if hit.empty:
                told = sum(is_reported(f) for f in flags)
                if not told:  # the engine reports no flag (sglang): not measured, never a pass
                    why = "not measured: the engine reported no recompile-limit flag for any request"
                    rows.append(Check(investigation, metric, 0.0, None, 0.0, "skipped", why))
                    continue
                unknown = len(flags) - told
                why = "no request hit the recompile limit" + (
                    f" ({unknown} of {len(flags)} requests did not report it)" if unknown else ""
                )
                rows.append(Check(investigation, metric, 0.0, 0.0, 0.0, "pass", why))
                continue
            first = table_rows(hit.iloc[:1])[0]
            stage = _text(first.get("recompile_limit_stage")) or "a stage not reported"
            reasons = [r for r in _text(first.get("recompile_reasons")).split("; ") if r]
            limit = ln.get("recompile_limit")
            lim = f" (limit {int(limit)})" if _text(limit) else ""
            why = (
                f"{_request_label(first)} hit torch.compile's recompile limit{lim} in {stage}; "
                f"later calls ran eagerly. torch: {'; '.join(reasons) or 'no reason logged'}"
                + (f" ({len(hit)} requests hit it)" if len(hit) > 1 else "")
            )
            rows.append(Check(investigation, metric, 0.0, float(len(hit)), 0.0, "fail", why))
    return rows
