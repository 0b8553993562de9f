"""The declared tables of a :class:`perfkit.bundle.ResultBundle` (:data:`TABLES`), the bundle
files' version, a frame cast to its declaration (:func:`conform`) and older bundles read as the
current schema in memory. The naming and unit rules: docs/DESIGN.md, "Bundles".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

#: version of the bundle files this perfkit writes (meta.json and results.json)
SCHEMA_VERSION = 2

#: ``index`` of a startup warmup request; measured requests have index >= 0 (0: the cold one)
WARMUP_INDEX = -1

#: allowed units of a column
UNITS = frozenset("ms s MiB GiB MHz W count bool text id index frames px fraction json mask".split())

#: unit -> the last ``_``-separated word of a column with that unit (and only of those)
UNIT_SUFFIX = {"ms": "ms", "s": "s", "MiB": "mib", "GiB": "gib", "MHz": "mhz", "W": "w"}


@dataclass(frozen=True)
class Column:
    """One declared column: pandas ``dtype`` and ``unit`` (one of :data:`UNITS`)."""

    name: str
    dtype: str
    unit: str
    doc: str


@dataclass(frozen=True)
class Table:
    """One declared table: a name, a line of doc and its columns (in file order)."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    #: added within its schema version: an older bundle has no file for it (read as empty)
    additive: bool = False

    @property
    def names(self) -> list[str]:
        """Column names, in order."""
        return [c.name for c in self.columns]


def _table(name: str, doc: str, rows: str, additive: bool = False) -> Table:
    """Table ``name`` from ``rows``: ``name dtype unit doc`` a line (indented: the doc goes on)."""
    lines = [ln for ln in re.sub(r"\n +", " ", rows).split("\n") if ln]
    return Table(name, doc, tuple(Column(*ln.split(None, 3)) for ln in lines), additive)


