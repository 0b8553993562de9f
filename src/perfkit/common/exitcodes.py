"""Exit codes of every perfkit command and the suite: :data:`EXIT_OK` (0) every check passed,
:data:`EXIT_REGRESSION` (1) a check failed, :data:`EXIT_ERROR` (2) an error; :func:`run_click`
applies the rule to a command line, interrupts included."""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_REGRESSION", "STATUS_WORD", "run_click"]

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2
#: output cut by its reader (``| head``): 128 + SIGPIPE
EXIT_SIGPIPE = 141
#: ``run.json``'s ``status`` of each exit code
STATUS_WORD = {EXIT_OK: "pass", EXIT_REGRESSION: "regression", EXIT_ERROR: "error"}

#: the interrupts :func:`run_click` saw (a KeyboardInterrupt can be swallowed; this list is not)
_SEEN: list[str] = []
#: True while :func:`run_click` runs a command (a swallowed interrupt is redelivered only then)
_RUNNING: list[bool] = []


def _interrupt(signum: int, frame: Any) -> None:  # noqa: ARG001
    _SEEN.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _redeliver(hook: Any) -> Any:
    """An ``sys.unraisablehook`` that delivers an interrupt swallowed in a ``__del__`` again."""
    import _thread
    import threading

    def again(sig: int) -> None:
        if _RUNNING:  # never once run_click has returned
            _thread.interrupt_main(sig)

    def unraisable(u: Any) -> None:
        if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt) and _SEEN:
            timer = threading.Timer(0.05, again, (getattr(signal, _SEEN[-1], signal.SIGINT),))
            timer.daemon = True
            timer.start()
            return
        hook(u)

    return unraisable


def _words(command: "click.Command", args: list[str], prog_name: str) -> str:
    """The command line's command words (``perfkit history confirm``), read from ``args``."""
    import click

    words, cmd = [prog_name], command
    for a in args:
        if a.startswith("-"):
            continue
        sub = cmd.get_command(click.Context(cmd), a) if isinstance(cmd, click.Group) else None
        if sub is None:
            break
        words.append(a)
        cmd = sub
    return " ".join(words)


def run_click(command: "click.Command", args: list[str], prog_name: str, *, process: bool = False) -> int:
    """Run a click command line under the one exit-code rule; returns its exit code: an
    interrupt (SIGINT/SIGTERM), bad usage, an OSError or a crash is :data:`EXIT_ERROR` with one
    line on stderr, output cut by its reader :data:`EXIT_SIGPIPE`. ``process``: the process's own
    command line (an interrupted one exits within :data:`EXIT_DEADLINE_S`). Rules:
    docs/suite.md, "Interrupts"."""
    import threading

    main_thread = threading.current_thread() is threading.main_thread()  # else signals stay as they are
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, _interrupt) for s in sigs} if main_thread else {}
    _SEEN.clear()
    old_hook = sys.unraisablehook
    if main_thread:
        sys.unraisablehook = _redeliver(old_hook)
        _RUNNING.append(True)
    said = False
    try:
        code, said = _run(command, args, prog_name)
    except KeyboardInterrupt:  # delivered while the command was being wound down
        _SEEN.append("SIGINT")
        code = EXIT_ERROR
    finally:
        for s, h in old.items():  # the process is ending: a late signal must not change its exit code
            signal.signal(s, signal.SIG_IGN if _SEEN or process else h)
        _RUNNING.clear()
        sys.unraisablehook = old_hook
    if _SEEN and process:  # the interrupt's line is the last word
        logging.disable(logging.CRITICAL)
    if _SEEN and not said:
        print(
            f"{_words(command, args, prog_name)}: interrupted ({_SEEN[0]}): what it started was "
            f"ended; no verdict (exit {EXIT_ERROR})",
            file=sys.stderr,
        )
    if _SEEN and process:
        _exit_interrupted()
    return EXIT_ERROR if _SEEN else code


#: an interrupted ``perfkit`` process exits within this many seconds of its interrupt line
EXIT_DEADLINE_S = 10.0


def _exit_interrupted() -> None:
    """End this interrupted process now with :data:`EXIT_ERROR`, its exit hooks bounded in time."""
    import atexit
    import contextlib
    import os
    import threading

    def end() -> None:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                f.flush()
        os._exit(EXIT_ERROR)

    timer = threading.Timer(EXIT_DEADLINE_S, end)
    timer.daemon = True
    timer.start()
    atexit._run_exitfuncs()
    end()


def _run(command: "click.Command", args: list[str], prog_name: str) -> tuple[int, bool]:
    """(exit code, whether the command said its interrupt itself) of one command line."""
    import click

    said = False
    try:
        rv = command.main(args=args, prog_name=prog_name, standalone_mode=False)
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else EXIT_OK
    except (click.Abort, KeyboardInterrupt) as exc:
        cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__ or exc.__context__
        if isinstance(cause, KeyboardInterrupt) and cause.args:
            _SEEN.append(str(cause.args[0]))
        _SEEN.append("SIGINT")
        code = EXIT_ERROR
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_ERROR
        said = bool(_SEEN) and code == EXIT_ERROR  # the suite said the interrupt itself
        if type(sys.stdout).__name__ == "_PacifyFlushWrapper":  # click's exit 1 on EPIPE: `| head`
            code = EXIT_SIGPIPE
    except OSError as exc:  # a path the command cannot write or read (--out under a file, /sys)
        if not _SEEN:
            print(f"{_words(command, args, prog_name)}: error: {exc}", file=sys.stderr)
        code = EXIT_ERROR
    except Exception as exc:  # a crash is an error, never a verdict: exit 2, not Python's 1
        from perfkit.common import MissingExtra

        if isinstance(exc, MissingExtra) and not _SEEN:  # the caller prints its pip line
            raise
        if not _SEEN:  # once interrupted, a failing cleanup is the interrupt's
            import traceback

            traceback.print_exc()
            print(
                f"{_words(command, args, prog_name)}: crashed: no verdict (exit {EXIT_ERROR})",
                file=sys.stderr,
            )
        code = EXIT_ERROR
    return code, said
