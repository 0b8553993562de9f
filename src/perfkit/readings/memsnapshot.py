"""Allocator snapshot files (torch's ``_dump_snapshot`` pickle, maybe gzipped): read with a
builtins-only unpickler, validated, grouped by allocation site (MiB). Format, sites: docs/sglang.md."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)

MIB = 2**20
#: path fragments that mark a frame as the engine's own code (checked in order)
ENGINE_MARKERS: tuple[str, ...] = ("perfkit/refengine/", "/sglang/")
#: frames of torch itself and Python's machinery: never a site's "library line"
_INTERNAL = ("/torch/", "<frozen", "/threading.py", "/contextlib.py", "/runpy.py")
NO_STACK = "(no stack recorded)"
_SAFE_GLOBALS = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex")}


class MemSnapshotError(ValueError):
    """A snapshot file that cannot be read; the message names the file (and the key)."""


class Frame(BaseModel):
    """One Python (or C++) frame: function ``name``, ``filename``, ``line``."""

    name: str
    filename: str
    line: int


def _shared_frames(v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    # torch's pickle shares frame dicts among stacks: validate each once, by identity
    cache = info.context.get("frames") if isinstance(info.context, dict) else None
    if cache is None or not isinstance(v, list):
        return handler(v)
    out = []
    for f in v:
        hit = cache.get(id(f))
        if hit is None:
            try:
                hit = cache[id(f)] = (f, Frame.model_validate(f))
            except ValidationError:
                return handler(v)
        out.append(hit[1])
    return out


#: the largest size a block, segment or event may claim (bytes): 1 PiB; more is a corrupted file
MAX_SIZE = 2**50
#: the most bytes a snapshot may decompress to (a gzip bomb is refused before it fills memory)
MAX_BYTES = 256 * 2**20
#: the most memory (bytes) unpickling, then validating, may build (estimated before each)
MAX_BUILD_BYTES = 2**30
_MODEL_BYTES = 600  # a validated Block / TraceEntry (measured: 545 B with an empty stack)


class _Framed(BaseModel):
    """A block or event: ``size`` (bytes) and its allocation stack."""

    size: int = Field(ge=0, le=MAX_SIZE)
    frames: list[Frame] = Field(default_factory=list)
    _frames = field_validator("frames", mode="wrap")(_shared_frames)


class Block(_Framed):
    """A block inside a segment (bytes)."""

    address: int
    requested_size: Optional[int] = None
    state: str


class Segment(BaseModel):
    """One cudaMalloc'd segment of the caching allocator (bytes)."""

    device: int
    address: int
    total_size: int = Field(ge=0, le=MAX_SIZE)
    blocks: list[Block]


class TraceEntry(_Framed):
    """One allocator event (``time_us``: epoch microseconds)."""

    action: str
    addr: int
    time_us: Optional[int] = None


class SnapshotFile(BaseModel):
    """torch's snapshot dict (the keys perfkit reads)."""

    segments: list[Segment]
    device_traces: list[list[TraceEntry]] = Field(default_factory=list)


@dataclass
class MemSnapshot:
    """A validated snapshot. ``path``: where it was read from."""

    path: Path
    segments: list[Segment]
    traces: list[list[TraceEntry]]

    @property
    def live_mib(self) -> float:
        """MiB in active blocks (all devices)."""
        return sum(b.size for _, b in _active(self)) / MIB


class _BuiltinsOnly(pickle.Unpickler):
    def __init__(self, fh: Any, path: Path):
        super().__init__(fh)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise MemSnapshotError(
            f"{self._path}: names the class {module}.{name}; a snapshot holds builtin containers "
            "only, so it is refused (not unpickled)"
        )


_GETS = {"GET", "BINGET", "LONG_BINGET", "DUP"}


def _scan(raw: bytes, path: Path, limit: int) -> None:
    """Refuse a pickle that would build more than ``limit`` bytes, before unpickling it."""
    total = refs = 0
    for n, (op, arg, _) in enumerate(pickletools.genops(raw)):
        if op.name in _GETS:
            refs, total = refs + 1, total + 24
        elif op.name == "MEMOIZE" or "PUT" in op.name:
            if op.name != "MEMOIZE" and arg > n:
                why = "the unpickler would size its memo by it"
                raise MemSnapshotError(f"{path}: memo index {arg} at opcode {n} ({why}): refused")
            total += 16
        elif op.name == "REDUCE":
            total += 24 * refs
        elif op.stack_after:
            refs, total = refs + 1, total + 24 + (216 if arg is None else sys.getsizeof(arg))
        if total > limit:
            raise MemSnapshotError(
                f"{path}: unpickling would build more than {limit / 2**20:.0f} MiB (by opcode {n}): "
                "refused before building it; pass max_build_bytes for a larger genuine snapshot"
            )


