"""``perfkit figures`` blocks: Markdown generated from bundles, kept true by ``--check`` (docs/suite.md)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.common.slugs import md_code
from perfkit.investigations import registry
from perfkit.readings.records import parse_lines
from perfkit.report.ab import power_markdown, sequential_markdown
from perfkit.report.runinfo import run_results
from perfkit.report.tables import markdown_table

#: ``commands``: rendered by the caller of :func:`update_file`
KINDS = tuple(
    "key-numbers full compare ab-power ab-sequential history-nightly history-replay timings sglang-tier commands".split()
)
_TIMINGS_FILE = "timings.json"
#: the statistics behind every generated figure, stated under each block
_STATS_NOTE = (
    "Medians and quartiles: numpy's linear interpolation (Hyndman–Fan type 7); intervals: 95 % "
    "percentile bootstrap, seed 0."
)
_BLOCK = re.compile(
    r"(?P<open><!-- perfkit:figures (?P<args>[^>]*?) -->\n)(?P<body>.*?)(?P<close><!-- perfkit:end -->)",
    re.S,
)
_ARG = re.compile(r"(\w+)=(\S+)")
_ATTRS = ("src", "kind", "vs", "threshold", "confidence")
#: the attributes each kind reads beyond src and kind (any other is refused)
_KIND_ATTRS = {
    "compare": ("vs",),
    "ab-power": ("threshold", "confidence"),
    "ab-sequential": ("threshold", "confidence"),
}


def kinds() -> tuple[str, ...]:
    """Every block kind: :data:`KINDS` and the investigations' own."""
    return (*KINDS, *registry.doc_blocks())


def _session() -> str:
    name = registry.session_name()
    if name is None:
        raise FiguresError("compare: no registered investigation declares session=True")
    return name


class FiguresError(ValueError):
    """A figures block that cannot be generated; the message names the file and the block."""


@dataclass(frozen=True)
class Block:
    """One marked block (``src`` relative to the root; ``threshold``, ``confidence``: fractions)."""

    src: str
    kind: str
    vs: str | None = None
    threshold: float | None = None
    confidence: float | None = None


def blocks(text: str, where: str = "<text>") -> list[Block]:
    """The marked blocks of a document. Raises FiguresError: a bad block (names ``where``)."""
    opens = len(re.findall(r"<!-- perfkit:figures\b", text))
    ends = text.count("<!-- perfkit:end -->")
    found = list(_BLOCK.finditer(text))
    if opens != len(found) or ends != len(found):
        raise FiguresError(
            f"{where}: {opens} '<!-- perfkit:figures ... -->' marker(s) and {ends} '<!-- perfkit:end -->' "
            f"marker(s) make {len(found)} complete block(s): every block opens on its own line and ends "
            "with '<!-- perfkit:end -->'"
        )
    out = []
    for m in found:
        pairs = _ARG.findall(m.group("args"))
        if twice := sorted({k for k, _ in pairs if [x for x, _ in pairs].count(k) > 1}):
            raise FiguresError(
                f"{where}: figures attribute(s) {', '.join(twice)} given twice: {m.group('open').strip()}"
            )
        args = dict(pairs)
        if unknown := sorted(set(args) - set(_ATTRS)):
            raise FiguresError(
                f"{where}: unknown figures attribute(s) {', '.join(unknown)} (known: {', '.join(_ATTRS)})"
            )
        if "src" not in args:
            raise FiguresError(f"{where}: figures block without src=: {m.group('open').strip()}")
        kind = args.get("kind", "full")
        if kind not in kinds():
            raise FiguresError(f"{where}: figures block kind={kind!r}; known: {', '.join(kinds())}")
        if ignored := sorted(set(args) - {"src", "kind"} - set(_KIND_ATTRS.get(kind, ()))):
            raise FiguresError(
                f"{where}: kind={kind} takes no {', '.join(ignored)} "
                f"(it takes: src, kind{''.join(', ' + a for a in _KIND_ATTRS.get(kind, ()))}): {m.group('open').strip()}"
            )
        if kind == "compare" and "vs" not in args:
            raise FiguresError(f"{where}: a kind=compare block needs vs=DIR: {m.group('open').strip()}")
        setting: dict[str, float] = {}
        for key, default in (
            ("threshold", stats.DEFAULT_THRESHOLD),
            ("confidence", stats.DEFAULT_CONFIDENCE),
        ):
            text = args.get(key)
            try:
                setting[key] = float(text) if text is not None else default
            except ValueError:
                raise FiguresError(
                    f"{where}: figures {key}={text!r} is not a number (a fraction, e.g. 0.01)"
                ) from None
            if not 0.0 < setting[key] < 1.0:
                raise FiguresError(f"{where}: figures {key}={text!r} must be a fraction in (0, 1)")
        out.append(Block(args["src"], kind, args.get("vs"), setting["threshold"], setting["confidence"]))
    return out


