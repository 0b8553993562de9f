"""Request traces for the serving-under-load investigation: reading one, and what its
requests say about warmup coverage.

A trace is JSONL, one request a line, with vllm-omni's diffusion benchmark fields: ``width``,
``height``, ``num_frames``, ``num_inference_steps``, ``seed``, ``fps`` and an optional ``slo_ms``
(plus an optional ``prompt``). A field left out takes the params' request value; any other
field, or a value of the wrong type, is refused naming the file, the line and the key.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.engine.client import VideoRequestSpec
from perfkit.scenarios.registry import ScenarioError

__all__ = ["TraceLine", "read_trace", "shape_key", "trace_summary"]

#: at most this many lines (a trace is a sample of a day's requests, replayed in one launch)
MAX_LINES = 100_000


class TraceLine(BaseModel):
    """One trace request (vllm-omni's fields; pixels, frames, steps, ms)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    width: Optional[int] = Field(None, gt=0)
    height: Optional[int] = Field(None, gt=0)
    num_frames: Optional[int] = Field(None, gt=0)
    num_inference_steps: Optional[int] = Field(None, gt=0)
    seed: Optional[int] = None
    fps: Optional[int] = Field(None, gt=0)
    slo_ms: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    prompt: Optional[str] = None


def read_trace(path: Path, base: VideoRequestSpec) -> list[tuple[VideoRequestSpec, float | None]]:
    """The trace's requests in order, each as (request, its slo_ms or None).

    Raises:
        ScenarioError: the file is missing, a line is not a JSON object, has an unknown field or
            a wrong value (``trace.jsonl:3: key 'num_frames': ...``), or the trace is empty.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"trace {path}: cannot be read: {exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= MAX_LINES:
            raise ScenarioError(f"{path}: more than {MAX_LINES} requests")
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ScenarioError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ScenarioError(f"{path}:{n}: a request is a JSON object, got {type(obj).__name__}")
        try:
            tl = TraceLine.model_validate(obj)
        except ValidationError as exc:
            e = exc.errors()[0]
            key = ".".join(str(x) for x in e.get("loc") or ()) or "?"
            raise ScenarioError(f"{path}:{n}: key {key!r}: {e.get('msg')} (got {e.get('input')!r})") from None
        fields = {k: v for k, v in tl.model_dump().items() if v is not None and k != "slo_ms"}
        out.append((dataclasses.replace(base, **fields), tl.slo_ms))
    if not out:
        raise ScenarioError(f"{path}: no request in the trace")
    return out


def shape_key(spec: VideoRequestSpec) -> str:
    """A request's shape as the trace tables name it: ``"64x64 25f 4 steps"`` (W x H)."""
    return f"{spec.width}x{spec.height} {spec.num_frames}f {spec.num_inference_steps} steps"


def _p99(x: list[float]) -> float | None:
    return float(np.quantile(x, 0.99)) if x else None


def trace_summary(rows: list[dict[str, Any]], warmup_shape: Any, slos: list[Any]) -> dict[str, Any]:
    """Per shape (in order of first hit): requests, first-hit e2e and compiles, the later
    requests' median, the first-hit penalty (ms), covered (its latent shape equals the startup
    warmup's; None when either is not reported); over the trace: the share of requests of
    uncovered shapes, p99, the p99 with each uncovered first hit replaced by its shape's later
    median, the share of p99 the uncovered first hits cause, SLO attainment over the requests
    that carry ``slo_ms``. ``rows``: the trace's per-request rows in order (ms)."""
    shapes: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = shapes.setdefault(r["shape"], {"shape": r["shape"], "rows": []})
        s["rows"].append(r)
    table = []
    for key, s in shapes.items():
        done = [r for r in s["rows"] if r["status"] == "completed"]
        first = s["rows"][0]
        later = [r["e2e_ms"] for r in done if r is not first]
        latent = next((r["latent_shape"] for r in done if r.get("latent_shape")), None)
        covered = None if latent is None or not warmup_shape else latent == warmup_shape
        later_med = float(np.median(later)) if later else None
        ok_first = first["status"] == "completed"
        table.append(
            {
                "shape": key,
                "requests": len(s["rows"]),
                "latent_shape": latent,
                "covered": covered,
                "first_hit_ms": first["e2e_ms"] if ok_first else None,
                "first_hit_compiles": first.get("compiles"),
                "later_median_ms": later_med,
                "first_hit_penalty_ms": (first["e2e_ms"] - later_med)
                if ok_first and later_med is not None
                else None,
            }
        )
    n = len(rows)
    uncovered = {t["shape"] for t in table if t["covered"] is False}
    e2e = [r["e2e_ms"] for r in rows if r["status"] == "completed"]
    fixed = []
    firsts = {id(shapes[k]["rows"][0]) for k in uncovered}
    later = {t["shape"]: t["later_median_ms"] for t in table}
    for r in rows:
        if r["status"] != "completed":
            continue
        swap = id(r) in firsts and later.get(r["shape"]) is not None
        fixed.append(later[r["shape"]] if swap else r["e2e_ms"])
    p99, p99_fixed = _p99(e2e), _p99(fixed)
    share_p99 = (p99 - p99_fixed) / p99 if p99 and p99_fixed is not None else None
    with_slo = [(r, s) for r, s in zip(rows, slos) if s is not None]
    met = [r for r, s in with_slo if r["status"] == "completed" and r["e2e_ms"] <= s]
    unknown = [t["shape"] for t in table if t["covered"] is None]
    share = sum(t["requests"] for t in table if t["covered"] is False) / n if n else None
    sentence = (
        f"Trace: {n} requests of {len(table)} shapes against a startup warmup of latent shape "
        f"{warmup_shape or 'not reported'}; {len(uncovered)} shape(s) not covered "
        f"({', '.join(sorted(uncovered)) or 'none'}), {share:.0%} of the requests; their first hits "
        f"cause {share_p99:.0%} of the trace's p99."
        if share is not None and share_p99 is not None
        else f"Trace: {n} requests of {len(table)} shapes; coverage not reported for {', '.join(unknown) or 'any'}."
    )
    return {
        "shapes": table,
        "requests": n,
        "uncovered_shapes": sorted(uncovered),
        "coverage_not_reported": unknown,
        "uncovered_share": share,
        "p99_ms": p99,
        "p99_without_uncovered_first_hits_ms": p99_fixed,
        "uncovered_p99_share": share_p99,
        "slo_requests": len(with_slo),
        "slo_attainment": (len(met) / len(with_slo)) if with_slo else None,
        "sentence": sentence,
    }
