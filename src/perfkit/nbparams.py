"""Notebook parameters: declared once here (:func:`declared`), written into each parameters cell
by ``notebooks/make_notebooks.py``, bound and validated in the notebook (:func:`bind`). See
docs/lab.md, "Notebooks that papermill alone can run and gate".
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Iterable, Literal, Mapping, Optional, Union

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from perfkit.bundle import identity_differences, read_meta
from perfkit.common.slugs import did_you_mean
from perfkit.engine.spec import EngineSpecError, error_text
from perfkit.gate.verdicts import GATE, FailOn
from perfkit.investigations import registry
from perfkit.params import (
    InvariantsParams,
    ParamsError,
    RequestParams,
    SuiteParams,
    _AtKeys,
    _dotted,
    _is_model,
    _known_fields,
    yaml_value,
)

#: the notebooks that are neither an investigation nor the baseline gate
AB = "ab"
HISTORY = "history"

#: a notebook's default engine and request: the tiny reference engine on this machine
NOTEBOOK_ENGINE: dict[str, Any] = {
    "kind": "reference",
    "preset": "tiny",
    "compile": True,
    "compile_backend": "aot_eager",
}
NOTEBOOK_REQUEST: dict[str, Any] = {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4}

#: the comment papermill writes at the top of the cell it injects (``-p``/``-y`` values)
INJECTED_HEADER = "# Parameters"


class NotebookParamsError(ParamsError):
    """Notebook parameters that cannot run; every problem, one a line, naming its parameter."""


@dataclass(frozen=True)
class NotebookParam:
    """One notebook parameter (``annotation`` validates; :func:`type_text` is what papermill shows)."""

    name: str
    annotation: Any
    default: Any
    help: str = ""


def _strip(ann: Any) -> Any:
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _union_args(ann: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(ann) in (Union, UnionType):
        return typing.get_args(ann)
    return None


def type_text(ann: Any) -> str:
    """The annotation papermill can read (words, brackets and commas only): ``int``, ``dict`` (also
    a pydantic model), ``list[int]``, ``Optional[dict]``; a Literal is its values' type."""
    ann = _strip(ann)
    args = _union_args(ann)
    if args is not None:
        rest = [a for a in args if a is not type(None)]
        inner = type_text(rest[0]) if len(rest) == 1 else "object"
        return f"Optional[{inner}]" if len(rest) < len(args) else inner
    origin = typing.get_origin(ann)
    if origin is Literal:
        return type(typing.get_args(ann)[0]).__name__
    if origin in (list, tuple, set) or ann in (list, tuple, set):
        inner = typing.get_args(ann)
        return f"list[{type_text(inner[0])}]" if inner else "list"
    if origin is dict or ann is dict or _is_model(ann):
        return "dict"
    if ann in (int, float, str, bool):
        return ann.__name__
    return "object"


def _takes_str(ann: Any) -> bool:
    """Whether a value of type ``ann`` may be a string (a ``-p`` string is then kept)."""
    ann = _strip(ann)
    args = _union_args(ann)
    if args is not None:
        return any(_takes_str(a) for a in args)
    if typing.get_origin(ann) is Literal:
        return any(isinstance(v, str) for v in typing.get_args(ann))
    return ann in (str, Any, object)


_ENGINE_HELP = "perfkit.engine.spec.EngineSpec fields of its kind (JSON or YAML with -p)"
_REQUEST_HELP = "a /v1/videos request: num_frames, height, width, num_inference_steps, seed, prompt"
_INVARIANTS_HELP = (
    "limits over the investigations' defaults, e.g. {latency_drift_max: 0.05} (None: the defaults)"
)
_FAIL_ON_HELP = "gate: the last cell raises when the gate fails (papermill exits 1); never: explore"
_FAIL_ON = NotebookParam("fail_on", FailOn, "gate", _FAIL_ON_HELP)
_ENGINE = NotebookParam("engine", dict, NOTEBOOK_ENGINE, _ENGINE_HELP)
_REQUEST = NotebookParam("request", dict, NOTEBOOK_REQUEST, _REQUEST_HELP)
_INVARIANTS = NotebookParam("invariants", Optional[dict], None, _INVARIANTS_HELP)


