"""EngineSpec: how to start an engine and reach it; one pydantic model per kind, told apart by
``kind`` (:data:`AnyEngineSpec`, which the params file embeds). See docs/DESIGN.md ("One
parameter's path") and docs/sglang.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from perfkit.common.frames import PRESET_NAMES
from perfkit.common.slugs import did_you_mean
from perfkit.engine.argv import (
    OFFLOAD_COMPONENTS,
    argv_list,
    check_command,
    check_model_path,
    check_sglang,
    env_strings,
    percent_map,
    reference_argv,
)

#: a request's timeout when neither the spec nor a params file's ``timeout_s`` sets one (s)
DEFAULT_REQUEST_TIMEOUT_S = 1800.0
#: The default ``warmup_frames``; for kind ``sglang`` it adds no flag (sglang's own default).
DEFAULT_WARMUP_FRAMES = 17
#: pydantic error type of a rule between fields (ctx: ``field`` it names, ``detail``).
CROSS_FIELD = "engine_cross_field"
#: pydantic error type of an unknown ``kind`` (ctx: ``field`` = ``"kind"``).
BAD_KIND = "engine_kind"

_RESOLUTION = r"^\d+x\d+$"
#: an argv field: a string is split like a shell would
Argv = Annotated[list[str], BeforeValidator(argv_list)]

#: Offload modes of the reference engine (``--offload``): resident, whole-model offload, group
#: offload at block or leaf level.
OFFLOAD_MODES = ("none", "model", "group-block", "group-leaf")
OffloadMode = Literal[OFFLOAD_MODES]
#: Stages of the reference engine's pipeline (names as sglang spells them): the keys
#: ``ReferenceEngine.debug_stage_delay`` accepts.
REFERENCE_STAGES = (
    "TextEncodingStage",
    "LatentPreparationStage",
    "DenoisingStage",
    "UpsampleStage",
    "RefinementStage",
    "DecodingStage",
)


class EngineSpecError(ValueError):
    """An invalid engine spec: ``problems`` (field, message), one line each ``EngineSpec.<field>: ...``."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"EngineSpec.{f}: {m}" for f, m in problems))

    @classmethod
    def from_validation(
        cls, exc: ValidationError | list[Any], kind: str | None = None, tagged: bool = True
    ) -> EngineSpecError:
        """Each pydantic error as a field-named problem; ``tagged``: locations start with the kind."""
        problems = []
        for err in exc if isinstance(exc, list) else exc.errors():
            loc = tuple(err.get("loc") or ())
            tag, loc = split_kind(loc) if tagged else (None, loc)
            k = tag or kind
            typ, ctx, got = err.get("type", ""), err.get("ctx") or {}, err.get("input")
            if typ in (CROSS_FIELD, BAD_KIND):
                loc = loc + (ctx["field"],)
            name = ".".join(str(p) for p in loc) or "(spec)"
            if typ == "extra_forbidden":
                msg = f"unknown field for kind {k!r}" + unknown_key_hint(k, str(loc[-1]))
            elif typ == "missing":
                msg = f"required for kind {k!r}"
            elif typ == CROSS_FIELD:
                msg = ctx["detail"]
            elif typ == BAD_KIND:
                got = got.get("kind") if isinstance(got, Mapping) else getattr(got, "kind", got)
                msg = f"must be one of {', '.join(KINDS)}, got {got!r}"
            else:
                msg = error_text(err)
            problems.append((name, msg))
        return cls(problems)


def error_text(err: Mapping[str, Any], bare: bool = False) -> str:
    """``message, got <input>`` of one pydantic error; no input when ``bare``, raised or a mapping/list."""
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    got = err.get("input")
    if bare or "error" in (err.get("ctx") or {}) or isinstance(got, (dict, list)):
        return msg
    return f"{msg}, got {got!r}"


def _cross_field(field: str, detail: str) -> PydanticCustomError:
    return PydanticCustomError(CROSS_FIELD, "{field} {detail}", {"field": field, "detail": detail})


