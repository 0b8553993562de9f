"""The history commands as single functions (what ``perfkit history ...`` calls)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfkit.history import changepoints as cp
from perfkit.history.check import CheckResult, check_runs, write_summary
from perfkit.history.runs import read_baseline_history, read_nightly, read_run
from perfkit.history.store import AddResult, HistoryError, HistoryRun, add_runs, read_store


def add(
    store: str | Path, paths: Sequence[str | Path], *, commit: str | None = None, hardware: str | None = None
) -> AddResult:
    """``perfkit history add``: read every path (:func:`perfkit.history.runs.read_run`) first,
    then store them all (a bad path stores nothing). Raises HistoryError naming the file/key."""
    runs = [r for p in paths for r in read_run(p, commit=commit, hardware=hardware)]
    return add_runs(store, runs)


def import_baselines(
    store: str | Path, repo: str | Path, path: str, *, hardware: str | None = None
) -> tuple[AddResult, list[str]]:
    """``perfkit history import REPO --baselines FILE``: every committed version of a
    perf_baselines file (:func:`perfkit.history.runs.read_baseline_history`).

    Returns what was stored and one note per version skipped (it names the commit and why).
    Raises HistoryError when no version can be read (the message holds the notes), so that an
    import of nothing is never a success.
    """
    runs, skipped = read_baseline_history(repo, path, hardware=hardware)
    if not runs:
        raise HistoryError(f"{repo}: {path}: no version could be read:\n  " + "\n  ".join(skipped))
    return add_runs(store, runs), skipped


def import_nightly(store: str | Path, path: str | Path, *, hardware: str) -> AddResult:
    """``perfkit history import``: sglang's nightly comparison files under ``path`` (a
    directory, a file or a ci-data-diffusion checkout). Raises HistoryError naming the file/key."""
    return add_runs(store, read_nightly(path, hardware))


def read_any(path: str | Path, *, hardware: str | None = None, commit: str | None = None) -> list[HistoryRun]:
    """A run to check: a nightly comparison file (``*.json``; ``hardware`` needed) or a perfkit
    run/A-B output/bundle directory."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        if not hardware:
            raise HistoryError(f"{p}: a nightly comparison file does not name its hardware; give --hardware")
        return read_nightly(p, hardware)
    return read_run(p, commit=commit, hardware=hardware)


def check(
    store: str | Path,
    path: str | Path,
    out_dir: str | Path | None = None,
    *,
    hardware: str | None = None,
    commit: str | None = None,
    commit_url: str | None = None,
    settings: cp.Settings = cp.Settings(),
) -> tuple[CheckResult, Path]:
    """``perfkit history check``: judge the run at ``path`` against the store's series and write
    ``out_dir/summary.md`` (default ``path/history/`` for a run directory, never ``path/summary.md``:
    that is the suite's own; ``outputs/history-check/<stem>/`` for a file). Returns the result
    (``exit_code``) and the summary's path."""
    if out_dir is None:
        p = Path(path)
        out_dir = p / "history" if p.is_dir() else Path("outputs/history-check") / p.stem
    runs = read_any(path, hardware=hardware, commit=commit)
    res = check_runs(read_store(store), runs, settings)
    return res, write_summary(res, out_dir, commit_url)


def changes(
    store: str | Path, *, hardware: str | None = None, case: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """``perfkit history changes``: every change point and event of the store's series
    (:func:`perfkit.history.check.changes`), of one hardware and/or case when given. Raises
    HistoryError when no series matches (nothing listed is never an empty success)."""
    from perfkit.history.check import changes as table

    df = read_store(store, hardware=hardware)
    if case is not None:
        df = df[df["case_id"] == case]
    if df.empty:
        raise HistoryError(f"{store}: no series stored" + (f" for case {case!r}" if case else ""))
    return table(cp.analyse_frame(df))
