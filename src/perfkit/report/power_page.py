"""The Markdown of an A/B power pool (:mod:`perfkit.ab.power`) for ``perfkit figures``
(``kind=ab-power``, ``ab-sequential``): docs/ab.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfkit.ab import power
from perfkit.common.numfmt import percent_text
from perfkit.report.tables import markdown_table

#: the targets of the recommendation: detection at least, A/A false alarms at most (fractions)
DETECT_MIN = 0.95
ALARM_MAX = 0.01
#: random draws per (arm, N, M) where the ways to pick launches exceed MAX_EXACT; seed 0
SIMS = 2000

_METRIC_WORDS = {"DenoisingStage": "DenoisingStage", "warm_e2e": "warm e2e"}


def _arm_words(arm: str, info: dict, launches: int) -> str:
    pct = info.get("DenoisingStage_pct")
    target = _METRIC_WORDS.get(info.get("target", ""), info.get("target"))
    return f"{arm}: DenoisingStage +{pct:g} % ({launches} launches, caught on {target})"


def spells_text(sp: pd.DataFrame) -> str:
    """One clause per arm of :func:`perfkit.ab.power.slow_spells` (quiet level in ms; clocks and
    power-cap shares where recorded)."""
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
    """How the rates were drawn: over every way to pick the launches (exact), or random draws."""
    exact = pd.concat([table["aa_exact"], table["ab_exact"]]).dropna()
    if len(exact) and exact.astype(bool).all():
        return "over every way to pick the launches from the pool (exact for this pool)"
    if len(exact) and not exact.astype(bool).any():
        return f"over {SIMS} random draws of the pool"
    return f"over every way to pick the launches where there are at most {power.MAX_EXACT:,}, else {SIMS} random draws"


def power_markdown(path: str | Path, threshold: float, confidence: float, label: str | None = None) -> str:
    """Markdown for the pool at ``path`` decided at (``threshold``, ``confidence``). Raises
    FileNotFoundError, ValueError: as :func:`perfkit.ab.power.load_pool`."""
    pool = power.load_pool(path)
    a_n = len(pool.launches("A"))
    arms = "; ".join(_arm_words(arm, info, len(pool.launches(arm))) for arm, info in pool.arms.items())
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
            "metric": var["metric"],
            "CV between launches": [percent_text(x) for x in var["cv_between"]],
            "CV within a launch": [percent_text(x) for x in var["cv_within"]],
            "ICC": ["–" if x != x else f"{x:.2f}" for x in var["icc"]],
            "CV of A's launch medians": [percent_text(x) for x in var["cv_launch_a"]],
            **{
                f"measured {c[:-4]}/A": ["–" if x != x else f"{x:+.1f} %" for x in var[c]]
                for c in var.columns
                if c.endswith("_pct")
            },
        }
    )
    spells = spells_text(power.slow_spells(pool))
    table = power.power_table(pool, settings=[(threshold, confidence)], sims=SIMS, seed=0)
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
    lines = [
        head,
        "",
        markdown_table(vt),
        "",
        "Slow spells (a warm request's DenoisingStage more than 5 % above its arm's quiet level, the "
        f"10th percentile of the arm's warm requests): {spells}.",
        "",
        f"Decided as `perfkit ab --threshold {threshold:g} --confidence {confidence:g}` would "
        f"(a regression: the {confidence:.0%} interval of B/A lies above {1 + threshold:g}); "
        '"gated": the exit code with `--gate-metrics DenoisingStage,warm_e2e`, "every metric '
        f'gating": without it; rates {_ways_text(table)}:',
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]
    short_aa = sorted({int(n) for n, w in zip(table["n"], table["aa_ways"]) if not w})
    if short_aa:
        lines.append(
            f"- No A/A rate (–) at N = {', '.join(map(str, short_aa))}: an A/A needs 2N distinct A launches "
            f"and the pool has {a_n}."
        )
    for arm in pool.arms:
        ns = sorted({int(r.n) for r in table.itertuples() if r.arm == arm and not r.ab_ways})
        if ns:
            lines.append(
                f"- No rate for {arm} (–) at N = {', '.join(map(str, ns))}: it needs N launches of A and of "
                f"{arm}; the pool has {a_n} of A and {len(pool.launches(arm))} of {arm}."
            )
    untrusted = power.arm_warnings(pool)
    for said in untrusted.values():
        lines.append(f"- **Off its asked change:** {said}; no N and M are recommended from this pool.")
    for alarm, what in () if untrusted else power.JUDGEMENTS.items():
        rec = power.recommend(table, DETECT_MIN, ALARM_MAX, alarm=alarm)
        if rec.empty:
            lines.append(
                f"- Judged by {what}: no N ≤ {int(table['n'].max())} meets detection ≥ {DETECT_MIN:.0%} "
                f"of every arm with A/A false alarms ≤ {ALARM_MAX:.0%} at this setting."
            )
        else:
            r = rec.iloc[0]
            lines.append(
                f"- Judged by {what}: the cheapest N and M with detection ≥ {DETECT_MIN:.0%} of every arm "
                f"and A/A false alarms ≤ {ALARM_MAX:.0%} are **N = {int(r['n'])}, M = {int(r['m'])}** "
                f"(worst detection {percent_text(r['detect_min_seen'])}, worst false alarm "
                f"{percent_text(r['alarm_max_seen'])})."
            )
    sizes = f"{a_n} A launches" + "".join(f", {len(pool.launches(arm))} {arm}" for arm in pool.arms)
    lines += [
        "",
        f"*Generated by `perfkit figures` from the pool `{label or path}` ({sizes}): launch values are "
        "medians of the first M warm requests; intervals Welch t on their logs; the draws share "
        "launches, so the rates describe this pool, not independent experiments (with 10 A launches "
        "there are 252 A/A splits at N = 5: steps of 0.4 %); random draws, where taken, seed 0.*",
        "",
    ]
    return "\n".join(lines)


#: experiments a kind (A/A, each arm) and slow-spell rule in a sequential replay; seed 0
SEQ_SIMS = 1000
#: the gate of the sequential figures (``perfkit ab --gate-metrics``)
SEQ_GATE = ("DenoisingStage", "warm_e2e")


def sequential_markdown(
    path: str | Path, threshold: float, confidence: float, label: str | None = None
) -> str:
    """``kind=ab-sequential``: the sequential ``perfkit ab`` (Pocock spending, gated on
    :data:`SEQ_GATE`) replayed on the pool with each slow-spell rule.

    Raises:
        FileNotFoundError, ValueError: as :func:`perfkit.ab.power.load_pool`, or a pool too small."""
    from perfkit.ab import sequential as sq

    pool = power.load_pool(path)
    a_n = len(pool.launches("A"))
    rows, mx = [], None
    for rule in sq.SLOW_RULES:
        design = sq.Design(sq.DEFAULT_MIN_LAUNCHES, sq.DEFAULT_MAX_LAUNCHES, confidence, "pocock", rule)
        runs = sq.replay_pool(pool, design, SEQ_GATE, threshold, sims=SEQ_SIMS, seed=0)
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
    lines = [
        f"Sequential `perfkit ab --launches {sq.DEFAULT_MIN_LAUNCHES} --max-launches {mx} --threshold {threshold:g} "
        f"--confidence {confidence:g} --gate-metrics {','.join(SEQ_GATE)}` replayed on `{label or path}` "
        f"({sizes}; the maximum is cut to {mx} launches a side, what the pool holds for an A/A of two "
        "disjoint sides), with each slow-spell rule:",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
        f"*Generated by `perfkit figures` from the pool `{label or path}`: {SEQ_SIMS} experiments a row (seed 0), "
        "each a random order of the pool's launches drawn without replacement for each side (an A/A: the first "
        f"{mx} of a random order of A's launches on one side, the next {mx} on the other), fed one launch at a "
        "time in the order the procedure asks for; launch values are medians of the warm requests, intervals "
        "Welch t at each look's share of the error rate (Pocock spending), split over the two gated metrics. The experiments share launches, so "
        'the rates describe this pool, not independent occasions. "Caught on its metric": the run stopped on a '
        "regression of the arm's own metric; a run stops at the first gated regression, so an arm called a "
        "regression on DenoisingStage first is not looked at on warm e2e again.*",
        "",
    ]
    return "\n".join(lines)
