"""The perfkit command: run, gate and report diffusion video serving investigations.

    perfkit suite --params params/ci-cpu.yaml [--out outputs/RUN] [--replay RUN] [--only NAME]
    perfkit run notebooks/cold_warm.ipynb -p repeats=3 -p run_dir=outputs/x [--out FILE]
    perfkit report outputs/RUN
    perfkit compare --run outputs/RUN --baseline baselines/h200.json [--profile pr_test] [--strict]
    perfkit compare --before A.json --after B.json    (two sglang perf dumps)
    perfkit baseline update --bundle outputs/RUN/cold_warm --baseline FILE --case ID [--hardware NAME]
    perfkit engine serve [refengine args...]      (python -m perfkit.refengine; takes sglang
        serve's --model-path/--port/--host/--num-gpus and honours SGLANG_PERF_LOG_DIR when
        SGLANG_DIFFUSION_STAGE_LOGGING=1, so EngineSpec(kind="sglang",
        executable=["perfkit", "engine"]) drives it like sglang's server)

Exit codes: 0 every gate passed, 1 a regression (a gate failed), 2 an error (bad params, engine
crash, notebook exception).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from perfkit.checks import check_markdown, check_table, overall_status
from perfkit.gate.verdicts import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION
from perfkit.scenarios import registry

log = logging.getLogger("perfkit")


class UsageError(ValueError):
    """A bad command line (``-p`` without ``=``, unparsable value, unknown parameter): exit 2."""


def _parse_kv(items: list[str]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items -> {key: YAML-parsed value}. Raises :class:`UsageError`."""
    out: dict[str, Any] = {}
    for it in items or []:
        if "=" not in it:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r} (empty key)")
        try:
            out[k] = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UsageError(
                f"-p {k}: value {v!r} is not valid YAML ({where}); quote strings "
                f"with special characters, e.g. -p '{k}=\"...\"'"
            ) from None
    return out


def _sigterm_as_interrupt() -> None:
    """SIGTERM (CI cancel, ``timeout``) stops the run like Ctrl-C: engines torn down, report written."""
    import signal

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _check_notebook_parameters(nb: Path, given: dict[str, Any]) -> None:
    """Raise :class:`UsageError` for a ``-p`` name the notebook's ``parameters`` cell lacks."""
    import difflib

    import papermill as pm

    try:
        declared = list(pm.inspect_notebook(str(nb)))
    except Exception as exc:  # noqa: BLE001 - not a notebook, unreadable JSON, ...
        raise UsageError(f"cannot read the parameters of {nb}: {exc}") from None
    unknown = [k for k in given if k not in declared]
    if not unknown:
        return
    hints = []
    for k in unknown:
        m = difflib.get_close_matches(k, declared, n=1, cutoff=0.6)
        hints.append(f"{k!r}" + (f" (did you mean {m[0]!r}?)" if m else ""))
    known = ", ".join(declared) if declared else "none (the notebook has no parameters cell)"
    raise UsageError(
        f"{nb.name}: unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; known: {known}"
    )


def cmd_suite(a: argparse.Namespace) -> int:
    _sigterm_as_interrupt()
    from perfkit.params import ParamsError
    from perfkit.suite import SuiteError, run_suite

    try:
        res = run_suite(
            a.params,
            a.out,
            replay=a.replay,
            only=a.only,
            notebooks=a.notebooks,
            screenshot=not a.no_screenshot,
            progress=not a.quiet,
            force=a.force,
        )
    except ParamsError as exc:
        print(f"perfkit: invalid params:\n{exc}", file=sys.stderr)
        return EXIT_ERROR
    except SuiteError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except FileNotFoundError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for n in res.notebooks:
        wall = f"{n.wall_s:.1f} s" if n.wall_s is not None else ""
        status = f"{n.status} ({n.reason})" if n.status == "skipped" and n.reason else n.status
        print(f"  {n.name:15s} {status:8s} {wall:>9s}  {n.error or ''}")
    print(f"perfkit suite: {res.status.upper()} (exit {res.exit_code})")
    print(f"  report:   {res.run_dir / 'report.html'}")
    print(f"  summary:  {res.run_dir / 'summary.md'}")
    if (res.run_dir / "baseline.json").exists():
        print(f"  baseline: {res.run_dir / 'baseline.json'}")
    return res.exit_code


