"""Progress of long runs: a bar per launch and per request, with an estimate from the params.

:func:`track_requests` wraps the requests of one launch (what
:func:`perfkit.scenarios.common.measure_launch` sends). Where it renders:

- in a terminal (``python -m perfkit.measure``, a script): tqdm's text bar on stderr;
- in JupyterLab: tqdm's notebook widget when ipywidgets is installed, else the text bar (never
  tqdm's "IProgress not found" warning, which ``tqdm.auto`` prints without ipywidgets);
- in a notebook executed by ``perfkit suite`` or ``perfkit run`` (papermill): nothing is drawn
  into the notebook (a bar there would be saved as text in its outputs); each event is appended
  as one JSON line to the file named by ``$PERFKIT_PROGRESS_FILE``, and the suite draws the bars
  in its terminal from it (:class:`ProgressFile`).

The estimate: each scenario's ``plan(params)`` gives the requests of each launch it would make
(:func:`planned_requests`); the suite sums them over the notebooks it runs, so the overall bar
has a total and tqdm an ETA. Launches a scenario reuses from an earlier one make the estimate an
upper bound.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: environment variable naming the events file (set for papermill kernels by the suite)
PROGRESS_ENV = "PERFKIT_PROGRESS_FILE"
#: launches with fewer requests than this draw no per-request bar (they finish in seconds)
MIN_REQUESTS_FOR_BAR = 2

__all__ = ["PROGRESS_ENV", "track_requests", "tqdm_class", "emit", "read_events", "planned_requests"]


def tqdm_class() -> type:
    """The tqdm class for here: the notebook widget in a Jupyter kernel that has ipywidgets,
    else the text bar (``tqdm.std``)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
        except ImportError:
            pass
    from tqdm.std import tqdm as std_tqdm

    return std_tqdm


def emit(event: str, **fields: Any) -> None:
    """Append ``{"event": event, "t": unix seconds, **fields}`` to ``$PERFKIT_PROGRESS_FILE``
    (no-op when unset; a write error is logged, never raised)."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        log.debug("progress file %s: %s", path, exc)


def track_requests(requests: Sequence[T], label: str) -> Iterator[T]:
    """Yield ``requests`` while showing a per-request bar for launch ``label`` (see the module
    doc for where it renders). Emits ``launch`` (label, requests), ``request`` (label, index i
    done so far, n) and ``launch_done`` events."""
    items = list(requests)
    n = len(items)
    emit("launch", label=label, requests=n)
    # in a papermill kernel the suite draws the bars: nothing goes into the notebook
    quiet = bool(os.environ.get(PROGRESS_ENV)) or n < MIN_REQUESTS_FOR_BAR
    bar = None if quiet else tqdm_class()(total=n, desc=label, unit="request", leave=False)
    try:
        for i, item in enumerate(items):
            yield item
            if bar is not None:
                bar.update(1)
            emit("request", label=label, i=i + 1, n=n)
    finally:  # also when the caller stops early (a failed request)
        if bar is not None:
            bar.close()
        emit("launch_done", label=label)


def read_events(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Events appended to ``path`` since byte ``offset``, and the new offset (a partial last
    line is left for the next call). A missing file gives no events."""
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
    """(launches, requests) of several scenarios' plans (each a list of requests per launch)."""
    launches = requests = 0
    for plan in plans:
        launches += len(plan)
        requests += sum(int(x) for x in plan)
    return launches, requests
