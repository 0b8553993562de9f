"""Session-wide test guards and shared runs.

``h200_replay_run`` (session): ``perfkit suite`` replaying the committed H200 bundles once
(papermill, notebooks, report), shared by the report template and browser tests.

``no_surviving_engines`` (autouse, every test): any engine process started through
:func:`perfkit.engine.launch.launch` during a test (and any descendant seen at its teardown) must be gone
when the test ends. A survivor is killed and the test errors, so the run fails.
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
