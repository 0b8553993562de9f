"""Warmup shapes (seed case 003): one launch per startup warmup setting, fresh compile caches;
per request shape its first request against the warm median (docs/DESIGN.md, "covered shape")."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

import pandas as pd
from pydantic import Field, field_validator

from perfkit.bundle import WARMUP_INDEX, ResultBundle, sub_bundle, table_rows
from perfkit.checks import NOT_REPORTED, NOT_REPORTED_REASON, Check, check_max, number
from perfkit.common.numfmt import fmt
from perfkit.common.slugs import md_text
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import common, registry
from perfkit.investigations.common import as_request, code, join_params, md, reuse_or_launch, run_kwargs
from perfkit.investigations.shape_coverage import coverage_entry, warm_across_warmups, warmed_shapes
from perfkit.measuring.assemble import PlannedLaunch, assemble, join_bundles, launch_key
from perfkit.measuring.profiled import FIRST_OF_NEW_SHAPE, ProfileParams, attach, run_profiled

NAME = "warmup_shapes"


class WarmupShapesParams(registry.InvestigationParams):
    """``warmup_shapes`` section: one launch per warmup setting, each shape sent ``repeats`` times."""

    #: startup warmup frames, one launch each (0: no warmup)
    warmup_frames: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [17, 25], min_length=1)
    #: request frames sent to each launch
    request_frames: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [25], min_length=1)
    #: requests per shape per launch (the first and at least one warm)
    repeats: int = Field(3, ge=2, le=1000)
    #: profile the first uncovered shape's first and warm requests in an extra launch
    profile: Optional[ProfileParams] = None

    @field_validator("warmup_frames")
    @classmethod
    def _each_warmup_once(cls, v: list[int]) -> list[int]:
        if twice := sorted({w for w in v if v.count(w) > 1}):
            raise ValueError(f"each warmup setting is one launch: {twice} given twice")
        return v


class WarmupShapesInvariants(registry.InvariantParams):
    """A covered shape (its latent shape ran in the startup warmup) pays no shape setup."""

    #: first request of a covered shape / its warm median (judged with ``ratio_lower``)
    covered_first_request_max_ratio: Optional[float] = 1.5
    #: compiles during the first request of a covered shape
    covered_compiles_max: Optional[float] = 0


def warmup_shapes(
    spec: EngineSpec,
    warmup_frames: list[int] = (17, 25),
    request_frames: list[int] = (25,),
    repeats: int = 3,
    request: VideoRequestSpec | dict | None = None,
    run_dir: str | Path = "outputs/warmup_shapes",
    sample_interval_s: float = 0.1,
    reuse: Any = None,
    profile: ProfileParams | dict | None = None,
) -> ResultBundle:
    """The ``warmup_shapes`` bundle: one launch per warmup setting (results keys: docs/suite.md,
    "Results"). ``reuse``: earlier bundles whose launch a setting may take. Raises ValueError:
    repeats < 2 or an empty setting list."""
    if repeats < 2:
        raise ValueError(f"warmup_shapes: repeats must be >= 2, got {repeats}")
    if not warmup_frames or not request_frames:
        raise ValueError("warmup_shapes: warmup_frames and request_frames must not be empty")
    base = as_request(request)
    launches = []
    reused: list[str] = []
    coverage: list[dict[str, Any]] = []
    for w in warmup_frames:
        s = spec.replace(warmup_frames=int(w), share_compile_cache=False)
        reqs = [dataclasses.replace(base, num_frames=int(f)) for f in request_frames for _ in range(repeats)]
        one_shape = reuse if len(request_frames) == 1 else None  # a reused launch sent one shape
        data = reuse_or_launch(
            one_shape, [s], reqs, run_dir, f"warmup{w}", sample_interval_s=sample_interval_s
        )
        reused += [f"warmup{w}"] if data.launch_row.get("reused_from") else []
        launches.append(data)
        df = pd.DataFrame(data.requests)
        warmed = warmed_shapes(df, data.logs)
        stages = pd.DataFrame(data.stages)
        for j, f in enumerate(request_frames):
            idx = list(range(j * repeats, (j + 1) * repeats))
            rows = df[df["index"].isin(idx)].sort_values("index") if not df.empty else df
            ok = rows[rows["status"] == "completed"] if not rows.empty else rows
            coverage.append(
                coverage_entry(data, ok, stages, warmed, int(w), int(f), idx[0], base.width, base.height)
            )
    params = {
        "spec": spec.to_dict(),
        "warmup_frames": list(map(int, warmup_frames)),
        "request_frames": list(map(int, request_frames)),
        "repeats": repeats,
        "request": base.payload(),
    }
    results: dict[str, Any] = {
        "coverage": coverage,
        "reused_launches": reused,
        "warm_across_warmups": warm_across_warmups(coverage),
    }
    profile = ProfileParams.model_validate(profile) if isinstance(profile, dict) else profile
    pair = next((c for c in coverage if c.get("covered") is False), None)
    if profile is not None:
        params["profile"] = profile.model_dump()
        results["profiled"] = (
            {k: pair[k] for k in ("warmup_frames", "request_frames")}
            if pair
            else {"note": "every measured shape is covered (or failed): nothing profiled"}
        )
    bundle = assemble(NAME, launches, params, results)
    if profile is None or pair is None:
        return bundle
    w, f = pair["warmup_frames"], pair["request_frames"]
    s = spec.replace(warmup_frames=int(w), share_compile_cache=False)
    req = dataclasses.replace(base, num_frames=int(f))
    label = f"profiled-warmup{w}"
    return attach(
        bundle, *run_profiled(s, req, profile, Path(run_dir), label=label, first_role=FIRST_OF_NEW_SHAPE)
    )


def run(ctx: registry.RunContext, p: WarmupShapesParams) -> ResultBundle:
    """:func:`warmup_shapes` with the params section."""
    return warmup_shapes(ctx.engine, **run_kwargs(ctx, p, NAME))


def split(p: WarmupShapesParams) -> list[tuple[str, WarmupShapesParams]]:
    """One part per warmup setting: ``("warmup17", params with warmup_frames [17])``."""
    out: list[tuple[str, WarmupShapesParams]] = []
    seen: set[str] = set()
    for i, w in enumerate(p.warmup_frames):
        key = f"warmup{w}" if f"warmup{w}" not in seen else f"warmup{w}-{i}"
        seen.add(key)
        out.append((key, p.model_copy(update={"warmup_frames": [int(w)]})))
    return out


def join(parts: list[ResultBundle], p: WarmupShapesParams) -> ResultBundle:
    """The bundle :func:`warmup_shapes` would have written, from the :func:`split` parts'.
    Raises ValueError: the parts do not cover ``p.warmup_frames`` in order."""
    params, coverage = join_params(parts, "warmup_frames", list(map(int, p.warmup_frames)), "coverage")
    results = {
        "coverage": coverage,
        "reused_launches": [x for b in parts for x in b.results.get("reused_launches") or []],
        "warm_across_warmups": warm_across_warmups(coverage),
    }
    # as unsplit: only the first part that profiled keeps its traces
    profiled = next((b for b in parts if "warmup_frames" in (b.results.get("profiled") or {})), None)
    noted = profiled or next((b for b in parts if "profiled" in b.results), None)
    if noted is not None:
        results["profiled"] = noted.results["profiled"]
    joined = join_bundles(NAME, parts, params, results)
    if profiled is not None:
        attach(joined, profiled.table("traces"), dict(profiled.traces))
    else:
        joined.tables.pop("traces", None)
    return joined


def launches(p: WarmupShapesParams, engine: EngineSpec, request: VideoRequestSpec) -> list[PlannedLaunch]:
    """One per warmup setting; with one request shape it may reuse an earlier session."""
    out = []
    for w in p.warmup_frames:
        s = engine.replace(warmup_frames=int(w), share_compile_cache=False)
        if len(p.request_frames) == 1:
            req = dataclasses.replace(request, num_frames=int(p.request_frames[0]))
            out.append(PlannedLaunch((launch_key(s, req),), p.repeats, reuses=True))
        else:
            out.append(PlannedLaunch((), len(p.request_frames) * p.repeats))
    return out


def case_ids(p: WarmupShapesParams, namer: Any) -> list[str]:
    """One per (warmup setting, request shape), uncovered ones too."""
    return [
        namer(warmup_frames=w, num_frames=f, suffix="_shapes")
        for w in p.warmup_frames
        for f in p.request_frames
    ]


def _first_request_error(bundle: ResultBundle) -> str | None:
    req = bundle.requests
    req = req[(req["index"] != WARMUP_INDEX).fillna(False).to_numpy(bool)].sort_values("index", kind="stable")
    errs = [str(e) for e in req["error"] if isinstance(e, str) and e.strip()]
    return errs[0] if errs else None


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: no coverage measured, or an entry failed."""
    cov = (bundle.results or {}).get("coverage") or []
    if not cov:
        raise registry.bundle_error(bundle, "no coverage measured")
    bad = next((c for c in cov if c.get("error")), None)
    if bad:
        what = f"warmup {bad.get('warmup_frames')}f / request {bad.get('request_frames')}f"
        raise registry.bundle_error(bundle, f"{what} failed: {bad['error']}")
    if not any(c.get("first_ms") is not None for c in cov):
        raise registry.bundle_error(
            bundle,
            "no request shape was measured (every entry lacks a first request and a warm one): "
            f"{_first_request_error(bundle) or 'see the engine log'}",
        )


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """Covered shapes: first-request ratio and compiles, against :class:`WarmupShapesInvariants`."""
    rows: list[Check] = []
    coverage = [c for c in (r.get("coverage") or []) if isinstance(c, dict)]
    covered = [c for c in coverage if c.get("covered")]
    for key, metric in (
        ("covered_first_request_max_ratio", "covered_first_request_ratio"),
        ("covered_compiles_max", "covered_compiles"),
    ):
        if key not in inv:
            continue
        limit = float(inv[key])
        if not covered:
            why = "not measured" if not coverage else "no covered shape measured"
            rows.append(Check(NAME, metric, limit, None, limit, "skipped", why))
            continue
        for c in covered:
            label = f"{metric}[warmup={c.get('warmup_frames')}f,request={c.get('request_frames')}f]"
            if metric == "covered_compiles":
                if c.get("compiles") is None and c.get("first_ms") is not None:
                    rows.append(Check(NAME, label, limit, None, limit, "skipped", NOT_REPORTED_REASON))
                else:
                    rows.append(check_max(NAME, label, c.get("compiles"), limit))
                continue
            ratio = number(c.get("ratio"))
            if ratio is None and number(c.get("warm_median_ms")) and number(c.get("first_ms")) is not None:
                ratio = float(c["first_ms"]) / float(c["warm_median_ms"])
            what = (
                f"penalty {fmt(c['penalty_ms'], '.0f', ' ms')}"
                + (f" in {c['penalty_stage']}" if c.get("penalty_stage") else "")
                if number(c.get("penalty_ms")) is not None
                else ""
            )
            noise = "lower bound: first request / the slowest warm request of its shape"
            rows.append(check_max(NAME, label, ratio, limit, what, c.get("ratio_lower"), noise))
    return rows


