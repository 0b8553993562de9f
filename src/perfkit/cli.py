"""The perfkit command: run, gate and report diffusion video serving investigations.

One command line (click) for every task; ``perfkit COMMAND --help`` describes each option.
Exit codes, one rule for every command: 0 pass, 1 a regression or a failed check, 2 an error or
misuse (bad input, a missing file, nothing comparable, a run that never started).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from perfkit.checks import check_markdown, check_table, overall_status
from perfkit.gate.verdicts import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REGRESSION,
    nothing_compared,
    nothing_measured_reason,
)
from perfkit.gate.verdicts import notebooks as notebook_names
from perfkit.measure import investigations, measure_command

log = logging.getLogger("perfkit")

EXIT_CODES = "Exit codes: 0 pass, 1 a regression or a failed check, 2 an error or misuse."


class UsageError(ValueError):
    """A bad command line (``-p`` without ``=``, unparsable value, unknown parameter): exit 2."""


def _parse_kv(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items -> {key: value read as YAML 1.2 (``1e3`` is a number)}.
    Raises :class:`UsageError`."""
    import yaml

    from perfkit.params import load_yaml

    out: dict[str, Any] = {}
    for it in items or []:
        if "=" not in it:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r} (empty key)")
        try:
            out[k] = load_yaml(v) if v != "" else ""
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            shown = repr(v) if len(v) <= 80 else repr(v[:60]) + f"… ({len(v):,} characters)"
            raise UsageError(
                f"-p {k}: value {shown} is not valid YAML ({where}); quote strings "
                f"with special characters, e.g. -p '{k}=\"...\"'"
            ) from None
    return out


def _sigterm_as_interrupt() -> None:
    """SIGTERM (CI cancel, ``timeout``) stops the run like Ctrl-C: engines torn down, report
    written. This process also becomes the owner of everything it starts
    (:func:`perfkit.engine.owner.become_subreaper`: orphans below it come back to it)."""
    import signal

    from perfkit.engine.owner import become_subreaper

    become_subreaper()

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


def _declares(nb: Path, name: str) -> bool:
    """Whether notebook ``nb``'s parameters cell declares ``name`` (False when unreadable)."""
    import papermill as pm

    try:
        return name in pm.inspect_notebook(str(nb))
    except Exception:  # noqa: BLE001 - _check_notebook_parameters already named the problem
        return False


def _executor_options(a: SimpleNamespace) -> dict[str, Any]:
    """Keyword options for the chosen executor: ``address`` for Ray, when given."""
    return {"address": a.address} if a.executor == "ray" and a.address else {}


def cmd_partition(a: SimpleNamespace) -> int:
    """``perfkit suite --partition I/N``: shard I's units into bundles and a shard manifest."""
    from perfkit.params import ParamsError
    from perfkit.scaleout.executor import ExecutorError
    from perfkit.scaleout.shards import MANIFEST, ShardInterrupted, run_shard
    from perfkit.scaleout.units import PartitionError, parse_partition

    try:
        i, n = parse_partition(a.partition)
    except PartitionError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if a.replay:
        print("perfkit: --partition measures; it cannot be combined with --replay", file=sys.stderr)
        return EXIT_ERROR
    if not a.out:
        print("perfkit: --partition needs --out (the shard's output directory)", file=sys.stderr)
        return EXIT_ERROR
    out = Path(a.out)
    if (out / MANIFEST).exists() and not a.force:
        print(
            f"perfkit: --out {out} already holds a shard ({MANIFEST}): pass --force to replace it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        m = run_shard(
            a.params,
            out,
            i,
            n,
            only=a.only,
            tier=a.tier,
            executor=a.executor or "inprocess",
            executor_options=_executor_options(a),
            progress=not a.quiet,
        )
    except (ParamsError, ExecutorError, ValueError, FileNotFoundError, ShardInterrupted) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    bad = [o for o in m["outcomes"] if o["status"] != "ok"]
    for o in m["outcomes"]:
        print(f"  {o['unit_id']:30s} {o['status']:6s} {o['wall_s'] or 0:9.1f} s  {o.get('error') or ''}")
    print(f"perfkit suite --partition {i}/{n}: {len(m['outcomes'])} unit(s), {len(bad)} failed")
    print(f"  manifest: {out / MANIFEST}")
    return EXIT_ERROR if bad else EXIT_OK


def cmd_merge(a: SimpleNamespace) -> int:
    """``perfkit merge DIR... --out RUN``: join shards, then notebooks (replay), gate, report."""
    _sigterm_as_interrupt()
    from perfkit.params import ParamsError
    from perfkit.suite import SuiteError, merge_runs

    try:
        res = merge_runs(
            a.dirs,
            a.out,
            params_path=a.params,
            notebooks=a.notebooks,
            screenshot=not a.no_screenshot,
            progress=not a.quiet,
            force=a.force,
            allow_mixed_commits=a.allow_mixed_commits,
        )
    except (ParamsError, SuiteError, FileNotFoundError) as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return _print_result(res, "perfkit merge")


def cmd_suite(a: SimpleNamespace) -> int:
    _sigterm_as_interrupt()
    from perfkit.params import ParamsError
    from perfkit.scaleout.executor import ExecutorError
    from perfkit.suite import SuiteError, run_suite, run_units_suite

    if a.address and a.executor != "ray":
        print(f"perfkit: --address {a.address} is ignored: it is for --executor ray", file=sys.stderr)
    if a.partition is not None:
        return cmd_partition(a)
    common = dict(
        only=a.only,
        tier=a.tier,
        notebooks=a.notebooks,
        screenshot=not a.no_screenshot,
        progress=not a.quiet,
        force=a.force,
    )
    try:
        if a.executor is not None:
            if a.replay:
                print("perfkit: --executor measures; it cannot be combined with --replay", file=sys.stderr)
                return EXIT_ERROR
            res = run_units_suite(
                a.params,
                a.out,
                executor=a.executor,
                executor_options=_executor_options(a),
                **common,
            )
        else:
            res = run_suite(a.params, a.out, replay=a.replay, **common)
    except ExecutorError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ParamsError as exc:
        print(f"perfkit: invalid params:\n{exc}", file=sys.stderr)
        return EXIT_ERROR
    except SuiteError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except FileNotFoundError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return _print_result(res, "perfkit suite")


def _print_result(res: Any, command: str) -> int:
    """Print a suite result (each notebook's gate result, the status, where the report is);
    return its exit code."""
    from perfkit.gate.outcome import gate_result
    from perfkit.gate.verdicts import read_verdict

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
    return res.exit_code


