"""The sequential procedure itself (the method: docs/choosing-n-m.md): the design
(:class:`Design`), alpha spending (:func:`spent_alpha`), one look (:class:`Look`), and the walk
over launches a side until decided, undecided or at the maximum (:class:`Walker`, :class:`Walk`).
Ratios and confidences are fractions; launches are counts a side.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from perfkit import stats
from perfkit.ab.pool import slow_launches
from perfkit.common.numfmt import confidence_text

#: alpha-spending functions (docs/choosing-n-m.md)
SPENDINGS = ("pocock", "obrien-fleming")
#: what happens to a launch run in a slow spell
SLOW_RULES = ("replace", "keep")
#: ``--undecided``: ``fail`` (exit 1) or ``pass`` (exit 0, said in the summary)
UNDECIDED = ("fail", "pass")
DEFAULT_MIN_LAUNCHES = 3
DEFAULT_MAX_LAUNCHES = 10
#: the metric whose warm requests mark slow spells (as :func:`perfkit.ab.pool.slow_spells`)
SLOW_METRIC = "DenoisingStage"


def spent_alpha(fraction: float, alpha: float, spending: str = "pocock") -> float:
    """The error rate spent up to information fraction ``fraction`` (0..1) of a total ``alpha``
    (two-sided), by the Lan–DeMets ``pocock`` or ``obrien-fleming`` function (docs/choosing-n-m.md).

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
        paired: launch ``i`` of A ran beside launch ``i`` of B (``perfkit ab --paired``): paired t
            intervals (:func:`perfkit.stats.paired_ratio_interval`), no launch replaced
            (``slow_rule`` must be ``keep``).

    Raises:
        ValueError: any of the above out of range (the field is named).
    """

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
        keys = ("min_launches", "max_launches", "confidence", "spending", "slow_rule", "paired")
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
    # paired: kept == run (nothing replaced): launch i of A is the pair of B's
    interval = stats.paired_ratio_interval if design.paired else stats.ratio_interval
    for k, metric in enumerate(metrics):
        iv = interval(np.exp(xa[:, k]), np.exp(xb[:, k]), conf)
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
    (so that without replacements the order is A B B A A B …, :func:`perfkit.stats.interleaved_order`)."""
    ka, kb = len(kept["A"]), len(kept["B"])
    if ka != kb:
        return "A" if ka < kb else "B"
    ra, rb = len(run["A"]), len(run["B"])
    if ra != rb:
        return "A" if ra < rb else "B"
    return last or "A"


class Walker:
    """The procedure, one launch at a time (:meth:`add`; :meth:`feed` a whole order): after each
    launch, replace slow-spell launches, look when both sides have a new ``n`` ≥ ``min_launches``
    kept launches, stop at a regression, with every gated metric decided, or at the maximum.
    ``logmed`` and ``slow`` may grow between calls of :meth:`add` (a live run adds each launch's
    values as it ends).

    Args:
        logmed: side -> label -> log launch medians of ``metrics`` (an array, NaN: not measured).
        slow: side -> label -> the launch's warm :data:`SLOW_METRIC` times (ms; empty: none).
        metrics: the gated metrics; thresholds: each one's threshold (fraction).
        design: :class:`Design`.
        failed: labels of failed launches: the walk stops (``failed``) at the first.
    """

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
        nxt = _next_arm(w.run, self._kept, self._last)
        if len(w.run[nxt]) >= design.max_launches:
            return _at_maximum(w, self.metrics, design)
        w.next_arm = nxt
        return w

    def feed(self, order: Sequence[tuple[str, str]]) -> Walk:
        """Take the launches in ``order`` ((side "A"/"B", launch label) in the order they ran: a
        live run so far, or a recorded one) until the walk stops; with ``stop`` None the caller
        runs ``next_arm`` (or, replaying, the recording ends: :func:`end_of_recording`)."""
        for side, label in order:
            if self.add(side, label).stop is not None:
                break
        return self.w


def end_of_recording(w: Walk, metrics: Sequence[str], design: Design) -> Walk:
    """A replayed recording that ends before the procedure stopped: undecided, as at the maximum
    (the recording's launches a side are its maximum)."""
    if w.stop is None:
        ran = ", ".join(f"{len(v)} of {s}" for s, v in w.run.items())
        _at_maximum(w, metrics, design, f"the recording ends ({ran} launches)")
    return w


def _at_maximum(w: Walk, metrics: Sequence[str], design: Design, why: str = "") -> Walk:
    """Stop ``w`` at the maximum (``why``: the reason's start; default: the maximum reached):
    the gated metrics still inconclusive are undecided."""
    w.stop, w.next_arm = "maximum", None
    final = w.final
    w.undecided = (
        [m for m, v in final.metrics.items() if v["decision"] == "inconclusive"] if final else list(metrics)
    )
    why = why or f"maximum reached ({design.max_launches} launches run a side)"
    w.reason = f"{why} with {', '.join(w.undecided) or 'no metric'} still inconclusive"
    return w
