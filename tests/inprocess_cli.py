"""``perfkit ARGS`` in the test's own process: the command line itself (click's parsing, the
command's output and exit code) through click's runner, for the quick commands (figures,
compare) whose tests would otherwise start a new interpreter per call, each importing perfkit
again (seconds of CPU each on a 2-core runner). Commands that launch engines, kernels or
signal handlers (suite, merge, ab; run where it starts a kernel) stay subprocesses in their
tests. Log records go to pytest's log capture, not to the returned stderr (under pytest the
root logger already has handlers, so the command's logging.basicConfig adds none): a test that
asserts on the absence of a logged traceback keeps its subprocess (test_figures' report test)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from click.testing import CliRunner

from perfkit.cli import cli


def perfkit(*args: str, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``perfkit ARGS`` (in ``cwd``) as a finished process would be seen: returncode, stdout,
    stderr. An exception the command does not turn into an exit code is raised here, not read
    as an exit code (a subprocess prints its traceback and exits 2)."""
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        res = CliRunner().invoke(cli, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(["perfkit", *args], res.exit_code, res.stdout, res.stderr)
