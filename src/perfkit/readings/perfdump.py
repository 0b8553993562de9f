"""sglang's perf dump (``--perf-dump-path FILE``, both layouts) and the before/after comparison
sglang's ``compare_perf.py`` prints. Rules and departures: docs/sglang.md, "Readers"."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.common.slugs import md_text
from perfkit.readings.records import (
    PerfRecord,
    RecordError,
    decode_text,
    load_json,
    read_head,
    read_memory_map,
    read_number,
    read_optional_str,
    read_step_list,
    sum_by_name,
)

#: keys every dump has (``dump_benchmark_report``)
REQUIRED_KEYS = ("request_id", "total_duration_ms", "steps")


@dataclass
class PerfDump(PerfRecord):
    """One perf dump read as a record (ms, MiB): ``stages`` from its ``steps``, ``steps`` its
    ``denoise_steps_ms``; ``denoise_steps``, ``memory_checkpoints`` None in the older layout."""

    denoise_steps: list[float | None] | None = None
    memory_checkpoints: dict[str, dict[str, float | None]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def layout(self) -> str:
        """``"stages_only"`` (older sglang) or ``"with_denoise_steps"``."""
        return "stages_only" if self.denoise_steps is None else "with_denoise_steps"


_OPTIONAL = {"denoise_steps_ms": read_step_list, "memory_checkpoints": read_memory_map}


def perf_dump_from_dict(obj: Any) -> PerfDump:
    """A parsed dump. Raises :class:`RecordError` naming the key sglang would not write so."""
    rid, stages = read_head(obj, "dump", REQUIRED_KEYS, "steps", "is missing (not an sglang perf dump?)")
    opt = {k: read(obj[k], k) for k, read in _OPTIONAL.items() if k in obj}
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise RecordError("meta", f"{meta!r} is not an object")
    denoise, mem = opt.get("denoise_steps_ms"), opt.get("memory_checkpoints")
    return PerfDump(
        request_id=rid,
        total_duration_ms=read_number(obj["total_duration_ms"], "total_duration_ms"),
        stages=stages,
        steps=list(denoise or []),
        memory_snapshots=dict(mem or {}),
        denoise_steps=denoise,
        memory_checkpoints=mem,
        **{k: read_optional_str(obj, k) for k in ("timestamp", "commit_hash", "tag")},
        meta=dict(meta or {}),
        raw=obj,
    )


#: a dump holds one request (under 20 KiB for LTX-2 two-stage): a larger file is refused unread
MAX_DUMP_BYTES = 16 * 2**20


def loads_perf_dump(text: str, source: str = "<string>") -> PerfDump:
    """Parse dump text. Raises :class:`RecordError` naming ``source`` (and the key)."""
    obj = load_json(text, "a perf dump", "invalid JSON at line {lineno} column {colno}: {msg}", source)
    try:
        dump = perf_dump_from_dict(obj)
    except RecordError as exc:
        raise exc.located(source=source) from None
    dump.path = source
    return dump


def read_perf_dump(path: str | Path) -> PerfDump:
    """Read a perf dump file. Raises FileNotFoundError, or :class:`RecordError` naming the file and
    key (not JSON, over :data:`MAX_DUMP_BYTES`, not a dump)."""
    p = Path(path)
    with open(p, "rb") as fh:
        raw = fh.read(MAX_DUMP_BYTES + 1)
    if len(raw) > MAX_DUMP_BYTES:
        raise RecordError(
            "<dump>", f"over {MAX_DUMP_BYTES // 2**20} MiB: not one request's perf dump", source=str(p)
        )
    return loads_perf_dump(decode_text(raw, str(p)), source=str(p))


def is_perf_dump(obj: Any) -> bool:
    """Whether parsed JSON looks like a perf dump, not a record (``stages``) or a baseline."""
    keys = obj.keys() if isinstance(obj, dict) else set()
    return {"total_duration_ms", "steps"} <= keys and not {"stages", "scenarios"} & keys


#: compare_perf.py's thresholds: E2E beyond +-2 %; a stage beyond max(10 %, 120 ms)
#: (``get_perf_status_emoji``); stage rows shown when |diff| > 0.5 ms or a side > 100 ms
E2E_STATUS_PCT = 2.0
STAGE_REL_TOL = 0.1
STAGE_MIN_ABS_TOL_MS = 120.0
STAGE_SHOW_DIFF_MS = 0.5
STAGE_SHOW_MS = 100.0
DENOISING_LOOP = "Denoising Loop"


@dataclass
class DumpRow:
    """``status``: ``slower``, ``faster``, ``similar`` or ``not measured`` (a side null or absent)."""

    name: str
    before: float | None
    after: float | None
    status: str
    steps: tuple[int, int] | None = None  # the loop row's step counts

    @property
    def diff(self) -> float | None:
        """after - before (ms; None when a side is missing)."""
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def pct(self) -> float | None:
        """The difference in percent of before (0 when before is 0; None when a side is missing)."""
        d = self.diff  # compare_perf: base 0 -> 0 %
        return None if d is None else 0.0 if self.before == 0 else d / self.before * 100.0


@dataclass
class DumpComparison:
    """The result of :func:`compare_dumps`."""

    before: PerfDump
    after: PerfDump
    e2e: DumpRow
    stages: list[DumpRow]

    @property
    def compared(self) -> int:
        """How many rows had a number on both sides."""
        return sum(1 for r in (self.e2e, *self.stages) if r.diff is not None)

    @property
    def regressions(self) -> list[DumpRow]:
        """The rows (e2e, then stages) that got slower."""
        return [r for r in (self.e2e, *self.stages) if r.status == "slower"]

    @property
    def verdict(self) -> str:
        """``fail`` (a regression), ``pass``, or ``error`` (nothing compared)."""
        if self.compared == 0:
            return "error"
        return "fail" if self.regressions else "pass"


def _stage_status(b: float | None, n: float | None) -> str:
    if b is None or n is None:
        return "not measured"
    upper = max(b * (1 + STAGE_REL_TOL), b + STAGE_MIN_ABS_TOL_MS)
    lower = min(b * (1 - STAGE_REL_TOL), b - STAGE_MIN_ABS_TOL_MS)
    return "slower" if n > upper else "faster" if n < lower else "similar"


_STEP_NAME = re.compile(r"^denoising_step_(\d+)$")


def _grouped(d: PerfDump) -> tuple[dict[str, float | None], Counter[str]]:
    """Stage ms, steps summed into one row (``consolidate_steps``), and the parts of each."""
    items = [(DENOISING_LOOP if _STEP_NAME.match(n) else n, ms) for n, ms in d.stages]
    items += [(DENOISING_LOOP, ms) for ms in d.denoise_steps or ()]
    return sum_by_name(items), Counter(n for n, _ in items)


def compare_dumps(before: PerfDump, after: PerfDump) -> DumpComparison:
    """Compare as sglang's ``compare_perf.py`` does, but a missing value is "not measured", not 0."""
    e2e = DumpRow("E2E Latency", before.total_duration_ms, after.total_duration_ms, "not measured")
    if e2e.pct is not None:
        e2e.status = (
            "faster" if e2e.pct < -E2E_STATUS_PCT else "slower" if e2e.pct > E2E_STATUS_PCT else "similar"
        )
    (b_dur, b_cnt), (n_dur, n_cnt) = _grouped(before), _grouped(after)
    rows: list[DumpRow] = []
    for name in [*n_dur, *(x for x in b_dur if x not in n_dur)]:
        b, n = b_dur.get(name), n_dur.get(name)
        steps = (b_cnt[name], n_cnt[name]) if name == DENOISING_LOOP else None
        row = DumpRow(name, b, n, _stage_status(b, n), steps)
        d = row.diff
        if d is None or abs(d) > STAGE_SHOW_DIFF_MS or b > STAGE_SHOW_MS or n > STAGE_SHOW_MS:
            rows.append(row)
    return DumpComparison(before, after, e2e, rows)


