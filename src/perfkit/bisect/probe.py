"""One probe: build a checkout in a temporary detached worktree, read its engine spec and run
``perfkit ab``'s sequential A/B of it against a reference checkout on one metric; the git calls
for it. See docs/history.md ("Probe builders").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfkit.ab.sequential import Design, Gate, decide_sequential, run_sequential
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.owner import run_bounded
from perfkit.engine.spec import EngineSpec
from perfkit.history.runs import git as _git
from perfkit.params import ParamsError, load_side, not_a_file
from perfkit.report.ab import write_ab_outputs
from perfkit.stats import DEFAULT_THRESHOLD

log = logging.getLogger(__name__)


class BisectError(ValueError):
    """Bad input for a bisection or a confirmation (a repository, a commit, a spec)."""


git = functools.partial(_git, error=BisectError)


@dataclass(frozen=True)
class Commit:
    """One commit: full sha, subject line, author date (ISO 8601, the author's zone)."""

    sha: str
    subject: str
    author_date: str

    @property
    def short(self) -> str:
        """The sha's first 10 characters."""
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


_FORMAT = "%H%x1f%s%x1f%aI"


def commit_info(repo: str | Path, rev: str) -> Commit:
    """Commit ``rev`` of ``repo``; BisectError naming it when unknown."""
    try:
        out = git(repo, "show", "-s", f"--format={_FORMAT}", f"{rev}^{{commit}}", "--")
    except BisectError:
        raise BisectError(f"{repo}: no commit {rev!r}") from None
    return Commit(*out.strip().split("\x1f"))


def commit_range(repo: str | Path, good: str, bad: str) -> tuple[Commit, list[Commit]]:
    """The good commit and the first-parent commits after it up to ``bad`` (oldest first).
    Raises BisectError: not a repository, an unknown commit, ``good`` not an ancestor of ``bad``."""
    check_repo(repo)
    gc, bc = commit_info(repo, good), commit_info(repo, bad)
    g, b = gc.sha, bc.sha
    if g == b:
        raise BisectError(f"good and bad are the same commit ({g[:10]})")
    p = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b], check=False)
    if p.returncode != 0:
        raise BisectError(
            f"{repo}: the good commit {good} ({g[:10]}) is not an ancestor of the bad one {bad} ({b[:10]})"
        )
    out = git(repo, "log", "--first-parent", "--reverse", f"--format={_FORMAT}", f"{g}..{b}", "--")
    commits = [Commit(*line.split("\x1f")) for line in out.splitlines() if line]
    if not commits or commits[-1].sha != b:
        raise BisectError(f"{repo}: {bad} is not on the first-parent line after {good}")
    return gc, commits


@contextlib.contextmanager
def worktree(repo: str | Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``sha`` in a new temporary directory, removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix=f"perfkit-probe-{sha[:10]}-"))
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
    """Run the shell line ``command`` in ``cwd``, output to ``log_path``; None when it succeeded,
    else the error in one line. Past ``timeout_s`` its whole process tree is ended."""
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


