"""The sequential procedure of ``perfkit ab``: launch until every gated metric is decided.

After ``min_launches`` a side the run is *looked at*; while a gated metric is still
"inconclusive" (:func:`perfkit.ab.stats.decide`) another interleaved pair of launches runs and
the run is looked at again, up to ``max_launches`` launches a side. It stops at the first look
where every gated metric is decided (regression, improvement or no change at its threshold), or
where a gated metric is a regression (the exit code is then known), or at the maximum:
**undecided**, which exits 1 unless the user opts out (``--undecided pass``).

**Why the false-alarm rate holds under repeated looks: alpha spending.** Looking at a 95 %
interval after every pair and stopping at the first regression would cry wolf far more often
than 2.5 %. Each look ``n`` (launches a side) instead gets its own share of the error rate
α = 1 − confidence from a Lan–DeMets spending function of the information fraction
``t = n / max_launches`` (Lan & DeMets, Biometrika 1983; Jennison & Turnbull, *Group Sequential
Methods*, 2000, ch. 7):

- ``pocock`` (default): α(t) = α · ln(1 + (e − 1) t): much of α at the first looks, so a change
  several times the noise stops early (launches are the expensive unit: ~40 s on an H200);
- ``obrien-fleming``: α(t) = 2 − 2 Φ(z_{1−α/2} / √t): almost nothing early, nearly the full
  α at the last look (fewer early stops, a narrower last interval).

Look ``n`` builds the usual Welch t interval on launch medians (:func:`perfkit.ab.stats.ratio_interval`)
for each of the K gated metrics at confidence ``1 − (α(t_n) − α(t_{n−1})) / K``. The shares add up
to α, so by the union bound the chance that *any* look's interval of *any* gated metric misses its
true ratio is at most α whatever the correlation between looks and metrics, and the chance that an
A/A exits 1 as a regression at most α/2 (2.5 % at the default 95 %; the recorded pools measure
0–0.7 %, ``docs/choosing-n-m.md``). This is conservative next to exact group-sequential boundaries, which have no closed
form for Welch t at 2–10 launches a side; an always-valid confidence sequence (Howard et al.,
2021) needs a variance bound or many samples to be that tight at a handful of launches. With
``min_launches == max_launches`` there is one look at the nominal confidence: the fixed-N A/B.

**Slow spells** (``slow_rule``): a launch with at least half of its warm DenoisingStage requests
above 1.05 × its side's quiet level (:func:`perfkit.ab.power.slow_launches`, the detector of
:func:`perfkit.ab.power.slow_spells`) ran its median in a host slow spell. With ``replace``
(default) it is left out of the intervals and another launch of its side runs instead; it still
counts against ``max_launches`` (launches *run* a side). A spell is an exception: when half or
more of a side's launches are marked, that is the host's state, nothing is replaced and the
result says so. With ``keep`` every launch counts. The marking looks at each side against its
own quiet level, so under A/A both sides lose launches alike (``benchmarks/ab_power.py`` shows
the A/A rates with both rules).

Units: ratios and confidences are fractions; launches are counts a side.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit.ab import stats
from perfkit.ab.power import slow_launches

__all__ = [
    "Design",
    "Look",
    "Walk",
    "walk",
    "Walker",
    "end_of_recording",
    "spent_alpha",
    "SPENDINGS",
    "SLOW_RULES",
    "UNDECIDED",
    "DEFAULT_MIN_LAUNCHES",
    "DEFAULT_MAX_LAUNCHES",
    "SLOW_METRIC",
    "pool_design",
    "replay_pool",
    "replay_summary",
    "decide_sequential",
    "run_sequential",
    "gated_metrics",
]

#: alpha-spending functions (module doc)
SPENDINGS = ("pocock", "obrien-fleming")
#: what happens to a launch run in a slow spell (module doc)
SLOW_RULES = ("replace", "keep")
#: ``--undecided``: ``fail`` (exit 1) or ``pass`` (exit 0, said in the summary)
UNDECIDED = ("fail", "pass")
DEFAULT_MIN_LAUNCHES = 3
DEFAULT_MAX_LAUNCHES = 10
#: the metric whose warm requests mark slow spells (as :func:`perfkit.ab.power.slow_spells`)
SLOW_METRIC = "DenoisingStage"


def spent_alpha(fraction: float, alpha: float, spending: str = "pocock") -> float:
    """The error rate spent up to information fraction ``fraction`` (0..1) of a total ``alpha``
    (two-sided), by the Lan–DeMets ``pocock`` or ``obrien-fleming`` function (module doc).

    Raises:
        ValueError: an unknown ``spending``.
    """
    t = min(max(float(fraction), 0.0), 1.0)
    if spending not in SPENDINGS:
        raise ValueError(f"spending must be one of {', '.join(SPENDINGS)}, got {spending!r}")
    if t <= 0.0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * t)
    from scipy.stats import norm  # imported here: the CLI starts without scipy

    return float(2.0 * norm.sf(norm.isf(alpha / 2.0) / math.sqrt(t)))


@dataclass(frozen=True)
class Design:
    """How a sequential A/B runs and decides.

    Attributes:
        min_launches: launches a side at the first look (>= 2: an interval needs 2).
        max_launches: launches run a side at most (replacements count), >= min_launches.
        confidence: overall two-sided confidence over all looks and gated metrics (α = 1 − confidence).
        spending: the alpha-spending function (:data:`SPENDINGS`).
        slow_rule: launches in a slow spell: ``replace`` or ``keep`` (:data:`SLOW_RULES`).

    Raises:
        ValueError: any of the above out of range (the field is named).
    """

    min_launches: int = DEFAULT_MIN_LAUNCHES
    max_launches: int = DEFAULT_MAX_LAUNCHES
    confidence: float = stats.DEFAULT_CONFIDENCE
    spending: str = "pocock"
    slow_rule: str = "replace"

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

    def look_confidence(self, n: int) -> float:
        """The two-sided confidence of the look with ``n`` launches a side:
        1 − (α(n / max) − α((n − 1) / max)), the first look (``min_launches``) spending α(min / max);
        each of K gated metrics then gets 1 − (that share) / K (:class:`Walker`)."""
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
        keys = ("min_launches", "max_launches", "confidence", "spending", "slow_rule")
        return cls(**{k: d[k] for k in keys if k in d})


@dataclass
class Look:
    """One look: ``n`` launches a side (the first ``n`` kept launches of each), the interval's
    confidence, the launches used and per gated metric ``ratio, low, high, decision`` (B/A)."""

    n: int
    confidence: float
    launches: dict[str, list[str]]
    metrics: dict[str, dict[str, Any]]
    decided: bool
    position: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready apart from NaN)."""
        return asdict(self)


