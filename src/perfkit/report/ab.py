"""The A/B report (``perfkit ab``) and the ``perfkit figures`` Markdown of an A/B power pool (docs/ab.md)."""

from __future__ import annotations

import base64
import logging
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from perfkit.ab import power
from perfkit.ab.decide import AbResult, needed_text, slow_spells
from perfkit.checks import number
from perfkit.common.numfmt import change_text, confidence_text, number_text, percent_text
from perfkit.common.slugs import md_text
from perfkit.gate.verdicts import STATUS_WORD
from perfkit.report.belowstage import ab_panel
from perfkit.report.plots import ab_forest, figure_to_png_bytes
from perfkit.report.render import template_env, write_tool_outputs
from perfkit.report.tables import format_table, markdown_table

log = logging.getLogger(__name__)

_SIZED = "with the launches a side that would decide it, if its B/A and noise stay as observed"


def _bound(x: Any) -> str:
    """An interval bound as a % change, past ×10 either way "> +900 %" / "< -90 %"."""
    v = number(x)
    if v is not None and v > 10:
        return "> +900 %"
    if v is not None and 0 < v < 0.1:
        return "< -90 %"
    return change_text(x)


def _num(x: Any) -> str:
    v = number(x)
    return "–" if v is None else number_text(v)


def _verdict_frame(res: AbResult) -> pd.DataFrame:
    t = res.table
    return pd.DataFrame(
        {
            "metric": t["metric"],
            "unit": t["unit"],
            "A": [_num(v) for v in t["a"]],
            "B": [_num(v) for v in t["b"]],
            "B/A": [change_text(v) for v in t["ratio"]],
            "interval": [f"[{_bound(lo)}, {_bound(hi)}]" for lo, hi in zip(t["low"], t["high"])],
            "threshold": [f"±{float(v) * 100:.1f} %" for v in t["threshold"]],
            "status": [d if g else f"{d} (not gated)" for d, g in zip(t["decision"], res.gated)],
            "launches A/B": [f"{a}/{b}" for a, b in zip(t["n_a"], t["n_b"])],
        }
    )


def _decision_counts(res: AbResult) -> pd.DataFrame:
    from perfkit.stats import DECISIONS

    t = res.table
    gated = res.gated
    rows = []
    for label, mask in (("", gated), (" (not gated)", ~gated)):
        for d in DECISIONS:
            if names := list(t.loc[(t["decision"] == d) & mask, "metric"]):
                rows.append({"status": d + label, "metrics": len(names), "which": ", ".join(names)})
    return pd.DataFrame(rows, columns=["status", "metrics", "which"])


def _noise(t: pd.DataFrame, icc: Callable[[Any], str] = _num) -> dict[str, Any]:
    return {
        "metric": t["metric"],
        "CV between launches": [percent_text(v) for v in t["cv_between"]],
        "CV within a launch": [percent_text(v) for v in t["cv_within"]],
        "ICC": [icc(v) for v in t["icc"]],
    }


def _launch_frame(res: AbResult) -> pd.DataFrame:
    lm = res.launch_means
    ab = res.meta.get("ab") or {}
    loads = ab.get("launch_load") or {}
    if lm.empty:
        return pd.DataFrame()
    wide = lm.pivot_table(index=["side", "launch"], columns="metric", values="value", aggfunc="first")
    rows = []
    for (side, launch), r in wide.iterrows():
        ld = loads.get(str(launch)) or {}
        rows.append(
            {
                "launch": launch,
                "side": side,
                "position": ld.get("position", ""),
                "ready (s)": _num(r.get("ready")),
                "first result (s)": _num(r.get("first_result")),
                "cold e2e (ms)": _num(r.get("cold_e2e")),
                "warm e2e (ms)": _num(r.get("warm_e2e")),
                "load avg": " / ".join(str(x) for x in (ld.get("loadavg") or [])),
            }
        )
    df = pd.DataFrame(rows)
    return df.sort_values("position", key=lambda s: pd.to_numeric(s, errors="coerce")) if not df.empty else df


def _badge(res: AbResult) -> str:
    return {"no regression": STATUS_WORD[0]}.get(res.verdict, res.verdict)