@dataclass(frozen=True)
class ProbeSetup:
    """How every probe is built and compared: ``python_path``, a directory of the checkout
    prepended to ``PYTHONPATH``; ``build``, a shell line run in each checkout first;
    ``threshold(s)`` fractions."""

    spec: Path
    metric: str = "DenoisingStage"
    python_path: str | None = None
    build: str | None = None
    design: Design = field(default_factory=Design)
    threshold: float = DEFAULT_THRESHOLD
    warm: int = 3
    build_timeout_s: float | None = None
    thresholds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not Path(self.spec).is_file():
            raise BisectError(f"--spec {self.spec}: {not_a_file(self.spec)}")

    def require_varies(self) -> None:
        """Raise BisectError unless a probe's engine can depend on its commit."""
        if self.build or self.python_path is not None:
            return
        try:
            text = Path(self.spec).read_text(encoding="utf-8")
        except OSError:
            return
        if "{checkout}" not in text:
            raise BisectError(
                f"{self.spec} does not depend on the checkout (no {{checkout}} in it) and neither "
                "--python-path nor --build is given: every probe would run the same engine"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (the design's too, ``spec`` as text)."""
        d = asdict(self)
        d["spec"] = str(self.spec)
        d["design"] = self.design.to_dict()
        return d


@dataclass
class Probe:
    """One A/B of a commit (``position`` 1: the first after the good one) against the reference.
    ``verdict``: ``bad`` (a regression), ``good``, ``undecided`` or ``error``; ``ratio``, ``low``,
    ``high``: B/A and its interval; ``launches``: side -> launches run; ``wall_s`` build included."""

    commit: Commit
    position: int
    verdict: str
    decision: str | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    error: str | None = None
    launches: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    out: str = ""
    wall_s: float = 0.0


def load_spec(
    path: Path, checkout: Path, python_path: str | None = None
) -> tuple[EngineSpec, dict[str, Any]]:
    """The engine spec and request of ``path`` for ``checkout`` (``{checkout}`` filled, the overlay
    on ``PYTHONPATH``). Raises BisectError naming a bad file and key, or a bad ``python_path``."""
    try:
        spec, request = load_side(path, checkout)
    except ParamsError as exc:
        raise BisectError(str(exc)) from None
    if python_path is not None:
        src = (Path(checkout) / python_path).resolve()
        if not src.is_dir():
            raise BisectError(f"--python-path {python_path!r}: not a directory of the checkout ({src})")
        rest = spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env = {**spec.env, "PYTHONPATH": os.pathsep.join(x for x in (str(src), rest) if x)}
        spec = spec.replace(env=env)
    return spec, request or {}


def prepare(checkout: Path, setup: ProbeSetup, log_dir: Path) -> tuple[EngineSpec, dict[str, Any]]:
    """Build ``checkout`` (log in ``log_dir/build.log``) and read its spec; BisectError when the
    build failed or the spec is bad."""
    if setup.build:
        err = run_build(setup.build, checkout, log_dir / "build.log", setup.build_timeout_s)
        if err:
            raise BisectError(err)
    return load_spec(setup.spec, checkout, setup.python_path)


def compare(
    ref: tuple[EngineSpec, dict[str, Any]],
    probe: tuple[EngineSpec, dict[str, Any]],
    setup: ProbeSetup,
    out: Path,
    commit: Commit,
    position: int,
) -> Probe:
    """The sequential A/B of ``probe`` (B) against ``ref`` (A) on ``setup.metric`` into ``out``; a
    failed launch or an unmeasured metric is the probe's ``error``, never raised."""
    spec_a, req_a = ref
    spec_b, req_b = probe
    if req_a and req_b and req_a != req_b:
        why = f"the two checkouts' params ask for different requests ({req_a} vs {req_b})"
        return Probe(commit, position, "error", error=why)
    request = VideoRequestSpec.from_dict(dict(req_a or req_b))
    gate = Gate([setup.metric], setup.threshold, setup.thresholds or None)
    bundles = run_sequential({"A": spec_a, "B": spec_b}, request, setup.warm, setup.design, out, gate)
    try:
        res = decide_sequential(bundles["A"], bundles["B"], setup.design, gate)
    except ValueError as exc:
        return Probe(commit, position, "error", error=str(exc), out=str(out))
    write_ab_outputs(res, out)
    seq = res.meta.get("sequential") or {}
    row = (
        res.table.set_index("metric").loc[setup.metric] if setup.metric in set(res.table["metric"]) else None
    )
    decision = None if row is None else str(row["decision"])

    def num(k: str) -> float | None:
        v = None if row is None else row[k]
        return None if v is None or v != v else float(v)

    errors = [str(e).splitlines()[0] for e in res.meta.get("launch_errors") or [] if str(e)]
    if res.exit_code == 2 or decision in (None, "not measured"):
        verdict = "error"
        error = "; ".join(errors) or f"{setup.metric} was not measured on both sides"
    else:
        verdict = {"regression": "bad", "no change": "good", "improvement": "good"}.get(decision, "undecided")
        error = None
    launches, reason = dict(seq.get("launches_run") or {}), str(seq.get("reason") or "")
    log.info("probe %s (%s): %s, %s", commit.short, commit.subject, verdict, decision)
    return Probe(
        commit, position, verdict, decision, num("ratio"), num("low"), num("high"), error, launches, reason,
        str(out),
    )  # fmt: skip