def _compiles(n: Any) -> str:
    x = number(n)
    return f"compiles {NOT_REPORTED}" if x is None else f"{x:.0f} compile{'' if x == 1 else 's'}"


def key_numbers(r: Mapping[str, Any]) -> list[registry.KeyNumber]:
    """One line per (warmup setting, request shape): covered or not, penalty, compiles."""
    return [
        registry.KeyNumber(
            f"warmup {c.get('warmup_frames')}f → request {c.get('request_frames')}f",
            f"{'covered' if c.get('covered') else 'not covered'}, penalty "
            f"{fmt(number(c.get('penalty_ms')), '.0f', ' ms')}, {_compiles(c.get('compiles'))}",
        )
        for c in r.get("coverage") or []
    ]


_SUMMARY_COLUMNS = (
    "warmup_frames request_frames warmup_latent_frames request_latent_frames covered warmup_source first_ms "
    "warm_median_ms penalty_ms ratio compiles penalty_stage error"
).split()


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """The summary table of a ``warmup_shapes`` results dict: a row per (warmup setting, request shape)."""
    return common.pick_columns(pd.DataFrame(r.get("coverage") or []), _SUMMARY_COLUMNS)


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of a ``warmup_shapes`` results dict: a line per shape pair, the cost."""
    rows = r.get("coverage") or []
    if not rows:
        return "No coverage results."

    out = []
    for c in rows:
        cov = {True: "covered", None: "coverage not known"}.get(c.get("covered"), "**not covered**")
        if "warmup_source" in c:  # bundles before it came without one
            src = c["warmup_source"]
            cov += f" (warmup shape from its {src})" if src else " (no warmup shape known)"
        out.append(
            f"- warmup {c.get('warmup_frames')} frames → request "
            f"{c.get('request_frames')} frames: {cov}; first request "
            f"{fmt(c.get('first_ms'), '.0f', ' ms')} vs warm median "
            f"{fmt(c.get('warm_median_ms'), '.0f', ' ms')} (penalty "
            f"{fmt(c.get('penalty_ms'), '.0f', ' ms')}, x{fmt(c.get('ratio'), '.2f')}, "
            f"{_compiles(c.get('compiles'))}"
            + (f", mostly in {md_text(c['penalty_stage'], code=True)}" if c.get("penalty_stage") else "")
            + ")."
        )
    for c in rows:
        for rk in c.get("ranks") or []:
            out.append(
                f"  - rank {rk.get('rank')} ({rk.get('device')}): first request "
                f"{_compiles(rk.get('first_compiles'))}"
                + (
                    f", penalty mostly in {md_text(rk['penalty_stage'], code=True)} "
                    f"({fmt((rk.get('penalty_by_stage_ms') or {}).get(rk['penalty_stage']), '.0f', ' ms')})"
                    if rk.get("penalty_stage")
                    else ""
                )
                + f"; warm step {fmt(rk.get('warm_step_median_ms'), '.1f', ' ms')} = its branch "
                f"{fmt(rk.get('warm_compute_median_ms'), '.1f', ' ms')} + all_gather wait "
                f"{fmt(rk.get('warm_gather_median_ms'), '.1f', ' ms')}"
                + (
                    f"; peak VRAM reserved {fmt(rk.get('peak_reserved_mib'), ',.0f', ' MiB')}."
                    if number(rk.get("peak_reserved_mib")) is not None
                    else "."
                )
            )
    for x in r.get("warm_across_warmups") or []:
        ci = x.get("ratio_ci") or [None, None]
        out.append(
            f"- Steady state, request {x.get('request_frames')} frames: warm median after a "
            f"{x.get('warmup_frames')}-frame warmup {fmt(x.get('warm_median_ms'), '.0f', ' ms')} vs "
            f"{fmt(x.get('vs_warm_median_ms'), '.0f', ' ms')} after a {x.get('vs_warmup_frames')}-frame "
            f"one: x{fmt(x.get('ratio'), '.2f')} (95% CI {fmt(ci[0], '.2f')}..{fmt(ci[1], '.2f')})."
        )
    uncovered = [c for c in rows if not c.get("covered")]
    tail = (
        "A shape the warmup does not cover pays its shape setup (recompilation, graph "
        "capture) on the first user request."
        if uncovered
        else "Every requested shape is covered by the startup warmup."
    )
    return "\n".join(out) + "\n\n" + tail


def cases(bundle: ResultBundle, case_id: Any) -> dict[str, ResultBundle]:
    """One case per (launch, covered request frames), suffix ``_shapes``."""
    out: dict[str, ResultBundle] = {}
    req = bundle.requests
    covered = {
        (c.get("warmup_frames"), c.get("request_frames")): c.get("covered")
        for c in (bundle.results or {}).get("coverage") or []
    }
    rows = table_rows(bundle.launches) if not bundle.launches.empty else [{"launch": None}]
    for row in rows:
        la = row.get("launch")
        w = number(row.get("warmup_frames"))
        w = int(w) if w is not None else None
        sel = req if la is None else req[(req["launch"] == la).fillna(False).to_numpy(bool)]
        sel = sel[(sel["index"] != WARMUP_INDEX).fillna(False).to_numpy(bool)]
        frames = sorted({int(f) for f in sel["num_frames"].dropna()})
        for f in frames:
            if covered.get((w, f)) is False:
                continue
            sb = sub_bundle(bundle, launch=la, num_frames=f)
            if not sb.measured_requests().empty:
                out[case_id(warmup_frames=w, num_frames=f, suffix="_shapes")] = sb
    return out


NOTEBOOK = common.headline(NAME, "Coverage", keep="coverage") + (
    md(
        "## Why an uncovered shape pays: recompilation\n\n"
        "Each request that ran a shape first in its launch: its penalty over the warm median "
        "of the same shape in that launch, the stage holding most of it, and the "
        "recompilations it paid (count, compile time, the compiler's reason)."
    ),
    code(common.ROOT_CAUSE),
    md(
        "## Below the stage: the first request of a new shape against a warm one\n\n"
        "With `profile` set, an extra launch with the warmup that did not cover a shape sends "
        "that shape's first request and warm ones with sglang's profiling fields; their "
        "torch.profiler traces are in the bundle under `traces/` (open them in Perfetto, "
        "ui.perfetto.dev, or chrome://tracing). They are extra requests: no statistic, "
        "invariant or gate here reads them. The diff names the ops the first request of the "
        "new shape spends its penalty in."
    ),
    code(common.BELOW_STAGE),
    md("## Every request: role and shape"),
    code(common.REQUESTS),
    md("## Gate (covered shapes pay no setup)"),
    code(common.GATE_CELL),
    md("## First-request penalty by warmup shape and request shape"),
    code("show(plots.coverage_heatmap(coverage))"),
    md("## Which stage absorbs the penalty (first request − warm median, ms)"),
    code("""by_stage = pd.DataFrame({f"warmup {c['warmup_frames']}f → request {c['request_frames']}f":
                         c.get("penalty_by_stage_ms") or {} for c in results["coverage"]}).T