_EMOJI = {"slower": "🔴", "faster": "🟢", "similar": "⚪️", "not measured": "–"}


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def dump_comparison_markdown(c: DumpComparison) -> str:
    """The report compare_perf.py prints, "–" for values not measured."""
    e = c.e2e
    marks = {"faster": "✅ (Faster)", "slower": "❌ (Slower)", "similar": "➖ (Similar)"}
    e2e_status = marks.get(e.status, "– (not measured)")
    diff = "–" if e.diff is None else f"**{e.diff:+.2f} ms ({e.pct:+.1f}%)**"
    tput = [("–" if v is None else f"{1000 / v if v else 0:.2f} req/s") for v in (e.before, e.after)]
    out = [
        "### Performance Comparison Report",
        "",
        "#### 1. High-level Summary",
        "| Metric | Baseline | New | Diff | Status |",
        "| :--- | :--- | :--- | :--- | :--- |",
        f"| **E2E Latency** | {_ms(e.before)} ms | {_ms(e.after)} ms | {diff} | {e2e_status} |",
        f"| **Throughput** | {tput[0]} | {tput[1]} | - | - |",
        "",
        "#### 2. Stage Breakdown",
    ]
    if not c.stages:
        out.append("*No significant stage differences found.*")
    else:
        out += [
            "| Stage Name | Baseline (ms) | New (ms) | Diff (ms) | Diff (%) | Status |",
            "| :--- | :--- | :--- | :--- | :--- | :--- |",
        ]
        for r in c.stages:
            name = md_text(r.name, cell=True)  # a stage name from the dump: never markup
            if r.steps is not None:
                bs, ns = r.steps
                name += f" ({ns} steps)" if bs == ns else f" ({bs}->{ns} steps)"
            d = "–" if r.diff is None else f"{r.diff:+.2f}"
            p = "–" if r.pct is None else f"{r.pct:+.1f}%"
            out.append(f"| {name} | {_ms(r.before)} | {_ms(r.after)} | {d} | {p} | {_EMOJI[r.status]} |")
    out += [
        "",
        "<details>",
        "<summary>Metadata</summary>",
        "",
        f"- Baseline Commit: {md_text(c.before.commit_hash or 'N/A', code=True)}",
        f"- New Commit: {md_text(c.after.commit_hash or 'N/A', code=True)}",
        "</details>",
    ]
    return "\n".join(out) + "\n"