def _unreadable(p: Path, exc: Exception) -> None:
    if isinstance(exc, OSError):
        raise exc
    raise FiguresError(f"{p}: unreadable results ({exc})") from exc


def render_block(block: Block, root: Path) -> str:
    """The Markdown of one block. Raises FiguresError: ``src`` holds no investigation results."""
    src = root / block.src
    if block.kind == "compare":
        return _compare(block, root)
    if block.kind in ("ab-power", "ab-sequential"):
        fn = power_markdown if block.kind == "ab-power" else sequential_markdown
        try:
            return fn(src, float(block.threshold or 0), float(block.confidence or 0), label=block.src)
        except (OSError, ValueError) as exc:
            raise FiguresError(f"{block.kind} {block.src}: {exc}") from exc
    if block.kind in registry.doc_blocks():
        return _combined(block, root)
    if block.kind in ("history-nightly", "history-replay"):
        return _history_nightly(block, root)
    if block.kind == "timings":
        return _timings_markdown(src / _TIMINGS_FILE, label=f"{block.src}/{_TIMINGS_FILE}")
    if block.kind == "sglang-tier":
        return tier_markdown(src / _TIER_FILE, label=f"{block.src}/{_TIER_FILE}")
    results = run_results(src, _unreadable)
    if not results:
        raise FiguresError(f"{src}: no <investigation>/results.json to generate figures from")
    parts: list[str] = []
    if block.kind == "key-numbers":
        rows = [
            (registry.get(name).title, k.label, k.text)
            for name, r in results.items()
            for k in registry.get(name).key_numbers(r)
        ]
        parts.append(markdown_table(pd.DataFrame(rows, columns=["investigation", "what", "value"])))
    else:
        for name, r in results.items():
            parts += _full_section(name, r)
    return _with_footer(parts, md_code(block.src))


def _history_nightly(block: Block, root: Path) -> str:
    """sglang's nightly files under ``src`` (H100): change points and outliers, or replayed."""
    from perfkit.history import changepoints as cp
    from perfkit.history.check import changes_markdown, replay, replay_markdown
    from perfkit.history.runs import read_nightly
    from perfkit.history.store import HistoryError, runs_frame

    try:
        runs = read_nightly(root / block.src, "H100")
    except HistoryError as exc:
        raise FiguresError(f"{block.kind} {block.src}: {exc}") from exc
    if block.kind == "history-replay":
        return f"{replay_markdown(replay(runs))}\n*Generated by `perfkit figures` from {md_code(block.src)} ({len(runs)} runs).*\n"
    frame = runs_frame(runs)
    text = changes_markdown(cp.analyse_frame(frame))
    return (
        f"{text}\n*Generated by `perfkit figures` from {md_code(block.src)} ({frame['run_key'].nunique()} runs): "
        "change points by Apache Otava's E-Divisive and t-test, outliers and intervals by "
        "`perfkit.history.changepoints`.*\n"
    )


