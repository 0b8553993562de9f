"""ResultBundle: one scenario run's data on disk, loadable anywhere.

Directory layout (``outputs/RUN/<scenario>/``)::

    meta.json         schema_version, scenario, perfkit version, git commit, torch/diffusers
                      versions, host, cpu_count, gpu name/driver, caps, params, engine commands
                      (secrets redacted)
    results.json      scenario-derived results (penalties, coverage, leak checks, verdicts)
    requests.parquet  one row per request (warmup runs included, index -1)
    stages.parquet    one row per (request, stage)
    steps.parquet     one row per (request, denoising step)
    memory.parquet    memory timeline samples
    launches.parquet  one row per engine launch (cold start and its parts)
    records/<launch>.jsonl   raw performance.log lines
    logs/<launch>.{stdout,stderr}.log   engine logs

Table columns (all times in ms unless named ``*_s``/``t*``; memory in MiB):

- requests: launch, request_id, index (0 = cold request, -1 = startup warmup), tag, status,
  error, num_frames, effective_num_frames, latent_frames, height, width, steps, client_ms,
  e2e_ms, compiles, compile_ms, recompile_limit_hit, peak_allocated_mb, peak_reserved_mb,
  host_rss_mib, host_anon_mib, placement, t_start, t_end (epoch s)
- stages: launch, request_id, index, tag, stage, ms, peak_allocated_mb, t_start, t_end
- steps: launch, request_id, index, tag, stage, step, ms
- memory: launch, t (epoch s), device_used_mib, host_rss_mib, host_anon_mib, gpu_util_pct
- launches: launch, label, ready_s, process_start_s, models_loaded_s, warmup_s,
  warmup_frames, device_cap_gib, host_cap_gib, enforcement, cap_exceeded, command, exit_code,
  load_peak_mb, warmup_peak_mb
"""
from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from perfkit.common.provenance import git_commit

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
TABLES = ("requests", "stages", "steps", "memory", "launches")

_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api[_-]?key|access[_-]?key|auth)", re.I)
_SECRET_INLINE = re.compile(
    r"((?:--?[\w-]*(?:token|secret|password|api[_-]?key|access[_-]?key)[\w-]*)[= ]|"
    r"(?:[\w]*(?:TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY)[\w]*)=)(\S+)",
    re.I,
)
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{10,}|sk-[A-Za-z0-9]{10,}|ghp_[A-Za-z0-9]{10,})\b")
REDACTED = "***REDACTED***"


def redact(obj: Any) -> Any:
    """Return a copy with secrets replaced by ``***REDACTED***``.

    Keys that look like secrets (token, secret, password, api key, access key, auth) have their
    values replaced; strings have ``--hf-token X``/``HF_TOKEN=X`` forms and well-known token
    prefixes (hf_, sk-, ghp_) masked.
    """
    if isinstance(obj, dict):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and v not in (None, "") else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [redact(v) for v in obj]
        # a secret flag followed by its value as the next argv element
        for i in range(len(out) - 1):
            if isinstance(out[i], str) and out[i].startswith("-") and _SECRET_KEY.search(out[i]) \
                    and "=" not in out[i]:
                out[i + 1] = REDACTED
        return out
    if isinstance(obj, str):
        s = _SECRET_INLINE.sub(lambda m: m.group(1) + REDACTED, obj)
        return _SECRET_VALUE.sub(REDACTED, s)
    return obj


def _gpu_info() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(h)
            drv = pynvml.nvmlSystemGetDriverVersion()
            total = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**20
            return {"gpu_name": name if isinstance(name, str) else name.decode(),
                    "gpu_driver": drv if isinstance(drv, str) else drv.decode(),
                    "gpu_count": pynvml.nvmlDeviceGetCount(), "gpu_total_mib": round(total)}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML on this host is a normal case
        return {"gpu_name": None, "gpu_driver": None, "gpu_count": 0, "gpu_total_mib": None}


