"""History runs from perfkit's outputs (a suite run, an A/B's sides, a bundle), the committed
versions of an sglang ``perf_baselines`` file and sglang's nightly diffusion comparisons.
Metrics, units, commit, time and hardware rules: docs/history.md ("Sources")."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.bundle import ResultBundle
from perfkit.common.jsonsafe import unique_keys
from perfkit.common.provenance import repo_root
from perfkit.gate import baseline as bl
from perfkit.gate.run import bundles_hardware, case_id, load_run_bundles, run_hardware
from perfkit.history.store import HistoryError, HistoryRun, Value, finite_number, utc

_SCALARS = {
    "expected_e2e_ms": ("e2e_ms", "ms"),
    "expected_avg_denoise_ms": ("avg_denoise_step_ms", "ms"),
    "expected_median_denoise_ms": ("median_denoise_step_ms", "ms"),
    "expected_load_ms": ("load_ms", "ms"),
    "expected_first_result_ms": ("first_result_ms", "ms"),
}


def case_values(case: str, entry: Mapping[str, Any], where: str) -> list[Value]:
    """The values of one sglang-layout case entry (a null: a gap). Raises HistoryError: a value
    not a finite number (names ``where``, the case and the key)."""
    items = [(m, u, k, entry[k]) for k, (m, u) in _SCALARS.items() if k in entry]
    items += [
        (f"{s}_ms", "ms", f"stages_ms.{s}", v) for s, v in sorted((entry.get("stages_ms") or {}).items())
    ]
    items += [
        (k[:-3] + "_mib", "MiB", k, v)
        for k, v in sorted(entry.items())
        if k.endswith(("_vram_mb", "_allocated_mb"))
    ]
    out: list[Value] = []
    for metric, unit, key, v in items:
        if v is None:
            out.append(
                Value(case, metric, unit, None, f"not measured (null in {where}: scenarios.{case}.{key})")
            )
        elif not finite_number(v):
            raise HistoryError(f"{where}: scenarios.{case}.{key}: not a finite number: {v!r}")
        elif v or key not in _SCALARS or "denoise" not in key:  # sglang's 0.0 denoise aggregate: no steps
            out.append(Value(case, metric, unit, float(v)))
    return out


def _mtime(p: Path) -> datetime:
    return datetime.fromtimestamp(p.stat().st_mtime, tz=timezone.utc)


def _commit(bundles: Mapping[str, ResultBundle], given: str | None, where: Path) -> str:
    """``given``, else the one ``git_commit`` of the bundles' meta.json."""
    if given:
        return given
    commits: dict[str, list[str]] = {}
    for name, b in bundles.items():
        c = b.meta.get("git_commit")
        if c is None or c == "":
            continue
        if not isinstance(c, str):
            raise HistoryError(f"{where}: {name}/meta.json: git_commit: not a string: {c!r}")
        commits.setdefault(c, []).append(name)
    if len(commits) > 1:
        listed = "; ".join(f"{c} ({', '.join(names)})" for c, names in commits.items())
        raise HistoryError(f"{where}: its bundles were measured at several commits: {listed}; give --commit")
    if commits:
        return next(iter(commits))
    raise HistoryError(f"{where}: no git_commit in any bundle's meta.json; give --commit")


