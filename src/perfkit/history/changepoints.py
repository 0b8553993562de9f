"""Change points (Apache Otava's E-Divisive), outliers and gaps of one series, and events across
series. The rules, their sources and limits: docs/history.md ("Change points", "Gate")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd
from scipy import stats as sps

from perfkit import stats
from perfkit.common import require_extra
from perfkit.common.numfmt import json_float, number_text


@dataclass(frozen=True)
class Settings:
    """Detection settings, unitless (docs/history.md, "Change points", "Gate"): a step's p and
    relative size, Otava's window, an outlier's distance (robust sd, relative), runs a level needs,
    two modes' gap (pooled sd) and least share, the largest step a gated level may hide, the robust
    sd's trim, the gate's least half width (sglang's nightly: 5 %), runs in a row for a regression."""

    max_pvalue: float = 0.001
    min_magnitude: float = 0.02
    window_len: int = 30
    outlier_sigmas: float = 6.0
    outlier_min: float = 0.05
    confidence: float = 0.95
    min_segment: int = 3
    mode_gap: float = 3.0
    min_mode_share: float = 0.2
    max_step: float = 0.5
    robust_from: int = 10
    trim_sigmas: float = 4.0
    min_step: float = 0.05
    confirm_runs: int = 2


@dataclass(frozen=True)
class Point:
    """One run's value of a series; ``value`` None is a gap."""

    run_key: str
    run_id: str
    commit: str
    time: datetime
    value: float | None
    error: str | None = None


@dataclass
class Step:
    """One change point between ``before`` and ``after`` (first run of the new level); ``ratio``
    mean after / before, ``low``/``high`` None below 2 runs a side."""

    index: int
    before: Point
    after: Point
    between: list[Point]
    mean_before: float
    mean_after: float
    ratio: float
    low: float | None
    high: float | None
    kind: str  # "regression" | "improvement"
    n_before: int
    n_after: int

    @property
    def change_pct(self) -> float:
        """The step's change in percent (+: the value rose)."""
        return (self.ratio - 1.0) * 100.0


@dataclass
class Analysis:
    """A series' points (time order) and what was found in them."""

    hardware: str
    case_id: str
    metric: str
    unit: str
    points: list[Point]
    steps: list[Step] = field(default_factory=list)
    outliers: list[tuple[Point, float]] = field(default_factory=list)  # (point, ratio to neighbours)
    gaps: list[Point] = field(default_factory=list)
    noise: float = math.nan  # robust relative run-to-run noise (log units ~ fraction)

    def level(self, settings: Settings | None = None) -> Level | None:
        """The current level's model (:func:`level_model` of :meth:`segment_values`)."""
        return level_model(self.segment_values(), settings or Settings())

    def segment_values(self) -> list[float]:
        """Values of the current level: kept runs since the last step (outliers and gaps out)."""
        bad = {p.run_key for p, _ in self.outliers} | {p.run_key for p in self.gaps}
        start = self.steps[-1].after.time if self.steps else None
        return [
            float(p.value)
            for p in self.points
            if p.run_key not in bad and p.value is not None and (start is None or p.time >= start)
        ]


def higher_is_worse(metric: str) -> bool:
    """False for rates (names ending in ``qps``, ``throughput``, ``attainment``, ``_rate``)."""
    m = metric.lower()
    return not m.endswith(("qps", "throughput", "attainment", "_rate"))


@dataclass(frozen=True)
class Mode:
    """One mode of a level: geometric mean, next run's prediction interval (values' unit), runs."""

    mean: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Level:
    """A level as the gate sees it: one mode or two; ``noise`` their pooled sd of log values."""

    modes: tuple[Mode, ...]
    noise: float
    n: int

    @property
    def step(self) -> float:
        """The smallest relative step the gate could see: a mode's interval half width."""
        return max(m.high / m.mean - 1 for m in self.modes)

    def text(self, unit: str = "") -> str:
        """The modes in words, e.g. ``two modes: 8.81 s (12 runs), 10.8 s (9 runs)``."""
        u = f" {unit}" if unit else ""
        ms = ", ".join(f"{number_text(m.mean)}{u} ({m.n} runs)" for m in self.modes)
        return f"two modes: {ms}" if len(self.modes) == 2 else f"one mode: {ms}"


def two_modes(y: np.ndarray, s: Settings) -> np.ndarray | None:
    """Labels (0 lower, 1 upper mode) of log values ``y`` when they alternate between two levels."""
    from scipy.cluster.vq import ClusterError, kmeans2

    n = y.size
    need = max(s.min_segment, math.ceil(s.min_mode_share * n))
    init = np.percentile(y, [10, 90]).reshape(2, 1)
    if n < 2 * need or not init[1, 0] > init[0, 0]:
        return None
    try:
        centres, lab = kmeans2(y.reshape(-1, 1), init, minit="matrix", missing="raise")
    except ClusterError:
        return None
    if centres[0, 0] > centres[1, 0]:
        lab = 1 - lab
    lo, hi = y[lab == 0], y[lab == 1]
    if min(lo.size, hi.size) < need or np.count_nonzero(np.diff(lab)) < s.min_segment:
        return None
    sp = math.sqrt((((lo - lo.mean()) ** 2).sum() + ((hi - hi.mean()) ** 2).sum()) / (n - 2))
    gap = float(hi.min() - lo.max())
    if gap <= s.mode_gap * sp or hi.mean() - lo.mean() <= math.log1p(s.min_magnitude):
        return None
    return lab


def level_model(values: Sequence[float], s: Settings = Settings()) -> Level | None:
    """One or two modes of ``values`` (None below ``min_segment``), each with a next run's
    prediction interval ``mean ± t(1 − max_pvalue/2, df) · sd · √(1 + 1/n)`` on log values."""
    y = np.log(np.asarray(values, dtype=float))
    if y.size < s.min_segment:
        return None
    lab = two_modes(y, s)
    groups = [y] if lab is None else [y[lab == 0], y[lab == 1]]
    sizes = [g.size for g in groups]
    if y.size >= s.robust_from:
        dev = [g - np.median(g) for g in groups]
        mad = float(sps.median_abs_deviation(np.concatenate(dev), scale="normal"))
        if mad > 0:
            kept = [g[np.abs(d) <= s.trim_sigmas * mad] for g, d in zip(groups, dev)]
            groups = [k if k.size >= s.min_segment else g for k, g in zip(kept, groups)]
    df = sum(g.size for g in groups) - len(groups)
    sd = math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / df)
    t = float(sps.t.ppf(1 - s.max_pvalue / 2, df))
    modes = []
    for g, k in zip(groups, sizes):
        m = float(g.mean())
        half = max(t * sd * math.sqrt(1 + 1 / g.size), math.log1p(s.min_step))
        modes.append(Mode(math.exp(m), math.exp(m - half), math.exp(m + half), int(k)))
    return Level(tuple(modes), sd, int(y.size))


