"""Offload modes: what each offload mode (none, model, group-block, group-leaf) costs and saves,
one launch per mode; a mode the device cannot run is ``not applicable`` (docs/suite.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

import pandas as pd
from pydantic import Field, field_validator

from perfkit.bundle import ResultBundle
from perfkit.checks import Check, check_flag
from perfkit.common.numfmt import fmt, json_float
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import OFFLOAD_MODES, EngineSpec, EngineSpecError
from perfkit.investigations import common, registry
from perfkit.investigations.common import code, md, mib
from perfkit.measuring.assemble import PlannedLaunch, assemble, join_bundles, launch_key
from perfkit.measuring.launch_rows import LaunchData
from perfkit.readings.records import parse_lines

NAME = "offload_modes"
#: slack of ``offload_vram_order``'s ">=" (allocator rounding), a fraction of the larger value
_ORDER_TOLERANCE = 0.05

OffloadMode = Literal["none", "model", "group-block", "group-leaf"]
#: a warm request slower than the cold one by more than this fraction fails
_WARM_TOLERANCE = 0.10
RAN, NOT_APPLICABLE, FAILED = "ran", "not applicable", "failed"

#: the engine's refusal of a mode the device cannot run (refengine.models)
_REFUSAL_RE = re.compile(r"offload mode '(?P<mode>[\w-]+)' needs an accelerator; device is (?P<device>\w+)")
#: the placement facts the engine reports in its records
_REPORTED = (
    "placement offload placement_by_component offload_use_stream device compile_active "
    "compile_disabled_reason compile_requested"
).split()


def _reported(data: LaunchData) -> dict[str, Any]:
    """The engine's placement facts from the launch's last record."""
    report = data.report or parse_lines(data.record_lines)
    pk = next((r.perfkit for r in reversed(report.records) if r.perfkit), None)
    return {k: pk.get(k) for k in _REPORTED} if pk else {}


def _mode_entry(data: LaunchData, mode: str, repeats: int) -> dict[str, Any]:
    lr = data.launch_row
    df, ok, numbers = common.launch_numbers(data)
    m = _REFUSAL_RE.search(data.error or "")
    rep = _reported(data)
    ps, ml = json_float(lr.get("process_start_s")), json_float(lr.get("models_loaded_s"))
    e: dict[str, Any] = {
        "ready_s": json_float(lr.get("ready_s")),
        "process_start_s": ps,
        "load_s": (ml - ps) if ml is not None and ps is not None else ml,
        "warmup_s": json_float(lr.get("warmup_s")),
        "n_completed": int(len(ok)),
        **numbers,
        "placement": rep.get("placement") or lr.get("placement"),
        **{k: rep.get(k) for k in _REPORTED[1:]},
    }
    if m:  # the engine's "not applicable" reason
        e.update({"status": NOT_APPLICABLE, "reason": m.group(0), "device": e["device"] or m.group("device")})
    elif len(ok) == repeats and data.error is None:
        e.update({"status": RAN, "reason": None})
    else:
        why = data.error or (common.request_errors(df) if not df.empty else None)
        e.update({"status": FAILED, "reason": (why or "see the engine log").splitlines()[0][:300]})
    ran, off, cold, warm = e["status"] == RAN, e["offload"] or {}, e["cold_ms"], e["warm_ms"]
    e["placement_matches"] = (bool(off) and all(v == mode for v in off.values())) if ran else None
    timed = ran and cold is not None and warm is not None
    e["warm_not_slower"] = bool(warm <= cold * (1 + _WARM_TOLERANCE)) if timed else None
    return e


class OffloadModesParams(registry.InvestigationParams):
    """``offload_modes`` section (off by default): one launch per mode, ``repeats`` requests each."""

    enabled: bool = False

    #: offload modes to measure, one launch each (--offload MODE for every component)
    modes: list[OffloadMode] = Field(default_factory=lambda: list(OFFLOAD_MODES), min_length=1)
    #: requests per launch: the first is the cold request, at least 2 so there is a warm one
    repeats: int = Field(2, ge=2, le=1000)
    #: one memory budget for every launch (None: no caps)
    caps: Optional[registry.CapParams] = None

    @field_validator("modes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"modes must be unique, got {v}")
        return v


class OffloadModesInvariants(registry.InvariantParams):
    """What every mode that ran must show (modes that could not run are skipped)."""

    #: the engine reports, for every component, the offload mode that was asked for
    offload_placement_matches: Optional[bool] = True
    #: the warm request is not slower than the cold one (beyond 10 %)
    offload_warm_not_slower: Optional[bool] = True
    #: GPU: peak VRAM none > model >= group modes, host memory peak in the reverse order
    offload_vram_order: Optional[bool] = True


def offload_modes(
    spec: EngineSpec,
    modes: list[str] | None = None,
    request: VideoRequestSpec | dict | None = None,
    repeats: int = 2,
    caps: MemoryCaps | None = None,
    run_dir: str | Path = "outputs/offload_modes",
    sample_interval_s: float = 0.1,
    reuse: Any = None,
) -> ResultBundle:
    """The ``offload_modes`` bundle: one launch per mode (default all four), each with
    ``offload=<mode>`` for every component; an engine kind without the switch has every mode
    "not applicable". Results keys: docs/suite.md, "Results". Raises ValueError: repeats < 2,
    an unknown or repeated mode."""
    if repeats < 2:
        raise ValueError(f"offload_modes: repeats must be >= 2, got {repeats}")
    modes = list(modes) if modes else list(OFFLOAD_MODES)
    bad = [m for m in modes if m not in OFFLOAD_MODES]
    if bad or len(set(modes)) != len(modes):
        raise ValueError(f"offload_modes: modes must be unique values of {OFFLOAD_MODES}, got {modes}")
    req = common.as_request(request)
    caps = caps if caps is not None else MemoryCaps()
    launches: list[LaunchData] = []
    entries: list[dict[str, Any]] = []
    for mode in modes:
        label = f"offload-{mode}"
        entries.append(e := {"mode": mode, "label": label, "reused_from": None})
        specs = _mode_specs(spec, mode, caps)
        if not specs:
            e.update({"status": NOT_APPLICABLE, "reason": f"engine kind {spec.kind!r} has no offload modes"})
            continue
        mine = reuse if mode == "none" else None
        data = common.reuse_or_launch(
            mine, specs, [req] * repeats, run_dir, label, caps=caps, sample_interval_s=sample_interval_s
        )
        launches.append(data)
        e.update(reused_from=data.launch_row.get("reused_from"), **_mode_entry(data, mode, repeats))
    results: dict[str, Any] = {
        "modes": entries,
        "device": next((e["device"] for e in entries if e.get("device")), None),
        "warm_tolerance": _WARM_TOLERANCE,
        "order_tolerance": _ORDER_TOLERANCE,
        "reused_launches": [e["label"] for e in entries if e.get("reused_from")],
    }
    params = {
        "spec": spec.to_dict(),
        "modes": modes,
        "request": req.payload(),
        "repeats": repeats,
        "caps": caps.to_dict(),
    }
    return assemble(NAME, launches, params, results, caps=[caps] * len(launches))


def run(ctx: registry.RunContext, p: OffloadModesParams) -> ResultBundle:
    """:func:`offload_modes` with the params section."""
    caps = p.caps.to_caps() if p.caps else None
    return offload_modes(ctx.engine, **common.run_kwargs(ctx, p, NAME, caps=caps))


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: no mode measured, or none ran although some were applicable."""
    rows = (bundle.results or {}).get("modes") or []
    if not rows:
        raise registry.bundle_error(bundle, "no offload mode measured")
    failed = [f"{r.get('mode')}: {r.get('reason')}" for r in rows if r.get("status") == FAILED]
    if failed and not any(r.get("status") == RAN for r in rows):
        raise registry.bundle_error(bundle, "no offload mode ran; " + "; ".join(failed))