class Timing(BaseModel):
    """One recorded wall time of ``timings.json`` (``date`` ISO, ``source``: how it was measured)."""

    model_config = ConfigDict(extra="forbid")
    what: str
    wall_s: float = Field(gt=0)
    machine: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str


class _Timings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timings: list[Timing] = Field(min_length=1)


def _duration(s: float) -> str:
    """``354`` -> ``5 min 54 s``; ``42.4`` -> ``42 s``; ``2593`` -> ``43 min 13 s``."""
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec} s" if m else f"{sec} s"


def _timings_markdown(path: Path, label: str) -> str:
    """Raises FiguresError: the file is missing or not :class:`_Timings` (naming the key)."""
    try:
        doc = _Timings.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FiguresError(f"timings {label}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        e = exc.errors()[0]
        key = ".".join(map(str, e.get("loc") or ())) or "?"
        raise FiguresError(f"timings {label}: {key}: {e.get('msg')}") from None
    rows = [(t.what, _duration(t.wall_s), t.machine, t.date, t.source) for t in doc.timings]
    table = markdown_table(
        pd.DataFrame(rows, columns=["what", "wall time", "machine", "date", "how it was measured"]),
        labels=False,
        own_markdown=True,
    )
    return (
        f"{table}\n\n*Generated by `perfkit figures` from {md_code(label)}: wall times as recorded on the "
        "machine and date of each row; a shared or loaded machine takes longer.*\n"
    )


#: what ``make test-sglang`` writes, committed as a copy
_TIER_FILE = "verdicts.json"


def tier_markdown(path: Path, label: str) -> str:
    """``kind=sglang-tier``: one row per run of ``verdicts.json``. Raises FiguresError: the file is
    missing or not JSON, ``_meta`` lacks a key, a run lacks ``wall_s``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        meta = doc["_meta"]
        date, version, machine, commit = (meta[k] for k in ("date", "sglang", "machine", "commit"))
    except OSError as exc:
        raise FiguresError(f"sglang-tier {label}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise FiguresError(
            f"sglang-tier {label}: no _meta with date, sglang, machine, commit ({exc!r})"
        ) from None
    rows = []
    for name, r in doc.items():
        if name == "_meta":
            continue
        if not isinstance(r, dict) or not isinstance(r.get("wall_s"), (int, float)):
            raise FiguresError(f"sglang-tier {label}: {name}: no wall_s")
        n = Counter((r.get("checks") or {}).values())
        counts = ", ".join(f"{n[st]} {st}" for st in ("pass", "fail", "skipped") if n[st])
        code = r.get("exit_code")
        rows.append(
            (
                name,
                str(r.get("verdict") or "–"),
                "–" if code is None else str(code),
                _duration(r["wall_s"]),
                counts or "–",
            )
        )
    table = markdown_table(
        pd.DataFrame(rows, columns=["run", "verdict", "exit code", "wall time", "checks"]), labels=False
    )
    return (
        f"{table}\n\n*Generated by `perfkit figures` from {md_code(label)}: `make test-sglang` on {machine}, "
        f"{date}, sglang {version}, perfkit {commit}.*\n"
    )


def _with_footer(parts: list[str], source: str) -> str:
    parts = [*parts, "", f"*Generated by `perfkit figures` from {source}. {_STATS_NOTE}*", ""]
    return "\n".join(parts).replace("\n\n\n", "\n\n")


def _full_section(name: str, r: dict) -> list[str]:
    s = registry.get(name)
    keys = pd.DataFrame([(k.label, k.text) for k in s.key_numbers(r)], columns=["what", "value"])
    parts = [f"#### {s.title}", "", markdown_table(keys), ""]
    table = s.summary_table(r)
    if table is not None and not table.empty:
        parts += [markdown_table(table), ""]
    if reading := (s.reading(r) or "").strip():
        parts += [reading, ""]
    return parts


def _combined(block: Block, root: Path) -> str:
    """An investigation's DocBlock: the comma-separated ``src`` results combined, as ``full``."""
    investigation, decl = registry.doc_blocks()[block.kind]
    name = investigation.name
    srcs = block.src.split(",")
    if any(not x for x in srcs):
        raise FiguresError(f"{block.kind} src={block.src}: an empty item in the list")
    found = []
    where: dict[Path, str] = {}
    for src in srcs:
        d = (root / src).resolve()
        if d in where:
            raise FiguresError(f"{block.kind} src={block.src}: {src} is {where[d]} again")
        where[d] = src
        if not d.is_dir():
            raise FiguresError(f"{block.kind}: {root / src}: no such directory")
        r = run_results(d, _unreadable).get(name)
        if r is None:
            raise FiguresError(f"{block.kind}: {root / src} has no {name}/results.json")
        found.append(r)
    try:
        r = dict(decl.combine(found, [f"{s}/{name}/results.json" for s in srcs]))
    except registry.InvestigationError as exc:
        raise FiguresError(f"{block.kind} {block.src}: {exc}") from exc
    names = ", ".join(md_code(x) for x in srcs)
    return _with_footer(_full_section(name, r), f"{names} ({len(srcs)} {decl.verb})")


def update_text(text: str, root: Path, where: str = "<text>", commands: Callable | None = None) -> str:
    """``text`` with every marked block regenerated (``kind=commands`` by ``commands(block, root)``)."""
    found = iter(blocks(text, where))  # validated first: a bad block fails before anything is rendered

    def sub(m: re.Match) -> str:
        try:
            b = next(found)
            body = commands(b, root) if commands and b.kind == "commands" else render_block(b, root)
        except FiguresError as exc:
            raise FiguresError(f"{where}: {exc}") from exc
        return m.group("open") + body + m.group("close")

    return _BLOCK.sub(sub, text)


MAX_DOC_BYTES = 8 * 2**20


def update_file(
    path: str | Path, root: str | Path, check: bool = False, commands: Callable | None = None
) -> bool:
    """Regenerate the blocks of ``path`` (untouched with ``check``); whether its text changed. Raises
    FiguresError: a bad block, no results, over :data:`MAX_DOC_BYTES`; OSError: unreadable file."""
    p = Path(path)
    if p.stat().st_size > MAX_DOC_BYTES:
        raise FiguresError(
            f"{p}: {p.stat().st_size:,} bytes, more than a Markdown page holds ({MAX_DOC_BYTES:,})"
        )
    old = p.read_text(encoding="utf-8")
    if not blocks(old, str(p)):
        raise FiguresError(f"{p}: no '<!-- perfkit:figures src=... -->' block")
    new = update_text(old, Path(root), str(p), commands)
    changed = not same_figures(old, new)
    if changed and not check:
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(p)
    return changed


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.(\d+))?")