_DUMP = TypeAdapter(Any)


def section_params(name: str) -> list[NotebookParam]:
    """An investigation's params model fields but ``enabled`` and ``tier``, with their ``#:`` comments."""
    model = registry.get(name).params_model
    out = []
    for key, f in model.model_fields.items():
        if key in ("enabled", "tier"):
            continue
        default = _DUMP.dump_python(f.get_default(call_default_factory=True), exclude_none=True)
        out.append(NotebookParam(key, f.annotation, default, _field_comment(model, key)))
    return out


@functools.cache
def _field_comment(model: type[BaseModel], key: str) -> str:
    """The ``#:`` comment above a field in its class source, as one line."""
    for cls in model.__mro__:
        try:
            src = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        m = re.search(r"((?:[ \t]*#:[^\n]*\n)+)[ \t]*" + re.escape(key) + r"\s*:", src)
        if m:
            return " ".join(ln.strip()[2:].strip() for ln in m.group(1).splitlines())
    return ""


def _investigation(name: str) -> list[NotebookParam]:
    return [
        _ENGINE,
        _REQUEST,
        *section_params(name),
        _INVARIANTS,
        NotebookParam(
            "run_dir",
            str,
            "outputs/notebooks",
            "the bundle and verdict.json land in run_dir/<investigation>/",
        ),
        NotebookParam(
            "bundle_dir", Optional[str], None, "a recorded bundle to replay instead of launching anything"
        ),
        _FAIL_ON,
    ]


def _gate() -> list[NotebookParam]:
    return [
        _ENGINE,
        _REQUEST,
        NotebookParam(
            "baseline_file", Optional[str], None, "a baseline JSON (sglang layout) of the same hardware"
        ),
        NotebookParam("profile", str, "pr_test", "tolerance profile of the baseline"),
        NotebookParam("strict", bool, False, 'a case missing from the baseline fails instead of being "new"'),
        NotebookParam(
            "hardware",
            Optional[str],
            None,
            "metadata.hardware of this run's baseline.json (None: from the bundles)",
        ),
        _INVARIANTS,
        NotebookParam(
            "run_dir", str, "outputs/notebooks", "the run whose bundles are gated (nothing is launched)"
        ),
        _FAIL_ON,
    ]


def _ab() -> list[NotebookParam]:
    return [
        NotebookParam("spec_a", str, "../examples/ab/tiny-cpu.yaml", "side A: an engine spec YAML (perfkit.engine.spec)"),
        NotebookParam("spec_b", str, "../examples/ab/tiny-cpu-denoise-30pct.yaml", "side B (spec_a again: an A/A check)"),
        NotebookParam("launches", Annotated[int, Field(ge=2)], 3, "launches a side before the first look, interleaved A B B A ..."),
        NotebookParam("max_launches", Annotated[int, Field(ge=2)], 6, "launches a side at most: pairs are added until every gated metric is decided"),
        NotebookParam("undecided", Literal["fail", "pass"], "fail", 'a gated metric still inconclusive at max_launches: "fail" (exit 1) or "pass"'),
        NotebookParam("warm", Annotated[int, Field(ge=1)], 5, "M, warm requests a launch after the cold request"),
        NotebookParam("threshold", Annotated[float, Field(gt=0, lt=1)], 0.05, "decision threshold (fraction): regression when the interval lies above 1 + threshold"),
        NotebookParam("gate_metrics", Optional[list[str]], None, 'e.g. ["DenoisingStage", "warm_e2e"]: only these set the verdict (None: every metric)'),
        NotebookParam("run_dir", str, "outputs/notebooks/ab", "the side bundles land in run_dir/a and run_dir/b"),
        NotebookParam("replay_a", Optional[str], None, 'a recorded side-A bundle (e.g. "../examples/ab/aa/a"): launches nothing'),
        NotebookParam("replay_b", Optional[str], None, "the recorded side-B bundle"),
        NotebookParam("fail_on", FailOn, "gate", "gate: the last cell raises on a regression or an undecided gate (papermill exits 1); never: explore"),
    ]  # fmt: skip


