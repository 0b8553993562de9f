"""Suite parameters: the YAML files under ``params/`` (:class:`SuiteParams`, assembled from the
registry), validated before anything is launched. Their layout: docs/suite.md, "Params files".
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from perfkit.common.frames import MAX_FRAMES, PIXEL_MULTIPLE
from perfkit.common.slugs import did_you_mean
from perfkit.engine.spec import (
    BAD_KIND,
    CROSS_FIELD,
    DEFAULT_REQUEST_TIMEOUT_S,
    AnyEngineSpec,
    EngineSpec,
    EngineSpecError,
    ReferenceEngine,
    error_text,
    split_kind,
    unknown_key_hint,
)
from perfkit.investigations import registry
from perfkit.investigations.registry import InvestigationParams

#: seconds a cell keeps for its teardown after a request's timeout and the stop grace
TEARDOWN_MARGIN_S = 10.0


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
    #: at most 1000: the scheduler's training timesteps (the reference engine's ``MAX_STEPS``)
    num_inference_steps: int = Field(4, ge=1, le=1000)
    seed: int = 0
    guidance_scale: Optional[float] = Field(None, ge=0)
    negative_prompt: Optional[str] = None
    fps: Optional[int] = Field(None, ge=1)


class BaselineParams(_Model):
    """Which baseline a run is compared against, with which profile and how strictly."""

    #: baseline JSON to compare against (relative to the params file's repo root or absolute)
    file: Optional[str] = None
    profile: str = "pr_test"
    strict: bool = False
    #: metadata.hardware of this run's baseline.json
    hardware: Optional[str] = None


class ScaleoutParams(_Model):
    """``scaleout`` section: how units of work run (docs/scale-out.md)."""

    #: extra attempts of a unit that raised (engine crash, node lost) before it is an error
    retries: int = Field(0, ge=0, le=5)


class _SuiteBase(_Model):
    name: str
    description: str = ""
    #: papermill per-cell execution timeout (s); None: no limit
    timeout_s: Optional[float] = Field(1800, gt=0)
    #: the engine: a spec of its kind (``kind`` left out: ``reference``)
    engine: AnyEngineSpec = Field(default_factory=ReferenceEngine)
    request: RequestParams = Field(default_factory=RequestParams)
    baseline: BaselineParams = Field(default_factory=BaselineParams)
    scaleout: ScaleoutParams = Field(default_factory=ScaleoutParams)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _reference_engine(self) -> "_SuiteBase":
        """What the reference engine would refuse only after a launch."""
        eng = self.engine
        if not isinstance(eng, ReferenceEngine):
            return self
        problems: list[tuple[tuple, str]] = []
        for sec, src in (("request", self.request.model_dump()), ("engine", eng.model_dump())):
            for key in ("height", "width"):
                v = src.get(key)
                if isinstance(v, int) and not isinstance(v, bool) and v % PIXEL_MULTIPLE:
                    msg = f"must be a multiple of {PIXEL_MULTIPLE} for the reference engine, got {v}"
                    problems.append(((sec, key), msg))
        max_frames = eng.max_frames or MAX_FRAMES
        frames = [(("request", "num_frames"), self.request.num_frames)]
        for s in registry.all_investigations():
            sec = getattr(self, s.name)
            if sec.enabled:
                frames += [
                    ((s.name, k, i), f) for k, v in sec if k == "request_frames" for i, f in enumerate(v)
                ]
        over = "must be <= {} (the reference engine's max_frames), got {}"
        problems += [(loc, over.format(max_frames, f)) for loc, f in frames if f > max_frames]
        if problems:
            raise _AtKeys(problems)
        return self

    @model_validator(mode="after")
    def _timeouts_ordered(self) -> "_SuiteBase":
        """``request_timeout_s + stop_grace_s + TEARDOWN_MARGIN_S <= timeout_s`` (docs/robustness.md)."""
        if self.timeout_s is None:
            return self
        eng, margin = self.engine, TEARDOWN_MARGIN_S
        if eng.request_timeout_s is not None:
            if eng.request_timeout_s + eng.stop_grace_s + margin > self.timeout_s:
                msg = (
                    f"request_timeout_s {eng.request_timeout_s:g} + stop_grace_s "
                    f"{eng.stop_grace_s:g} + {margin:g} s for the teardown must be <= "
                    f"timeout_s {self.timeout_s:g} (the notebook cell's timeout), so that "
                    f"a hung request ends and its engine is stopped before the cell is killed"
                )
                raise _AtKeys([(("engine", "request_timeout_s"), msg)])
        elif self.timeout_s <= eng.stop_grace_s + margin:
            msg = (
                f"must be > engine.stop_grace_s {eng.stop_grace_s:g} + {margin:g} s for the "
                f"teardown, got {self.timeout_s:g}"
            )
            raise _AtKeys([(("timeout_s",), msg)])
        return self

    def request_timeout_s(self) -> float:
        """A request's timeout (s): ``engine.request_timeout_s``, else what the cell timeout leaves
        after the teardown, at most ``DEFAULT_REQUEST_TIMEOUT_S``."""
        if self.engine.request_timeout_s is not None:
            return self.engine.request_timeout_s
        if self.timeout_s is None:
            return DEFAULT_REQUEST_TIMEOUT_S
        return min(DEFAULT_REQUEST_TIMEOUT_S, self.timeout_s - self.engine.stop_grace_s - TEARDOWN_MARGIN_S)

    def enabled(self) -> list[str]:
        """Enabled investigations, in run order."""
        return [s.name for s in registry.all_investigations() if getattr(self, s.name).enabled]

    def refuse_disabled(self, only: Any) -> None:
        """Raise ParamsError for ``--only`` naming a disabled investigation."""
        off = [n for n in only or () if n in type(self).model_fields and not getattr(self, n).enabled]
        if off:
            raise ParamsError(
                "; ".join(
                    f"--only {n}: {n}.enabled is false in the params (add --set {n}.enabled=true)"
                    for n in off
                )
            )

    def section(self, name: str) -> InvestigationParams:
        return getattr(self, name)

    def engine_spec(self) -> EngineSpec:
        """The engine spec, ``request_timeout_s`` filled in (:meth:`request_timeout_s`)."""
        return self.engine.replace(request_timeout_s=self.request_timeout_s())

    def engine_dict(self) -> dict[str, Any]:
        """:meth:`engine_spec` as a plain dict (a notebook's ``engine`` parameter)."""
        return self.engine_spec().to_dict()

    def invariants_all(self) -> dict[str, Any]:
        """Every gated invariant (None limits left out), defaults overlaid with ``invariants``."""
        return {k: v for k, v in self.invariants.model_dump().items() if v is not None}


def _build_models() -> tuple[type[BaseModel], type[BaseModel]]:
    inv_fields: dict[str, Any] = {
        k: (f.annotation, f) for k, f in registry.EngineInvariants.model_fields.items()
    }
    for s in registry.all_investigations():
        for key, f in s.invariants_model.model_fields.items():
            inv_fields[key] = (f.annotation, f)
    invariants = create_model("InvariantsParams", __base__=registry.InvariantParams, **inv_fields)
    sections: dict[str, Any] = {
        s.name: (s.params_model, Field(default_factory=s.params_model)) for s in registry.all_investigations()
    }
    sections["invariants"] = (invariants, Field(default_factory=invariants))
    model = create_model("SuiteParams", __base__=_SuiteBase, **sections)
    model.__doc__ = (
        "A params file: name, description, timeout_s, engine, request, baseline, one "
        "section per registered investigation, invariants."
    )
    return invariants, model


InvariantsParams, SuiteParams = _build_models()


class _AtKeys(ValueError):
    """Problems found across sections: ((key path), message) each."""

    def __init__(self, problems: list[tuple[tuple, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in problems))


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    cur: Any = model
    for part in (p for p in loc if not isinstance(p, int)):
        if not _is_model(cur) or part not in cur.model_fields:
            return []
        cur = _unwrap(cur.model_fields[part].annotation)
    return list(cur.model_fields) if _is_model(cur) else []


def _unwrap(ann: Any) -> Any:
    models = [u for u in map(_unwrap, get_args(ann)) if _is_model(u)]
    return models[0] if models else ann


def _line_of(text: str, loc: tuple) -> int | None:
    """1-based line of the YAML node at ``loc``, best effort."""
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


def _dotted(loc: tuple) -> str:
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")


def _format_error(err: dict[str, Any], source: str, text: str | None) -> str:
    loc = tuple(err.get("loc") or ())
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    kind = None
    if loc[:1] == ("engine",):  # drop the union's tag
        kind, rest = split_kind(loc[1:])
        loc = ("engine", *rest)
        if typ in (CROSS_FIELD, BAD_KIND):  # a rule about one field, or the kind itself
            loc += (ctx["field"],)
            inp = err.get("input")
            bad_kind = inp.get("kind") if typ == BAD_KIND and isinstance(inp, dict) else None
            err = {**err, "msg": ctx["detail"], "input": bad_kind}
            ctx = {}
    path = _dotted(loc)
    line = _line_of(text, loc) if text else None
    at = f" (line {line})" if line else ""
    exc = ctx.get("error")
    if typ == "extra_forbidden":
        key = loc[-1] if loc else "?"
        parent = loc[:-1]
        where = ".".join(str(p) for p in parent if not isinstance(p, int))
        if parent == ("engine",):
            hint = unknown_key_hint(kind, str(key))
        else:
            hint = did_you_mean(key, _known_fields(SuiteParams, parent))
        return f"{source}: unknown key {key!r}" + (f" in {where}" if where else "") + at + hint
    if isinstance(exc, _AtKeys):
        out = []
        for ploc, msg in exc.problems:
            line = _line_of(text, ploc) if text else None
            out.append(f"{source}: {_dotted(ploc)}: {msg}" + (f" (line {line})" if line else ""))
        return "\n".join(out)
    if typ == "missing":
        for_kind = f" for kind {kind!r}" if kind and loc[:1] == ("engine",) else ""
        return f"{source}: {path}: required key is missing{for_kind}"
    got = err.get("input")
    bare = (got is None and typ == CROSS_FIELD) or isinstance(got, BaseModel)
    return f"{source}: {path or 'top level'}: {error_text(err, bare)}{at}"


def parse_params(data: Any, source: str = "<params>", text: str | None = None) -> SuiteParams:
    """Validate a params mapping. Raises :class:`ParamsError` listing every problem."""
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return SuiteParams.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(e, source, text) for e in exc.errors()]
        raise ParamsError("\n".join(dict.fromkeys(lines))) from None


class _Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 floats (``1e3``); refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)


