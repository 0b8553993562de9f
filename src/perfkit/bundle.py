"""ResultBundle: one investigation run's data on disk (``outputs/RUN/<investigation>/``), loadable
anywhere; bundle files are read only here. Columns, units and versions: :mod:`perfkit.bundle_schema`,
docs/DESIGN.md "Bundles".
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import shutil
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from perfkit.bundle_schema import (
    MAX_ROWS,
    SCHEMA_VERSION,
    WARMUP_INDEX,
    check_rows,
    conform,
    upgrade_results,
    upgrade_table,
)
from perfkit.bundle_schema import TABLE_NAMES as TABLES  # noqa: I001 - file order; declarations below
from perfkit.bundle_schema import TABLES as TABLE_SCHEMAS
from perfkit.common import jsonsafe
from perfkit.common.provenance import git_commit, source_digest
from perfkit.readings.sampler.nvml import gpu_facts

log = logging.getLogger(__name__)

# Redaction in linear time (docs/robustness.md, "Input limits"): patterns that never backtrack.
_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api[_-]?key|access[_-]?key|auth)", re.I)
#: secret words a ``KEY=value`` or ``--flag value`` name holds (``auth``/``passwd`` only as keys)
_SECRET_NAME = re.compile(r"token|secret|password|api[_-]?key|access[_-]?key", re.I)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_SECRET_VALUE = re.compile(r"\b(?:hf_|sk-|ghp_)[A-Za-z0-9]{10,}+\b")
_SPACE = re.compile(r"(\s+)")
REDACTED = "***REDACTED***"


#: what makes two measurements the same engine and request shape (``meta["params"]`` ``spec``
#: and ``request``; the frame count is an investigation's own axis, an A/B compares it too)
IDENTITY_SPEC = ("kind", "preset", "model_path")
IDENTITY_REQUEST = ("height", "width", "num_inference_steps")


def _secret_name(name: str, *, dashed_only: bool = False) -> bool:
    """Whether the name ending ``name`` holds a secret word after a ``-`` (``--hf-token``) or,
    unless ``dashed_only``, in its last ``\\w`` run (``HF_TOKEN``). One backwards walk: linear."""
    i = len(name)
    word_start = None
    while i > 0 and (name[i - 1] in _NAME_CHARS or name[i - 1].isalnum()):
        if name[i - 1] == "-" and word_start is None:
            word_start = i
        i -= 1
    if word_start is None:
        word_start = i
    dash = name.find("-", i)
    if dash >= 0 and _SECRET_NAME.search(name, dash):
        return True
    if dashed_only:
        return False
    if _SECRET_NAME.search(name, word_start):
        return True
    # api-key / access-key: the secret word itself spans the run's last dash
    dash, k = word_start - 1, word_start - 1
    while k > 0 and (name[k - 1].isalnum() or name[k - 1] == "_"):
        k -= 1
    m = _SECRET_NAME.search(name, k) if dash >= 0 and name[dash : dash + 1] == "-" else None
    return bool(m and m.start() < dash < m.end())


def _redact_token(tok: str) -> str:
    """One whitespace-free token with the value after its first secret ``NAME=`` replaced."""
    start = 0
    while True:
        eq = tok.find("=", start)
        if eq < 0:
            return tok
        if eq + 1 < len(tok) and _secret_name(tok[start:eq]):
            return tok[: eq + 1] + REDACTED
        start = eq + 1


def _redact_text(text: str) -> str:
    """Secrets in free text: ``NAME=value``, ``--secret-flag value`` and hf_/sk-/ghp_ tokens."""
    if "=" not in text and "-" not in text and not any(p in text for p in ("hf_", "sk-", "ghp_")):
        return text
    parts = _SPACE.split(text)  # tokens at even indices, whitespace runs at odd ones
    flag_before = False
    for i in range(0, len(parts), 2):
        tok = parts[i]
        if not tok:
            continue
        if flag_before and parts[i - 1] == " ":
            parts[i] = REDACTED
            flag_before = False
            continue
        if "=" in tok:
            tok = _redact_token(tok)
        # a --secret-flag outside a value that is already redacted
        flag_before = "-" in tok and _secret_name(tok, dashed_only=True)
        parts[i] = _SECRET_VALUE.sub(REDACTED, tok)
    return "".join(parts)


def redact(obj: Any) -> Any:
    """A copy with secrets (secret-looking keys' values, ``--hf-token X``, ``HF_TOKEN=X``, hf_/sk-/ghp_
    tokens) replaced by ``***REDACTED***``; linear time on any input (docs/robustness.md)."""
    if isinstance(obj, dict):
        return {
            k: (REDACTED if _SECRET_KEY.search(str(k)) and v not in (None, "") else redact(v))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        out = [redact(v) for v in obj]
        # a secret flag followed by its value as the next argv element
        for i in range(len(out) - 1):
            if (
                isinstance(out[i], str)
                and out[i].startswith("-")
                and _SECRET_KEY.search(out[i])
                and "=" not in out[i]
            ):
                out[i + 1] = REDACTED
        return out
    if isinstance(obj, str):
        return _redact_text(obj)
    return obj


def environment_meta() -> dict[str, Any]:
    """Facts needed to reproduce a run: versions, git commit and source digest, host, CPUs, GPU."""
    from perfkit.common.version import __version__ as perfkit_version

    meta: dict[str, Any] = {
        "perfkit_version": perfkit_version,
        "git_commit": git_commit(),
        "source_digest": source_digest(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    for mod in ("torch", "diffusers", "transformers"):
        try:
            meta[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            meta[f"{mod}_version"] = None
    meta.update(gpu_facts())
    meta["nccl_version"] = _nccl_version()
    return meta


def _nccl_version() -> str | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL
        return None


def _table_property(name: str, doc: str) -> Any:
    return property(lambda self: self.table(name), doc=f"The ``{name}`` table: {doc}.")


@dataclass
class ResultBundle:
    """One investigation's data (investigation ``ab`` for an A/B side); read tables through
    :meth:`table` or the properties: every declared column (:data:`TABLE_SCHEMAS`) in its dtype.
    records: launch -> raw performance.log lines; logs, traces: file name -> text, path."""

    investigation: str
    meta: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    records: dict[str, list[str]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    traces: dict[str, Path] = field(default_factory=dict)
    path: Path | None = None

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` with every declared column (missing ones all-NA) in its dtype; KeyError:
        not a declared table; ValueError: the table holds an undeclared column."""
        if name not in TABLE_SCHEMAS:
            raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}")
        df = conform(name, self.tables.get(name))
        if name in self.tables:
            self.tables[name] = df  # conformed once; later reads are cheap
        return df

    requests = _table_property("requests", "one row per request, startup warmup included (index -1)")
    stages = _table_property("stages", "one row per (request, stage); ms")
    steps = _table_property("steps", "one row per (request, step); ms")
    memory = _table_property("memory", "memory timeline samples; MiB, t_s epoch s")
    launches = _table_property("launches", "one row per engine launch; cold start parts in s, peaks in MiB")

    def measured_requests(self, launch: str | None = None) -> pd.DataFrame:
        """Completed request rows that are not the startup warmup, of one launch when given."""
        req = self.requests
        if req.empty:
            return req
        mask = (req["index"] != WARMUP_INDEX).fillna(False) & (req["status"] == "completed").fillna(False)
        if launch is not None:
            mask &= (req["launch"] == launch).fillna(False)
        return req[mask.to_numpy(bool)]

    def save(self, path: str | Path) -> Path:
        """Write the bundle under ``path`` at :data:`SCHEMA_VERSION`; returns the directory.
        ValueError naming table and column: a table holds an undeclared column."""
        tables = {name: conform(name, self.tables.get(name)) for name in TABLES}  # check first
        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta)
        meta["schema_version"] = SCHEMA_VERSION
        meta["scenario"] = self.investigation
        meta["tables"] = list(TABLES)  # what this writer wrote (merge: a missing one is lost)
        results = {k: v for k, v in dict(self.results).items() if k != "schema_version"}
        nulled = jsonsafe.non_finite(results)
        if nulled:  # JSON has no NaN: written as null, and meta.json says which and why
            meta["results_null"] = {
                p: "not a finite number (nothing measured): written as null" for p, _ in nulled
            }
        _write_json(d / "meta.json", redact(meta))
        _write_json(d / "results.json", redact({"schema_version": SCHEMA_VERSION, **results}))
        for name, df in tables.items():
            df.to_parquet(d / f"{name}.parquet", index=False)
        (d / "records").mkdir(exist_ok=True)
        for label, lines in self.records.items():
            (d / "records" / f"{_safe(label)}.jsonl").write_text(
                "".join(line if line.endswith("\n") else line + "\n" for line in lines)
            )
        (d / "logs").mkdir(exist_ok=True)
        for name, text in self.logs.items():
            (d / "logs" / _safe(name)).write_text(redact(text))
        if self.traces:
            (d / "traces").mkdir(exist_ok=True)
        for name, src in list(self.traces.items()):
            dest = d / "traces" / _safe(name)
            if Path(src).resolve() != dest.resolve():
                shutil.copyfile(src, dest)
            self.traces[name] = dest
        self.path = d
        log.info("bundle %s saved to %s", self.investigation, d)
        return d

    @classmethod
    def load(cls, path: str | Path) -> "ResultBundle":
        """Load a bundle directory (an older schema upgraded in memory). FileNotFoundError: no
        meta.json; ValueError naming file and key: a file not a bundle's (bad JSON, schema version,
        investigation name, undeclared column, too many rows)."""
        d = Path(path)
        meta_p = d / "meta.json"
        meta = read_meta(d)
        version = _version(meta, meta_p, default=1)
        scen = meta.get("scenario", d.name)
        if not isinstance(scen, str) or not (_INVESTIGATION_NAME.fullmatch(scen) or "scenario" not in meta):
            raise ValueError(f"{meta_p}: scenario: {scen!r} is not an investigation name")
        results = _results(d, version)
        tables = {}
        for name in TABLES:
            p = d / f"{name}.parquet"
            try:
                if p.exists() and (rows := pq.read_metadata(p).num_rows) > MAX_ROWS:
                    raise ValueError(f"{rows:,} rows, over the limit of {MAX_ROWS:,} for a bundle table")
                df = pd.read_parquet(p) if p.exists() else pd.DataFrame()
                tables[name] = conform(name, upgrade_table(name, df, version))
                check_rows(name, tables[name])
            except ValueError as exc:
                raise ValueError(f"{p}: {exc}") from None
        if version < SCHEMA_VERSION:
            meta["upgraded_from_schema"] = version
            meta["schema_version"] = SCHEMA_VERSION
        records = {p.stem: p.read_text().splitlines() for p in sorted((d / "records").glob("*.jsonl"))}
        logs = {p.name: p.read_text(errors="replace") for p in _listing(d / "logs")}
        traces = {p.name: p for p in _listing(d / "traces")}
        return cls(scen, meta, results, tables, records, logs, traces, d)


