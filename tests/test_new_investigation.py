"""An investigation is one module (issue 32): a throwaway module in a temporary package, on
sys.path and nowhere in perfkit, registers itself and gets its notebook (the generator's
output, validated by nbformat), its report section (jinja, with its notebook rendered by
nbconvert), its figure (matplotlib), its ``perfkit figures`` blocks and its line in ``perfkit
suite --help``, with no edit outside that module. Nothing is mocked; nothing is launched (its
``run`` is not the subject). A command likewise (docs/DESIGN.md, "Adding a command"): a
throwaway click module named in ``COMMANDS`` runs, and the command reference goes stale until
regenerated."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from perfkit.bundle import ResultBundle
from perfkit.investigations import registry
from perfkit.report import figures as readme_figures
from perfkit.report import render

ROOT = Path(__file__).resolve().parents[1]
NAME = "throwaway_probe"

MODULE = '''
"""A throwaway investigation: everything it needs declared here."""

from typing import Any, Mapping

import matplotlib.figure
import pandas as pd

from perfkit.bundle import ResultBundle
from perfkit.investigations.common import DocBlock, Figure, code, md
from perfkit.investigations.registry import KeyNumber, RunContext, Investigation, InvestigationParams, register

NAME = "throwaway_probe"


class ProbeParams(InvestigationParams):
    enabled: bool = False
    sleeps: int = 3


def run(ctx: RunContext, p: ProbeParams) -> ResultBundle:
    raise NotImplementedError("not launched in this test")


def key_numbers(r: Mapping[str, Any]) -> list[KeyNumber]:
    return [KeyNumber("slowest sleep", r.get("slowest_ms"), "ms")]


def draw(bundle: ResultBundle) -> matplotlib.figure.Figure:
    req = bundle.requests
    fig = matplotlib.figure.Figure()
    ax = fig.add_subplot()
    ax.plot(req["index"], req["e2e_ms"], marker="o")
    ax.set_title("Sleep per request")
    return fig


def pooled(results: list[Mapping[str, Any]], names: list[str]) -> dict[str, Any]:
    return {"slowest_ms": max(r["slowest_ms"] for r in results)}


INVESTIGATION = register(
    Investigation(
        name=NAME,
        title="Throwaway probe",
        question="Does a sleep take as long as asked?",
        params_model=ProbeParams,
        run=run,
        key_numbers=key_numbers,
        section_intro="Each request sleeps; the probe says for how long.",
        cells=(md("## Sleeps, one row each"), code("show_table(bundle.requests)")),
        figures=(Figure("throwaway-sleeps", "Sleep per request", draw),),
        doc_blocks={"throwaway-pooled": DocBlock(pooled, verb="runs pooled")},
    )
)
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The throwaway module imported from a temporary package (so registered); unregistered
    and forgotten afterwards."""
    root = tmp_path_factory.mktemp("throwaway")
    pkg = root / "throwaway_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("throwaway_pkg.probe")
        yield module.INVESTIGATION
    finally:
        if NAME in registry.names():
            registry.unregister(NAME)
        sys.path.remove(str(root))
        for m in [m for m in sys.modules if m.startswith("throwaway_pkg")]:
            del sys.modules[m]


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "notebooks" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bundle() -> ResultBundle:
    requests = pd.DataFrame(
        {
            "launch": ["l0"] * 3,
            "request_id": ["a", "b", "c"],
            "index": [0, 1, 2],
            "e2e_ms": [30.0, 20.0, 21.0],
        }
    )
    requests["status"] = "completed"
    return ResultBundle(investigation=NAME, results={"slowest_ms": 30.0}, tables={"requests": requests})


def test_its_notebook_is_generated_from_its_module(probe):
    gen = _generator()
    makers = gen.notebooks()
    assert NAME in makers  # the generator finds it in the registry: no edit there
    nb = makers[NAME]()
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    assert sources[0].startswith("# Throwaway probe\n\nDoes a sleep take as long as asked?")
    assert nb.cells[1].metadata["tags"] == ["parameters"]
    assert "sleeps: int = 3" in sources[1]  # its params model, written by nbparams
    assert "import throwaway_pkg.probe  # registers the investigation" in sources[3]
    assert "from perfkit.investigations.registry import figure" in sources[3]
    assert f'load_or_run("{NAME}"' in sources[4] and "sleeps=sleeps" in sources[4]
    i = sources.index("## Sleeps, one row each")
    assert sources[i + 1 : i + 4] == [
        "show_table(bundle.requests)",
        "## Sleep per request",
        'show(figure("throwaway-sleeps", bundle))',
    ]
    assert sources[-1].startswith(
        f'_gate = finish("{NAME}", _verdict, fail_on, where=str(out / "verdict.json"))'
    )  # assigned: the page shows no raw cell value
    # the module's cells compile (the notebook would run them)
    for c in nb.cells:
        if c.cell_type == "code":
            compile(c.source, NAME, "exec")