# fmt: off
_KEY = f"""
launch      string  id     launch label (unique in the bundle)
request_id  string  id     request id (joins requests, stages, steps and records)
index       Int64   index  request index in its launch: 0 = cold request, >= 1 warm, {WARMUP_INDEX} = startup warmup
"""
TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _table("requests", "one row per request (startup warmup included, index -1)", _KEY + """
status                 string   text    completed, failed, rejected, timeout, ...
error                  string   text    why the request failed (engine or client message)
num_frames             Int64    frames  frames requested
effective_num_frames   Int64    frames  frames generated (aligned to 8k+1)
latent_frames          Int64    frames  latent frames ((num_frames - 1) // 8 + 1)
latent_shape           string   text    latent tensor shape, 'AxBxCxD'
height                 Int64    px      output height
width                  Int64    px      output width
steps                  Int64    count   denoising steps requested
client_ms              float64  ms      latency seen by the client (submit to result)
e2e_ms                 float64  ms      server end-to-end time (record total_duration_ms)
compiles               Int64    count   torch.compile compilations during the request (NA: not reported, as in sglang's
                                        records)
compile_ms             float64  ms      time spent compiling during the request (NaN: not reported)
recompile_reasons      string   text    recompilation reasons, '; '-joined (NA: not reported)
compile_phases         string   json    torch's compile timers inside the request: JSON of dynamo_timed name -> ms (names
                                        nest); null when nothing compiled or the engine does not report them
recompile_limit_hit    boolean  bool    torch.compile's recompile limit was hit (NA: not reported)
recompile_limit_stage  string   text    pipeline stage running when the recompile limit was hit
peak_allocated_mib     float64  MiB     device peak allocated during the request
peak_reserved_mib      float64  MiB     device peak reserved during the request
reserved_mib           float64  MiB     device reserved at the request's runtime peak
host_rss_mib           float64  MiB     host RSS of the engine after the request (NaN: not reported)
host_anon_mib          float64  MiB     host anonymous RSS of the engine after the request (NaN: not reported)
placement              string   text    where the weights lived (device, group_offload, ...)
t_start_s              float64  s       request start, epoch seconds: the engine's record's t_start (its pipeline start)
                                        when it reports one, else perfkit's submit time
t_end_s                float64  s       request end, epoch seconds: the engine's record's t_end when it reports one,
                                        else the time perfkit saw the request end
submitted_s            float64  s       engine's job created (request accepted), epoch seconds; NaN: not reported
started_s              float64  s       engine's job started (taken from its queue), epoch seconds; NaN: not reported
completed_s            float64  s       engine's job completed, epoch seconds; NaN: not reported
"""),
        _table("stages", "one row per (request, stage)", _KEY + """
stage               string   text  stage name (sglang's: DenoisingStage, DecodingStage, ...)
ms                  float64  ms    stage execution time
peak_allocated_mib  float64  MiB   device peak allocated during the stage
t_start_s           float64  s     stage start, epoch seconds
t_end_s             float64  s     stage end, epoch seconds
"""),
        _table("steps", "one row per (request, denoising or refinement step)", _KEY + """
stage  string   text   stage the step belongs to (DenoisingStage, RefinementStage)
step   Int64    index  step index within the stage, from 0
ms     float64  ms     step time
"""),
        _table("memory", "memory timeline samples of each launch", """
launch               string   id        launch label
t_s                  float64  s         sample time, epoch seconds
device_used_mib      float64  MiB       engine device memory in use (NaN without NVML)
device_source        string   text      where device_used_mib came from: nvml-process, nvml-device-delta or none
host_rss_mib         float64  MiB       host RSS summed over the engine process tree (shared pages once per process)
host_anon_mib        float64  MiB       host anonymous RSS summed per process over the engine tree: a page shared
                                        copy-on-write by forked processes counts once per process (the tree once:
                                        host_pss_mib)
host_pss_mib         float64  MiB       host PSS of the engine process tree (smaps_rollup; shared pages counted once; read on
                                        some samples only, NaN between reads)
host_uss_mib         float64  MiB       host USS of the engine tree: private pages only (a block its forked processes share
                                        is in none)
cgroup_current_mib   float64  MiB       memory.current of the engine's own cgroup (NaN: it has none)
gpu_util_fraction    float64  fraction  NVML GPU utilisation, 0..1 (NaN without NVML)
sm_clock_mhz         float64  MHz       NVML SM clock (slowest engine GPU; NaN: not read)
power_w              float64  W         NVML power draw summed over the engine's GPUs (NaN: not read)
clock_event_reasons  Int64    mask      NVML current clock-event reasons, OR over the engine's GPUs (0x4 software power cap,
                                        0x80 power brake, 0x20/0x40 thermal, 0x1 idle; NA: not read)
"""),
        _table("launches", "one row per engine launch (cold start and its parts)", """
launch                   string   id      launch label (unique in the bundle)
label                    string   id      launch label as given to the launcher
ready_s                  float64  s       cold start: launch until ready
process_start_s          float64  s       cold start part: until the process ran
models_loaded_s          float64  s       cold start part: until the models were loaded
warmup_s                 float64  s       cold start part: the startup warmup
cold_start_sources       string   text    where each cold start part came from (OS, engine log line, /health, perfkit-mark)
                                          or why it is not reported
first_result_s           float64  s       time to first result: launch until the first successful request ended
first_request_wait_s     float64  s       time to first result part: ready until the first successful request was sent
first_request_ms         float64  ms      time to first result part: the first successful request (client view)
warmup_frames            Int64    frames  startup warmup num_frames (0: none)
warmup_latent_shape      string   text    latent shape the startup warmup ran
device_cap_gib           float64  GiB     device memory cap (NaN: none)
host_cap_gib             float64  GiB     host memory cap asked, the launch's budget (NaN: none; in force: host_cap_effective_gib)
host_cap_asked_gib       float64  GiB     host memory cap asked, as its enforcer held it (NaN: no cap enforced)
host_cap_effective_gib   float64  GiB     host cap in force: min(asked, cgroup limits above perfkit, MemTotal)
host_cap_clamp           string   text    why the host cap in force is below the ask (NA: not)
cap_label                string   text    the memory budget's label (a capped launch)
enforcement              string   text    how the caps were enforced (none, cgroup, watchdog, ...)
cap_mechanism            string   text    what held the host cap: cgroup, watchdog-pss, watchdog-rss or none
host_source              string   text    source of the cap's host figures: cgroup (memory.current), pss, rss or none
host_pss_peak_mib        float64  MiB     peak host PSS of the engine tree (cap watchdog)
cgroup_peak_mib          float64  MiB     peak memory of the engine's own cgroup (NaN: none)
cap_exceeded             boolean  bool    a host cap was exceeded (the engine was stopped)
command                  string   text    engine argv, space-joined (secrets redacted)
exit_code                Int64    id      engine exit code (NA: still running at teardown)
error                    string   text    why the launch failed, if it did
ended                    string   text    how the engine ended (exit code, signal, killed by perfkit after N s)
end_signal               Int64    id      signal that ended the engine (9: SIGKILL; NA: none)
end_by_perfkit           boolean  bool    perfkit's teardown ended it (not the engine itself)
failed_request           Int64    id      index of the request that hung or failed and ended the launch
oom_record               string   text    the host's OOM-kill record of the engine (kernel log, cgroup)
load_peak_mib            float64  MiB     device peak reserved during model load
load_peak_allocated_mib  float64  MiB     device peak allocated during model load
warmup_peak_mib          float64  MiB     device peak reserved during the startup warmup
placement                string   text    where the weights lived (device, group_offload, ...)
reused_from              string   text    '<investigation>/<launch>' whose session this launch reuses
config_source            string   text    where the effective config came from: engine record, engine log (<form of sglang's
                                          server_args line>), not reported
compile_requested        boolean  bool    torch.compile asked for (engine's view)
compile_active           boolean  bool    torch.compile in force, as the engine reports
compile_backend          string   text    torch.compile backend in force
compile_disabled_reason  string   text    the engine's reason when compile was asked but is not active
recompile_limit          Int64    count   torch._dynamo recompile limit in force
attention_backend        string   text    attention implementation in force
dtype                    string   text    weights dtype in force
offload                  string   text    offload mode per component, as the engine reports
engine_device            string   text    the engine's device, as it reports
"""),
        _table("traces", "one row per profiled request (an extra request: in no other table, statistic or gate); "
               "its torch.profiler trace (sglang's file) is under traces/ in the bundle", _KEY + """
role            string   text   which request was profiled: profiled cold, profiled warm, profiled first of new shape
status          string   text   the profiled request's status (completed, failed, ...)
mode            string   text   sglang's profile mode: full_stages or N_steps
steps_asked     Int64    count  N of an N_steps trace (sglang's num_profiled_timesteps, -1 resolved); NA: full_stages
steps_recorded  Int64    count  N_steps: ProfilerStep ranges in the trace (N+1: sglang adds its warm-up step; fewer when the
                                request ran out of steps); full_stages: the request's denoising steps
stages          string   text   the profiled request's performance.log stage names in order, '; '-joined (names the trace's
                                STAGE ranges); NA: no record
file            string   text   the trace file, relative to the bundle (traces/...); NA: none kept
size_mib        float64  MiB    the gzipped trace's size
kept            boolean  bool   the trace is in the bundle (false: over the size cap, or none)
note            string   text   why no trace was kept (size cap, the engine's error)
e2e_ms          float64  ms     the profiled request's server time (profiler overhead included)
injected_ms     float64  ms     test-only injected slowdown of the request, wall time (engine record; NaN: none)
""", additive=True),
        _table("memory_sites", "allocation sites from CUDA allocator snapshots on request boundaries (investigation "
               "setting ``snapshot``): what grew between the snapshot after the cold request and after "
               "warm request k, and the blocks alive at warm request k's peak; the snapshots themselves "
               "are under traces/ (memsnap-<launch>-request-<i>.pickle.gz). Empty with the reason in "
               "results.memory_sites.status (``not available on cpu``) when none was read", """
launch        string   id     launch label
kind          string   text   grew: the diff from_index -> to_index; peak: alive at to_index's peak
from_index    Int64    index  request index of the earlier snapshot (0: the cold request)
to_index      Int64    index  request index of the later snapshot (warm request k)
site          string   text   innermost engine frame of the allocation stack: function (file:line)
library_line  string   text   innermost frame outside torch (the library line that allocated)
in_engine     boolean  bool   the stack has a frame inside the engine
blocks        Int64    count  grew: new minus gone blocks; peak: live blocks
mib           float64  MiB    grew: MiB grown (new - gone); peak: MiB alive at the peak
""", additive=True),
    )
}
# fmt: on