def read_meta(path: str | Path) -> dict[str, Any]:
    """Bundle directory ``path``'s meta.json, checked, not upgraded; raises as :meth:`ResultBundle.load`."""
    meta_p = Path(path) / "meta.json"
    if not meta_p.exists():
        raise FileNotFoundError(f"{path} is not a result bundle: no meta.json")
    return _read_object(meta_p)


def identity_differences(
    recorded: dict[str, Any], engine: dict[str, Any] | None, request: dict[str, Any] | None
) -> list[str]:
    """How ``engine`` / ``request`` (None: not compared) differ from a bundle's ``meta["params"]``
    on the identity keys: ``"engine.preset: given 'tiny', measured with 'ltx-2b'"`` each."""
    out = []
    for where, given, had, keys in (
        ("engine", engine, recorded.get("spec"), IDENTITY_SPEC),
        ("request", request, recorded.get("request"), IDENTITY_REQUEST),
    ):
        if given is not None and had:
            out += [
                f"{where}.{k}: given {given.get(k)!r}, measured with {had.get(k)!r}"
                for k in keys
                if given.get(k) != had.get(k)
            ]
    return out


def read_results(path: str | Path) -> dict[str, Any]:
    """Bundle directory ``path``'s results.json, upgraded ({} without one); ValueError naming the file."""
    d = Path(path)
    meta_p = d / "meta.json"
    return _results(d, _version(_read_object(meta_p), meta_p, default=1) if meta_p.exists() else 1)


