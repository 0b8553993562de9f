"""A `perfkit suite` stopped by SIGTERM (CI cancel) leaves no engine behind and still a report."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _engines(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "perfkit.refengine" in cmd and marker in cmd:
            out.append(p)
    return out


def test_sigterm_tears_down_the_engine_and_writes_the_report(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfkit.cli",
            "suite",
            "--params",
            str(ROOT / "params" / "ci-cpu.yaml"),
            "--out",
            str(out),
            "--only",
            "cold_warm",
            "-q",
            "--no-screenshot",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 180
        while not _engines(str(out)) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert _engines(str(out)), "the engine never started"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output
    deadline = time.time() + 20
    while _engines(str(out)) and time.time() < deadline:
        time.sleep(0.5)
    assert not _engines(str(out)), "an engine outlived the interrupted suite"
    html = (out / "report.html").read_text()
    assert "interrupted" in html
    assert "interrupted" in (out / "summary.md").read_text()