#: table names, in file order
TABLE_NAMES = tuple(TABLES)


def unit_of_suffix(name: str) -> str | None:
    """The unit a column name claims by its last ``_``-separated word (``e2e_ms``: ms), or None."""
    return {suffix: unit for unit, suffix in UNIT_SUFFIX.items()}.get(name.rsplit("_", 1)[-1])


def markdown() -> str:
    """Every table and column as Markdown (name, dtype, unit, doc) for docs."""
    lines = []
    for t in TABLES.values():
        lines += [f"### {t.name}", "", t.doc, "", "| column | dtype | unit | doc |", "|---|---|---|---|"]
        lines += [f"| {c.name} | {c.dtype} | {c.unit} | {c.doc} |" for c in t.columns]
        lines.append("")
    return "\n".join(lines)


def _cast(s: pd.Series, dtype: str) -> pd.Series:
    if str(s.dtype) == dtype:
        return s
    if dtype == "string":
        return s.map(lambda v: None if _missing(v) else str(v)).astype("string")
    if dtype == "boolean":
        return s.map(lambda v: pd.NA if _missing(v) else bool(v)).astype("boolean")
    num = pd.to_numeric(s, errors="coerce")  # Int64 or float64
    bad = s[(num.isna() & ~s.map(_missing)) | s.map(lambda v: dtype == "float64" and isinstance(v, str))]
    if len(bad):  # text in a number column: an error, never a silent NaN (issue 54)
        raise ValueError(f"column {s.name!r} holds {bad.iloc[0]!r}, not a number ({dtype})")
    if dtype == "float64":
        return num.astype("float64")
    frac = num[num.notna() & (num != num.round())] if num.dtype.kind == "f" else num[:0]
    if len(frac):  # 1.5 as a request index was rounded to 2: another request's row
        raise ValueError(f"column {s.name!r} holds {float(frac.iloc[0])!r}, not an integer ({dtype})")
    return num.round().astype("Int64") if num.dtype.kind == "f" else num.astype(dtype)


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v))