def cmd_run(a: argparse.Namespace) -> int:
    from perfkit.suite import default_out, execute_notebook

    nb = Path(a.notebook)
    if not nb.exists():
        print(f"perfkit: notebook {nb} not found", file=sys.stderr)
        return EXIT_ERROR
    params: dict[str, Any] = {}
    if a.params:
        from perfkit.params import ParamsError, load_params

        try:
            sp = load_params(a.params)
        except ParamsError as exc:
            print(f"perfkit: invalid params:\n{exc}", file=sys.stderr)
            return EXIT_ERROR
        from perfkit.suite import notebook_parameters

        params.update(notebook_parameters(nb.stem, sp, Path("unused")))
        params.pop("run_dir", None)
    try:
        given = _parse_kv(a.p)
        _check_notebook_parameters(nb, given)
    except UsageError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    params.update(given)
    run_dir = Path(params.get("run_dir") or default_out(nb.stem)).resolve()
    params["run_dir"] = str(run_dir)
    out = Path(a.out) if a.out else run_dir / "notebooks" / nb.name
    top = run_dir  # the outermost folder this run creates (removed again when nothing ran)
    while not top.parent.exists():
        top = top.parent
    created = not run_dir.exists()
    r = execute_notebook(nb, out, params, cwd=Path.cwd(), timeout_s=a.timeout)
    print(f"{nb.name}: {r.status} in {r.wall_s:.1f} s -> {out}")
    if r.error:
        print(f"  {r.error}", file=sys.stderr)
        if created and top.exists() and not any(f.is_file() for f in top.rglob("*")):
            import shutil

            shutil.rmtree(top, ignore_errors=True)  # nothing ran: leave no empty run directory
        return EXIT_ERROR
    from perfkit.gate.verdicts import read_verdict

    v = read_verdict(run_dir / nb.stem)
    if v and v.get("status") == "fail":
        return EXIT_REGRESSION
    return EXIT_OK


def cmd_report(a: argparse.Namespace) -> int:
    from perfkit import report

    run = Path(a.run)
    if not run.is_dir():
        print(f"perfkit: {run} is not a run directory", file=sys.stderr)
        return EXIT_ERROR
    report.write_summary(run)
    html = report.render_report(run, a.out)
    print(f"report: {html}")
    if a.screenshot:
        try:
            print(f"screenshot: {report.screenshot(html, run / 'report.png')}")
        except Exception as exc:  # noqa: BLE001
            print(f"perfkit: no screenshot: {exc}", file=sys.stderr)
    return EXIT_OK