def _ms(v: Any) -> str:
    return fmt(v, ".0f", " ms")


def _placement_text(r: Mapping[str, Any]) -> str:
    off = r.get("offload") or {}
    if not off:
        return r.get("placement") or "–"
    return f"{r.get('placement')}: " + ", ".join(f"{k}={v}" for k, v in off.items())


def compile_text(e: Mapping[str, Any]) -> str:
    """torch.compile as the engine reported it: ``on``, ``off (not asked)``, ``off: <reason>``, ``–``."""
    active = e.get("compile_active")
    if active is None:
        return "–"
    if active:
        return "on"
    if e.get("compile_requested") is False:
        return "off (not asked)"
    why = e.get("compile_disabled_reason")
    return f"off: {why}" if why else "off"


def _skip(metric: str, why: str) -> Check:
    return Check(NAME, metric, None, None, None, "skipped", why)


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """Per mode: placement and warm rows (a failed launch fails its placement row, a mode that
    could not run is skipped); across modes (GPU) the memory order."""
    rows: list[Check] = []
    entries = [e for e in (r.get("modes") or []) if isinstance(e, dict)]
    for key, col in (
        ("offload_placement_matches", "placement_matches"),
        ("offload_warm_not_slower", "warm_not_slower"),
    ):
        if not inv.get(key):
            continue
        if not entries:
            rows.append(_skip(key, "not measured"))
            continue
        for e in entries:
            metric = f"{col}[{e.get('mode')}]"
            st = e.get("status")
            if st == NOT_APPLICABLE:
                rows.append(_skip(metric, f"not applicable: {e.get('reason')}"))
            elif st == FAILED:
                why = f"launch failed: {e.get('reason')}"
                failed = col == "placement_matches"
                rows.append(check_flag(NAME, metric, False, True, why) if failed else _skip(metric, why))
            else:
                detail = (
                    f"asked {e.get('mode')}, engine reports {_placement_text(e)}"
                    if col == "placement_matches"
                    else f"cold {_ms(e.get('cold_ms'))}, warm {_ms(e.get('warm_ms'))}, margin "
                    f"{_WARM_TOLERANCE:.0%} (fixed: a launch per mode has too few warm requests to "
                    "estimate its own noise)"
                )
                rows.append(check_flag(NAME, metric, e.get(col), True, detail))
    if inv.get("offload_vram_order"):
        rows += _order_checks(r, entries)
    return rows


