"""Papermill orchestration: run the investigation notebooks, gate the run, assemble its outputs.

``perfkit suite --params params/ci-cpu.yaml --out outputs/RUN`` calls :func:`run_suite`, which

1. validates the params (:func:`perfkit.params.load_params`) before anything is launched;
2. runs each enabled investigation notebook (``cold_warm``, ``warmup_shapes``,
   ``memory_budget``) with papermill; each writes its bundle to ``RUN/<scenario>/`` and its gate
   rows to ``RUN/<scenario>/verdict.json``;
3. runs the baseline gate notebook, which launches nothing: it reuses the bundles measured in
   step 2, writes ``RUN/baseline.json`` (this run's numbers, sglang layout), compares them with
   the params' baseline file when one is set and re-checks the invariants on all results;
4. writes ``RUN/summary.md`` (appended to ``$GITHUB_STEP_SUMMARY`` when set), ``RUN/run.json``
   and ``RUN/report.html`` (:mod:`perfkit.report`), even when a notebook failed.

Before anything runs, a replay directory without bundles, a missing or broken ``baseline.file``
and an ``--out`` already holding another run (without ``--force``) are errors (exit 2). A replay
launches nothing: an investigation whose bundle the replay directory lacks is skipped.

Exit codes (:data:`EXIT_OK`, :data:`EXIT_REGRESSION`, :data:`EXIT_ERROR`): 0 every gate passed,
1 a gate failed (regression), 2 an error (bad params, engine crash, notebook exception, kernel
death).

The helpers the notebooks call live here too, so notebooks stay thin: :func:`load_or_run`
(replay a recorded bundle or run a scenario), :func:`scenario_verdict`, :func:`write_verdict`,
:func:`case_id`, :func:`bundle_cases`, :func:`gate`.

Run directory layout::

    RUN/params.yaml            the validated params (resolved, with defaults)
    RUN/run.json               notebook statuses, wall times, errors, exit code
    RUN/notebooks/<nb>.ipynb   executed notebooks (with outputs)
    RUN/<scenario>/            ResultBundle + verdict.json
    RUN/baseline_gate/verdict.json
    RUN/baseline.json  RUN/summary.md  RUN/report.html  RUN/report.png (when chromium is there)
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import yaml

from perfkit import baseline as bl
from perfkit.bundle import ResultBundle
from perfkit.params import SCENARIOS, ParamsError, SuiteParams, load_params

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2

GATE = "baseline_gate"
NOTEBOOKS = (*SCENARIOS, GATE)
#: invariant keys checked by each investigation notebook (the gate re-checks them all)
SCENARIO_INVARIANTS: dict[str, tuple[str, ...]] = {
    "cold_warm": ("warm_cold_ratio_max", "warm_cold_ratio_min", *bl.LEAK_INVARIANTS.values()),
    "warmup_shapes": ("covered_first_request_max_ratio", "covered_compiles_max"),
    "memory_budget": ("caps_held", "caps_completed", "warm_degrades_allowed"),
}
VERDICT_FILE = "verdict.json"
RUN_FILE = "run.json"
KERNEL_NAME = "python3"


def repo_root() -> Path:
    """The checkout this perfkit runs from (where ``notebooks/`` lives)."""
    return Path(__file__).resolve().parents[2]


def notebooks_dir() -> Path:
    env = os.environ.get("PERFKIT_NOTEBOOKS")
    return Path(env) if env else repo_root() / "notebooks"


# ---------------------------------------------------------------------------------------------
# Case ids and bundle slicing
# ---------------------------------------------------------------------------------------------

def _slug(s: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "", str(s).replace(" + ", "-").replace(" ", "")) or "x"


def case_id(engine: Mapping[str, Any], request: Mapping[str, Any], *, warmup_frames: int | None = None,
            num_frames: int | None = None, suffix: str = "") -> str:
    """Case id saying preset, shape and startup warmup: ``tiny_25f_64x64_4s_w17``.

    ``suffix`` distinguishes scenarios measuring the same shape (``_shapes``, ``_cap-24GiBdev``).
    """
    preset = engine.get("preset") or engine.get("kind") or "engine"
    if engine.get("kind") == "sglang":
        preset = Path(str(engine.get("model_path") or "sglang")).name
    nf = num_frames if num_frames is not None else request.get("num_frames")
    w = warmup_frames if warmup_frames is not None else engine.get("warmup_frames", 17)
    cid = (f"{_slug(preset)}_{nf}f_{request.get('height')}x{request.get('width')}_"
           f"{request.get('num_inference_steps')}s_w{w}")
    return cid + suffix


def sub_bundle(bundle: ResultBundle, *, launch: Any = None, num_frames: int | None = None,
               skip_first: bool = False) -> ResultBundle:
    """The part of a bundle from one launch and/or one request frame count (tables filtered).

    ``skip_first`` drops the first measured request of the selection (an uncovered cold request,
    whose shape setup is the investigation's finding, not the steady state a baseline holds).
    """
    req = bundle.requests
    if req.empty:
        return bundle
    mask = pd.Series(True, index=req.index)
    if skip_first and "index" in req:
        sel = req
        if launch is not None and "launch" in req:
            sel = sel[sel["launch"] == launch]
        if num_frames is not None and "num_frames" in req:
            sel = sel[sel["num_frames"] == num_frames]
        measured = sel[sel["index"] >= 0]
        if len(measured) >= 2:
            mask &= req.index != measured["index"].idxmin()
    if launch is not None and "launch" in req:
        mask &= req["launch"] == launch
    if num_frames is not None and "num_frames" in req:
        mask &= (req["num_frames"] == num_frames) | (req.get("index", 0) == -1)
    keep = req[mask]
    keys = set(zip(keep.get("launch", pd.Series([None] * len(keep))), keep["request_id"].astype(str)))
    tables = dict(bundle.tables)
    tables["requests"] = keep
    for name in ("stages", "steps"):
        t = bundle.table(name)
        if not t.empty and "request_id" in t:
            la = t["launch"] if "launch" in t else pd.Series([None] * len(t), index=t.index)
            tables[name] = t[[k in keys for k in zip(la, t["request_id"].astype(str))]]
    for name in ("memory", "launches"):
        t = bundle.table(name)
        if launch is not None and not t.empty and "launch" in t:
            tables[name] = t[t["launch"] == launch]
    return ResultBundle(scenario=bundle.scenario, meta=bundle.meta, results=bundle.results,
                        tables=tables, path=bundle.path)


def _launch_rows(bundle: ResultBundle) -> list[dict[str, Any]]:
    lt = bundle.launches
    return [] if lt.empty else lt.to_dict("records")


def _has_measured(bundle: ResultBundle) -> bool:
    return not bundle.measured_requests().empty


def _cold_covered(bundle: ResultBundle) -> bool:
    """Whether the first measured request has the latent shape the startup warmup ran.

    False (uncovered) when the warmup's shape differs or there was no warmup; True when shapes
    are unknown (other engines' records carry no latent shape: keep every request, as sglang's
    baseline dump does).
    """
    req = bundle.requests
    if req.empty or "latent_shape" not in req or "index" not in req:
        return True
    warm = req[req["index"] < 0]["latent_shape"].dropna()
    first = req[req["index"] >= 0].sort_values("index")["latent_shape"].dropna()
    if first.empty:
        return True
    if warm.empty:
        return False
    return str(first.iloc[0]) in {str(x) for x in warm}


cold_request_covered = _cold_covered


def bundle_cases(bundles: Mapping[str, ResultBundle], engine: Mapping[str, Any],
                 request: Mapping[str, Any]) -> dict[str, ResultBundle]:
    """Case id -> (sub-)bundle for this run's baseline.json.

    - cold_warm: one case, ``<preset>_<F>f_<H>x<W>_<S>s_w<warmup>``.
    - warmup_shapes: one case per (launch, covered request frames), suffix ``_shapes``.
    - memory_budget: one case per launch (cap), suffix ``_cap-<label>``.

    As in sglang's baseline dump every request counts and the worst is kept, except an
    uncovered cold request (its shape differs from the startup warmup's): its shape setup is
    what the investigations report and the invariants gate, so the baseline holds the steady
    state. Uncovered warmup_shapes slices are left out for the same reason.

    Slices without a completed measured request are left out.
    """
    cases: dict[str, ResultBundle] = {}
    cw = bundles.get("cold_warm")
    if cw is not None and _has_measured(cw):
        cases[case_id(engine, request)] = sub_bundle(cw, skip_first=not _cold_covered(cw))
    ws = bundles.get("warmup_shapes")
    if ws is not None and not ws.requests.empty:
        req = ws.requests
        for row in _launch_rows(ws) or [{"launch": None}]:
            la = row.get("launch")
            w = row.get("warmup_frames")
            w = int(w) if w is not None and not (isinstance(w, float) and math.isnan(w)) else None
            sel = req if la is None or "launch" not in req else req[req["launch"] == la]
            if "index" in sel:
                sel = sel[sel["index"] != -1]
            frames = sorted({int(f) for f in sel.get("num_frames", pd.Series(dtype=float)).dropna()})
            covered = {(c.get("warmup_frames"), c.get("request_frames")): c.get("covered")
                       for c in ws.results.get("coverage") or []}
            for f in frames:
                if covered.get((w, f)) is False:
                    continue  # an uncovered shape's first request is the finding, gated by invariants
                sb = sub_bundle(ws, launch=la, num_frames=f)
                if _has_measured(sb):
                    cases[case_id(engine, request, warmup_frames=w, num_frames=f,
                                  suffix="_shapes")] = sb
    mb = bundles.get("memory_budget")
    if mb is not None and not mb.requests.empty:
        for row in _launch_rows(mb) or [{"launch": None, "label": "unlimited"}]:
            la = row.get("launch")
            label = row.get("cap_label") or row.get("label") or la or "unlimited"
            sb = sub_bundle(mb, launch=la)
            sb = sub_bundle(mb, launch=la, skip_first=not _cold_covered(sb))
            if _has_measured(sb):
                cases[case_id(engine, request, suffix=f"_cap-{_slug(label)}")] = sb
    return cases


# ---------------------------------------------------------------------------------------------
# Notebook helpers: load or run, verdicts
# ---------------------------------------------------------------------------------------------

def _caps(d: Mapping[str, Any] | None):
    from perfkit.caps import MemoryCaps

    if d is None:
        return None
    d = {k: v for k, v in dict(d).items() if v is not None}
    return MemoryCaps(**d)


def load_or_run(scenario: str, *, out: str | Path, bundle_dir: str | Path | None = None,
                engine: Mapping[str, Any] | None = None, request: Mapping[str, Any] | None = None,
                **kwargs: Any) -> ResultBundle:
    """Replay ``bundle_dir`` (launches nothing) or run ``scenario``; the bundle lands in ``out``.

    ``kwargs`` go to the scenario function (perfkit.scenarios): ``repeats``, ``thresholds``,
    ``caps`` (a dict, or for memory_budget a list of dicts), ``warmup_frames``,
    ``request_frames``, ``min_budget`` ({lo_gib, hi_gib} or None; memory_budget only).
    Launch directories (engine logs, perf logs, compile caches) go to ``out/launches/``.

    Raises:
        ScenarioError: the bundle holds no usable measurement (:func:`check_bundle`): the
            notebook fails and the suite exits 2.
    """
    out = Path(out)
    if bundle_dir:
        b = ResultBundle.load(bundle_dir)
        if b.scenario != scenario:
            raise ValueError(f"bundle_dir {bundle_dir} holds a {b.scenario!r} bundle, "
                             f"expected {scenario!r}")
        if Path(bundle_dir).resolve() != out.resolve():
            b.save(out)
        log.info("replaying %s bundle from %s", scenario, bundle_dir)
        check_bundle(scenario, b)
        return b

    from perfkit import scenarios
    from perfkit.client import VideoRequestSpec
    from perfkit.engine import EngineSpec

    spec = EngineSpec.from_dict(dict(engine or {}))
    req = VideoRequestSpec.from_dict(dict(request or {}))
    out.mkdir(parents=True, exist_ok=True)
    work = out / "launches"  # launch directories (logs, perf logs, compile caches)
    # one engine launch serves several investigations where the parameters allow it: the
    # cold_warm session, when it already ran what warmup_shapes / memory_budget would launch
    reuse = None
    if scenario in ("warmup_shapes", "memory_budget") and kwargs.get("share_launches", True) \
            and (out.parent / "cold_warm" / "meta.json").exists():
        try:
            reuse = ResultBundle.load(out.parent / "cold_warm")
        except (OSError, ValueError) as exc:
            log.warning("cold_warm bundle not reusable: %s", exc)
    if scenario == "cold_warm":
        b = scenarios.cold_vs_warm(spec, req, repeats=int(kwargs.get("repeats", 5)),
                                   caps=_caps(kwargs.get("caps")), run_dir=work,
                                   thresholds=kwargs.get("thresholds"))
    elif scenario == "warmup_shapes":
        b = scenarios.warmup_shapes(spec, warmup_frames=list(kwargs["warmup_frames"]),
                                    request_frames=list(kwargs["request_frames"]),
                                    repeats=int(kwargs.get("repeats", 3)), request=req, run_dir=work,
                                    reuse=reuse)
    elif scenario == "memory_budget":
        caps = [_caps(c) for c in (kwargs.get("caps") or [{}])]
        b = scenarios.memory_budget(spec, caps=caps, request=req,
                                    repeats=int(kwargs.get("repeats", 2)), run_dir=work,
                                    min_budget=kwargs.get("min_budget") or None, reuse=reuse)
    else:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    b.save(out)
    check_bundle(scenario, b)  # after saving: the bundle (engine logs) is there to look at
    return b


class ScenarioError(RuntimeError):
    """The measurement itself failed (engine crash, no completed request): exit code 2."""


def check_bundle(scenario: str, bundle: ResultBundle) -> None:
    """Raise :class:`ScenarioError` when a bundle holds no usable measurement.

    cold_warm: an error or no cold/warm numbers. warmup_shapes: no coverage, or an entry with an
    error. memory_budget: a launch without caps that did not complete (an engine crash, not a
    budget verdict; a capped launch that fails is a gate result instead).
    """
    r = bundle.results or {}
    where = f"{scenario} ({bundle.path or 'bundle'})"
    if scenario == "cold_warm":
        if r.get("error") or r.get("cold_ms") is None or r.get("warm_median_ms") is None:
            raise ScenarioError(f"{where}: no cold/warm measurement: "
                                f"{r.get('error') or 'fewer than 2 completed requests'}")
    elif scenario == "warmup_shapes":
        cov = r.get("coverage") or []
        if not cov:
            raise ScenarioError(f"{where}: no coverage measured")
        bad = [c for c in cov if c.get("error")]
        if bad:
            raise ScenarioError(f"{where}: warmup {bad[0].get('warmup_frames')}f / request "
                                f"{bad[0].get('request_frames')}f failed: {bad[0]['error']}")
        if not any(c.get("first_ms") is not None for c in cov):
            raise ScenarioError(f"{where}: no request shape was measured (every entry lacks a "
                                f"first request and a warm one): "
                                f"{_first_request_error(bundle) or 'see the engine log'}")
    elif scenario == "memory_budget":
        caps = r.get("caps") or []
        if not caps:
            raise ScenarioError(f"{where}: no budget measured")
        for c in caps:
            if c.get("device_cap_gib") is None and c.get("host_cap_gib") is None \
                    and not c.get("completed"):
                raise ScenarioError(f"{where}: the run without caps ({c.get('label')}) did not "
                                    f"complete: {c.get('error') or 'see the engine log'}")


def _first_request_error(bundle: ResultBundle) -> str | None:
    """The first measured request's error text (e.g. the engine's HTTP 400 message), if any."""
    req = bundle.requests
    if req.empty or "error" not in req:
        return None
    if "index" in req:
        req = req[req["index"] >= 0].sort_values("index", kind="stable")
    errs = [str(e) for e in req["error"] if isinstance(e, str) and e.strip()]
    return errs[0] if errs else None


def scenario_verdict(scenario: str, results: Mapping[str, Any],
                     invariants: Mapping[str, Any] | None = None) -> list[bl.Verdict]:
    """Invariant rows for one investigation (only the invariants that concern it)."""
    inv = dict(bl.DEFAULT_INVARIANTS if invariants is None else invariants)
    keys = SCENARIO_INVARIANTS.get(scenario, ())
    mine = {k: v for k, v in inv.items() if k in keys}
    return bl.check_invariants({scenario: dict(results)}, mine)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return _jsonable(v.item())
        except (TypeError, ValueError):
            pass
    return v


def write_verdict(out: str | Path, scenario: str, rows: Iterable[bl.Verdict | Mapping[str, Any]],
                  **extra: Any) -> dict[str, Any]:
    """Write ``out/verdict.json``: {scenario, status, rows, ...extra}. Returns the document."""
    df = bl.verdict_table(rows)
    doc = {"scenario": scenario, "status": bl.overall_status(df),
           "rows": _jsonable(df.to_dict("records")), **_jsonable(extra)}
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    bl.atomic_write_text(p / VERDICT_FILE, json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def read_verdict(path: str | Path) -> dict[str, Any] | None:
    p = Path(path)
    if p.is_dir():
        p = p / VERDICT_FILE
    if not p.exists():
        return None
    return json.loads(p.read_text())


def load_run_bundles(run_dir: str | Path) -> dict[str, ResultBundle]:
    """Scenario -> bundle for each ``run_dir/<scenario>/`` holding one."""
    out: dict[str, ResultBundle] = {}
    for s in SCENARIOS:
        d = Path(run_dir) / s
        if (d / "meta.json").exists():
            out[s] = ResultBundle.load(d)
    return out


@dataclass
class GateResult:
    baseline_doc: dict[str, Any]
    cases: list[str]
    invariant_rows: list[bl.Verdict]
    baseline_rows: list[bl.Verdict]
    compared_with: str | None
    errors: list[str] = field(default_factory=list)
    #: e.g. the baseline's hardware differs from this run's (printed, not gated)
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[bl.Verdict]:
        return [*self.invariant_rows, *self.baseline_rows]


def gate(run_dir: str | Path, *, engine: Mapping[str, Any], request: Mapping[str, Any],
         baseline_file: str | Path | None = None, profile: str = "pr_test", strict: bool = False,
         hardware: str | None = None, invariants: Mapping[str, Any] | None = None) -> GateResult:
    """The baseline gate. Launches nothing: reads the bundles under ``run_dir``.

    Writes ``run_dir/baseline.json`` (this run's numbers, sglang layout, one case per
    :func:`bundle_cases`), compares them with ``baseline_file`` when given (``profile``,
    ``strict``) and checks ``invariants`` (default :data:`perfkit.baseline.DEFAULT_INVARIANTS`)
    on every scenario's results.
    """
    run_dir = Path(run_dir)
    bundles = load_run_bundles(run_dir)
    errors: list[str] = []
    if not bundles:
        errors.append(f"no bundles under {run_dir}")
    cases = bundle_cases(bundles, engine, request)
    hw = hardware or _hardware(bundles)
    doc = bl.baseline_from_bundles(cases, hardware=hw)
    bl.save_baseline(doc, run_dir / "baseline.json")
    inv = dict(bl.DEFAULT_INVARIANTS if invariants is None else invariants)
    inv_rows = bl.check_invariants({s: b.results for s, b in bundles.items()}, inv)
    base_rows: list[bl.Verdict] = []
    warnings: list[str] = []
    compared = None
    if baseline_file:
        bpath = resolve_baseline_file(baseline_file)
        if bpath.exists():
            ref = bl.load_baseline(bpath)
            base_rows = bl.compare(doc["scenarios"], ref, profile=profile, strict=strict)
            compared = str(bpath)
            overlap, warnings = bl.check_overlap(doc["scenarios"], ref, source=str(baseline_file),
                                                 run_hardware=hw)
            base_rows = [*overlap, *base_rows]
            for w in warnings:
                log.warning("%s", w)
        else:
            log.warning("baseline file %s does not exist: comparing nothing", baseline_file)
            base_rows = [bl.Verdict("baseline", str(baseline_file), None, None, None,
                                    "fail" if strict else "skipped",
                                    "baseline file not found" + (" (strict)" if strict else ""))]
    return GateResult(doc, list(cases), inv_rows, base_rows, compared, errors, warnings)


def resolve_baseline_file(file: str | Path) -> Path:
    """A params ``baseline.file``: as given when it exists (absolute or relative to the current
    directory), else relative to the perfkit checkout (:func:`repo_root`)."""
    p = Path(file)
    if not p.is_absolute() and not p.exists():
        return repo_root() / p
    return p


def run_hardware(run_dir: str | Path) -> str:
    """The hardware label of a finished run: its baseline.json's ``metadata.hardware``, else the
    params' ``baseline.hardware``, else what its bundles say (GPU name, CPU count)."""
    run_dir = Path(run_dir)
    try:
        hw = (bl.load_baseline(run_dir / "baseline.json").get("metadata") or {}).get("hardware")
        if hw:
            return str(hw)
    except (OSError, bl.BaselineError):
        pass
    try:
        sp = yaml.safe_load((run_dir / "params.yaml").read_text()) or {}
        hw = (sp.get("baseline") or {}).get("hardware")
        if hw:
            return str(hw)
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return _hardware(load_run_bundles(run_dir))


def _hardware(bundles: Mapping[str, ResultBundle]) -> str:
    for b in bundles.values():
        gpu = b.meta.get("gpu_name")
        if gpu:
            return str(gpu)
    for b in bundles.values():
        if b.meta.get("cpu_count"):
            return f"cpu x{b.meta['cpu_count']} ({b.meta.get('host', 'host')})"
    return "unknown"


def run_cases(run_dir: str | Path, engine: Mapping[str, Any] | None = None,
              request: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Case id -> scenario entry for a finished run (from its baseline.json, else its bundles)."""
    run_dir = Path(run_dir)
    if engine is None or request is None:
        p = run_dir / "params.yaml"
        if (run_dir / "baseline.json").exists() and engine is None:
            return dict(bl.load_baseline(run_dir / "baseline.json").get("scenarios") or {})
        if p.exists():
            sp = yaml.safe_load(p.read_text())
            engine = engine or sp.get("engine") or {}
            request = request or sp.get("request") or {}
    cases = bundle_cases(load_run_bundles(run_dir), engine or {}, request or {})
    return {c: bl.from_bundle(b, c) for c, b in cases.items()}


# ---------------------------------------------------------------------------------------------
# Running notebooks
# ---------------------------------------------------------------------------------------------

@dataclass
class NotebookRun:
    name: str
    status: str = "pending"  # ok, error, skipped
    wall_s: float | None = None
    error: str | None = None
    ename: str | None = None
    output: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    #: why a notebook was skipped (disabled in the params, not selected, no bundle to replay)
    reason: str | None = None


def kernel_name() -> str:
    """A kernel that runs this Python (``python3`` resolves to ``sys.executable``; otherwise a
    ``perfkit`` kernelspec pointing at this interpreter is installed under ``sys.prefix``)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec(KERNEL_NAME)
        exe = spec.argv[0] if spec.argv else ""
        if exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}") \
                or Path(exe).resolve() == Path(sys.executable).resolve():
            return KERNEL_NAME
        log.info("kernel python3 runs %s, not %s: using a perfkit kernel", exe, sys.executable)
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install

    install(kernel_name="perfkit", display_name="Python (perfkit)", prefix=sys.prefix)
    return "perfkit"


def _error_of(nb_path: Path) -> tuple[str | None, str | None]:
    """(ename, text) of the first error output in an executed notebook."""
    import nbformat

    try:
        nb = nbformat.read(str(nb_path), as_version=4)
    except Exception:  # noqa: BLE001
        return None, None
    for cell in nb.cells:
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "error":
                return o.get("ename"), f"{o.get('ename')}: {o.get('evalue')}"
    return None, None


@contextlib.contextmanager
def _stderr_to(path: Path | None):
    """Send file descriptor 2 (ours and the kernel's, which inherits it) to ``path``."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def execute_notebook(src: str | Path, dst: str | Path, parameters: Mapping[str, Any], *,
                     cwd: str | Path | None = None, timeout_s: float | None = None,
                     kernel: str | None = None, kernel_log: str | Path | None = None) -> NotebookRun:
    """Run one notebook with papermill; never raises for a failing notebook.

    ``kernel_log``: file that receives the kernel's own stderr (ipykernel's transport warnings,
    shutdown noise) and papermill's log lines instead of the terminal.
    """
    import papermill as pm

    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=src.stem, output=str(dst), parameters=_jsonable(dict(parameters)))
    t0 = time.monotonic()
    try:
        with _stderr_to(Path(kernel_log) if kernel_log else None):
                pm.execute_notebook(str(src), str(dst), parameters=dict(parameters),
                                kernel_name=kernel or kernel_name(),
                                cwd=str(cwd) if cwd else None, progress_bar=False,
                                log_output=False,
                                execution_timeout=int(timeout_s) if timeout_s else None)
        run.status = "ok"
    except Exception as exc:  # noqa: BLE001 - papermill errors, dead kernels, timeouts
        run.status = "error"
        ename, text = _error_of(dst) if dst.exists() else (None, None)
        run.ename = ename or type(exc).__name__
        run.error = text or f"{type(exc).__name__}: {exc}"
        log.error("notebook %s failed: %s", src.name, run.error)
    run.wall_s = round(time.monotonic() - t0, 2)
    return run


def notebook_parameters(name: str, params: SuiteParams, run_dir: Path,
                        replay: Path | None = None) -> dict[str, Any]:
    """Papermill parameters of one notebook, from the suite params."""
    common = {"run_dir": str(run_dir), "engine": dict(params.engine),
              "request": params.request.model_dump(), "invariants": params.invariants_all()}
    if name == GATE:
        b = params.baseline
        bfile = b.file
        return {**common, "baseline_file": bfile, "profile": b.profile, "strict": b.strict,
                "hardware": b.hardware}
    sec = getattr(params, name).model_dump()
    sec.pop("enabled", None)
    bundle_dir = None
    if replay is not None:
        if not (replay / name / "meta.json").exists():  # a replay never launches an engine
            raise SuiteError(f"--replay {replay}: no {name} bundle ({NO_REPLAY_BUNDLE})")
        bundle_dir = str(replay / name)
    return {**common, **sec, "bundle_dir": bundle_dir}


@dataclass
class SuiteResult:
    run_dir: Path
    exit_code: int
    status: str
    notebooks: list[NotebookRun]
    verdicts: pd.DataFrame

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "exit_code": self.exit_code, "status": self.status,
                "notebooks": [asdict(n) for n in self.notebooks]}


def default_out(name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("outputs") / f"{name}-{stamp}"


def collect_verdicts(run_dir: str | Path) -> pd.DataFrame:
    """All verdict rows of a run (investigations + gate), duplicates dropped, with a
    ``notebook`` column."""
    frames = []
    for name in NOTEBOOKS:
        doc = read_verdict(Path(run_dir) / name)
        if doc and doc.get("rows"):
            df = bl.verdict_table(doc["rows"])
            df.insert(0, "notebook", name)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["notebook", *bl.VERDICT_COLUMNS])
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(subset=["case", "metric"], keep="first").reset_index(drop=True)


def exit_code_for(notebooks: Iterable[NotebookRun | Mapping[str, Any]], verdicts: pd.DataFrame) -> int:
    for n in notebooks:
        st = n.status if isinstance(n, NotebookRun) else n.get("status")
        if st == "error":
            return EXIT_ERROR
    if not verdicts.empty and (verdicts["status"] == "fail").any():
        return EXIT_REGRESSION
    return EXIT_OK


STATUS_WORD = {EXIT_OK: "pass", EXIT_REGRESSION: "regression", EXIT_ERROR: "error"}


class SuiteError(ValueError):
    """A suite that cannot start (replay directory without bundles, run directory holding
    another run): nothing ran; exit code 2."""


#: skip reason of an investigation whose bundle the replay directory lacks
NO_REPLAY_BUNDLE = "no bundle in replay dir"
#: what a run directory holds once a suite ran there (see the module doc)
RUN_OUTPUTS = (RUN_FILE, "params.yaml", "baseline.json", "summary.md", "report.html",
               "report.png", "notebooks", *NOTEBOOKS)


def check_baseline_file(params: SuiteParams, source: str | Path) -> None:
    """Raise :class:`ParamsError` when ``baseline.file`` is set but missing, not a valid
    baseline (the message gives line/column for broken JSON) or lacks ``baseline.profile``.
    ``file: null`` means invariants only and passes."""
    f = params.baseline.file
    if f is None:
        return
    p = resolve_baseline_file(f)
    if not p.exists():
        raise ParamsError(f"{source}: baseline.file: {f} does not exist (looked in {Path.cwd()} "
                          f"and {repo_root()}); use 'file: null' to gate on invariants only")
    try:
        ref = bl.load_baseline(p)
    except bl.BaselineError as exc:
        raise ParamsError(f"{source}: baseline.file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{source}: baseline.file: cannot read {p}: {exc}") from None
    profiles = sorted(ref.get("tolerances") or {})
    if params.baseline.profile not in profiles:
        raise ParamsError(f"{source}: baseline.profile: {params.baseline.profile!r} is not a "
                          f"tolerance profile of {f} (it has: {', '.join(profiles) or 'none'})")


def replay_plan(replay_dir: Path, selected: Iterable[str]) -> list[str]:
    """The selected investigations without a bundle in ``replay_dir`` (they are skipped, never
    launched). Raises :class:`SuiteError` when ``replay_dir`` is missing or holds no bundle of
    the selected investigations."""
    selected = list(selected)
    if not replay_dir.exists():
        raise SuiteError(f"--replay {replay_dir}: no such directory (--replay launches nothing: "
                         "it needs a run directory holding bundles)")
    if not replay_dir.is_dir():
        raise SuiteError(f"--replay {replay_dir}: not a directory")
    have = [s for s in SCENARIOS if (replay_dir / s / "meta.json").exists()]
    if not have:
        raise SuiteError(f"--replay {replay_dir}: no bundle to replay (expected "
                         f"<dir>/<investigation>/meta.json for one of {', '.join(SCENARIOS)}); "
                         "--replay launches nothing")
    missing = [n for n in selected if n not in have]
    if selected and len(missing) == len(selected):
        raise SuiteError(f"--replay {replay_dir}: no bundle of {', '.join(selected)} (it holds "
                         f"{', '.join(have)}); --replay launches nothing")
    return missing


def prepare_run_dir(run_dir: Path, *, force: bool = False, replay_dir: Path | None = None) -> None:
    """Refuse (:class:`SuiteError`) a run directory that holds another run, unless ``force``:
    then that run's outputs (:data:`RUN_OUTPUTS`) are removed, so no stale bundle or verdict
    mixes into the new report."""
    if replay_dir is not None and replay_dir == run_dir:
        raise SuiteError(f"--replay and --out are the same directory ({run_dir}): choose another "
                         "--out (the replayed bundles are copied there)")
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise SuiteError(f"--out {run_dir}: exists and is not a directory")
    found = [run_dir / n for n in RUN_OUTPUTS if (run_dir / n).exists()]
    if not found:
        return
    if not force:
        raise SuiteError(f"--out {run_dir} already holds another run "
                         f"({', '.join(p.name for p in found)}); its bundles would mix into this "
                         "run's report: choose a new --out, or pass --force to replace that run")
    for p in found:
        log.warning("--force: removing %s of the earlier run", p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def run_suite(params_path: str | Path, out: str | Path | None = None, *,
              replay: str | Path | None = None, only: Iterable[str] | None = None,
              notebooks: str | Path | None = None, screenshot: bool = True,
              progress: bool = True, force: bool = False) -> SuiteResult:
    """Run the suite (see the module doc). Raises :class:`ParamsError` (bad params, baseline
    file) or :class:`SuiteError` (replay directory without bundles, ``out`` holding another run
    and no ``force``) before anything runs; every later failure is reported through the exit
    code.

    With ``replay`` nothing is launched: an investigation whose bundle the replay directory
    lacks is skipped (:data:`NO_REPLAY_BUNDLE`).
    """
    from perfkit import report

    params = load_params(params_path)
    check_baseline_file(params, params_path)
    spec = params.engine_spec()
    try:
        spec.check()
    except FileNotFoundError as exc:
        if not replay:
            raise ParamsError(f"{params_path}: engine: {exc}") from None
    run_dir = Path(out) if out else default_out(params.name)
    run_dir = run_dir.resolve()
    replay_dir = Path(replay).resolve() if replay else None
    enabled = params.enabled()
    selected = [n for n in enabled if not only or n in set(only)]
    skipped = {n: "disabled in the params" if n not in enabled else "not selected by --only"
               for n in SCENARIOS if n not in selected}
    if replay_dir is not None:
        for n in replay_plan(replay_dir, selected):
            skipped[n] = NO_REPLAY_BUNDLE
            log.warning("--replay %s: no %s bundle: %s skipped", replay_dir, n, n)
    prepare_run_dir(run_dir, force=force, replay_dir=replay_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.yaml").write_text(
        f"# validated from {params_path}\n" + yaml.safe_dump(params.model_dump(), sort_keys=False))
    nb_dir = Path(notebooks) if notebooks else notebooks_dir()
    names = [n for n in selected if n not in skipped] + [GATE]
    runs: list[NotebookRun] = [NotebookRun(n, status="skipped", reason=skipped[n])
                               for n in SCENARIOS if n in skipped]
    kern = kernel_name()
    t_start = time.monotonic()
    try:
        from tqdm import tqdm

        # the bar writes to a copy of the terminal's stderr: fd 2 goes to kernel logs meanwhile
        bar_file = os.fdopen(os.dup(2), "w") if progress else sys.stderr
        it = tqdm(names, desc="perfkit suite", unit="notebook", disable=not progress,
                  file=bar_file)
    except ImportError:  # pragma: no cover
        it = names
    for name in it:
        if hasattr(it, "set_postfix_str"):
            it.set_postfix_str(name)
        src = nb_dir / f"{name}.ipynb"
        dst = run_dir / "notebooks" / f"{name}.ipynb"
        if not src.exists():
            runs.append(NotebookRun(name, status="error", error=f"notebook {src} not found",
                                    ename="FileNotFoundError"))
            continue
        # a stale verdict from an earlier run in the same directory must not count
        stale = run_dir / name / VERDICT_FILE
        if stale.exists():
            stale.unlink()
        log.info("running %s", src)
        try:
            r = execute_notebook(src, dst, notebook_parameters(name, params, run_dir, replay_dir),
                                 cwd=run_dir, timeout_s=params.timeout_s, kernel=kern,
                                 kernel_log=run_dir / "notebooks" / f"{name}.kernel.log")
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM (CI cancel): the kernel is shut down, its engine follows it
            # (launch's parent-death signal); stop here, but still write the report (exit 2)
            log.error("interrupted while running %s: writing the report of what ran", name)
            runs.append(NotebookRun(name, status="error", ename="KeyboardInterrupt",
                                    error=f"interrupted (Ctrl-C or SIGTERM) while running {name}"))
            break
        if r.status == "ok" and read_verdict(run_dir / name) is None:
            r.status, r.ename = "error", "MissingVerdict"
            r.error = f"notebook {name} finished without writing {name}/{VERDICT_FILE}"
        runs.append(r)
    if hasattr(it, "close"):
        it.close()
    order = {n: i for i, n in enumerate(NOTEBOOKS)}
    runs.sort(key=lambda r: order.get(r.name, 99))
    verdicts = collect_verdicts(run_dir)
    code = exit_code_for(runs, verdicts)
    info = {"params_file": str(params_path), "name": params.name,
            "description": params.description, "exit_code": code, "status": STATUS_WORD[code],
            "wall_s": round(time.monotonic() - t_start, 2),
            "finished": _dt.datetime.now().isoformat(timespec="seconds"),
            "replay": str(replay_dir) if replay_dir else None,
            "notebooks": [asdict(r) for r in runs]}
    (run_dir / RUN_FILE).write_text(json.dumps(_jsonable(info), indent=2, default=str) + "\n")
    summary = report.write_summary(run_dir)
    gh = os.environ.get("GITHUB_STEP_SUMMARY")
    if gh:
        try:
            with open(gh, "a", encoding="utf-8") as fh:
                fh.write(summary + "\n")
        except OSError as exc:
            log.warning("cannot append to GITHUB_STEP_SUMMARY %s: %s", gh, exc)
    html = report.render_report(run_dir)
    if screenshot:
        try:
            report.screenshot(html, run_dir / "report.png")
        except Exception as exc:  # noqa: BLE001 - a screenshot is a nicety
            log.warning("no screenshot: %s", exc)
    return SuiteResult(run_dir, code, STATUS_WORD[code], runs, verdicts)