def same_figures(old: str, new: str) -> bool:
    """Whether two renderings say the same, each number within one unit of its last digit."""
    if _NUMBER.sub("#", old) != _NUMBER.sub("#", new):
        return False
    for a, b in zip(_NUMBER.finditer(old), _NUMBER.finditer(new)):
        unit = 10.0 ** -max(len(a.group(1) or ""), len(b.group(1) or ""))
        if abs(float(a.group().replace(",", "")) - float(b.group().replace(",", ""))) > unit * 1.000001:
            return False
    return True


def _warm(src: str, root: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.Series]:
    """(warm requests, stages, steps, launch row + ``rank_peaks`` MiB) of ``DIR/<inv>[@<launch>]``."""
    path, _, launch = src.partition("@")
    b = ResultBundle.load(root / path if launch else root / path / _session())
    warm = b.measured_requests(launch or None)
    warm = warm[(warm["index"] > 0).fillna(False).to_numpy(bool)]
    lt = b.table("launches")
    lt = lt[lt["launch"] == launch] if launch else lt
    if warm.empty or lt.empty:
        raise ValueError(f"{src}: no warm request or no such launch")
    ids = set(warm["request_id"])
    stages = b.stages[b.stages["request_id"].isin(ids)]
    steps = b.steps[b.steps["request_id"].isin(ids)]
    row = lt.iloc[0].copy()
    # per-rank device peaks of a multi-GPU engine (its records' perfkit.ranks)
    peaks: dict[int, float] = {}
    for lines in b.records.values():
        for rec in parse_lines(lines).records:
            if rec.request_id not in ids:
                continue
            for k, r in enumerate(rec.perfkit.get("ranks") or []):
                v = r.get("peak_reserved_mb")
                if isinstance(v, (int, float)):
                    peaks[k] = max(peaks.get(k, 0.0), float(v))
    row["rank_peaks"] = peaks
    return warm, stages, steps, row