def conform(name: str, df: pd.DataFrame | None) -> pd.DataFrame:
    """``df`` with every declared column of table ``name``, in order, in its dtype (missing: all-NA).
    KeyError: not a declared table; ValueError: an undeclared column, or a non-number in a number
    column (a fraction in an integer one)."""
    table = TABLES[name]
    df = pd.DataFrame() if df is None else df
    extra = [c for c in df.columns if c not in table.names]
    if extra:
        raise ValueError(
            f"table {name!r}: undeclared column(s) {', '.join(map(repr, extra))} "
            f"(declare them in perfkit.bundle_schema.TABLES[{name!r}])"
        )
    wide = df.reset_index(drop=True).reindex(columns=table.names)  # a missing column all NaN
    out = pd.DataFrame({c.name: _cast(wide[c.name], c.dtype) for c in table.columns}, columns=table.names)
    out.index = df.index if len(df) else out.index
    return out


#: the columns that name one row of a table (its measured requests' rows, index >= 0)
ROW_KEYS = {"requests": ("launch", "index"), "stages": ("launch", "index", "stage")}
#: rows a bundle table may hold: a day of 0.1 s memory samples is 864,000
MAX_ROWS = 5_000_000


def check_rows(name: str, df: pd.DataFrame) -> None:
    """ValueError when a measured request or one of its stages has two rows in table ``name``."""
    keys = ROW_KEYS.get(name)
    if keys is None or df.empty:
        return
    rows = df[(df["index"] >= 0).fillna(False)]
    dup = rows[rows.duplicated(list(keys))]
    if len(dup):
        first = ", ".join(f"{k} {v!r}" if isinstance(v := dup.iloc[0][k], str) else f"{k} {v}" for k in keys)
        raise ValueError(f"two rows for {first}: one row each is what perfkit writes")