def test_perfkit_suite_help_lists_it(probe):
    import inprocess_cli

    text = inprocess_cli.perfkit("suite", "--help", cwd=ROOT).stdout
    (line,) = [ln for ln in text.splitlines() if ln.split()[:1] == [NAME]]
    assert line.split(None, 1)[1] == "Throwaway probe: Does a sleep take as long as asked? [off by default]"


def test_its_figure_is_drawn_by_kind(probe):
    fig = registry.figure("throwaway-sleeps", _bundle())
    (ax,) = fig.axes
    assert ax.get_title() == "Sleep per request"
    assert list(ax.lines[0].get_ydata()) == [30.0, 20.0, 21.0]
    with pytest.raises(KeyError, match="unknown figure kind 'nope'"):
        registry.figure("nope", _bundle())


def test_its_report_section_uses_the_generic_template(probe, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / NAME).mkdir(parents=True)
    (run_dir / NAME / "results.json").write_text(json.dumps({"slowest_ms": 30.4}))
    nb = _generator().notebooks()[NAME]()
    (run_dir / "notebooks").mkdir()
    nbformat.write(nb, run_dir / "notebooks" / f"{NAME}.ipynb")
    assert render.section_template(NAME) == "sections/investigation.html.j2"
    html = render.render_section(run_dir, {"name": NAME, "status": "ok", "wall_s": 1.5})
    assert f'<section id="{NAME}"' in html
    assert "<h2>Throwaway probe</h2>" in html
    assert "Does a sleep take as long as asked?" in html
    assert '<p class="muted">Each request sleeps; the probe says for how long.</p>' in html
    assert "slowest sleep" in html and "30 ms" in html  # its key numbers
    assert "Sleeps, one row each" in html  # its notebook, rendered by nbconvert


def test_its_readme_figures_and_block_kind(probe, tmp_path):
    for d, ms in (("a", 30.0), ("b", 41.0)):
        (tmp_path / d / NAME).mkdir(parents=True)
        (tmp_path / d / NAME / "results.json").write_text(json.dumps({"slowest_ms": ms}))
    full = readme_figures.render_block(readme_figures.Block("a", "full"), tmp_path)
    assert "#### Throwaway probe" in full and "| slowest sleep | 30 ms |" in full
    assert "throwaway-pooled" in readme_figures.kinds()
    (block,) = readme_figures.blocks(
        "<!-- perfkit:figures src=a,b kind=throwaway-pooled -->\n<!-- perfkit:end -->"
    )
    pooled = readme_figures.render_block(block, tmp_path)
    assert "| slowest sleep | 41 ms |" in pooled and "(2 runs pooled)" in pooled


def test_a_second_module_cannot_take_its_figure_kind(probe):
    dup = registry.Investigation(
        name="throwaway_twin",
        title="Twin",
        question="?",
        params_model=probe.params_model,
        run=probe.run,
        figures=probe.figures,
    )
    with pytest.raises(ValueError, match="figure kind"):
        registry.register(dup)
    assert "throwaway_twin" not in registry.names()


COMMAND_MODULE = '''
"""A throwaway command: a click wrapper over one call."""

import click

from perfkit.cli._common import EXIT_CODES, done


@click.command("throwaway", epilog=EXIT_CODES)
@click.option("--times", type=click.IntRange(min=1), default=2, show_default=True, help="how many echoes")
def throwaway_command(times: int) -> None:
    """Echo a word TIMES times."""
    click.echo(" ".join(["probe"] * times))
    done(0)
'''