@dataclass
class Walk:
    """Where the procedure stands after the launches run so far.

    Attributes:
        looks: the looks taken, in order.
        stop: why it stopped (``decided``, ``regression``, ``maximum``, ``failed``), or None:
            keep launching.
        next_arm: the side to launch next ("A"/"B") while ``stop`` is None.
        used: launches of the order the procedure read (a replay may hold more).
        run: side -> launches run (labels, in order) within ``used``.
        replaced: side -> launches left out as run in a slow spell.
        spell_kept: sides whose slow launches were kept (half or more marked: the host's state).
        undecided: gated metrics still inconclusive when it stopped at the maximum.
        reason: the stop in words.
    """

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
    """Per side the launches kept (in order), those replaced, and the sides whose marked launches
    were kept because half or more were marked."""
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
    # the look's share of α, split evenly over the gated metrics (Bonferroni): the exit code reads
    # any of them, so its false-alarm rate, not each metric's, is what the spending bounds
    conf = 1.0 - (1.0 - design.look_confidence(n)) / max(1, len(metrics))
    use = {s: kept[s][:n] for s in ("A", "B")}
    none = np.full(len(metrics), np.nan)  # a launch without any value: not measured there
    xa = np.array([logmed["A"].get(x, none) for x in use["A"]], dtype=float).reshape(n, len(metrics))
    xb = np.array([logmed["B"].get(x, none) for x in use["B"]], dtype=float).reshape(n, len(metrics))
    out: dict[str, dict[str, Any]] = {}
    for k, metric in enumerate(metrics):
        iv = stats.ratio_interval(np.exp(xa[:, k]), np.exp(xb[:, k]), conf)
        out[metric] = {
            "ratio": iv.ratio,
            "low": iv.low,
            "high": iv.high,
            "decision": stats.decide(iv, thresholds[k]),
        }
    decided = all(m["decision"] != "inconclusive" for m in out.values())
    return Look(n, conf, use, out, decided, position)


