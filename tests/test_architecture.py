"""The house rules of docs/DESIGN.md, checked on the source: no import cycle, the layers of the
import-linter contract, no investigation name written outside its own module, and no investigation
module imported outside :mod:`perfkit.investigations`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import grimp
import pytest

from perfkit.investigations import registry

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "perfkit"


def test_no_import_cycle_in_src():
    """No cycle among perfkit's modules. The root package is the public API above every layer
    (docs/DESIGN.md): its calls import what they need inside the function, never at import
    time (but its version, from the leaf ``perfkit.common.version``), and no module imports the
    root (import-linter would see a layer broken through it); so the root's own lazy imports
    are left out, and checked to be lazy."""
    graph = grimp.build_graph("perfkit")
    deps = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    lazy = ast.parse((SRC / "__init__.py").read_text(encoding="utf-8"))
    top_level = [n for n in lazy.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(
        not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("perfkit"))
        or n.module == "perfkit.common.version"
        for n in top_level
    ), "perfkit/__init__.py imports a perfkit module at import time"
    deps["perfkit"] = set()
    try:
        TopologicalSorter(deps).prepare()
    except CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_import_linter_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def test_every_top_level_module_sits_in_a_layer():
    """A module in no layer of the contract goes unchecked by import-linter: every top-level
    module and package of perfkit is named in ``layers`` (pyproject.toml), but the root, its
    ``__main__`` and the reference engine (its own contracts)."""
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c for c in conf["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    pkgs = [d.name for d in SRC.iterdir() if (d / "__init__.py").is_file()]
    tops = {f"perfkit.{name}" for name in pkgs + [f.stem for f in SRC.glob("*.py")]}
    outside = tops - named - {"perfkit.__init__", "perfkit.__main__", "perfkit.refengine"}
    assert not outside, f"in no layer of pyproject.toml's contract: {sorted(outside)}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in a file except docstrings and ``__all__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            skip |= {id(n) for n in ast.walk(node.value)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def _names(text: str, name: str) -> bool:
    """``text`` names investigation ``name``: equal to it, or (for names with an underscore, which
    are no English words) holding it as a word; ``overhead`` in prose is not a name."""
    if text == name:
        return True
    return "_" in name and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def test_run_order_is_declared_not_import_order():
    # warmup_shapes and memory_budget reuse the cold_warm session: cold_warm must run first; a
    # new investigation module (discovered, not listed) may sit anywhere its order says
    known = ("cold_warm", "warmup_shapes", "memory_budget", "offload_modes", "overhead")
    assert tuple(n for n in registry.names() if n in known) == known
    orders = [s.order for s in registry.all_investigations()]
    assert orders == sorted(orders)


#: (file, text): strings of outside formats that happen to equal an investigation's name
EXTERNAL_WORDS = {
    # sglang's perf_baselines tolerance key for model load time (docs/sglang.md "Interop facts")
    ("src/perfkit/gate/baseline/files.py", "load"),
}


def _investigation_modules() -> set[str]:
    """The modules that register an investigation: each registered investigation's ``run`` module."""
    return {s.run.__module__ for s in registry.all_investigations()}