def _run_with_bars(nb: Path, out: Path, params: dict[str, Any], a: SimpleNamespace):
    """Execute the notebook; on a terminal, draw its requests' progress from the kernel's events
    (:class:`perfkit.scenarios.progress.RunBars`; the estimate from the scenario's plan)."""
    from perfkit.scenarios import registry
    from perfkit.scenarios.progress import RunBars
    from perfkit.suite import execute_notebook

    plan: list[int] = []
    if nb.stem in registry.names() and not params.get("bundle_dir"):
        s = registry.get(nb.stem)
        fields = s.params_model.model_fields
        try:
            sec = s.params_model.model_validate({k: v for k, v in params.items() if k in fields})
            plan = list(s.plan(sec)) if s.plan is not None else []
        except ValueError:
            plan = []
    planned = sum(plan)
    pfile = out.with_suffix(".progress.jsonl")
    bars = RunBars(sys.stderr, len(plan), planned, enabled=planned > 0 and sys.stderr.isatty())
    # this process owns what the kernel starts (perfkit.engine.owner): ended here if it outlives it
    from perfkit.engine.owner import REGISTRY_ENV, Watch, become_subreaper, describe

    become_subreaper()
    registry_file = out.with_suffix(".processes.jsonl")
    watch = Watch.start(registry_file)
    old_env = os.environ.get(REGISTRY_ENV)
    os.environ[REGISTRY_ENV] = str(registry_file)
    try:
        with bars.watch(pfile, nb.stem, planned):
            r = execute_notebook(nb, out, params, cwd=Path.cwd(), timeout_s=a.timeout, progress_file=pfile)
    finally:
        bars.close()
        if old_env is None:
            os.environ.pop(REGISTRY_ENV, None)
        else:
            os.environ[REGISTRY_ENV] = old_env
        left = watch.reap()
    if left and r.status == "error":
        r.error = f"{r.error}\n{describe(left)}"
    return r


def cmd_run(a: SimpleNamespace) -> int:
    from perfkit.suite import default_out, outputs_base

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
    from perfkit.nbparams import validate
    from perfkit.params import ParamsError

    try:
        given = _parse_kv(a.p)
        _check_notebook_parameters(nb, given)
        given = validate(nb.stem, given)
    except UsageError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ParamsError as exc:
        print(f"perfkit: invalid parameters for {nb.name}:\n{exc}", file=sys.stderr)
        return EXIT_ERROR
    params.update(given)
    if _declares(nb, "fail_on") and "fail_on" not in given:
        params["fail_on"] = "never"  # the exit code comes from verdict.json (printed below)
    if params.get("run_dir"):
        run_dir = Path(params["run_dir"]).resolve()
        top = run_dir  # the outermost folder this run creates (removed again when nothing ran)
        while not top.parent.exists():
            top = top.parent
        created = not run_dir.exists()
    else:  # a new outputs/<notebook>/<timestamp>/, made (empty) by default_out
        base = outputs_base(nb.stem).resolve()
        top = None
        if not base.exists():  # remove what this run creates, outputs/ included, if nothing ran
            top = base
            while not top.parent.exists():
                top = top.parent
        run_dir = default_out(nb.stem).resolve()
        top = top or run_dir
        created = True
    params["run_dir"] = str(run_dir)
    out = Path(a.out) if a.out else run_dir / "notebooks" / nb.name
    r = _run_with_bars(nb, out, params, a)
    from perfkit.gate.outcome import exit_code, gate_result, verdict_line
    from perfkit.gate.verdicts import read_verdict

    v = read_verdict(run_dir / nb.stem) if r.status == "ok" else None
    word = gate_result(r.status, v, r.ename)
    print(f"{nb.name}: gate {word} in {r.wall_s:.1f} s -> {out}")
    if v is not None:
        print(f"  {verdict_line(nb.stem, v)}")
    if r.error:
        print(f"  {r.error}", file=sys.stderr)
        if created and top.exists() and not any(f.is_file() for f in top.rglob("*")):
            import shutil

            shutil.rmtree(top, ignore_errors=True)  # nothing ran: leave no empty run directory
        return EXIT_ERROR
    return exit_code(word, v)


