"""Suite parameters: the YAML files under ``params/``, validated before anything is launched.

Layout (every section optional except ``name``; unknown keys are errors)::

    name: ci-cpu
    description: ...
    timeout_s: 600                 # per notebook cell (papermill execution timeout)
    engine: {kind, preset, compile, compile_backend, device, dtype, warmup_frames, ...}
                                   # any EngineSpec field (perfkit.engine)
    request: {num_frames, height, width, num_inference_steps, seed, prompt, ...}
    cold_warm: {enabled, repeats, thresholds: {...}, caps: {device_gib, host_gib, label} | null}
    warmup_shapes: {enabled, warmup_frames: [17, 25], request_frames: [25], repeats}
    memory_budget: {enabled, caps: [{label, device_gib, host_gib}], repeats,
                    min_budget: {lo_gib, hi_gib} | null}
    baseline: {file: path | null, profile: pr_test, strict: false, hardware: name | null}
    invariants: {warm_cold_ratio_max: 1.0, ...}   # perfkit.baseline.KNOWN_INVARIANTS

Errors name the file, the key path and, for unknown keys, the closest known key::

    params/ci-cpu.yaml: unknown key 'cold_wram' (line 12) (did you mean 'cold_warm'?)
    params/ci-cpu.yaml: cold_warm.repeats: must be >= 2, got 0 (line 14)
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["ParamsError", "SuiteParams", "load_params", "parse_params", "SCENARIOS"]

#: Investigation notebooks, in run order; the baseline gate runs after them.
SCENARIOS = ("cold_warm", "warmup_shapes", "memory_budget")
#: The reference engine (perfkit.refengine) answers 400 to a height/width not a multiple of this.
REFERENCE_PIXEL_MULTIPLE = 32
#: The reference engine's default --max-frames (requests above it get a 400).
REFERENCE_MAX_FRAMES = 257


class ParamsError(ValueError):
    """Invalid suite parameters; the message names the file and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class RequestParams(_Model):
    """A /v1/videos request (sglang's field names). Pixels, frames, steps."""

    prompt: str = "a cat walks on the beach at sunset, cinematic"
    num_frames: int = Field(25, ge=1)
    height: int = Field(64, ge=8)
    width: int = Field(64, ge=8)
    num_inference_steps: int = Field(4, ge=1)
    seed: int = 0
    guidance_scale: Optional[float] = Field(None, ge=0)
    negative_prompt: Optional[str] = None
    fps: Optional[int] = Field(None, ge=1)


class CapParams(_Model):
    """One memory budget. ``None`` means no cap on that side."""

    label: Optional[str] = None
    device_gib: Optional[float] = Field(None, gt=0)
    host_gib: Optional[float] = Field(None, gt=0)


class ColdWarmParams(_Model):
    enabled: bool = True
    #: requests in the session: one cold + (repeats - 1) warm
    repeats: int = Field(5, ge=2, le=1000)
    #: leak-check thresholds passed to perfkit.scenarios.cold_vs_warm
    thresholds: Optional[dict[str, float]] = None
    caps: Optional[CapParams] = None


class WarmupShapesParams(_Model):
    enabled: bool = True
    warmup_frames: list[int] = Field(default_factory=lambda: [17, 25], min_length=1)
    request_frames: list[int] = Field(default_factory=lambda: [25], min_length=1)
    repeats: int = Field(3, ge=2, le=1000)

    @field_validator("warmup_frames", "request_frames")
    @classmethod
    def _frames(cls, v: list[int], info) -> list[int]:
        least = 0 if info.field_name == "warmup_frames" else 1  # 0 warmup frames: no warmup
        for x in v:
            if x < least:
                raise ValueError(f"frame counts must be >= {least}, got {x}")
        return v


class MinBudgetParams(_Model):
    lo_gib: float = Field(gt=0)
    hi_gib: float = Field(gt=0)
    #: bisection stops when hi - lo <= this (GiB); each probe is one engine launch
    resolution_gib: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _order(self) -> "MinBudgetParams":
        if self.lo_gib >= self.hi_gib:
            raise ValueError(f"lo_gib ({self.lo_gib:g}) must be < hi_gib ({self.hi_gib:g})")
        return self


