"""sglang's nightly diffusion comparisons as history runs: ``sgl-project/ci-data-diffusion``'s
``diffusion-comparisons/<date>_<run_id>.json`` (``timestamp``, ``commit_sha``, ``run_id``,
``results``: ``case_id``, ``framework``, ``model``, ``task``, ``latency_s``, ``error``), metric
``latency_s`` (s); an error or a null is a gap. The files do not name the hardware: the caller does.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.common.jsonsafe import unique_keys
from perfkit.history.store import HistoryError, HistoryRun, Value

SOURCE = "sglang-nightly"
METRIC = "latency_s"
#: the largest comparison file read (bytes; sglang's hold a few KB): a larger one is refused
#: before parsing (32 MB took 2.1 GiB); at least 40 bytes a result, 50,000 results at most
MAX_BYTES = 2 * 2**20


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow")
    # printable, at most 200 characters: a case id names files and table rows
    case_id: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    framework: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    model: str | None = None
    task: str | None = None
    # strict: a string ("7.5") or a bool (true) is a mistyped key, not a latency; a value
    # outside JSON's finite numbers (1e400 reads as inf, NaN), below 0 or above 1e7 s (115 days;
    # 1e308 overflowed `history site`) is refused
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
    """One shared (never mutated) dict per distinct label set."""
    return {"model": model, "task": task, "framework": framework}


def nightly_files(path: str | Path) -> list[Path]:
    """The comparison files under ``path``: a file, a directory of them, or a checkout of
    ``ci-data-diffusion`` (its ``diffusion-comparisons/``). Sorted by name.

    Raises:
        HistoryError: ``path`` does not exist or holds no ``*.json`` file.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if (p / "diffusion-comparisons").is_dir():
        p = p / "diffusion-comparisons"
    if not p.is_dir():
        raise HistoryError(f"{path}: no such file or directory")
    files = sorted(p.glob("*.json"))
    if not files:
        raise HistoryError(f"{p}: no nightly comparison file (*.json)")
    return files


def read_nightly_file(path: str | Path, hardware: str) -> HistoryRun:
    """One comparison file as a :class:`HistoryRun` (source ``sglang-nightly``).

    A non-sglang framework's result gets case id ``<case_id>@<framework>``.

    Raises:
        HistoryError: over :data:`MAX_BYTES`, not JSON (or nested too deeply), or a missing/mistyped key (names the
            file and the key, e.g. ``results.3.latency_s``): a latency that is a string, a bool,
            not finite (NaN, 1e400), negative or above 1e7 s; an empty ``commit_sha``, ``case_id`` or
            ``framework``; a case (of one framework) given twice; a key given twice in one object.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise HistoryError(f"{path}: more than {MAX_BYTES >> 20} MiB: refused before parsing")
        # json reads it (pydantic's own JSON reader keeps the last of a key given twice)
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
        if case in seen:  # two latencies of one case in one run: which one is the run's?
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
    """Every comparison file under ``path`` (:func:`nightly_files`) as runs; the first bad
    file raises :class:`HistoryError` naming it and its key, and nothing is returned."""
    return [read_nightly_file(f, hardware) for f in nightly_files(path)]
