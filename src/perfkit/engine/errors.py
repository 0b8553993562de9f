"""What starting or talking to an engine raises: :class:`EngineStartError` (with the exit code,
log tail, cap outcome, argv and launch directory), :class:`PortInUseError`,
:class:`EngineExitedError`.
"""

from __future__ import annotations

from pathlib import Path

from perfkit.engine.caps import CapOutcome


class EngineStartError(RuntimeError):
    """The engine did not become ready: it exited, timed out, or could not be started.

    Attributes:
        exit_code: the process exit code (negative: killed by that signal), None if still running
            or never started.
        log_tail: the last lines of its stdout+stderr.
        cap_outcome: the host cap outcome (None without a launch).
        command: the argv.
        run_dir: the launch directory holding the logs.
    """

    def __init__(
        self,
        message: str,
        exit_code: int | None = None,
        log_tail: str = "",
        cap_outcome: CapOutcome | None = None,
        command: list[str] | None = None,
        run_dir: Path | None = None,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.cap_outcome = cap_outcome
        self.command = command
        self.run_dir = run_dir


class PortInUseError(EngineStartError):
    """The fixed port of the spec is taken."""


class EngineExitedError(RuntimeError):
    """The engine is no longer running (see :meth:`EngineHandle.raise_if_dead`)."""