class _SpecMeta(type(BaseModel)):  # type: ignore[misc]
    """``EngineSpec(...)`` builds the model of ``kind``; a bad field raises EngineSpecError."""

    def __call__(cls, /, **data: Any) -> Any:
        return cls.from_dict(data)


class EngineSpec(BaseModel, metaclass=_SpecMeta):
    """The fields every kind has; ``EngineSpec(kind=..., **fields)`` builds that kind's model and
    raises :class:`EngineSpecError` naming each bad field. extra_args, env: placeholders
    ``{perf_log_dir}``, ``{port}``, ``{host}``; port None: a free one; request_timeout_s: submit to
    completion (None: docs/robustness.md "Timeouts, in order")."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    kind: str = "reference"
    extra_args: Argv = Field(default_factory=list)
    env: Annotated[dict[str, str], BeforeValidator(env_strings)] = Field(default_factory=dict)
    health_path: str = Field("/health", pattern=r"^/")
    host: str = Field("127.0.0.1", min_length=1)
    port: Optional[int] = Field(None, ge=1, le=65535)
    startup_timeout_s: float = Field(600.0, gt=0)
    request_timeout_s: Optional[float] = Field(None, gt=0)
    stop_grace_s: float = Field(10.0, gt=0)
    share_compile_cache: bool = False

    def check(self) -> None:
        """Checks that need the host, run before any launch; FileNotFoundError naming the field."""

    def command(self, port: int, perf_log_dir: str | Path) -> list[str]:
        """The exact argv to start this engine on ``port``, writing records to ``perf_log_dir``."""
        d = str(perf_log_dir)
        return [self._subst(a, port, d) for a in self._argv(port, d)]

    def startup_warmup_frames(self) -> int | None:
        """Frames of the startup warmup asked for: 0 when off or on requests, None: unknown."""
        return None

    def env_for(self, perf_log_dir: str | Path, port: int | None = None) -> dict[str, str]:
        """Environment additions for a launch: ``spec.env``, the perf log directory's variables."""
        d = str(perf_log_dir)
        out = {"PERFKIT_PERF_LOG_DIR": d}
        if self.kind != "reference":  # the kinds that write sglang's per-request records
            out["SGLANG_DIFFUSION_STAGE_LOGGING"] = "1"
            out["SGLANG_PERF_LOG_DIR"] = d
        return {**out, **{k: self._subst(v, port, d) for k, v in self.env.items()}}

    def _subst(self, s: str, port: int | None, perf_log_dir: str) -> str:
        s = s.replace("{perf_log_dir}", perf_log_dir).replace("{host}", self.host)
        if port is not None:
            s = s.replace("{port}", str(port))
        return s

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of this kind's fields (the command kind's argv under ``command``)."""
        return self.model_dump(by_alias=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineSpec:
        """The spec of ``d["kind"]`` (default ``reference``); EngineSpecError naming each bad field."""
        if not isinstance(d, Mapping):
            raise EngineSpecError([("(spec)", f"expects a mapping, got {type(d).__name__}")])
        try:
            if cls is EngineSpec:
                return _ADAPTER.validate_python(dict(d))
            return cls.model_validate(dict(d))
        except ValidationError as exc:
            kind = cls.model_fields["kind"].default
            raise EngineSpecError.from_validation(exc, kind, tagged=cls is EngineSpec) from None

    def replace(self, **changes: Any) -> EngineSpec:
        """A validated copy with some fields changed (keys as :meth:`to_dict`'s); EngineSpecError."""
        return EngineSpec.from_dict({**self.to_dict(), **changes})


class _ServingEngine(EngineSpec):
    """Fields the reference engine and sglang share; warmup_*: the startup warmup (frames 0: off;
    mode ``server``: a synthetic request, ``request``: sglang warms on the first real ones)."""

    model_path: Optional[str] = Field(None, min_length=1)
    compile: bool = False
    warmup_frames: int = Field(DEFAULT_WARMUP_FRAMES, ge=0)
    warmup_resolution: Optional[str] = Field(None, pattern=_RESOLUTION)
    warmup_steps: Optional[int] = Field(None, ge=1)
    warmup_mode: Optional[Literal["off", "request", "server"]] = None
    num_gpus: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _warmup_off(self) -> _ServingEngine:
        if self.warmup_frames == 0 and self.warmup_mode not in (None, "off"):
            raise _cross_field(
                "warmup_mode",
                f"{self.warmup_mode!r} contradicts warmup_frames=0 (which turns the startup warmup off)",
            )
        return self

    def startup_warmup_frames(self) -> int | None:
        return 0 if self.warmup_mode in ("off", "request") else self.warmup_frames


class ReferenceEngine(_ServingEngine):
    """perfkit's reference engine (``python -m perfkit.refengine``), the default kind; each field is
    the engine's flag of that name (docs/refengine.md). debug_*: TEST ONLY (a leak in MiB per
    request; a stage's slowdown in percent of its own work, from measured request N on)."""

    kind: Literal["reference"] = "reference"
    preset: str = Field("tiny", min_length=1)
    #: torch.compile backends the reference engine is run with (torch._dynamo.list_backends()
    #: holds more; these are the ones that work without extra packages)
    compile_backend: Literal["inductor", "aot_eager", "eager", "cudagraphs"] = "inductor"
    compile_vae: bool = False
    recompile_limit: Optional[int] = Field(None, ge=1)
    two_stage: bool = False
    warmup_mode: Optional[Literal["off", "server"]] = None
    height: Optional[int] = Field(None, ge=1)
    width: Optional[int] = Field(None, ge=1)
    steps: Optional[int] = Field(None, ge=1)
    dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = None
    device: Optional[str] = Field(None, pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    keep_outputs: bool = False
    debug_leak_mib: int = Field(0, ge=0)
    memory_snapshot_after: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    memory_snapshot_entries: int = Field(20000, ge=1)
    debug_stage_delay: Annotated[
        dict[Literal[REFERENCE_STAGES], Annotated[float, Field(ge=0)]], BeforeValidator(percent_map)
    ] = Field(default_factory=dict)
    debug_stage_delay_from: int = Field(0, ge=0)
    max_frames: Optional[int] = Field(None, ge=1)
    cpu_threads: Optional[int] = Field(None, ge=1)
    offload: Optional[OffloadMode] = None
    offload_components: dict[Literal[OFFLOAD_COMPONENTS], OffloadMode] = Field(default_factory=dict)

    @field_validator("warmup_mode", mode="before")
    @classmethod
    def _request_mode(cls, v: Any) -> Any:
        if v == "request":
            raise ValueError("'request' is only supported by kind 'sglang'")
        return v

    @model_validator(mode="after")
    def _known_preset(self) -> ReferenceEngine:
        # the engine refuses an unknown preset only after it started: refuse it here
        if self.model_path is None and self.preset not in PRESET_NAMES:
            raise _cross_field(
                "preset",
                f"{self.preset!r} is not a preset of the reference engine; known: "
                f"{', '.join(PRESET_NAMES)} (or set model_path)",
            )
        return self

    check = check_model_path
    _argv = reference_argv


class SglangEngine(_ServingEngine):
    """sglang's diffusion server (``sglang serve``): model_path a local directory or a hub id;
    executable the argv prefix that runs sglang; server_args extra ``sglang serve`` arguments."""

    kind: Literal["sglang"] = "sglang"
    model_path: str = Field(min_length=1)
    executable: Argv = Field(default_factory=lambda: ["sglang"], min_length=1)
    server_args: Argv = Field(default_factory=list)

    @model_validator(mode="after")
    def _absolute_paths(self) -> SglangEngine:
        if not Path(self.model_path).is_absolute() and Path(self.model_path).exists():
            self.model_path = str(Path(self.model_path).resolve())
        exe = self.executable[0]
        if "/" in exe and not Path(exe).is_absolute() and Path(exe).exists():
            self.executable = [str(Path(exe).absolute()), *self.executable[1:]]
        return self

    check = check_sglang

    def _argv(self, port: int, d: str) -> list[str]:
        argv = list(self.executable) + ["serve", "--model-path", self.model_path, "--port", str(port)]
        argv += ["--host", self.host, "--num-gpus", str(self.num_gpus)]
        argv += self.sglang_warmup_args()
        if self.compile:
            argv += ["--enable-torch-compile"]
        given = list(self.server_args) + list(self.extra_args)
        if not any(a == "--output-path" or a.startswith("--output-path=") for a in given):
            # sglang's default "outputs/" is relative to its cwd: the launch's directory instead
            given += ["--output-path", str(Path(d).parent / "outputs")]
        return argv + given

    def sglang_warmup_args(self) -> list[str]:
        """``sglang serve`` flags for the startup warmup settings (docs/sglang.md)."""
        out: list[str] = []
        mode = "off" if self.warmup_frames == 0 else self.warmup_mode
        if mode is not None:
            out += ["--warmup-mode", mode]
        if self.warmup_frames not in (0, DEFAULT_WARMUP_FRAMES):
            out += ["--warmup-num-frames", str(self.warmup_frames)]
        if self.warmup_resolution:
            h, w = self.warmup_resolution.split("x")
            out += ["--warmup-resolutions", f"{w}x{h}"]
        if self.warmup_steps is not None:
            out += ["--warmup-steps", str(self.warmup_steps)]
        return out


class CommandEngine(EngineSpec):
    """Any server started by the argv ``command_template`` (``command`` in dicts; placeholders as
    ``extra_args``) that writes sglang-format records."""

    kind: Literal["command"] = "command"
    command_template: Argv = Field(
        validation_alias=AliasChoices("command", "command_template"),
        serialization_alias="command",
        min_length=1,
    )

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "command" in data and data.get("command_template") is not None:
            raise _cross_field("command", "give either 'command' or 'command_template', not both")
        return data

    check = check_command

    def _argv(self, port: int, d: str) -> list[str]:
        return list(self.command_template) + list(self.extra_args)


#: The model of each kind.
ENGINE_KINDS: dict[str, type[EngineSpec]] = {
    "reference": ReferenceEngine,
    "sglang": SglangEngine,
    "command": CommandEngine,
}
KINDS = tuple(ENGINE_KINDS)


def _kind_of(v: Any) -> Any:
    return v.get("kind", "reference") if isinstance(v, Mapping) else getattr(v, "kind", "reference")


#: A spec of any kind, told apart by ``kind`` (missing: ``reference``): the type a pydantic field
#: holding an engine spec uses (the params file's ``engine`` section).
AnyEngineSpec = Annotated[
    Union[tuple(Annotated[model, Tag(kind)] for kind, model in ENGINE_KINDS.items())],
    Discriminator(
        _kind_of,
        custom_error_type=BAD_KIND,
        custom_error_message=f"kind must be one of {', '.join(KINDS)}",
        custom_error_context={"field": "kind", "detail": f"must be one of {', '.join(KINDS)}"},
    ),
]

_ADAPTER: TypeAdapter[EngineSpec] = TypeAdapter(AnyEngineSpec)


#: the keys a spec of each kind takes (the command kind's argv as ``command``)
_KEYS = {
    k: ["command" if n == "command_template" else n for n in m.model_fields] for k, m in ENGINE_KINDS.items()
}


def split_kind(loc: tuple) -> tuple[str | None, tuple]:
    """``(kind, rest)`` of an :data:`AnyEngineSpec` error location; ``(None, loc)`` without a kind tag."""
    if loc and loc[0] in ENGINE_KINDS:
        return loc[0], tuple(loc[1:])
    return None, tuple(loc)


def unknown_key_hint(kind: str | None, key: str) -> str:
    """What to say after "unknown key": the kinds that have it, else the closest key of ``kind``."""
    owners = [k for k in KINDS if k != kind and key in _KEYS[k]]
    if owners:
        return f" (a field of kind {' and '.join(map(repr, owners))})"
    return did_you_mean(key, _KEYS.get(kind or "reference", _KEYS["reference"]))