# --------------------------------------------------------------------------- version 1
def _v1(*names: str) -> dict[str, str]:
    return {n[:-2] + "b" if n.endswith("_mib") else n[:-2]: n for n in names}


#: table -> {version 1 column: version 2 column}
V1_COLUMN_RENAMES: dict[str, dict[str, str]] = {
    "requests": _v1("peak_allocated_mib", "peak_reserved_mib", "reserved_mib", "t_start_s", "t_end_s"),
    "stages": _v1("peak_allocated_mib", "t_start_s", "t_end_s"),
    "steps": {},
    "memory": _v1("t_s"),
    "launches": _v1("load_peak_mib", "load_peak_allocated_mib", "warmup_peak_mib"),
}
#: results.json's ``caps`` entries: {version 1 key: version 2 key}
V1_CAPS_RENAMES = _v1("peak_reserved_mib", "peak_allocated_mib", "load_peak_mib")


def sampler_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A :class:`perfkit.readings.sampler.MemorySampler` frame (``t``, ``gpu_util_pct``) in the
    memory table's columns; frames already in them pass unchanged."""
    df = frame.rename(columns=V1_COLUMN_RENAMES["memory"])
    if "gpu_util_pct" in df.columns:
        df = df.assign(gpu_util_fraction=pd.to_numeric(df["gpu_util_pct"], errors="coerce") / 100.0)
        df = df.drop(columns=["gpu_util_pct"])
    return df


def upgrade_table(name: str, df: pd.DataFrame, version: int) -> pd.DataFrame:
    """``df`` of table ``name`` written by schema ``version``, in the current columns (version 1:
    renamed, ``gpu_util_pct`` as a fraction, ``tag`` ``warmup`` as :data:`WARMUP_INDEX`)."""
    if version >= SCHEMA_VERSION or df is None:
        return df
    out = df.rename(columns=V1_COLUMN_RENAMES.get(name, {}))
    if name == "memory":
        out = sampler_frame(out)
    if "tag" in out.columns and name in ("requests", "stages", "steps"):
        warm = out["tag"].astype("string").str.lower() == "warmup"
        if "index" in out.columns and warm.fillna(False).any():
            out = out.copy()
            out.loc[warm.fillna(False).to_numpy(bool), "index"] = WARMUP_INDEX
        out = out.drop(columns=["tag"])
    return out


def upgrade_results(results: Mapping[str, Any], version: int = 1) -> dict[str, Any]:
    """results.json written by schema ``version``, with the current keys (a new dict, without
    ``schema_version``); version 1's recorded verdicts are dropped: replay judges checks again."""
    out = {k: v for k, v in dict(results or {}).items() if k != "schema_version"}
    if version >= SCHEMA_VERSION:
        return out
    out.pop("thresholds", None)
    if isinstance(out.get("leak_checks"), list):
        out["leak_checks"] = [
            {k: v for k, v in c.items() if k not in ("passed", "threshold")} if isinstance(c, dict) else c
            for c in out["leak_checks"]
        ]
    if isinstance(out.get("caps"), list):
        out["caps"] = [
            {V1_CAPS_RENAMES.get(k, k): v for k, v in e.items()} if isinstance(e, dict) else e
            for e in out["caps"]
        ]
    return out
