"""Progress of long runs (:func:`track_requests`): tqdm on a terminal, text lines in a kernel, JSON
lines in ``$PERFKIT_PROGRESS_FILE`` under ``perfkit suite``/``run`` that :class:`RunBars` draws
(with :func:`planned_requests`); docs/lab.md, docs/suite.md."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

PROGRESS_ENV = "PERFKIT_PROGRESS_FILE"
#: launches with fewer requests than this draw no per-request bar (they finish in seconds)
MIN_REQUESTS_FOR_BAR = 2

#: in-process receivers of events (:meth:`RunBars.listen`)
_LISTENERS: list[Callable[[Mapping[str, Any]], None]] = []


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (JupyterLab, papermill, nbclient)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _quiet() -> bool:
    """Whether someone else draws the progress: the suite (an events file) or a listener."""
    return bool(os.environ.get(PROGRESS_ENV)) or bool(_LISTENERS)


def launching(label: str, what: str = "the engine") -> None:
    """Say that launch ``label`` is starting ``what``: an event, in a lone kernel a text line."""
    emit("launching", label=label, what=what)
    if not _quiet() and in_kernel():
        print(f"{label}: launching {what} … (the first request is sent once it serves)", flush=True)


def emit(event: str, **fields: Any) -> None:
    """Send ``{"event", "t", **fields}`` to listeners and ``$PERFKIT_PROGRESS_FILE`` (errors logged)."""
    ev = {"event": event, "t": time.time(), **fields}
    for listener in list(_LISTENERS):
        listener(ev)
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    line = json.dumps(ev, default=str) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        log.debug("progress file %s: %s", path, exc)


@contextlib.contextmanager
def listening(callback: Callable[[Mapping[str, Any]], None]) -> Iterator[None]:
    """Pass this process's progress events to ``callback`` (not drawn here) while the block runs."""
    _LISTENERS.append(callback)
    try:
        yield
    finally:
        _LISTENERS.remove(callback)


def track_requests(requests: Sequence[T], label: str) -> Iterator[T]:
    """Yield ``requests`` with a bar for launch ``label``, emitting the progress events."""
    items = list(requests)
    n = len(items)
    emit("launch", label=label, requests=n)
    quiet = _quiet()
    lines = not quiet and in_kernel()  # text lines in a notebook, never a widget
    bar = None
    if not quiet and not lines and n >= MIN_REQUESTS_FOR_BAR:
        from tqdm.std import tqdm

        bar = tqdm(total=n, desc=label, unit="request", leave=False)
    t0 = time.monotonic()
    done = 0
    try:
        for i, item in enumerate(items):
            if lines:
                print(
                    f"{label}: request {i + 1}/{n} sent" + (" (the cold one)" if i == 0 else ""), flush=True
                )
            yield item
            done = i + 1
            if bar is not None:
                bar.update(1)
            emit("request", label=label, i=i + 1, n=n)
    finally:  # also when the caller stops early (a failed request)
        if bar is not None:
            bar.close()
        if lines:
            print(f"{label}: {done} of {n} requests done in {time.monotonic() - t0:.1f} s", flush=True)
        emit("launch_done", label=label)


def in_flight(path: str | Path) -> dict[str, Any] | None:
    """``{"launch": label, "request": i}`` of the request in flight when the events of ``path``
    stop (a kernel died mid-launch); None when every launch ended."""
    events, _ = read_events(path)
    open_: dict[str, int] = {}
    for ev in events:
        label = str(ev.get("label"))
        if ev.get("event") == "launch":
            open_[label] = 0
        elif ev.get("event") == "request" and label in open_:
            open_[label] = int(ev.get("i") or 0)
        elif ev.get("event") == "launch_done":
            open_.pop(label, None)
    if not open_:
        return None
    label, done = list(open_.items())[-1]
    return {"launch": label, "request": done}


def read_events(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Events appended to ``path`` since byte ``offset``, and the new offset (a partial line left)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    events = []
    for line in data[: end + 1].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end + 1


def planned_requests(plans: Iterable[Sequence[int]]) -> tuple[int, int]:
    """(launches, requests) of several investigations' plans (each a list of requests per launch)."""
    plans = [list(p) for p in plans]
    return sum(map(len, plans)), sum(int(x) for p in plans for x in p)


class RunBars:
    """Terminal bars of a whole run (every planned request, the current launch's) from events."""

    def __init__(self, file: Any, launches: int, requests: int, enabled: bool = True) -> None:
        from tqdm.std import tqdm

        self._tqdm = tqdm
        self.file = file
        self.enabled = enabled and requests > 0
        self.launches_planned = launches
        self.launches_seen = 0
        self.overall = tqdm(
            total=requests, desc="requests", unit="request", file=file, position=1, disable=not self.enabled
        )
        self.launch_bar: Any = None

    def handle(self, ev: Mapping[str, Any], investigation: str = "") -> None:
        """Apply one event (``launching``, ``launch``, ``request``, ``launch_done``) to the bars."""
        if not self.enabled:
            return
        kind = ev.get("event")
        if kind == "launching":
            n = self.launches_seen + 1
            self.overall.set_postfix_str(f"launch {n}: launching {ev.get('what', 'the engine')} …")
        elif kind == "launch":
            self.launches_seen += 1
            self._launches_postfix()
            if self.launch_bar is not None:
                self.launch_bar.close()
            self.launch_bar = self._tqdm(
                total=int(ev.get("requests") or 0),
                desc=f"{investigation} {ev.get('label', '')}".strip(),
                unit="request",
                file=self.file,
                position=2,
                leave=False,
            )
        elif kind == "request":
            self.overall.update(1)
            if self.launch_bar is not None:
                self.launch_bar.update(1)
        elif kind == "launch_done" and self.launch_bar is not None:
            self.launch_bar.close()
            self.launch_bar = None

    @contextlib.contextmanager
    def watch(self, path: Path, investigation: str, planned: int = 0):
        """Tail ``path`` while the block runs; ``planned`` requests not sent count as done at its end."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()
        offset = path.stat().st_size if path.exists() else 0

        def loop() -> None:
            nonlocal offset
            while True:
                events, offset = read_events(path, offset)
                for ev in events:
                    self.handle(ev, investigation)
                if stop.is_set():
                    return
                stop.wait(0.5)

        with self._planned(planned):
            t = threading.Thread(target=loop, name="perfkit-progress", daemon=True)
            t.start()
            try:
                yield
            finally:
                stop.set()
                t.join(timeout=5)

    @contextlib.contextmanager
    def listen(self, investigation: str, planned: int = 0):
        """Take this process's events while the block runs."""
        if not self.enabled:
            yield
            return
        with self._planned(planned), listening(lambda ev: self.handle(ev, investigation)):
            yield

    @contextlib.contextmanager
    def _planned(self, planned: int) -> Iterator[None]:
        start = self.overall.n
        try:
            yield
        finally:
            short = planned - (self.overall.n - start)
            if short > 0:
                self.overall.update(short)
            self._launches_postfix()

    def _launches_postfix(self) -> None:
        of = f"/~{self.launches_planned}" if self.launches_planned else ""
        self.overall.set_postfix_str(f"launch {self.launches_seen}{of}")

    def close(self) -> None:
        """Close the bars."""
        if self.launch_bar is not None:
            self.launch_bar.close()
        self.overall.close()
