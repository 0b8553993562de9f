"""The root-cause panel of one investigation's bundle (:func:`root_cause`; docs/suite.md)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Mapping

import pandas as pd

from perfkit.bundle import WARMUP_INDEX, ResultBundle
from perfkit.checks import NOT_REPORTED, is_reported
from perfkit.common.numfmt import json_float
from perfkit.investigations import registry
from perfkit.readings.records import read_number
from perfkit.report.plots import launch_names
from perfkit.report.tables import MISSING, Table, cell_text, format_table, penalty_stage
from perfkit.roles import request_roles

log = logging.getLogger(__name__)


#: launches-table column -> config row label: always shown ("not reported" when empty)
_CONFIG_COLUMNS: dict[str, str] = {
    "compile_requested": "torch.compile requested",
    "compile_active": "torch.compile active",
    "compile_backend": "compile backend",
    "compile_disabled_reason": "compile disabled because",
    "attention_backend": "attention backend",
    "dtype": "dtype",
    "offload": "offload",
    "recompile_limit": "recompile limit",
    "config_source": "config source",
    "first_result_s": "time to first result (s)",
}
#: shown when present
_EXTRA_CONFIG = {
    "engine_device": "engine device",
    "cold_start_sources": "cold start parts from",
    "warmup_frames": "startup warmup frames",
    "warmup_latent_shape": "startup warmup latent shape",
    "placement": "placement",
    "device_cap_gib": "device cap (GiB)",
    "host_cap_effective_gib": "host cap in force (GiB)",
    "enforcement": "cap enforcement",
    "reused_from": "session reused from",
}

_LOG_LINE = re.compile(
    r"^\s*[WEF]\d{4}\s|\b(?:WARNING|WARN|ERROR|CRITICAL|FATAL)\b|\b\w*(?:Warning|Error|Exception):|"
    r"^Traceback\b|\bdeprecated\b",
)
_NOISE = [
    (re.compile(r"^\s*[VIWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+"), ""),  # glog prefix
    (re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+\s*"), ""),  # logging timestamp
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"\b\d+(\.\d+)?\b"), "N"),
]


def _present(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


def not_reported(launches: pd.DataFrame | None) -> list[str]:
    """Labels of the :data:`_CONFIG_COLUMNS` settings no launch reported."""
    df = launches if launches is not None else pd.DataFrame()
    out = [label for col, label in _CONFIG_COLUMNS.items() if not _present(df, col)]
    if _present(df, "compile_active") and df["compile_active"].fillna(False).astype(bool).all():
        out = [x for x in out if x != _CONFIG_COLUMNS["compile_disabled_reason"]]  # nothing to explain
    return out


def engine_config(launches: pd.DataFrame) -> Table | None:
    """The effective engine config, a column per launch; None without launches."""
    if launches is None or launches.empty or "launch" not in launches.columns:
        return None
    names = launch_names(launches)
    cols = [str(lk) for lk in launches["launch"]]
    header = [
        "setting",
        *(names.get(lk, lk) if names.get(lk, lk) == lk else f"{lk} ({names[lk]})" for lk in cols),
    ]
    rows = [
        [
            label,
            *(NOT_REPORTED if col in _CONFIG_COLUMNS and pd.isna(v) else cell_text(v) for v in launches[col]),
        ]
        for col, label in {**_CONFIG_COLUMNS, **_EXTRA_CONFIG}.items()
        if _present(launches, col)
    ]
    return Table(header=header, rows=rows)


#: (label, torch ``dynamo_timed`` name; torch._dynamo.utils, torch 2.11-2.13); they nest: the
#: kernel compile wait is inside AOT + inductor
COMPILE_PHASES = (
    ("dynamo tracing", "bytecode_tracing"),
    ("AOT + inductor", "OutputGraph.call_user_compiler"),
    ("kernel compile wait", "async_compile.wait"),
    ("guards", "build_guards"),
)


def compile_phase_text(value: Any) -> str:
    """``compile_phases`` (name -> ms) as "dynamo tracing 0.15 s · …"; else "not reported"/"unreadable"."""
    if not is_reported(value):
        return NOT_REPORTED
    try:
        phases = json.loads(value) if isinstance(value, str) else dict(value)
        if not isinstance(phases, dict):
            raise TypeError("not an object")
        parts = [
            f"{label} {read_number(phases[key], key, nullable=False) / 1000:.2f} s"
            for label, key in COMPILE_PHASES
            if key in phases
        ]
    except (ValueError, TypeError):  # RecordError is a ValueError
        return f"unreadable: {str(value)[:60]}"
    return " · ".join(parts) if parts else "none of the known phases"


def recompilations(bundle: ResultBundle) -> Table | None:
    """One row per request that compiled (times in s); None when none did."""
    req = bundle.requests
    comp = req[(req["compiles"] > 0).fillna(False).to_numpy(bool)]
    if comp.empty:
        return None
    roles = request_roles(req, bundle.launches)
    label = dict(zip(roles["request_id"], roles["label"]))
    multi = req["launch"].nunique() > 1
    phased = _present(comp, "compile_phases")
    rows = []
    for _, r in comp.iterrows():
        rid = r.get("request_id")
        reasons = str(r.get("recompile_reasons") or "") if pd.notna(r.get("recompile_reasons")) else ""
        uniq = list(dict.fromkeys(x.strip() for x in reasons.split(";") if x.strip()))
        if not uniq:
            i = pd.to_numeric(pd.Series([r.get("index")]), errors="coerce").iloc[0]
            uniq = ["first compilation (startup warmup)" if i == WARMUP_INDEX else "no reason recorded"]
        me = roles[roles["request_id"] == rid].head(1)
        warm = roles[
            (roles["role"] == "warm") & roles["launch"].isin(me["launch"]) & roles["shape"].isin(me["shape"])
        ]
        stage, extra = penalty_stage(bundle.stages, {"request_id": rid}, warm)
        ms = r.get("compile_ms")
        rows.append(
            {
                **({"launch": r.get("launch")} if multi else {}),
                "request": label.get(rid, cell_text(r.get("index"))),
                "compiles": r.get("compiles"),
                "compile time (s)": float(ms) / 1000 if pd.notna(ms) else None,
                "stage that paid": stage,
                "stage excess (s)": extra / 1000,
                **({"made of": compile_phase_text(r.get("compile_phases"))} if phased else {}),
                "reason": "; ".join(uniq),
            }
        )
    return format_table(pd.DataFrame(rows), None, labels=False)


def _compile_count_note(bundle: ResultBundle) -> str | None:
    req = bundle.requests
    missing = int(req["compiles"].isna().sum())
    if not missing:
        return None
    if missing == len(req):
        return (
            f"Compile counts {NOT_REPORTED}: the engine's records carry none (sglang's do not), "
            "so whether a request compiled is not known from them."
        )
    return f"Compile counts {NOT_REPORTED} for {missing} of {len(req)} requests (no record, or the engine gave none)."


def log_findings(logs: Mapping[str, str], limit: int = 20) -> Table | None:
    """Warnings and errors in engine logs, a row per message, most frequent first."""
    found: dict[str, dict[str, Any]] = {}
    for name, text in (logs or {}).items():
        launch = re.sub(r"\.(stdout|stderr)\.log$", "", name)
        for line in str(text).splitlines():
            if not _LOG_LINE.search(line):
                continue
            key = shown = line.strip()
            for i, (pat, rep) in enumerate(_NOISE):
                key = pat.sub(rep, key)
                shown = key if i == 1 else shown  # glog prefix and timestamp gone, numbers kept
            shown = shown if len(shown) <= 300 else shown[:299] + "…"
            e = found.setdefault(key, {"message": shown, "count": 0, "launches": []})
            e["count"] += 1
            if launch not in e["launches"]:
                e["launches"].append(launch)
    if not found:
        return None
    rows = sorted(found.values(), key=lambda e: -e["count"])[:limit]
    df = pd.DataFrame(
        [{"count": e["count"], "logged by": ", ".join(e["launches"]), "message": e["message"]} for e in rows]
    )
    return format_table(df, None, labels=False)


def budget_clamps(launches: pd.DataFrame) -> list[str]:
    """Sentences for launches whose host cap in force is below the ask, or was exceeded."""
    out: list[str] = []
    if launches is None or launches.empty:
        return out
    for _, r in launches.iterrows():
        lk = r.get("launch")
        clamp = r.get("host_cap_clamp")
        if isinstance(clamp, str) and clamp.strip():
            ask, eff = r.get("host_cap_asked_gib"), r.get("host_cap_effective_gib")
            if pd.isna(ask):
                ask = r.get("host_cap_gib")
            out.append(f"{lk}: host cap asked {cell_text(ask)} GiB, in force {cell_text(eff)} GiB ({clamp})")
        if pd.notna(r.get("cap_exceeded")) and bool(r.get("cap_exceeded")):
            out.append(f"{lk}: the host cap was exceeded and the engine was stopped")
    return out


_ABS_WORD = re.compile(r"^/[^\s]*$")


def _command_text(command: str, keep: int = 3) -> str:
    return " ".join(
        "…/" + "/".join(w.rstrip("/").split("/")[-keep:]) if _ABS_WORD.match(w) and w.count("/") > keep else w
        for w in command.split(" ")
    )


def _instrumentation_overhead(results: Mapping[str, Any], name: str) -> tuple[Table | None, str | None]:
    """(table, title of the investigation it is from when not ``name``); (None, None) when none."""
    for inv, r in sorted(results.items(), key=lambda kv: kv[0] != name):
        srcs = (r, r.get("instrumentation") or {}) if isinstance(r, Mapping) else ()
        parts = {  # {part: {median_on_ms, median_off_ms, overhead_ci, ...}}
            str(k): v
            for src in srcs
            if isinstance(src, Mapping)
            for k, v in src.items()
            if isinstance(v, Mapping) and "overhead_ci" in v and "median_off_ms" in v
        }
        if not parts:
            continue
        rows = []
        for part, s in parts.items():
            ci = list(s.get("overhead_ci") or [None, None]) + [None, None]
            on, off = json_float(s.get("median_on_ms")), json_float(s.get("median_off_ms"))
            rows.append(
                {
                    "part": part.replace("_", " "),
                    "pairs": s.get("n_on"),
                    "median on (ms)": s.get("median_on_ms"),
                    "median off (ms)": s.get("median_off_ms"),
                    "median cost": _pct(
                        on / off - 1 if on is not None and off is not None and off > 0 else None
                    ),
                    "95% interval": f"{_pct(ci[0])} … {_pct(ci[1])}" if ci[0] is not None else MISSING,
                }
            )
        where = None if inv == name else registry.get(inv).title
        return format_table(pd.DataFrame(rows), None, labels=False), where
    return None, None


def _pct(v: Any) -> str:
    f = json_float(v)
    return MISSING if f is None else f"{f:+.2%}"


def root_cause(
    b: ResultBundle | Exception | None, name: str, results: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The root-cause panel of ``name``'s bundle; None without one; never raises."""
    if not isinstance(b, ResultBundle):
        return None
    try:
        ov, ov_from = _instrumentation_overhead(results, name)
        launches = b.launches
        commands = []
        if _present(launches, "command"):
            commands = [
                {"launch": str(r["launch"]), "command": _command_text(str(r["command"]))}
                for _, r in launches.iterrows()
                if pd.notna(r.get("command"))
            ]
        return {
            "config": engine_config(launches),
            "not_reported": not_reported(launches),
            "recompiles": recompilations(b),
            "compiles_note": _compile_count_note(b),
            "logs": log_findings(b.logs),
            "clamps": budget_clamps(launches),
            "instrumentation": ov,
            "instrumentation_from": ov_from,
            "commands": commands,
        }
    except Exception as exc:  # noqa: BLE001 - the report is written in every case
        log.warning("report: root-cause panel of %s: %r", name, exc)
        return None