class MemoryBudgetParams(_Model):
    enabled: bool = True
    caps: list[CapParams] = Field(default_factory=lambda: [CapParams()], min_length=1)
    repeats: int = Field(2, ge=1, le=1000)
    min_budget: Optional[MinBudgetParams] = None


class BaselineParams(_Model):
    #: baseline JSON to compare against (relative to the params file's repo root or absolute)
    file: Optional[str] = None
    profile: str = "pr_test"
    strict: bool = False
    #: metadata.hardware of this run's baseline.json
    hardware: Optional[str] = None


class SuiteParams(_Model):
    name: str
    description: str = ""
    #: papermill per-cell execution timeout (s); None: no limit
    timeout_s: Optional[float] = Field(1800, gt=0)
    engine: dict[str, Any] = Field(default_factory=dict)
    request: RequestParams = Field(default_factory=RequestParams)
    cold_warm: ColdWarmParams = Field(default_factory=ColdWarmParams)
    warmup_shapes: WarmupShapesParams = Field(default_factory=WarmupShapesParams)
    memory_budget: MemoryBudgetParams = Field(default_factory=MemoryBudgetParams)
    baseline: BaselineParams = Field(default_factory=BaselineParams)
    invariants: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: dict[str, Any]) -> dict[str, Any]:
        from perfkit.engine import EngineSpec

        known = {f.name for f in dataclasses.fields(EngineSpec)} | {"command"}
        for key in v:
            if key not in known:
                raise _UnknownKey(key, sorted(known))
        try:
            EngineSpec.from_dict(v)
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("invariants")
    @classmethod
    def _invariants(cls, v: dict[str, Any]) -> dict[str, Any]:
        from perfkit.baseline import KNOWN_INVARIANTS

        for key, val in v.items():
            if key not in KNOWN_INVARIANTS:
                raise _UnknownKey(key, sorted(KNOWN_INVARIANTS))
            if key in ("caps_held", "caps_completed", "warm_degrades_allowed"):
                if not isinstance(val, bool):
                    raise ValueError(f"{key} must be true or false, got {val!r}")
            elif isinstance(val, bool) or not isinstance(val, (int, float)):
                raise ValueError(f"{key} must be a number, got {val!r}")
        return v

    @model_validator(mode="after")
    def _reference_engine(self) -> "SuiteParams":
        """What the reference engine would refuse only after a launch: a 400 for a height or
        width that is not a multiple of 32, an unknown preset, more frames than --max-frames."""
        eng = self.engine
        if eng.get("kind", "reference") != "reference":
            return self
        problems: list[tuple[tuple, str]] = []
        for sec, src in (("request", self.request.model_dump()), ("engine", eng)):
            for key in ("height", "width"):
                v = src.get(key)
                if isinstance(v, int) and not isinstance(v, bool) and v % REFERENCE_PIXEL_MULTIPLE:
                    problems.append(((sec, key), f"must be a multiple of {REFERENCE_PIXEL_MULTIPLE} "
                                                 f"for the reference engine, got {v}"))
        if not eng.get("model_path"):
            preset = eng.get("preset", "tiny")
            try:
                from perfkit.refengine.models import PRESETS
            except ImportError:  # pragma: no cover - no torch here: the launch will say so
                PRESETS = None
            if PRESETS is not None and preset not in PRESETS:
                problems.append((("engine", "preset"),
                                 f"unknown preset {preset!r} for the reference engine; known: "
                                 f"{', '.join(PRESETS)} (or set engine.model_path)"))
        max_frames = eng.get("max_frames") or REFERENCE_MAX_FRAMES
        if self.request.num_frames > max_frames:
            problems.append((("request", "num_frames"),
                             f"must be <= {max_frames} (the reference engine's max_frames), "
                             f"got {self.request.num_frames}"))
        if self.warmup_shapes.enabled:
            for i, f in enumerate(self.warmup_shapes.request_frames):
                if f > max_frames:
                    problems.append((("warmup_shapes", "request_frames", i),
                                     f"must be <= {max_frames} (the reference engine's "
                                     f"max_frames), got {f}"))
        if problems:
            raise _AtKeys(problems)
        return self

    # ------------------------------------------------------------------ helpers
    def enabled(self) -> list[str]:
        """Enabled investigations, in run order."""
        return [s for s in SCENARIOS if getattr(self, s).enabled]

    def engine_spec(self):
        from perfkit.engine import EngineSpec

        return EngineSpec.from_dict(self.engine)

    def invariants_all(self) -> dict[str, Any]:
        """perfkit.baseline.DEFAULT_INVARIANTS overlaid with this file's ``invariants``."""
        from perfkit.baseline import DEFAULT_INVARIANTS

        return {**DEFAULT_INVARIANTS, **self.invariants}