def ab_context(res: AbResult, page_dir: str | Path = ".") -> dict[str, Any]:
    """What ``sections/ab.html.j2`` gets (trace links relative to ``page_dir``)."""
    sides = res.meta.get("sides") or {}
    ab = res.meta.get("ab") or {}
    fig = ab_forest(res.table, res.launch_means)
    t = res.table[res.table["decision"] != "not measured"]
    needed = ["" if pd.isna(v) else str(v) for v in t["launches_needed"]]
    return {
        "verdict": _badge(res),
        "confidence": confidence_text(res.confidence),
        "ab": ab,
        "meta": res.meta,
        "launches_per_side": _launches_text(res),
        "spells": _spells_line(res),
        "sequential": _sequential_text(res),
        "looks": format_table(_looks_frame(res), None),
        "verdicts": format_table(_verdict_frame(res)),
        "variance": format_table(pd.DataFrame({**_noise(t), "launches needed": needed}), None),
        "launches": format_table(_launch_frame(res), None),
        "forest_png": base64.b64encode(figure_to_png_bytes(fig)).decode("ascii"),
        "below_stage": ab_panel(
            (sides.get("A") or {}).get("path"), (sides.get("B") or {}).get("path"), page_dir
        ),
    }


def _launches_text(res: AbResult) -> str:
    """ "N launches a side" or "A: n, B: m launches": held, else run, else planned."""
    ab = res.meta.get("ab") or {}
    sides = res.meta.get("sides") or {}
    held = {s: len(v["launches"]) for s, v in sides.items() if (v or {}).get("launches")}
    n = held if len(held) == 2 else ab.get("launches_done") or ab.get("launches_per_side", "?")
    if isinstance(n, dict):
        if set(n) == {"A", "B"} and n["A"] == n["B"]:
            return f"{n['A']} launches a side"
        pool = " (arms of one pool)" if set(n) - {"A", "B"} else ""
        return ", ".join(f"{k}: {v}" for k, v in n.items()) + f" launches{pool}"
    return f"{n} launches a side"


def _spells_line(res: AbResult) -> str:
    sp = pd.DataFrame(res.meta.get("slow_spells") or [])
    if sp.empty or not (pd.to_numeric(sp["slow_requests"], errors="coerce") > 0).any():
        return ""
    return (
        "slow spells (DenoisingStage more than 5 % above the side's quiet level, its 10th "
        f"percentile): {_spells_text(sp)}: the host slowed these requests down, which widens the intervals"
    )


def _looks_frame(res: AbResult) -> pd.DataFrame:
    seq = res.meta.get("sequential") or {}
    cols: dict[str, dict[str, str]] = {}
    for i, lk in enumerate(seq.get("looks") or [], 1):
        head = f"look {i}: {lk.get('n')} a side, {confidence_text(float(lk.get('confidence') or math.nan))}"
        cols[head] = {
            m: f"[{_bound(v.get('low'))}, {_bound(v.get('high'))}] {v.get('decision')}"
            for m, v in (lk.get("metrics") or {}).items()
        }
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols).fillna("–")
    return df.rename_axis("metric").reset_index()


def design_text(d: Mapping[str, Any], probe: bool = False) -> str:
    """A sequential design in words: an A/B's, or each ``probe``'s of bisect and confirm."""
    lo, hi, spending = d.get("min_launches"), d.get("max_launches"), d.get("spending")
    conf = float(d.get("confidence", 0.95))
    if probe:
        return (
            f"{lo}–{hi} launches a side a probe{', paired' if d.get('paired') else ''} ({spending} alpha "
            f"spending, {conf * 100:.0f} % over the looks)"
        )
    return (
        f"first look at {lo} launches a side, at most {hi} run a side, {spending} alpha spending of "
        f"{(1 - conf) * 100:.0f} % over the looks"
    )


def _sequential_text(res: AbResult) -> str:
    seq = res.meta.get("sequential") or {}
    if not seq:
        return ""
    run = seq.get("launches_run") or {}
    text = (
        f"sequential: {design_text(seq.get('design') or {})}; ran "
        f"{', '.join(f'{v} of {k}' for k, v in run.items())}; stopped: {seq.get('reason')}"
    )
    if replaced := {k: v for k, v in (seq.get("replaced") or {}).items() if v}:
        text += "; replaced as run in a slow spell: " + ", ".join(x for v in replaced.values() for x in v)
    if seq.get("spell_kept"):
        text += (
            f"; side {', '.join(seq['spell_kept'])}: half or more of its launches in a slow spell, kept "
            "(the host's state, not a spell)"
        )
    t = res.table
    left = [
        m for m in t.loc[(t["decision"] == "inconclusive") & res.gated, "metric"] if m not in res.undecided
    ]
    if left:  # gated, inconclusive when another gated metric's regression ended the A/B
        text += f"; still inconclusive ({_SIZED}): " + needed_text(res, left)
    if res.undecided:
        text += f"; undecided ({_SIZED}): " + needed_text(res, res.undecided)
        if seq.get("undecided_rule") == "pass":
            text += "; exit 0 only because of --undecided pass"
    return text