def _history() -> list[NotebookParam]:
    return [
        NotebookParam("store", str, "../outputs/history", "the history store (perfkit history add/import write it)"),
        NotebookParam("nightly", Optional[str], "../tests/fixtures/sglang-nightly", "imported first when the store is empty (None: never)"),
        NotebookParam("hardware", str, "H100", "the series: hardware, case and metric"),
        NotebookParam("case_id", str, "flux2_dev_t2i_1024", "the case"),
        NotebookParam("metric", str, "latency_s", "the metric's name in the store"),
    ]  # fmt: skip


def declared(notebook: str) -> list[NotebookParam]:
    """The parameters of ``notebook`` in its cell's order; KeyError for an unknown notebook."""
    if notebook in registry.names():
        return _investigation(notebook)
    table = {GATE: _gate, AB: _ab, HISTORY: _history}
    if notebook not in table:
        raise KeyError(f"no declared parameters for notebook {notebook!r}")
    return table[notebook]()


def parameters_cell(notebook: str) -> str:
    """The source of ``notebook``'s parameters cell: ``name: type = default  # help`` lines."""
    lines = []
    for p in declared(notebook):
        t = type_text(p.annotation)
        ann = f'"{t}"' if t.startswith("Optional") else t  # quoted: runs without typing
        lines.append(f"{p.name}: {ann} = {p.default!r}" + (f"  # {p.help}" if p.help else ""))
    return "\n".join(lines)


def injected_names(history: Any) -> list[str]:
    """Names assigned by the cells papermill injected, read from IPython's ``In``."""
    names: list[str] = []
    for src in history or []:
        if not isinstance(src, str) or not src.lstrip().startswith(INJECTED_HEADER):
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def unknown_names(notebook: str, given: Any) -> list[str]:
    """One problem line per name in ``given`` that ``notebook`` does not declare."""
    known = [p.name for p in declared(notebook)]
    return [
        f"unknown parameter {k!r}{did_you_mean(k, known)}; known: {', '.join(known)}"
        for k in given
        if k not in known
    ]


