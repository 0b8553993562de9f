"""Decide an A/B from two sides' bundles: the values compared, slow spells, per metric the ratio
B/A, its interval and decision, the exit code (0 no gated regression; 1 a gated regression or
undecided; 2 nothing gated compared or a launch failed). Metrics and rules: docs/ab.md."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.bundle import IDENTITY_REQUEST, WARMUP_INDEX, ResultBundle
from perfkit.common import jsonsafe
from perfkit.common.numfmt import change_text
from perfkit.gate.verdicts import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, jsonable
from perfkit.readings import stages as _stages
from perfkit.readings.sampler.nvml import POWER_REASONS

#: unit of each fixed metric (stage metrics are ms)
METRIC_UNITS = {
    **dict.fromkeys(("ready", "first_result"), "s"),
    **dict.fromkeys(("cold_e2e", "warm_e2e", "denoising_step"), "ms"),
    **dict.fromkeys(("peak_vram", "host_peak"), "MiB"),
}
#: metrics with one value a launch (no variance within a launch)
LAUNCH_METRICS = ("ready", "first_result", "cold_e2e", "peak_vram", "host_peak")

COLUMNS = ["launch", "metric", "unit", "index", "value"]


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) and x > 0 else math.nan


def metric_values(bundle: ResultBundle) -> pd.DataFrame:
    """Long table of a side's measured values, :data:`COLUMNS` (``index``: the request's place in
    its launch, 0 for launch-level metrics; units :data:`METRIC_UNITS`, stages ms)."""
    rows: list[tuple[Any, str, str, int, float]] = []
    launches = bundle.launches
    req = bundle.measured_requests()
    mem = bundle.memory

    def add(launch: Any, metric: str, index: int, value: Any, unit: str | None = None) -> None:
        v = _num(value)
        if not math.isnan(v):
            rows.append((str(launch), metric, unit or METRIC_UNITS.get(metric, "ms"), int(index), v))

    for lr in launches.to_dict("records"):
        lab = lr["launch"]
        add(lab, "ready", 0, lr.get("ready_s"))
        add(lab, "first_result", 0, lr.get("first_result_s"))
        # PSS peak: the larger of the cap watchdog's (launch row) and the sampler's reads
        host = _num(lr.get("host_pss_peak_mib"))
        if not mem.empty and "host_pss_mib" in mem.columns:
            m = mem[(mem["launch"] == lab).fillna(False).to_numpy(bool)]
            sampled = (
                _num(pd.to_numeric(m["host_pss_mib"], errors="coerce").max()) if not m.empty else math.nan
            )
            host = float(np.fmax(host, sampled))
        add(lab, "host_peak", 0, host)
        r = req[(req["launch"] == lab).fillna(False).to_numpy(bool)] if not req.empty else req
        if not r.empty:
            add(lab, "peak_vram", 0, pd.to_numeric(r["peak_reserved_mib"], errors="coerce").max())
            cold = r[r["index"] == 0]
            if not cold.empty:
                add(lab, "cold_e2e", 0, cold["e2e_ms"].iloc[0])
            for rec in r[r["index"] >= 1].to_dict("records"):
                add(lab, "warm_e2e", rec["index"], rec["e2e_ms"])
    warm_ids = set(req.loc[(req["index"] >= 1).fillna(False).to_numpy(bool), "request_id"].astype(str))
    st = bundle.stages
    if not st.empty and warm_ids:
        st = st[st["request_id"].astype(str).isin(warm_ids) & (st["index"] != WARMUP_INDEX).fillna(False)]
        per = st.groupby(["launch", "index", "stage"], sort=False)["ms"].sum().reset_index()
        for rec in per.to_dict("records"):
            add(rec["launch"], rec["stage"], rec["index"], rec["ms"], "ms")
    sp = bundle.steps
    if not sp.empty and warm_ids:
        sp = sp[sp["request_id"].astype(str).isin(warm_ids)]
        sp = sp[sp["stage"].map(lambda s: _stages.stage_class(str(s)) == _stages.DENOISING)]
        per = sp.groupby(["launch", "index"], sort=False)["ms"].mean().reset_index()
        for rec in per.to_dict("records"):
            add(rec["launch"], "denoising_step", rec["index"], rec["ms"])
    return pd.DataFrame(rows, columns=COLUMNS)


def launch_errors(bundle: ResultBundle) -> dict[str, Any]:
    """Launch label -> error of each failed launch of a side's bundle."""
    la = bundle.launches
    if la.empty or "error" not in la:
        return {}
    return {str(r["launch"]): r["error"] for r in la[la["error"].notna()].to_dict("records")}


