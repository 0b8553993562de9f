"""A run directory's state as the page and summary.md read it: ``run.json``, each notebook's status
and gate result, key numbers, bundles, and the tables beside the verdict."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from perfkit.bundle import ResultBundle, read_results
from perfkit.checks import check_table, is_reported
from perfkit.common.slugs import clip
from perfkit.gate.verdicts import (
    GATE,
    check_counts,
    collect_verdicts,
    exit_code_for,
    notebooks,
    read_verdict,
    status_word,
)
from perfkit.gate.verdicts import gate_result as gate_word
from perfkit.investigations import registry

log = logging.getLogger(__name__)


GATE_COLUMNS = ["notebook", "case", "metric", "baseline", "measured", "limit", "status", "reason"]
#: gate rows sort failures first
GATE_ORDER = {"fail": 0, "inconclusive": 1, "improved": 2, "pass": 3, "new": 4, "skipped": 5}


def section_head(name: str) -> tuple[str, str, str]:
    """(title, question, intro) of a notebook's section; (name, "", "") for an unknown one."""
    if name == GATE:
        return "Baseline gate", "This run's numbers against the baseline, and the invariants.", ""
    try:
        s = registry.get(name)
    except KeyError:
        return name, "", ""
    return s.title, s.question, s.section_intro


def notebook_error(nb_path: Path) -> tuple[str | None, str | None]:
    """(ename, text) of the first error output in an executed notebook."""
    import nbformat

    try:
        nb = nbformat.read(str(nb_path), as_version=4)
    except Exception:  # noqa: BLE001
        return None, None
    for cell in nb.cells:
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "error":
                return o.get("ename"), f"{o.get('ename')}: {o.get('evalue')}"
    return None, None


def _run_info(run_dir: Path) -> dict[str, Any]:
    """``run.json`` (ValueError naming it when not a run record), or one inferred from the files."""
    p = run_dir / "run.json"
    if p.exists():
        try:
            info = json.loads(p.read_text())
        except ValueError as exc:
            raise ValueError(f"{p}: unreadable run record: {exc}") from None
        nbs = info.get("notebooks", []) if isinstance(info, dict) else None
        if not isinstance(nbs, list) or not all(isinstance(n, dict) for n in nbs):
            raise ValueError(f"{p}: not a run record (an object with a list of notebooks)")
        for n in info.get("notebooks") or []:
            doc = read_verdict(run_dir / str(n.get("name")))
            if doc and doc.get("status") == "error" and n.get("status") == "ok":
                n.update({"status": "error", "error": doc.get("error")})
                info["exit_code"] = None  # recomputed from the files as they are now
        return info
    # a run dir made by hand (perfkit run)
    nbs = []
    for name in notebooks():
        nbp = run_dir / "notebooks" / f"{name}.ipynb"
        if nbp.exists() or read_verdict(run_dir / name):
            ename, err = notebook_error(nbp) if nbp.exists() else (None, None)
            nbs.append(
                {
                    "name": name,
                    "status": "error" if err else "ok",
                    "error": err,
                    "ename": ename,
                    "wall_s": None,
                    "output": str(nbp),
                }
            )
    return {"name": run_dir.name, "notebooks": nbs}


def load_bundles(dirs: Iterable[Path]) -> dict[Path, ResultBundle | Exception]:
    """Each of ``dirs`` with a ``meta.json`` as a :class:`ResultBundle`, loaded once, or why not (logged)."""
    out: dict[Path, ResultBundle | Exception] = {}
    for d in dirs:
        if not (d / "meta.json").is_file():
            continue
        try:
            out[d] = ResultBundle.load(d)
        except Exception as exc:  # noqa: BLE001 - the report is written in every case
            log.warning("report: unreadable bundle %s: %r", d, exc)
            out[d] = exc
    return out


def run_results(
    run_dir: Path, on_error: Callable[[Path, Exception], None] | None = None
) -> dict[str, dict | str]:
    """Each ``results.json`` in registry order, or its error (``repr``, logged; ``on_error`` first)."""
    out: dict[str, dict | str] = {}
    for s in registry.all_investigations():
        p = run_dir / s.name / "results.json"
        if not p.exists():
            continue
        try:
            out[s.name] = read_results(p.parent)
        except (OSError, ValueError) as exc:
            if on_error is not None:
                on_error(p, exc)
            log.warning("report: results of %s: %r", s.name, exc)
            out[s.name] = repr(exc)
    return out


def key_numbers(results: Mapping[str, dict | str]) -> dict[str, list[registry.KeyNumber] | str]:
    """Each investigation's key numbers, or the error (``repr``, logged)."""
    out: dict[str, list[registry.KeyNumber] | str] = {}
    for name, r in results.items():
        try:
            out[name] = r if isinstance(r, str) else list(registry.get(name).key_numbers(r))
        except Exception as exc:  # noqa: BLE001 - the report is written in every case
            log.warning("report: key numbers of %s: %r", name, exc)
            out[name] = repr(exc)
    return out


