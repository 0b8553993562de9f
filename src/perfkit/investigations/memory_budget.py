"""Memory budget (seed case 000): a launch per cap; the device and host peaks (MiB), the placement
the engine chose, whether the cap held and whether warm requests degrade (docs/suite.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd
from pydantic import Field, model_validator

from perfkit.bundle import ResultBundle, table_rows
from perfkit.checks import Check, check_flag
from perfkit.common.numfmt import fmt, json_float
from perfkit.common.slugs import md_text, slug
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import common, registry
from perfkit.investigations.common import code, md, mib
from perfkit.measuring.assemble import PlannedLaunch, assemble, join_bundles, launch_key, relabel
from perfkit.measuring.launch_rows import LaunchData, measure_launch
from perfkit.measuring.profiled import SnapshotParams, sites_markdown
from perfkit.readings.sampler.nvml import nvml_inventory

log = logging.getLogger(__name__)

NAME = "memory_budget"

#: A warm request slower than the cold one by more than this fraction "degrades".
_WARM_DEGRADE_TOLERANCE = 0.10


def cap_entry(data: LaunchData, cap: MemoryCaps, repeats: int) -> dict[str, Any]:
    """One ``caps`` entry of the results from the launch ``data`` under ``cap`` (MiB, GiB, ms)."""
    df, ok, numbers = common.launch_numbers(data)
    lr = data.launch_row
    exceeded = bool(lr.get("cap_exceeded")) or (data.error or "").startswith("host memory cap exceeded")
    oom = bool(not df.empty and df["error"].fillna("").str.contains("out of device memory").any())
    cold, warm = numbers["cold_ms"], numbers["warm_ms"]
    return {
        "label": cap.label,
        "device_cap_gib": cap.device_gib,
        "host_cap_gib": cap.host_gib,
        "completed": bool(len(ok) == repeats),
        "n_completed": int(len(ok)),
        "cap_held": bool(not exceeded and not oom),
        "host_cap_effective_gib": json_float(lr.get("host_cap_effective_gib")),
        "host_cap_clamp": _text(lr.get("host_cap_clamp")),
        "enforcement": lr.get("enforcement"),
        "cap_mechanism": _text(lr.get("cap_mechanism")),
        "host_source": _text(lr.get("host_source")),
        **numbers,
        "placement": lr.get("placement"),
        "error": data.error or (None if len(ok) == repeats else common.request_errors(df)),
        "warm_degrades": bool(warm > cold * (1 + _WARM_DEGRADE_TOLERANCE)) if warm is not None else None,
    }


def _text(v: Any) -> str | None:
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)


class MinBudgetParams(registry._Model):
    """Bisection of the smallest device budget that completes (GPU only)."""

    lo_gib: float = Field(gt=0)
    hi_gib: float = Field(gt=0)
    #: bisection stops when hi - lo <= this (GiB)
    resolution_gib: float = Field(1.0, ge=0.01)

    @model_validator(mode="after")
    def _order(self) -> "MinBudgetParams":
        if self.lo_gib >= self.hi_gib:
            raise ValueError(f"lo_gib ({self.lo_gib:g}) must be < hi_gib ({self.hi_gib:g})")
        return self


class MemoryBudgetParams(registry.InvestigationParams):
    """``memory_budget`` section: one launch per budget, ``repeats`` requests each."""

    #: the budgets; the default is one launch without caps
    caps: list[registry.CapParams] = Field(default_factory=lambda: [registry.CapParams()], min_length=1)
    #: requests per launch (the first is the cold request)
    repeats: int = Field(2, ge=1, le=1000)
    #: also bisect the minimum device cap, {lo_gib, hi_gib} (GPU only; None: no bisection)
    min_budget: Optional[MinBudgetParams] = None
    #: CUDA allocator snapshots after the cold request and warm request k (``memory_sites``)
    snapshot: Optional[SnapshotParams] = None


class MemoryBudgetInvariants(registry.InvariantParams):
    """What every budget must show (booleans)."""

    #: every memory cap held (no OOM inside the cap, no host cap exceeded)
    caps_held: Optional[bool] = True
    #: every capped run completed all its requests
    caps_completed: Optional[bool] = None
    #: False gates: warm requests no slower than the cold one (beyond 10 %)
    warm_degrades_allowed: Optional[bool] = None


def memory_budget(
    spec: EngineSpec,
    caps: list[MemoryCaps | None] | None = None,
    request: VideoRequestSpec | dict | None = None,
    repeats: int = 2,
    run_dir: str | Path = "outputs/memory_budget",
    sample_interval_s: float = 0.1,
    min_budget: dict[str, float] | None = None,
    reuse: Any = None,
    snapshot: SnapshotParams | dict | None = None,
) -> ResultBundle:
    """The ``memory_budget`` bundle: one launch per cap (None: unlimited; default: the params
    model's), results keys in docs/suite.md, "Results"; ``min_budget`` ``{"lo_gib", "hi_gib"}``
    also bisects the minimum device cap. Raises ValueError: repeats < 1."""
    if repeats < 1:
        raise ValueError(f"memory_budget: repeats must be >= 1, got {repeats}")
    caps = list(caps) if caps else [c.to_caps() for c in MemoryBudgetParams().caps]
    caps = [c if c is not None else MemoryCaps() for c in caps]
    req = common.as_request(request)
    spec, snapshot, why_not = common.snapshot_spec(spec, snapshot, repeats)
    launches, entries, reused, collected = [], [], [], []
    for i, cap in enumerate(caps):
        label = f"cap{i}"
        data = common.reuse_or_launch(
            reuse, [spec], [req] * repeats, run_dir, label, caps=cap, sample_interval_s=sample_interval_s
        )
        reused += [label] if data.launch_row.get("reused_from") else []
        data.launch_row["cap_label"] = cap.label
        launches.append(data)
        e = cap_entry(data, cap, repeats)
        if snapshot is not None:
            e["memory_sites"], sites = common.snapshot_sites(data, snapshot, repeats, why_not)
            collected.append(sites)
        entries.append(e)
    results: dict[str, Any] = {
        "caps": entries,
        "warm_degrade_tolerance": _WARM_DEGRADE_TOLERANCE,
        "reused_launches": reused,
    }
    if min_budget:
        mb = find_min_budget(spec, req, run_dir=Path(run_dir) / "bisect", **min_budget)
        results.update(
            min_budget_gib=mb["min_gib"], min_budget_probes=mb["probes"], min_budget_note=mb["note"]
        )
    params = {
        "spec": spec.to_dict(),
        "caps": [c.to_dict() for c in caps],
        "request": req.payload(),
        "repeats": repeats,
        "min_budget": min_budget,
    }
    if snapshot is not None:
        params["snapshot"] = snapshot.model_dump()
        results["memory_sites"] = entries[0].get("memory_sites") if entries else None
    bundle = assemble(NAME, launches, params, results, caps=caps)
    if snapshot is not None:
        common.attach_sites(bundle, collected)
    return bundle


def find_min_budget(
    spec: EngineSpec,
    request: VideoRequestSpec | dict | None,
    lo_gib: float,
    hi_gib: float,
    run_dir: str | Path = "outputs/min_budget",
    resolution_gib: float = 1.0,
) -> dict[str, Any]:
    """Bisect the smallest device cap (GiB) at which one request completes, a launch a probe:
    ``{"min_gib": float | None, "probes": [{"device_gib", "completed", "placement", "e2e_ms",
    "error"}], "note": str}`` (min_gib None without an NVIDIA GPU). Raises ValueError: not
    0 < lo_gib < hi_gib, or resolution_gib < 0.01 (the probes' rounding)."""
    if not (0 < lo_gib < hi_gib):
        raise ValueError(f"find_min_budget: need 0 < lo_gib < hi_gib, got {lo_gib}, {hi_gib}")
    if not resolution_gib >= 0.01:
        raise ValueError(
            f"find_min_budget: resolution_gib must be >= 0.01 (caps are rounded to it), got {resolution_gib}"
        )
    if not nvml_inventory():
        note = "find_min_budget needs a GPU (device caps are CUDA memory fractions); none visible: skipped"
        log.warning(note)
        return {"min_gib": None, "probes": [], "note": note}
    req = common.as_request(request)
    probes: list[dict[str, Any]] = []

    def ok_at(gib: float) -> bool:
        caps = MemoryCaps(device_gib=gib)
        data = measure_launch(spec, [req], Path(run_dir), f"probe{gib:g}GiB", caps=caps, stop_on_failure=True)
        df = data.sent_rows()
        good = bool(not df.empty and (df["status"] == "completed").all() and data.error is None)
        probes.append(
            {
                "device_gib": gib,
                "completed": good,
                "placement": data.launch_row.get("placement"),
                "e2e_ms": json_float(df["e2e_ms"].iloc[0]) if not df.empty else None,
                "error": data.error or (None if good else common.request_errors(df)),
            }
        )
        log.info("min budget probe %.2f GiB: %s", gib, "ok" if good else "failed")
        return good

    if not ok_at(hi_gib):
        return {"min_gib": None, "probes": probes, "note": f"fails even at {hi_gib} GiB"}
    lo, hi = lo_gib, hi_gib
    if ok_at(lo):
        return {"min_gib": lo, "probes": probes, "note": f"completes at the lower bound {lo} GiB"}
    while hi - lo > resolution_gib:
        mid = round((lo + hi) / 2, 2)
        if ok_at(mid):
            hi = mid
        else:
            lo = mid
    return {"min_gib": hi, "probes": probes, "note": f"smallest passing cap within {resolution_gib} GiB"}


def run(ctx: registry.RunContext, p: MemoryBudgetParams) -> ResultBundle:
    """:func:`memory_budget` with the params section."""
    mb = p.min_budget.model_dump() if p.min_budget else None
    return memory_budget(
        ctx.engine, **common.run_kwargs(ctx, p, NAME, caps=[c.to_caps() for c in p.caps], min_budget=mb)
    )


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: no budget measured, the launch without caps did not complete,
    an engine lost not to its cap (no OOM record, cap kill or CUDA OOM), or a request timed out."""
    caps = (bundle.results or {}).get("caps") or []
    if not caps:
        raise registry.bundle_error(bundle, "no budget measured")
    for c in caps:
        if c.get("device_cap_gib") is None and c.get("host_cap_gib") is None and not c.get("completed"):
            why = c.get("error") or "see the engine log"
            raise registry.bundle_error(
                bundle, f"the run without caps ({c.get('label')}) did not complete: {why}"
            )
    held = {f"cap{i}": c.get("cap_held") for i, c in enumerate(caps)}
    for row in table_rows(bundle.launches):
        oom = str(row.get("oom_record") or "")
        if (
            json_float(row.get("end_signal")) is not None
            and row.get("end_by_perfkit") in (False, 0)
            and not row.get("cap_exceeded")
            and held.get(row.get("launch")) is not False
            and not oom.startswith(("cgroup ", "kernel log: "))
        ):
            raise registry.bundle_error(
                bundle,
                f"launch {row.get('launch')} ({row.get('cap_label') or row.get('label')}) lost its engine, "
                f"not to its cap: it {row.get('ended')}; OOM-kill record: {oom or 'none'}",
            )
    hung = bundle.requests[bundle.requests["status"] == "timeout"]
    if len(hung):
        r = hung.iloc[0]
        raise registry.bundle_error(
            bundle,
            f"launch {r.get('launch')}: request {r.get('index')} timed out "
            f"({r.get('error') or 'no answer'}): the engine hung, not a budget verdict",
        )


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """The gate's checks of a ``memory_budget`` results dict: per budget, cap held, completed, warm."""
    rows: list[Check] = []
    caps = [c for c in (r.get("caps") or []) if isinstance(c, dict)]
    for key, col, want in (
        ("caps_held", "cap_held", True),
        ("caps_completed", "completed", True),
        ("warm_degrades_allowed", "warm_degrades", False),
    ):
        if key not in inv or bool(inv[key]) != want:  # warm_degrades_allowed gates when False
            continue
        if not caps:
            rows.append(Check(NAME, key, None, None, None, "skipped", "not measured"))
            continue
        for c in caps:
            detail = (
                f"device cap {_gib(c.get('device_cap_gib'))}, host cap {_gib(c.get('host_cap_gib'))},"
                f" enforcement {c.get('enforcement') or '–'}, peak reserved "
                f"{mib(c.get('peak_reserved_mib'))}, {common.host_peak_text(c)}, placement {c.get('placement') or '–'}"
            )
            rows.append(check_flag(NAME, f"{col}[{c.get('label')}]", c.get(col), want, detail))
    return rows


def _gib(v: Any) -> str:
    return fmt(v, "g", " GiB", missing="none")


def key_numbers(r: Mapping[str, Any]) -> list[registry.KeyNumber]:
    """The key numbers of a ``memory_budget`` results dict (peaks in MiB, minimum budget in GiB)."""
    out = [
        registry.KeyNumber(
            f"cap {c.get('label')}",
            ("completed" if c.get("completed") else "did not complete")
            + ", "
            + ("held" if c.get("cap_held") else "not held")
            + f", peak reserved {mib(c.get('peak_reserved_mib'))}",
        )
        for c in r.get("caps") or []
    ]
    mb = json_float(r.get("min_budget_gib"))
    if mb is not None:
        if _failing_below(r, mb):
            out.append(registry.KeyNumber("minimum device budget", mb, "GiB", "g"))
        else:  # the search's lower bound completed: nothing smaller was tried
            text = f"≤ {mb:g} GiB (the search's lower bound completed)"
            out.append(registry.KeyNumber("minimum device budget", text))
    return out


def _failing_below(r: Mapping[str, Any], mb: float) -> list[float]:
    """The failed probes' device budgets (GiB) below ``mb``."""
    return [
        float(p["device_gib"])
        for p in r.get("min_budget_probes") or []
        if not p.get("completed") and json_float(p.get("device_gib")) is not None and p["device_gib"] < mb
    ]


_SUMMARY_COLUMNS = (
    "label device_cap_gib host_cap_gib host_cap_effective_gib host_cap_clamp completed cap_held enforcement "
    "cap_mechanism peak_reserved_mib host_pss_peak_mib cgroup_peak_mib host_anon_peak_mib placement cold_ms "
    "warm_ms warm_degrades error"
).split()


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """One row per budget (MiB, GiB, ms); a sparse column only when some budget has a value."""
    return common.pick_columns(
        pd.DataFrame(r.get("caps") or []),
        _SUMMARY_COLUMNS,
        sparse=("error", "host_cap_clamp", "cgroup_peak_mib"),
    )


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of a ``memory_budget`` results dict: per budget (MiB), the minimum (GiB)."""
    out = []
    for c in r.get("caps") or []:
        out.append(
            f"- **{md_text(c.get('label'))}**: "
            + ("completed" if c.get("completed") else "**did not complete**")
            + ", cap "
            + ("held" if c.get("cap_held") else "**not held**")
            + f" (enforcement {c.get('enforcement')}); peak reserved "
            f"{mib(c.get('peak_reserved_mib'))}, {common.host_peak_text(c)}, placement {c.get('placement') or '–'}"
            + ("; warm requests degrade" if c.get("warm_degrades") else "")
            + "."
        )
        sites = sites_markdown(c)
        if sites:
            out.append(f"  {sites}")
    mb = json_float(r.get("min_budget_gib"))
    out.append("")
    if mb is None:
        out.append("Smallest device budget: not searched (no GPU, or not asked).")
    else:
        below = _failing_below(r, mb)
        out.append(
            f"Smallest device budget that completes: {mb:g} GiB (the largest failing probe: {max(below):g} GiB)."
            if below
            else f"Smallest device budget that completes: at most {mb:g} GiB (the search's lower bound "
            "completed; nothing smaller was tried)."
        )
    return "\n".join(out)


def cases(bundle: ResultBundle, case_id: Any) -> dict[str, ResultBundle]:
    """One case per budget, suffix ``_cap-<label>``."""
    rows = table_rows(bundle.launches) or [{"launch": None, "label": "unlimited"}]
    labels = {r.get("launch"): r.get("cap_label") or r.get("label") or r.get("launch") for r in rows}
    return common.steady_cases(
        bundle, case_id, {f"_cap-{slug(x or 'unlimited')}": la for la, x in labels.items()}
    )


def split(p: MemoryBudgetParams) -> list[tuple[str, MemoryBudgetParams]]:
    """One part per budget (``cap0``, ``cap1``), or one part with ``min_budget`` (a chain)."""
    if p.min_budget is not None or len(p.caps) < 2:
        return [("all", p)]
    return [(f"cap{i}", p.model_copy(update={"caps": [c]})) for i, c in enumerate(p.caps)]


def join(parts: list[ResultBundle], p: MemoryBudgetParams) -> ResultBundle:
    """The bundle :func:`memory_budget` would have written, from the :func:`split` parts'.
    Raises ValueError: a part that is not one budget, or parts that do not match ``p.caps``."""
    if len(parts) != len(p.caps):
        raise ValueError(f"{NAME}: {len(parts)} parts for {len(p.caps)} budgets")
    entries, reused = [], []
    for i, b in enumerate(parts):
        got = b.results.get("caps") or []
        if len(got) != 1:
            raise ValueError(f"{NAME}: part {i} ({b.path}) measured {len(got)} budgets, expected 1")
        relabel(b, "cap0", f"cap{i}")
        entries += got
        reused += [f"cap{i}" for x in b.results.get("reused_launches") or [] if x == "cap0"]
    results = {**parts[0].results, "caps": entries, "reused_launches": reused}
    params = {
        **(parts[0].meta.get("params") or {}),
        "caps": [c for b in parts for c in (b.meta.get("params") or {}).get("caps") or []],
    }
    return join_bundles(NAME, parts, params, results)


def launches(p: MemoryBudgetParams, engine: EngineSpec, request: VideoRequestSpec) -> list[PlannedLaunch]:
    """One per budget, each may reuse an earlier session (the bisection's are left out)."""
    return [
        PlannedLaunch((launch_key(engine, request, c.to_caps()),), p.repeats, reuses=True) for c in p.caps
    ]


NOTEBOOK = common.headline(NAME, "Budgets") + (
    md("## Gate (caps held, runs completed)"),
    code(common.GATE_CELL),
    md("## Memory timeline per budget"),
    code("""for row in table_rows(bundle.launches) or [{}]:
    show(plots.memory_timeline(
        bundle, launch=row.get("launch"),
        caps={"device_cap_gib": row.get("device_cap_gib"), "host_cap_gib": row.get("host_cap_gib")}))"""),
    md(common.MEMORY_SITES_MD),
    code(common.MEMORY_SITES),
    md("## Latency per request under each budget"),
    code("show(plots.e2e_per_request(bundle))"),
    md(
        "## How to read this\n\n"
        "Each budget is one launch. The device cap works like sglang's CI "
        "(`SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB`: the worker caps torch's memory "
        "fraction); the host cap is what host planning sees "
        "(`SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB`) and, where possible, enforced "
        "(cgroup or watchdog: see `enforcement`). A budget is met when the run completed and "
        "the cap held; `placement` says what the engine moved off the device to fit, and "
        "`warm_degrades` whether warm requests got slower under the cap."
    ),
)

SECTION_INTRO = "The same request under each memory budget (device and host caps): did it complete, did the cap hold, and what did it cost in latency."


INVESTIGATION = registry.register_module(
    globals(),
    order=30,
    title="Memory budget",
    question="Does the pipeline fit the memory budget, and what does it cost in latency?",
    plan=lambda p: [p.repeats] * len(p.caps),
    params_model=MemoryBudgetParams,
    invariants_model=MemoryBudgetInvariants,
    notebook_intro="Does the pipeline fit the memory budget (e.g. 12 GiB GPU + 32 GiB host), and what "
    "does it cost in latency?",
)
