"""sglang ``perf_baselines`` files across a repository's git history as history runs.

Each commit that changed the file is one run (source ``perf-baselines``): its version's
expected values, one per case × metric as for a perfkit run (:func:`perfkit.history.runs.
case_values`: ``e2e_ms``, ``<Stage>_ms``, ...; the top-level ``load_peak_vram_mb`` /
``runtime_peak_vram_mb`` maps count as the case's own keys), at the commit's committer time.
The series then show expected values moving as pull requests tighten or loosen them (e.g.
sglang's 5090 case, DecodingStage 26,550 → 13,000 ms by hand). Hardware: ``--hardware``, else
the file's ``metadata.hardware``, else the file name (``perf_baselines/h100.json`` → ``h100``,
``perf_baselines_5090.json`` → ``5090``, ``perf_baselines.json`` → ``default``).
"""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path, PurePosixPath

from perfkit.gate import baseline as bl
from perfkit.history.runs import case_values
from perfkit.history.store import HistoryError, HistoryRun

SOURCE = "perf-baselines"


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        raise HistoryError(f"{repo}: git {' '.join(args)}: {err.strip()}") from None


def read_baseline_history(repo: str | Path, path: str, *, hardware: str | None = None) -> list[HistoryRun]:
    """Every committed version of ``path`` (relative to the repository ``repo``) as a run,
    oldest first (``git log`` of HEAD; renames are not followed).

    Raises:
        HistoryError: not a git repository, the file has no history, or a version that is
            not valid baseline JSON or holds a non-number (names ``repo:commit:path`` and the key).
    """
    repo = Path(repo)
    log = _git(repo, "log", "--format=%H %cI", "--", path).split("\n")
    commits = [line.split(" ", 1) for line in log if line.strip()]
    if not commits:
        raise HistoryError(f"{repo}: {path}: no commit touches this file")
    suffix = PurePosixPath(path).stem.removeprefix("perf_baselines").lstrip("_") or "default"
    runs = []
    for sha, when in reversed(commits):
        where = f"{repo}:{sha[:10]}:{path}"
        try:
            text = _git(repo, "show", f"{sha}:{path}")
        except HistoryError:
            continue  # the commit deleted the file
        try:
            doc = bl.loads_baseline(text, where)
        except bl.BaselineError as exc:
            raise HistoryError(str(exc)) from None
        cases = doc.get("scenarios")
        if not isinstance(cases, dict):
            raise HistoryError(f"{where}: scenarios: missing or not an object")
        values = []
        for case, entry in cases.items():
            if not isinstance(entry, dict):
                raise HistoryError(f"{where}: scenarios.{case}: not an object")
            merged = dict(entry)
            for top in ("load_peak_vram_mb", "runtime_peak_vram_mb"):
                m = doc.get(top)
                if isinstance(m, dict) and case in m and top not in merged:
                    merged[top] = m[case]
            values += case_values(case, merged, where)
        if not values:
            continue
        hw = hardware or str((doc.get("metadata") or {}).get("hardware") or suffix)
        runs.append(
            HistoryRun(
                source=SOURCE,
                run_id=sha,
                hardware=hw,
                commit=sha,
                time=datetime.fromisoformat(when),
                values=values,
                source_file=path,
                provenance={
                    "repository": str(repo),
                    "kind": "expected values",
                    "metadata": doc.get("metadata"),
                },
            )
        )
    return runs