def status_text(n: Mapping[str, Any]) -> str:
    """Whether a notebook ran: ``ran``, ``error``, ``skipped (<reason>)``."""
    st = str(n.get("status"))
    if st == "ok":
        return "ran"
    return f"{st} ({n['reason']})" if st == "skipped" and n.get("reason") else st


def gate_result(run_dir: str | Path, n: Mapping[str, Any]) -> tuple[str, str]:
    """(result, text) of notebook entry ``n``'s gate (docs/suite.md), text as the notebook's last
    line (``fail: 4 checks: 1 failed, 2 passed, 1 skipped``)."""
    st = str(n.get("status") or "")
    if st == "skipped":
        return "not run", "not run"
    if st == "error":
        return "error", "error: " + (clip(n.get("error"), 120) or "notebook failed")
    doc = read_verdict(Path(run_dir) / str(n.get("name")))
    if doc is None:
        return "not gated", "not gated: no verdict written"
    word = gate_word("ok", doc)
    if word == "error":
        return "error", "error: " + (clip(doc.get("error"), 120) or "verdict unreadable")
    rows = check_table(doc.get("rows") or [])
    counts = check_counts(rows["status"]) if not rows.empty else ""
    if word == "fail":
        failed = not rows.empty and (rows["status"] == "fail").any()
        return "fail", "fail: " + (
            counts if failed else clip(doc.get("reason"), 120) or "the verdict says fail"
        )
    if word == "inconclusive":
        return "inconclusive", f"inconclusive: {counts}; noise could flip, none failed"
    if word == "not gated":
        return "not gated", f"not gated: {counts or 'no check declared'}"
    return "pass", f"pass: {counts}"