def _next_arm(run: Mapping[str, list[str]], kept: Mapping[str, list[str]], last: str | None) -> str:
    """The side with fewer kept launches; a tie: fewer run; a tie again: the side that ran last
    (so that without replacements the order is A B B A A B …, :func:`perfkit.ab.stats.interleaved_order`)."""
    ka, kb = len(kept["A"]), len(kept["B"])
    if ka != kb:
        return "A" if ka < kb else "B"
    ra, rb = len(run["A"]), len(run["B"])
    if ra != rb:
        return "A" if ra < rb else "B"
    return last or "A"


class Walker:
    """The procedure, one launch at a time (:func:`walk` feeds a whole order): after each launch,
    replace slow-spell launches, look when both sides have a new ``n`` ≥ ``min_launches`` kept
    launches, stop as the module doc says. Arguments as :func:`walk`'s; ``logmed`` and ``slow``
    may grow between calls of :meth:`add` (a live run adds each launch's values as it ends)."""

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
            where = f"{n} launches a side (look {len(w.looks)}, {look.confidence:.2%} interval)"
            if regressed:
                w.stop, w.next_arm = "regression", None
                w.reason = f"{', '.join(regressed)} decided a regression at {where}"
                return w
            if look.decided:
                w.stop, w.next_arm = "decided", None
                w.reason = f"every gated metric decided at {where}"
                return w
        nxt = _next_arm(w.run, self._kept, self._last)
        if len(w.run[nxt]) >= design.max_launches:
            return _at_maximum(w, self.metrics, design)
        w.next_arm = nxt
        return w


def walk(
    order: Sequence[tuple[str, str]],
    logmed: Mapping[str, Mapping[str, np.ndarray]],
    slow: Mapping[str, Mapping[str, np.ndarray]],
    metrics: Sequence[str],
    thresholds: Sequence[float],
    design: Design,
    failed: Sequence[str] = (),
) -> Walk:
    """Run the procedure over the launches in ``order`` (a live run so far, or a recorded one).

    Args:
        order: (side, launch label) in the order they ran; sides "A" and "B".
        logmed: side -> label -> log launch medians of ``metrics`` (an array, NaN: not measured).
        slow: side -> label -> the launch's warm :data:`SLOW_METRIC` times (ms; empty: none).
        metrics: the gated metrics; thresholds: each one's threshold (fraction).
        design: :class:`Design`.
        failed: labels of failed launches: the walk stops (``failed``) at the first.

    Returns:
        :class:`Walk`; with ``stop`` None the caller runs ``next_arm`` (or, replaying, the
        recording ends: the caller calls that undecided, :func:`end_of_recording`).
    """
    walker = Walker(logmed, slow, metrics, thresholds, design, failed)
    for side, label in order:
        if walker.add(side, label).stop is not None:
            break
    return walker.w


def end_of_recording(w: Walk, metrics: Sequence[str], design: Design) -> Walk:
    """A replayed recording that ends before the procedure stopped: undecided, as at the maximum
    (the recording's launches a side are its maximum)."""
    if w.stop is None:
        _at_maximum(w, metrics, design)
        w.reason = w.reason.replace(
            f"maximum reached ({design.max_launches} launches run a side)",
            f"the recording ends ({', '.join(f'{len(v)} of {s}' for s, v in w.run.items())} launches)",
        )
    return w