#: limits of every YAML perfkit reads (docs/robustness.md)
MAX_YAML_BYTES = 1 * 2**20
MAX_YAML_DEPTH = 64
MAX_YAML_VALUES = 100_000

_OPEN = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


class YamlLimitError(yaml.YAMLError):
    """YAML beyond a ``MAX_YAML_*`` limit (a :class:`yaml.YAMLError`)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


def _check_limits(text: str) -> None:
    if len(text) > MAX_YAML_BYTES:
        raise YamlLimitError(f"{len(text):,} characters, over the limit of {MAX_YAML_BYTES:,}")
    depth = 0
    for tok in yaml.scan(text, Loader=_Yaml12Loader):
        if isinstance(tok, _OPEN):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise YamlLimitError(
                    f"nested deeper than {MAX_YAML_DEPTH} levels (line {tok.start_mark.line + 1})"
                )
        elif isinstance(tok, _CLOSE):
            depth -= 1


def _check_values(data: Any) -> None:
    stack, n = [data], 0
    while stack:
        v = stack.pop()
        n += 1
        if n > MAX_YAML_VALUES:
            raise YamlLimitError(f"more than {MAX_YAML_VALUES:,} values (aliases expanded)")
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def load_yaml(text: str) -> Any:
    """Parse params YAML (safe, YAML 1.2 floats). Raises yaml.YAMLError; YamlLimitError over a
    limit."""
    _check_limits(text)
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except ValueError as exc:  # Python's 4,300-digit int limit
        raise YamlLimitError(f"a number too long to read ({exc})") from None
    _check_values(data)
    return data


def yaml_value(text: str) -> Any:
    """``text`` read as YAML 1.2; ParamsError: the parser's problem, one line."""
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise ParamsError(getattr(exc, "problem", None) or str(exc).splitlines()[0]) from None