def coerce(notebook: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with each string read as YAML where the type takes no string;
    NotebookParamsError naming a parameter that is not valid YAML."""
    types = {p.name: p.annotation for p in declared(notebook)}
    out: dict[str, Any] = {}
    problems = []
    for k, v in given.items():
        if isinstance(v, str) and k in types and not _takes_str(types[k]):
            try:
                v = yaml_value(v)
            except ParamsError as where:
                problems.append(f"{k}: {v!r} is not valid JSON or YAML ({where})")
                continue
        out[k] = v
    if problems:
        raise NotebookParamsError("\n".join(problems))
    return out


def _bundle_problems(notebook: str, given: Mapping[str, Any], injected: Iterable[str]) -> list[str]:
    bundle = given.get("bundle_dir")
    if not bundle or notebook not in registry.names():
        return []
    meta = read_meta(bundle)
    if meta.get("scenario") != notebook:
        return [f"bundle_dir: {bundle} holds a {meta.get('scenario')!r} bundle, expected {notebook!r}"]
    names = set(injected)
    diffs = identity_differences(
        meta.get("params") or {},
        given.get("engine") if "engine" in names else None,
        given.get("request") if "request" in names else None,
    )
    return [
        f"{d} (bundle_dir {bundle}: a replay shows what was measured; give the params it was measured "
        "with, or leave them out)"
        for d in diffs
    ]


def bind(notebook: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The declared parameters' values from the kernel's globals, coerced and validated. Raises
    NotebookParamsError: unknown names, bad values, a replayed bundle of another investigation,
    engine or request."""
    params = declared(notebook)
    injected = injected_names(namespace.get("In"))
    problems = unknown_names(notebook, injected)
    given = {p.name: namespace.get(p.name, p.default) for p in params}
    try:
        given = coerce(notebook, given)
    except NotebookParamsError as exc:
        problems += str(exc).splitlines()
    else:
        try:
            given = validate(notebook, given)
        except ParamsError as exc:
            problems += str(exc).splitlines()
        else:
            problems += _bundle_problems(notebook, given, injected)
    if problems:
        raise NotebookParamsError(
            f"{notebook} notebook parameters:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return given


def _pydantic_problems(prefix: str, errors: Iterable[Any], model: Any = None) -> list[str]:
    out = []
    for e in errors:
        parts = tuple(e.get("loc") or ())
        loc = _dotted((prefix, *parts) if prefix else parts)
        if e.get("type") == "extra_forbidden":
            out.append(f"{loc}: unknown field" + did_you_mean(parts[-1], _known_fields(model, parts[:-1])))
        else:
            out.append(f"{loc}: {error_text(e)}")
    return out


def _suite_problems(name: str, exc: ValidationError, problems: dict[Any, list[str]]) -> None:
    """The params model's errors by parameter, the rules across sections only when nothing else was
    wrong."""
    earlier = any(problems.values())
    for e in exc.errors():
        top, rest = (e["loc"][0], tuple(e["loc"][1:])) if e["loc"] else (None, ())
        out = problems.setdefault(top, [])
        if top == "engine":
            out += [
                f"engine.{f}: {m}" for f, m in EngineSpecError.from_validation([{**e, "loc": rest}]).problems
            ]
        elif top == "request":
            out += _pydantic_problems("request", [{**e, "loc": rest}], RequestParams)
        elif top == name:
            out += [p if p[:1] != ":" else f"{name}{p}" for p in _pydantic_problems("", [{**e, "loc": rest}])]
        elif not earlier and isinstance(err := (e.get("ctx") or {}).get("error"), _AtKeys):
            out += [f"{_dotted(loc)}: {msg}" for loc, msg in err.problems]


def validate(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Notebook parameters validated with the params file's models in one pass, other declared
    ones strictly by annotation; undeclared names pass through. Raises ParamsError: every
    problem, each naming its parameter."""
    section = registry.get(name).params_model if name in registry.names() else None
    try:
        types = {p.name: p.annotation for p in declared(name)}
    except KeyError:
        types = {}
    out: dict[str, Any] = {}
    problems: dict[Any, list[str]] = {}
    # timeout_s: papermill's cell timeout is not a notebook parameter
    doc: dict[str, Any] = {"name": "-p", "timeout_s": None}
    for key, value in given.items():
        mine = problems.setdefault(key, [])
        try:
            if key in ("run_dir", "bundle_dir"):
                if value is not None and not isinstance(value, str):
                    mine.append(f"{key}: must be a path, got {value!r}")
                elif key == "bundle_dir" and value and not (Path(value) / "meta.json").is_file():
                    mine.append(f"bundle_dir: {value} is not a result bundle (no meta.json)")
                out[key] = value
            elif key == "engine" and not isinstance(value, Mapping):
                raise ValueError(f"must be a mapping of engine fields, got {value!r}")
            elif key in ("engine", "request"):
                doc[key] = dict(value) if key == "engine" else value
            elif key == "invariants":
                out[key] = _invariants(value)
            elif section is not None and key in section.model_fields:
                doc.setdefault(name, {})[key] = value
            elif key in types:
                out[key] = TypeAdapter(types[key]).validate_python(value, strict=True)
            else:
                out[key] = value
        except ValidationError as exc:
            mine += _pydantic_problems(key, exc.errors(), InvariantsParams if key == "invariants" else None)
        except (TypeError, ValueError) as exc:
            mine.append(f"{key}: {exc}")
    try:
        suite = SuiteParams.model_validate(doc)
    except ValidationError as exc:
        _suite_problems(name, exc, problems)
    else:
        if "engine" in doc:
            out["engine"] = suite.engine.to_dict()
        if "request" in doc:
            out["request"] = suite.request.model_dump()
        dumped = suite.section(name).model_dump() if name in doc else {}
        out.update({k: dumped[k] for k in doc.get(name, {})})
    if lines := [p for k in (*given, name, None) for p in problems.get(k, [])]:
        raise ParamsError("\n".join(lines))
    return out


def _invariants(value: Any) -> dict[str, Any] | None:
    """The given invariants validated; only the keys given."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of invariant limits, got {value!r}")
    try:
        registry.merged_invariants(value)
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("invariants: ")) from None
    return {k: v for k, v in InvariantsParams.model_validate(value).model_dump().items() if k in value}