def error_reasons(res: AbResult, fmt: Callable[..., str] = lambda x, code=False: str(x).strip()) -> list[str]:
    """Why the A/B is an error (exit 2), a line each; ``fmt`` writes text perfkit did not write."""
    out = [
        f"launch failed: {fmt((str(e).splitlines() or [''])[0], code=True)} (details in report.html)"
        for e in res.meta.get("launch_errors") or []
    ]
    gate = res.meta.get("gate_metrics")
    if res.exit_code == 2 and not (res.table["decision"] != "not measured").any():
        out.append("nothing compared: no metric was measured on both sides")
    elif res.exit_code == 2 and gate and set(res.gated_unmeasured) >= set(gate):
        out.append(
            f"nothing gated was compared: none of the gated metrics ({fmt(', '.join(gate))}) was measured on both sides"
        )
    return out


def ab_summary_markdown(res: AbResult) -> str:
    """``summary.md`` of an A/B: the verdict, how it ran, the verdict table."""
    ab = res.meta.get("ab") or {}
    word = {"regression": "REGRESSION", "error": "ERROR"}.get(res.verdict, res.verdict)
    conf = confidence_text(res.confidence)
    overall = ((res.meta.get("sequential") or {}).get("design") or {}).get("confidence")
    if overall is not None:  # sequential: "95 % over all looks (the last look's 97.92 %)"
        conf = f"{confidence_text(float(overall))} over all looks (the last look's {conf})"
    intervals = (
        "paired t intervals on launch pairs (each A launch beside a B launch, requests in turn)"
        if ab.get("paired")
        else "Welch t intervals on launch medians"
    )
    lines = [f"## perfkit ab: {word} (exit code {res.exit_code})", ""]
    how = (
        f"{_launches_text(res)}, {ab.get('warm_per_launch', '?')} warm "
        f"request{'' if ab.get('warm_per_launch') == 1 else 's'} a launch, {conf} {intervals}, default threshold "
        f"±{float(res.meta.get('threshold', 0.05)) * 100:.1f} %"
    )
    if res.meta.get("thresholds_from"):
        how += f" (per-metric thresholds from {md_text(res.meta['thresholds_from'], code=True)})"
    if res.meta.get("gate_metrics"):
        how += f"; the exit code gates on {md_text(', '.join(res.meta['gate_metrics']))} only"
    if ab.get("loadavg_end"):
        how += f"; host load {' / '.join(str(x) for x in ab['loadavg_end'])}"
    lines += [how + ".", ""]
    reasons = error_reasons(res, md_text)
    lines += [f"- {x}" for x in reasons]
    if (
        res.meta.get("gate_metrics")
        and res.gated_unmeasured
        and not any(x.startswith("nothing") for x in reasons)
    ):
        lines.append(
            f"- gated but not measured on both sides (gates nothing): {md_text(', '.join(res.gated_unmeasured))}"
        )
    if seq := _sequential_text(res):
        lines.append(f"- {md_text(seq)}")  # it names metrics (stage names from the bundles)
    if spells := _spells_line(res):
        lines.append(f"- {spells}")
    if res.ungated_regressions:
        lines.append(f"- reported, not gated: {md_text(', '.join(res.ungated_regressions))} regressed")
    lines += ["", markdown_table(_verdict_frame(res)), ""]
    looks = _looks_frame(res)
    if not looks.empty:
        lines += [
            "Looks (gated metrics, B/A interval at each look's confidence):",
            "",
            markdown_table(looks),
            "",
        ]
    return "\n".join(lines)


def write_ab_outputs(res: AbResult, out: str | Path) -> dict[str, Path]:
    """``ab.json``, ``summary.md`` and ``report.html`` under ``out``: name -> path."""
    saved = res.save(out)
    sides = res.meta.get("sides") or {}
    meta = [{"text": f"side {s}", "code": (sides.get(s) or {}).get("path") or "?"} for s in ("A", "B")]
    if res.meta.get("replay"):
        meta.append({"text": "replayed from recorded bundles"})
    paths = write_tool_outputs(
        out,
        ab_summary_markdown(res),
        "sections/ab.html.j2",
        ab_context(res, out),
        "ab",
        title="perfkit ab: is B slower than A?",
        verdict=_badge(res),
        exit_code=res.exit_code,
        meta=meta,
        warnings=list(res.meta.get("warnings") or []),
        gates=format_table(_decision_counts(res)),
    )
    log.info("ab report: %s", paths["report"])
    return {"result": saved, **paths}