def _investigation_imports(text: str, mods: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in ``text`` of a module in ``mods`` (``import m``,
    ``from m import x``, ``from perfkit.investigations import <m's last part>``)."""
    short = {m.rpartition(".")[2] for m in mods}
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in mods]
        elif isinstance(node, ast.ImportFrom):
            if node.module in mods:
                found.append((node.lineno, node.module))
            if node.module == "perfkit.investigations":
                found += [(node.lineno, a.name) for a in node.names if a.name in short]
    return found


def test_nothing_outside_investigations_imports_an_investigation_module():
    mods = _investigation_modules()
    assert "perfkit.investigations.cold_warm" in mods and len(mods) >= 5
    files = [f for f in SRC.rglob("*.py") if f.parent != SRC / "investigations"]
    files += [ROOT / "notebooks" / "make_notebooks.py", *(ROOT / "benchmarks").rglob("*.py")]
    found = [
        f"{f.relative_to(ROOT)}:{line}: {m}"
        for f in files
        for line, m in _investigation_imports(f.read_text(encoding="utf-8"), mods)
    ]
    assert not found, "investigation modules imported outside perfkit.investigations:\n" + "\n".join(found)


def test_the_scan_sees_each_form_of_import():
    """The scan above reads every form of import it checks (it cannot pass by not looking)."""
    text = (
        "import perfkit.investigations.cold_warm\n"
        "from perfkit.investigations.overhead import NAME\n"
        "from perfkit.investigations import registry, warmup_shapes\n"
        "from perfkit.investigations.registry import get\n"
    )
    assert _investigation_imports(text, _investigation_modules()) == [
        (1, "perfkit.investigations.cold_warm"),
        (2, "perfkit.investigations.overhead"),
        (3, "warmup_shapes"),
    ]


def test_investigation_names_are_written_only_in_their_own_module():
    names = registry.names()
    assert len(names) >= 4
    files = [*SRC.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    found = []
    for f in files:
        own = f.parent.name == "investigations" and f.stem in names
        for line, text in _literals(f):
            for name in names:
                if own and f.stem == name:
                    continue
                if (str(f.relative_to(ROOT)), text) in EXTERNAL_WORDS:
                    continue
                if _names(text, name):
                    found.append(f"{f.relative_to(ROOT)}:{line}: {name!r} in {text[:60]!r}")
    assert not found, "investigation names outside their module:\n" + "\n".join(found)


def test_every_investigation_has_its_notebook_template_and_params_section():
    from perfkit.params import SuiteParams

    for s in registry.all_investigations():
        assert (ROOT / "notebooks" / s.notebook).exists(), s.notebook
        assert (SRC / "report" / "templates" / s.template).exists(), s.template
        assert s.name in SuiteParams.model_fields
        # its defaults live in its params model only: the params file's section is that model
        assert SuiteParams.model_fields[s.name].annotation is s.params_model


def test_invariant_defaults_come_from_the_investigations():
    from perfkit.params import parse_params

    p = parse_params({"name": "x"})
    merged = registry.EngineInvariants().model_dump()  # what every launch's engine must run
    for s in registry.all_investigations():
        merged.update({k: v for k, v in s.invariant_defaults().items() if v is not None})
    assert p.invariants_all() == merged
    assert p.invariants_all()["warm_cold_ratio_max"] == 1.0
    assert p.invariants_all()["compile_inactive_ok"] is False
    assert "instrumentation_overhead_max" not in p.invariants_all()  # None: reported, not gated


def test_the_cli_and_a_notebook_kernel_start_without_scipy():
    """scipy (0.4-0.7 s of CPU to import) is imported where a test or interval needs it, not at
    module level: every ``perfkit`` command and every notebook kernel of a suite imports the
    CLI, the investigations (all of them, through the registry), the report and the gate. So are
    matplotlib (0.2-0.5 s: where a figure is drawn), httpx (0.1 s: where a request is sent) and
    jinja2 (where HTML is rendered): a replayed notebook sends no request and renders no page."""
    heavy = {"scipy", "torch", "papermill", "matplotlib", "httpx", "jinja2"}
    code = (
        "import sys\n"
        "import perfkit.cli, perfkit.nbparams, perfkit.report, perfkit.investigations.registry\n"
        "import perfkit.gate.run, perfkit.report.tables, perfkit.suite, perfkit.scaleout.merge\n"
        "import perfkit.report.plots, perfkit.measuring.launch_rows, perfkit.engine.launch, importlib\n"
        "[importlib.import_module(c.split(':')[0]) for c in perfkit.cli.COMMANDS.values()]\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(heavy)!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_command_imports_only_its_own_module():
    """``perfkit merge`` (any command that needs neither) starts without pandas and the
    investigations: the group imports a command's module when it runs (``perfkit.cli.COMMANDS``)."""
    code = (
        "import sys\n"
        "from perfkit.cli import cli\n"
        "cli.get_command(None, 'merge')\n"
        "print(sorted({m for m in sys.modules if m.split('.')[0] == 'pandas' or m.startswith('perfkit.investigations')})[:3])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------ the optional stacks (extras)
OPTIONAL = {"apache-otava": "history", "duckdb": "history", "ray": "ray", "jupyterlab": "lab"}


def test_the_core_dependencies_leave_out_the_optional_stacks():
    """``pip install perfkit`` brings none of apache-otava, Ray, DuckDB, JupyterLab: each is in
    its extra, every extra in ``all``, which ``make setup`` installs with the test tools; and
    :data:`perfkit.common.EXTRAS` (what :func:`~perfkit.common.require_extra` checks) names
    the same extras."""
    import tomllib

    from packaging.requirements import Requirement

    from perfkit.common import EXTRAS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name for r in project["dependencies"]}
    assert not core & set(OPTIONAL), core & set(OPTIONAL)
    assert {"torch", "papermill", "click"} <= core  # the list read is the real one
    extras = {k: {Requirement(r).name for r in v} for k, v in project["optional-dependencies"].items()}
    for dist, extra in OPTIONAL.items():
        assert dist in extras[extra], (dist, extra)
    assert project["optional-dependencies"]["all"] == ["perfkit[history,ray,lab]"]
    assert set(EXTRAS) == {"history", "ray", "lab"}
    assert "pip install -e '.[all,test]'" in (ROOT / "Makefile").read_text()


#: run in a fresh interpreter with the optional stacks unimportable (None in sys.modules: an
#: import raises ModuleNotFoundError, find_spec says None), as on a core install
_WITHOUT_EXTRAS = r"""
import contextlib, importlib, io, json, pkgutil, sys
for m in ("otava", "duckdb", "ray", "jupyterlab"):
    sys.modules[m] = None
import perfkit
from perfkit.cli import main

failed = {}
for mod in pkgutil.walk_packages(perfkit.__path__, "perfkit."):
    if not mod.name.endswith("__main__"):
        try:
            importlib.import_module(mod.name)
        except Exception as exc:
            failed[mod.name] = repr(exc)

def cli(*args):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(args))
    return [code, err.getvalue(), out.getvalue()[:200]]

from perfkit.history import changepoints as cp
from perfkit.scaleout.shards import ExecutorError, executor
try:
    cp.analyse([])
    analyse = "ran"
except ImportError as exc:
    analyse = str(exc)
try:
    executor("ray")
    ray = "found"
except ExecutorError as exc:
    ray = str(exc)
from pathlib import Path
from perfkit.lab import LabDir, LabError, launch
try:
    launch(LabDir(Path("outputs/lab/x")), browser=False)
    lab = "launched"
except LabError as exc:
    lab = str(exc)
print(json.dumps({
    "failed": failed,
    "suite_help": cli("suite", "--help"),
    "history_check": cli("history", "check", "outputs/nowhere", "--store", "nowhere"),
    "history_add_help": cli("history", "add", "--help"),
    "history_notebook": cli("run", "notebooks/history.ipynb"),
    "analyse": analyse,
    "ray": ray,
    "lab": lab,
    "loaded": sorted(m for m in ("otava", "duckdb", "ray", "jupyterlab") if sys.modules[m] is not None),
}))
"""


def test_without_the_optional_stacks_perfkit_imports_and_a_command_needing_one_says_the_pip_install():
    """On a core install every perfkit module imports (each import of an optional stack is
    inside the function that needs it), ``perfkit suite --help`` works, and ``perfkit history``
    (its ``--help`` aside), the history notebook, change points, ``--executor ray`` and
    ``perfkit lab``'s JupyterLab fail
    with one line naming the ``pip install``: the CLI exits 2 without a traceback."""
    import json

    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failed"] == {}
    assert got["loaded"] == []
    code, err, out = got["suite_help"]
    assert code == 0 and "--params" in out, (err, out)
    hint = "perfkit history needs otava, duckdb: pip install 'perfkit[history]'"
    assert got["history_check"][:2] == [2, f"perfkit: {hint}\n"]
    assert got["history_add_help"][0] == 0 and "RUNS" in got["history_add_help"][2]
    assert got["history_notebook"][:2] == [
        2,
        "perfkit: history.ipynb needs otava, duckdb: pip install 'perfkit[history]'\n",
    ]
    assert (
        got["analyse"]
        == "change points (perfkit.history) needs otava, duckdb: pip install 'perfkit[history]'"
    )
    assert got["ray"] == "--executor ray needs ray: pip install 'perfkit[ray]'"
    assert got["lab"] == (
        "perfkit lab needs jupyterlab: pip install 'perfkit[lab]'; the notebooks are ready in outputs/lab/x"
    )