def _order_checks(r: Mapping[str, Any], entries: list[dict[str, Any]]) -> list[Check]:
    """VRAM none > model >= group-*, host memory the other way (docs/suite.md)."""
    key = "offload_vram_order"
    ran = {e["mode"]: e for e in entries if e.get("status") == RAN}
    dev = str(r.get("device") or "")
    if not entries:
        return [_skip(key, "not measured")]
    if not dev.startswith("cuda"):
        return [_skip(key, f"needs a GPU (device {dev or 'unknown'})")]
    if len(ran) < 2:
        return [_skip(key, f"fewer than two modes ran ({', '.join(ran) or 'none'})")]
    pairs = [("none", "model", True)] + [("model", g, False) for g in ("group-block", "group-leaf")]
    if "model" not in ran:
        pairs += [("none", g, True) for g in ("group-block", "group-leaf")]
    rows = []
    for hi, lo, strict in pairs:
        if hi not in ran or lo not in ran:
            continue
        for what, col, sign in (("vram", "peak_reserved_mib", 1), ("host", "host_pss_peak_mib", -1)):
            a, b = json_float(ran[hi].get(col)), json_float(ran[lo].get(col))
            metric = f"{what}_order[{hi}>{lo}]" if sign > 0 else f"{what}_order[{hi}<{lo}]"
            if a is None or b is None:
                rows.append(_skip(metric, f"{col} not measured"))
                continue
            big, small = (a, b) if sign > 0 else (b, a)
            ok = big > small if strict else big >= small * (1 - _ORDER_TOLERANCE)
            rel = ">" if strict else f">= (within {_ORDER_TOLERANCE:.0%})"
            why = f"{col}: {hi} {mib(a)}, {lo} {mib(b)}; needs {'the first' if sign > 0 else 'the second'} {rel}"
            rows.append(Check(NAME, metric, None, big - small, 0.0, "pass" if ok else "fail", why))
    return rows or [_skip(key, "no pair of ordered modes ran")]


