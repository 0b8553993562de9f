"""The two commands as single functions (what ``perfkit bisect`` and ``perfkit history confirm``
call): build the probe setup, run, write ``summary.md`` and ``report.html``."""

from __future__ import annotations

from pathlib import Path

from perfkit.ab.sequential import Design
from perfkit.bisect.checkout import BisectError
from perfkit.bisect.confirm import confirm
from perfkit.bisect.probe import ProbeSetup
from perfkit.bisect.search import bisect
from perfkit.common.outdirs import given_out_problem, stamped_dir
from perfkit.report.history_site import write_bisect_outputs


def make_setup(
    spec: str | Path,
    *,
    metric: str | None = "DenoisingStage",
    python_path: str | None = None,
    build: str | None = None,
    design: Design | None = None,
    threshold: float = 0.05,
    thresholds: dict[str, float] | None = None,
    warm: int = 3,
    build_timeout_s: float | None = None,
) -> ProbeSetup:
    """A :class:`ProbeSetup` from the command's options (``design`` None: 2 to 6 launches a
    side, unpaired; ``thresholds``: per-metric, from ``--threshold-from``).

    Raises:
        BisectError: the spec file is missing.
    """
    if not Path(spec).is_file():
        raise BisectError(
            f"--spec {spec}: {'is a directory, not a file' if Path(spec).is_dir() else 'not found'}"
        )
    return ProbeSetup(
        Path(spec), metric or "DenoisingStage", python_path, build, design or Design(2, 6), threshold,
        warm, build_timeout_s, dict(thresholds or {}),
    )  # fmt: skip


def out_dir(given: str | None, kind: str) -> Path:
    """``--out`` (refused when it is a file or a non-empty directory), else a new
    ``outputs/<kind>/<timestamp>``.

    Raises:
        BisectError: ``--out`` is a file or a non-empty directory.
    """
    if given:
        problem = given_out_problem(given)
        if problem:
            raise BisectError(f"--out {Path(given)} {problem}")
        return Path(given)
    return stamped_dir(Path("outputs") / kind)


def run_bisect(repo: str | Path, good: str, bad: str, setup: ProbeSetup, out: Path) -> tuple[int, Path]:
    """``perfkit bisect``: the search (:func:`perfkit.bisect.search.bisect`) and its outputs.
    Returns (exit code, summary.md path). Raises BisectError for bad input."""
    res = bisect(repo, good, bad, setup, out)
    paths = write_bisect_outputs(res.to_dict(), out)
    return res.exit_code, paths["summary"]


def run_confirm(
    store: str | Path,
    series: str,
    change: str,
    repo: str | Path,
    setup: ProbeSetup,
    out: Path,
    *,
    metric: str | None = None,
    hardware: str | None = None,
) -> tuple[int, Path]:
    """``perfkit history confirm``: the A/B across the step (:func:`perfkit.bisect.confirm.confirm`,
    on ``metric`` or the series' own, :func:`perfkit.bisect.confirm.ab_metric`) and its outputs.
    Returns (exit code, summary.md path). Raises BisectError or HistoryError for bad input."""
    res = confirm(store, series, change, repo, setup, out, hardware=hardware, metric=metric)
    paths = write_bisect_outputs(res.to_dict(), out)
    return res.exit_code, paths["summary"]