def launch_means(values: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, launch) the median of its values and their count: ``metric, launch, unit,
    value, n`` (why the median: docs/choosing-n-m.md)."""
    if values.empty:
        return pd.DataFrame(columns=["metric", "launch", "unit", "value", "n"])
    g = values.groupby(["metric", "launch"], sort=False)
    return g.agg(unit=("unit", "first"), value=("value", "median"), n=("value", "size")).reset_index()


def paired_values(values_a: pd.DataFrame, values_b: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric's pairs of a paired A/B (``A<k>`` ran beside ``B<k>``): ``pair``, ``a`` (A's launch
    median), ``b`` (A's median times the median ratio B/A of requests of the same place; a
    launch-level metric: B's value)."""
    rows = []
    va, vb = values_a[values_a["metric"] == metric], values_b[values_b["metric"] == metric]
    by_a = {str(x)[1:]: g for x, g in va.groupby("launch")}
    by_b = {str(x)[1:]: g for x, g in vb.groupby("launch")}
    for k in sorted(set(by_a) & set(by_b)):
        ga, gb = by_a[k], by_b[k]
        a_med = float(ga["value"].median())
        if metric in LAUNCH_METRICS:
            rows.append((k, a_med, float(gb["value"].median())))
            continue
        both = (
            ga.set_index("index")["value"]
            .to_frame("a")
            .join(gb.set_index("index")["value"].to_frame("b"), how="inner")
        )
        if both.empty:
            continue
        ratio = float(np.exp(np.median(np.log(both["b"].to_numpy(float) / both["a"].to_numpy(float)))))
        rows.append((k, a_med, a_med * ratio))
    return pd.DataFrame(rows, columns=["pair", "a", "b"])


def metric_order(names: Any) -> list[str]:
    """Metrics in report order: launch and e2e metrics, stages in pipeline order, step, peaks."""
    names = list(dict.fromkeys(names))
    head = [m for m in ("ready", "first_result", "cold_e2e", "warm_e2e") if m in names]
    tail = [m for m in ("denoising_step", "peak_vram", "host_peak") if m in names]
    stages = _stages.order_stages([m for m in names if m not in head and m not in tail])
    return head + stages + tail


#: the metric whose warm requests mark slow spells
SLOW_METRIC = "DenoisingStage"
#: a warm request is slow above this × its side's quiet level
SLOW_FACTOR = 1.05
#: the quiet level: this quantile of the side's warm requests (1 / it an integer)
QUIET_QUANTILE = 0.10


def _request_clocks(bundle: ResultBundle) -> pd.DataFrame:
    """Per warm request: median SM clock (MHz), share of samples at a power limit."""
    mem, req, cols = bundle.memory, bundle.requests, ["launch", "index", "sm_mhz", "power_capped"]
    if mem.empty or "sm_clock_mhz" not in mem or mem["sm_clock_mhz"].isna().all():
        return pd.DataFrame(columns=cols)
    rows = []
    warm = req[(req["index"] > 0) & req["t_start_s"].notna() & req["t_end_s"].notna()]
    for r in warm.itertuples():
        m = mem[(mem["launch"] == r.launch) & (mem["t_s"] >= r.t_start_s) & (mem["t_s"] <= r.t_end_s)]
        rs = m["clock_event_reasons"].dropna()
        capped = float(((rs.astype("int64") & POWER_REASONS) > 0).mean()) if len(rs) else math.nan
        rows.append((r.launch, r.index, float(m["sm_clock_mhz"].median()), capped))
    return pd.DataFrame(rows, columns=cols)


def slow_launches(requests: dict[str, np.ndarray]) -> list[str]:
    """Labels of the launches (label -> warm request ms) with half or more of their requests slow
    (:func:`slow_spells`' rule)."""
    lists = {k: np.asarray(v, dtype=float).ravel().tolist() for k, v in requests.items()}
    every = [x for v in lists.values() for x in v]
    if not every:
        return []
    # the stdlib's quantiles cost ~1/5 of numpy's (the replay calls this ~300,000 times)
    if len(every) > 1 and all(math.isfinite(x) for x in every):
        quiet = statistics.quantiles(every, n=round(1 / QUIET_QUANTILE), method="inclusive")[0]
    else:
        quiet = float(np.quantile(np.array(every), QUIET_QUANTILE))
    cut = SLOW_FACTOR * quiet
    return [k for k, v in lists.items() if v and sum(x > cut for x in v) / len(v) >= 0.5]