def environment_meta() -> dict[str, Any]:
    """Facts needed to reproduce a run: versions, git commit, host, CPU count, GPU."""
    import perfkit

    meta: dict[str, Any] = {
        "perfkit_version": perfkit.__version__,
        "git_commit": git_commit(),
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
    meta.update(_gpu_info())
    return meta


@dataclass
class ResultBundle:
    """One scenario's data. Tables are pandas DataFrames with the columns in the module doc.

    Attributes:
        scenario: ``cold_warm``, ``warmup_shapes`` or ``memory_budget``.
        meta: reproduction facts (see :func:`environment_meta`), caps, params, commands.
        results: scenario-derived results (JSON-serialisable dict).
        tables: name -> DataFrame for each of :data:`TABLES`.
        records: launch label -> raw performance.log lines (JSON strings).
        logs: file name -> text of engine logs.
        path: where it was saved/loaded, if anywhere.
    """

    scenario: str
    meta: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    records: dict[str, list[str]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    def table(self, name: str) -> pd.DataFrame:
        """A table by name (an empty DataFrame when absent)."""
        return self.tables.get(name, pd.DataFrame())

    @property
    def requests(self) -> pd.DataFrame:
        return self.table("requests")

    @property
    def stages(self) -> pd.DataFrame:
        return self.table("stages")

    @property
    def steps(self) -> pd.DataFrame:
        return self.table("steps")

    @property
    def memory(self) -> pd.DataFrame:
        return self.table("memory")

    @property
    def launches(self) -> pd.DataFrame:
        return self.table("launches")

    def measured_requests(self, launch: str | None = None) -> pd.DataFrame:
        """Completed, non-warmup request rows (of one launch when given)."""
        req = self.requests
        if req.empty:
            return req
        mask = pd.Series(True, index=req.index)
        if "tag" in req:
            mask &= req["tag"].fillna("").astype(str).str.lower() != "warmup"
        if "status" in req:
            mask &= req["status"] == "completed"
        if launch is not None and "launch" in req:
            mask &= req["launch"] == launch
        return req[mask]

    def save(self, path: str | Path) -> Path:
        """Write the bundle under ``path`` (created). Returns the directory."""
        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta)
        meta.setdefault("schema_version", SCHEMA_VERSION)
        meta["scenario"] = self.scenario
        _write_json(d / "meta.json", redact(meta))
        _write_json(d / "results.json", redact(self.results))
        for name in TABLES:
            df = self.tables.get(name)
            if df is None:
                df = pd.DataFrame()
            df.to_parquet(d / f"{name}.parquet", index=False)
        (d / "records").mkdir(exist_ok=True)
        for label, lines in self.records.items():
            (d / "records" / f"{_safe(label)}.jsonl").write_text(
                "".join(line if line.endswith("\n") else line + "\n" for line in lines))
        (d / "logs").mkdir(exist_ok=True)
        for name, text in self.logs.items():
            (d / "logs" / _safe(name)).write_text(redact(text))
        self.path = d
        log.info("bundle %s saved to %s", self.scenario, d)
        return d

    @classmethod
    def load(cls, path: str | Path) -> "ResultBundle":
        """Load a bundle directory.

        Raises:
            FileNotFoundError: when ``path`` has no meta.json.
            ValueError: when its schema version is newer than this perfkit understands.
        """
        d = Path(path)
        meta_p = d / "meta.json"
        if not meta_p.exists():
            raise FileNotFoundError(f"{d} is not a result bundle: no meta.json")
        meta = json.loads(meta_p.read_text())
        if int(meta.get("schema_version", 1)) > SCHEMA_VERSION:
            raise ValueError(f"{d}: bundle schema {meta['schema_version']} is newer than "
                             f"this perfkit ({SCHEMA_VERSION})")
        results = json.loads((d / "results.json").read_text()) if (d / "results.json").exists() else {}
        tables = {}
        for name in TABLES:
            p = d / f"{name}.parquet"
            tables[name] = pd.read_parquet(p) if p.exists() else pd.DataFrame()
        records = {}
        if (d / "records").is_dir():
            for p in sorted((d / "records").glob("*.jsonl")):
                records[p.stem] = p.read_text().splitlines()
        logs = {}
        if (d / "logs").is_dir():
            for p in sorted((d / "logs").iterdir()):
                logs[p.name] = p.read_text(errors="replace")
        return cls(scenario=meta.get("scenario", d.name), meta=meta, results=results,
                   tables=tables, records=records, logs=logs, path=d)


def sub_bundle(bundle: ResultBundle, *, launch: Any = None, num_frames: int | None = None,
               skip_first: bool = False) -> ResultBundle:
    """The part of a bundle from one launch and/or one request frame count (tables filtered).

    ``skip_first`` drops the first measured request of the selection (an uncovered cold request,
    whose shape setup is the investigation's finding, not the steady state a baseline holds).
    """
    req = bundle.requests
    if req.empty:
        return bundle
    mask = pd.Series(True, index=req.index)
    if skip_first and "index" in req:
        sel = req
        if launch is not None and "launch" in req:
            sel = sel[sel["launch"] == launch]
        if num_frames is not None and "num_frames" in req:
            sel = sel[sel["num_frames"] == num_frames]
        measured = sel[sel["index"] >= 0]
        if len(measured) >= 2:
            mask &= req.index != measured["index"].idxmin()
    if launch is not None and "launch" in req:
        mask &= req["launch"] == launch
    if num_frames is not None and "num_frames" in req:
        mask &= (req["num_frames"] == num_frames) | (req.get("index", 0) == -1)
    keep = req[mask]
    keys = set(zip(keep.get("launch", pd.Series([None] * len(keep))), keep["request_id"].astype(str)))
    tables = dict(bundle.tables)
    tables["requests"] = keep
    for name in ("stages", "steps"):
        t = bundle.table(name)
        if not t.empty and "request_id" in t:
            la = t["launch"] if "launch" in t else pd.Series([None] * len(t), index=t.index)
            tables[name] = t[[k in keys for k in zip(la, t["request_id"].astype(str))]]
    for name in ("memory", "launches"):
        t = bundle.table(name)
        if launch is not None and not t.empty and "launch" in t:
            tables[name] = t[t["launch"] == launch]
    return ResultBundle(scenario=bundle.scenario, meta=bundle.meta, results=bundle.results,
                        tables=tables, path=bundle.path)


def cold_request_covered(bundle: ResultBundle) -> bool:
    """Whether the first measured request has the latent shape the startup warmup ran.

    False (uncovered) when the warmup's shape differs or there was no warmup; True when shapes
    are unknown (other engines' records carry no latent shape: keep every request, as sglang's
    baseline dump does).
    """
    req = bundle.requests
    if req.empty or "latent_shape" not in req or "index" not in req:
        return True
    warm = req[req["index"] < 0]["latent_shape"].dropna()
    first = req[req["index"] >= 0].sort_values("index")["latent_shape"].dropna()
    if first.empty:
        return True
    if warm.empty:
        return False
    return str(first.iloc[0]) in {str(x) for x in warm}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def load_many(paths: Iterable[str | Path], table: str = "requests") -> pd.DataFrame:
    """Concatenate one table across bundles, adding ``host``, ``scenario`` and ``bundle`` columns.

    Bundles from different hosts load into one table; a bundle lacking the table adds no rows.
    """
    frames = []
    for p in paths:
        b = ResultBundle.load(p)
        df = b.table(table).copy()
        df.insert(0, "host", b.meta.get("host"))
        df.insert(1, "scenario", b.scenario)
        df.insert(2, "bundle", str(p))
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
