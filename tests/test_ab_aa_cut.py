"""`perfkit ab` cut short: an A/A of the tiny reference engine stopped at 2 launches a side is
undecided (exit 1), never a pass and never a regression (real engine processes, real CLI).

Not a ``timing`` test: at 2 launches a side the interval's t quantile at 99 % is 9.9 or more
(Welch, 1 to 2 degrees of freedom; 63.7 for 2 pairs), so no host state decides it either way
and it runs in the parallel phase, beside other tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from perfkit.ab.decide import AbResult
from perfkit.cli import cli

SPEC_A = Path(__file__).resolve().parents[1] / "examples/ab/tiny-cpu.yaml"


def ab(*args: str):
    return CliRunner().invoke(cli, ["ab", *args], catch_exceptions=False)


@pytest.mark.slow
def test_live_aa_cut_at_two_launches_is_undecided_not_a_pass(tmp_path):
    """An A/A of the tiny engine with at most 2 launches a side: never a regression, and ending
    undecided exits 1 with "undecided" on summary.md's first line and the launches it would
    need. (The interleaved design only: the undecided rule is the sequential procedure's, the
    same for pairs; the live paired design runs in test_ab.py.)"""
    out = tmp_path / "aa"
    res = ab("--a", str(SPEC_A), "--b", str(SPEC_A), "-n", "2", "--max-launches", "2", "-m", "3",
             "--confidence", "0.99", "--gate-metrics", "DenoisingStage,warm_e2e", "--out", str(out), "-q",
             )  # fmt: skip
    r = AbResult.load(out)
    assert not r.meta["ab"].get("paired")
    assert "regression" not in set(r.table.loc[r.gated, "decision"]), r.table.to_string()
    assert res.exit_code == r.exit_code == 1 and r.verdict == "undecided", res.output
    assert (out / "summary.md").read_text().splitlines()[0] == "## perfkit ab: undecided (exit code 1)"
    seq = r.meta["sequential"]
    assert seq["stop"] == "maximum" and seq["launches_run"] == {"A": 2, "B": 2}
    assert r.undecided and "perfkit ab: undecided: " in res.output and "still inconclusive" in res.output