#: the targets of the recommendation: detection at least, A/A false alarms at most (fractions)
_DETECT_MIN = 0.95
_ALARM_MAX = 0.01
#: random draws per (arm, N, M) where the ways to pick launches exceed MAX_EXACT; seed 0
_SIMS = 2000

_METRIC_WORDS = {"DenoisingStage": "DenoisingStage", "warm_e2e": "warm e2e"}


def _spells_text(sp: pd.DataFrame) -> str:
    sp = sp.assign(**{c: pd.to_numeric(sp[c], errors="coerce") for c in sp.columns if c != "arm"})
    return "; ".join(
        f"{r.arm}: {r.slow_requests} of {r.requests} warm requests in {r.slow_launches} of {r.launches} launches "
        f"(quiet level {r.quiet_ms:.0f} ms, worst +{r.worst_pct:.0f} %"
        + (
            f"; SM clock {r.slow_sm_mhz:.0f} MHz slow vs {r.quiet_sm_mhz:.0f} MHz quiet, at a power limit in "
            f"{percent_text(r.slow_power_capped, 0)} vs {percent_text(r.quiet_power_capped, 0)} of their samples"
            if r.slow_sm_mhz == r.slow_sm_mhz and r.quiet_sm_mhz == r.quiet_sm_mhz
            else ""
        )
        + ")"
        for r in sp.itertuples()
    )


def _ways_text(table: pd.DataFrame) -> str:
    exact = pd.concat([table["aa_exact"], table["ab_exact"]]).dropna()
    if len(exact) and exact.astype(bool).all():
        return "over every way to pick the launches from the pool (exact for this pool)"
    if len(exact) and not exact.astype(bool).any():
        return f"over {_SIMS} random draws of the pool"
    return f"over every way to pick the launches where there are at most {power.MAX_EXACT:,}, else {_SIMS} random draws"


def power_markdown(path: str | Path, threshold: float, confidence: float, label: str | None = None) -> str:
    """``kind=ab-power`` for the pool at ``path``. Raises FileNotFoundError, ValueError (load_pool)."""
    pool = power.load_pool(path)
    a_n = len(pool.launches("A"))
    arms = "; ".join(
        f"{arm}: DenoisingStage +{info.get('DenoisingStage_pct'):g} % ({len(pool.launches(arm))} launches, "
        f"caught on {_METRIC_WORDS.get(info.get('target', ''), info.get('target'))})"
        for arm, info in pool.arms.items()
    )
    wall = pool.meta.get("wall_s")
    head = (
        f"Pool `{label or path}`: {a_n} launches of A; {arms}; one interleaved order, "
        f"{pool.warm} warm requests a launch"
        + (f", {float(wall) / 60:.0f} min in all" if isinstance(wall, (int, float)) else "")
        + "."
    )
    var = power.variance_table(pool)
    vt = pd.DataFrame(
        {
            **_noise(var, lambda x: "–" if x != x else f"{x:.2f}"),
            "CV of A's launch medians": [percent_text(x) for x in var["cv_launch_a"]],
            **{
                f"measured {c[:-4]}/A": ["–" if x != x else f"{x:+.1f} %" for x in var[c]]
                for c in var.columns
                if c.endswith("_pct")
            },
        }
    )
    spells = _spells_text(slow_spells(pool.values, pool.bundles))
    table = power.power_table(pool, settings=[(threshold, confidence)], sims=_SIMS, seed=0)
    rows = []
    for (n, m), g in table.groupby(["n", "m"], sort=True):
        first = g.iloc[0]
        row = {
            "N": int(n),
            "M": int(m),
            "A/A: interval holds 1": percent_text(first["aa_covers"]),
            "A/A alarm: DenoisingStage": percent_text(first["aa_alarm_DenoisingStage"]),
            "warm e2e": percent_text(first["aa_alarm_warm_e2e"]),
            "A/A exit 1: gated": percent_text(first["aa_alarm_gate"]),
            "every metric gating": percent_text(first["aa_alarm_any"]),
        }
        for _, r in g.iterrows():
            target = r["target"]
            row[f"{r['arm']}: caught on {_METRIC_WORDS.get(target, target)}"] = percent_text(
                r[f"detect_{target}"]
            )
            row[f"{r['arm']}: TextEncodingStage alarm"] = percent_text(r["alarm_untouched"])
            row[f"{r['arm']}: exit 1, gated"] = percent_text(r["detect_gate"])
            row[f"{r['arm']}: every metric gating"] = percent_text(r["detect_any"])
        rows.append(row)
    untrusted = power.arm_warnings(pool)
    recs = [
        (what, power.recommend(table, _DETECT_MIN, _ALARM_MAX, alarm=alarm).head(1).to_dict("records"))
        for alarm, what in (() if untrusted else power.JUDGEMENTS.items())
    ]
    tpl = template_env().get_template("figures/ab_power.md.j2")
    return tpl.render(
        pct=percent_text,
        head=head,
        variance=markdown_table(vt),
        spells=spells,
        threshold=threshold,
        confidence=confidence,
        ways=_ways_text(table),
        table=markdown_table(pd.DataFrame(rows)),
        short_aa=sorted({int(n) for n, w in zip(table["n"], table["aa_ways"]) if not w}),
        short_ab=[
            (arm, ns, len(pool.launches(arm)))
            for arm in pool.arms
            if (ns := sorted({int(r.n) for r in table.itertuples() if r.arm == arm and not r.ab_ways}))
        ],
        a_n=a_n,
        untrusted=untrusted.values(),
        recs=recs,
        n_max=int(table["n"].max()),
        detect=f"{_DETECT_MIN:.0%}",
        alarm=f"{_ALARM_MAX:.0%}",
        source=label or path,
        sizes=f"{a_n} A launches" + "".join(f", {len(pool.launches(arm))} {arm}" for arm in pool.arms),
    )


