"""Generate the suite's notebooks (committed without outputs).

    python notebooks/make_notebooks.py          # rewrite notebooks/*.ipynb
    python notebooks/make_notebooks.py --check  # exit 1 when a committed notebook differs

Notebooks stay thin: perfkit calls, plots, a short reading. Logic lives in the package
(perfkit.suite, perfkit.report, perfkit.report.plots, perfkit.gate.baseline) where tests reach it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from perfkit import nbparams

HERE = Path(__file__).resolve().parent

SETUP = """from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from perfkit.bundle import table_rows
from perfkit.checks import check_table
from perfkit.gate import run as gate_run
from perfkit.gate import verdicts
from perfkit.gate.outcome import finish
from perfkit.readings.stages import REFINEMENT, stage_class
from perfkit.report import plots, reading, show, summary_frame, tables
from perfkit.report.notebook import (check_frame, first_request_costs, invariants_frame,
                                     replay_markdown, request_frame, show_table, verdict_markdown)
from perfkit.scenarios.runner import load_or_run

_ = tables.use_in_notebook()  # every DataFrame shown through perfkit's one table formatter"""


GATE_CELL = """show_table(check_frame(rows))
display(Markdown(verdict_markdown(rows)))"""

ROOT_CAUSE = """show_table(first_request_costs(bundle.requests, bundle.stages), transpose=False)"""

REQUESTS = """show_table(request_frame(bundle.requests), transpose=False)"""

#: what grew between the allocator snapshots, by allocation site (perfkit.measuring.memsites)
MEMORY_SITES = """from perfkit.measuring.memsites import sites_markdown

display(Markdown(sites_markdown(results) or "No allocator snapshots: set `snapshot` (e.g. `{}`) to take them."))
sites = bundle.tables.get("memory_sites")
if sites is not None and not sites.empty:
    for kind, caption in (("grew", "What grew between the snapshots, by allocation site"),
                          ("peak", "Alive at warm request k's peak, by allocation site")):
        show_table(sites[sites["kind"] == kind].drop(columns=["kind"]), caption=caption, transpose=False)"""

MEMORY_SITES_MD = (
    "## Allocation sites: what grew, allocated where\n\n"
    "With `snapshot` set, the engine records CUDA allocation history and dumps allocator "
    "snapshots after the cold request and after warm request k (torch's "
    "`_record_memory_history` / `_dump_snapshot`; open them at pytorch.org/memory_viz). The "
    "live blocks that grew between the two are grouped by allocation site (the innermost "
    "engine frame first), and the blocks alive at warm request k's peak the same way. On a CPU "
    "engine this says *not available on cpu*."
)


def bind_cell(name: str) -> str:
    """The cell after the parameters (and papermill's injected ones): every value checked and
    typed (perfkit.nbparams.bind) before anything is imported or launched."""
    return f'''from perfkit.nbparams import bind

# unknown names, -p strings (read as JSON or YAML), every value validated: before anything runs
globals().update(bind("{name}", globals()))'''


def _fields(name: str) -> list[str]:
    """The scenario's own parameters (its params model's fields)."""
    return [p.name for p in nbparams.section_params(name)]


def gate_cells(name: str, where: str) -> list:
    """The last cells: the gate's sentence, and (``fail_on="gate"``) the exception that makes
    papermill exit 1 when the gate failed, after every output above is rendered."""
    return [
        new_markdown_cell(
            "## Gate result\n\n"
            'With `fail_on = "gate"` (the default) this cell raises `GateFailed` when the gate '
            "failed or judged nothing, so `papermill` exits 1; every output above is kept. "
            '`fail_on = "never"` explores without failing the run.'
        ),
        new_code_cell(f"finish({name}, _verdict, fail_on, where={where})"),
    ]


