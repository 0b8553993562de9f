"""The sequential procedure of ``perfkit ab``: launch until every gated metric is decided; run
live, decide a recording, replay a pool. Method and sources: docs/choosing-n-m.md, "Launching
until decided". Ratios and confidences are fractions; launches are counts a side."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.ab.decide import (
    SLOW_METRIC,
    compare,
    launch_errors,
    metric_order,
    metric_values,
    paired_values,
    slow_launches,
    slow_spells,
)
from perfkit.ab.power import log_medians
from perfkit.common.numfmt import confidence_text
from perfkit.gate.verdicts import EXIT_OK, EXIT_REGRESSION, jsonable

#: alpha-spending functions (docs/choosing-n-m.md)
SPENDINGS = ("pocock", "obrien-fleming")
#: what happens to a launch run in a slow spell
SLOW_RULES = ("replace", "keep")
#: ``--undecided``: ``fail`` (exit 1) or ``pass`` (exit 0, said in the summary)
UNDECIDED = ("fail", "pass")
DEFAULT_MIN_LAUNCHES = 3
DEFAULT_MAX_LAUNCHES = 10


def spent_alpha(fraction: float, alpha: float, spending: str = "pocock") -> float:
    """The error rate spent up to information fraction ``fraction`` (0..1) of a total ``alpha``
    (two-sided), by the Lan–DeMets ``pocock`` or ``obrien-fleming`` function (docs/choosing-n-m.md)."""
    t = min(max(float(fraction), 0.0), 1.0)
    if t <= 0.0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * t)
    from scipy.stats import norm  # imported here: the CLI starts without scipy

    return float(2.0 * norm.sf(norm.isf(alpha / 2.0) / math.sqrt(t)))


@dataclass(frozen=True)
class Gate:
    """What decides an A/B: the gated ``metrics`` (None: every metric compared), the ±``threshold``
    (a fraction) and per-metric ``thresholds`` that override it."""

    metrics: Sequence[str] | None = None
    threshold: float = stats.DEFAULT_THRESHOLD
    thresholds: Mapping[str, float] | None = None

    def to_meta(self) -> dict[str, Any]:
        """The meta keys a replay decides by: ``threshold``, ``thresholds``, ``gate_metrics``."""
        metrics = list(dict.fromkeys(self.metrics)) if self.metrics is not None else None
        return {
            "threshold": self.threshold,
            "thresholds": dict(self.thresholds or {}),
            "gate_metrics": metrics,
        }


@dataclass(frozen=True)
class Design:
    """How a sequential A/B runs: launches a side at the first look (>= 2) and at most (replacements
    count); ``confidence`` two-sided over all looks and gated metrics; ``paired``: launch i of A ran
    beside launch i of B (``slow_rule`` must be ``keep``). Raises ValueError naming a field."""

    min_launches: int = DEFAULT_MIN_LAUNCHES
    max_launches: int = DEFAULT_MAX_LAUNCHES
    confidence: float = stats.DEFAULT_CONFIDENCE
    spending: str = "pocock"
    slow_rule: str = "replace"
    paired: bool = False

    def __post_init__(self) -> None:
        if self.min_launches < 2:
            raise ValueError(
                f"min_launches must be >= 2 (an interval needs 2 a side), got {self.min_launches}"
            )
        if self.max_launches < self.min_launches:
            raise ValueError(
                f"max_launches ({self.max_launches}) must be >= min_launches ({self.min_launches})"
            )
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.spending not in SPENDINGS:
            raise ValueError(f"spending must be one of {', '.join(SPENDINGS)}, got {self.spending!r}")
        if self.slow_rule not in SLOW_RULES:
            raise ValueError(f"slow_rule must be one of {', '.join(SLOW_RULES)}, got {self.slow_rule!r}")
        if self.paired and self.slow_rule != "keep":
            raise ValueError(
                "slow_rule must be 'keep' when paired: a pair shares its host state, and replacing "
                f"one side's launch would break the pair (got {self.slow_rule!r})"
            )

    def look_confidence(self, n: int) -> float:
        """Two-sided confidence of the look at ``n`` launches a side: 1 − (α(n/max) − α((n−1)/max))."""
        alpha = 1.0 - self.confidence
        hi = spent_alpha(n / self.max_launches, alpha, self.spending)
        lo = 0.0 if n <= self.min_launches else spent_alpha((n - 1) / self.max_launches, alpha, self.spending)
        return 1.0 - max(hi - lo, 1e-12)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, with each look's confidence."""
        return {
            **asdict(self),
            "look_confidence": {
                n: self.look_confidence(n) for n in range(self.min_launches, self.max_launches + 1)
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Design":
        """Inverse of :meth:`to_dict` (``look_confidence`` is recomputed)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class Look:
    """One look at ``n`` kept launches a side: per gated metric ``ratio, low, high, decision`` (B/A)."""

    n: int
    confidence: float
    launches: dict[str, list[str]]
    metrics: dict[str, dict[str, Any]]
    decided: bool
    position: int


@dataclass
class Walk:
    """Where the procedure stands: ``stop`` (``decided``, ``regression``, ``maximum``, ``failed``;
    None: launch ``next_arm``), ``run`` and ``replaced`` (side -> labels), ``spell_kept`` (sides
    with half or more marked slow, all kept), ``undecided`` (inconclusive at the maximum)."""

    looks: list[Look] = field(default_factory=list)
    stop: str | None = None
    next_arm: str | None = None
    used: int = 0
    run: dict[str, list[str]] = field(default_factory=dict)
    replaced: dict[str, list[str]] = field(default_factory=dict)
    spell_kept: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def final(self) -> Look | None:
        """The last look (None: none was taken)."""
        return self.looks[-1] if self.looks else None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready apart from NaN)."""
        d = asdict(self)
        d["launches_run"] = {s: len(v) for s, v in self.run.items()}
        return d


def _kept(
    run: Mapping[str, list[str]], slow: Mapping[str, Mapping[str, np.ndarray]], design: Design
) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """Per side the launches kept and replaced; the sides whose half or more were marked (all kept)."""
    kept, replaced, spell_kept = {}, {}, []
    for side, labels in run.items():
        marked: list[str] = []
        if design.slow_rule == "replace" and labels:
            marked = slow_launches({x: slow.get(side, {}).get(x, np.empty(0)) for x in labels})
            if 2 * len(marked) >= len(labels) and marked:
                spell_kept.append(side)
                marked = []
        kept[side] = [x for x in labels if x not in marked]
        replaced[side] = marked
    return kept, replaced, spell_kept


def _look(
    n: int,
    kept: Mapping[str, list[str]],
    logmed: Mapping[str, Mapping[str, np.ndarray]],
    metrics: Sequence[str],
    thresholds: Sequence[float],
    design: Design,
    position: int,
) -> Look:
    # the look's share of α split over the gated metrics (Bonferroni): the exit code reads any
    conf = 1.0 - (1.0 - design.look_confidence(n)) / max(1, len(metrics))
    use = {s: kept[s][:n] for s in ("A", "B")}
    none = np.full(len(metrics), np.nan)
    xa, xb = (np.array([logmed[s].get(x, none) for x in use[s]], float).reshape(n, -1) for s in "AB")
    out: dict[str, dict[str, Any]] = {}
    interval = stats.paired_ratio_interval if design.paired else stats.ratio_interval
    for k, metric in enumerate(metrics):
        iv = interval(np.exp(xa[:, k]), np.exp(xb[:, k]), conf)
        out[metric] = {"ratio": iv.ratio, "low": iv.low, "high": iv.high}
        out[metric]["decision"] = stats.decide(iv, thresholds[k])
    decided = all(m["decision"] != "inconclusive" for m in out.values())
    return Look(n, conf, use, out, decided, position)


class Walker:
    """The procedure one launch at a time over ``logmed`` (side -> label -> log launch medians of
    ``metrics``) and ``slow`` (side -> label -> warm :data:`SLOW_METRIC` ms); both may grow between
    calls of :meth:`add`. The first of ``failed`` stops the walk."""

    def __init__(
        self,
        logmed: Mapping[str, Mapping[str, np.ndarray]],
        slow: Mapping[str, Mapping[str, np.ndarray]],
        metrics: Sequence[str],
        thresholds: Sequence[float],
        design: Design,
        failed: Sequence[str] = (),
    ) -> None:
        self.logmed, self.slow, self.metrics = logmed, slow, list(metrics)
        self.thresholds, self.design, self.failed = list(thresholds), design, set(failed)
        self.w = Walk(run={"A": [], "B": []}, next_arm="A")
        self._last_n, self._last = 0, None
        self._kept: dict[str, list[str]] = {"A": [], "B": []}

    def add(self, side: str, label: str) -> Walk:
        """Take the launch ``label`` of ``side`` (the next in the order) and return the state."""
        w, design = self.w, self.design
        if w.stop is not None:
            return w
        if len(w.run[side]) >= design.max_launches:
            return _at_maximum(w, self.metrics, design)
        w.run[side].append(label)
        w.used += 1
        self._last = side
        if label in self.failed:
            w.stop, w.reason, w.next_arm = "failed", f"launch {label} failed", None
            return w
        self._kept, w.replaced, w.spell_kept = _kept(w.run, self.slow, design)
        n = min(len(self._kept["A"]), len(self._kept["B"]))
        if n >= design.min_launches and n > self._last_n:
            self._last_n = n
            look = _look(n, self._kept, self.logmed, self.metrics, self.thresholds, design, w.used)
            w.looks.append(look)
            regressed = [m for m, v in look.metrics.items() if v["decision"] == "regression"]
            where = f"{n} launches a side (look {len(w.looks)}, {confidence_text(look.confidence)} interval)"
            if regressed:
                w.stop, w.next_arm = "regression", None
                w.reason = f"{', '.join(regressed)} decided a regression at {where}"
                left = [m for m, v in look.metrics.items() if v["decision"] == "inconclusive"]
                if left:  # one gated regression decides the exit code: the others are not waited for
                    w.reason += f"; {', '.join(left)} left inconclusive: one gated regression ends the A/B"
                return w
            if look.decided:
                w.stop, w.next_arm = "decided", None
                w.reason = f"every gated metric decided at {where}"
                return w
        # the side with fewer kept, then fewer run launches, else the last side (A B B A A B …)
        ka, kb = ((len(self._kept[s]), len(w.run[s])) for s in "AB")
        nxt = (self._last or "A") if ka == kb else ("A" if ka < kb else "B")
        if len(w.run[nxt]) >= design.max_launches:
            return _at_maximum(w, self.metrics, design)
        w.next_arm = nxt
        return w

    def feed(self, order: Sequence[tuple[str, str]]) -> Walk:
        """Take (side, label) pairs in the order they ran until the walk stops."""
        for side, label in order:
            if self.add(side, label).stop is not None:
                break
        return self.w


def _at_maximum(w: Walk, metrics: Sequence[str], design: Design, why: str = "") -> Walk:
    w.stop, w.next_arm = "maximum", None
    final = w.final
    w.undecided = (
        [m for m, v in final.metrics.items() if v["decision"] == "inconclusive"] if final else list(metrics)
    )
    why = why or f"maximum reached ({design.max_launches} launches run a side)"
    w.reason = f"{why} with {', '.join(w.undecided) or 'no metric'} still inconclusive"
    return w


def _inputs(
    values: Mapping[str, pd.DataFrame], metrics: Sequence[str], paired: bool = False, m: float = math.inf
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per side: label -> log launch medians (paired: B's from pair ratios), label -> slow-metric ms."""
    logmed, slow = {}, {}
    for side, v in values.items():
        med = log_medians(v, m).reindex(columns=list(metrics))
        logmed[side] = {str(k): row.to_numpy(float) for k, row in med.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1) & (v["index"] <= m)]
        slow[side] = {str(k): g["value"].to_numpy(float) for k, g in x.groupby("launch")}
    if paired and set(values) == {"A", "B"}:
        for j, metric in enumerate(metrics):
            # A keeps its launch median (paired_values' a is the same); B becomes a·(pair ratio)
            for pr in paired_values(values["A"], values["B"], metric).itertuples():
                label = f"B{pr.pair}"
                if label in logmed["B"]:
                    row = np.array(logmed["B"][label], dtype=float)  # a copy: pandas' may be read-only
                    row[j] = math.log(pr.b) if pr.b > 0 else math.nan
                    logmed["B"][label] = row
    return logmed, slow


def _order(a: Any, b: Any) -> list[tuple[str, str]]:
    """(side, label) in the order the launches ran (meta ``ab.order``), else interleaved A B B A …."""
    la, lb = ([str(x) for x in bd.launches["launch"]] if not bd.launches.empty else [] for bd in (a, b))
    recorded = (a.meta.get("ab") or {}).get("order") or []
    side = {x: "A" for x in la} | {x: "B" for x in lb}
    if recorded and set(la) | set(lb) <= set(recorded) and not set(la) & set(lb):
        return [(side[x], x) for x in recorded if x in side]
    seq = {"A": list(la), "B": list(lb)}
    return [(s, seq[s].pop(0)) for s in stats.interleaved_order(max(len(la), len(lb), 1)) if seq[s]]


def _walk_bundles(
    a: Any,
    b: Any,
    design: Design,
    gate: Gate,
) -> tuple[Walk, list[str], dict[str, pd.DataFrame]]:
    values = {"A": metric_values(a), "B": metric_values(b)}
    every = pd.concat([v["metric"] for v in values.values()]).unique()
    metrics = list(dict.fromkeys(gate.metrics)) if gate.metrics is not None else metric_order(every)
    logmed, slow = _inputs(values, metrics, design.paired)
    failed = [*launch_errors(a), *launch_errors(b)]
    thr = [float((gate.thresholds or {}).get(m, gate.threshold)) for m in metrics]
    return Walker(logmed, slow, metrics, thr, design, failed).feed(_order(a, b)), metrics, values


def decide_sequential(
    a: Any,
    b: Any,
    design: Design,
    gate: Gate = Gate(),
    undecided: str = "fail",
) -> Any:
    """Walk the two bundles' launches in the order they ran, then compare the last look's launches
    at its confidence; undecided gated metrics exit 1 unless ``undecided="pass"``. Returns an
    :class:`perfkit.ab.decide.AbResult` (``meta["sequential"]``: design, looks, stop, needs).
    Raises ValueError: ``undecided`` not in :data:`UNDECIDED`; a gate naming a metric not compared."""
    if undecided not in UNDECIDED:
        raise ValueError(f"undecided must be one of {', '.join(UNDECIDED)}, got {undecided!r}")
    w, metrics, values = _walk_bundles(a, b, design, gate)
    if w.stop is None:  # the recording ends first
        ran = ", ".join(f"{len(v)} of {s}" for s, v in w.run.items())
        _at_maximum(w, metrics, design, f"the recording ends ({ran} launches)")
    final = w.final
    if final is not None:
        keep, conf = final.launches, final.confidence
    else:
        keep = {s: [x for x in w.run[s] if x not in w.replaced.get(s, [])] for s in ("A", "B")}
        conf = design.look_confidence(design.min_launches)
    errors = [f"{k}: {v}" for bd in (a, b) for k, v in launch_errors(bd).items()]
    used = {s: v[v["launch"].isin([str(x) for x in keep[s]])] for s, v in values.items()}
    res = compare(
        used["A"], used["B"], gate.threshold, gate.thresholds, conf, len(errors), gate.metrics, design.paired
    )
    t = res.table.set_index("metric")
    left = [m for m in metrics if m in t.index and t.loc[m, "decision"] == "inconclusive"]
    needed = {m: None if pd.isna(n := t.loc[m, "launches_needed"]) else int(n) for m in left}
    if w.stop == "maximum" and res.exit_code == EXIT_OK and w.undecided and undecided == "fail":
        res.exit_code = EXIT_REGRESSION
    res.meta = {
        "slow_spells": jsonable(slow_spells(values, {"A": a, "B": b}).to_dict("records")),
        "ab": a.meta.get("ab") or b.meta.get("ab") or {},
        **gate.to_meta(),
        "launch_errors": errors,
        "sides": {
            side: {
                "path": str(bd.path) if bd.path else None,
                "launches": [str(x) for x in bd.launches["launch"]] if not bd.launches.empty else [],
                "spec": (bd.meta.get("params") or {}).get("spec"),
            }
            for side, bd in (("A", a), ("B", b))
        },
        "sequential": jsonable(
            {
                "design": design.to_dict(),
                **w.to_dict(),
                "launches_needed": needed,
                "undecided_rule": undecided,
                "metrics": metrics,
            }
        ),
    }
    return res


def run_sequential(
    specs: Mapping[str, Any],
    request: Any,
    warm: int,
    design: Design,
    out: Any,
    gate: Gate = Gate(),
    profile: Any = None,
) -> dict[str, Any]:
    """Run a live A/B of ``specs`` ({"A": EngineSpec, "B": EngineSpec}) until the procedure stops.
    Engine failures stay in the ``launches`` table (the decision exits 2). Returns {"A": bundle,
    "B": bundle}, saved under ``out/a`` and ``out/b``, their meta ``ab.sequential`` for ``--replay``."""
    from perfkit.ab.driver import run_arms

    def extend(bundles: dict[str, Any]) -> list[str]:
        if set(bundles) != {"A", "B"}:
            return []
        w, _, _ = _walk_bundles(bundles["A"], bundles["B"], design, gate)
        if w.stop is not None or not w.next_arm:
            return []
        if design.paired:  # a pair more, its first side alternating
            k = len(w.run["A"])
            return ["A", "B"] if k % 2 == 0 else ["B", "A"]
        return [w.next_arm]

    return run_arms(
        specs,
        request,
        design.min_launches,
        warm,
        out,
        extend=extend,
        # a replay without --gate-metrics or --threshold decides as the run did
        meta={"sequential": {**design.to_dict(), **gate.to_meta()}},
        profile=profile,
        paired=design.paired,
    )


def replay_pool(
    pool: Any,
    design: Design,
    metrics: Sequence[str] = ("DenoisingStage", "warm_e2e"),
    threshold: float = 0.01,
    sims: int = 2000,
    seed: int = 0,
    m: int | None = None,
) -> pd.DataFrame:
    """Replay the procedure ``sims`` times an arm and as many A/As on a recorded pool
    (docs/choosing-n-m.md, "How the replay resamples"). One row per experiment: ``kind``,
    ``target``, ``stop``, ``regressed``, ``caught``, ``launches`` (the larger side), ``looks``,
    ``max_launches``, ``slow_rule``. Raises ValueError: the pool is too small for a first look."""
    a = len(pool.launches("A"))
    cap = min([a // 2, *(len(pool.launches(arm)) for arm in pool.arms)])  # an A/A draws both sides from A
    if cap < design.min_launches:
        raise ValueError(
            f"{pool.path}: the pool replays at most {cap} launches a side ({a} of A: an A/A needs two "
            f"disjoint sides), fewer than the first look's {design.min_launches}"
        )
    design = replace(design, max_launches=min(design.max_launches, cap))
    m = int(m or pool.warm)
    mx = design.max_launches
    rng = np.random.default_rng(seed)
    arms = ["A", *pool.arms]
    logmed, slow = _inputs({arm: pool.values[arm] for arm in arms}, metrics, m=m)
    thresholds = [threshold] * len(metrics)
    rows = []
    a_labels = np.array(sorted(logmed["A"]))
    for kind in ["A/A", *pool.arms]:
        target = None if kind == "A/A" else pool.arms[kind]["target"]
        other = "A" if kind == "A/A" else kind
        b_labels = np.array(sorted(logmed[other]))
        lm, sl = ({"A": d["A"], "B": d[other]} for d in (logmed, slow))
        for _ in range(sims):
            pa = list(rng.permutation(a_labels))
            pb = pa[mx:] if kind == "A/A" else list(rng.permutation(b_labels))  # A/A: no launch on both
            seq = {"A": pa[:mx], "B": pb[:mx]}
            walker = Walker(lm, sl, metrics, thresholds, design)
            w = walker.w
            while w.stop is None:
                side = w.next_arm or "A"
                w = walker.add(side, str(seq[side][len(w.run[side])]))
            regressed = [
                k for k, v in (w.final.metrics if w.final else {}).items() if v["decision"] == "regression"
            ]
            rows.append(
                {
                    "kind": kind,
                    "target": target,
                    "stop": w.stop,
                    "regressed": ",".join(regressed) if w.stop == "regression" else "",
                    "caught": bool(target and w.stop == "regression" and target in regressed),
                    "launches": max(len(v) for v in w.run.values()),
                    "looks": len(w.looks),
                    "max_launches": mx,
                    "slow_rule": design.slow_rule,
                }
            )
    return pd.DataFrame(rows)


def replay_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per ``kind`` of :func:`replay_pool`'s rows: ``experiments``, the fractions stopped at
    ``regression``/``decided``/``undecided`` and ``caught``, launches a side (median, p90, max)."""
    out = []
    for kind, g in runs.groupby("kind", sort=False):
        out.append(
            {
                "kind": kind,
                "target": g["target"].iloc[0],
                "experiments": len(g),
                "regression": float((g["stop"] == "regression").mean()),
                "caught": float(g["caught"].mean()) if kind != "A/A" else math.nan,
                "decided": float((g["stop"] == "decided").mean()),
                "undecided": float((g["stop"] == "maximum").mean()),
                "median_launches": float(g["launches"].median()),
                "p90_launches": float(g["launches"].quantile(0.9)),
                "max_used": int(g["launches"].max()),
                "max_launches": int(g["max_launches"].iloc[0]),
            }
        )
    return pd.DataFrame(out)