def test_a_throwaway_command_by_the_recipe(tmp_path, monkeypatch):
    import inprocess_cli
    from perfkit.cli import COMMANDS, cli

    (tmp_path / "throwaway_cmd.py").write_text(textwrap.dedent(COMMAND_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "throwaway", "throwaway_cmd:throwaway_command")
    try:
        proc = inprocess_cli.perfkit("throwaway", "--times", "3", cwd=ROOT)
        assert (proc.returncode, proc.stdout) == (0, "probe probe probe\n")
        bad = inprocess_cli.perfkit("throwaway", "--times", "0", cwd=ROOT)
        assert bad.returncode == 2 and "--times" in bad.stderr  # click's misuse: exit 2
        listed = inprocess_cli.perfkit("--help", cwd=ROOT).stdout
        assert re.search(r"^ +throwaway +Echo a word TIMES times\.$", listed, re.M), listed
        stale = inprocess_cli.perfkit("figures", "--check", "docs/commands.md", cwd=ROOT)
        assert stale.returncode == 1 and "stale" in stale.stdout  # the reference names every command
        doc = tmp_path / "commands.md"
        doc.write_text((ROOT / "docs/commands.md").read_text())
        assert inprocess_cli.perfkit("figures", "--root", str(ROOT), str(doc), cwd=ROOT).returncode == 0
        text = doc.read_text()
        assert "| [`perfkit throwaway`](#perfkit-throwaway) | Echo a word TIMES times |" in text
        assert "### perfkit throwaway\n\n```text\nUsage: perfkit throwaway [OPTIONS]" in text
    finally:
        cli.commands.pop("throwaway", None)  # the lazy group keeps what it loaded
        sys.modules.pop("throwaway_cmd", None)


def test_the_register_module_shorthand_takes_the_module_declarations():
    """``register_module(globals(), ...)`` (the built-in investigations' shorthand, DESIGN.md
    step 1): NAME, NOTEBOOK, SECTION_INTRO and the functions defined in the module named as a
    field; a function it imported under a field's name is not taken; keywords override."""
    from perfkit.investigations.common import code, headline

    def run(ctx, p):
        raise NotImplementedError

    def reading(r):
        return "module reading"

    namespace = {
        "__name__": __name__,
        "NAME": "throwaway_short",
        "NOTEBOOK": (*headline("throwaway_short", "Sleeps"), code("show_table(bundle.requests)")),
        "SECTION_INTRO": "Short intro.",
        "run": run,
        "reading": reading,
        "checks": json.dumps,  # imported, not defined here: not its checks
        "plan": 3,  # not a function
    }
    s = registry.register_module(
        namespace, title="Short", question="?", params_model=registry.InvestigationParams, order=7
    )
    try:
        assert registry.get("throwaway_short") is s
        assert (s.run, s.reading, s.checks, s.plan(None)) == (run, reading, registry.no_checks, [])
        assert (s.section_intro, s.order, s.title) == ("Short intro.", 7, "Short")
        assert [c.source for c in s.notebook_cells()] == [
            "## Sleeps",
            'show_table(summary_frame("throwaway_short", results))\n'
            'display(Markdown(reading("throwaway_short", results)))',
            "show_table(bundle.requests)",
        ]
        over = registry.register_module(
            {**namespace, "NAME": "throwaway_short2"},
            title="S",
            question="?",
            params_model=registry.InvestigationParams,
            reading=registry.no_reading,
            section_intro="x",
        )
        registry.unregister("throwaway_short2")
        assert (over.reading, over.section_intro) == (registry.no_reading, "x")
    finally:
        registry.unregister("throwaway_short")


def test_designs_minimal_investigation_sketch_runs_against_the_real_api():
    """The ``python`` sketch in DESIGN.md's "Adding an investigation" executes (every import it
    names exists) and its ``measure_launch``/``assemble`` calls bind to their real signatures."""
    import inspect

    from perfkit.measuring.assemble import assemble
    from perfkit.measuring.launch_rows import measure_launch

    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text.split("### Adding an investigation", 1)[1].split("### Adding a command", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    ns: dict = {}
    exec(compile(textwrap.dedent(block), "DESIGN.md sketch", "exec"), ns)
    assert issubclass(ns["Params"], registry.InvestigationParams)
    calls = {"measure_launch": measure_launch, "assemble": assemble}
    for call in re.findall(r"(measure_launch|assemble)\((.*)\)\n", textwrap.dedent(block)):
        n_args = len([a for a in re.split(r",(?![^\[]*\])", call[1]) if a.strip()])
        inspect.signature(calls[call[0]]).bind(*range(n_args))  # TypeError when the arity is off
    assert list(inspect.signature(measure_launch).parameters)[:4] == ["spec", "requests", "run_dir", "label"]
