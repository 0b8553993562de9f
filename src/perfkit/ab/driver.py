"""Run an A/B: balanced interleaved launches (``A B B A …``) of two or more engine specs into a
bundle per side, or paired launches side by side, their requests in turn (docs/choosing-n-m.md,
"Paired launches")."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from tqdm.std import tqdm  # a text bar, never a widget (perfkit.measuring.progress)

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


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_arms(
    specs: Mapping[str, EngineSpec],
    request: VideoRequestSpec,
    launches: int | Mapping[str, int],
    warm: int,
    out: str | Path,
    extend: Callable[[dict[str, ResultBundle]], Sequence[str]] | None = None,
    meta: Mapping[str, Any] | None = None,
    profile: ProfileParams | None = None,
    paired: bool = False,
) -> dict[str, ResultBundle]:
    """Run launches of arms A, B, C, … in one interleaved order, a bundle per arm saved under
    ``out/<arm>`` after every launch (meta ``ab``: order, load averages, wall time, ``meta``).
    ``extend(bundles)`` returns the arms to launch next once the order has run; ``profile`` adds
    one profiled launch per arm. Engine failures stay in the ``launches`` rows. Raises
    ValueError: warm < 1, a bad launch count, a paired run that is not pairs of A and B."""
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
        meta = {**dict(meta or {}), "paired": True, "pair_turns": {}}
    reqs = [request] * (1 + warm)
    data: dict[str, list[LaunchData]] = {arm: [] for arm in specs}
    loads: dict[str, Any] = {}
    t0 = time.time()
    bundles: dict[str, ResultBundle] = {}
    with tqdm(total=len(order), desc="ab launches", unit="launch") as bar:
        pos = 0
        while pos < len(order) or (extend is not None and _extended(order, extend, bundles, bar)):
            group = order[pos : pos + 2] if paired else [order[pos]]
            if paired and sorted(group) != ["A", "B"]:
                raise ValueError(f"paired launches run an A and a B together; the order has {group} at {pos}")
            key, ran = _launch(specs, group, pos, len(order), reqs, out, data, loads)
            if paired:
                meta["pair_turns"][key] = ran
            pos += len(group)
            # saved after every launch: a pool cut short keeps what it ran
            bundles = _save_arms(specs, request, counts, warm, out, data, order[:pos], loads, t0, meta)
            bar.update(len(group))
            failed = [x.label for ds in data.values() for x in ds if x.error]
            if not paired and failed and all(data.values()):  # the procedure stops at a failed launch
                log.warning("launch %s failed: no further launch", failed[0])
                break
    if profile is not None and not any(d.error for ds in data.values() for d in ds):

        def profiled(arm: str, _turn: Any = None) -> Any:
            return run_profiled(
                specs[arm], request, profile, out / "launches", label=f"profiled-{arm.lower()}"
            )

        got = run_pair("A", "B", profiled)[0] if paired else {arm: profiled(arm) for arm in bundles}
        for arm, b in bundles.items():
            attach(b, *got[arm])
            b.save(out / arm.lower())
    return bundles


def _launch(
    specs: Mapping[str, EngineSpec],
    group: list[str],
    pos: int,
    total: int,
    reqs: list[VideoRequestSpec],
    out: Path,
    data: dict[str, list[LaunchData]],
    loads: dict[str, Any],
) -> tuple[str, list[str]]:
    """One launch or a pair; returns its key (``"A00+B00"``) and, paired, the request order."""
    labels = {arm: f"{arm}{len(data[arm]):02d}" for arm in group}
    for k, arm in enumerate(group):
        loads[labels[arm]] = {"position": pos + k, "loadavg": _loadavg()}
    watch = Watch.start()

    def one(arm: str, turn: Any = None) -> LaunchData:
        return measure_launch(specs[arm], reqs, out / "launches", labels[arm], turn=turn)

    got, ran = run_pair(group[0], group[1], one) if len(group) == 2 else ({group[0]: one(group[0])}, [])
    left = watch.reap(grace_s=max(specs[a].stop_grace_s for a in group))  # what outlived the teardown
    for arm in group:
        d = got[arm]
        if left:
            d.launch_row["error"] = d.error = "; ".join(x for x in (d.error, describe(left)) if x)
        ready, err = d.launch_row.get("ready_s") or math.nan, f", error: {d.error}" if d.error else ""
        where = "paired" if len(group) == 2 else f"{pos + 1}/{total}"
        first = "" if len(group) == 2 else f", first result {d.launch_row.get('first_result_s')} s"
        log.info("launch %s (%s): ready %.2f s%s%s", d.label, where, ready, first, err)
        data[arm].append(d)
    return "+".join(labels[a] for a in group), [f"{labels[a]}:{i}" for a, i in ran]


def _extended(order: list[str], extend: Callable[..., Sequence[str]], bundles: Any, bar: Any) -> bool:
    """Append ``extend(bundles)`` to ``order``; whether it added any."""
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
    """Assemble and save the bundle of each arm that has launches so far."""
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


class Alternation:
    """Two sides' requests in turn (``first``'s 0, ``second``'s 0, ``first``'s 1, …); a side that
    has ended no longer holds the other up."""

    def __init__(self, first: str, second: str) -> None:
        self._cv = threading.Condition()
        self._other = {first: second, second: first}
        self._turn = first
        self._ended: set[str] = set()
        #: (side, request index) in the order the requests ran
        self.log: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def turn(self, side: str, i: int) -> Iterator[None]:
        """Wait for ``side``'s turn (or the other's end), run the block, pass the turn on."""
        other = self._other[side]
        with self._cv:
            self._cv.wait_for(lambda: self._turn == side or other in self._ended)
            self.log.append((side, i))
        try:
            yield
        finally:
            with self._cv:
                self._turn = other
                self._cv.notify_all()

    def end(self, side: str) -> None:
        """``side`` sends no more requests: the other runs on alone."""
        with self._cv:
            self._ended.add(side)
            self._turn = self._other[side]
            self._cv.notify_all()


def run_pair(
    first: str, second: str, measure: Callable[[str, Callable[[int], Any]], Any]
) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """Run ``measure(side, turn)`` for both sides on two threads, ``turn(i)`` the context around
    request ``i``. Returns ({side: result}, the (side, request index) order they ran in); raises
    what a ``measure`` raised once both threads ended."""
    alt = Alternation(first, second)
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def work(side: str) -> None:
        try:
            results[side] = measure(side, lambda i: alt.turn(side, i))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors[side] = exc
        finally:
            alt.end(side)

    threads = [threading.Thread(target=work, args=(s,), name=f"ab-{s}", daemon=True) for s in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.5)  # wakes for Ctrl-C / SIGTERM (raised in this thread)
    for s in (first, second):
        if s in errors:
            raise errors[s]
    return results, alt.log