def cmd_lab(a: SimpleNamespace) -> int:
    from perfkit.lab import LabError, lab_command, launch, prepare_replay, prepare_run

    if bool(a.run) == bool(a.replay):
        print("perfkit lab: give a run directory or --replay DIR (one of them)", file=sys.stderr)
        return EXIT_ERROR
    try:
        if a.replay:
            if a.only:
                print(f"perfkit lab: executing {', '.join(a.only)} …", file=sys.stderr)
            lab = prepare_replay(a.replay, a.dir, only=a.only or None, execute=not a.no_execute)
        else:
            lab = prepare_run(a.run, a.dir)
    except LabError as exc:
        print(f"perfkit lab: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for nb in lab.notebooks:
        ran = f"executed in {lab.executed[nb.stem]:.1f} s" if nb.stem in lab.executed else "as saved"
        err = f" (raised {lab.errors[nb.stem]})" if nb.stem in lab.errors else ""
        print(f"  {nb.name:22s} {ran}{err}")
    print(f"perfkit lab: {len(lab.notebooks)} notebooks in {lab.dir}")
    if a.no_launch:
        print("  open them with: " + " ".join(lab_command(lab, not a.no_browser)))
        return EXIT_OK
    try:
        return launch(lab, not a.no_browser)
    except LabError as exc:
        print(f"perfkit lab: {exc}", file=sys.stderr)
        return EXIT_ERROR


def cmd_report(a: SimpleNamespace) -> int:
    from perfkit import report

    run = Path(a.run)
    if not run.is_dir():
        print(f"perfkit: {run} is not a run directory", file=sys.stderr)
        return EXIT_ERROR
    if not (run / "run.json").exists() and not any(
        (run / n / "verdict.json").exists() for n in notebook_names()
    ):
        print(f"perfkit: {run} is not a run directory (no run.json and no verdict.json)", file=sys.stderr)
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
    cid = case or run.stem
    with open(run, "rb") as fh:
        head = fh.read(perfdump.MAX_DUMP_BYTES + 1)
    if len(head) <= perfdump.MAX_DUMP_BYTES and perfdump.is_perf_dump(_json_or_none(head)):
        return {cid: bl.entry_from_records([perfdump.read_perf_dump(run).to_record()])}, None
    del head
    # a performance.log: streamed, one record at a time (raw fields dropped), strict UTF-8
    recs = (
        r
        for r in records.iter_perf_log(run, strict=True, keep_raw=False, partial_last=False)
        if isinstance(r, records.PerfRecord) and not r.is_warmup
    )
    try:
        return {cid: bl.entry_from_records(recs)}, None
    except ValueError as exc:
        if isinstance(exc, records.RecordError):
            raise
        return {}, None  # no measured record


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _compare_dumps(a: SimpleNamespace) -> int:
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


def cmd_compare(a: SimpleNamespace) -> int:
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
    except KeyError as exc:  # the profile is not in the file's tolerances: name the file
        print(f"perfkit: {a.baseline}: tolerances: {exc.args[0]}", file=sys.stderr)
        return EXIT_ERROR
    except bl.BaselineError as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    overlap, warnings = bl.check_overlap(cases, ref, source=str(a.baseline), run_hardware=hardware)
    df = check_table([*overlap, *rows])
    for w in warnings:
        print(f"perfkit: {'error' if nothing_compared(df) else 'warning'}: {w}", file=sys.stderr)
    shown = df.astype(object).where(df.notna(), "–")  # not measured: "–", never 0
    print(check_markdown(shown))
    status = overall_status(df)
    if nothing_compared(df) or status == "skipped":
        print(f"compare: ERROR: nothing compared (no case of {a.run} is in {a.baseline})")
        return EXIT_ERROR
    print(f"compare: {status.upper()}")
    return EXIT_REGRESSION if status == "fail" else EXIT_OK


def cmd_baseline_update(a: SimpleNamespace) -> int:
    from perfkit.gate import baseline as bl

    if a.unit_times:
        from perfkit.scaleout.shards import refresh_estimates

        if a.bundle or a.case:
            print(
                "perfkit: --unit-times refreshes estimates only: leave out --bundle/--case", file=sys.stderr
            )
            return EXIT_ERROR
        try:
            written = refresh_estimates(a.baseline, a.unit_times)
        except (OSError, ValueError) as exc:
            print(f"perfkit: {exc}", file=sys.stderr)
            return EXIT_ERROR
        for c, v in written.items():
            print(f"{a.baseline}: case {c} estimated_full_test_time_s {v}")
        if not written:
            print(f"{a.baseline}: no case of these units is in the file (nothing refreshed)")
        return EXIT_OK
    if not a.bundle or not a.case:
        print("perfkit: baseline update needs --bundle and --case (or --unit-times)", file=sys.stderr)
        return EXIT_ERROR
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


def cmd_wheelhouse(a: SimpleNamespace) -> int:
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
            print(f"wheelhouse size: {wheelhouse.wheelhouse_size(a.dir) / 2**20:.1f} MiB")
            print(
                "on the host: python3 -m pip install --no-index --no-deps "
                f"{a.dir}/*.whl   (or: perfkit wheelhouse install {a.dir})"
            )
        else:
            wheelhouse.install(a.dir, a.target)
    except (RuntimeError, FileNotFoundError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _ab_side(path: str, option: str) -> tuple[Any, dict[str, Any] | None]:
    """An ``--a``/``--b`` file -> (EngineSpec, request dict or None). A mapping with an
    ``engine`` key is a params file (validated as one, its ``request`` taken); any other mapping
    is an engine spec. Raises click.BadParameter naming the option and the file."""
    import yaml

    from perfkit.engine.spec import EngineSpec, EngineSpecError
    from perfkit.params import ParamsError, load_params, load_yaml

    p = Path(path)
    if not p.is_file():
        raise click.BadParameter(
            f"{'is a directory, not a file' if p.is_dir() else 'not found'}: {path}", param_hint=option
        )
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise click.BadParameter(
            f"{path}: invalid YAML: {str(exc).splitlines()[0]}", param_hint=option
        ) from None
    except UnicodeDecodeError as exc:  # a binary file given by mistake
        raise click.BadParameter(
            f"{path}: not UTF-8 text (byte {exc.start}): expected an engine spec or a params file (YAML)",
            param_hint=option,
        ) from None
    except OSError as exc:
        raise click.BadParameter(f"{path}: unreadable: {exc.strerror or exc}", param_hint=option) from None
    if not isinstance(data, dict):
        raise click.BadParameter(
            f"{path}: expected an engine spec or a params file (a mapping)", param_hint=option
        )
    try:
        if "engine" in data:
            params = load_params(p)
            return params.engine_spec(), params.request.model_dump(exclude_none=True)
        return EngineSpec.from_dict(data), None
    except (ParamsError, EngineSpecError) as exc:
        raise click.BadParameter(f"{path}:\n{exc}", param_hint=option) from None


def _fraction(text: str | None, option: str) -> float | None:
    """``5%`` or ``0.05`` -> 0.05; raises click.BadParameter outside (0, 1)."""
    if text is None:
        return None
    t = str(text).strip()
    try:
        v = float(t.rstrip("%")) / (100.0 if t.endswith("%") else 1.0)
    except ValueError:
        raise click.BadParameter(
            f"expected a fraction like 0.05 or a percent like 5%, got {text!r}", param_hint=option
        ) from None
    if not 0.0 < v < 1.0:
        raise click.BadParameter(f"must be between 0 and 1 (0 % and 100 %), got {text!r}", param_hint=option)
    return v


def cmd_ab(a: SimpleNamespace) -> int:
    """``perfkit ab``: run (or replay) an A/B, write ab.json, summary.md, report.html; exit code."""
    import datetime as _dt

    from perfkit.ab import stats as ab_stats
    from perfkit.ab.decide import thresholds_from_run
    from perfkit.ab.sequential import decide_sequential, run_sequential
    from perfkit.bundle import ResultBundle
    from perfkit.report.ab import write_ab_outputs

    threshold = _fraction(a.threshold, "--threshold") or ab_stats.DEFAULT_THRESHOLD
    confidence = _fraction(a.confidence, "--confidence")
    thresholds: dict[str, float] = {}
    if a.threshold_from:
        try:
            thresholds = thresholds_from_run(a.threshold_from)
        except (FileNotFoundError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--threshold-from") from None
    gate = _gate_metrics(a.gate_metrics)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if a.replay:
        if a.a or a.b:
            raise click.UsageError("give either --replay DIR_A DIR_B or --a/--b, not both")
        if Path(a.replay[0]).resolve() == Path(a.replay[1]).resolve():
            raise click.BadParameter(
                f"{a.replay[0]} is given as both A and B: an A/B compares two recordings (for an A/A, "
                "record the same spec twice)",
                param_hint="--replay",
            )
        bundles = {}
        for side, d in zip("AB", a.replay):
            try:
                bundles[side] = ResultBundle.load(d)
            except (FileNotFoundError, ValueError) as exc:
                raise click.BadParameter(str(exc), param_hint="--replay") from None
        out = _ab_out(a.out, f"{stamp}-replay")
        design = _ab_design(a, confidence, bundles)
        if gate is None:  # as recorded: the alpha of each look is split over the gated metrics
            recorded = ((bundles["A"].meta.get("ab") or {}).get("sequential") or {}).get("gate_metrics")
            if recorded:
                gate = _gate_metrics([",".join(map(str, recorded))])
    else:
        if not (a.a and a.b):
            raise click.UsageError("give --a and --b (engine spec or params files), or --replay DIR_A DIR_B")
        from perfkit.ab.driver import AbPlan
        from perfkit.engine.client import VideoRequestSpec

        spec_a, req_a = _ab_side(a.a, "--a")
        spec_b, req_b = _ab_side(a.b, "--b")
        if req_a is not None and req_b is not None and req_a != req_b:
            raise click.BadParameter(
                f"the params files ask for different requests ({req_a} vs {req_b}): an A/B compares one shape",
                param_hint="--a/--b",
            )
        req = dict(req_a or req_b or {})
        for key, opt in (("num_frames", a.num_frames), ("height", a.height), ("width", a.width)):
            if opt is not None:
                req[key] = opt
        if a.steps is not None:
            req["num_inference_steps"] = a.steps
        if a.share_compile_cache:
            spec_a, spec_b = (s.replace(share_compile_cache=True) for s in (spec_a, spec_b))
        design = _ab_design(a, confidence, None)
        out = _ab_out(a.out, stamp)
        profile = None
        if a.profile:
            from pydantic import ValidationError

            from perfkit.scenarios.profiled import ProfileParams

            try:
                profile = ProfileParams(
                    steps=a.profile_steps, all_stages=a.profile_all_stages, warm=a.profile_warm
                )
            except ValidationError as exc:  # its messages, without pydantic's prefix
                msg = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
                raise click.BadParameter(msg, param_hint="--profile-steps") from None
        plan = AbPlan(
            spec_a, spec_b, VideoRequestSpec.from_dict(req), design.min_launches, a.warm, profile=profile
        )
        _sigterm_as_interrupt()
        bundles = run_sequential(plan, design, out, threshold, thresholds, gate)
    try:
        res = decide_sequential(
            bundles["A"], bundles["B"], design, threshold, thresholds, gate=gate, undecided=a.undecided
        )
    except ValueError as exc:
        kept = "" if a.replay else f" (the launches are kept: --replay {out / 'a'} {out / 'b'})"
        raise click.BadParameter(f"{exc}{kept}", param_hint="--gate-metrics") from None
    res.meta["replay"] = bool(a.replay)
    if a.threshold_from:
        res.meta["thresholds_from"] = str(a.threshold_from)
    paths = write_ab_outputs(res, out)
    if not a.quiet:
        print(paths["summary"].read_text())
        print(f"report: {paths['report']}")
    if res.exit_code == 2:  # say why on stderr too, -q or not
        why = [
            x[2:]
            for x in paths["summary"].read_text().splitlines()
            if x.startswith(("- nothing", "- launch failed"))
        ]
        print(f"perfkit ab: error: {'; '.join(why) or 'see ' + str(paths['summary'])}", file=sys.stderr)
    seq = res.meta.get("sequential") or {}
    if res.undecided:  # the launches it would need, on stderr too, -q or not
        need = seq.get("launches_needed") or {}
        print(
            f"perfkit ab: {'undecided' if res.exit_code else 'undecided, passed by --undecided pass'}: "
            + "; ".join(
                f"{m} still inconclusive"
                + (f", about {need[m]} launches a side would decide it" if need.get(m) else "")
                for m in res.undecided
            ),
            file=sys.stderr,
        )
    return res.exit_code


def _ab_design(a: SimpleNamespace, confidence: float | None, bundles: dict[str, Any] | None) -> Any:
    """The sequential design from the options; a replay's unset ones from the recording (its
    meta ``ab.sequential``, else one look at its launches a side: the fixed-N A/B it was).

    Raises:
        click.BadParameter: a design out of range (the option is named).
    """
    from perfkit.ab import sequential as sq

    rec: dict[str, Any] = {}
    if bundles is not None:
        rec = dict((bundles["A"].meta.get("ab") or {}).get("sequential") or {})
        if not rec:
            per = min(len(bundles["A"].launches), len(bundles["B"].launches))
            rec = {"min_launches": max(2, min(sq.DEFAULT_MIN_LAUNCHES, per)), "max_launches": max(2, per)}
    lo = a.launches or rec.get("min_launches") or sq.DEFAULT_MIN_LAUNCHES
    hi = a.max_launches or rec.get("max_launches") or max(sq.DEFAULT_MAX_LAUNCHES, lo)
    try:
        return sq.Design(
            min_launches=int(lo),
            max_launches=int(hi),
            confidence=confidence or float(rec.get("confidence") or sq.stats.DEFAULT_CONFIDENCE),
            spending=a.spending or rec.get("spending") or "pocock",
            slow_rule=a.slow_spells or rec.get("slow_rule") or "replace",
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-n/--launches, --max-launches") from None


def _ab_out(given: str | None, stamp: str) -> Path:
    """The ab run directory: ``--out`` (refused when it is a file or a non-empty directory: a
    replay must not overwrite a run, e.g. the A/A its thresholds come from), else a new
    ``outputs/ab/<stamp>`` (``-2``, ``-3``, … when that is taken).

    Raises:
        click.BadParameter: ``--out`` is a file or a non-empty directory.
    """
    if given:
        out = Path(given)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            what = "is a file" if not out.is_dir() else "exists and is not empty"
            raise click.BadParameter(f"{out} {what}", param_hint="--out")
        return out
    out, k = Path("outputs") / "ab" / stamp, 1
    while out.exists():
        k += 1
        out = Path("outputs") / "ab" / f"{stamp}-{k}"
    return out


def _gate_metrics(texts: Any) -> list[str] | None:
    """``--gate-metrics``: comma-separated metric names, each a fixed A/B metric
    (:data:`perfkit.ab.metrics.METRIC_UNITS`) or an sglang stage name (``…Stage``); None: all.

    Raises:
        click.BadParameter: empty, or a name that is neither.
    """
    if not texts:
        return None
    import difflib

    from perfkit.ab.metrics import METRIC_UNITS
    from perfkit.readings.stages import KNOWN_STAGES

    texts = [texts] if isinstance(texts, str) else list(texts)  # the option may be given twice
    names = list(dict.fromkeys(x.strip() for t in texts for x in str(t).split(",") if x.strip()))
    if not names:
        raise click.BadParameter("no metric named", param_hint="--gate-metrics")
    known = [*METRIC_UNITS, *KNOWN_STAGES]
    for x in names:
        if x not in METRIC_UNITS and not x.endswith("Stage"):
            near = [k for k in known if k.lower() == x.lower()] or difflib.get_close_matches(
                x, known, n=1, cutoff=0.6
            )
            raise click.BadParameter(
                f"unknown metric {x!r}"
                + (f" (did you mean {near[0]}? names are case-sensitive)" if near else "")
                + f"; metrics: {', '.join(METRIC_UNITS)} or a stage such as DenoisingStage",
                param_hint="--gate-metrics",
            )
    return names


# --------------------------------------------------------------------------------- command line
def _done(code: int) -> None:
    sys.exit(int(code))


def _existing_file(kind: str):
    """A click callback: the path must be an existing file, else exit 2 naming it."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            what = "is a directory, not a file" if Path(value).is_dir() else "not found"
            raise click.BadParameter(f"{kind} {what}: {value}")
        return value

    return check


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Examples:\n\n"
    "\b\n"
    "  perfkit suite --params params/ci-cpu.yaml\n"
    "  perfkit suite --params params/h200.yaml --replay examples/h200/bundles\n"
    "  perfkit compare --run outputs/ci-cpu/latest --baseline baselines/h200.json\n"
    "  perfkit run notebooks/NOTEBOOK.ipynb -p repeats=3\n\n" + EXIT_CODES,
)
@click.option("-v", "--verbose", count=True, help="more logging (-vv: debug)")
def cli(verbose: int) -> None:
    """perfkit: performance investigations of diffusion video serving engines."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command("suite", epilog=EXIT_CODES + " The report is written in every case.")
@click.option(
    "--params",
    "params",
    required=True,
    callback=_existing_file("params file"),
    help="params YAML (see params/)",
)
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
    help="run only this investigation (repeatable, or a comma list); the gate always runs",
)
@click.option(
    "--tier",
    type=click.Choice(["per-commit", "extra"]),
    default=None,
    help="run only the investigations of this tier (params: <section>.tier)",
)
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="run shard I of N (1-based) of the units of work: bundles and OUT/shard.json only, "
    "no notebooks; join the shards with perfkit merge",
)
@click.option(
    "--executor",
    type=click.Choice(["inprocess", "ray"]),
    default=None,
    help="run the units of work through this executor, then replay them into the report "
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
    _done(cmd_suite(SimpleNamespace(**kw)))


@cli.command("merge", epilog=EXIT_CODES + " A missing shard or a failed unit is an error (2).")
@click.argument("dirs", nargs=-1, required=True)
@click.option("--out", required=True, help="the merged run directory")
@click.option(
    "--params",
    default=None,
    callback=_existing_file("params file"),
    help="params YAML the shards must have run (default: the shards' own)",
)
@click.option("--notebooks", default=None, hidden=True, help="another notebooks folder (tests)")
@click.option("--force", is_flag=True, help="--out may hold an earlier run: its outputs are removed first")
@click.option(
    "--allow-mixed-commits",
    is_flag=True,
    help="merge shards measured at different commits (each unit's commit is shown); otherwise an error (2)",
)
@click.option("--no-screenshot", is_flag=True, help="skip the report screenshot")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar")
def merge_command(**kw: Any) -> None:
    """Join the outputs of perfkit suite --partition shards into one run: notebooks (replay),
    gate, report."""
    _done(cmd_merge(SimpleNamespace(**kw)))


@cli.command(
    "run",
    epilog="Example: perfkit run notebooks/NOTEBOOK.ipynb -p repeats=3 -p run_dir=outputs/try. " + EXIT_CODES,
)
@click.argument("notebook")
@click.option(
    "-p",
    "p",
    multiple=True,
    metavar="KEY=VALUE",
    help="a notebook parameter (value read as YAML; validated before the kernel starts); repeatable",
)
@click.option(
    "--params",
    default=None,
    callback=_existing_file("params file"),
    help="take the notebook's parameters from a params YAML first",
)
@click.option("--out", default=None, help="executed notebook path (default RUN_DIR/notebooks/NAME)")
@click.option("--timeout", type=float, default=None, help="per-cell timeout (s)")
def run_command(**kw: Any) -> None:
    """Run one notebook with papermill (its parameters validated by the same models as a params file)."""
    _done(cmd_run(SimpleNamespace(**kw)))


@cli.command(
    "lab",
    epilog="Examples: perfkit lab outputs/ci-cpu/latest; perfkit lab --replay examples/h200/bundles. "
    + EXIT_CODES,
)
@click.argument("run", required=False)
@click.option(
    "--replay",
    default=None,
    metavar="DIR",
    help="fresh copies of the investigation notebooks bound to the bundles in DIR (launches nothing)",
)
@click.option(
    "--dir",
    "dir",
    default=None,
    help="the lab directory (default outputs/lab/<time>); must be outside the tracked tree",
)
@click.option("--only", multiple=True, help="with --replay: only this investigation (repeatable)")
@click.option("--no-execute", is_flag=True, help="with --replay: copy and bind the notebooks, run none")
@click.option("--no-browser", is_flag=True, help="start JupyterLab without opening a browser")
@click.option("--no-launch", is_flag=True, help="prepare the notebooks and print the JupyterLab command only")
def lab_command(**kw: Any) -> None:
    """Open JupyterLab on a run's executed notebooks, or on notebooks bound to recorded bundles,
    outside the tracked tree (the tracked notebooks/ are never opened or saved)."""
    _done(cmd_lab(SimpleNamespace(**kw)))


@cli.command("report", epilog=EXIT_CODES)
@click.argument("run")
@click.option("--out", default=None, help="HTML path (default RUN/report.html)")
@click.option("--screenshot", is_flag=True, help="also save RUN/report.png (needs chromium)")
def report_command(**kw: Any) -> None:
    """Re-render report.html and summary.md of a run directory."""
    _done(cmd_report(SimpleNamespace(**kw)))


@cli.command("figures")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--root",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="directory the blocks' src= paths are relative to (default: the perfkit checkout)",
)
@click.option("--check", is_flag=True, help="change nothing; exit 1 when a block differs from its bundles")
def figures_command(files: tuple[str, ...], root: str | None, check: bool) -> None:
    """Regenerate the '<!-- perfkit:figures src=DIR kind=KIND -->' blocks of Markdown FILES
    from the bundles under DIR (figures in docs come from the data).

    \b
    KIND: key-numbers, full (a bundle's key numbers / all its figures),
    compare (vs=DIR2: two bundles side by side), ab-power (a recorded A/B power
    pool; attributes threshold=0.01 confidence=0.95), overhead-pooled
    (src=DIR1,DIR2,...: the overhead scenario's ABBA pairs of several launches).

    Exit codes: 0 up to date (or rewritten), 1 --check found a stale block, 2 a bad block or a
    src without results."""
    from perfkit.common.provenance import repo_root
    from perfkit.report.figures import FiguresError, update_file

    base = Path(root) if root else repo_root()
    stale = []
    try:  # every file is rendered before any is written: one bad block leaves all files as they were
        stale = [f for f in files if update_file(f, base, check=True)]
        if not check:
            for f in stale:
                update_file(f, base)
    except (FiguresError, OSError, ValueError) as exc:
        click.echo(f"perfkit figures: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    for f in files:
        if f in stale:
            click.echo(f"{f}: {'stale (differs from its bundles)' if check else 'regenerated'}")
        else:
            click.echo(f"{f}: up to date")
    sys.exit(1 if check and stale else EXIT_OK)


@cli.command(
    "compare",
    epilog="Examples: perfkit compare --run outputs/RUN --baseline baselines/h200.json; "
    "perfkit compare --before before.json --after after.json. "
    + EXIT_CODES
    + " Nothing in common with the baseline is an error (2).",
)
@click.option(
    "--run",
    default=None,
    help="a run directory, a bundle directory, a performance.log or an sglang perf dump JSON",
)
@click.option(
    "--baseline",
    default=None,
    callback=_existing_file("baseline file"),
    help="baseline JSON (sglang perf_baselines layout)",
)
@click.option(
    "--case",
    default=None,
    help="case id for a bundle, performance.log or perf dump (default: the bundle's "
    "investigation / the file's stem)",
)
@click.option("--profile", default="pr_test", show_default=True, help="tolerance profile of the baseline")
@click.option("--strict", is_flag=True, help="a case missing from the baseline fails instead of being 'new'")
@click.option(
    "--before",
    default=None,
    callback=_existing_file("perf dump"),
    help="sglang perf dump JSON (--perf-dump-path) of the reference build",
)
@click.option(
    "--after",
    default=None,
    callback=_existing_file("perf dump"),
    help="sglang perf dump JSON of the changed build",
)
def compare_command(**kw: Any) -> None:
    """Compare a run with a baseline file (sglang's rule), or two sglang perf dumps."""
    _done(cmd_compare(SimpleNamespace(**kw)))


@cli.group("baseline")
def baseline_group() -> None:
    """Baseline files (sglang perf_baselines layout)."""


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
@click.option(
    "--launch", default=None, help="the launch to take (bundles of several launches: warmup17, cap1, ...)"
)
@click.option(
    "--num-frames", type=int, default=None, help="one request shape of a launch that sent several shapes"
)
def baseline_update_command(**kw: Any) -> None:
    """Write one case, derived from a bundle, into a baseline file (atomically)."""
    _done(cmd_baseline_update(SimpleNamespace(**kw)))


@cli.group("wheelhouse")
def wheelhouse_group() -> None:
    """Offline wheels for air-gapped GPU hosts."""


@wheelhouse_group.command("download", epilog=EXIT_CODES)
@click.argument("dir")
@click.option("--have", default=None, help="the host's `pip list --format=freeze` (names it already has)")
@click.option("--python-version", default="3.12", show_default=True, help="the host's Python")
@click.option("--platform", multiple=True, help="pip platform tag (repeatable; default manylinux x86_64)")
@click.option(
    "--profile",
    type=click.Choice(["full", "measure", "ray", "measure+ray"]),
    default="full",
    show_default=True,
    help="full: everything perfkit needs; measure: engine + investigations only; ray: Ray (slimmed: "
    "Ray Core: no Java worker, dashboard web UI or AI libraries) and its missing requirements",
)
def wheelhouse_download_command(**kw: Any) -> None:
    """Download wheels of what a host lacks, for its Python."""
    _done(cmd_wheelhouse(SimpleNamespace(wcmd="download", **kw)))


@wheelhouse_group.command("install", epilog=EXIT_CODES)
@click.argument("dir")
@click.option("--target", default=None, help="install into this folder (then add it to PYTHONPATH)")
def wheelhouse_install_command(**kw: Any) -> None:
    """Install a wheelhouse offline (on the host)."""
    _done(cmd_wheelhouse(SimpleNamespace(wcmd="install", **kw)))


@cli.group("engine")
def engine_group() -> None:
    """Engines."""


@engine_group.command(
    "serve",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    epilog="Every argument goes to the reference engine (python -m perfkit.refengine); "
    "`perfkit engine serve --help` prints the engine's own options.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def engine_serve_command(args: tuple[str, ...]) -> None:
    """Run the reference engine (sglang serve's flags: --model-path, --port, --num-gpus, ...)."""
    _done(cmd_engine_serve(list(args)))


@cli.command(
    "ab",
    epilog="Examples:\n\n\b\n"
    "  perfkit ab --a a.yaml --b b.yaml -n 4 -m 5 --out outputs/ab/pr123\n"
    "  perfkit ab --a a.yaml --b a.yaml --out outputs/ab/aa     # A/A: the noise floor\n"
    "  perfkit ab --a a.yaml --b b.yaml --threshold-from outputs/ab/aa\n"
    "  perfkit ab --replay outputs/ab/pr123/a outputs/ab/pr123/b\n"
    "  perfkit ab --a a.yaml --b b.yaml -n 3 --max-launches 10 -m 5 --threshold 1% "
    "--gate-metrics DenoisingStage,warm_e2e\n\n"
    "It launches -n a side, then adds interleaved pairs until every gated metric is decided "
    "(alpha spending keeps the false-alarm rate over the looks) or --max-launches.\n\n"
    "Exit codes: 0 every gated metric decided, none regressed; 1 a gated metric regressed, or "
    "is still undecided at --max-launches (unless --undecided pass); every metric gates unless "
    "--gate-metrics names some; 2 an error or misuse (bad input, a failed launch, no gated metric "
    "measured on both sides).",
)
@click.option("--a", "a", default=None, metavar="FILE", help="side A: an engine spec YAML or a params file")
@click.option(
    "--b",
    "b",
    default=None,
    metavar="FILE",
    help="side B: an engine spec YAML or a params file (A again: A/A)",
)
@click.option(
    "-n",
    "--launches",
    type=click.IntRange(2, 100),
    default=None,
    help="launches a side before the first look (interleaved A B B A ...; default 3, a replay: as recorded)",
)
@click.option(
    "--max-launches",
    type=click.IntRange(2, 100),
    default=None,
    help="launches run a side at most (slow-spell replacements count); until then pairs are added"
    " until every gated metric is decided (default 10; a replay: as recorded)",
)
@click.option(
    "--undecided",
    type=click.Choice(["fail", "pass"]),
    default="fail",
    show_default=True,
    help="a gated metric still inconclusive at --max-launches: exit 1 (fail) or exit 0 (pass, said in"
    " the summary)",
)
@click.option(
    "--slow-spells",
    type=click.Choice(["replace", "keep"]),
    default=None,
    help="a launch whose median ran in a host slow spell: left out and replaced by another launch of its"
    " side (replace, default; it counts against --max-launches) or kept",
)
@click.option(
    "--spending",
    type=click.Choice(["pocock", "obrien-fleming"]),
    default=None,
    help="alpha spending over the looks (default pocock: decides early; obrien-fleming: keeps most for"
    " the last look)",
)
@click.option(
    "-m",
    "--warm",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="warm requests a launch, after the cold request",
)
@click.option(
    "--out",
    default=None,
    help="run directory (default outputs/ab/<timestamp>); holds a/, b/, ab.json, summary.md, report.html",
)
@click.option(
    "--threshold",
    default=None,
    help="decision threshold, a fraction or a percent (default 5%: a regression is an interval above +5%)",
)
@click.option(
    "--threshold-from",
    default=None,
    metavar="RUN",
    help="per-metric thresholds from a recorded A/A run directory (its ab.json): each metric's A/A interval",
)
@click.option(
    "--confidence",
    default=None,
    help="two-sided confidence over all looks and gated metrics (default 0.95; each look's intervals are"
    " wider: alpha spending, split over the gated metrics)",
)
@click.option(
    "--gate-metrics",
    default=None,
    multiple=True,
    metavar="M1,M2",
    help="metrics whose regression sets the exit code (e.g. DenoisingStage,warm_e2e; names are"
    " case-sensitive, stages are the engine's); the rest are decided and shown, not gated (default:"
    " every metric gates; a replay: as recorded)",
)
@click.option(
    "--replay",
    nargs=2,
    default=None,
    metavar="DIR_A DIR_B",
    help="re-decide from two recorded side bundles: launches nothing",
)
@click.option(
    "--num-frames",
    type=click.IntRange(1),
    default=None,
    help="request frames (default: the params file's, else the engine's)",
)
@click.option("--height", type=click.IntRange(1), default=None, help="request height (px)")
@click.option("--width", type=click.IntRange(1), default=None, help="request width (px)")
@click.option("--steps", type=click.IntRange(1), default=None, help="request denoising steps")
@click.option(
    "--share-compile-cache",
    is_flag=True,
    help="launches share compile caches (default: fresh ones each launch)",
)
@click.option(
    "--profile",
    is_flag=True,
    help="after the measured launches, an extra launch a side profiles a cold and a warm request"
    " (sglang's profile fields); the report diffs A's and B's ops (not part of any metric)",
)
@click.option(
    "--profile-steps",
    type=int,
    default=5,
    show_default=True,
    help="with --profile: denoising steps recorded after one warm-up step (sglang's"
    " num_profiled_timesteps; -1 all)",
)
@click.option(
    "--profile-warm",
    type=click.IntRange(1, 9),
    default=3,
    show_default=True,
    help="with --profile: warm requests profiled a side (the diff takes each op's median over them)",
)
@click.option(
    "--profile-all-stages",
    is_flag=True,
    help="with --profile: every stage (sglang's profile_all_stages)",
)
@click.option("-q", "--quiet", is_flag=True, help="do not print summary.md")
def ab_command(**kw: Any) -> None:
    """A/B two engines: interleaved launches, per-metric ratios B/A with intervals, a verdict."""
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("profile_steps", "profile_warm", "profile_all_stages")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    ]
    if given and not kw["profile"]:  # they mean nothing without it: never silently ignored
        raise click.UsageError(f"{', '.join(given)} only with --profile (nothing is profiled without it)")
    _done(cmd_ab(SimpleNamespace(**kw)))


def _probe_options(f):
    """The options ``perfkit bisect`` and ``perfkit history confirm`` share (perfkit.bisect.api.make_setup)."""
    opts = [
        click.option(
            "--repo", default=".", show_default=True, help="the engine's git repository (never checked out)"
        ),
        click.option(
            "--spec",
            required=True,
            metavar="FILE",
            help="engine spec YAML or params file; {checkout} = the probe",
        ),
        click.option(
            "--python-path",
            default=None,
            metavar="DIR",
            help="Python overlay: checkout/DIR first on PYTHONPATH",
        ),
        click.option("--build", default=None, metavar="CMD", help="shell command run in each checkout first"),
        click.option(
            "-n",
            "--launches",
            type=click.IntRange(2, 100),
            default=2,
            show_default=True,
            help="launches a side a probe before the A/B's first look (as perfkit ab -n)",
        ),
        click.option(
            "--max-launches",
            type=click.IntRange(2, 100),
            default=6,
            show_default=True,
            help="launches a side a probe at most; still inconclusive: the probe is undecided (skipped)",
        ),
        click.option(
            "-m",
            "--warm",
            type=click.IntRange(1, 1000),
            default=3,
            show_default=True,
            help="warm requests a launch",
        ),
        click.option(
            "--threshold", default="5%", show_default=True, help="a regression is an interval above it"
        ),
        click.option("--out", default=None, help="output directory (default outputs/<command>/<timestamp>)"),
        click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _probe_run(kind: str, fn, kw: dict[str, Any], *args: Any, **more: Any) -> None:
    """Build the probe setup from ``kw``, run ``fn(*args, setup, out, **more)``, print, exit."""
    from perfkit.bisect.api import make_setup, out_dir
    from perfkit.bisect.checkout import BisectError
    from perfkit.history.store import HistoryError

    try:
        metric = (_gate_metrics(kw["metric"]) or [None])[0] if kw.get("metric") else None
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="--metric") from None
    try:
        setup = make_setup(
            kw["spec"], metric=metric, python_path=kw["python_path"], build=kw["build"],
            min_launches=kw["launches"], max_launches=kw["max_launches"],
            threshold=_fraction(kw["threshold"], "--threshold"), warm=kw["warm"],
        )  # fmt: skip
        _sigterm_as_interrupt()
        if "metric" in more:  # confirm: the series' own metric unless --metric
            more["metric"] = metric
        code, summary = fn(*args, setup, out_dir(kw["out"], kind), **more)
    except (BisectError, HistoryError) as exc:
        click.echo(f"perfkit {kind}: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    if not kw["quiet"]:
        click.echo(summary.read_text())
    click.echo(f"summary: {summary}")
    _done(code)


@cli.command(
    "bisect",
    epilog="Exit codes: 0 the first bad commit found; 1 not reproduced (the bad commit is no regression"
    " against the good one); 2 bad input, or the search could not decide (the range left and the"
    " probes that failed or stayed undecided are named).",
)
@click.option("--good", required=True, help="a commit without the regression")
@click.option("--bad", required=True, help="a later commit with it")
@click.option("--metric", default="DenoisingStage", show_default=True, help="the A/B metric that decides")
@_probe_options
def bisect_command(**kw: Any) -> None:
    """The first bad commit between --good and --bad: an A/B against --good at each probe."""
    from perfkit.bisect.api import run_bisect

    _probe_run("bisect", run_bisect, kw, kw["repo"], kw["good"], kw["bad"])


@cli.group(
    "history",
    epilog="Examples:\n\n\b\n"
    "  perfkit history import tests/fixtures/sglang-nightly --hardware H100\n"
    "  perfkit history add outputs/ci-cpu/latest\n"
    "  perfkit history check outputs/ci-cpu/latest --out outputs/history-check\n"
    "  perfkit history site outputs/history-site\n"
    "  perfkit history confirm tiny-cpu/DenoisingStage_ms 1 --repo ../engine --spec spec.yaml\n\n"
    + EXIT_CODES,
)
def history_group() -> None:
    """Performance history across commits: a store, change points, a gate, an offline site."""


_STORE = click.option(
    "--store",
    default="outputs/history",
    show_default=True,
    help="history store directory (parquet files; created when missing)",
)


def _commit_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --commit-url template: ``{commit}`` its one field (``{sha}`` was a KeyError traceback)."""
    import string

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
        # the link lands in summary.md and the history page: javascript: or data: would run there
        raise click.BadParameter(f"{value!r}: must start with https:// or http://")
    return value


_COMMIT_URL = click.option(
    "--commit-url",
    default=None,
    callback=_commit_url,
    help="link template for commits, e.g. https://github.com/sgl-project/sglang/commit/{commit}",
)


def _history_call(fn, *args: Any, **kw: Any) -> Any:
    """Run a history library call; bad input exits 2 with one line naming file and key."""
    from perfkit.history.store import HistoryError

    try:
        return fn(*args, **kw)
    except (HistoryError, OSError) as exc:
        click.echo(f"perfkit history: {exc}", err=True)
        sys.exit(EXIT_ERROR)


def _added(res: Any) -> None:
    click.echo(f"{len(res.added)} run(s) added, {len(res.skipped)} already stored")


@history_group.command("add", epilog=EXIT_CODES)
@click.argument("runs", nargs=-1, required=True)
@_STORE
@click.option("--commit", default=None, help="commit measured (default: the bundles' git_commit)")
@click.option("--hardware", default=None, help="hardware label (default: what the run says)")
def history_add(runs: tuple[str, ...], store: str, commit: str | None, hardware: str | None) -> None:
    """Store perfkit RUNS: suite or merged runs (baseline.json), A/B outputs (each side), bundles."""
    from perfkit.history.api import add

    _added(_history_call(add, store, runs, commit=commit, hardware=hardware))


@history_group.command(
    "import",
    epilog=EXIT_CODES
    + " Examples: perfkit history import tests/fixtures/sglang-nightly --hardware H100; perfkit history "
    "import ../sglang --baselines python/sglang/multimodal_gen/test/server/perf_baselines/h100.json.",
)
@click.argument("path")
@_STORE
@click.option(
    "--hardware", default=None, help="hardware of these runs (required for nightly files: they do not say)"
)
@click.option(
    "--baselines",
    "baselines",
    default=None,
    help="PATH is a git repository: import every committed version of this perf_baselines file in it",
)
def history_import(path: str, store: str, hardware: str | None, baselines: str | None) -> None:
    """Store sglang's nightly comparison files (a directory, a file or a ci-data-diffusion
    checkout), or with --baselines a perf_baselines file's versions across git history."""
    from perfkit.history.api import import_baselines, import_nightly

    if baselines:
        _added(_history_call(import_baselines, store, path, baselines, hardware=hardware))
        return
    if not hardware:
        click.echo(
            "perfkit history import: nightly comparison files do not name their hardware; give --hardware",
            err=True,
        )
        sys.exit(EXIT_ERROR)
    _added(_history_call(import_nightly, store, path, hardware=hardware))


@history_group.command(
    "check",
    epilog="Exit codes: 0 no regression step, 1 a regression step, 2 bad input or nothing compared.",
)
@click.argument("run")
@_STORE
@click.option(
    "--out",
    "out",
    default=None,
    help="directory for summary.md (default: RUN/history/, for a file outputs/history-check/<name>/)",
)
@click.option("--hardware", default=None, help="hardware label (needed for a nightly comparison file)")
@click.option("--commit", default=None, help="commit measured (default: the bundles' git_commit)")
@_COMMIT_URL
@click.option("-q", "--quiet", is_flag=True, help="do not print summary.md")
def history_check(
    run: str,
    store: str,
    out: str | None,
    hardware: str | None,
    commit: str | None,
    commit_url: str | None,
    quiet: bool,
) -> None:
    """Is RUN (a perfkit run or a nightly comparison file) a new step against its series?"""
    from perfkit.history.api import check

    # never RUN/summary.md: that is the suite's own
    out_dir = out or (
        Path(run) / "history" if Path(run).is_dir() else Path("outputs/history-check") / Path(run).stem
    )
    res, summary = _history_call(
        check, store, run, out_dir, hardware=hardware, commit=commit, commit_url=commit_url
    )
    if not quiet:
        click.echo(summary.read_text())
    click.echo(f"summary: {summary}")
    _done(res.exit_code)


@history_group.command(
    "confirm",
    epilog="Exit codes: 0 confirmed; 1 not reproduced or undecided; 2 bad input or an error (a build, a launch).",
)
@click.argument("series")
@click.argument("change")
@_STORE
@click.option("--hardware", default=None, help="the series' hardware (when stored for several)")
@click.option(
    "--metric",
    default=None,
    help="the A/B metric (default: the series', e.g. DenoisingStage_ms -> DenoisingStage)",
)
@_probe_options
def history_confirm(series: str, change: str, **kw: Any) -> None:
    """A/B the commits on either side of step CHANGE (its number, or a commit) of SERIES (CASE/METRIC)."""
    from perfkit.bisect.api import run_confirm

    more = {"metric": kw["metric"], "hardware": kw["hardware"]}
    _probe_run("confirm", run_confirm, kw, kw["store"], series, change, kw["repo"], **more)


@history_group.command("site", epilog=EXIT_CODES)
@click.argument("out")
@_STORE
@_COMMIT_URL
def history_site(out: str, store: str, commit_url: str | None) -> None:
    """Write the offline history site to OUT/ (index.html, one page per hardware)."""
    from perfkit.report.history_site import write_site

    pages = _history_call(write_site, store, out, commit_url=commit_url)
    click.echo(f"{len(pages)} page(s): {Path(out) / 'index.html'}")


cli.add_command(measure_command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (also for ``perfkit`` itself)."""
    try:
        cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="perfkit", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