def slow_spells(values: Mapping[str, pd.DataFrame], bundles: Mapping[str, ResultBundle]) -> pd.DataFrame:
    """Per arm, its warm :data:`SLOW_METRIC` requests above :data:`SLOW_FACTOR` × its quiet level:
    ``arm, quiet_ms, requests, slow_requests, launches, slow_launches, worst_pct``, and the slow
    and quiet requests' median SM clock (MHz) and power-capped share (NaN: no clock samples)."""
    rows = []
    for arm, v in values.items():
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] > 0)]
        if x.empty:
            continue
        quiet = float(x["value"].quantile(QUIET_QUANTILE))
        is_slow = x["value"] > SLOW_FACTOR * quiet
        slow = x[is_slow]
        row: dict[str, Any] = {
            "arm": arm,
            "quiet_ms": quiet,
            "requests": len(x),
            "slow_requests": len(slow),
            "launches": x["launch"].nunique(),
            "slow_launches": slow["launch"].nunique(),
            "worst_pct": (float(x["value"].max()) / quiet - 1) * 100,
        }
        clocks = _request_clocks(bundles[arm]) if arm in bundles else pd.DataFrame()
        joined = x.assign(slow=is_slow, sm_mhz=math.nan, power_capped=math.nan)
        if not clocks.empty:
            joined = x.assign(slow=is_slow).merge(clocks, on=["launch", "index"], how="left")
        for part, want in (("slow", True), ("quiet", False)):
            sub = joined[joined["slow"] == want]
            row[f"{part}_sm_mhz"] = float(sub["sm_mhz"].median())
            row[f"{part}_power_capped"] = float(sub["power_capped"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


#: the comparison's file in an ab run directory
RESULT_FILE = "ab.json"
#: columns of :attr:`AbResult.table`
TABLE_COLUMNS = (
    "metric unit a b ratio low high threshold decision n_a n_b launches_needed "
    "icc cv_between cv_within gated reason"
).split()


@dataclass
class AbResult:
    """One A/B decision. ``table``: a row per metric, :data:`TABLE_COLUMNS` (``a``/``b`` geometric
    means of launch medians in the metric's unit, ``ratio`` B/A with ``low``/``high``, ``decision``
    one of :data:`perfkit.stats.DECISIONS`); ``launch_means`` each launch's median; ``meta`` how
    it was run."""

    table: pd.DataFrame
    launch_means: pd.DataFrame
    exit_code: int
    confidence: float = stats.DEFAULT_CONFIDENCE
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def decisions(self) -> dict[str, str]:
        """metric -> decision, one per table row."""
        return dict(zip(self.table["metric"], self.table["decision"]))

    @property
    def verdict(self) -> str:
        """``regression``, ``undecided`` (exit 1), ``error`` (exit 2), ``inconclusive`` (exit 0, a
        gated metric not decided), else ``no regression``."""
        decisions = set(self.table.loc[self.gated, "decision"])
        if self.exit_code == EXIT_REGRESSION:
            return "undecided" if self.undecided and "regression" not in decisions else "regression"
        if self.exit_code != EXIT_OK:
            return "error"
        return "inconclusive" if "inconclusive" in decisions else "no regression"

    @property
    def undecided(self) -> list[str]:
        """Gated metrics the sequential procedure left inconclusive at its maximum."""
        return list((self.meta.get("sequential") or {}).get("undecided") or [])

    @property
    def gated(self) -> pd.Series:
        """Per table row, whether its regression sets the exit code (booleans)."""
        return self.table["gated"].astype(bool)

    @property
    def gated_unmeasured(self) -> list[str]:
        """Gated metrics not measured on both sides."""
        t = self.table
        return list(t.loc[(t["decision"] == "not measured") & self.gated, "metric"])

    @property
    def ungated_regressions(self) -> list[str]:
        """Metrics called a regression that do not set the exit code."""
        t = self.table
        return list(t.loc[(t["decision"] == "regression") & ~self.gated, "metric"])

    def save(self, out: str | Path) -> Path:
        """Write ``out/ab.json`` (table, launch means, exit code, meta; NaN as null)."""
        p = Path(out) / RESULT_FILE
        p.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "confidence": self.confidence,
            "table": jsonable(self.table.to_dict("records")),
            "launch_means": jsonable(self.launch_means.to_dict("records")),
            "meta": jsonable(self.meta),
        }
        p.write_text(jsonsafe.dumps(doc, indent=2, default=str) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> "AbResult":
        """Read an ``ab.json`` (a file or its directory). Raises FileNotFoundError: no ab.json there."""
        p = Path(path)
        if p.is_dir():
            p = p / RESULT_FILE
        if not p.exists():
            raise FileNotFoundError(f"{p}: no {RESULT_FILE} (not an ab run directory)")
        doc = json.loads(p.read_text())
        table = pd.DataFrame(doc.get("table") or [], columns=TABLE_COLUMNS)
        for c in ("a", "b", "ratio", "low", "high", "threshold", "icc", "cv_between", "cv_within"):
            table[c] = pd.to_numeric(table[c], errors="coerce").astype(float)  # null -> NaN
        table["launches_needed"] = pd.to_numeric(table["launches_needed"], errors="coerce").astype("Int64")
        table["gated"] = _gated_column(table, (doc.get("meta") or {}).get("gate_metrics"), p)
        return cls(
            table=table,
            launch_means=pd.DataFrame(doc.get("launch_means") or []),
            exit_code=int(doc["exit_code"]),
            confidence=float(doc.get("confidence", stats.DEFAULT_CONFIDENCE)),
            meta=doc.get("meta") or {},
        )


def _gated_column(table: pd.DataFrame, gate: Any, path: Path) -> list[bool]:
    """Each row's ``gated``; a null one from the run's ``meta.gate_metrics``."""
    out = []
    for metric, v in zip(table["metric"], table["gated"]):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(True if gate is None else metric in gate)
        elif isinstance(v, (bool, np.bool_)):
            out.append(bool(v))
        else:
            raise ValueError(f"{path}: table row {metric!r}: gated is {v!r}, not true or false")
    return out


def compare(
    values_a: pd.DataFrame,
    values_b: pd.DataFrame,
    threshold: float = stats.DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    confidence: float = stats.DEFAULT_CONFIDENCE,
    failed_launches: int = 0,
    gate: Sequence[str] | None = None,
    paired: bool = False,
) -> AbResult:
    """Compare two sides' :func:`metric_values` into an :class:`AbResult` (``meta`` empty): Welch
    intervals over launch medians, or paired ones (:func:`paired_values`); ``gate`` None: every
    metric gates; any ``failed_launches``: exit 2. Raises ValueError: threshold or confidence not
    in (0, 1); ``gate`` empty or naming a metric not compared (those compared listed)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be a fraction in (0, 1), got {threshold}")
    thresholds = dict(thresholds or {})
    lm = pd.concat(
        [launch_means(values_a).assign(side="A"), launch_means(values_b).assign(side="B")], ignore_index=True
    )[["side", "metric", "launch", "unit", "value", "n"]]
    both = pd.concat([values_a.assign(side="A"), values_b.assign(side="B")], ignore_index=True)
    names = metric_order([*METRIC_UNITS, *both["metric"].unique()])
    if gate is not None:
        if isinstance(gate, str) or not all(isinstance(g, str) for g in gate):
            raise ValueError(f"gate must be a list of metric names, got {gate!r}")
        gate = list(dict.fromkeys(gate))
        if not gate:
            raise ValueError("gate names no metric (None: every metric gates)")
        unknown = [g for g in gate if g not in names]
        if unknown:
            raise ValueError(
                f"gate metrics {unknown} are not compared here; the metrics are {', '.join(names)}"
            )
    rows = []
    for metric in names:
        thr = float(thresholds.get(metric, threshold))
        ma, mb = (lm.loc[(lm["side"] == s) & (lm["metric"] == metric), "value"].to_numpy(float) for s in "AB")
        if paired:
            pv = paired_values(values_a, values_b, metric)
            iv = stats.paired_ratio_interval(pv["a"], pv["b"], confidence)
        else:
            iv = stats.ratio_interval(ma, mb, confidence)
        decision = stats.decide(iv, thr)
        sub = both[both["metric"] == metric]
        split = stats.variance_split(sub["value"], sub["side"] + ":" + sub["launch"], sub["side"])
        needed = stats.launches_needed(iv, thr, paired=paired) if decision == "inconclusive" else None
        unit = METRIC_UNITS.get(metric, "ms")
        if decision == "not measured":
            missing = [s for s, v in (("A", ma), ("B", mb)) if v.size == 0]
            reason = f"nothing measured on {' and '.join(missing)}"
        elif decision == "inconclusive" and (iv.n_a < 2 or iv.n_b < 2):
            reason = f"{min(iv.n_a, iv.n_b)} launch on a side: no interval"
        else:
            reason = (
                f"B/A {change_text(iv.ratio)} [{change_text(iv.low)}, {change_text(iv.high)}] "
                f"vs ±{thr * 100:.1f} %"
            )
            if decision == "inconclusive":
                reason += (
                    f"; ~{needed} launches a side would decide"
                    if needed
                    else "; more than 200 launches a side would be needed (or B/A sits on a boundary)"
                )
        gated = gate is None or metric in gate
        if not gated and decision == "regression":
            reason += "; reported, not gated"
        rows.append(
            {
                "metric": metric,
                "unit": unit,
                "a": math.exp(pd.Series(ma).apply(math.log).mean()) if ma.size else math.nan,
                "b": math.exp(pd.Series(mb).apply(math.log).mean()) if mb.size else math.nan,
                "ratio": iv.ratio,
                "low": iv.low,
                "high": iv.high,
                "threshold": thr,
                "decision": decision,
                "n_a": iv.n_a,
                "n_b": iv.n_b,
                "launches_needed": needed,
                "icc": split.icc,
                "cv_between": split.cv_between,
                "cv_within": split.cv_within,
                "gated": gated,
                "reason": reason,
            }
        )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["launches_needed"] = table["launches_needed"].astype("Int64")
    decisions = set(table.loc[table["gated"].astype(bool), "decision"])
    code = EXIT_REGRESSION if "regression" in decisions else EXIT_OK
    if failed_launches or not decisions - {"not measured"}:  # nothing gated was compared
        code = EXIT_ERROR
    return AbResult(table=table, launch_means=lm, exit_code=code, confidence=confidence)


#: what two sides of an A/B must share (the engines may differ)
SIDE_IDENTITY = ("investigation", "gpu_name", *(f"request.{k}" for k in ("num_frames", *IDENTITY_REQUEST)))


def incomparable(a: ResultBundle, b: ResultBundle) -> list[str]:
    """Why ``a`` and ``b`` cannot be one A/B: one ``"request.height: A 64, B 512"`` for each
    :data:`SIDE_IDENTITY` field that differs (one side lacking it included); [] when they can."""

    def field(bd: ResultBundle, key: str) -> Any:
        if key == "investigation":
            return bd.investigation
        if key.startswith("request."):
            return ((bd.meta.get("params") or {}).get("request") or {}).get(key.split(".", 1)[1])
        return bd.meta.get(key)

    return [
        f"{key}: A {field(a, key)!r}, B {field(b, key)!r}"
        for key in SIDE_IDENTITY
        if field(a, key) != field(b, key)
    ]


def thresholds_from_run(path: str | Path, floor: float = 0.01) -> dict[str, float]:
    """Per-metric thresholds from a recorded A/A's ``ab.json``: each interval end's largest distance
    from 1, at least ``floor``. Raises FileNotFoundError: no ab.json; ValueError: no interval."""
    t = AbResult.load(path).table
    t = t[np.isfinite(t["low"]) & np.isfinite(t["high"])]
    out = {
        m: float(max(floor, abs(hi - 1), abs(1 - lo))) for m, lo, hi in zip(t["metric"], t["low"], t["high"])
    }
    if not out:
        raise ValueError(
            f"{path}: the A/A run has no metric with an interval (fewer than 2 launches a side?)"
        )
    return out


def needed_text(res: "AbResult", metrics: list[str]) -> str:
    """ "M (B/A +3.1 %: about 9 launches a side), ..." for each of ``metrics``."""
    t = res.table.set_index("metric")
    out = []
    for m in metrics:
        n = t["launches_needed"].get(m) if m in t.index else None
        n = None if n is None or pd.isna(n) else int(n)
        ratio = change_text(float(t["ratio"].get(m))) if m in t.index else "–"
        size = (
            f"about {n} launches a side"
            if n
            else "no estimate: over 200 launches a side, or B/A on a threshold"
        )
        out.append(f"{m} (B/A {ratio}: {size})")
    return ", ".join(out)
