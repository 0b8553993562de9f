"""Generate the suite's notebooks (committed without outputs).

    python notebooks/make_notebooks.py          # rewrite notebooks/*.ipynb
    python notebooks/make_notebooks.py --check  # exit 1 when a committed notebook differs

Notebooks stay thin: perfkit calls, plots, a short reading. Logic lives in the package
(perfkit.suite, perfkit.report, perfkit.report.plots, perfkit.gate.baseline) where tests reach it.
An investigation's notebook is generic cells around the cells, figures and intro its module
declares (perfkit.investigations.common; Investigation.notebook_cells): one per registered investigation,
nothing here names one.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from perfkit import nbparams
from perfkit.investigations import registry
from perfkit.investigations.common import Cell
from perfkit.investigations.registry import Investigation

HERE = Path(__file__).resolve().parent

SETUP = """from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from perfkit.bundle import table_rows
from perfkit.checks import check_table
from perfkit.gate import run as gate_run
from perfkit.gate import verdicts
from perfkit.gate.verdicts import finish
from perfkit.readings.stages import REFINEMENT, stage_class
from perfkit.report import plots, reading, show, summary_frame, tables
from perfkit.report.tables import (check_frame, first_request_costs, invariants_frame,
                                   replay_markdown, request_frame, show_table, verdict_markdown)
from perfkit.investigations.registry import load_or_run

_ = tables.use_in_notebook()  # every DataFrame shown through perfkit's one table formatter"""


def bind_cell(name: str) -> str:
    """The cell after the parameters (and papermill's injected ones): every value checked and
    typed (perfkit.nbparams.bind) before anything is imported or launched."""
    return f'''from perfkit.nbparams import bind

# unknown names, -p strings (read as JSON or YAML), every value validated: before anything runs
globals().update(bind("{name}", globals()))'''


def _fields(name: str) -> list[str]:
    """The investigation's own parameters (its params model's fields)."""
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
        new_code_cell(
            f"_gate = finish({name}, _verdict, fail_on, where={where})  # assigned: the word is not echoed as a raw cell value"
        ),
    ]


def measure_cell(name: str) -> str:
    """Replay or run the investigation, then write its verdict."""
    args = ", ".join(f"{k}={k}" for k in _fields(name))
    return f'''out = Path(run_dir) / "{name}"
bundle = load_or_run("{name}", out=out, bundle_dir=bundle_dir, engine=engine, request=request,
                     {args})
results = bundle.results
rows = gate_run.investigation_checks("{name}", results, invariants)  # defaults merged with `invariants`
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


def _cell(c: Cell) -> nbformat.NotebookNode:
    return new_markdown_cell(c.source) if c.kind == "markdown" else new_code_cell(c.source)


def investigation_notebook(s: Investigation) -> nbformat.NotebookNode:
    """Investigation ``s``'s notebook: its title and intro, the parameters, the generic setup
    and measuring cells, the cells and figures its module declares
    (:meth:`~perfkit.investigations.registry.Investigation.notebook_cells`), and the gate's last cells.
    An investigation outside :mod:`perfkit.investigations` is imported in the setup cell (importing
    it registers it in the kernel)."""
    setup = SETUP
    module = s.run.__module__
    if not module.startswith("perfkit.investigations."):
        setup += f"\n\nimport {module}  # registers the investigation {s.name!r}"
    if s.figures:
        setup += "\nfrom perfkit.investigations.registry import figure"
    cells = [new_code_cell(measure_cell(s.name)), *map(_cell, s.notebook_cells())]
    cells += gate_cells(f'"{s.name}"', 'str(out / "verdict.json")')
    return _nb(s.name, s.title, s.notebook_intro or s.question, cells, setup=setup)


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
        new_code_cell("""show_table(check_frame(g.invariant_rows, with_case=True))
display(Markdown(verdict_markdown(g.invariant_rows, "Invariants")))"""),
        new_markdown_cell("## Against the baseline"),
        new_code_cell("""from perfkit.common.slugs import md_text

for w in g.warnings:
    display(Markdown(f"**Warning:** {md_text(w)}"))
if g.compared_with:
    display(Markdown(f"Compared with {md_text(g.compared_with, code=True)}, profile {md_text(profile, code=True)}."))
    base = check_table(g.baseline_rows)
    show_table(base.rename(columns={"expected": "baseline", "actual": "measured", "bound": "limit"}))
    display(Markdown(verdict_markdown(g.baseline_rows, "Against the baseline")))
    show(plots.baseline_vs_actual(base))
else:
    display(Markdown("No baseline file for this hardware: gated on invariants only."))"""),
        new_markdown_cell(
            "## How to read this\n\n"
            "A baseline metric passes when measured ≤ limit = max(baseline × (1 + tol), baseline + pad), "
            "sglang's rule; `improved` rows were faster than baseline × (1 − 0.2) and carry the "
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

from perfkit.ab.sequential import Design, Gate, decide_sequential, run_sequential
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.params import load_yaml
from perfkit.report import plots, show
from perfkit.gate.verdicts import finish_code
from perfkit.report.ab import ab_summary_markdown

pd.set_option("display.max_colwidth", 120)"""
    cells = [
        new_code_cell("""gate = Gate(gate_metrics, threshold)
if replay_a:
    bundles = {"A": ResultBundle.load(replay_a), "B": ResultBundle.load(replay_b)}
    recorded = min(len(b.launches) for b in bundles.values())  # the recording is the maximum
    design = Design(min(launches, recorded), min(max_launches, recorded))
else:
    spec = lambda p: EngineSpec.from_dict(load_yaml(Path(p).read_text()))  # noqa: E731
    design = Design(launches, max_launches)
    specs = {"A": spec(spec_a), "B": spec(spec_b)}
    bundles = run_sequential(specs, VideoRequestSpec(), warm, design, run_dir, gate)
res = decide_sequential(bundles["A"], bundles["B"], design, gate, undecided)"""),
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
        new_code_cell('_gate = finish_code("A/B", res.exit_code, f"verdict {res.verdict}", fail_on)'),
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
from perfkit.history.check import import_nightly
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
from perfkit.common.slugs import md_text

display(Markdown(f"**{md_text(f'{a.case_id} {a.metric} on {a.hardware}')}**: {len(a.points)} runs, "
                 f"{len(a.steps)} steps, {len(a.outliers)} outliers, {len(a.gaps)} gaps; latest run: "
                 f"{md_text(ctx['latest']['status'])} ({md_text(ctx['latest']['text'])})"))"""),
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


def notebooks() -> dict[str, Callable[[], nbformat.NotebookNode]]:
    """Notebook file stem -> its maker: one per registered investigation, then the gate's, the
    A/B's and the history's."""
    out: dict[str, Callable[[], nbformat.NotebookNode]] = {
        s.name: functools.partial(investigation_notebook, s) for s in registry.all_investigations()
    }
    out.update(baseline_gate=baseline_gate, ab=ab, history=history)
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    bad = 0
    for name, make in notebooks().items():
        nb = make()
        text = nbformat.writes(nb) + "\n"
        p = HERE / (registry.get(name).notebook if name in registry.names() else f"{name}.ipynb")
        if check:
            if not p.exists() or p.read_text() != text:
                print(f"{p} is stale: run make notebooks")
                bad = 1
        elif not p.exists() or p.read_text() != text:
            p.write_text(text)
            print(f"wrote {p}")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