def _build_cost(data: dict[str, Any], path: Path, limit: int) -> None:
    """Refuse ``data`` when validating it would build more than ``limit`` bytes."""
    memo: dict[tuple[int, str | None], int] = {}
    total = 0

    def add(n: int, where: str) -> None:
        nonlocal total
        total += n
        if total > limit:
            raise MemSnapshotError(
                f"{path}: {where} expands (by shared references) to more than "
                f"{limit / 2**20:.0f} MiB of validated blocks and events: refused before building "
                "them; pass max_build_bytes for a larger genuine snapshot"
            )

    def cost(obj: Any, parts: str | None) -> int:
        if not isinstance(obj, dict):
            return 0
        hit = memo.get((id(obj), parts))
        if hit is None:
            inner = obj.get(parts) if parts else None
            frames = obj.get("frames")
            hit = _MODEL_BYTES + (8 * len(frames) if isinstance(frames, list) and not parts else 0)
            for b in inner if isinstance(inner, list) else ():
                hit += cost(b, None)
                if hit > limit:
                    break
            memo[id(obj), parts] = hit
        return hit

    for i, seg in enumerate(data.get("segments") or ()):
        add(cost(seg, "blocks"), f"segments.{i}")
    traces = data.get("device_traces")
    for d, trace in enumerate(traces if isinstance(traces, list) else ()):
        for i, e in enumerate(trace if isinstance(trace, list) else ()):
            add(cost(e, None), f"device_traces.{d}.{i}")