def _results(d: Path, version: int) -> dict[str, Any]:
    res_p = d / "results.json"
    if not res_p.exists():
        return {}
    results = _read_object(res_p)
    return upgrade_results(results, _version(results, res_p, default=version))


_INVESTIGATION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
#: a bundle's JSON files are a few KiB to a few MiB
MAX_JSON_BYTES = 256 * 2**20


def _read_object(path: Path) -> dict[str, Any]:
    """A bundle JSON file's object; ValueError naming ``path`` (and line) for anything else."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{path}: {size:,} bytes, over the limit of {MAX_JSON_BYTES:,} for a bundle file")
    raw = path.read_bytes()
    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=_bundle_int, object_pairs_hook=jsonsafe.unique_keys)
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}:{line}: invalid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a bundle file") from None
    except ValueError as exc:  # a key given twice, an integer of hundreds of digits
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: top level: is {type(doc).__name__}, expected a JSON object")
    if bad := jsonsafe.non_finite(doc):
        raise ValueError(f"{path}: {bad[0][0]}: {bad[0][1]!r} is not a finite number (perfkit writes null)")
    return doc


def _bundle_int(digits: str) -> int:
    if len(digits.lstrip("-")) > 20:
        raise ValueError(f"an integer of {len(digits)} digits ({digits[:12]}…) is not a bundle value")
    return int(digits)


def _version(doc: Any, path: Path, default: int) -> int:
    raw = doc.get("schema_version", default) if isinstance(doc, dict) else default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"{path}: schema_version {raw!r} is not a schema version (an integer >= 1)")
    if raw > SCHEMA_VERSION:
        raise ValueError(
            f"{path}: bundle schema {raw} is newer than this perfkit "
            f"(schema {SCHEMA_VERSION}); upgrade perfkit to read it"
        )
    return raw


def sub_bundle(
    bundle: ResultBundle, *, launch: Any = None, num_frames: int | None = None, skip_first: bool = False
) -> ResultBundle:
    """The part of a bundle from one launch and/or frame count (warmup rows kept); ``skip_first``
    drops the first measured request."""
    req = bundle.requests
    if req.empty:
        return bundle
    every = pd.Series(True, index=req.index)
    in_launch = (req["launch"] == launch).fillna(False) if launch is not None else every
    of_frames = (req["num_frames"] == num_frames).fillna(False) if num_frames is not None else every
    mask = in_launch & (of_frames | (req["index"] == WARMUP_INDEX).fillna(False))
    if skip_first:
        measured = req[(in_launch & of_frames & (req["index"] != WARMUP_INDEX).fillna(False)).to_numpy(bool)]
        if len(measured) >= 2:
            mask &= req.index != measured["index"].astype("float64").idxmin()
    keep = req[mask.to_numpy(bool)]
    keys = set(row_keys(keep))
    tables = dict(bundle.tables)
    tables["requests"] = keep
    for name in ("stages", "steps"):
        t = bundle.table(name)
        if not t.empty:
            tables[name] = rows_of(t, keys)
    for name in ("memory", "launches"):
        t = bundle.table(name)
        if launch is not None and not t.empty:
            tables[name] = t[(t["launch"] == launch).fillna(False).to_numpy(bool)]
    return replace(bundle, tables=tables)  # records and logs kept: what the engine ran


def row_keys(df: pd.DataFrame) -> list[tuple[Any, str]]:
    """(launch, request_id) per row of a conformed table; a missing launch is None."""
    return [(None if pd.isna(la) else la, str(rid)) for la, rid in zip(df["launch"], df["request_id"])]


def rows_of(df: pd.DataFrame, keys: set[tuple[Any, str]]) -> pd.DataFrame:
    """The rows of conformed table ``df`` whose :func:`row_keys` are in ``keys``."""
    if df.empty or not keys:
        return df.iloc[0:0]
    return df[[k in keys for k in row_keys(df)]]


def table_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A table's rows as dicts with ``pd.NA`` as None (float NaN stays NaN)."""
    return [{k: (None if v is pd.NA else v) for k, v in r.items()} for r in df.to_dict("records")]


def cold_request_covered(bundle: ResultBundle) -> bool:
    """Whether the first measured request has a latent shape the startup warmup ran (unknown: True)."""
    req = bundle.requests
    if req.empty or req["latent_shape"].isna().all():
        return True
    warmup = (req["index"] == WARMUP_INDEX).fillna(False).to_numpy(bool)
    warm = req[warmup]["latent_shape"].dropna()
    first = req[~warmup].sort_values("index")["latent_shape"].dropna()
    if first.empty:
        return True
    if warm.empty:
        return False
    return str(first.iloc[0]) in {str(x) for x in warm}


def steady_state(bundle: ResultBundle, *, launch: Any = None, num_frames: int | None = None) -> ResultBundle:
    """The slice a baseline case holds, without the first measured request the warmup did not cover."""
    sel = sub_bundle(bundle, launch=launch, num_frames=num_frames)
    return sub_bundle(sel, skip_first=not cold_request_covered(sel))


def _listing(d: Path) -> list[Path]:
    return sorted(d.iterdir()) if d.is_dir() else []


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(jsonsafe.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
