"""``perfkit suite``: run a params file's investigations (or one shard of its units), gate, report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, choice, done, fail, file_option, print_result
from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK
from perfkit.investigations import registry
from perfkit.measure import investigations


def _partition(kw: dict[str, Any], executor_options: dict[str, Any]) -> int:
    """``--partition I/N``: shard I's units into bundles and a shard manifest."""
    from perfkit.params import ParamsError
    from perfkit.scaleout.merge import MANIFEST
    from perfkit.scaleout.shards import ExecutorError, ShardInterrupted, run_shard
    from perfkit.scaleout.units import PartitionError, parse_partition

    try:
        i, n = parse_partition(kw["partition"])
    except PartitionError as exc:
        return fail(str(exc))
    if kw["replay"]:
        return fail("--partition measures; it cannot be combined with --replay")
    if not kw["out"]:
        return fail("--partition needs --out (the shard's output directory)")
    out = Path(kw["out"])
    if (out / MANIFEST).exists() and not kw["force"]:
        return fail(f"--out {out} already holds a shard ({MANIFEST}): pass --force to replace it")
    try:
        m = run_shard(
            kw["params"], out, i, n, only=kw["only"], tier=kw["tier"], executor=kw["executor"] or "inprocess",
            executor_options=executor_options, progress=not kw["quiet"], sets=kw["sets"],
        )  # fmt: skip
    except (ParamsError, ExecutorError, ValueError, FileNotFoundError, ShardInterrupted) as exc:
        return fail(str(exc))
    bad = [o for o in m["outcomes"] if o["status"] != "ok"]
    for o in m["outcomes"]:
        print(f"  {o['unit_id']:30s} {o['status']:6s} {o['wall_s'] or 0:9.1f} s  {o.get('error') or ''}")
    print(f"perfkit suite --partition {i}/{n}: {len(m['outcomes'])} unit(s), {len(bad)} failed")
    print(f"  manifest: {out / MANIFEST}")
    return EXIT_ERROR if bad else EXIT_OK


def _suite(kw: dict[str, Any]) -> int:
    from perfkit.engine.owner import become_subreaper

    become_subreaper()  # orphans below come back here
    from perfkit.params import ParamsError
    from perfkit.scaleout.shards import ExecutorError
    from perfkit.suite import run_suite
    from perfkit.suite.execute import SuiteError

    if kw["address"] and kw["executor"] != "ray":
        fail(f"--address {kw['address']} is ignored: it is for --executor ray")
    options = {"address": kw["address"]} if kw["executor"] == "ray" and kw["address"] else {}
    if kw["partition"] is not None:
        return _partition(kw, options)
    common = {k: kw[k] for k in ("only", "tier", "notebooks", "force", "sets", "executor")}
    common.update(screenshot=not kw["no_screenshot"], progress=not kw["quiet"])
    try:
        res = run_suite(kw["params"], kw["out"], replay=kw["replay"], executor_options=options, **common)
    except ParamsError as exc:
        return fail(f"invalid params:\n{exc}")
    except (ExecutorError, SuiteError, FileNotFoundError) as exc:
        return fail(str(exc))
    return print_result(res, "perfkit suite")


class _SuiteCommand(click.Command):
    """``perfkit suite``: its help ends with the registered investigations."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        lines = ["Investigations (each a params section of that name; --only picks them):\n\n\b"]
        for s in registry.all_investigations():
            off = "" if s.params_model.model_fields["enabled"].default else " [off by default]"
            lines.append(f"  {s.name:14s} {s.title}: {s.question}{off}")
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text("\n".join(lines))
        super().format_epilog(ctx, formatter)


@click.command("suite", cls=_SuiteCommand, epilog=EXIT_CODES + " The report is written in every case.")
@file_option("--params", kind="params file", required=True, help="params YAML (see params/)")
@click.option(
    "--out",
    default=None,
    help="run directory (default: outputs/<params name>/<timestamp>, with a 'latest' link)",
)
@click.option("--replay", default=None, help="a run directory whose bundles are replayed: launches nothing")
@click.option(
    "--only",
    multiple=True,
    callback=lambda ctx, param, value: investigations(value),
    help="run only this investigation (repeatable, or a comma list); the gate always runs; a "
    "disabled one is refused before anything starts (enable it with --set NAME.enabled=true)",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="override one params key (value read as YAML; validated like the file, errors name the "
    "key), e.g. --set load.enabled=true; repeatable",
)
@choice(
    "--tier", ["per-commit", "extra"], "run only the investigations of this tier (params: <section>.tier)"
)
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="run shard I of N (1-based) of the units of work: bundles and OUT/shard.json only, "
    "no notebooks; join the shards with perfkit merge",
)
@choice(
    "--executor",
    ["inprocess", "ray"],
    "run the units of work through this executor, then replay them into the report "
    "(default: the notebooks measure, in process)",
)
@click.option("--address", default=None, help="Ray cluster address (--executor ray; e.g. auto)")
@click.option("--notebooks", default=None, hidden=True, help="another notebooks folder (tests)")
@click.option("--force", is_flag=True, help="--out may hold an earlier run: its outputs are removed first")
@click.option("--no-screenshot", is_flag=True, help="skip the report screenshot")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar")
def suite_command(**kw: Any) -> None:
    """Run the investigation notebooks of a params file, gate the run, write the report."""
    kw["only"] = list(kw["only"]) or None
    done(_suite(kw))
