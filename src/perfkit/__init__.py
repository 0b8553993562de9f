"""perfkit: performance investigation suite for diffusion video serving engines.

The public API (docs/lab.md): :func:`run_suite`, :func:`load_bundle`, :func:`compare`, :func:`run_ab`
(not ``ab``: the subpackage would replace it); each imports its library module when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
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
    """Run a params file's investigations, the gate, the report (:func:`perfkit.suite.run_suite`).

    Returns a SuiteResult (``run_dir``, ``exit_code`` 0 pass / 1 regression / 2 error, ...).
    Raises ParamsError (bad params, tier or name), SuiteError (a replay without bundles, ``out``
    holding another run); later failures go to the exit code.
    """
    from perfkit import suite

    return suite.run_suite(params, out, replay=replay, only=only, tier=tier, progress=progress)


def load_bundle(path: str | Path) -> ResultBundle:
    """The bundle under ``path``: ``meta``, ``results`` and its tables (units: bundle_schema).

    Raises FileNotFoundError (no bundle), ValueError (naming a file and column off its schema).
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
    """``run`` (a run, bundle, ``performance.log`` or perf dump) against a baseline JSON by
    sglang's rule: pass when actual <= max(expected × (1 + tolerance), expected + pad).

    Returns the check rows as a DataFrame (``actual`` in ms, MiB; ``status``); no shared case
    gives a failing ``cases compared`` row. Raises OSError, ValueError (naming the file and key).
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
    """Is B slower than A? ``perfkit ab``'s sequential A/B (docs/ab.md) of two spec or params
    files, or with ``replay`` of two recorded side bundles, nothing launched.

    Returns the decision: ``verdict``, ``exit_code`` (0 / 1 regression or undecided / 2 error),
    ``table``. Raises ValueError: no ``out`` for a live run, a bad spec, a gated metric unmeasured.
    """
    from perfkit.ab.ab_command import design_for, run_or_replay
    from perfkit.params import load_side

    gate = list(gate_metrics) if gate_metrics else None

    def decision(bundles: Any) -> tuple[Any, float, dict[str, float]]:
        n = [len(x.launches) for x in (bundles or {}).values()]
        lo, hi = min([launches, *n]), min([max_launches, *n])
        return design_for(lo, hi, None, None, None, bundles), threshold, {}

    if not replay:
        if out is None:
            raise ValueError("ab: out is required for a live run (where the side bundles go)")
        a, b, out = load_side(a), load_side(b), Path(out)
    return run_or_replay(a, b, out, decision, gate, undecided, replay=replay, warm=warm)