def _at_maximum(w: Walk, metrics: Sequence[str], design: Design) -> Walk:
    """Stop ``w`` at the maximum: the gated metrics still inconclusive are undecided."""
    w.stop, w.next_arm = "maximum", None
    final = w.final
    w.undecided = (
        [m for m, v in final.metrics.items() if v["decision"] == "inconclusive"] if final else list(metrics)
    )
    w.reason = (
        f"maximum reached ({design.max_launches} launches run a side) with "
        f"{', '.join(w.undecided) or 'no metric'} still inconclusive"
    )
    return w


def _pool_arrays(
    pool: Any, arms: Sequence[str], metrics: Sequence[str], m: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per arm: label -> log launch medians of ``metrics`` over the first ``m`` warm requests
    (:func:`perfkit.ab.power.log_medians`, as the live decision reads them), and label -> its
    warm :data:`SLOW_METRIC` times (ms)."""
    from perfkit.ab.power import log_medians

    logmed, slow = {}, {}
    for arm in arms:
        v = pool.values[arm]
        med = log_medians(v, m).reindex(columns=list(metrics))
        logmed[arm] = {str(k): row.to_numpy(float) for k, row in med.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1) & (v["index"] <= m)]
        slow[arm] = {str(k): g["value"].to_numpy(float) for k, g in x.groupby("launch")}
    return logmed, slow


def pool_design(pool: Any, design: Design) -> Design:
    """``design`` with its maximum cut to what the pool can replay: at most half of A's launches
    (an A/A draws both sides from A, without sharing) and every arm's launches."""
    a = len(pool.launches("A"))
    cap = min([a // 2, *(len(pool.launches(arm)) for arm in pool.arms)])
    if cap < design.min_launches:
        raise ValueError(
            f"{pool.path}: the pool replays at most {cap} launches a side ({a} of A: an A/A needs two "
            f"disjoint sides), fewer than the first look's {design.min_launches}"
        )
    return Design(
        design.min_launches,
        min(design.max_launches, cap),
        design.confidence,
        design.spending,
        design.slow_rule,
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
    """Replay the procedure on a recorded pool (:func:`perfkit.ab.power.load_pool`): ``sims``
    experiments an arm and as many A/As.

    Each experiment draws, without replacement, a random order of launches for each side from
    the pool (an A/A: a random order of A's launches, the first ``max`` launches side A and the
    next ``max`` side B, so no launch is on both sides; an arm: a random order of A's launches
    and one of the arm's) and feeds them to a :class:`Walker` one at a time in the order the
    procedure asks for (interleaved, replacements of slow-spell launches included). Draws
    share launches, so the rates describe the pool, not independent occasions.

    Args:
        design: its ``max_launches`` is cut by :func:`pool_design` (at most the pool's launches).
        metrics: the gated metrics; threshold: theirs (fraction).
        m: warm requests a launch used (default the pool's).

    Returns:
        One row per experiment: ``kind`` ("A/A" or the arm), ``target`` (the arm's metric;
        None for A/A), ``stop`` (``regression``, ``decided``, ``maximum``), ``regressed`` (the
        metrics called a regression, comma-separated), ``caught`` (the target called a
        regression), ``launches`` (launches run a side, the larger side), ``looks``,
        ``max_launches``, ``slow_rule``.

    Raises:
        ValueError: the pool is too small for a first look (:func:`pool_design`).
    """
    design = pool_design(pool, design)
    m = int(m or pool.warm)
    mx = design.max_launches
    rng = np.random.default_rng(seed)
    arms = ["A", *pool.arms]
    logmed, slow = _pool_arrays(pool, arms, metrics, m)
    thresholds = [threshold] * len(metrics)
    rows = []
    a_labels = np.array(sorted(logmed["A"]))
    for kind in ["A/A", *pool.arms]:
        target = None if kind == "A/A" else pool.arms[kind].get("target", SLOW_METRIC)
        other = "A" if kind == "A/A" else kind
        b_labels = np.array(sorted(logmed[other]))
        lm = {"A": logmed["A"], "B": logmed[other]}
        sl = {"A": slow["A"], "B": slow[other]}
        for _ in range(sims):
            pa = list(rng.permutation(a_labels))
            if kind == "A/A":
                seq = {"A": pa[:mx], "B": pa[mx : 2 * mx]}
            else:
                seq = {"A": pa[:mx], "B": list(rng.permutation(b_labels))[:mx]}
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
    """Per ``kind`` of :func:`replay_pool`'s rows: ``experiments``; ``regression`` (stopped on a
    gated regression: exit 1), ``caught`` (the arm's target metric called a regression),
    ``decided`` (stopped with every gated metric decided, no regression: exit 0),
    ``undecided`` (at the maximum: exit 1 unless ``--undecided pass``), fractions; launches run a
    side: ``median_launches``, ``p90_launches``, ``max_used`` and ``max_launches``."""
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


def _inputs(
    values: Mapping[str, pd.DataFrame], metrics: Sequence[str]
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per side: label -> log launch medians of ``metrics`` (:func:`perfkit.ab.metrics.launch_means`,
    the values the decision's intervals use) and label -> warm :data:`SLOW_METRIC` times."""
    from perfkit.ab.metrics import launch_means

    logmed, slow = {}, {}
    for side, v in values.items():
        lm = launch_means(v)
        wide = lm.pivot_table(index="launch", columns="metric", values="value", aggfunc="first")
        wide = np.log(wide.reindex(columns=list(metrics)).astype(float))
        logmed[side] = {str(k): row.to_numpy(float) for k, row in wide.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1)]
        slow[side] = {str(k): g["value"].to_numpy(float) for k, g in x.groupby("launch")}
    return logmed, slow


def gated_metrics(values: Mapping[str, pd.DataFrame], gate: Sequence[str] | None) -> list[str]:
    """The metrics the procedure waits for: ``gate``, or every metric either side measured."""
    from perfkit.ab.metrics import metric_order

    if gate is not None:
        return list(dict.fromkeys(gate))
    return metric_order(pd.concat([v["metric"] for v in values.values()]).unique())


def _thresholds(
    metrics: Sequence[str], threshold: float, thresholds: Mapping[str, float] | None
) -> list[float]:
    return [float((thresholds or {}).get(m, threshold)) for m in metrics]


def _failed_labels(bundle: Any) -> list[str]:
    la = bundle.launches
    if la.empty or "error" not in la:
        return []
    return [str(x) for x in la.loc[la["error"].notna(), "launch"]]


def _order(a: Any, b: Any) -> list[tuple[str, str]]:
    """(side, label) in the order the two bundles' launches ran (their meta ``ab.order``), else
    interleaved A B B A … over each side's launches in label order."""
    la = [str(x) for x in a.launches["launch"]] if not a.launches.empty else []
    lb = [str(x) for x in b.launches["launch"]] if not b.launches.empty else []
    recorded = (a.meta.get("ab") or {}).get("order") or []
    side = {x: "A" for x in la} | {x: "B" for x in lb}
    if recorded and set(la) | set(lb) <= set(recorded) and not set(la) & set(lb):
        return [(side[x], x) for x in recorded if x in side]
    out, seq = [], {"A": list(la), "B": list(lb)}
    for s in stats.interleaved_order(max(len(la), len(lb), 1)):
        if seq[s]:
            out.append((s, seq[s].pop(0)))
    return out


def decide_sequential(
    a: Any,
    b: Any,
    design: Design,
    threshold: float = stats.DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    gate: Sequence[str] | None = None,
    undecided: str = "fail",
    order: Sequence[tuple[str, str]] | None = None,
) -> Any:
    """Decide two sides' bundles (live or recorded) by the procedure: walk their launches in the
    order they ran (:func:`walk`; a recording that ends first is undecided), then the full
    comparison (:func:`perfkit.ab.decide.compare_bundles`) of the last look's launches at its
    confidence. Undecided gated metrics make the exit code 1 unless ``undecided="pass"``.

    Returns:
        :class:`perfkit.ab.decide.AbResult` whose ``meta["sequential"]`` holds the design, the
        looks (launches, confidence, each gated metric's interval and decision), why it
        stopped, the launches run and replaced, the undecided metrics, the launches a side each
        would need, and ``undecided_rule``.

    Raises:
        ValueError: ``undecided`` not in :data:`UNDECIDED`; a gate naming a metric not compared
            (as :func:`perfkit.ab.decide.compare`).
    """
    from perfkit.ab.decide import compare_bundles
    from perfkit.ab.metrics import metric_values
    from perfkit.gate.verdicts import EXIT_OK, EXIT_REGRESSION, jsonable

    if undecided not in UNDECIDED:
        raise ValueError(f"undecided must be one of {', '.join(UNDECIDED)}, got {undecided!r}")
    values = {"A": metric_values(a), "B": metric_values(b)}
    metrics = gated_metrics(values, gate)
    logmed, slow = _inputs(values, metrics)
    failed = _failed_labels(a) + _failed_labels(b)
    seq = list(order) if order is not None else _order(a, b)
    w = walk(seq, logmed, slow, metrics, _thresholds(metrics, threshold, thresholds), design, failed)
    if w.stop is None:
        end_of_recording(w, metrics, design)
    final = w.final
    if final is not None:
        keep, conf = final.launches, final.confidence
    else:
        keep = {s: [x for x in w.run[s] if x not in w.replaced.get(s, [])] for s in ("A", "B")}
        conf = design.look_confidence(design.min_launches)
    res = compare_bundles(a, b, threshold, thresholds, conf, gate=gate, keep=keep)
    needed = {}
    if w.stop == "maximum":
        t = res.table.set_index("metric")
        for m in w.undecided:
            v = t["launches_needed"].get(m) if m in t.index else None
            needed[m] = None if v is None or pd.isna(v) else int(v)
        if res.exit_code == EXIT_OK and w.undecided and undecided == "fail":
            res.exit_code = EXIT_REGRESSION
    res.meta["sequential"] = jsonable(
        {
            "design": design.to_dict(),
            **w.to_dict(),
            "launches_needed": needed,
            "undecided_rule": undecided,
            "metrics": metrics,
        }
    )
    return res


def run_sequential(
    plan: Any,
    design: Design,
    out: Any,
    threshold: float = stats.DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    gate: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run a live A/B (a :class:`perfkit.ab.driver.AbPlan`; its ``launches`` is not read) by the
    procedure: ``design.min_launches`` a side interleaved (:func:`perfkit.ab.driver.run_arms`),
    then after each launch the one the procedure asks for (:func:`walk` over what ran, with the
    same gate and thresholds as the decision after it), until it stops.

    Returns:
        {"A": bundle, "B": bundle} (saved under ``out/a`` and ``out/b``); their meta ``ab``
        holds ``sequential`` (the design and ``gate_metrics``), which ``--replay`` reads back.
    """
    from perfkit.ab.driver import run_arms
    from perfkit.ab.metrics import metric_values

    def extend(bundles: dict[str, Any]) -> list[str]:
        if set(bundles) != {"A", "B"}:
            return []
        values = {"A": metric_values(bundles["A"]), "B": metric_values(bundles["B"])}
        metrics = gated_metrics(values, gate)
        logmed, slow = _inputs(values, metrics)
        failed = _failed_labels(bundles["A"]) + _failed_labels(bundles["B"])
        thr = _thresholds(metrics, threshold, thresholds)
        w = walk(_order(bundles["A"], bundles["B"]), logmed, slow, metrics, thr, design, failed)
        return [w.next_arm] if w.stop is None and w.next_arm else []

    return run_arms(
        {"A": plan.spec_a, "B": plan.spec_b},
        plan.request,
        design.min_launches,
        plan.warm,
        out,
        request_timeout_s=plan.request_timeout_s,
        extend=extend,
        # the gated metrics and thresholds with the design: a replay without --gate-metrics or
        # --threshold splits alpha and decides as the run did
        meta={
            "sequential": {
                **design.to_dict(),
                "gate_metrics": list(gate) if gate else None,
                "threshold": threshold,
                "thresholds": dict(thresholds or {}),
            }
        },
        profile=plan.profile,
    )
