"""The cost of perfkit's own instrumentation (stage timing, the memory sampler): interleaved ABBA
pairs of warm requests in one engine session (docs/suite.md)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, ValidationError

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.checks import Check, check_max, number
from perfkit.common.numfmt import fmt, json_float
from perfkit.common.slugs import md_text
from perfkit.engine.client import VideoClient, VideoRequestSpec
from perfkit.investigations import common, registry
from perfkit.investigations.common import DocBlock, MeasureOption, code, md
from perfkit.measuring.assemble import assemble
from perfkit.measuring.launch_rows import measure_launch

log = logging.getLogger(__name__)

NAME = "overhead"
PARTS = ("stage_timing", "sampler")


class OverheadParams(registry.InvestigationParams):
    """``overhead`` section: interleaved on/off pairs in one session of its own."""

    enabled: bool = False
    #: ABBA pairs per comparison (each pair is two warm requests)
    pairs: int = Field(10, ge=2, le=10_000)
    #: the memory sampler's polling interval under test (s)
    sampler_interval_s: float = Field(0.1, gt=0)


class OverheadInvariants(registry.InvariantParams):
    """The upper end of the 95 % interval of each overhead (fraction of server e2e)."""

    #: e.g. 0.005 on a GPU host (0.5 % of e2e)
    instrumentation_overhead_max: Optional[float] = None


def _summary(
    on: list[float], off: list[float], pairs: list[tuple[float, float]] | None = None
) -> dict[str, Any]:
    """One part's medians (ms), overhead (fraction) and 95 % interval (docs/suite.md)."""
    if not on or not off:
        return {"n_on": len(on), "n_off": len(off), "overhead": None}
    mw = stats.mann_whitney(on, off)
    out: dict[str, Any] = {
        "n_on": len(on),
        "n_off": len(off),
        "median_on_ms": float(np.median(on)),
        "median_off_ms": float(np.median(off)),
        "mann_whitney_p": json_float(mw.get("pvalue")),
        "on_ms": on,
        "off_ms": off,
    }
    if pairs is not None and len(pairs) >= 2:
        logs = np.log(np.asarray([a for a, _ in pairs]) / np.asarray([b for _, b in pairs]))
        lo, hi = stats.bootstrap_median_ci(logs)
        out.update(
            {
                "estimator": "paired: median of on/off ratios of ABBA pairs",
                "n_pairs": len(pairs),
                "pairs_ms": [list(p) for p in pairs],
                "overhead": float(np.expm1(np.median(logs))),
                "overhead_ci": [json_float(float(np.expm1(lo))), json_float(float(np.expm1(hi)))],
            }
        )
        return out
    ratio_ci = stats.bootstrap_ratio_ci(on, off)
    out.update(
        {
            "estimator": "unpaired: ratio of medians",
            "overhead": float(np.median(on) / np.median(off) - 1),
            "overhead_ci": [json_float(ratio_ci[0] - 1), json_float(ratio_ci[1] - 1)],
        }
    )
    return out


#: an ABBA time: a finite positive number of ms (a string, bool, null, 0 or inf is refused)
_Ms = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


class _PooledPart(BaseModel):
    """One part of one launch's results, as :func:`pooled` needs it."""

    pairs_ms: list[tuple[_Ms, _Ms]] = Field(min_length=2)
    on_ms: list[_Ms]
    off_ms: list[_Ms]


