"""The committed examples are true and usable (issue 40, items 3, 5 and 6), read from the
committed files alone (no engine, no notebook; well under a second):

- no committed report, summary or README names an absolute path of the machine that wrote it;
- the H200 example's summary.md fits a PR comment at a glance (≤ 10 KB), and the committed
  failing example's summary.md shows its failure first;
- every params file and A/B engine spec under ``params/`` and ``examples/`` validates with the
  loader of each command the docs pair it with (``perfkit suite``/``merge``/``measure``:
  :func:`perfkit.params.load_params`; ``perfkit ab --a/--b``: the CLI's own side loader), and
  every such pairing written in the docs names a file that exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: an absolute path of a machine: a root directory that is not the repository's own words
#: (``/v1/videos`` is an HTTP route, ``/health`` too); preceded by nothing path-like
ABS_PATH = re.compile(
    r"(?<![\w.~…/:-])/(?:tmp|work|home|root|Users|opt|var|mnt|srv|scratch|private|usr/local)/[\w.-]"
)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in out]


def _reports_summaries_readmes() -> list[Path]:
    return [
        p
        for p in _tracked("examples", "README.md", "docs")
        if p.name in ("report.html", "summary.md", "README.md") or p.name.startswith("check-run")
    ]


def test_no_committed_report_summary_or_readme_names_an_absolute_path():
    files = _reports_summaries_readmes()
    assert len(files) >= 20, files  # the scan reaches the examples
    found = []
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        for m in ABS_PATH.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{p.relative_to(ROOT)}:{line}: {text[max(0, m.start() - 30) : m.end() + 40]!r}")
    assert found == [], "\n".join(found[:20])


def test_absolute_path_scan_catches_the_known_offenders():
    """The scan is real: the paths the committed reports used to carry are caught, the
    repository's own words are not."""
    for bad in (
        "--perf-log-dir /tmp/w/c1/cold_warm/session/perf",
        '"run_dir": "/work/main/examples"',
        "<pre>/opt/torch/.venv/bin/python3 -m",
        "see /home/user/x",
        "/root/.cache/x",
    ):
        assert ABS_PATH.search(bad), bad
    for fine in ("POST /v1/videos", "GET /health", "…/cold_warm/session/perf", "examples/h200/bundles"):
        assert not ABS_PATH.search(fine), fine


