"""The declared columns of every bundle table (:data:`TABLES`: name, pandas dtype, unit, one line
of doc), the units allowed (:data:`UNITS`) and the unit a column name claims
(:func:`unit_of_suffix`); :func:`markdown` writes them for docs.
"""

from __future__ import annotations

from dataclasses import dataclass

#: version of the bundle files this perfkit writes (meta.json and results.json)
SCHEMA_VERSION = 2

#: ``index`` of a startup warmup request (requests, stages, steps); measured requests have
#: index >= 0 (0 = the cold request of a launch)
WARMUP_INDEX = -1

#: allowed units of a column
UNITS = frozenset(
    {
        "ms",
        "s",
        "MiB",
        "GiB",
        "MHz",
        "W",
        "count",
        "bool",
        "text",
        "id",
        "index",
        "frames",
        "px",
        "fraction",
        "json",
        "mask",
    }
)

#: unit -> the last ``_``-separated word of a column with that unit (and only of those)
UNIT_SUFFIX = {"ms": "ms", "s": "s", "MiB": "mib", "GiB": "gib", "MHz": "mhz", "W": "w"}


@dataclass(frozen=True)
class Column:
    """One declared column.

    Attributes:
        name: column name.
        dtype: pandas dtype string (``"float64"``, ``"Int64"``, ``"string"``, ``"boolean"``).
        unit: one of :data:`UNITS`.
        doc: one line: what the value is.
    """

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
    #: added after its schema version without a bump: a bundle saved before the table existed
    #: has no file for it (read as empty; merge notes it instead of calling it lost data)
    additive: bool = False

    @property
    def names(self) -> list[str]:
        """Column names, in order."""
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        """The declared column ``name``. Raises KeyError when undeclared."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} declares no column {name!r}")


def _c(name: str, dtype: str, unit: str, doc: str) -> Column:
    return Column(name, dtype, unit, doc)


_WARMUP_DOC = f"request index in its launch: 0 = cold request, >= 1 warm, {WARMUP_INDEX} = startup warmup"
_KEY = (
    _c("launch", "string", "id", "launch label (unique in the bundle)"),
    _c("request_id", "string", "id", "request id (joins requests, stages, steps and records)"),
    _c("index", "Int64", "index", _WARMUP_DOC),
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table(
            "requests",
            "one row per request (startup warmup included, index -1)",
            _KEY
            + (
                _c("status", "string", "text", "completed, failed, rejected, timeout, ..."),
                _c("error", "string", "text", "why the request failed (engine or client message)"),
                _c("num_frames", "Int64", "frames", "frames requested"),
                _c("effective_num_frames", "Int64", "frames", "frames generated (aligned to 8k+1)"),
                _c("latent_frames", "Int64", "frames", "latent frames ((num_frames - 1) // 8 + 1)"),
                _c("latent_shape", "string", "text", "latent tensor shape, 'AxBxCxD'"),
                _c("height", "Int64", "px", "output height"),
                _c("width", "Int64", "px", "output width"),
                _c("steps", "Int64", "count", "denoising steps requested"),
                _c("client_ms", "float64", "ms", "latency seen by the client (submit to result)"),
                _c("e2e_ms", "float64", "ms", "server end-to-end time (record total_duration_ms)"),
                _c(
                    "compiles",
                    "Int64",
                    "count",
                    "torch.compile compilations during the request (NA: not reported, as in sglang's records)",
                ),
                _c(
                    "compile_ms",
                    "float64",
                    "ms",
                    "time spent compiling during the request (NaN: not reported)",
                ),
                _c(
                    "recompile_reasons",
                    "string",
                    "text",
                    "recompilation reasons, '; '-joined (NA: not reported)",
                ),
                _c(
                    "compile_phases",
                    "string",
                    "json",
                    "torch's compile timers inside the request: JSON of dynamo_timed name -> ms "
                    "(names nest); null when nothing compiled or the engine does not report them",
                ),
                _c(
                    "recompile_limit_hit",
                    "boolean",
                    "bool",
                    "torch.compile's recompile limit was hit (NA: not reported)",
                ),
                _c(
                    "recompile_limit_stage",
                    "string",
                    "text",
                    "pipeline stage running when the recompile limit was hit",
                ),
                _c("peak_allocated_mib", "float64", "MiB", "device peak allocated during the request"),
                _c("peak_reserved_mib", "float64", "MiB", "device peak reserved during the request"),
                _c("reserved_mib", "float64", "MiB", "device reserved at the request's runtime peak"),
                _c(
                    "host_rss_mib",
                    "float64",
                    "MiB",
                    "host RSS of the engine after the request (NaN: not reported)",
                ),
                _c(
                    "host_anon_mib",
                    "float64",
                    "MiB",
                    "host anonymous RSS of the engine after the request (NaN: not reported)",
                ),
                _c("placement", "string", "text", "where the weights lived (device, group_offload, ...)"),
                _c("t_start_s", "float64", "s", "request start, epoch seconds"),
                _c("t_end_s", "float64", "s", "request end, epoch seconds"),
                _c(
                    "submitted_s",
                    "float64",
                    "s",
                    "engine's job created (request accepted), epoch seconds; NaN: not reported",
                ),
                _c(
                    "started_s",
                    "float64",
                    "s",
                    "engine's job started (taken from its queue), epoch seconds; NaN: not reported",
                ),
                _c("completed_s", "float64", "s", "engine's job completed, epoch seconds; NaN: not reported"),
            ),
        ),
        Table(
            "stages",
            "one row per (request, stage)",
            _KEY
            + (
                _c("stage", "string", "text", "stage name (sglang's: DenoisingStage, DecodingStage, ...)"),
                _c("ms", "float64", "ms", "stage execution time"),
                _c("peak_allocated_mib", "float64", "MiB", "device peak allocated during the stage"),
                _c("t_start_s", "float64", "s", "stage start, epoch seconds"),
                _c("t_end_s", "float64", "s", "stage end, epoch seconds"),
            ),
        ),
        Table(
            "steps",
            "one row per (request, denoising or refinement step)",
            _KEY
            + (
                _c("stage", "string", "text", "stage the step belongs to (DenoisingStage, RefinementStage)"),
                _c("step", "Int64", "index", "step index within the stage, from 0"),
                _c("ms", "float64", "ms", "step time"),
            ),
        ),
        Table(
            "memory",
            "memory timeline samples of each launch",
            (
                _c("launch", "string", "id", "launch label"),
                _c("t_s", "float64", "s", "sample time, epoch seconds"),
                _c("device_used_mib", "float64", "MiB", "engine device memory in use (NaN without NVML)"),
                _c(
                    "device_source",
                    "string",
                    "text",
                    "where device_used_mib came from: nvml-process, nvml-device-delta or none",
                ),
                _c(
                    "host_rss_mib",
                    "float64",
                    "MiB",
                    "host RSS summed over the engine process tree (shared pages once per process)",
                ),
                _c(
                    "host_anon_mib",
                    "float64",
                    "MiB",
                    "host anonymous RSS summed per process over the engine tree: a page shared "
                    "copy-on-write by forked processes counts once per process (the tree once: "
                    "host_pss_mib)",
                ),
                _c(
                    "host_pss_mib",
                    "float64",
                    "MiB",
                    "host PSS of the engine process tree (smaps_rollup; shared pages counted once; "
                    "read on some samples only, NaN between reads)",
                ),
                _c(
                    "host_uss_mib",
                    "float64",
                    "MiB",
                    "host USS of the engine tree: private pages only (a block its forked processes "
                    "share is in none)",
                ),
                _c(
                    "cgroup_current_mib",
                    "float64",
                    "MiB",
                    "memory.current of the engine's own cgroup (NaN: it has none)",
                ),
                _c(
                    "gpu_util_fraction",
                    "float64",
                    "fraction",
                    "NVML GPU utilisation, 0..1 (NaN without NVML)",
                ),
                _c("sm_clock_mhz", "float64", "MHz", "NVML SM clock (slowest engine GPU; NaN: not read)"),
                _c(
                    "power_w", "float64", "W", "NVML power draw summed over the engine's GPUs (NaN: not read)"
                ),
                _c(
                    "clock_event_reasons",
                    "Int64",
                    "mask",
                    "NVML current clock-event reasons, OR over the engine's GPUs (0x4 software power cap, "
                    "0x80 power brake, 0x20/0x40 thermal, 0x1 idle; NA: not read)",
                ),
            ),
        ),
        Table(
            "launches",
            "one row per engine launch (cold start and its parts)",
            (
                _c("launch", "string", "id", "launch label (unique in the bundle)"),
                _c("label", "string", "id", "launch label as given to the launcher"),
                _c("ready_s", "float64", "s", "cold start: launch until ready"),
                _c("process_start_s", "float64", "s", "cold start part: until the process ran"),
                _c("models_loaded_s", "float64", "s", "cold start part: until the models were loaded"),
                _c("warmup_s", "float64", "s", "cold start part: the startup warmup"),
                _c(
                    "cold_start_sources",
                    "string",
                    "text",
                    "where each cold start part came from (OS, engine log line, /health, perfkit-mark) "
                    "or why it is not reported",
                ),
                _c(
                    "first_result_s",
                    "float64",
                    "s",
                    "time to first result: launch until the first successful request ended",
                ),
                _c(
                    "first_request_wait_s",
                    "float64",
                    "s",
                    "time to first result part: ready until the first successful request was sent",
                ),
                _c(
                    "first_request_ms",
                    "float64",
                    "ms",
                    "time to first result part: the first successful request (client view)",
                ),
                _c("warmup_frames", "Int64", "frames", "startup warmup num_frames (0: none)"),
                _c("warmup_latent_shape", "string", "text", "latent shape the startup warmup ran"),
                _c("device_cap_gib", "float64", "GiB", "device memory cap (NaN: none)"),
                _c("host_cap_gib", "float64", "GiB", "host memory cap as asked (NaN: none)"),
                _c("host_cap_asked_gib", "float64", "GiB", "host memory cap asked (NaN: none)"),
                _c(
                    "host_cap_effective_gib",
                    "float64",
                    "GiB",
                    "host cap in force: min(asked, cgroup limits above perfkit, MemTotal)",
                ),
                _c(
                    "host_cap_clamp", "string", "text", "why the host cap in force is below the ask (NA: not)"
                ),
                _c("cap_label", "string", "text", "the memory budget's label (a capped launch)"),
                _c(
                    "enforcement",
                    "string",
                    "text",
                    "how the caps were enforced (none, cgroup, watchdog, ...)",
                ),
                _c(
                    "cap_mechanism",
                    "string",
                    "text",
                    "what held the host cap: cgroup, watchdog-pss, watchdog-rss or none",
                ),
                _c(
                    "host_source",
                    "string",
                    "text",
                    "source of the cap's host figures: cgroup (memory.current), pss, rss or none",
                ),
                _c("host_pss_peak_mib", "float64", "MiB", "peak host PSS of the engine tree (cap watchdog)"),
                _c("cgroup_peak_mib", "float64", "MiB", "peak memory of the engine's own cgroup (NaN: none)"),
                _c("cap_exceeded", "boolean", "bool", "a host cap was exceeded (the engine was stopped)"),
                _c("command", "string", "text", "engine argv, space-joined (secrets redacted)"),
                _c("exit_code", "Int64", "id", "engine exit code (NA: still running at teardown)"),
                _c("error", "string", "text", "why the launch failed, if it did"),
                _c(
                    "ended",
                    "string",
                    "text",
                    "how the engine ended (exit code, signal, killed by perfkit after N s)",
                ),
                _c("end_signal", "Int64", "id", "signal that ended the engine (9: SIGKILL; NA: none)"),
                _c(
                    "end_by_perfkit", "boolean", "bool", "perfkit's teardown ended it (not the engine itself)"
                ),
                _c(
                    "failed_request",
                    "Int64",
                    "id",
                    "index of the request that hung or failed and ended the launch",
                ),
                _c(
                    "oom_record",
                    "string",
                    "text",
                    "the host's OOM-kill record of the engine (kernel log, cgroup)",
                ),
                _c("load_peak_mib", "float64", "MiB", "device peak reserved during model load"),
                _c("load_peak_allocated_mib", "float64", "MiB", "device peak allocated during model load"),
                _c("warmup_peak_mib", "float64", "MiB", "device peak reserved during the startup warmup"),
                _c("placement", "string", "text", "where the weights lived (device, group_offload, ...)"),
                _c("reused_from", "string", "text", "'<scenario>/<launch>' whose session this launch reuses"),
                _c(
                    "config_source",
                    "string",
                    "text",
                    "where the effective config came from: engine record, engine log (<form of sglang's server_args line>), "
                    "not reported",
                ),
                _c("compile_requested", "boolean", "bool", "torch.compile asked for (engine's view)"),
                _c("compile_active", "boolean", "bool", "torch.compile in force, as the engine reports"),
                _c("compile_backend", "string", "text", "torch.compile backend in force"),
                _c(
                    "compile_disabled_reason",
                    "string",
                    "text",
                    "the engine's reason when compile was asked but is not active",
                ),
                _c("recompile_limit", "Int64", "count", "torch._dynamo recompile limit in force"),
                _c("attention_backend", "string", "text", "attention implementation in force"),
                _c("dtype", "string", "text", "weights dtype in force"),
                _c("offload", "string", "text", "offload mode per component, as the engine reports"),
                _c("engine_device", "string", "text", "the engine's device, as it reports"),
            ),
        ),
        Table(
            "traces",
            "one row per profiled request (an extra request: in no other table, statistic or gate); "
            "its torch.profiler trace (sglang's file) is under traces/ in the bundle",
            _KEY
            + (
                _c(
                    "role",
                    "string",
                    "text",
                    "which request was profiled: profiled cold, profiled warm, profiled first of new shape",
                ),
                _c("status", "string", "text", "the profiled request's status (completed, failed, ...)"),
                _c("mode", "string", "text", "sglang's profile mode: full_stages or N_steps"),
                _c(
                    "steps_asked",
                    "Int64",
                    "count",
                    "N of an N_steps trace (sglang's num_profiled_timesteps, -1 resolved); NA: full_stages",
                ),
                _c(
                    "steps_recorded",
                    "Int64",
                    "count",
                    "N_steps: ProfilerStep ranges in the trace (N+1: sglang adds its warm-up step; fewer "
                    "when the request ran out of steps); full_stages: the request's denoising steps",
                ),
                _c(
                    "stages",
                    "string",
                    "text",
                    "the profiled request's performance.log stage names in order, '; '-joined (names "
                    "the trace's STAGE ranges); NA: no record",
                ),
                _c(
                    "file",
                    "string",
                    "text",
                    "the trace file, relative to the bundle (traces/...); NA: none kept",
                ),
                _c("size_mib", "float64", "MiB", "the gzipped trace's size"),
                _c(
                    "kept",
                    "boolean",
                    "bool",
                    "the trace is in the bundle (false: over the size cap, or none)",
                ),
                _c("note", "string", "text", "why no trace was kept (size cap, the engine's error)"),
                _c(
                    "e2e_ms",
                    "float64",
                    "ms",
                    "the profiled request's server time (profiler overhead included)",
                ),
                _c(
                    "injected_ms",
                    "float64",
                    "ms",
                    "test-only injected slowdown of the request, wall time (engine record; NaN: none)",
                ),
            ),
            additive=True,
        ),
        Table(
            "memory_sites",
            "allocation sites from CUDA allocator snapshots on request boundaries (scenario "
            "setting ``snapshot``): what grew between the snapshot after the cold request and after "
            "warm request k, and the blocks alive at warm request k's peak; the snapshots themselves "
            "are under traces/ (memsnap-<launch>-request-<i>.pickle.gz). Empty with the reason in "
            "results.memory_sites.status (``not available on cpu``) when none was read",
            (
                _c("launch", "string", "id", "launch label"),
                _c(
                    "kind",
                    "string",
                    "text",
                    "grew: the diff from_index -> to_index; peak: alive at to_index's peak",
                ),
                _c(
                    "from_index",
                    "Int64",
                    "index",
                    "request index of the earlier snapshot (0: the cold request)",
                ),
                _c("to_index", "Int64", "index", "request index of the later snapshot (warm request k)"),
                _c(
                    "site",
                    "string",
                    "text",
                    "innermost engine frame of the allocation stack: function (file:line)",
                ),
                _c(
                    "library_line",
                    "string",
                    "text",
                    "innermost frame outside torch (the library line that allocated)",
                ),
                _c("in_engine", "boolean", "bool", "the stack has a frame inside the engine"),
                _c("blocks", "Int64", "count", "grew: new minus gone blocks; peak: live blocks"),
                _c("mib", "float64", "MiB", "grew: MiB grown (new - gone); peak: MiB alive at the peak"),
            ),
            additive=True,
        ),
    )
}

#: table names, in file order
TABLE_NAMES = tuple(TABLES)


def unit_of_suffix(name: str) -> str | None:
    """The unit a column name claims by its last ``_``-separated word (``"e2e_ms"`` -> ``"ms"``,
    ``"ms"`` -> ``"ms"``, ``"host_cap_gib"`` -> ``"GiB"``), or None."""
    last = name.rsplit("_", 1)[-1]
    for unit, suffix in UNIT_SUFFIX.items():
        if last == suffix:
            return unit
    return None


def markdown() -> str:
    """Every table and column as Markdown (name, dtype, unit, doc) for docs."""
    lines = []
    for t in TABLES.values():
        lines += [f"### {t.name}", "", t.doc, "", "| column | dtype | unit | doc |", "|---|---|---|---|"]
        lines += [f"| {c.name} | {c.dtype} | {c.unit} | {c.doc} |" for c in t.columns]
        lines.append("")
    return "\n".join(lines)
