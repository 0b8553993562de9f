"""Session-wide test guards and shared runs.

``h200_replay_run`` (session): ``perfkit suite`` replaying the committed H200 bundles once
(papermill, notebooks, report), shared by the report template and browser tests.

``no_surviving_engines`` (autouse, every test): any engine process started through
:func:`perfkit.engine.launch.launch` during a test (and any descendant seen at its teardown) must be gone
when the test ends. A survivor is killed and the test errors, so the run fails.

Parallel runs (``make test``: pytest-xdist, two workers, ``--dist loadgroup``): every test module is
one work unit (:class:`_ModuleGroups`, this conftest's xdist scheduler), so its module-scoped
engine launches run once, on one worker; the modules that use ``h200_replay_run`` form one unit,
so the session fixture runs once; the heaviest modules are collected and handed out first, so the
two workers end together. Tests marked ``timing`` (their verdict depends on
the host's speed: a live A/B must decide +30 %) run afterwards, alone on the machine.
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
    "test_scenarios",
    "test_profiling",
    "test_engine_config",
    "test_cfg_parallel",
    "test_ab_power",
    "test_offload_modes",
)


def _shares_the_h200_replay(path: Path) -> bool:
    return path.name != "conftest.py" and "h200_replay_run" in path.read_text(encoding="utf-8")


#: test files (relative to the rootdir, as in node ids) that use the session's H200 replay: one group
_H200_GROUP = "h200_replay_run"


class _ModuleGroups(LoadScopeScheduling):
    """xdist scheduling with one work unit per test module (the modules that use
    ``h200_replay_run`` form one unit), handed out in collection order (heaviest first).

    pytest-xdist 3.8's own ``--dist loadgroup`` marks a test's group by rewriting
    ``item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid`` is ``_id``): every test
    became a group of its own and a module's module-scoped launches ran once on each worker (CI:
    test_scaleout_merge's four suite runs, 148 s, twice)."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        root = Path(str(config.rootpath))
        self._shared = {
            str(p.relative_to(root))
            for p in sorted(Path(__file__).parent.glob("test_*.py"))
            if _shares_the_h200_replay(p)
        }

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return _H200_GROUP if module in self._shared else module


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
