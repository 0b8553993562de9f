"""Exit codes, one rule for every perfkit command and the suite: :data:`EXIT_OK` (0) every check
passed, :data:`EXIT_REGRESSION` (1) a check failed, :data:`EXIT_ERROR` (2) an error (bad input,
engine crash, notebook exception, nothing compared). A leaf, so that a command starts without
importing the gate (pandas, the scenarios); :mod:`perfkit.gate.verdicts` re-exports them."""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_REGRESSION", "STATUS_WORD"]

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2
#: the status word of each exit code (``run.json``'s ``status``, the summary's)
STATUS_WORD = {EXIT_OK: "pass", EXIT_REGRESSION: "regression", EXIT_ERROR: "error"}