def measure_cell(name: str) -> str:
    """Replay or run the scenario, then write its verdict."""
    args = ", ".join(f"{k}={k}" for k in _fields(name))
    return f'''out = Path(run_dir) / "{name}"
bundle = load_or_run("{name}", out=out, bundle_dir=bundle_dir, engine=engine, request=request,
                     {args})
results = bundle.results
rows = gate_run.scenario_checks("{name}", results, invariants)  # defaults merged with `invariants`
_verdict = verdicts.write_verdict(out, "{name}", rows)
if bundle_dir:
    display(Markdown(replay_markdown(bundle.meta.get("params"), dict({args}), bundle_dir)))
show_table(invariants_frame("{name}", invariants), caption="Limits this run is judged against")'''


def _nb(name: str, title: str, intro: str, cells: list, setup: str = SETUP) -> nbformat.NotebookNode:
    pcell = new_code_cell(nbparams.parameters_cell(name))
    pcell.metadata["tags"] = ["parameters"]
    nb = new_notebook(
        cells=[
            new_markdown_cell(f"# {title}\n\n{intro}"),
            pcell,
            new_code_cell(bind_cell(name)),
            new_code_cell(setup),
            *cells,
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    # stable ids, the ones nbstripout's git filter writes (the cell's position): regenerating gives
    # the same files, and a notebook saved from JupyterLab cleans back to exactly this file
    for i, c in enumerate(nb.cells):
        c.id = str(i)
    return nb


#: the profiled requests of a bundle, op by op (perfkit.report.belowstage)
BELOW_STAGE = """from perfkit.report import belowstage

below = belowstage.below_stage(bundle)
if below is None:
    display(Markdown("No request was profiled (set `profile`, e.g. `{'requests': ['cold', 'warm'], 'steps': 5}`)."))
else:
    show_table(belowstage.trace_list(below), caption="Profiled requests and their trace files")
    for err in below.errors:
        display(Markdown(f"**Trace not read:** `{err}`"))
    if below.diff is not None:
        show_table(belowstage.diff_frame(below.diff, first=belowstage.first_word(below)),
                   caption=f"Ops whose time changed most, {belowstage.diff_title(below)}")
    for role, top in below.stage_top.items():
        show_table(top, caption=f"Top ops per stage, {role}")
    for role, over in belowstage.overhead_tables(below):
        show_table(over, caption=f"CPU-side overhead and device idle share per stage, {role}")
    for role, events in list(below.events.items())[:2]:  # the first one, the first warm one
        show(plots.step_timeline(events, title=f"One denoising step over time, {role}"))"""


def cold_warm() -> nbformat.NotebookNode:
    cells = [
        new_code_cell(measure_cell("cold_warm")),
        new_markdown_cell("## Headline numbers"),
        new_code_cell("""show_table(summary_frame("cold_warm", results))
display(Markdown(reading("cold_warm", results)))"""),
        new_markdown_cell(
            "## Why the first request pays: recompilation\n\n"
            "Each request that ran a shape first in its launch (the cold request, or the first of a "
            "new shape): its penalty over the warm median of the same shape, the stage holding "
            "most of it, and the recompilations it paid (count, compile time, the compiler's reason)."
        ),
        new_code_cell(ROOT_CAUSE),
        new_markdown_cell(
            "## Below the stage: profiled requests\n\n"
            "With `profile` set, an extra launch sends a cold and a warm request with sglang's "
            "profiling fields (`profile`, `num_profiled_timesteps`, `profile_all_stages`); their "
            "torch.profiler traces are in the bundle under `traces/` (open them in Perfetto, "
            "ui.perfetto.dev, or chrome://tracing). They are extra requests: no statistic, "
            "invariant or gate here reads them. Op time is the wall time of top-level ops."
        ),
        new_code_cell(BELOW_STAGE),
        new_markdown_cell("## Every request: role and shape"),
        new_code_cell(REQUESTS),
        new_markdown_cell("## Gate (invariants measured within this run)"),
        new_code_cell(GATE_CELL),
        new_markdown_cell("## Per-stage latency, cold vs warm requests"),
        new_code_cell("show(plots.stage_breakdown(bundle))"),
        new_markdown_cell("## End-to-end latency per request"),
        new_code_cell("show(plots.e2e_per_request(bundle))"),
        new_markdown_cell("## Denoising step times"),
        new_code_cell("show(plots.step_times(bundle))"),
        new_markdown_cell("## Memory timeline"),
        new_code_cell("""cap_lines = {"device_cap_gib": (caps or {}).get("device_gib"),
             "host_cap_gib": (caps or {}).get("host_gib")}
show(plots.memory_timeline(bundle, caps=cap_lines))"""),
        new_markdown_cell("## Leak checks (rows of the gate above)"),
        new_code_cell("""from perfkit.scenarios.cold_warm import LEAK_CHECKS

leak_rows = [r for r in rows if r.metric in LEAK_CHECKS]
show_table(check_frame(leak_rows))
display(Markdown(verdict_markdown(leak_rows, "Leak checks")))"""),
        new_markdown_cell(MEMORY_SITES_MD),
        new_code_cell(MEMORY_SITES),
        new_markdown_cell(
            "## How to read this\n\n"
            "- The **cold request** (red) pays what the startup warmup did not: shape setup, "
            "lazy initialisation. The **first-request penalty** is cold minus the warm median, per "
            "stage; the stage that holds it says where to look.\n"
            "- A warm/cold ratio above 1 means warm requests are slower than the first: state "
            "leaks across requests (residency, in-flight copies, host copies). The leak checks "
            "fit a slope to host/device memory per request and to latency drift.\n"
            "- Absolute milliseconds are only comparable on the same hardware; the gate here uses "
            "ratios measured within this run."
        ),
    ]
    cells += gate_cells('"cold_warm"', 'str(out / "verdict.json")')
    return _nb(
        "cold_warm",
        "Cold vs warm",
        "Does the second (warm) request in one server session meet the same numbers as the "
        "first (cold) request, or does state leak across requests and degrade it?",
        cells,
    )


def warmup_shapes() -> nbformat.NotebookNode:
    cells = [
        new_code_cell(measure_cell("warmup_shapes")),
        new_markdown_cell("## Coverage"),
        new_code_cell("""coverage = summary_frame("warmup_shapes", results)
show_table(coverage)
display(Markdown(reading("warmup_shapes", results)))"""),
        new_markdown_cell(
            "## Why an uncovered shape pays: recompilation\n\n"
            "Each request that ran a shape first in its launch: its penalty over the warm median "
            "of the same shape in that launch, the stage holding most of it, and the "
            "recompilations it paid (count, compile time, the compiler's reason)."
        ),
        new_code_cell(ROOT_CAUSE),
        new_markdown_cell(
            "## Below the stage: the first request of a new shape against a warm one\n\n"
            "With `profile` set, an extra launch with the warmup that did not cover a shape sends "
            "that shape's first request and warm ones with sglang's profiling fields; their "
            "torch.profiler traces are in the bundle under `traces/` (open them in Perfetto, "
            "ui.perfetto.dev, or chrome://tracing). They are extra requests: no statistic, "
            "invariant or gate here reads them. The diff names the ops the first request of the "
            "new shape spends its penalty in."
        ),
        new_code_cell(BELOW_STAGE),
        new_markdown_cell("## Every request: role and shape"),
        new_code_cell(REQUESTS),
        new_markdown_cell("## Gate (covered shapes pay no setup)"),
        new_code_cell(GATE_CELL),
        new_markdown_cell("## First-request penalty by warmup shape and request shape"),
        new_code_cell("show(plots.coverage_heatmap(coverage))"),
        new_markdown_cell("## Which stage absorbs the penalty (first request − warm median, ms)"),
        new_code_cell("""by_stage = pd.DataFrame({f"warmup {c['warmup_frames']}f → request {c['request_frames']}f":
                         c.get("penalty_by_stage_ms") or {} for c in results["coverage"]}).T
show_table(by_stage.rename(columns=lambda st: f"{st} (ms)").rename_axis("case").reset_index())
if any(stage_class(s) == REFINEMENT for s in by_stage.columns):  # only for a two-stage run
    display(Markdown("With the two-stage pipeline the half-resolution denoising stage and the "
                     "full-resolution refinement stage each specialise on their own latent shape."))"""),
        new_markdown_cell("## End-to-end latency per request, one line per launch"),
        new_code_cell("show(plots.e2e_per_request(bundle))"),
        new_markdown_cell("## Per-stage latency"),
        new_code_cell("show(plots.stage_breakdown(bundle))"),
        new_markdown_cell(
            "## How to read this\n\n"
            "LTX aligns frames to 8k+1 and compresses time by 8: latent frames = (frames − 1) // 8 "
            "+ 1, so a 17-frame warmup runs 3 latent frames and a 25-frame request needs 4. A "
            "request shape is **covered** when the startup warmup already ran its latent shape; "
            "an uncovered shape pays recompilation / graph capture on its first request (the "
            "penalty above, with its compile count). The fix is a warmup at the served shapes."
        ),
    ]
    cells += gate_cells('"warmup_shapes"', 'str(out / "verdict.json")')
    return _nb(
        "warmup_shapes",
        "Warmup shapes",
        "Does the server's startup warmup cover the shapes users send?",
        cells,
    )


def memory_budget() -> nbformat.NotebookNode:
    cells = [
        new_code_cell(measure_cell("memory_budget")),
        new_markdown_cell("## Budgets"),
        new_code_cell("""show_table(summary_frame("memory_budget", results))
display(Markdown(reading("memory_budget", results)))"""),
        new_markdown_cell("## Gate (caps held, runs completed)"),
        new_code_cell(GATE_CELL),
        new_markdown_cell("## Memory timeline per budget"),
        new_code_cell("""for row in table_rows(bundle.launches) or [{}]:
    show(plots.memory_timeline(
        bundle, launch=row.get("launch"),
        caps={"device_cap_gib": row.get("device_cap_gib"), "host_cap_gib": row.get("host_cap_gib")}))"""),
        new_markdown_cell(MEMORY_SITES_MD),
        new_code_cell(MEMORY_SITES),
        new_markdown_cell("## Latency per request under each budget"),
        new_code_cell("show(plots.e2e_per_request(bundle))"),
        new_markdown_cell(
            "## How to read this\n\n"
            "Each budget is one launch. The device cap works like sglang's CI "
            "(`SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB`: the worker caps torch's memory "
            "fraction); the host cap is what host planning sees "
            "(`SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB`) and, where possible, enforced "
            "(cgroup or watchdog: see `enforcement`). A budget is met when the run completed and "
            "the cap held; `placement` says what the engine moved off the device to fit, and "
            "`warm_degrades` whether warm requests got slower under the cap."
        ),
    ]
    cells += gate_cells('"memory_budget"', 'str(out / "verdict.json")')
    return _nb(
        "memory_budget",
        "Memory budget",
        "Does the pipeline fit the memory budget (e.g. 12 GiB GPU + 32 GiB host), and what "
        "does it cost in latency?",
        cells,
    )


def offload_modes() -> nbformat.NotebookNode:
    cells = [
        new_code_cell(measure_cell("offload_modes")),
        new_markdown_cell("## Modes"),
        new_code_cell("""modes_table = summary_frame("offload_modes", results)
show_table(modes_table)
display(Markdown(reading("offload_modes", results)))"""),
        new_markdown_cell(
            "## Gate (placement reported as asked, warm not slower, memory order on a GPU)\n\n"
            "Modes the device cannot run are `skipped`, never passed."
        ),
        new_code_cell(GATE_CELL),
        new_markdown_cell("## Device vs host memory, and warm latency, per mode"),
        new_code_cell("show(plots.offload_memory_latency(modes_table))"),
        new_markdown_cell("## Latency per request, one line per mode"),
        new_code_cell("show(plots.e2e_per_request(bundle))"),
        new_markdown_cell("## Per-component placement the engine reported"),
        new_code_cell(
            """placement = pd.DataFrame({m["mode"]: m.get("offload") or {} for m in results["modes"]}).T
show_table(placement.rename_axis("mode").reset_index())"""
        ),
        new_markdown_cell(
            "## How to read this\n\n"
            "Each mode is one launch of the reference engine with `--offload MODE` for every "
            "component. `none` keeps the weights on the device; `model` moves whole components in "
            "and out (accelerate's `cpu_offload_with_hook`, as diffusers' "
            "`enable_model_cpu_offload`); `group-block` and `group-leaf` onload blocks or leaf "
            "modules just before they run (`diffusers.hooks.apply_group_offloading`, with a CUDA "
            "stream prefetching the next group). Expect peak VRAM none > model ≥ group and host "
            "memory the other way round, paid for in warm latency. On a CPU device only `none` "
            "runs: the engine refuses the others at startup (exit code 2) and they are recorded "
            "as *not applicable* with its reason."
        ),
    ]
    cells += gate_cells('"offload_modes"', 'str(out / "verdict.json")')
    return _nb(
        "offload_modes",
        "Offload modes",
        "What does each offload mode (none, model, group-block, group-leaf) cost in latency and "
        "save in device memory, and what does it move to the host?",
        cells,
    )


def overhead() -> nbformat.NotebookNode:
    cells = [
        new_code_cell(measure_cell("overhead")),
        new_markdown_cell("## Overhead of each instrument"),
        new_code_cell("""show_table(summary_frame("overhead", results))
display(Markdown(reading("overhead", results)))"""),
        new_markdown_cell("## Gate (upper end of each interval)"),
        new_code_cell(GATE_CELL),
        new_markdown_cell(
            "## How to read this\n\n"
            "Each instrument is switched on and off in interleaved ABBA pairs of warm requests of one "
            "session, judged on the server's end-to-end time. The overhead is median(on) / "
            "median(off) − 1 with a 95 % bootstrap interval; the gate holds the interval's upper "
            "end to `instrumentation_overhead_max`, so a noisy probe cannot pass on a lucky median."
        ),
    ]
    cells += gate_cells('"overhead"', 'str(out / "verdict.json")')
    return _nb(
        "overhead",
        "Instrumentation overhead",
        "What does perfkit's own instrumentation (stage timing, the memory sampler) cost?",
        cells,
    )


def baseline_gate() -> nbformat.NotebookNode:
    cells = [
        new_code_cell("""g = gate_run.gate(run_dir, engine=engine, request=request, baseline_file=baseline_file,
              profile=profile, strict=strict, hardware=hardware, invariants=invariants)
if g.errors:
    raise RuntimeError("; ".join(g.errors))
_verdict = verdicts.write_verdict(Path(run_dir) / verdicts.GATE, verdicts.GATE, g.rows,
                               cases=g.cases, compared_with=g.compared_with,
                               warnings=g.warnings)
table = check_table(g.rows)"""),
        new_markdown_cell("## This run's baseline (sglang layout)"),
        new_code_cell("""display(Markdown(f"`{Path(run_dir) / 'baseline.json'}`: {len(g.cases)} cases. "
                 "Copy it under `baselines/` (same hardware only) to gate later runs."))
show_table(pd.DataFrame([{"case": c, "slowest warm e2e (ms)": e.get("expected_e2e_ms"),
                       "median step (ms)": e.get("expected_median_denoise_ms"),
                       "load (ms)": e.get("expected_load_ms"),
                       "runtime peak VRAM (MiB)": e.get("runtime_peak_vram_mb")}
                      for c, e in g.baseline_doc["scenarios"].items()]))"""),
        new_markdown_cell("## Invariants (any hardware)"),
        new_code_cell("""show_table(check_table(g.invariant_rows))
display(Markdown(verdict_markdown(g.invariant_rows, "Invariants")))"""),
        new_markdown_cell("## Against the baseline"),
        new_code_cell("""for w in g.warnings:
    display(Markdown(f"**Warning:** {w}"))
if g.compared_with:
    display(Markdown(f"Compared with `{g.compared_with}`, profile `{profile}`."))
    base = check_table(g.baseline_rows)
    show_table(base)
    display(Markdown(verdict_markdown(g.baseline_rows, "Against the baseline")))
    show(plots.baseline_vs_actual(base))
else:
    display(Markdown("No baseline file for this hardware: gated on invariants only."))"""),
        new_markdown_cell(
            "## How to read this\n\n"
            "A baseline metric passes when actual ≤ max(expected × (1 + tol), expected + pad), "
            "sglang's rule; `improved` rows were faster than expected × (1 − 0.2) and carry the "
            "snippet to paste into the baseline. Invariants are ratios within this run (warm/cold, "
            "covered-shape first request, leak slopes, caps held) and hold on any hardware."
        ),
    ]
    cells += gate_cells("verdicts.GATE", 'str(Path(run_dir) / verdicts.GATE / "verdict.json")')
    return _nb(
        "baseline_gate",
        "Baseline gate",
        "This run's numbers in sglang's baseline layout, compared with the baseline of the "
        "same hardware, and the invariants that hold anywhere. Launches nothing: it reads "
        "the bundles the investigations wrote.",
        cells,
    )


def ab() -> nbformat.NotebookNode:
    setup = """from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from perfkit.ab.driver import AbPlan
from perfkit.ab.sequential import Design, decide_sequential, run_sequential
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.params import load_yaml
from perfkit.report import plots, show
from perfkit.gate.outcome import finish_code
from perfkit.report.ab import ab_summary_markdown

pd.set_option("display.max_colwidth", 120)"""
    cells = [
        new_code_cell("""if replay_a:
    bundles = {"A": ResultBundle.load(replay_a), "B": ResultBundle.load(replay_b)}
    recorded = min(len(b.launches) for b in bundles.values())  # the recording is the maximum
    design = Design(min(launches, recorded), min(max_launches, recorded))
else:
    spec = lambda p: EngineSpec.from_dict(load_yaml(Path(p).read_text()))  # noqa: E731
    design = Design(launches, max_launches)
    plan = AbPlan(spec(spec_a), spec(spec_b), VideoRequestSpec(), launches, warm)
    bundles = run_sequential(plan, design, run_dir, threshold, gate=gate_metrics)
res = decide_sequential(bundles["A"], bundles["B"], design, threshold, gate=gate_metrics, undecided=undecided)"""),
        new_markdown_cell("## Verdict per metric"),
        new_code_cell("display(Markdown(ab_summary_markdown(res)))"),
        new_markdown_cell("## Forest plot: B/A with intervals, each launch's dots behind"),
        new_code_cell("show(plots.ab_forest(res.table, res.launch_means))"),
        new_markdown_cell("## Variance between and within launches"),
        new_code_cell(
            'display(res.table[["metric", "icc", "cv_between", "cv_within", "launches_needed", "reason"]])'
        ),
        new_markdown_cell(
            "## How to read this\n\n"
            "Each launch is one sample: its median per metric. The interval of B/A is a 95 % Welch t "
            "interval on the logs of those launch values; a metric is a regression when the whole "
            "interval lies above 1 + threshold, an improvement below 1 − threshold, no change inside "
            "±threshold, else inconclusive (with the launches a side that would decide it, sized from "
            "the measured variance as Kalibera & Jones do). Launches are added in pairs until every "
            "gated metric is decided, each look's interval at its share of the error rate (alpha "
            "spending); still inconclusive at `max_launches` is *undecided*, exit 1 unless "
            '`undecided = "pass"`. `docs/choosing-n-m.md` says how to pick the launches and M.'
        ),
    ]
    cells += [
        new_markdown_cell(
            "## Gate result\n\n"
            'With `fail_on = "gate"` (the default) this cell raises `GateFailed` on a regression, '
            'an undecided gated metric (with `undecided = "fail"`) or nothing compared, so '
            "`papermill` exits 1 as `perfkit ab` does; every output above is kept."
        ),
        new_code_cell('finish_code("A/B", res.exit_code, f"verdict {res.verdict}", fail_on)'),
    ]
    return _nb(
        "ab",
        "A/B: is B slower than A?",
        "Interleaved launches of two engine specs, per-metric ratios B/A with intervals that hold "
        "at a few launches a side (the same as `perfkit ab`).",
        cells,
        setup=setup,
    )


def history() -> nbformat.NotebookNode:
    setup = """import pandas as pd
from IPython.display import Markdown, display

from perfkit.history import changepoints as cp
from perfkit.history.api import import_nightly
from perfkit.history.store import read_store
from perfkit.report import show, tables
from perfkit.report.history_site import series_context, trend_figure

_ = tables.use_in_notebook()  # every DataFrame shown through perfkit's one table formatter"""
    cells = [
        new_code_cell("""if nightly and read_store(store).empty:
    print(f"{len(import_nightly(store, nightly, hardware=hardware).added)} runs imported from {nightly}")
frame = read_store(store, hardware=hardware)
series = frame[(frame["case_id"] == case_id) & (frame["metric"] == metric)]
if series.empty:
    raise ValueError(f"{store}: no series {hardware} / {case_id} / {metric}; cases: {sorted(frame['case_id'].unique())}")
(a,) = cp.analyse_frame(series)
ctx = series_context(a, None, cp.Settings())
display(Markdown(f"**{a.case_id} {a.metric} on {a.hardware}**: {len(a.points)} runs, {len(a.steps)} steps, "
                 f"{len(a.outliers)} outliers, {len(a.gaps)} gaps; latest run: {ctx['latest']['status']} "
                 f"({ctx['latest']['text']})"))"""),
        new_markdown_cell("## Trend: levels, steps (dashed), outliers (crosses), gaps (ticks)"),
        new_code_cell("show(trend_figure(a))"),
        new_markdown_cell("## Steps: commit range, levels, size with its 95 % interval"),
        new_code_cell("""display(pd.DataFrame(ctx["steps"]).assign(
    before=lambda d: d["before"].str["full"], after=lambda d: d["after"].str["full"]) if ctx["steps"] else "no step")"""),
        new_markdown_cell("## Single-run outliers and gaps"),
        new_code_cell("""display(pd.DataFrame(ctx["outliers"]).assign(commit=lambda d: d["commit"].str["full"]) if ctx["outliers"] else "no outlier")
display(pd.DataFrame(ctx["gaps"]) if ctx["gaps"] else "no gap")"""),
        new_markdown_cell("## The runs"),
        new_code_cell(
            """display(series[["time", "commit", "run_id", "value", "error"]].reset_index(drop=True))"""
        ),
        new_markdown_cell(
            "## How to read this\n\n"
            "Steps come from Apache Otava's E-Divisive with a t-test (`perfkit.history.changepoints`): "
            "each is the last run before and the first run after the change, so the commit that caused "
            "it lies in that range. A single run far from both its neighbours (or from its level) is an "
            "outlier, never a step; errors and nulls are gaps, never 0. `perfkit history site` shows "
            "every series of every hardware; `perfkit history check RUN` gates a new run against its series."
        ),
    ]
    return _nb(
        "history",
        "History: one series across commits",
        "A case's metric on one hardware across runs: its levels, the steps between them with their "
        "commit ranges, single-run outliers and gaps (the same analysis as `perfkit history site`).",
        cells,
        setup=setup,
    )


NOTEBOOKS = {
    "cold_warm": cold_warm,
    "warmup_shapes": warmup_shapes,
    "memory_budget": memory_budget,
    "offload_modes": offload_modes,
    "overhead": overhead,
    "baseline_gate": baseline_gate,
    "ab": ab,
    "history": history,
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    bad = 0
    for name, make in NOTEBOOKS.items():
        nb = make()
        text = nbformat.writes(nb) + "\n"
        p = HERE / f"{name}.ipynb"
        if check:
            if not p.exists() or p.read_text() != text:
                print(f"{p} is stale: run python notebooks/make_notebooks.py")
                bad = 1
        else:
            p.write_text(text)
            print(f"wrote {p}")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