class _AtKeys(ValueError):
    """Problems found across sections: ((key path), message) each."""

    def __init__(self, problems: list[tuple[tuple, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in problems))


class _UnknownKey(ValueError):
    def __init__(self, key: str, known: list[str]) -> None:
        self.key = key
        self.known = known
        super().__init__(f"unknown key {key!r}{_suggest(key, known)}")


def _suggest(key: str, known: list[str]) -> str:
    m = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    return f" (did you mean {m[0]!r}?)" if m else ""


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the model at ``loc`` (the parent of an unknown key)."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return []
        ann = cur.model_fields[part].annotation
        cur = _unwrap(ann)
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _unwrap(ann: Any) -> Any:
    import typing

    args = typing.get_args(ann)
    if not args:
        return ann
    for a in args:
        u = _unwrap(a)
        if isinstance(u, type) and issubclass(u, BaseModel):
            return u
    return ann


def _line_of(text: str, loc: tuple) -> int | None:
    """1-based line of the YAML node at ``loc`` (best effort)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    line = k.start_mark.line + 1
                    node = v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _format_error(err: dict[str, Any], source: str, text: str | None) -> str:
    loc = tuple(err.get("loc") or ())
    path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
    line = _line_of(text, loc) if text else None
    at = f" (line {line})" if line else ""
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    exc = ctx.get("error")
    if typ == "extra_forbidden":
        key = loc[-1] if loc else "?"
        parent = loc[:-1]
        where = ".".join(str(p) for p in parent if not isinstance(p, int))
        known = _known_fields(SuiteParams, parent)
        return (f"{source}: unknown key {key!r}" + (f" in {where}" if where else "") + at
                + _suggest(str(key), known))
    if isinstance(exc, _UnknownKey):
        key_loc = loc + (exc.key,)
        line = _line_of(text, key_loc) if text else None
        at = f" (line {line})" if line else at
        return f"{source}: unknown key {exc.key!r} in {path}{at}{_suggest(exc.key, exc.known)}"
    if isinstance(exc, _AtKeys):
        out = []
        for ploc, msg in exc.problems:
            ppath = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in ploc)
            line = _line_of(text, ploc) if text else None
            out.append(f"{source}: {ppath.replace('.[', '[')}: {msg}"
                       + (f" (line {line})" if line else ""))
        return "\n".join(out)
    if typ == "missing":
        return f"{source}: {path}: required key is missing"
    msg = str(exc) if exc is not None else err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    m = re.match(r"EngineSpec\.(\w+) (.*)", msg, re.S)
    if m and loc == ("engine",):
        field = "command" if m.group(1) == "command_template" else m.group(1)
        loc = ("engine", field)
        path = f"engine.{field}"
        msg = m.group(2)
        line = _line_of(text, loc) if text else None
        at = f" (line {line})" if line else at
    got = err.get("input")
    got_s = "" if isinstance(got, (dict, list)) or exc is not None else f", got {got!r}"
    return f"{source}: {path or 'top level'}: {msg}{got_s}{at}"


def parse_params(data: Any, source: str = "<params>", text: str | None = None) -> SuiteParams:
    """Validate a params mapping. Raises :class:`ParamsError` listing every problem."""
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return SuiteParams.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(e, source, text) for e in exc.errors()]
        raise ParamsError("\n".join(dict.fromkeys(lines))) from None


def load_params(path: str | Path) -> SuiteParams:
    """Read and validate a params YAML file. Raises :class:`ParamsError` (or FileNotFoundError)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{p}: invalid YAML: {exc}") from None
    if data is None:
        raise ParamsError(f"{p}: empty params file")
    return parse_params(data, str(path), text)