def test_h200_summary_fits_a_comment_at_a_glance():
    text = (ROOT / "examples/h200/report/summary.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 10 * 1024, len(text.encode())
    # passing rows are collapsed; the key numbers say they are informational
    assert "<details><summary>" in text and "Informational" in text


def test_failing_example_shows_its_failure_first():
    """examples/h200/failing: the committed H200 bundles replayed against latency_drift_max
    0.05 (measured 0.091). Its summary's first section is the failed row."""
    text = (ROOT / "examples/h200/failing/report/summary.md").read_text(encoding="utf-8")
    assert text.startswith("## perfkit: h200-failing — ❌ REGRESSION (exit 1)"), text[:200]
    sections = re.findall(r"^### (.+)$", text, flags=re.M)
    assert sections[0] == "Failed gate rows", sections
    first = text.split("### Failed gate rows", 1)[1].split("###", 1)[0]
    assert "| cold_warm | latency_drift | – | 0.091 | 0.05 | fail |" in first, (
        first
    )  # baseline, measured, limit
    inv = text.split("### Investigations", 1)[1].split("###", 1)[0]
    assert "| Cold vs warm | fail: 4 checks: 1 failed, 3 passed | ran |" in inv, inv
    assert "| Warmup shapes | pass: 4 checks: 4 passed | ran |" in inv, inv
    # its README states the command that made it
    readme = (ROOT / "examples/h200/README.md").read_text(encoding="utf-8")
    assert "--params examples/h200/failing/params.yaml --replay examples/h200/bundles" in readme


# --------------------------------------------------------------------------- specs and params


def _load_with(command: str, path: Path) -> None:
    """Validate ``path`` as ``perfkit <command>`` would read it, without launching anything."""
    from perfkit.cli.ab import side as _ab_side
    from perfkit.params import load_params

    if command == "ab":
        try:
            _ab_side(str(path), "--a")
        except click.BadParameter as exc:  # what `perfkit ab` prints before exiting 2
            raise AssertionError(f"perfkit ab --a {path}: {exc.format_message()}") from None
    else:
        load_params(path)


def _doc_pairings() -> set[tuple[str, str]]:
    """(command, yaml file) pairs written in the docs: ``perfkit suite|measure|merge ...
    --params FILE``, ``perfkit ab --a FILE --b FILE``, ``gpu-ab-pool.sh start OUT FILE`` (the
    pool runs ``perfkit ab``'s engines) -- only repository files, not placeholders."""
    docs = _tracked("README.md", "docs", "examples", "deploy")
    docs = [p for p in docs if p.suffix in (".md", ".sh")]
    pairs: set[tuple[str, str]] = set()
    for p in docs:
        for line in p.read_text(encoding="utf-8").splitlines():
            for m in re.finditer(r"perfkit (suite|measure|merge|run)\b[^`|]*?--params\s+(\S+\.ya?ml)", line):
                pairs.add(("suite", m.group(2)))
            for m in re.finditer(r"perfkit ab\b[^`|]*", line):
                for f in re.findall(r"--[ab]\s+(\S+\.ya?ml)", m.group(0)):
                    pairs.add(("ab", f))
            for m in re.finditer(r"gpu-ab-pool\.sh start \S+ (\S+\.ya?ml)", line):
                pairs.add(("ab", m.group(1)))
    # placeholders (a.yaml, FILE.yaml) are not files of the repository
    return {(c, f) for c, f in pairs if "/" in f}


def test_every_example_spec_and_params_file_loads_with_its_commands():
    files = [p for p in _tracked("params", "examples") if p.suffix in (".yaml", ".yml")]
    assert files, "no params or spec files found"
    problems = []
    for p in files:
        rel = p.relative_to(ROOT).as_posix()
        # A/B and bisect engine specs are `perfkit ab` sides; every other YAML a params file
        command = "ab" if rel.startswith(("examples/ab/", "examples/bisect/")) else "suite"
        try:
            _load_with(command, p)
        except Exception as exc:  # noqa: BLE001 - collect every file's problem
            problems.append(f"{rel} ({command}): {str(exc).splitlines()[0]}")
    pairs = _doc_pairings()
    assert ("ab", "examples/ab/h200-ltx2b.yaml") in pairs, sorted(pairs)
    assert ("suite", "params/h200.yaml") in pairs, sorted(pairs)
    for command, f in sorted(pairs):
        p = ROOT / f
        if not p.exists():
            problems.append(f"{f}: named with perfkit {command} in the docs, not in the repository")
            continue
        try:
            _load_with(command, p)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{f} (perfkit {command}, as the docs pair it): {str(exc).splitlines()[0]}")
    assert problems == [], "\n".join(problems)


def test_a_spec_without_what_ab_needs_is_caught(tmp_path: Path):
    """The walk is real: a params-like file without ``name`` fails as `perfkit ab` says."""
    bad = tmp_path / "spec.yaml"
    bad.write_text("engine: {kind: reference, preset: tiny}\nrequest: {num_frames: 9}\n")
    with pytest.raises(AssertionError, match="name"):
        _load_with("ab", bad)


# --------------------------------------------------------------------------- README timings


def test_timings_block_states_machine_and_date(tmp_path: Path):
    """``kind=timings``: each recorded wall time with its machine, date and source; a record
    without a machine, or with a date that is not a date, is refused naming the key."""
    from perfkit.report.figures import FiguresError, update_text

    d = tmp_path / "t"
    d.mkdir()
    (d / "timings.json").write_text(
        '{"timings": [{"what": "perfkit suite --params params/ci-cpu.yaml", "wall_s": 354, '
        '"machine": "2 shared CPU cores", "date": "2026-12-01", "source": "time(1)"}]}'
    )
    doc = "x\n<!-- perfkit:figures src=t kind=timings -->\nold\n<!-- perfkit:end -->\n"
    out = update_text(doc, tmp_path)
    assert (
        "| perfkit suite --params params/ci-cpu.yaml | 5 min 54 s | 2 shared CPU cores | 2026-12-01 | time(1) |"
        in out
    )
    (d / "timings.json").write_text(
        '{"timings": [{"what": "x", "wall_s": 1, "date": "soon", "source": "y"}]}'
    )
    with pytest.raises(FiguresError, match="timings t/timings.json: timings.0.machine"):
        update_text(doc, tmp_path)


def test_every_example_params_file_matches_the_bundles_it_replays():
    """Each ``perfkit suite --params P --replay DIR`` the docs give: every investigation
    section of P states what DIR's bundles were measured with (the replay note of the notebook,
    :func:`perfkit.report.tables.replay_markdown`, names no difference)."""
    import json

    from perfkit.params import load_params
    from perfkit.report.tables import replay_markdown

    docs = [p for p in _tracked("README.md", "docs", "examples") if p.suffix == ".md"]
    pairs = set()
    for p in docs:
        pairs |= set(re.findall(r"--params (\S+\.yaml) --replay (examples/\S+?)[`\s)]", p.read_text()))
    assert ("params/h200.yaml", "examples/h200/bundles") in pairs, sorted(pairs)
    problems = []
    for pf, bd in sorted(pairs):
        params = load_params(ROOT / pf)
        for meta in sorted((ROOT / bd).glob("*/meta.json")):
            section = getattr(params, meta.parent.name, None)
            if section is None or not section.enabled:
                problems.append(f"{pf}: {meta.parent.name} bundle in {bd}, but the section is not enabled")
                continue
            note = replay_markdown(json.loads(meta.read_text()).get("params"), section.model_dump(), bd)
            if "differ" in note:
                problems.append(f"{pf} vs {bd}/{meta.parent.name}: {note.split('replay (', 1)[1]}")
    assert problems == [], "\n".join(problems)


def test_replay_note_prints_params_in_words_not_python_reprs():
    """A replay whose params differ from the bundle's names both values in words
    ("caps: given [unlimited; 24GiB dev (device_gib 24)]"), never a raw Python dict."""
    from perfkit.report.tables import replay_markdown

    recorded = {"caps": [{"label": "unlimited"}, {"label": "12GiB", "device_gib": 12.0, "host_gib": 32.0}]}
    given = {"caps": [{"label": "unlimited"}, {"label": "24GiB dev", "device_gib": 24}]}
    note = replay_markdown(recorded, given, "examples/x")
    assert (
        "<code>caps</code>: given \\[unlimited; 24GiB dev (device_gib 24)\\], measured with \\[unlimited; 12GiB"
        in note
    )
    assert "{" not in note and "'label'" not in note
    # a cap without limits is what "no cap" (None) means: no difference
    assert "differ" not in replay_markdown(
        {"caps": {"label": "unlimited", "host_enforcement": "auto"}}, {"caps": None}, "x"
    )


def test_every_committed_run_report_is_regenerated_by_the_script():
    """examples/regenerate.sh re-renders every committed suite or merge report (a directory
    with run.json) from its bundles, with its README's command."""
    script = (ROOT / "examples/regenerate.sh").read_text()
    targets = set(re.findall(r'^\s+"(examples/[^|"]+)\|perfkit (?:suite|merge) ', script, flags=re.M))
    runs = {p.parent.relative_to(ROOT).as_posix() for p in _tracked("examples") if p.name == "run.json"}
    assert runs and runs <= targets, sorted(runs - targets)
