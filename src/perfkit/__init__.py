"""perfkit: performance investigation suite for diffusion video serving engines.

The public API for notebook users: :func:`run_suite`, :func:`load_bundle`, :func:`compare` and
:func:`run_ab`, each a thin wrapper over the library module that does the work (imported when
called, so ``import perfkit`` stays cheap). The A/B call is ``run_ab``, not ``ab``: importing the
subpackage :mod:`perfkit.ab` would replace a function of that name. The rest: docs/DESIGN.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # for type checkers only: importing these costs seconds (pandas, torch)
    import pandas as pd

    from perfkit.bundle import ResultBundle
    from perfkit.suite import SuiteResult

from perfkit.common.version import __version__

__all__ = ["run_suite", "load_bundle", "compare", "run_ab", "__version__"]


def run_suite(
    params: str | Path,
    out: str | Path | None = None,
    *,
    replay: str | Path | None = None,
    only: Sequence[str] | None = None,
    tier: str | None = None,
    progress: bool = True,
) -> SuiteResult:
    """Run the enabled investigations of a params file in their notebooks, then the gate, the
    report and the summary (:func:`perfkit.suite.run_suite`).

    Args:
        params: a params YAML (``params/cpu.yaml``, ``params/h200.yaml``).
        out: the run directory (default: a new ``outputs/suite/<timestamp>``).
        replay: a run or bundles directory: render from its bundles, launch nothing.
        only: these investigations only (registered names).
        tier: ``per-commit`` or ``extra``: the investigations of that tier only.
        progress: progress bars on stderr.

    Returns:
        :class:`perfkit.suite.SuiteResult`: ``run_dir``, ``exit_code`` (0 pass, 1 regression,
        2 error), ``status``, each notebook's run, and the verdict rows (a DataFrame).

    Raises:
        perfkit.suite.ParamsError: bad params or baseline file, unknown tier or investigation.
        perfkit.suite.SuiteError: a replay directory without bundles, or ``out`` holding
            another run. Every later failure is reported through the exit code.
    """
    from perfkit import suite

    return suite.run_suite(params, out, replay=replay, only=only, tier=tier, progress=progress)


def load_bundle(path: str | Path) -> ResultBundle:
    """The bundle saved under ``path`` (``RUN/<investigation>/``): ``meta``, ``results`` and the
    tables (``requests``, ``stages``, ``steps``, ``memory``, ``launches``; ms, s, MiB as declared
    in :mod:`perfkit.bundle_schema`).

    Raises:
        FileNotFoundError: no bundle there; ValueError: a file that is not what its schema
            declares (naming the file and column).
    """
    from perfkit.bundle import ResultBundle

    return ResultBundle.load(path)


def compare(
    run: str | Path,
    baseline: str | Path,
    *,
    case: str | None = None,
    profile: str = "pr_test",
    strict: bool = False,
) -> pd.DataFrame:
    """``run`` against the baseline file ``baseline`` by sglang's rule: a metric passes when
    actual <= max(expected × (1 + tolerance), expected + pad) (sglang's
    ``perf_baselines.json`` tolerances; :func:`perfkit.gate.baseline.compare`).

    Args:
        run: a run directory, a bundle, a ``performance.log`` or a perf dump.
        baseline: a baseline JSON in sglang's layout.
        case: the case id to compare a single bundle or log as (default: a bundle's cases as
            its run's baseline.json names them, a log's file stem).
        profile: the tolerance profile (``pr_test``, ``long_term``, ...).
        strict: a case or metric the baseline lacks fails instead of being ``new``.

    Returns:
        The check rows as a DataFrame (:func:`perfkit.checks.check_table`): ``case``,
        ``metric``, ``expected``, ``actual`` (ms, MiB), ``bound``, ``status`` (pass, fail,
        improved, new, skipped) and ``reason``. A run sharing no case with the baseline gives a
        failing ``cases compared`` row, never an empty pass.

    Raises:
        OSError: a file missing or unreadable; ValueError: an unreadable input or baseline, a
            profile it lacks, nothing measured in ``run`` (:class:`perfkit.gate.baseline.BaselineError`
            names the file and key).
    """
    from perfkit.checks import check_table
    from perfkit.gate.run import compare_run

    return check_table(compare_run(run, baseline, case, profile, strict)[0])


def run_ab(
    a: str | Path,
    b: str | Path,
    out: str | Path | None = None,
    *,
    replay: bool = False,
    launches: int = 4,
    max_launches: int = 8,
    warm: int = 5,
    threshold: float = 0.05,
    gate_metrics: Sequence[str] | None = None,
    undecided: str = "fail",
) -> Any:
    """Is B slower than A? A Welch t interval of B/A on the logs of the launches' medians
    (Kalibera & Jones: the launch is the unit) against ±``threshold``; launches added in pairs
    until every gated metric is decided or ``max_launches`` a side ran (alpha spending).

    Args:
        a, b: engine spec or params YAML files (:func:`perfkit.params.load_side`; the request
            shape is the params files', which must agree); with ``replay``, two recorded side bundles
            (``OUT/a``, ``OUT/b`` of an earlier run) decided again, nothing launched, paired if
            the recording was.
        out: where the side bundles go (required unless ``replay``).
        launches: launches a side at the first look (>= 2).
        max_launches: launches a side at most.
        warm: warm requests a launch after the cold one.
        threshold: the relative change that matters (0.05: ±5 %).
        gate_metrics: the metrics that decide (default: every metric; a replay: as recorded).
        undecided: ``fail`` (exit code 1) or ``pass`` when a gated metric stays inconclusive.

    Returns:
        The decision (:func:`perfkit.ab.sequential.decide_sequential`): ``verdict``,
        ``exit_code`` (0 no regression, 1 regression or undecided, 2 error), ``table`` (one row
        per metric: B/A, interval, decision), ``launch_means``, ``undecided``.

    Raises:
        ValueError: ``out`` missing for a live run, a spec file that is not an engine spec
            (naming the key), sides that cannot be one A/B, or a gated metric nobody measured.
    """
    from perfkit.ab.ab_command import design_for, run_or_replay
    from perfkit.params import load_side

    gate = list(gate_metrics) if gate_metrics else None

    def decision(bundles: Any) -> tuple[Any, float, dict[str, float]]:
        # a replay: as many as recorded, its pairing and slow-spell rule as `perfkit ab --replay` reads them
        n = [len(x.launches) for x in (bundles or {}).values()]
        lo, hi = min([launches, *n]), min([max_launches, *n])
        return design_for(lo, hi, None, None, None, bundles), threshold, {}

    if not replay:
        if out is None:
            raise ValueError("ab: out is required for a live run (where the side bundles go)")
        a, b, out = load_side(a), load_side(b), Path(out)
    return run_or_replay(a, b, out, decision, gate, undecided, replay=replay, warm=warm)
