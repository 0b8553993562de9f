"""Run an A/B: balanced interleaved launches of two engine specs, a bundle per side.

Order ``A B B A A B …`` (:func:`perfkit.stats.interleaved_order`), N launches a side; each
launch is one :func:`perfkit.measuring.launch_rows.measure_launch` (fresh compile caches unless the
spec shares them): cold start, the cold request, then M warm requests of the same shape, with
per-stage and per-step times and memory; its launch row carries ``first_result_s`` (launch
until the first successful request ended, s; :func:`perfkit.measuring.launch_rows.first_result`).
The host's load averages (``os.getloadavg``) before each launch and at the end go into the
bundles' meta: the runner may be shared.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tqdm.std import tqdm  # a text bar, never a widget (perfkit.measuring.progress)

from perfkit.ab.paired import run_pair
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.owner import Watch, describe
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.assemble import assemble
from perfkit.measuring.launch_rows import LaunchData, measure_launch
from perfkit.measuring.profiled import ProfileParams, attach, run_profiled
from perfkit.stats import interleaved_order

log = logging.getLogger(__name__)

#: the ``scenario`` field of the sides' bundles
BUNDLE_NAME = "ab"


@dataclass(frozen=True)
class AbPlan:
    """What to run.

    Attributes:
        spec_a, spec_b: the two engines (the same one twice: an A/A check).
        request: the request shape (cold and warm requests alike).
        launches: N, launches a side (>= 1; 2 or more for an interval).
        warm: M, warm requests a launch after the cold request (>= 1).
        request_timeout_s: per request (s; None: each spec's ``request_timeout_s``, else
            :data:`~perfkit.engine.spec.DEFAULT_REQUEST_TIMEOUT_S`).
        profile: profile a cold and a warm request of each side in an extra launch after the
            measured ones (:mod:`perfkit.measuring.profiled`); None: nothing profiled.
    """

    spec_a: EngineSpec
    spec_b: EngineSpec
    request: VideoRequestSpec
    launches: int
    warm: int
    request_timeout_s: float | None = None
    profile: ProfileParams | None = None

    def __post_init__(self) -> None:
        if self.launches < 1:
            raise ValueError(f"launches a side must be >= 1, got {self.launches}")
        if self.warm < 1:
            raise ValueError(f"warm requests a launch must be >= 1, got {self.warm}")


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_ab(plan: AbPlan, out: str | Path, launches: int | None = None, **kw: Any) -> dict[str, ResultBundle]:
    """Run the plan's launches (``launches`` a side instead of ``plan.launches`` when given; ``kw``:
    :func:`run_arms`' ``extend``, ``meta``, ``paired``) in balanced interleaved order; save and
    return a bundle per side (``out/a``, ``out/b``; launch dirs under ``out/launches``).

    Never raises for engine failures: a failed launch keeps its error in the ``launches`` table
    (the decision then exits 2). Returns {"A": bundle, "B": bundle}.
    """
    n = plan.launches if launches is None else launches
    kw |= {"request_timeout_s": plan.request_timeout_s, "profile": plan.profile}
    return run_arms({"A": plan.spec_a, "B": plan.spec_b}, plan.request, n, plan.warm, out, **kw)


def run_arms(
    specs: Mapping[str, EngineSpec],
    request: VideoRequestSpec,
    launches: int | Mapping[str, int],
    warm: int,
    out: str | Path,
    request_timeout_s: float | None = None,
    extend: Callable[[dict[str, ResultBundle]], Sequence[str]] | None = None,
    meta: Mapping[str, Any] | None = None,
    profile: ProfileParams | None = None,
    paired: bool = False,
) -> dict[str, ResultBundle]:
    """Run launches of several engine specs ("arms": A, and B, C, … each a variant of it) in one
    balanced interleaved order (:func:`perfkit.stats.interleaved_order`), a bundle per arm
    under ``out/<arm in lower case>``: one power pool can hold A and several slowdowns, each
    compared with the same A launches. ``launches``: a side, or arm -> launches.

    Every bundle is saved after every launch (a pool cut short keeps what it ran) and its meta
    ``ab`` holds the whole order, the load averages and the wall time. Never raises for engine
    failures (a failed launch keeps its error in its ``launches`` row: a request that hung or
    lost the engine is named with how the engine ended). After each launch any process it
    started that outlived its teardown is ended (:class:`perfkit.engine.owner.Watch`) and named
    in that error.

    ``extend`` (the sequential A/B, :mod:`perfkit.ab.sequential`): once the planned order has
    run, it is called with the bundles so far and returns the arms to launch next (empty: stop);
    ``meta`` is added to every bundle's meta ``ab`` (e.g. the sequential design).

    ``profile``: after every measured launch, one extra launch per arm (label
    ``profiled-<arm>``; paired: A's and B's side by side) profiles its cold and a warm request;
    the traces go into that arm's bundle (``traces`` table, ``traces/``). Not a measured
    launch: not in the order, the launch counts or any metric.

    ``paired`` (``perfkit ab --paired``, arms A and B with equal counts): the order is taken two
    at a time, one A and one B launch run side by side with their requests in turn
    (:mod:`perfkit.ab.paired`), the first of the two sending the first request; ``extend`` must
    then return two arms. The meta ``ab`` says ``paired`` and each pair's request order.

    Raises:
        ValueError: warm < 1, a launch count < 1, or a count for an arm without a spec; paired
            with arms other than A and B, unequal counts, or an extension that is not a pair.
    """
    if warm < 1:
        raise ValueError(f"warm requests a launch must be >= 1, got {warm}")
    counts = {arm: launches for arm in specs} if isinstance(launches, int) else dict(launches)
    if set(counts) != set(specs):
        raise ValueError(f"launch counts for arms {sorted(counts)} but specs for {sorted(specs)}")
    if paired and (set(specs) != {"A", "B"} or counts["A"] != counts["B"]):
        raise ValueError(f"paired launches need arms A and B with equal counts, got {counts}")
    out = Path(out)
    order = interleaved_order(counts)
    if paired:
        meta = {**dict(meta or {}), "paired": True}
        turns: dict[str, list[str]] = {}
    reqs = [request] * (1 + warm)
    data: dict[str, list[LaunchData]] = {arm: [] for arm in specs}
    loads: dict[str, Any] = {}
    t0 = time.time()
    bundles: dict[str, ResultBundle] = {}
    with tqdm(total=len(order), desc="ab launches", unit="launch") as bar:  # closed on an interrupt too
        pos = 0
        while pos < len(order) or (extend is not None and _extended(order, extend, bundles, bar)):
            if paired:
                pair = order[pos : pos + 2]
                if sorted(pair) != ["A", "B"]:
                    raise ValueError(
                        f"paired launches run an A and a B together; the order has {pair} at {pos}"
                    )
                key, ran = _paired_launch(specs, pair, pos, reqs, out, request_timeout_s, data, loads)
                turns[key] = ran
                meta["pair_turns"] = turns
                bundles = _save_arms(
                    specs, request, counts, warm, out, data, order[: pos + 2], loads, t0, meta
                )
                bar.update(2)
                pos += 2
                continue
            arm = order[pos]
            label = f"{arm}{len(data[arm]):02d}"
            loads[label] = {"position": pos, "loadavg": _loadavg()}
            watch = Watch.start()
            d = measure_launch(specs[arm], reqs, out / "launches", label, request_timeout_s=request_timeout_s)
            left = watch.reap(grace_s=specs[arm].stop_grace_s)  # what outlived the launch's teardown
            if left:
                d.launch_row["error"] = d.error = "; ".join(x for x in (d.error, describe(left)) if x)
            log.info(
                "launch %s (%d/%d): ready %.2f s, first result %s s%s",
                label,
                pos + 1,
                len(order),
                d.launch_row.get("ready_s") or math.nan,
                d.launch_row.get("first_result_s"),
                f", error: {d.error}" if d.error else "",
            )
            data[arm].append(d)
            # saved after every launch: a pool cut short (a lost host, a killed job) keeps what it ran
            bundles = _save_arms(specs, request, counts, warm, out, data, order[: pos + 1], loads, t0, meta)
            bar.update()
            pos += 1
            failed = [x.label for ds in data.values() for x in ds if x.error]
            if failed and all(data.values()):  # the procedure stops at a failed launch: no more
                log.warning("launch %s failed: no further launch", failed[0])
                break
    if profile is not None and not any(d.error for ds in data.values() for d in ds):

        def profiled(arm: str, _turn: Any = None) -> Any:
            return run_profiled(
                specs[arm], request, profile, out / "launches", label=f"profiled-{arm.lower()}"
            )

        # paired: the two profiled launches side by side too, as their measured pairs ran
        got = run_pair("A", "B", profiled)[0] if paired else {arm: profiled(arm) for arm in bundles}
        for arm, b in bundles.items():
            attach(b, *got[arm])
            b.save(out / arm.lower())
    return bundles


def _paired_launch(
    specs: Mapping[str, EngineSpec],
    pair: list[str],
    pos: int,
    reqs: list[VideoRequestSpec],
    out: Path,
    request_timeout_s: float | None,
    data: dict[str, list[LaunchData]],
    loads: dict[str, Any],
) -> tuple[str, list[str]]:
    """One A and one B launch of :func:`run_arms` side by side, their requests in turn
    (:func:`perfkit.ab.paired.run_pair`, ``pair[0]`` first): each arm's :class:`LaunchData` is
    appended to ``data`` and its load averages put in ``loads``; what outlived the pair's
    teardown is named in both errors. Returns the pair's key (``"A00+B00"``) and its request
    order (``["A00:0", "B00:0", …]``)."""
    labels = {arm: f"{arm}{len(data[arm]):02d}" for arm in pair}
    for k, arm in enumerate(pair):
        loads[labels[arm]] = {"position": pos + k, "loadavg": _loadavg()}
    watch = Watch.start()
    got, ran = run_pair(
        pair[0],
        pair[1],
        lambda arm, turn: measure_launch(
            specs[arm], reqs, out / "launches", labels[arm], request_timeout_s=request_timeout_s, turn=turn
        ),
    )
    left = watch.reap(grace_s=max(specs[a].stop_grace_s for a in pair))
    for arm in pair:
        d = got[arm]
        if left:
            d.launch_row["error"] = d.error = "; ".join(x for x in (d.error, describe(left)) if x)
        log.info("launch %s (paired): ready %.2f s%s", d.label, d.launch_row.get("ready_s") or math.nan,
                 f", error: {d.error}" if d.error else "")  # fmt: skip
        data[arm].append(d)
    return "+".join(labels[a] for a in pair), [f"{labels[a]}:{i}" for a, i in ran]


def _extended(order: list[str], extend: Callable[..., Sequence[str]], bundles: Any, bar: Any) -> bool:
    """Append ``extend(bundles)`` to ``order`` (and to the bar's total); whether it added any."""
    more = list(extend(bundles))
    order += more
    bar.total = len(order)
    return bool(more)


def _save_arms(
    specs: Mapping[str, EngineSpec],
    request: VideoRequestSpec,
    counts: Mapping[str, int],
    warm: int,
    out: Path,
    data: dict[str, list[LaunchData]],
    done: list[str],
    loads: dict[str, Any],
    t0: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, ResultBundle]:
    """Assemble and save the bundle of each arm that has launches so far (``out/<arm>``);
    ``done`` is the order of the launches run so far."""
    meta_ab = {
        "order": [f"{s}{done[:i].count(s):02d}" for i, s in enumerate(done)],
        "launches_per_side": counts["A"] if len(set(counts.values())) == 1 else dict(counts),
        "launches_done": {arm: len(data[arm]) for arm in specs},
        "warm_per_launch": warm,
        "launch_load": loads,
        "loadavg_end": _loadavg(),
        "cpu_count": os.cpu_count(),
        "wall_s": round(time.time() - t0, 1),
        **dict(extra or {}),
    }
    bundles = {}
    for arm, spec in specs.items():
        if not data[arm]:
            continue
        b = assemble(
            BUNDLE_NAME,
            data[arm],
            params={"side": arm, "spec": spec.to_dict(), "request": request.payload()},
            results={"side": arm, "launches": [d.label for d in data[arm]]},
        )
        b.meta["ab"] = meta_ab
        b.save(out / arm.lower())
        bundles[arm] = b
    return bundles
