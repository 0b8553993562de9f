"""Baseline files: a new document, load (checked), dump and save (atomic)."""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfkit.common import jsonsafe
from perfkit.common.slugs import did_you_mean
from perfkit.gate.baseline.rules import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    DEFAULT_STEP_FRACTIONS,
    DEFAULT_TOLERANCES,
    DERIVED_KEYS,
    ENGINE_KEY,
    SCALAR_METRICS,
    TOP_LEVEL_CASE_MAPS,
    _number_problem,
    is_flat,
)
from perfkit.readings.records import short_repr

#: the largest baseline file read (bytes): sglang's perf_baselines files are about 100 KB
MAX_BASELINE_BYTES = 32 * 2**20


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file (and line/column)."""


def new_baseline(hardware: str | None = None, *, description: str = "") -> dict[str, Any]:
    """An empty baseline document with sglang's default tolerances (:data:`DEFAULT_TOLERANCES`),
    improvement threshold and step fractions."""
    return {
        "metadata": {
            "model": "Diffusion Server",
            "hardware": hardware or "unknown",
            "description": description,
            "last_updated": _dt.date.today().isoformat(),
        },
        "tolerances": copy.deepcopy(DEFAULT_TOLERANCES),
        "improvement_reporting": {"threshold": DEFAULT_IMPROVEMENT_THRESHOLD},
        "sampling": {"step_fractions": list(DEFAULT_STEP_FRACTIONS)},
        "scenarios": {},
    }


def metric_value(v: Any, where: str, nullable: bool = True) -> float | None:
    """A metric as written: None for JSON null ("not measured", sglang writes it), else a finite,
    non-negative number; anything else raises :class:`BaselineError` naming ``where`` (never 0)."""
    if v is None and nullable:
        return None
    problem = _number_problem(v)
    if problem:
        raise BaselineError(f"{where}: {short_repr(v)} {problem}")
    return float(v)


def _validate(doc: Any, source: str) -> None:
    def bad(where: str, what: str) -> BaselineError:
        return BaselineError(f"{source}: {where}: {what}")

    if not isinstance(doc, dict):
        raise bad("top level", f"is {type(doc).__name__}, expected a JSON object")
    sections = ("metadata", "tolerances", "improvement_reporting", "sampling", "scenarios")
    for key in (*sections, *TOP_LEVEL_CASE_MAPS):
        if key in doc and not isinstance(doc[key], dict):
            raise bad(key, f"is {type(doc[key]).__name__}, expected an object")

    def number(where: str, v: Any, nullable: bool = True) -> None:
        metric_value(v, f"{source}: {where}", nullable)

    imp = doc.get("improvement_reporting") or {}
    if "threshold" in imp:
        # sglang: faster than expected * (1 - threshold) is an improvement, so a threshold is a
        # fraction in [0, 1]; a string ("0.2"), NaN or -5 would turn every row into "improved"
        number("improvement_reporting.threshold", imp["threshold"], nullable=False)
        if imp["threshold"] > 1:
            raise bad("improvement_reporting.threshold", f"{imp['threshold']!r} is above 1 (a fraction)")
    all_tols = doc.get("tolerances") or {}
    flat = is_flat(all_tols)  # one set for every profile, as sglang reads it (tolerance_profile)
    for prof, tols in all_tols.items():
        if flat:
            if isinstance(tols, dict):
                raise bad(
                    f"tolerances.{prof}", "an object among flat tolerances (tolerances.e2e is a number)"
                )
            number(f"tolerances.{prof}", tols, nullable=False)
        elif not isinstance(tols, dict):
            raise bad(f"tolerances.{prof}", "expected an object")
        else:
            for k, v in tols.items():
                number(f"tolerances.{prof}.{k}", v, nullable=False)
    fr = (doc.get("sampling") or {}).get("step_fractions")
    if fr is not None:
        if not isinstance(fr, list):
            raise bad("sampling.step_fractions", "expected a list of numbers")
        for i, x in enumerate(fr):
            number(f"sampling.step_fractions[{i}]", x, nullable=False)
            if x > 1:
                raise bad(f"sampling.step_fractions[{i}]", f"{x!r} is above 1 (a fraction of the steps)")
    for case, entry in (doc.get("scenarios") or {}).items():
        if not isinstance(entry, dict):
            raise bad(f"scenarios.{case}", "expected an object")
        for k in entry:  # a renamed key would read as "nothing in the baseline": every stage new
            if k not in DERIVED_KEYS and (near := did_you_mean(k, DERIVED_KEYS, 0.8)):
                raise bad(f"scenarios.{case}.{k}", f"unknown key{near}")
        if all(entry.get(k, {}) == {} for k in DERIVED_KEYS if k != ENGINE_KEY):  # empty maps hold none
            raise bad(f"scenarios.{case}", f"no metric (keys: {', '.join(map(str, entry)) or 'none'})")
        for mkey in ("stages_ms", "denoise_step_ms"):
            if mkey not in entry:
                continue
            m = entry[mkey]
            if not isinstance(m, dict):
                raise bad(f"scenarios.{case}.{mkey}", f"{m!r} is not an object")
            for k, v in m.items():
                number(f"scenarios.{case}.{mkey}.{k}", v)
        for mkey in (*SCALAR_METRICS, "estimated_full_test_time_s"):
            if mkey in entry:
                number(f"scenarios.{case}.{mkey}", entry[mkey])
        ran = entry.get(ENGINE_KEY, {})
        if not isinstance(ran, dict) or any(
            not isinstance(v, bool if k == "compile_active" else str) for k, v in ran.items()
        ):
            raise bad(
                f"scenarios.{case}.{ENGINE_KEY}", f"{ran!r}: expected strings (compile_active: a boolean)"
            )
    for key in TOP_LEVEL_CASE_MAPS:
        for case, v in (doc.get(key) or {}).items():
            number(f"{key}.{case}", v)


def loads_baseline(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse baseline JSON text. Raises :class:`BaselineError` naming ``source`` and line/column."""
    try:
        doc = json.loads(text, object_pairs_hook=jsonsafe.unique_keys)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except ValueError as exc:  # a key twice
        raise BaselineError(f"{source}: {exc}") from None
    except RecursionError:
        raise BaselineError(f"{source}: nested too deeply to be a baseline file") from None
    _validate(doc, source)
    return doc


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Load a baseline file (sglang ``perf_baselines`` layout) as a plain dict, unknown keys kept.

    Raises:
        FileNotFoundError: when the file does not exist.
        BaselineError: when it is larger than :data:`MAX_BASELINE_BYTES`, not valid JSON (message: ``<file>: invalid JSON at line L column
            C: ...``) or has the wrong shape (message names the file and the key path).
    """
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_BASELINE_BYTES:
        raise BaselineError(f"{p}: {size:,} bytes, more than a baseline file holds ({MAX_BASELINE_BYTES:,})")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise BaselineError(f"{p}:{line}: invalid UTF-8 at byte {exc.start + 1}") from None
    return loads_baseline(text, source=str(p))


def dumps_baseline(doc: Mapping[str, Any]) -> str:
    """Serialise like sglang's files: 4-space indent, key order kept, trailing newline."""
    return jsonsafe.dumps(doc, indent=4, ensure_ascii=False) + "\n"


def save_baseline(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``doc`` to ``path`` atomically (see :func:`atomic_write_text`). Returns the path."""
    _validate(doc, "<document to save>")
    p = Path(path)
    atomic_write_text(p, dumps_baseline(doc))
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically.

    Writes a temp file in the same directory, flushes and fsyncs it, then ``os.replace``s it over
    the target (and fsyncs the directory, best effort). On any error the temp file is removed and
    the old file is left untouched. The new file keeps the old file's permission bits (or gets
    0o666 minus the umask when it is new).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        mode = p.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