def read_snapshot(
    path: str | Path, max_bytes: int = MAX_BYTES, max_build_bytes: int = MAX_BUILD_BYTES
) -> MemSnapshot:
    """Read and validate one snapshot file (pickle or gzip); ``max_bytes`` read and decompressed,
    ``max_build_bytes`` unpickled and validated, each checked before building. Raises
    MemSnapshotError naming the file (and key path): unreadable, over a limit, a class, a bad key."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(min(max_bytes, os.fstat(fh.fileno()).st_size) + 1)
    except OSError as exc:
        raise MemSnapshotError(f"{p}: cannot read the snapshot: {exc.strerror or exc}") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            gz = zlib.decompressobj(31)  # gzip
            raw = gz.decompress(raw, max_bytes + 1)
            if not gz.eof and len(raw) <= max_bytes:
                raise EOFError("the gzip stream ends early")
        if len(raw) > max_bytes:
            raise MemSnapshotError(
                f"{p}: more than {max_bytes / 2**20:.0f} MiB of snapshot (decompressed): refused "
                "before it fills the memory; record fewer max_entries or pass max_bytes"
            )
        _scan(raw, p, max_build_bytes)
        data = _BuiltinsOnly(io.BytesIO(raw), p).load()
    except MemSnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, LookupError, zlib.error, OSError) as exc:
        raise MemSnapshotError(
            f"{p}: not a readable snapshot (truncated or corrupted): {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise MemSnapshotError(f"{p}: expected torch's snapshot dict, got {type(data).__name__}")
    _build_cost(data, p, max_build_bytes)
    try:
        snap = SnapshotFile.model_validate(data, context={"frames": {}})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        raise MemSnapshotError(f"{p}: key {key}: {err['msg']} ({exc.error_count()} problem(s))") from None
    return MemSnapshot(p, snap.segments, snap.device_traces)


def _active(snap: MemSnapshot) -> list[tuple[int, Block]]:
    return [(s.device, b) for s in snap.segments for b in s.blocks if b.state.startswith("active")]


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/src/", "/tmp/site/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    parts = filename.rsplit("/", 2)
    return "/".join(parts[-2:])


def site_of(frames: list[Frame]) -> tuple[str, str, bool]:
    """(site, library line, in_engine) of an allocation stack (frames innermost first): the
    site is ``function (file:line)`` of the innermost engine frame, else of the library line
    (the innermost frame outside torch, else the innermost); :data:`NO_STACK` without frames."""
    if not frames:
        return NO_STACK, "", False

    def fmt(f: Frame) -> str:
        return f"{f.name} ({_short(f.filename)}:{f.line})"

    outside = next((f for f in frames if not any(m in f.filename for m in _INTERNAL)), frames[0])
    for f in frames:
        if any(m in f.filename for m in ENGINE_MARKERS):
            return fmt(f), fmt(outside), True
    return fmt(outside), fmt(outside), False


_COLUMNS = ["site", "library_line", "in_engine", "blocks", "mib"]


def _group(blocks: list[tuple[int, list[Frame]]]) -> pd.DataFrame:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for size, frames in blocks:
        site, lib, in_engine = site_of(frames)
        r = rows.setdefault(
            (site, lib), {"site": site, "library_line": lib, "in_engine": in_engine, "blocks": 0, "mib": 0.0}
        )
        r["blocks"] += 1
        r["mib"] += size / MIB
    df = pd.DataFrame(list(rows.values()), columns=_COLUMNS)
    return df.sort_values(["mib", "site"], ascending=[False, True], ignore_index=True)


def live_by_site(snap: MemSnapshot) -> pd.DataFrame:
    """The live blocks by site: columns site, library_line, in_engine, blocks, mib (largest first)."""
    return _group([(b.size, b.frames) for _, b in _active(snap)])


def diff_snapshots(before: MemSnapshot, after: MemSnapshot) -> pd.DataFrame:
    """What grew by allocation site (a block is the same when address, size and stack match): one
    row a changed site (new/gone blocks and MiB, ``grown_mib``), largest grown first."""

    def key(b: Block) -> tuple[Any, ...]:
        return (b.address, b.size, tuple((f.filename, f.line, f.name) for f in b.frames))

    a = {key(b): b for _, b in _active(before)}
    z = {key(b): b for _, b in _active(after)}
    new = _group([(b.size, b.frames) for k, b in z.items() if k not in a])
    gone = _group([(b.size, b.frames) for k, b in a.items() if k not in z])
    cols = ["site", "library_line", "in_engine"]
    df = new.rename(columns={"blocks": "new_blocks", "mib": "new_mib"}).merge(
        gone.rename(columns={"blocks": "gone_blocks", "mib": "gone_mib"}), on=cols, how="outer"
    )
    df = df.fillna({"new_blocks": 0, "gone_blocks": 0, "new_mib": 0.0, "gone_mib": 0.0})
    df = df.astype({"new_blocks": int, "gone_blocks": int})
    df["grown_mib"] = df["new_mib"] - df["gone_mib"]
    df = df[cols + ["new_blocks", "gone_blocks", "new_mib", "gone_mib", "grown_mib"]]
    return df.sort_values(["grown_mib", "site"], ascending=[False, True], ignore_index=True)


@dataclass
class Peak:
    """The peak of allocated MiB in the trace window, its time (epoch µs), the blocks by site."""

    mib: float
    time_us: Optional[int]
    events: int
    by_site: pd.DataFrame


def _rounded(size: int) -> int:
    """A requested size as the caching allocator's block: a multiple of 512 bytes, at least 512."""
    return max(512, -(-size // 512) * 512)


def peak_by_site(snap: MemSnapshot, since_s: float | None = None, device: int | None = None) -> Peak:
    """The blocks alive at the peak of allocated bytes after ``since_s`` (epoch s), by site: the
    trace replayed back from the live blocks, then forward. Raises MemSnapshotError (naming the
    file): no trace events for the device, or none after ``since_s``."""
    dev = device if device is not None else (snap.segments[0].device if snap.segments else 0)
    events = snap.traces[dev] if dev < len(snap.traces) else []
    if not events:
        raise MemSnapshotError(
            f"{snap.path}: key device_traces.{dev}: no trace events (history not recorded)"
        )
    live: dict[int, tuple[int, list[Frame]]] = {
        b.address: (b.size, b.frames) for d, b in _active(snap) if d == dev
    }
    for e in reversed(events):  # the state before the first event
        if e.action == "alloc":
            live.pop(e.addr, None)
        elif e.action == "free_completed":
            live[e.addr] = (_rounded(e.size), e.frames)
    since_us = None if since_s is None else int(since_s * 1e6)
    start = (
        0
        if since_us is None
        else next((i for i, e in enumerate(events) if (e.time_us or 0) >= since_us), None)
    )
    if start is None:
        raise MemSnapshotError(f"{snap.path}: no trace events after {since_s} (epoch s)")

    def apply(state: dict[int, tuple[int, list[Frame]]], e: TraceEntry) -> int:
        if e.action == "alloc":
            state[e.addr] = (_rounded(e.size), e.frames)
            return state[e.addr][0]
        if e.action == "free_completed" and e.addr in state:
            return -state.pop(e.addr)[0]
        return 0

    state = dict(live)
    total = sum(s for s, _ in state.values())
    best, best_i = -1, start
    for i, e in enumerate(events):
        total += apply(state, e)
        if i >= start and total > best:
            best, best_i = total, i
    state = dict(live)
    for e in events[: best_i + 1]:
        apply(state, e)
    return Peak(
        mib=best / MIB,
        time_us=events[best_i].time_us,
        events=len(events) - start,
        by_site=_group(list(state.values())),
    )
