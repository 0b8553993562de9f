"""Session-wide test guards and shared runs.

``h200_replay_run`` (session): ``perfkit suite`` replaying the committed H200 bundles once
(papermill, notebooks, report), shared by the report template and browser tests.

``no_surviving_engines`` (autouse, every test): any engine process started through
:func:`perfkit.engine.launch.launch` during a test (and any descendant seen at its teardown) must be gone
when the test ends. A survivor is killed and the test errors, so the run fails.

Parallel runs (``make test``: pytest-xdist, two workers, ``--dist loadgroup``): every test module is
one group, so its module-scoped engine launches stay on one worker; the modules that share
``h200_replay_run`` form one group, so the session fixture runs once; the heaviest modules are
collected first, so the two workers end together. Tests marked ``timing`` (their verdict depends on
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


def pytest_collection_modifyitems(config, items):
    """Group every test by its module (the h200 replay users together) and put the heavy first."""
    shared = {it.module.__name__ for it in items if "h200_replay_run" in getattr(it, "fixturenames", ())}
    for it in items:
        name = it.module.__name__
        it.add_marker(pytest.mark.xdist_group("h200_replay_run" if name in shared else name))
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