def apply_sets(data: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``section.key=value`` of ``sets`` put in (value as YAML).
    Raises ParamsError naming a bad item."""
    out = copy.deepcopy(data)
    for item in sets:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise ParamsError(f"--set {item!r}: expected section.key=value (e.g. load.enabled=true)")
        try:
            value = load_yaml(text)
        except yaml.YAMLError as exc:
            raise ParamsError(f"--set {item!r}: the value is not YAML: {str(exc).splitlines()[0]}") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ParamsError(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not a mapping")
        node[parts[-1]] = value
    return out


def not_a_file(path: str | Path) -> str:
    """Why ``path`` is no regular file: "not found", "is a directory, not a file", ..."""
    p = Path(path)
    if p.is_dir():
        return "is a directory, not a file"
    return "is not a regular file" if p.exists() else "not found"


def load_params(path: str | Path, sets: Sequence[str] = ()) -> SuiteParams:
    """Read and validate a params file, ``sets`` (``--set``) applied. Raises ParamsError naming
    the key and line, FileNotFoundError."""
    p = Path(path)
    if (size := p.stat().st_size) > MAX_YAML_BYTES:
        raise ParamsError(f"{p}: {size:,} bytes, over the limit of {MAX_YAML_BYTES:,}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{p}: invalid UTF-8 at byte {exc.start + 1}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{p}: invalid YAML: {str(exc).replace('<unicode string>', str(p))}") from None
    if data is None:
        raise ParamsError(f"{p}: empty params file")
    params = parse_params(data, str(path), text)  # the file's own errors first, with lines
    return parse_params(apply_sets(data, sets), f"{path} with --set {' '.join(sets)}") if sets else params


def load_side(
    path: str | Path, checkout: str | Path | None = None
) -> tuple[EngineSpec, dict[str, Any] | None]:
    """One A/B side, a params file or an engine spec -> (EngineSpec, request dict or None);
    ``{checkout}`` in its text replaced by ``checkout``'s path. ParamsError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ParamsError(f"{not_a_file(p)}: {path}")
    try:
        text = p.read_text(encoding="utf-8")
        if checkout is not None:
            text = text.replace("{checkout}", str(Path(checkout).resolve()))
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError as exc:
        raise ParamsError(
            f"{path}: not UTF-8 text (byte {exc.start}): expected an engine spec or a params file (YAML)"
        ) from None
    except OSError as exc:
        raise ParamsError(f"{path}: unreadable: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: expected an engine spec or a params file (a mapping)")
    try:
        if "engine" in data:
            params = parse_params(data, str(path), text)
            return params.engine_spec(), params.request.model_dump(exclude_none=True)
        return EngineSpec.from_dict(data), None
    except (ParamsError, EngineSpecError) as exc:
        raise ParamsError(f"{path}:\n{exc}") from None
