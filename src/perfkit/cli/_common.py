"""What every perfkit command shares: the exit-code rule, exiting, file checks, shared options."""

from __future__ import annotations

import string
import sys
from pathlib import Path
from typing import Any, Callable

import click

from perfkit.common.exitcodes import EXIT_ERROR

EXIT_CODES = "Exit codes: 0 pass, 1 a regression or a failed check, 2 an error or misuse."


def done(code: int) -> None:
    """Exit with ``code``."""
    sys.exit(int(code))


def fail(message: str, prefix: str = "perfkit") -> int:
    """Print ``PREFIX: message`` on stderr; return :data:`EXIT_ERROR` (2)."""
    print(f"{prefix}: {message}", file=sys.stderr)
    return EXIT_ERROR


def file_option(*decls: str, kind: str, help: str, **kw: Any) -> Callable[[Callable], Callable]:
    """A click option whose value must be an existing file, else exit 2 naming it as ``kind``."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            from perfkit.params import not_a_file

            raise click.BadParameter(f"{kind} {not_a_file(value)}: {value}")
        return value

    return click.option(*decls, callback=check, help=help, **kw)


def choice(decls: str, choices: list[str], help: str, default: Any = None) -> Callable[[Callable], Callable]:
    """A click option (``decls`` space-separated) taking one of ``choices``; a default is shown."""
    shown = default is not None
    return click.option(
        *decls.split(), type=click.Choice(choices), default=default, show_default=shown, help=help
    )


def ranged(decls: str, type: Any, default: Any, help: str) -> Callable[[Callable], Callable]:
    """A click option (``decls`` space-separated) of ``type`` whose ``default`` --help shows."""
    return click.option(*decls.split(), type=type, default=default, show_default=True, help=help)


def print_result(res: Any, command: str) -> int:
    """Print a suite result (each notebook's gate result, the status, the report); its exit code."""
    from perfkit.gate.verdicts import gate_result, nothing_measured_reason, read_verdict

    for n in res.notebooks:
        wall = f"{n.wall_s:.1f} s" if n.wall_s is not None else ""
        verdict = read_verdict(res.run_dir / n.name) if n.status == "ok" else None
        status = gate_result(n.status, verdict, n.ename)  # pass / fail / not gated / error
        if n.status == "skipped" and n.reason:
            status = f"{n.status} ({n.reason})"
        print(f"  {n.name:15s} {status:9s} {wall:>9s}  {n.error or ''}")
    print(f"{command}: {res.status.upper()} (exit {res.exit_code})")
    why = nothing_measured_reason(res.verdicts)
    if why:
        print(f"  {why}")
    print(f"  report:   {res.run_dir / 'report.html'}")
    print(f"  summary:  {res.run_dir / 'summary.md'}")
    if (res.run_dir / "baseline.json").exists():
        print(f"  baseline: {res.run_dir / 'baseline.json'}")
    for n in res.notebooks:  # the interrupt rule's one line (exit 2)
        if n.ename == "KeyboardInterrupt" and (n.error or "").startswith("interrupted ("):
            ended = "what it started was ended; no verdict"
            print(f"{command}: {n.error}: {ended} (exit {res.exit_code})", file=sys.stderr)
            break
    return res.exit_code


def commit_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --commit-url template: ``{commit}`` its one field; http(s) only (no javascript: links)."""
    if value is None:
        return None
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as exc:  # an unmatched brace
        raise click.BadParameter(f"{value!r}: {exc}") from None
    if fields != {"commit"}:
        other = sorted(fields - {"commit"})
        why = f"unknown field {{{other[0]}}}" if other else "no {commit} field"
        raise click.BadParameter(f"{value!r}: {why}; the template's one field is {{commit}}")
    if not value.lower().startswith(("https://", "http://")):
        raise click.BadParameter(f"{value!r}: must start with https:// or http://")
    return value


STORE = click.option(
    "--store",
    default="outputs/history",
    show_default=True,
    help="history store directory (parquet files; created when missing)",
)
COMMIT_URL = click.option(
    "--commit-url",
    default=None,
    callback=commit_url,
    help="link template for commits, e.g. https://github.com/sgl-project/sglang/commit/{commit}",
)
