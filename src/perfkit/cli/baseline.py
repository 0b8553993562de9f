"""``perfkit baseline update``: write one case of a baseline file, or refresh its time estimates."""

from __future__ import annotations

from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, done, fail
from perfkit.common.exitcodes import EXIT_OK


@click.group("baseline")
def baseline_group() -> None:
    """Baseline files (sglang perf_baselines layout)."""


def _refresh(baseline: str, unit_times: tuple[str, ...]) -> int:
    from perfkit.scaleout.shards import refresh_estimates

    try:
        written = refresh_estimates(baseline, unit_times)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    for c, v in written.items():
        print(f"{baseline}: case {c} estimated_full_test_time_s {v}")
    if not written:
        print(f"{baseline}: no case of these units is in the file (nothing refreshed)")
    return EXIT_OK


@baseline_group.command("update", epilog=EXIT_CODES)
@click.option("--bundle", default=None, help="a bundle directory (RUN/<investigation>)")
@click.option("--baseline", required=True, help="the baseline JSON to update (created when missing)")
@click.option("--case", default=None, help="the case id to write")
@click.option(
    "--unit-times",
    multiple=True,
    help="refresh estimated_full_test_time_s of the file's cases from the unit wall times of "
    "shard outputs or merged runs (repeatable; instead of --bundle/--case)",
)
@click.option("--hardware", default=None, help="must match the file's metadata.hardware when it has one")
@click.option("--launch", help="the launch to take (bundles of several launches: warmup17, cap1, ...)")
@click.option("--num-frames", type=int, help="one request shape of a launch that sent several shapes")
def baseline_update_command(**kw: Any) -> None:
    """Write one case, derived from a bundle, into a baseline file (atomically)."""
    from perfkit.gate import baseline as bl

    bundle, baseline, case, unit_times = kw["bundle"], kw["baseline"], kw["case"], kw["unit_times"]
    if unit_times:
        if bundle or case:
            done(fail("--unit-times refreshes estimates only: leave out --bundle/--case"))
        done(_refresh(baseline, unit_times))
    if not bundle or not case:
        done(fail("baseline update needs --bundle and --case (or --unit-times)"))
    try:
        shape = {k: kw[k] for k in ("hardware", "launch", "num_frames")}
        doc = bl.update_baseline(bundle, baseline, case, **shape)
    except (OSError, ValueError) as exc:
        done(fail(str(exc)))
    e = doc["scenarios"][case]
    print(f"{baseline}: case {case} updated (e2e {e.get('expected_e2e_ms')} ms)")
    done(EXIT_OK)