def key_numbers(r: Mapping[str, Any]) -> list[registry.KeyNumber]:
    """The key numbers of an ``offload_modes`` results dict: per mode warm e2e (ms), peaks (MiB)."""
    out = []
    for e in r.get("modes") or []:
        st = e.get("status")
        if st == RAN:
            text = (
                f"warm {_ms(e.get('warm_ms'))}, peak reserved {mib(e.get('peak_reserved_mib'))}, "
                f"host PSS peak {mib(e.get('host_pss_peak_mib'))}"
            )
        else:
            why = str(e.get("reason") or "")
            m = _REFUSAL_RE.search(why)
            short = f"needs an accelerator; device is {m.group('device')}" if m else why[:80]
            text = f"{st}" + (f" ({short})" if short else "")
        out.append(registry.KeyNumber(f"offload {e.get('mode')}", text))
    return out


_SUMMARY_COLUMNS = (
    "mode status reason ready_s process_start_s load_s warmup_s cold_ms warm_ms peak_reserved_mib "
    "peak_allocated_mib host_pss_peak_mib cgroup_peak_mib host_anon_peak_mib compile placement"
).split()


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """One row per mode with :data:`_SUMMARY_COLUMNS` (s, ms, MiB)."""
    rows = []
    for e in r.get("modes") or []:
        row = {c: e.get(c) for c in _SUMMARY_COLUMNS}
        row["placement"] = _placement_text(e) if e.get("status") == RAN else (e.get("placement") or "–")
        row["compile"] = compile_text(e) if e.get("status") == RAN else "–"
        rows.append(row)
    df = pd.DataFrame(rows, columns=_SUMMARY_COLUMNS)
    for c in _SUMMARY_COLUMNS[3:-2]:  # the numbers: ready_s … host_anon_peak_mib
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df.rename(columns={"host_anon_peak_mib": common.ANON_SUM_LABEL})


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of an ``offload_modes`` results dict: a line per mode (ms, s, MiB), the order."""
    out = []
    for e in r.get("modes") or []:
        st = e.get("status")
        if st == RAN:
            ready = json_float(e.get("ready_s"))
            out.append(
                f"- **{e.get('mode')}**: ran; ready in "
                + ("–" if ready is None else f"{ready:.1f} s")
                + f", cold {_ms(e.get('cold_ms'))}, warm {_ms(e.get('warm_ms'))}; peak reserved "
                f"{mib(e.get('peak_reserved_mib'))}, host PSS peak {mib(e.get('host_pss_peak_mib'))}; "
                f"engine reports {_placement_text(e)}"
                + (f", torch.compile {compile_text(e)}" if compile_text(e) != "–" else "")
                + (f" (launch reused from {e.get('reused_from')})" if e.get("reused_from") else "")
                + "."
            )
        else:
            out.append(f"- **{e.get('mode')}**: {st} ({e.get('reason') or '–'}).")
    out.append("")
    dev = str(r.get("device") or "")
    if dev.startswith("cuda"):
        out.append(
            "Offloading trades device memory for host memory and transfer time: expect peak VRAM "
            "none > model ≥ group, host memory in the reverse order, and warm latency growing "
            "from none to group-leaf."
        )
    else:
        out.append(
            f"Device {dev or 'unknown'}: only `none` can run (offload moves weights between host "
            "and an accelerator), so there is no memory order to judge here."
        )
    return "\n".join(out)


def cases(bundle: ResultBundle, case_id: Any) -> dict[str, ResultBundle]:
    """One case per mode that ran, suffix ``_offload-<mode>``."""
    ran = [e for e in (bundle.results or {}).get("modes") or [] if e.get("status") == RAN]
    by = {f"_offload-{e.get('mode')}": e.get("label") or f"offload-{e.get('mode')}" for e in ran}
    return common.steady_cases(bundle, case_id, by)


def split(p: OffloadModesParams) -> list[tuple[str, OffloadModesParams]]:
    """One part per mode, keyed by the mode."""
    return [(m, p.model_copy(update={"modes": [m]})) for m in p.modes]


def join(parts: list[ResultBundle], p: OffloadModesParams) -> ResultBundle:
    """The bundle :func:`offload_modes` would have written, from the :func:`split` parts'.
    Raises ValueError: the parts do not cover ``p.modes`` in order."""
    params, entries = common.join_params(parts, "modes", list(p.modes), "modes")
    results = {
        **{k: v for k, v in parts[0].results.items() if k not in ("modes", "device", "reused_launches")},
        "modes": entries,
        "device": next((b.results.get("device") for b in parts if b.results.get("device")), None),
        "reused_launches": [e["label"] for e in entries if e.get("reused_from")],
    }
    return join_bundles(NAME, parts, params, results)


def launches(p: OffloadModesParams, engine: EngineSpec, request: VideoRequestSpec) -> list[PlannedLaunch]:
    """One per mode; mode ``none`` may reuse an earlier session."""
    caps = p.caps.to_caps() if p.caps else MemoryCaps()
    out = []
    for mode in p.modes:
        keys = tuple(launch_key(s, request, caps) for s in _mode_specs(engine, mode, caps))
        out.append(PlannedLaunch(keys, p.repeats, reuses=mode == "none") if keys else PlannedLaunch((), 0))
    return out


def _mode_specs(spec: EngineSpec, mode: str, caps: MemoryCaps) -> list[EngineSpec]:
    """The specs a launch of ``mode`` may have run (``none``: also automatic placement without
    a device cap); [] for an engine kind without offload modes."""
    try:
        specs = [spec.replace(offload=mode, offload_components={})]
    except EngineSpecError:
        return []
    if mode == "none" and not caps.device_gib and spec.replace(offload_components={}) == spec:
        specs.append(spec.replace(offload=None))
    return specs


NOTEBOOK = common.headline(NAME, "Modes", keep="modes_table") + (
    md(
        "## Gate (placement reported as asked, warm not slower, memory order on a GPU)\n\n"
        "Modes the device cannot run are `skipped`, never passed."
    ),
    code(common.GATE_CELL),
    md("## Device vs host memory, and warm latency, per mode"),
    code("show(plots.offload_memory_latency(modes_table))"),
    md("## Latency per request, one line per mode"),
    code("show(plots.e2e_per_request(bundle))"),
    md("## Per-component placement the engine reported"),
    code(
        """placement = pd.DataFrame({m["mode"]: m.get("offload") or {} for m in results["modes"]}).T