def read_suite_run(
    run_dir: str | Path, *, commit: str | None = None, hardware: str | None = None
) -> HistoryRun:
    """A finished suite or merged run as one run. Raises HistoryError: no baseline.json, no
    cases, no commit, or a bad value (names the file and the key)."""
    run_dir = Path(run_dir)
    bfile = run_dir / "baseline.json"
    try:
        doc = bl.load_baseline(bfile)
    except (OSError, bl.BaselineError, ValueError) as exc:
        raise HistoryError(f"{bfile}: {exc}") from None
    cases = doc.get("scenarios") or {}
    if not cases:
        raise HistoryError(f"{bfile}: scenarios: no case")
    bundles = load_run_bundles(run_dir)
    hardware = hardware or run_hardware(run_dir, doc, bundles)  # before a replay's bundles
    values = [v for c, e in cases.items() for v in case_values(c, e, str(bfile))]
    prov: dict[str, Any] = {"baseline_metadata": doc.get("metadata") or {}}
    when: datetime | None = None
    rj = run_dir / "run.json"
    if rj.exists():
        try:
            run = json.loads(rj.read_text())
        except (OSError, ValueError) as exc:
            raise HistoryError(f"{rj}: {exc}") from None
        prov.update({k: run.get(k) for k in ("name", "params_file", "status", "exit_code", "replay")})
        if not bundles and run.get("replay"):
            rp = Path(str(run["replay"]))
            bundles = load_run_bundles(rp if rp.is_absolute() or rp.exists() else repo_root() / rp)
        if run.get("finished"):
            try:
                when = datetime.fromisoformat(str(run["finished"]))
            except ValueError:
                raise HistoryError(f"{rj}: finished: not an ISO time: {run['finished']!r}") from None
            prov["time_from"] = "run.json finished"
    if when is None:
        when = _mtime(bfile)
        prov["time_from"] = "baseline.json modification time"
    when = utc(when)
    return HistoryRun(
        source="suite",
        run_id=f"{run_dir.name}@{when.isoformat()}",
        hardware=hardware,
        commit=_commit(bundles, commit, run_dir),
        time=when,
        values=values,
        source_file=str(bfile),
        provenance=prov,
    )


def read_bundle_run(
    bundle_dir: str | Path,
    *,
    source: str = "bundle",
    commit: str | None = None,
    hardware: str | None = None,
    time_file: str | Path | None = None,
) -> HistoryRun:
    """One bundle directory (an A/B side or an investigation's) as one run of one case. Raises
    HistoryError: not a bundle, or no engine spec/request in its meta (names the file)."""
    d = Path(bundle_dir)
    try:
        b = ResultBundle.load(d)
    except Exception as exc:  # noqa: BLE001 - any unreadable bundle is bad input, named
        raise HistoryError(f"{d}: not a readable bundle: {exc}") from None
    params = b.meta.get("params") or {}
    engine = params.get("spec") or params.get("engine")
    request = params.get("request")
    if not isinstance(engine, Mapping) or not isinstance(request, Mapping):
        raise HistoryError(f"{d / 'meta.json'}: params.spec (or params.engine) and params.request: missing")
    # an A/B request may leave the shape to the engine's preset
    case = (
        case_id(engine, request)
        if request.get("num_frames")
        else str(engine.get("preset") or engine.get("kind"))
    )
    entry = bl.from_bundle(b, case)
    tf = Path(time_file) if time_file else d / "meta.json"
    when = _mtime(tf)
    digest = hashlib.sha256((d / "meta.json").read_bytes()).hexdigest()[:12]
    return HistoryRun(
        source=source,
        run_id=f"{d.parent.name}/{d.name}:{digest}",
        hardware=hardware or bundles_hardware({"b": b}),
        commit=_commit({"b": b}, commit, d),
        time=when,
        values=case_values(case, entry, str(d)),
        source_file=str(d),
        provenance={
            "time_from": f"{tf.name} modification time",
            "perfkit_version": b.meta.get("perfkit_version"),
        },
    )


def read_run(path: str | Path, *, commit: str | None = None, hardware: str | None = None) -> list[HistoryRun]:
    """What ``perfkit history add PATH`` stores: a suite run, an A/B output (two runs; ``commit``
    applies to neither) or one bundle. Raises HistoryError: none of these."""
    p = Path(path)
    if (p / "baseline.json").exists():
        return [read_suite_run(p, commit=commit, hardware=hardware)]
    if (p / "ab.json").exists():
        return [
            read_bundle_run(p / s, source=f"ab-{s.upper()}", hardware=hardware, time_file=p / "ab.json")
            for s in ("a", "b")
            if (p / s / "meta.json").exists()
        ] or _bad(p)
    if (p / "meta.json").exists():
        return [read_bundle_run(p, commit=commit, hardware=hardware)]
    return _bad(p)


def _bad(p: Path) -> list[HistoryRun]:
    raise HistoryError(
        f"{p}: not a perfkit run (no baseline.json), A/B output (no ab.json with a/ and b/) or bundle (no meta.json)"
    )


BASELINES_SOURCE = "perf-baselines"


