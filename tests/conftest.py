"""Session-wide test guards and shared runs.

``h200_replay_run`` (session): ``perfkit suite`` replaying the committed H200 bundles once
(papermill, notebooks, report), shared by the report template and browser tests.

``scaleout_runs`` (session): test_scaleout_merge's small suite unsplit (through Ray), as two
shards and merged, shared with test_ray_suite.

``ci_cpu_replay_run`` (session): ``perfkit suite`` replaying synthetic bundles with
params/ci-cpu.yaml, shared by test_suite and the browser tests.

``no_surviving_engines`` (autouse, every test): any engine process started through
:func:`perfkit.engine.launch.launch` during a test (and any descendant seen at its teardown) must be gone
when the test ends. A survivor is killed and the test errors, so the run fails.

Parallel runs (``make test``: pytest-xdist, one worker more than the cores, ``--dist loadgroup``): every test module is
one work unit (:class:`_ModuleGroups`, this conftest's xdist scheduler), so its module-scoped
engine launches run once, on one worker; the modules that use one of the session fixtures below
(``h200_replay_run``, ``scaleout_runs``, ``ci_cpu_replay_run``) form one unit (a module naming two
joins their units), so the session fixture runs once; the heaviest modules are collected and handed out first, so the
workers end together. Tests marked ``timing`` (their verdict depends on
the host's speed: a live A/B must decide +30 %) run first, alone on the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from xdist.scheduler import LoadScopeScheduling

from perfkit.engine import launch as _launch

#: the parallel phase (an xdist worker): every process it starts (engines through suites and
#: kernels too) gets OpenMP's passive wait policy, unless the environment already names one.
#: Two workers on two cores with engines and kernels beside them oversubscribe the cores, and
#: torch's OpenMP threads spin between parallel regions by default (libgomp's ACTIVE policy),
#: burning the CPU the other worker needs: six tiny-engine requests measured here under load
#: took 4.7 s of engine CPU and 16.6 s wall spinning, 2.9 s and 5.8 s passive (2.1 s, 3.5 s with
#: one thread). The thread count is unchanged (OMP_NUM_THREADS, --cpu-threads as before); the
#: timing phase, alone on the machine, keeps the default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: as perfkit's CLI does (perfkit.cli.main): nbformat's jsonschema without rfc3987_syntax's
#: 0.8 s grammar build, which checks a format nbformat's schema never uses
sys.modules.setdefault("rfc3987_syntax", None)

#: modules by their wall time on CI's 2-core machine, heaviest first (pytest --durations): the
#: parallel run hands them out in this order, the rest after them in collection order
HEAVY_FIRST = (
    "test_scaleout_merge",
    "test_ray_suite",
    "test_suite",
    "test_process_faults",
    "test_report_browser",
    "test_figures",
    "test_notebooks",
    "test_investigations",
    "test_profiling",
    "test_engine_config",
    "test_cfg_parallel",
    "test_ab_aa_cut",
    "test_ab_power",
    "test_offload_modes",
)


#: this conftest's session fixtures that cost a suite run or more: the test modules naming one
#: form one work unit, so it runs once (modules naming two join both fixtures' units into one)
SHARED_SESSION_FIXTURES = ("h200_replay_run", "scaleout_runs", "ci_cpu_replay_run")


def _module_units(paths) -> dict[Path, str | None]:
    """Each test module's work unit: the first of :data:`SHARED_SESSION_FIXTURES` in its group, the
    fixtures named together by one module being one group; None for a module naming none."""
    named = {p: [f for f in SHARED_SESSION_FIXTURES if f in p.read_text(encoding="utf-8")] for p in paths}
    group = {f: f for f in SHARED_SESSION_FIXTURES}

    def root(f: str) -> str:
        while group[f] != f:
            f = group[f]
        return f

    for fs in named.values():
        for f in fs[1:]:
            a, b = sorted((root(fs[0]), root(f)), key=SHARED_SESSION_FIXTURES.index)
            group[b] = a
    return {p: root(fs[0]) if fs else None for p, fs in named.items()}


class _ModuleGroups(LoadScopeScheduling):
    """xdist scheduling with one work unit per test module (the modules that use one of
    :data:`SHARED_SESSION_FIXTURES` form one unit), handed out in collection order (heaviest first).

    pytest-xdist 3.8's own ``--dist loadgroup`` marks a test's group by rewriting
    ``item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid`` is ``_id``): every test
    became a group of its own and a module's module-scoped launches ran once on each worker (CI:
    test_scaleout_merge's four suite runs, 148 s, twice)."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        root = Path(str(config.rootpath))
        units = _module_units(Path(__file__).parent.glob("test_*.py"))
        self._unit = {str(p.relative_to(root)): u for p, u in units.items()}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return self._unit.get(module) or module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: :class:`_ModuleGroups` (one module, one worker), not reordered by size."""
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False  # keep HEAVY_FIRST's order
    return _ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """Put the heavy modules first (stable: a module's tests keep their order)."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(it.module.__name__.rsplit(".", 1)[-1], len(rank)))


@pytest.fixture(autouse=True)
def no_surviving_engines(request):
    before = len(_launch.started_processes())
    yield
    started = _launch.started_processes()[before:]
    if not started:
        return
    # a process killed a moment ago may still be exiting
    deadline = time.monotonic() + 1.0
    alive = _launch.surviving(started)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _launch.surviving(alive)
    if alive:
        desc = ", ".join(f"pid {p.pid} ({p.label}: {' '.join(p.command)[:80]})" for p in alive)
        for p in alive:
            try:
                os.killpg(p.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                psutil.Process(p.pid).kill()
            except psutil.Error:
                pass
        pytest.fail(f"{request.node.nodeid}: engine processes survived the test: {desc}", pytrace=False)


@pytest.fixture(scope="session")
def scaleout_runs(tmp_path_factory) -> dict:
    """test_scaleout_merge's small suite run unsplit (through Ray), as shards 1/2 and 2/2, and
    merged: shared by test_scaleout_merge and test_ray_suite (one work unit)."""
    import test_scaleout_merge

    return test_scaleout_merge.make_runs(tmp_path_factory.mktemp("scaleout"))


@pytest.fixture(scope="session")
def ci_cpu_replay_run(tmp_path_factory) -> dict:
    """``perfkit suite --params params/ci-cpu.yaml --replay REC`` on synthetic bundles of every
    investigation (tests/synthetic.py, ``make_run``), with ``GITHUB_STEP_SUMMARY`` set: shared by
    test_suite's replay test and the browser tests, which read its outputs. Keys: ``proc`` (the
    finished process), ``out`` (the run), ``rec`` (the bundles replayed), ``gh_summary`` (the
    file given as ``GITHUB_STEP_SUMMARY``)."""
    import synthetic

    tmp = tmp_path_factory.mktemp("ci-cpu-replay")
    rec = synthetic.make_run(tmp / "recorded")
    out, gh_summary = tmp / "run", tmp / "gh_summary.md"
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "suite", "--params", "params/ci-cpu.yaml", "--out", str(out)]
        + ["--replay", str(rec), "--no-screenshot", "-q"],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(gh_summary)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    return {"proc": proc, "out": out, "rec": rec, "gh_summary": gh_summary}


@pytest.fixture(scope="session")
def h200_replay_run(tmp_path_factory) -> Path:
    """``perfkit suite --params params/h200.yaml --replay examples/h200/bundles`` into a fresh
    directory (about a minute); fails the tests that use it when the suite does not exit 0."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("h200") / "run"
    exe = Path(sys.executable).parent / "perfkit"
    proc = subprocess.run(
        [str(exe), "suite", "--params", "params/h200.yaml", "--replay", "examples/h200/bundles"]
        + ["--out", str(out), "--no-screenshot", "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out