show_table(by_stage.rename(columns=lambda st: f"{st} (ms)").rename_axis("case").reset_index())
if any(stage_class(s) == REFINEMENT for s in by_stage.columns):  # only for a two-stage run
    display(Markdown("With the two-stage pipeline the half-resolution denoising stage and the "
                     "full-resolution refinement stage each specialise on their own latent shape."))"""),
    md("## End-to-end latency per request, one line per launch"),
    code("show(plots.e2e_per_request(bundle))"),
    md("## Per-stage latency"),
    code("show(plots.stage_breakdown(bundle))"),
    md(
        "## How to read this\n\n"
        "LTX aligns frames to 8k+1 and compresses time by 8: latent frames = (frames − 1) // 8 "
        "+ 1, so a 17-frame warmup runs 3 latent frames and a 25-frame request needs 4. A "
        "request shape is **covered** when the startup warmup already ran its latent shape; "
        "an uncovered shape pays recompilation / graph capture on its first request (the "
        "penalty above, with its compile count). The fix is a warmup at the served shapes."
    ),
)

SECTION_INTRO = "A covered shape is one the startup warmup already ran (same latent shape): its first request should cost what a warm one does, with no compiles. An uncovered shape pays shape setup (recompilation, graph capture) on its first call."


INVESTIGATION = registry.register_module(
    globals(),
    order=20,
    plan=lambda p: [len(p.request_frames) * p.repeats] * len(p.warmup_frames),
    title="Warmup shapes",
    question="Does the startup warmup cover the shapes users send?",
    params_model=WarmupShapesParams,
    invariants_model=WarmupShapesInvariants,
    measure_options=(
        common.MeasureOption(
            "--two-stage-shapes",
            "also run the warmup-shapes investigation with the two-stage pipeline",
            jobs=lambda on, sec, spec: [
                ("", sec, spec),
                ("_two_stage", sec, spec.replace(two_stage=True)),
            ],
            is_flag=True,
        ),
    ),
    notebook_intro="Does the server's startup warmup cover the shapes users send?",
)
