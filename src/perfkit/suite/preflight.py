"""What the suite checks and prepares before anything runs: the baseline file, the replay
directory and its bundles' identity, the run directory (refused when it holds another run),
the default ``outputs/<name>/<timestamp>`` directory and its ``latest`` link, the launch plan.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from perfkit.bundle import identity_differences, read_meta
from perfkit.common.outdirs import stamped_dir
from perfkit.common.provenance import repo_root
from perfkit.common.slugs import slug
from perfkit.gate import baseline as bl
from perfkit.gate.run import resolve_baseline_file
from perfkit.gate.verdicts import RUN_FILE
from perfkit.gate.verdicts import notebooks as notebook_names
from perfkit.investigations import registry
from perfkit.measuring.progress import planned_requests
from perfkit.params import ParamsError, SuiteParams

log = logging.getLogger(__name__)


LATEST = "latest"


def outputs_base(name: str) -> Path:
    """``outputs/<name>`` (slugged): where the runs of one params file or notebook land."""
    return Path("outputs") / slug(name)


def default_out(name: str) -> Path:
    """A new run directory ``outputs/<name>/<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when that
    second is taken): runs never overwrite each other."""
    return stamped_dir(outputs_base(name), create=True)


def link_latest(run_dir: Path) -> Path | None:
    """Point ``<run_dir's parent>/latest`` at ``run_dir`` (a relative symlink, replaced
    atomically). Returns the link, or None where symlinks are not possible (logged)."""
    link = run_dir.parent / LATEST
    tmp = run_dir.parent / f".{LATEST}.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, link)
        return link
    except OSError as exc:
        log.warning("could not link %s -> %s: %s", link, run_dir, exc)
        return None


class SuiteError(ValueError):
    """A suite that cannot start (replay directory without bundles, run directory holding
    another run): nothing ran; exit code 2."""


#: why a merged run skips an investigation: a part of it is missing or failed
NOT_MERGED = "not measured: a unit of it failed or is missing (see the scale-out entry)"
#: name of the run.json entry that carries scale-out problems (missing shard, failed unit)
SCALEOUT = "scale-out"

#: skip reason of an investigation whose bundle the replay directory lacks
NO_REPLAY_BUNDLE = "no bundle in replay dir"
#: what a run directory holds once a suite ran there
RUN_OUTPUTS = (
    RUN_FILE,
    "params.yaml",
    "baseline.json",
    "summary.md",
    "report.html",
    "report.png",
    "notebooks",
)


def check_baseline_file(params: SuiteParams, source: str | Path) -> None:
    """Raise :class:`ParamsError` when ``baseline.file`` is set but missing, not a valid
    baseline (the message gives line/column for broken JSON) or lacks ``baseline.profile``.
    ``file: null`` means invariants only and passes."""
    f = params.baseline.file
    if f is None:
        return
    p = resolve_baseline_file(f)
    if not p.exists():
        raise ParamsError(
            f"{source}: baseline.file: {f} does not exist (looked in {Path.cwd()} "
            f"and {repo_root()}); use 'file: null' to gate on invariants only"
        )
    try:
        ref = bl.load_baseline(p)
    except bl.BaselineError as exc:
        raise ParamsError(f"{source}: baseline.file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{source}: baseline.file: cannot read {p}: {exc}") from None
    tols = ref.get("tolerances") or {}
    if not bl.is_flat(tols) and params.baseline.profile not in tols:  # flat: one set for all
        profiles = sorted(tols)
        raise ParamsError(
            f"{source}: baseline.profile: {params.baseline.profile!r} is not a "
            f"tolerance profile of {f} (it has: {', '.join(profiles) or 'none'})"
        )


def replay_plan(replay_dir: Path, selected: Iterable[str], *, allow_empty: bool = False) -> list[str]:
    """The selected investigations without a bundle in ``replay_dir`` (skipped). Raises
    :class:`SuiteError` when ``replay_dir`` is missing or, unless ``allow_empty`` (a merge whose
    every unit failed), holds no bundle of them."""
    selected = list(selected)
    if allow_empty and replay_dir.is_dir():
        return [n for n in selected if not (replay_dir / n / "meta.json").exists()]
    if not replay_dir.exists():
        raise SuiteError(
            f"--replay {replay_dir}: no such directory (--replay launches nothing: "
            "it needs a run directory holding bundles)"
        )
    if not replay_dir.is_dir():
        raise SuiteError(f"--replay {replay_dir}: not a directory")
    have = [s for s in registry.names() if (replay_dir / s / "meta.json").exists()]
    if not have:
        raise SuiteError(
            f"--replay {replay_dir}: no bundle to replay (expected "
            f"<dir>/<investigation>/meta.json for one of {', '.join(registry.names())}); "
            "--replay launches nothing"
        )
    missing = [n for n in selected if n not in have]
    if selected and len(missing) == len(selected):
        raise SuiteError(
            f"--replay {replay_dir}: no bundle of {', '.join(selected)} (it holds "
            f"{', '.join(have)}); --replay launches nothing"
        )
    return missing


def check_replay_identity(replay_dir: Path, names: Iterable[str], params: SuiteParams, source: str) -> None:
    """Raise :class:`SuiteError` when a replayed bundle was measured with another engine or
    request shape than ``params`` describe (:func:`perfkit.bundle.identity_differences`): its
    numbers would be filed under another engine's case ids. Bundles recording none are logged."""
    problems = []
    for name in names:
        if not (replay_dir / name / "meta.json").exists():
            continue
        recorded = read_meta(replay_dir / name).get("params") or {}
        if not recorded.get("spec") or not recorded.get("request"):
            log.warning(
                "--replay %s: the %s bundle records no engine spec or request: not checked", replay_dir, name
            )
            continue
        diffs = identity_differences(recorded, params.engine_dict(), params.request.model_dump())
        if diffs:
            problems.append(f"the {name} bundle: {'; '.join(diffs)}")
    if problems:
        raise SuiteError(
            f"--replay {replay_dir}: " + "; ".join(problems) + f" ('given' is {source}): replay with the "
            "params file the bundles were measured with"
        )