def _outliers(y: np.ndarray, thr: float) -> list[tuple[int, float]]:
    """Points beyond ``thr`` (log units) from the medians of up to 3 values before and after."""
    ser = pd.Series(y)
    ml = ser.rolling(3, min_periods=1).median().shift(1).to_numpy()
    mr = ser[::-1].rolling(3, min_periods=1).median().shift(1)[::-1].to_numpy()
    dl, dr = y - ml, y - mr
    dev = np.minimum(np.abs(dl), np.abs(dr))
    with np.errstate(invalid="ignore"):
        hit = (dl * dr > 0) & (dev > thr) & (np.abs(ml - mr) < dev / 2)
    return [(int(i), math.exp(y[i] - (ml[i] + mr[i]) / 2)) for i in np.nonzero(hit)[0]]


def _step(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[float | None, float | None, float]:
    iv = stats.ratio_interval(a, b, confidence)
    return json_float(iv.low), json_float(iv.high), iv.pvalue


def _prune(vals: np.ndarray, idx: list[int], s: Settings) -> list[int]:
    """Drop change points, weakest first, until every level and step passes (docs/history.md)."""
    logv = np.log(vals)
    idx = list(idx)
    alpha = s.max_pvalue / max(1.0, vals.size / 100)
    while idx:
        b = [0, *idx, vals.size]
        short = [n for n in range(len(b) - 1) if b[n + 1] - b[n] < s.min_segment]
        if short:
            n = short[0]
            m = logv[b[n] : b[n + 1]].mean()
            if n == 0:
                drop = 0
            elif n == len(b) - 2:
                drop = len(idx) - 1
            else:
                left, right = logv[b[n - 1] : b[n]].mean(), logv[b[n + 1] : b[n + 2]].mean()
                drop = n - 1 if abs(m - left) <= abs(m - right) else n
            idx.pop(drop)
            continue
        weak = []
        for n in range(len(idx)):
            a, c = vals[b[n] : b[n + 1]], vals[b[n + 1] : b[n + 2]]
            lo, hi, p = _step(a, c, s.confidence)
            r = float(c.mean() / a.mean())
            if (lo is not None and lo <= 1.0 <= hi) or max(r, 1 / r) - 1 <= s.min_magnitude or not p < alpha:
                weak.append((p if math.isfinite(p) else 1.0, n))
        if not weak:
            break
        idx.pop(max(weak)[1])
    return idx


def _restore_modes(y: np.ndarray, bounds: list[tuple[int, int]], out: dict[int, float], s: Settings) -> None:
    """Drop from ``out`` the outliers inside a mode's interval of a two-mode level."""
    for a, b in bounds:
        seg, cands = y[a:b], [j for j in out if a <= j < b]
        if seg.size < 2 * s.min_segment or not cands:
            continue
        p10, p90 = np.percentile(seg, [10, 90])
        near = seg[np.abs(seg - (p10 + p90) / 2) <= 1.5 * (p90 - p10)]
        lv = level_model(np.exp(near), s)
        if lv is None or len(lv.modes) < 2:
            continue
        for j in cands:
            if any(m.low <= math.exp(y[j]) <= m.high for m in lv.modes):
                del out[j]


def analyse(
    points: Sequence[Point],
    *,
    hardware: str = "",
    case_id: str = "",
    metric: str = "",
    unit: str = "",
    settings: Settings = Settings(),
) -> Analysis:
    """Gaps, single-run outliers and steps of ``points`` (time order). Raises MissingExtra:
    apache-otava is not installed."""
    require_extra("history", "change points (perfkit.history)")
    from otava.analysis import compute_change_points

    pts = list(points)
    res = Analysis(hardware, case_id, metric, unit, pts)
    ok = [p.value is not None and math.isfinite(p.value) and p.value > 0 for p in pts]
    good = [i for i, k in enumerate(ok) if k]
    res.gaps = [p for p, k in zip(pts, ok) if not k]
    if not good:
        return res
    y = np.log(np.array([pts[i].value for i in good], dtype=float))
    d = np.diff(y)  # docs/history.md
    res.noise = (
        float(sps.median_abs_deviation(d, scale="normal") / math.sqrt(2.0)) if y.size >= 3 else math.nan
    )
    sigma = res.noise if math.isfinite(res.noise) else 0.0
    thr = max(settings.outlier_sigmas * sigma, math.log1p(settings.outlier_min))
    out = dict(_outliers(y, thr)) if y.size >= 3 else {}
    for attempt in range(3):  # pass 2: a run far from its own level
        kept_k = [k for k in range(len(good)) if k not in out]
        vals = np.array([pts[good[k]].value for k in kept_k], dtype=float)
        if vals.size < 4:
            res.outliers = [(pts[good[j]], r) for j, r in sorted(out.items())]
            return res
        cps, _ = compute_change_points(
            list(vals),
            window_len=settings.window_len,
            max_pvalue=settings.max_pvalue,
            min_magnitude=settings.min_magnitude,
        )
        idx = _prune(vals, sorted(int(c.index) for c in cps), settings)
        b = [0, *idx, vals.size]
        more = {}
        for n in range(len(b) - 1):
            seg = np.log(vals[b[n] : b[n + 1]])
            med = float(np.median(seg))
            for j in np.nonzero(np.abs(seg - med) > thr)[0]:
                if seg.size >= 2 * settings.min_segment and 0 < b[n] + int(j) < vals.size - 1:
                    more[kept_k[b[n] + int(j)]] = math.exp(seg[j] - med)
        if not more or attempt == 2:
            break
        out.update(more)
    starts = [0, *(kept_k[c] for c in idx)]
    bounds = list(zip(starts, [*starts[1:], len(good)]))
    _restore_modes(y, bounds, out, settings)
    res.outliers = [(pts[good[j]], r) for j, r in sorted(out.items())]
    levels = [[good[j] for j in range(a, b) if j not in out] for a, b in bounds]
    worse_up = higher_is_worse(metric)
    for n in range(len(idx)):
        ia, ib = levels[n], levels[n + 1]
        a = np.array([pts[i].value for i in ia], dtype=float)
        b = np.array([pts[i].value for i in ib], dtype=float)
        lo, hi, _ = _step(a, b, settings.confidence)
        ratio = float(b.mean() / a.mean())
        res.steps.append(
            Step(
                index=ib[0],
                before=pts[ia[-1]],
                after=pts[ib[0]],
                between=list(pts[ia[-1] + 1 : ib[0]]),
                mean_before=float(a.mean()),
                mean_after=float(b.mean()),
                ratio=ratio,
                low=lo,
                high=hi,
                kind="regression" if (ratio > 1) == worse_up else "improvement",
                n_before=int(a.size),
                n_after=int(b.size),
            )
        )
    return res


def analyse_frame(df: pd.DataFrame, settings: Settings = Settings()) -> list[Analysis]:
    """One :class:`Analysis` per hardware × case × metric of a store frame."""
    keys = ["hardware", "case_id", "metric"]
    return [
        analyse(frame_points(g), **dict(zip(keys, k)), unit=str(g["unit"].iloc[0]), settings=settings)
        for k, g in df.groupby(keys, sort=True)
    ]


def frame_points(g: pd.DataFrame) -> list[Point]:
    """One series' rows of a store frame as points, in time order (a NaN value: a gap)."""
    g = g.sort_values(["time", "run_key"])
    times = g["time"].dt.to_pydatetime() if hasattr(g["time"], "dt") else list(g["time"])
    values = g["value"].to_numpy(dtype=float, na_value=np.nan)
    errors = g["error"].tolist()
    return [
        Point(k, r, c, t, None if v != v else float(v), None if e is None or e != e else str(e))
        for k, r, c, t, v, e in zip(
            g["run_key"].tolist(), g["run_id"].tolist(), g["commit"].tolist(), times, values, errors
        )
    ]


@dataclass
class Event:
    """Steps of one hardware whose commit ranges overlap; ``before`` .. ``after`` the common range."""

    hardware: str
    before: Point
    after: Point
    members: list[tuple[Analysis, Step]]


def events(analyses: Sequence[Analysis]) -> list[Event]:
    """Steps grouped by hardware and overlapping commit range, by hardware then time."""
    out: list[Event] = []
    by_hw: dict[str, list[tuple[Analysis, Step]]] = {}
    for a in analyses:
        for s in a.steps:
            by_hw.setdefault(a.hardware, []).append((a, s))
    for hw in sorted(by_hw):
        items = sorted(by_hw[hw], key=lambda m: (m[1].after.time, m[1].before.time))
        while items:
            stab = items[0][1].after.time
            group = [m for m in items if m[1].before.time < stab <= m[1].after.time]
            items = [m for m in items if m not in group]
            before = max((m[1].before for m in group), key=lambda p: p.time)
            after = min((m[1].after for m in group), key=lambda p: p.time)
            out.append(Event(hw, before, after, group))
    return out


def last3_alarms(points: Sequence[Point], threshold: float = 0.05) -> list[tuple[Point, float]]:
    """sglang's nightly alarms: (run, value / mean − 1) for each run more than ``threshold`` above
    the mean of the 3 measured runs before it (sgl-project/ci-data-diffusion's dashboard)."""
    pts = [p for p in points if p.value is not None and math.isfinite(p.value) and p.value > 0]
    v = pd.Series([float(p.value) for p in pts], dtype=float)
    last3 = v.rolling(3).mean().shift(1)
    return [(p, x / m - 1) for p, x, m in zip(pts, v, last3) if x > m * (1 + threshold)]