def _compare_cases(run: Path, case: str | None) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Case id -> scenario entry for what ``--run`` names, and its hardware label (None: unknown).

    A perfkit run directory (as before), a bundle directory (``meta.json``), a performance.log
    (sglang's per-request JSON lines) or a perf dump JSON (sglang's ``--perf-dump-path``).
    Raises OSError/ValueError (RecordError, BaselineError) for unreadable input.
    """
    from perfkit.bundle import ResultBundle
    from perfkit.gate import baseline as bl
    from perfkit.gate.run import run_cases, run_hardware
    from perfkit.readings import perfdump, records

    if run.is_dir():
        if (run / "meta.json").exists():
            b = ResultBundle.load(run)
            cid = case or b.scenario
            return {cid: bl.from_bundle(b, cid)}, b.meta.get("gpu_name")
        cases = run_cases(run)
        if cases or not (run / "performance.log").exists():
            return cases, run_hardware(run)
        run = run / "performance.log"
    if not run.exists():
        raise FileNotFoundError(f"{run}: no such file or directory")
    text = run.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    cid = case or run.stem
    if isinstance(obj, dict) and perfdump.is_perf_dump(obj):
        return {cid: bl.entry_from_records([perfdump.loads_perf_dump(text, str(run)).to_record()])}, None
    recs = records.parse_lines(
        text.splitlines(keepends=True), partial_last=False, source=str(run), strict=True
    ).records
    recs = [r for r in recs if not r.is_warmup]
    return ({cid: bl.entry_from_records(recs)} if recs else {}), None


def _compare_dumps(a: argparse.Namespace) -> int:
    from perfkit.readings import perfdump

    try:
        before = perfdump.read_perf_dump(a.before)
        after = perfdump.read_perf_dump(a.after)
    except (OSError, ValueError) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    c = perfdump.compare_dumps(before, after)
    print(perfdump.dump_comparison_markdown(c))
    if c.verdict == "error":
        print(
            f"perfkit: nothing comparable between {a.before} and {a.after} (no E2E and no "
            f"stage measured on both sides)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    for r in c.regressions:
        print(f"regression: {r.name} {r.before:.2f} ms -> {r.after:.2f} ms", file=sys.stderr)
    print(f"compare: {c.verdict.upper()}")
    return EXIT_REGRESSION if c.verdict == "fail" else EXIT_OK


def cmd_compare(a: argparse.Namespace) -> int:
    from perfkit.gate import baseline as bl

    if a.before or a.after:
        if not (a.before and a.after) or a.run or a.baseline:
            print(
                "perfkit: compare takes --before A.json --after B.json, or --run and --baseline",
                file=sys.stderr,
            )
            return EXIT_ERROR
        return _compare_dumps(a)
    if not (a.run and a.baseline):
        print("perfkit: compare needs --run and --baseline (or --before and --after)", file=sys.stderr)
        return EXIT_ERROR
    try:
        ref = bl.load_baseline(a.baseline)
    except (OSError, bl.BaselineError) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        cases, hardware = _compare_cases(Path(a.run), a.case)
    except (OSError, ValueError) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not cases:
        print(f"perfkit: no cases in {a.run} (no baseline.json, bundles nor records)", file=sys.stderr)
        return EXIT_ERROR
    try:
        rows = bl.compare(cases, ref, profile=a.profile, strict=a.strict)
    except KeyError as exc:
        print(f"perfkit: {exc.args[0]}", file=sys.stderr)
        return EXIT_ERROR
    except bl.BaselineError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    overlap, warnings = bl.check_overlap(cases, ref, source=str(a.baseline), run_hardware=hardware)
    for w in warnings:
        print(f"perfkit: warning: {w}", file=sys.stderr)
    df = check_table([*overlap, *rows])
    shown = df.astype(object).where(df.notna(), "–")  # not measured: "–", never 0
    print(check_markdown(shown))
    status = overall_status(df)
    print(f"compare: {status.upper()}")
    # no common case: a failing "cases compared" row, exit 1 (tests/test_preflight.py keeps this)
    return EXIT_REGRESSION if status == "fail" else EXIT_OK


def cmd_baseline_update(a: argparse.Namespace) -> int:
    from perfkit.gate import baseline as bl

    try:
        doc = bl.update_baseline(
            a.bundle, a.baseline, a.case, hardware=a.hardware, launch=a.launch, num_frames=a.num_frames
        )
    except (OSError, ValueError) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    e = doc["scenarios"][a.case]
    print(f"{a.baseline}: case {a.case} updated (e2e {e.get('expected_e2e_ms')} ms)")
    return EXIT_OK


def cmd_engine_serve(rest: list[str]) -> int:
    argv = [sys.executable, "-m", "perfkit.refengine", *rest]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return EXIT_ERROR  # pragma: no cover


def cmd_wheelhouse(a: argparse.Namespace) -> int:
    from perfkit import wheelhouse

    try:
        if a.wcmd == "download":
            reqs = wheelhouse.download(
                a.dir,
                a.have,
                python_version=a.python_version,
                profile=a.profile,
                platforms=tuple(a.platform) if a.platform else wheelhouse.DEFAULT_PLATFORMS,
            )
            print(f"{len(reqs)} wheels in {a.dir}: {' '.join(reqs)}")
            print(
                "on the host: python3 -m pip install --no-index --no-deps "
                f"{a.dir}/*.whl   (or: perfkit wheelhouse install {a.dir})"
            )
        else:
            wheelhouse.install(a.dir, a.target)
    except (RuntimeError, FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perfkit",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 pass, 1 regression, 2 error",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("suite", help="run the investigation notebooks and gate the run")
    s.add_argument("--params", required=True, help="params YAML (see params/)")
    s.add_argument("--out", help="run directory (default outputs/<name>-<timestamp>)")
    s.add_argument("--replay", help="a run directory whose bundles are replayed (no launch)")
    s.add_argument(
        "--only",
        action="append",
        choices=list(registry.names()),
        help="run only this investigation (repeatable); the gate always runs",
    )
    s.add_argument("--notebooks", help=argparse.SUPPRESS)  # tests: another notebooks folder
    s.add_argument(
        "--force", action="store_true", help="--out may hold an earlier run: its outputs are removed first"
    )
    s.add_argument("--no-screenshot", action="store_true", help="skip the report screenshot")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_suite)

    r = sub.add_parser("run", help="run one notebook with papermill")
    r.add_argument("notebook")
    r.add_argument(
        "-p",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter (value parsed as YAML); repeatable",
    )
    r.add_argument("--params", help="take the notebook's parameters from a params YAML first")
    r.add_argument("--out", help="executed notebook path (default RUN_DIR/notebooks/NAME)")
    r.add_argument("--timeout", type=float, default=None, help="per-cell timeout (s)")
    r.set_defaults(func=cmd_run)

    rp = sub.add_parser("report", help="re-render report.html and summary.md of a run")
    rp.add_argument("run")
    rp.add_argument("--out", help="HTML path (default RUN/report.html)")
    rp.add_argument("--screenshot", action="store_true", help="also save RUN/report.png")
    rp.set_defaults(func=cmd_report)

    c = sub.add_parser("compare", help="compare a run with a baseline file, or two sglang perf dumps")
    c.add_argument(
        "--run", help="a run directory, a bundle directory, a performance.log or an sglang perf dump JSON"
    )
    c.add_argument("--baseline", help="baseline JSON (sglang perf_baselines layout)")
    c.add_argument(
        "--case",
        help="case id for a bundle, performance.log or perf dump "
        "(default: the bundle's scenario / the file's stem)",
    )
    c.add_argument("--profile", default="pr_test")
    c.add_argument("--strict", action="store_true")
    c.add_argument("--before", help="sglang perf dump JSON (--perf-dump-path) of the baseline build")
    c.add_argument("--after", help="sglang perf dump JSON of the new build")
    c.set_defaults(func=cmd_compare)

    b = sub.add_parser("baseline", help="baseline files")
    bsub = b.add_subparsers(dest="bcmd", required=True)
    bu = bsub.add_parser("update", help="write one case from a bundle into a baseline file")
    bu.add_argument("--bundle", required=True)
    bu.add_argument("--baseline", required=True)
    bu.add_argument("--case", required=True)
    bu.add_argument("--hardware", help="must match the file's metadata.hardware when it has one")
    bu.add_argument("--launch", help="the launch to take (bundles of several launches: warmup17, cap1, ...)")
    bu.add_argument("--num-frames", type=int, help="one request shape of a launch that sent several shapes")
    bu.set_defaults(func=cmd_baseline_update)

    m = sub.add_parser(
        "measure",
        help="run the investigations into bundles without notebooks (GPU hosts without Jupyter)",
        add_help=False,
    )
    m.set_defaults(func=None)

    w = sub.add_parser("wheelhouse", help="offline wheels for air-gapped hosts")
    wsub = w.add_subparsers(dest="wcmd", required=True)
    wd = wsub.add_parser("download", help="download wheels of what a host lacks")
    wd.add_argument("dir")
    wd.add_argument("--have", help="the host's `pip list --format=freeze` (names it already has)")
    wd.add_argument("--python-version", default="3.12", help="the host's Python (default 3.12)")
    wd.add_argument(
        "--platform", action="append", help="pip platform tag (repeatable; default manylinux x86_64)"
    )
    wd.add_argument(
        "--profile",
        choices=["full", "measure"],
        default="full",
        help="full: everything perfkit needs; measure: engine + investigations only",
    )
    wd.set_defaults(func=cmd_wheelhouse)
    wi = wsub.add_parser("install", help="install a wheelhouse offline (on the host)")
    wi.add_argument("dir")
    wi.add_argument("--target", help="install into this folder (then add it to PYTHONPATH)")
    wi.set_defaults(func=cmd_wheelhouse)

    e = sub.add_parser("engine", help="engines")
    esub = e.add_subparsers(dest="ecmd", required=True)
    es = esub.add_parser(
        "serve", help="run the reference engine (python -m perfkit.refengine)", add_help=False
    )
    es.set_defaults(func=None)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `perfkit engine serve ARGS...`: everything after `serve` goes to the engine untouched
    if len(argv) >= 2 and argv[0] == "engine" and argv[1] == "serve":
        return cmd_engine_serve(argv[2:])
    if argv and argv[0] == "measure":
        from perfkit.measure import main as measure_main

        return measure_main(argv[1:])
    a = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(a.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(a.func(a))
    except KeyboardInterrupt:
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