def prepare_run_dir(run_dir: Path, *, force: bool = False, replay_dir: Path | None = None) -> None:
    """Refuse (:class:`SuiteError`) a run directory that holds another run, unless ``force``:
    then that run's outputs (:data:`RUN_OUTPUTS`) are removed, so no stale bundle or verdict
    mixes into the new report."""
    if replay_dir is not None and replay_dir == run_dir:
        raise SuiteError(
            f"--replay and --out are the same directory ({run_dir}): choose another "
            "--out (the replayed bundles are copied there)"
        )
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise SuiteError(f"--out {run_dir}: exists and is not a directory")
    found = [run_dir / n for n in (*RUN_OUTPUTS, *notebook_names()) if (run_dir / n).exists()]
    if not found:
        return
    if not force:
        raise SuiteError(
            f"--out {run_dir} already holds another run "
            f"({', '.join(p.name for p in found)}); its bundles would mix into this "
            "run's report: choose a new --out, or pass --force to replace that run"
        )
    for p in found:
        log.warning("--force: removing %s of the earlier run", p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def run_plan(params: SuiteParams, names: Iterable[str]) -> tuple[int, int]:
    """(launches, requests) the investigations ``names`` would make with ``params``, from each
    investigation's ``plan`` (an upper bound: an investigation may reuse an earlier one's launch)."""
    plans = []
    for n in names:
        if n not in registry.names():  # the gate notebook launches nothing
            continue
        s = registry.get(n)
        if s.plan is not None:
            try:
                plans.append(s.plan(params.section(n)))
            except (AttributeError, TypeError, ValueError) as exc:
                log.debug("no plan for %s: %s", n, exc)
    return planned_requests(plans)