#: experiments a kind (A/A, each arm) and slow-spell rule in a sequential replay; seed 0
_SEQ_SIMS = 1000
#: the gate of the sequential figures (``perfkit ab --gate-metrics``)
_SEQ_GATE = ("DenoisingStage", "warm_e2e")


def sequential_markdown(
    path: str | Path, threshold: float, confidence: float, label: str | None = None
) -> str:
    """``kind=ab-sequential``: the pool replayed. Raises FileNotFoundError, ValueError (load_pool)."""
    from perfkit.ab import sequential as sq

    pool = power.load_pool(path)
    a_n = len(pool.launches("A"))
    rows, mx = [], None
    for rule in sq.SLOW_RULES:
        design = sq.Design(sq.DEFAULT_MIN_LAUNCHES, sq.DEFAULT_MAX_LAUNCHES, confidence, "pocock", rule)
        runs = sq.replay_pool(pool, design, _SEQ_GATE, threshold, sims=_SEQ_SIMS, seed=0)
        for r in sq.replay_summary(runs).itertuples():
            used = runs.loc[runs["kind"] == r.kind, "launches"]
            dist = used.value_counts(normalize=True).reindex(range(design.min_launches, r.max_launches + 1))
            mx = r.max_launches
            what = (
                "A/A"
                if r.kind == "A/A"
                else f"{r.kind}: +{pool.arms[r.kind]['DenoisingStage_pct']:g} % DenoisingStage"
            )
            rows.append(
                {
                    "experiment": what,
                    "slow spells": rule,
                    "exit 1, regression": percent_text(r.regression),
                    "caught on its metric": "–"
                    if r.kind == "A/A"
                    else f"{percent_text(r.caught)} ({_METRIC_WORDS.get(r.target, r.target)})",
                    "decided, exit 0": percent_text(r.decided),
                    "undecided (exit 1)": percent_text(r.undecided),
                    "launches a side: median": f"{r.median_launches:g}",
                    "90th pct": f"{r.p90_launches:g}",
                    "most": str(r.max_used),
                    "stopped at " + " / ".join(str(k) for k in dist.index): " / ".join(
                        f"{(v if v == v else 0) * 100:.0f}" for v in dist
                    )
                    + " %",
                }
            )
    sizes = f"{a_n} A launches" + "".join(f", {len(pool.launches(arm))} {arm}" for arm in pool.arms)
    tpl = template_env().get_template("figures/ab_sequential.md.j2")
    return tpl.render(
        first=sq.DEFAULT_MIN_LAUNCHES,
        mx=mx,
        threshold=threshold,
        confidence=confidence,
        gate=_SEQ_GATE,
        source=label or path,
        sizes=sizes,
        table=markdown_table(pd.DataFrame(rows)),
        sims=_SEQ_SIMS,
    )