def pooled(results: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> dict[str, Any]:
    """The ABBA pairs of two or more launches' results pooled into one paired estimate per part
    (docs/suite.md): ``{"launches": n, "stage_timing": {...}, "sampler": {...}}`` as one launch's.
    Raises InvestigationError naming the launch and field: fewer than two launches, a part
    without valid pairs (finite ms > 0, on/off one per pair), the same pairs twice."""
    names = list(names) if names is not None else [f"launch {i}" for i in range(1, len(results) + 1)]
    if len(results) < 2:
        raise registry.InvestigationError(
            f"{NAME}: pooling needs two or more launches, got {len(results)} (one launch is its own "
            "results: kind=full)"
        )
    for name, r in zip(names, results):
        if not isinstance(r, Mapping):
            raise registry.InvestigationError(
                f"{NAME}: {name}: results are a {type(r).__name__}, not a mapping"
            )
    out: dict[str, Any] = {"launches": len(results)}
    for part in PARTS:
        pairs: list[tuple[float, float]] = []
        on: list[float] = []
        off: list[float] = []
        seen: dict[tuple, str] = {}
        for name, r in zip(names, results):
            raw = r.get(part)
            if not isinstance(raw, Mapping) or not raw.get("pairs_ms"):
                raise registry.InvestigationError(
                    f"{NAME}: {name} has no {part}.pairs_ms (missing, null or empty; a launch recorded "
                    "before pairs were kept cannot be pooled)"
                )
            try:
                s = _PooledPart.model_validate(raw)
            except ValidationError as exc:
                bad = "; ".join(
                    f"{part}.{'.'.join(str(x) for x in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
                    for e in exc.errors()[:3]
                )
                raise registry.InvestigationError(f"{NAME}: {name}: {bad}") from None
            if not len(s.on_ms) == len(s.off_ms) == len(s.pairs_ms):
                raise registry.InvestigationError(
                    f"{NAME}: {name}: {part} has {len(s.pairs_ms)} pairs but {len(s.on_ms)} on_ms and "
                    f"{len(s.off_ms)} off_ms (one of each per pair)"
                )
            key = tuple(s.pairs_ms)
            if key in seen:
                raise registry.InvestigationError(
                    f"{NAME}: {name} repeats the {part} pairs of {seen[key]} (the same launch twice)"
                )
            seen[key] = name
            pairs += s.pairs_ms
            on += s.on_ms
            off += s.off_ms
        part_out = _summary(on, off, pairs)
        part_out["estimator"] = f"{part_out['estimator']}, pooled over {len(results)} launches"
        out[part] = part_out
    return out


def _agreement(client: VideoClient, request: VideoRequestSpec, ids: list[str], n: int) -> dict[str, Any]:
    """``n`` pairs timed with events and with syncs: per stage medians (ms) and ratio."""
    by: dict[str, dict[str, list[float]]] = {}
    sums: list[float] = []
    for i in range(n):
        for mode in ("events", "sync") if i % 2 == 0 else ("sync", "events"):
            out = client.generate(
                dataclasses.replace(request, extra={**request.extra, "perfkit_stage_timing": mode})
            )
            ids.append(out.request_id)
            if not out.ok or out.record is None:
                continue
            stages = out.record.stage_ms()
            for name, ms in stages.items():
                by.setdefault(name, {"events": [], "sync": []})[mode].append(ms)
            if mode == "events" and out.record.total_duration_ms:
                sums.append(sum(stages.values()) / out.record.total_duration_ms)
    per_stage = {}
    for name, d in by.items():
        if d["events"] and d["sync"]:
            ev, sy = float(np.median(d["events"])), float(np.median(d["sync"]))
            per_stage[name] = {"events_ms": ev, "sync_ms": sy, "ratio": json_float(ev / sy) if sy else None}
    return {
        "pairs": n,
        "stages": per_stage,
        "events_stage_sum_over_e2e": json_float(float(np.median(sums))) if sums else None,
    }


def _overhead_probe(
    request: VideoRequestSpec, pairs: int = 10, sampler_interval_s: float = 0.1
) -> Callable[[Any, VideoClient, Any], dict[str, Any]]:
    """measure_launch's ``after`` hook: ABBA pairs per part, timing agreement (:func:`_summary`'s keys, ms)."""

    def run(handle, client: VideoClient, sampler) -> dict[str, Any]:
        ids: list[str] = []

        def e2e(spec: VideoRequestSpec) -> float | None:
            out = client.generate(spec)
            ids.append(out.request_id)
            if not out.ok or out.record is None or out.record.total_duration_ms is None:
                log.warning("overhead probe request failed: %s", out.error)
                return None
            return out.record.total_duration_ms

        timed = request
        untimed = dataclasses.replace(request, extra={**request.extra, "perfkit_stage_timing": False})
        e2e(timed)  # one warm-up request

        def abba(one: Callable[[bool], float | None]) -> dict[str, Any]:
            on, off, both = [], [], []
            for i in range(pairs):
                got = {flag: one(flag) for flag in ((True, False) if i % 2 == 0 else (False, True))}
                on += [got[True]] if got[True] is not None else []
                off += [got[False]] if got[False] is not None else []
                if got[True] is not None and got[False] is not None:
                    both.append((got[True], got[False]))
            return _summary(on, off, both)

        def sampled(flag: bool) -> float | None:
            probe = handle.sampler(interval_s=sampler_interval_s) if flag else None
            if probe is not None:
                probe.start()
            v = e2e(timed)
            if probe is not None:
                probe.stop()
            return v

        stage_timing = abba(lambda flag: e2e(timed if flag else untimed))
        sampler.stop()
        sampler_part = abba(sampled)
        agreement = _agreement(client, request, ids, 3)
        return {
            "stage_timing": stage_timing,
            "timing_agreement": agreement,
            "sampler": sampler_part,
            "sampler_interval_s": sampler_interval_s,
            "request_ids": ids,
        }

    return run


def run(ctx: registry.RunContext, p: OverheadParams) -> ResultBundle:
    """One launch: a warm-up request, then ``p.pairs`` ABBA pairs per part."""
    probe = _overhead_probe(ctx.request, pairs=p.pairs, sampler_interval_s=p.sampler_interval_s)
    data = measure_launch(ctx.engine, [ctx.request], ctx.work_dir / NAME, "probe", after=probe)
    own = p.model_dump(exclude={"enabled", "tier"})  # pairs, sampler_interval_s
    results: dict[str, Any] = {"error": data.error, **own}
    results.update({k: v for k, v in (data.extra or {}).items() if k in (*PARTS, "timing_agreement")})
    params = {"spec": ctx.engine.to_dict(), "request": ctx.request.payload(), **own}
    return assemble(NAME, [data], params, results)


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: the probe did not run or measured nothing."""
    r = bundle.results or {}
    if r.get("error") or not any(number((r.get(k) or {}).get("overhead")) is not None for k in PARTS):
        raise registry.bundle_error(
            bundle, f"no overhead measured: {r.get('error') or 'every probe request failed'}"
        )


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """The gate's checks of an ``overhead`` results dict: each part's interval against its maximum."""
    rows: list[Check] = []
    if "instrumentation_overhead_max" not in inv:
        return rows
    limit = float(inv["instrumentation_overhead_max"])
    for part in PARTS:
        s = r.get(part) or {}
        ci = s.get("overhead_ci") or [None, None]
        what = f"median {s['overhead']:+.2%}" if number(s.get("overhead")) is not None else ""
        rows.append(check_max(NAME, f"{part}_overhead_ci_high", ci[1], limit, what))
    return rows


def key_numbers(r: Mapping[str, Any]) -> list[registry.KeyNumber]:
    """The key numbers of an ``overhead`` results dict: each part's overhead, 95 % interval (% of e2e)."""
    out = []
    for part in PARTS:
        s = r.get(part) or {}
        ov, ci = number(s.get("overhead")), s.get("overhead_ci") or [None, None]
        lo, hi = number(ci[0]), number(ci[1])
        ci_text = f" (95% CI {lo:+.2%} … {hi:+.2%})" if lo is not None and hi is not None else ""
        text = None if ov is None else f"{ov:+.2%}{ci_text}"
        out.append(registry.KeyNumber(f"{part.replace('_', ' ')} overhead", text))
    return out


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """The summary table of an ``overhead`` results dict: a row per part (medians in ms, interval)."""
    rows = []
    for part in PARTS:
        s = r.get(part) or {}
        ci = s.get("overhead_ci") or [None, None]
        keys = ("n_on", "n_off", "median_on_ms", "median_off_ms", "overhead")
        rows.append({"part": part, **{k: s.get(k) for k in keys}, "ci_low": ci[0], "ci_high": ci[1]})
    return pd.DataFrame(rows)


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of an ``overhead`` results dict: each overhead and whether its interval tells."""
    lines = [f"- **{md_text(k.label)}**: {md_text(k.text)}" for k in key_numbers(r)]
    how = set()
    for s in (r.get(part) or {} for part in PARTS):
        if s.get("estimator"):
            how.add(f"{s['estimator']}" + (f" ({s['n_pairs']} pairs)" if s.get("n_pairs") else ""))
    lines.append("")
    if how:
        lines.append(f"Estimator: {'; '.join(sorted(how))}; 95 % percentile bootstrap, seed 0.")
        lines.append("")
    lines.append(
        "An interval that straddles 0 and is wider than the target says the probe needs "
        "more pairs, not that the overhead is small."
    )
    agree = r.get("timing_agreement") or {}
    stages = agree.get("stages") or {}
    if stages:
        lines.append("")
        lines.append(
            "Event-timed stages vs the same stages timed with a sync at every boundary "
            f"({agree.get('pairs')} pairs, medians): "
            + ", ".join(
                f"{md_text(name, code=True)} {fmt(d.get('events_ms'), '.1f')} vs {fmt(d.get('sync_ms'), '.1f')} ms"
                for name, d in stages.items()
            )
            + f"; event-timed stages add up to {fmt(agree.get('events_stage_sum_over_e2e'), '.1%')} of e2e."
        )
    return "\n".join(lines)


def found_in(results: Mapping[str, Any]) -> bool:
    """Whether another investigation's results hold this probe (``results["instrumentation"]``)."""
    inst = results.get("instrumentation")
    return isinstance(inst, Mapping) and any(
        isinstance(v, Mapping) and "overhead_ci" in v for v in inst.values()
    )


NOTEBOOK = common.headline(NAME, "Overhead of each instrument") + (
    md("## Gate (upper end of each interval)"),
    code(common.GATE_CELL),
    md(
        "## How to read this\n\n"
        "Each instrument is switched on and off in interleaved ABBA pairs of warm requests of one "
        "session, judged on the server's end-to-end time. The overhead is median(on) / "
        "median(off) − 1 with a 95 % bootstrap interval; the gate holds the interval's upper "
        "end to `instrumentation_overhead_max`, so a noisy probe cannot pass on a lucky median."
    ),
)

SECTION_INTRO = "Warm requests of one shape with each piece of perfkit's instrumentation (stage timing, memory sampler) on and off, interleaved, judged on the server's end-to-end time."


INVESTIGATION = registry.register_module(
    globals(),
    order=90,
    plan=lambda p: [1],
    title="Instrumentation overhead",
    question="What does perfkit's own instrumentation (stage timing, memory sampler) cost?",
    params_model=OverheadParams,
    invariants_model=OverheadInvariants,
    doc_blocks={"overhead-pooled": DocBlock(combine=pooled, verb="launches pooled")},
    measure_options=(
        MeasureOption(
            "--overhead-pairs",
            "> 0 runs the instrumentation-overhead investigation with this many ABBA pairs",
            jobs=lambda pairs, sec, spec: [
                ("", sec.model_copy(update={"enabled": True, "pairs": pairs}), spec)
            ],
        ),
    ),
    notebook_intro="What does perfkit's own instrumentation (stage timing, the memory sampler) cost?",
)