def git(repo: str | Path, *args: str, error: type[ValueError] = HistoryError) -> str:
    """stdout of ``git -C repo args``. Raises ``error``: git failed or is not installed."""
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
    """Every committed version of ``path`` as a run, oldest first, with sglang's CI tolerances in
    its provenance. Returns (runs, one line per version skipped and why). Raises HistoryError:
    not a git repository, or no commit touches the file."""
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
    doc = bl.loads_baseline(text, where)
    cases = doc.get("scenarios")
    if not isinstance(cases, dict):
        raise HistoryError(f"{where}: scenarios: missing or not an object")
    values = []
    for case, entry in cases.items():
        merged = dict(entry)
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
    except KeyError:  # sglang's CI could not gate with this version
        tolerances = None
    return HistoryRun(
        source=BASELINES_SOURCE,
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


SOURCE = "sglang-nightly"
METRIC = "latency_s"
#: the largest comparison file read (bytes; sglang's hold a few KB; 32 MB took 2.1 GiB)
MAX_BYTES = 2 * 2**20


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow")
    case_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    framework: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    model: str | None = None
    task: str | None = None
    # strict: a string or a bool is a mistyped key; above 1e7 s overflowed `history site`
    latency_s: float | None = Field(strict=True, allow_inf_nan=False, ge=0, le=1e7)
    error: str | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="allow")
    timestamp: datetime
    commit_sha: str = Field(min_length=1)
    run_id: str | int
    results: list[_Result]


@functools.lru_cache(maxsize=4096)
def _labels(model: str | None, task: str | None, framework: str) -> dict[str, str | None]:
    """One shared (never mutated) dict per label set."""
    return {"model": model, "task": task, "framework": framework}


def read_nightly_file(path: str | Path, hardware: str) -> HistoryRun:
    """One comparison file as a run (another framework's case id: ``<case_id>@<framework>``).
    Raises HistoryError naming the file and key: over :data:`MAX_BYTES`, not JSON, a missing or
    mistyped key, a bad latency, a case or key given twice."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise HistoryError(f"{path}: more than {MAX_BYTES >> 20} MiB: refused before parsing")
        # json, not pydantic's reader: it keeps the last of a key given twice
        doc = _File.model_validate(json.loads(raw, object_pairs_hook=unique_keys))
    except ValidationError as exc:
        e = exc.errors()[0]
        key = ".".join(str(x) for x in e["loc"]) or "(top level)"
        raise HistoryError(f"{path}: {key}: {e['msg']}") from None
    except OSError as exc:
        raise HistoryError(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not JSON, not UTF-8, a key given twice
        raise HistoryError(f"{path}: {exc}") from None
    except RecursionError:
        raise HistoryError(f"{path}: nested too deeply to be a nightly comparison file") from None
    values = []
    seen: set[str] = set()
    for i, r in enumerate(doc.results):
        case = r.case_id if r.framework == "sglang" else f"{r.case_id}@{r.framework}"
        if case in seen:
            raise HistoryError(f"{path}: results.{i}.case_id: {r.case_id!r} ({r.framework}) appears twice")
        seen.add(case)
        err = r.error if r.error else (None if r.latency_s is not None else "latency_s is null")
        ok = r.latency_s is not None and not r.error
        labels = _labels(r.model, r.task, r.framework)
        values.append(Value(case, METRIC, "s", float(r.latency_s) if ok else None, err, labels))
    if not values:
        raise HistoryError(f"{path}: results: empty")
    return HistoryRun(
        source=SOURCE,
        run_id=str(doc.run_id),
        hardware=hardware,
        commit=doc.commit_sha,
        time=doc.timestamp,
        values=values,
        source_file=path.name,
        provenance={
            "repository": "sgl-project/ci-data-diffusion",
            "hardware_from": "given by the importer (the files do not name it)",
        },
    )


def read_nightly(path: str | Path, hardware: str) -> list[HistoryRun]:
    """Every comparison file under ``path`` (a file, a directory, a ci-data-diffusion checkout),
    sorted by name. Raises HistoryError: no such path, no ``*.json``, or a bad file."""
    p = Path(path)
    if p.is_file():
        return [read_nightly_file(p, hardware)]
    if (p / "diffusion-comparisons").is_dir():
        p = p / "diffusion-comparisons"
    if not p.is_dir():
        raise HistoryError(f"{path}: no such file or directory")
    files = sorted(p.glob("*.json"))
    if not files:
        raise HistoryError(f"{p}: no nightly comparison file (*.json)")
    return [read_nightly_file(f, hardware) for f in files]