show_table(placement.rename_axis("mode").reset_index())"""
    ),
    md(
        "## How to read this\n\n"
        "Each mode is one launch of the reference engine with `--offload MODE` for every "
        "component. `none` keeps the weights on the device; `model` moves whole components in "
        "and out (accelerate's `cpu_offload_with_hook`, as diffusers' "
        "`enable_model_cpu_offload`); `group-block` and `group-leaf` onload blocks or leaf "
        "modules just before they run (`diffusers.hooks.apply_group_offloading`, with a CUDA "
        "stream prefetching the next group). Expect peak VRAM none > model ≥ group and host "
        "memory the other way round, paid for in warm latency. On a CPU device only `none` "
        "runs: the engine refuses the others at startup (exit code 2) and they are recorded "
        "as *not applicable* with its reason."
    ),
)

SECTION_INTRO = "One launch per offload mode (none, model, group-block, group-leaf): cold start, cold and warm latency, peak device memory and host memory, and the placement the engine reported per component. Modes the device cannot run are shown as not applicable, with the engine's reason."


INVESTIGATION = registry.register_module(
    globals(),
    order=40,
    title="Offload modes",
    question="What does each offload mode (none, model, group-block, group-leaf) cost in "
    "latency and save in device memory, and what does it move to the host?",
    plan=lambda p: [p.repeats] * len(p.modes),
    params_model=OffloadModesParams,
    invariants_model=OffloadModesInvariants,
)
