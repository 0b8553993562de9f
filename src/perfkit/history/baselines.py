"""sglang ``perf_baselines`` files across a repository's git history as history runs (source
``perf-baselines``): one run per commit that changed the file, at its committer time; a version
that cannot be read is skipped with a note. Hardware and tolerance rules: docs/history.md ("Sources").
"""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path, PurePosixPath

from perfkit.gate import baseline as bl
from perfkit.history.runs import case_values
from perfkit.history.store import HistoryError, HistoryRun

SOURCE = "perf-baselines"


def git(repo: str | Path, *args: str, error: type[ValueError] = HistoryError) -> str:
    """Run ``git -C repo args`` and return its stdout.

    Raises:
        error: git failed or is not installed: ``{repo}: git {args}: {why}``, ``why`` being
            git's stderr's first line or the OS error.
    """
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise error(f"{repo}: git {' '.join(args)}: {exc}") from None
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[0]
        raise error(f"{repo}: git {' '.join(args)}: {why}")
    return p.stdout


def read_baseline_history(
    repo: str | Path, path: str, *, hardware: str | None = None
) -> tuple[list[HistoryRun], list[str]]:
    """Every committed version of ``path`` (relative to the repository ``repo``) as a run,
    oldest first (``git log`` of HEAD; renames are not followed), and a note for each version
    skipped.

    Tolerances are read as sglang reads them (:func:`perfkit.gate.baseline.tolerance_profile`:
    the oldest versions' flat set as well as ``pr_test``/``long_term`` profiles); the set its CI
    gates with (``pr_test``, or the flat one) goes into each run's provenance, ``tolerances``.

    Returns:
        ``(runs, skipped)``: ``skipped`` holds one line per version that cannot be read (not
        JSON, a non-number where a number belongs, no scenarios, no expected value) or that
        deleted the file, naming ``repo:commit:path`` and why; the other versions are read.

    Raises:
        HistoryError: not a git repository, or no commit touches the file.
    """
    repo = Path(repo)
    log = git(repo, "log", "--format=%H %cI", "--", path).split("\n")
    commits = [line.split(" ", 1) for line in log if line.strip()]
    if not commits:
        raise HistoryError(f"{repo}: {path}: no commit touches this file")
    suffix = PurePosixPath(path).stem.removeprefix("perf_baselines").lstrip("_") or "default"
    runs: list[HistoryRun] = []
    skipped: list[str] = []
    for sha, when in reversed(commits):
        where = f"{repo}:{sha[:10]}:{path}"
        try:
            text = git(repo, "show", f"{sha}:{path}")
        except HistoryError:
            skipped.append(f"{where}: skipped: the file is deleted at this commit")
            continue
        try:
            run = _version_run(text, where, sha, when, path, repo, hardware or None, suffix)
        except (bl.BaselineError, HistoryError) as exc:
            skipped.append(f"{exc} (version skipped)")
            continue
        runs.append(run)
    return runs, skipped


def _version_run(
    text: str, where: str, sha: str, when: str, path: str, repo: Path, hardware: str | None, suffix: str
) -> HistoryRun:
    """One version's run. Raises BaselineError/HistoryError naming ``where`` and the key."""
    doc = bl.loads_baseline(text, where)
    cases = doc.get("scenarios")
    if not isinstance(cases, dict):
        raise HistoryError(f"{where}: scenarios: missing or not an object")
    values = []
    for case, entry in cases.items():
        merged = dict(entry)  # loads_baseline checked that each entry is an object
        for top in ("load_peak_vram_mb", "runtime_peak_vram_mb"):
            m = doc.get(top)
            if isinstance(m, dict) and case in m and top not in merged:
                merged[top] = m[case]
        values += case_values(case, merged, where)
    if not values:
        raise HistoryError(f"{where}: scenarios: no expected value in any case")
    try:
        name, tols = bl.tolerance_profile(doc.get("tolerances"), "pr_test")
        tolerances: dict | None = {"profile": name, **tols}
    except KeyError:  # no pr_test and not flat: sglang's CI could not gate with this version
        tolerances = None
    return HistoryRun(
        source=SOURCE,
        run_id=sha,
        hardware=hardware or str((doc.get("metadata") or {}).get("hardware") or suffix),
        commit=sha,
        time=datetime.fromisoformat(when),
        values=values,
        source_file=path,
        provenance={
            "repository": str(repo),
            "kind": "expected values",
            "metadata": doc.get("metadata"),
            "tolerances": tolerances,
        },
    )
