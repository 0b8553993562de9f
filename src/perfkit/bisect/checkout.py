"""Git for the bisection: the commit range, subjects and author dates, and probe checkouts as
detached worktrees in a temporary directory, always removed; the user's checkout is never touched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from perfkit.engine.owner import run_bounded
from perfkit.history.runs import git as _git

log = logging.getLogger(__name__)


class BisectError(ValueError):
    """Bad input for a bisection or a confirmation (a repository, a commit, a spec): the message
    names it."""


git = functools.partial(_git, error=BisectError)


@dataclass(frozen=True)
class Commit:
    """One commit: full sha, subject line, author date (ISO 8601, the author's zone)."""

    sha: str
    subject: str
    author_date: str

    @property
    def short(self) -> str:
        return self.sha[:10]

    def to_dict(self) -> dict[str, str]:
        """``sha``, ``short`` (10 hex digits), ``subject``, ``author_date``."""
        d = asdict(self)
        return {"sha": d.pop("sha"), "short": self.short, **d}


def check_repo(repo: str | Path) -> None:
    """Raise BisectError unless ``repo`` is a directory inside a git repository (named)."""
    if not Path(repo).is_dir():
        raise BisectError(f"{repo}: not a directory")
    try:
        git(repo, "rev-parse", "--git-dir")
    except BisectError:
        raise BisectError(f"{repo}: not a git repository") from None


def resolve(repo: str | Path, rev: str) -> str:
    """The full sha of commit ``rev`` in ``repo``. Raises BisectError naming it when unknown."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except BisectError:
        raise BisectError(f"{repo}: no commit {rev!r}") from None


def commit_info(repo: str | Path, sha: str) -> Commit:
    """Subject and author date of ``sha``."""
    out = git(repo, "show", "-s", "--format=%H%x1f%s%x1f%aI", sha).strip()
    h, subject, date = out.split("\x1f")
    return Commit(h, subject, date)


def commit_range(repo: str | Path, good: str, bad: str) -> tuple[Commit, list[Commit]]:
    """The good commit and the commits after it up to ``bad`` (oldest first, ``bad`` last), along
    the first-parent line (``git rev-list --first-parent --reverse good..bad``).

    Raises:
        BisectError: not a repository, an unknown commit, ``good`` not an ancestor of ``bad``, or
            the same commit.
    """
    check_repo(repo)
    g, b = resolve(repo, good), resolve(repo, bad)
    if g == b:
        raise BisectError(f"good and bad are the same commit ({g[:10]})")
    p = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b], check=False)
    if p.returncode != 0:
        raise BisectError(
            f"{repo}: the good commit {good} ({g[:10]}) is not an ancestor of the bad one {bad} ({b[:10]})"
        )
    shas = git(repo, "rev-list", "--first-parent", "--reverse", f"{g}..{b}").split()
    if not shas or shas[-1] != b:
        raise BisectError(f"{repo}: {bad} is not on the first-parent line after {good}")
    return commit_info(repo, g), [commit_info(repo, s) for s in shas]


@contextlib.contextmanager
def worktree(repo: str | Path, sha: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A detached worktree of ``sha`` in a new temporary directory (under ``parent`` when
    given); removed on exit, also on an error."""
    tmp = Path(tempfile.mkdtemp(prefix=f"perfkit-probe-{sha[:10]}-", dir=parent))
    path = tmp / "checkout"
    try:
        git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
        yield path
    finally:
        with contextlib.suppress(BisectError):
            git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(BisectError):
            git(repo, "worktree", "prune")


def run_build(command: str, cwd: Path, log_path: Path, timeout_s: float | None = None) -> str | None:
    """Run the build command (a shell line) in the checkout ``cwd``; its output goes to
    ``log_path``. Returns None when it succeeded, else the error in one line (the exit code
    and the output's last line). Past ``timeout_s`` (or on an interrupt) the build's whole
    process tree is ended (:func:`perfkit.engine.owner.run_bounded`), not only its shell."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = run_bounded(command, timeout_s, shell=True, cwd=cwd, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return f"build {command!r} ran past {timeout_s} s (its processes were ended)"
    out = (p.stdout or "") + (p.stderr or "")
    log_path.write_text(out, encoding="utf-8")
    if p.returncode == 0:
        return None
    last = next((x.strip() for x in reversed(out.splitlines()) if x.strip()), "")
    return f"build {command!r} exited {p.returncode}" + (f": {last}" if last else "") + f" (log: {log_path})"