def _compare(block: Block, root: Path) -> str:
    try:
        a, sa, pa, la = _warm(block.src, root)
        b, sb, pb, lb = _warm(str(block.vs), root)
    except (OSError, ValueError, KeyError) as exc:
        raise FiguresError(
            f"compare {block.src} vs {block.vs}: no {_session()} bundle to compare ({exc})"
        ) from exc
    rows = []

    def row(what: str, x: list[float], y: list[float], unit: str = "ms") -> None:
        x = [v for v in x if v == v]
        y = [v for v in y if v == v]
        if not x and not y:
            return
        if not x or not y:  # measured on one side only (e.g. rank 1 of a 2-GPU run vs 1 GPU)
            one = f"{float(pd.Series(x or y).median()):,.1f} {unit}"
            rows.append((what, one if x else "–", one if y else "–", "–", "–"))
            return
        mx, my = float(pd.Series(x).median()), float(pd.Series(y).median())
        ci = "–"
        if len(x) > 1 or len(y) > 1:
            lo, hi = stats.bootstrap_ratio_ci(x, y)
            ci = f"{lo:.2f}–{hi:.2f}"
        rows.append((what, f"{mx:,.1f} {unit}", f"{my:,.1f} {unit}", f"{mx / my:.2f}", ci))

    row("warm request e2e", list(a["e2e_ms"]), list(b["e2e_ms"]))
    for x, y, what in ((sa, sb, "{} (warm)"), (pa, pb, "{} step")):
        for st in dict.fromkeys([*x["stage"], *y["stage"]]):
            row(what.format(st), list(x["ms"][x["stage"] == st]), list(y["ms"][y["stage"] == st]))
    row(
        "peak VRAM reserved (largest GPU, warm)",
        list(a["peak_reserved_mib"]),
        list(b["peak_reserved_mib"]),
        "MiB",
    )
    for k in sorted(set(la["rank_peaks"]) | set(lb["rank_peaks"])):
        row(
            f"peak VRAM reserved, rank {k} (GPU {k})",
            [la["rank_peaks"].get(k, math.nan)],
            [lb["rank_peaks"].get(k, math.nan)],
            "MiB",
        )
    row("cold start, ready", [float(la["ready_s"])], [float(lb["ready_s"])], "s")
    row("time to first result", [float(la["first_result_s"])], [float(lb["first_result_s"])], "s")
    df = pd.DataFrame(rows, columns=["what", "A", "B", "A/B", "95% CI of A/B"])
    note = (
        f"*Generated by `perfkit figures` from the warm requests of {md_code(block.src)} and {md_code(block.vs)} "
        f"(a directory: its `{_session()}` session; `DIR/<investigation>@<launch>`: that launch): "
        "medians over the warm requests (steps: over every step of them); A/B below 1: A is faster; "
        "intervals: percentile bootstrap of the ratio of medians, seed "
        "0 (launch-level figures have one value a side: no interval).*"
    )
    return "\n".join(
        [f"A: {md_code(block.src)} · B: {md_code(block.vs)}", "", markdown_table(df), "", note, ""]
    )