def gate_view(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The gate rows, ``baseline``/``measured``/``limit`` for expected/actual/bound, failures first."""
    if verdicts.empty:
        return pd.DataFrame(columns=GATE_COLUMNS)
    inv = verdicts["case"].isin([s.name for s in registry.all_investigations()])
    exp = pd.to_numeric(verdicts["expected"], errors="coerce")
    bound = pd.to_numeric(verdicts["bound"], errors="coerce")
    return (
        verdicts.assign(
            baseline=exp.where(~inv),
            measured=verdicts["actual"],
            limit=bound.where(bound.notna() | ~inv, exp),
            _o=verdicts["status"].map(GATE_ORDER).fillna(5),
        )
        .sort_values("_o", kind="stable")
        .drop(columns=["expected", "actual", "bound", "_o"])
    )


def _measured_elsewhere(results: Mapping[str, dict | str], name: str) -> str | None:
    try:
        s = registry.get(name)
    except KeyError:
        return None
    if s.found_in is None:
        return None
    for other, r in results.items():
        if other != name and isinstance(r, dict) and s.found_in(r):
            return registry.get(other).title
    return None


def investigations(
    run_dir: str | Path, nbs: list[dict[str, Any]], results: Mapping[str, dict | str]
) -> list[dict[str, Any]]:
    """One entry per notebook for the Investigations table and the page's toc."""
    run_dir = Path(run_dir)
    out = []
    for n in nbs:
        name = str(n.get("name"))
        title = section_head(name)[0]
        gate, text = gate_result(run_dir, n)
        note = None
        if gate == "not run" and (where := _measured_elsewhere(results, name)):
            note = f"not run on its own; measured inside {where}: see its root-cause panel"
        out.append(
            {
                "name": name,
                "title": title,
                "ran": status_text(n),
                "gate": gate,
                "gate_text": text,
                "note": note,
                "wall_s": n.get("wall_s"),
                "error": n.get("error") or n.get("reason") or "",
            }
        )
    return out


def investigations_table(inv: list[dict[str, Any]], checks: bool = False) -> list[dict[str, Any]]:
    """The Investigations table: the page's (``checks``: gate word and counts apart) or the summary's."""
    return [
        {
            "investigation": i["title"],
            "gate": i["gate"] if checks else i["gate_text"],
            **({"checks": i["gate_text"].partition(": ")[2]} if checks else {}),
            "notebook": i["ran"],
            "wall (s)": i["wall_s"],
            "note": i["note"] or (i["error"] if i["gate"] != "error" else ""),
        }
        for i in inv
    ]


def run_warnings(run_dir: Path) -> list[str]:
    """The run's warnings: the gate's, then :func:`refused_records`."""
    return [*((read_verdict(run_dir / GATE) or {}).get("warnings") or []), *refused_records(run_dir)]


def run_status(run_dir: Path) -> tuple[dict[str, Any], pd.DataFrame, int, str]:
    """(run.json info, verdict rows, exit code, status word)."""
    info = _run_info(run_dir)
    verdicts = collect_verdicts(run_dir)
    code = info.get("exit_code")
    if code is None:
        code = exit_code_for(info.get("notebooks", []), verdicts)
    return info, verdicts, code, status_word(code, verdicts)


def _part_id(part: Mapping[str, Any]) -> str:
    """As ``scaleout.units.Part.id``."""
    return str(part.get("investigation", part.get("scenario", ""))) + (
        f".{part['key']}" if part.get("key") else ""
    )


def units_frame(info: Mapping[str, Any]) -> pd.DataFrame | None:
    """One row per unit of work of a merged run (wall in s); None without units."""
    so = info.get("scaleout") or {}
    units = so.get("units") or []
    if not units:
        return None
    outcomes = {o.get("unit_id"): o for o in so.get("outcomes") or [] if isinstance(o, Mapping)}
    beside: dict[str, set[str]] = {}
    for pair in so.get("concurrent") or []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            a, b = (str(x) for x in pair)
            beside.setdefault(a, set()).add(b)
            beside.setdefault(b, set()).add(a)
    parts_info = so.get("parts") if isinstance(so.get("parts"), Mapping) else {}
    mixed = len(so.get("commits") or []) > 1  # --allow-mixed-commits
    noted = any((v or {}).get("notes") for v in parts_info.values() if isinstance(v, Mapping))
    rows = []
    for u in units:
        uid = u.get("id")
        o = outcomes.get(uid) or {}
        commits = {
            str((parts_info.get(_part_id(p)) or {}).get("commit") or "")[:12] for p in u.get("parts") or []
        } - {""}
        rows.append(
            {
                "unit": uid,
                "parts": ", ".join(_part_id(p) for p in u.get("parts") or []),
                "shard": u.get("shard"),
                "status": o.get("status") or "not run",
                "attempts": o.get("attempts"),
                "wall (s)": o.get("wall_s"),
                "GPUs": ", ".join(g[:12] + "…" for g in o.get("gpu_uuids") or []) or None,
                "ran beside": ", ".join(sorted(beside.get(uid, ()))) or None,
                **({"commit": ", ".join(sorted(commits)) or None} if mixed else {}),
                **({"notes": _unit_notes(u, parts_info)} if noted else {}),
                "error": clip(o.get("error")),
            }
        )
    return pd.DataFrame(rows)


def _unit_notes(unit: Mapping[str, Any], parts_info: Mapping[str, Any]) -> str | None:
    notes = (
        str(n)
        for p in unit.get("parts") or []
        for n in (parts_info.get(_part_id(p)) or {}).get("notes") or []
    )
    return "; ".join(dict.fromkeys(notes)) or None


def refused_records(run_dir: str | Path) -> list[str]:
    """One line per request failed because its performance.log record was refused (every bundle's)."""
    from perfkit.readings.records import REFUSED

    out: list[str] = []
    run_dir = Path(run_dir)
    paths = sorted(run_dir.glob("*/requests.parquet")) + sorted(run_dir.glob("merged/*/requests.parquet"))
    for p in paths:
        try:
            df = pd.read_parquet(p, columns=["launch", "request_id", "index", "error"])
        except Exception as exc:  # noqa: BLE001 - the summary is written in every case
            log.warning("summary: cannot read %s: %r", p, exc)
            continue
        for r in df.itertuples(index=False):
            if isinstance(r.error, str) and r.error.startswith(REFUSED):
                out.append(
                    f"{p.parent.name}: request {r.request_id} ({r.launch} #{r.index}) failed: {r.error}"
                )
    return out


def engine_ends_frame(
    run_dir: str | Path, bundles: Mapping[Path, ResultBundle | Exception]
) -> pd.DataFrame | None:
    """One row per launch that did not end by perfkit's plain teardown (``bundles`` and the units'),
    then each process a kernel left that the suite ended (``outlived``); None when none."""
    run_dir = Path(run_dir)
    rows = []
    units = load_bundles(m.parent for m in sorted(run_dir.glob("shards/*/units/*/*/meta.json")))
    seen: set[tuple[Any, ...]] = set()
    for d, b in {**bundles, **units}.items():
        if isinstance(b, Exception):
            continue
        for r in b.launches.to_dict("records"):
            failed, by_perfkit = r.get("failed_request"), r.get("end_by_perfkit")
            if not is_reported(failed) and (
                not is_reported(r.get("ended")) or by_perfkit is True or not is_reported(r.get("end_signal"))
            ):
                continue
            key = (d.name.split(".")[0], r.get("launch"), r.get("ended"), str(failed))
            if key in seen:  # a merged bundle and its unit's own copy
                continue
            seen.add(key)
            rows.append(
                {
                    "investigation": d.name,
                    "launch": r.get("launch"),
                    "failed request": int(failed) if is_reported(failed) else None,
                    "how the engine ended": r.get("ended") or "not recorded",
                    "OOM-kill record": r.get("oom_record") or "–",
                }
            )
    for n in _run_info(run_dir).get("notebooks", []):
        fl = n.get("in_flight") or {}
        for e in n.get("outlived") or []:
            label = str(e.get("label") or "")
            mine = fl and label.split(" ")[0] == str(fl.get("launch"))
            rows.append(
                {
                    "investigation": n.get("name"),
                    "launch": f"pid {e.get('pid')} {label}".strip(),
                    "failed request": fl.get("request") if mine else None,
                    "how the engine ended": f"found after its notebook's kernel ended: {e.get('how')}",
                    "OOM-kill record": "–",
                }
            )
    return pd.DataFrame(rows) if rows else None
