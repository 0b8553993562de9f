"""`perfkit bisect` and `perfkit history confirm` on a temporary git repository of 16 commits of a
small engine: the stand-in engine (tests/fake_engine.py) reads its DenoisingStage factor from the
repository's `knob.py` (1.0, then 1.3 from commit 11 on), found through the probe's PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest
import yaml

import fake_engine
from perfkit.ab.sequential import Design
from perfkit.bisect.probe import BisectError, ProbeSetup
from perfkit.bisect.search import bisect, next_position, run_confirm
from perfkit.cli import main
from perfkit.history.store import HistoryRun, Value, add_runs, read_confirmations
from perfkit.report.history_site import write_bisect_outputs, write_site

N_COMMITS, BAD_AT, BROKEN_BUILD_AT = 16, 11, 10
#: the engine's request: all of it DenoisingStage, times the checkout's knob.DENOISE_FACTOR
ENGINE = ("--mode", "serve", "--request-s", "0.08", "--load-s", "0", "--warmup-s", "0")
FAST = ["-n", "2", "--max-launches", "6", "--threshold", "15%", "-m", "3"]


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "A. Author", "GIT_AUTHOR_EMAIL": "a@example.org"}
    env |= {"GIT_COMMITTER_NAME": "A. Author", "GIT_COMMITTER_EMAIL": "a@example.org"}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, env=env, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def engine_repo(tmp_path_factory) -> tuple[Path, list[str]]:
    """16 commits; commit 11 switches DenoisingStage +30 % on; commit 10's build step fails."""
    repo = tmp_path_factory.mktemp("engine") / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for k in range(1, N_COMMITS + 1):
        (repo / "knob.py").write_text(f"DENOISE_FACTOR = {1.3 if k >= BAD_AT else 1.0}\nCOMMIT = {k}\n")
        bad_build = k == BROKEN_BUILD_AT
        (repo / "build.py").write_text(
            'raise SystemExit("fatal: missing header knob.h")\n' if bad_build else "print('built')\n"
        )
        _git(repo, "add", "knob.py", "build.py")
        subject = f"commit {k}" + (": DenoisingStage +30 %" if k == BAD_AT else "")
        _git(repo, "commit", "-q", "-m", subject, date=f"2026-11-{k:02d}T12:00:00+00:00")
        shas.append(_git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def _spec(path: Path, **extra) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "kind": "command",
                "command": fake_engine.command(*ENGINE, "--denoise-factor-from", "knob"),
                "startup_timeout_s": 60,
                **extra,
            }
        )
    )
    return path


def _untouched(repo: Path, head: str) -> None:
    assert _git(repo, "rev-parse", "HEAD").strip() == head
    assert _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1  # probes removed
    assert _git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"


def test_next_position_takes_the_untried_middle():
    assert next_position(0, 15, set()) == 7
    assert next_position(7, 11, {9}) == 8  # a tie: the lower
    assert next_position(8, 10, {9}) is None
    assert next_position(0, 1, set()) is None


def test_bisect_finds_commit_11_of_16_in_at_most_5_probes_and_leaves_the_checkout(engine_repo, tmp_path):
    repo, shas = engine_repo
    head = _git(repo, "rev-parse", "HEAD").strip()
    out = tmp_path / "out"
    args = ["bisect", "--repo", str(repo), "--good", shas[0][:8], "--bad", "main", "--spec"]
    args += [str(_spec(tmp_path / "spec.yaml")), "--python-path", ".", *FAST, "--out", str(out), "-q"]
    assert main(args) == 0  # the command line, in process (a subprocess would import torch again)
    res = json.loads((out / "bisect.json").read_text())
    assert res["outcome"] == "found"
    assert res["found"]["sha"] == shas[BAD_AT - 1]
    probes = res["probes"]
    assert 1 <= len(probes) <= 5
    for pr in probes:  # each probe's A/B decided, the right way (position k is commit k + 1)
        assert pr["verdict"] == ("bad" if pr["position"] + 1 >= BAD_AT else "good"), pr
        assert pr["decision"] == ("regression" if pr["verdict"] == "bad" else "no change")
        assert (pr["low"] > 1.15) if pr["verdict"] == "bad" else (0.85 <= pr["low"] <= pr["high"] <= 1.15)
        assert Path(pr["out"], "report.html").is_file()  # each probe's own A/B page
    assert res["launches"] == sum(sum(pr["launches"].values()) for pr in probes) >= 4 * len(probes)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## perfkit bisect: FOUND (exit code 0)")
    assert "commit 11: DenoisingStage +30 %" in summary and "2026-11-11T12:00:00+00:00" in summary
    assert f"{len(probes)} probes, {res['launches']} launches in all" in summary
    page = (out / "report.html").read_text()
    assert "commit 11: DenoisingStage +30 %" in page and "its A/B page" in page
    _untouched(repo, head)


def test_a_failing_build_is_that_probes_error_and_the_range_is_what_is_left(engine_repo, tmp_path):
    repo, shas = engine_repo
    head = _git(repo, "rev-parse", "HEAD").strip()
    # the spec refers to the checkout itself (no overlay option): {checkout} is filled per probe
    spec = _spec(tmp_path / "spec.yaml", env={"PYTHONPATH": "{checkout}"})
    setup = ProbeSetup(spec, build="python build.py", design=Design(2, 6), threshold=0.15, warm=3)
    good, bad = shas[BROKEN_BUILD_AT - 2], shas[BAD_AT]  # commits 9 .. 12
    res = bisect(repo, good, bad, setup, tmp_path / "out")
    by_commit = {p.commit.sha: p for p in res.probes}
    broken = by_commit[shas[BROKEN_BUILD_AT - 1]]
    assert broken.verdict == "error" and not broken.launches
    assert "build 'python build.py' exited 1: fatal: missing header knob.h" in broken.error
    assert by_commit[shas[BAD_AT - 1]].verdict == "bad"
    assert res.outcome == "not decided" and res.exit_code == 2 and res.found is None
    assert (res.lo, res.hi) == (0, 2)  # commit 10 or commit 11
    assert "one of positions 1..2" in res.message and "missing header knob.h" in res.message
    paths = write_bisect_outputs(res.to_dict(), tmp_path / "out")
    summary = paths["summary"].read_text()
    assert "NOT DECIDED (exit code 2)" in summary
    left = f"<code>{shas[BROKEN_BUILD_AT - 1][:10]} commit 10</code>, <code>{shas[BAD_AT - 1][:10]} commit 11"
    assert left in summary
    _untouched(repo, head)


def test_a_good_commit_that_cannot_be_built_still_writes_the_report(engine_repo, tmp_path):
    """Found by the breaker: a build failing on the good commit left only good/build.log; and a
    hung build needs its time limit."""
    repo, shas = engine_repo
    spec = _spec(tmp_path / "spec.yaml", env={"PYTHONPATH": "{checkout}"})
    broken = shas[BROKEN_BUILD_AT - 1]
    for build, timeout, why in (
        ("python build.py", None, "exited 1: fatal: missing header knob.h"),
        ("sleep 30", 1.0, "build 'sleep 30' ran past 1.0 s"),
    ):
        out = tmp_path / f"out-{timeout}"
        setup = ProbeSetup(spec, build=build, build_timeout_s=timeout, design=Design(2, 6))
        res = bisect(repo, broken, shas[-1], setup, out)
        assert (res.outcome, res.exit_code, res.probes) == ("error", 2, [])
        assert res.message.startswith(f"the good commit {broken[:10]} (commit 10): ") and why in res.message
        paths = write_bisect_outputs(res.to_dict(), out)
        assert paths["summary"].read_text().startswith("## perfkit bisect: ERROR (exit code 2)")
        assert (out / "report.html").exists() and json.loads((out / "bisect.json").read_text())[
            "outcome"
        ] == "error"


def test_a_build_past_its_time_limit_is_ended_with_its_whole_tree(engine_repo, tmp_path):
    """Issue 54: only the build's ``/bin/sh -c`` was killed; its children (one in a session of
    its own) ran on, re-parented to init, while the next probes measured."""
    repo, shas = engine_repo
    spec = _spec(tmp_path / "spec.yaml", env={"PYTHONPATH": "{checkout}"})
    pids = tmp_path / "pids"
    build = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; wait"
    setup = ProbeSetup(spec, build=build, build_timeout_s=1.0, design=Design(2, 6))
    res = bisect(repo, shas[0], shas[2], setup, tmp_path / "out")
    assert res.exit_code == 2 and "ran past 1.0 s" in res.message
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 2
    for pid in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            assert p.status() == psutil.STATUS_ZOMBIE or "sleep" not in p.name(), f"build child {pid} runs on"
    assert "(its processes were ended)" in res.message


def test_a_bad_commit_that_is_no_regression_is_not_reproduced(engine_repo, tmp_path):
    repo, shas = engine_repo
    setup = ProbeSetup(_spec(tmp_path / "spec.yaml"), python_path=".", design=Design(2, 6), threshold=0.15)
    res = bisect(repo, shas[12], shas[13], setup, tmp_path / "out")  # commits 13 .. 14: both +30 %
    assert [p.commit.sha for p in res.probes] == [shas[13]]  # the bad commit itself, once
    assert res.probes[0].decision == "no change"
    assert (res.outcome, res.exit_code, res.found) == ("not reproduced", 1, None)
    assert res.message.startswith(f"not reproduced: the bad commit {shas[13][:10]} is not a regression")


def test_bad_input_is_named(engine_repo, tmp_path, capsys):
    repo, shas = engine_repo
    # ab's decision options, checked as ab checks them (before anything is checked out)
    args = [
        "bisect",
        "--repo",
        str(repo),
        "--good",
        shas[0],
        "--bad",
        shas[2],
        "--spec",
        str(tmp_path / "x.yaml"),
    ]
    assert main([*args, "--paired", "--slow-spells", "replace"]) == 2
    assert "a paired A/B keeps every launch" in capsys.readouterr().err
    assert main([*args, "--confidence", "1.5"]) == 2 and "--confidence" in capsys.readouterr().err
    setup = ProbeSetup(_spec(tmp_path / "spec.yaml"))
    with pytest.raises(BisectError, match="no commit 'nope'"):
        bisect(repo, "nope", shas[-1], setup, tmp_path / "o1")
    with pytest.raises(BisectError, match="not an ancestor"):
        bisect(repo, shas[5], shas[2], setup, tmp_path / "o2")
    # found by the breaker: a directory that is no repository was "no commit 'HEAD~2'"; a spec
    # that cannot vary between commits made every probe run the same engine
    with pytest.raises(BisectError, match="not a git repository"):
        bisect(tmp_path, "HEAD~1", "HEAD", setup, tmp_path / "o3")
    with pytest.raises(
        BisectError, match=r"does not depend on the checkout .* every probe would run the same engine"
    ):
        bisect(repo, shas[0], shas[2], setup, tmp_path / "o4")


def _history(store: Path, shas: list[str]) -> None:
    """Two synthetic series on one hardware: `tiny` steps +30 % at commit 11 (as the code does),
    `tiny-b` steps +30 % at commit 6 (where the code changes nothing)."""
    runs = []
    for k, sha in enumerate(shas, 1):
        wiggle = 1.0 + 0.004 * ((k * 7) % 5 - 2)
        values = [
            Value("tiny", "DenoisingStage_ms", "ms", 50.0 * wiggle * (1.3 if k >= BAD_AT else 1.0)),
            Value("tiny-b", "DenoisingStage_ms", "ms", 50.0 * wiggle * (1.3 if k >= 6 else 1.0)),
        ]
        t = datetime(2026, 11, k, 12, tzinfo=timezone.utc)
        runs.append(HistoryRun("suite", f"run{k}", "cpu-test", sha, t, values, source_file=f"run{k}"))
    add_runs(store, runs)


def test_history_confirm_says_confirmed_on_commit_11_and_not_reproduced_elsewhere(engine_repo, tmp_path):
    repo, shas = engine_repo
    head = _git(repo, "rev-parse", "HEAD").strip()
    store = tmp_path / "store"
    _history(store, shas)
    spec = _spec(tmp_path / "spec.yaml")
    setup = ProbeSetup(spec, python_path=".", design=Design(2, 6), threshold=0.15)
    # the command line, paired (issue 51: `perfkit ab`'s decision options, shared)
    args = ["history", "confirm", "tiny/DenoisingStage_ms", "1", "--store", str(store), "--repo", str(repo)]
    args += [
        "--spec",
        str(spec),
        "--python-path",
        ".",
        "--paired",
        *FAST,
        "--out",
        str(tmp_path / "c11"),
        "-q",
    ]
    assert main(args) == 0
    res = json.loads((tmp_path / "c11" / "confirm.json").read_text())
    summary = tmp_path / "c11" / "summary.md"
    assert res["outcome"] == "confirmed" and res["setup"]["design"]["paired"] is True
    ab_meta = json.loads(Path(res["probes"][0]["out"], "ab.json").read_text())["meta"]
    assert (
        ab_meta["sequential"]["design"]["paired"] and ab_meta["sequential"]["design"]["slow_rule"] == "keep"
    )
    assert "launches a side a probe, paired (" in summary.read_text()
    assert (res["good"]["sha"], res["bad"]["sha"]) == (shas[BAD_AT - 2], shas[BAD_AT - 1])
    assert res["probes"][0]["decision"] == "regression" and res["probes"][0]["low"] > 1.15
    assert summary.read_text().startswith("## perfkit history confirm: CONFIRMED (exit code 0)")
    assert (
        res["repo"] == str(repo.resolve())
        and str(repo.resolve()) in (summary.parent / "report.html").read_text()
    )
    code, summary = run_confirm(store, "tiny-b/DenoisingStage_ms", shas[5][:8], repo, setup, tmp_path / "c6")
    res = json.loads((tmp_path / "c6" / "confirm.json").read_text())
    assert code == 1 and res["outcome"] == "not reproduced"
    assert (res["good"]["sha"], res["bad"]["sha"]) == (shas[4], shas[5])
    assert res["probes"][0]["decision"] == "no change"
    assert "NOT REPRODUCED (exit code 1)" in summary.read_text()
    stored = read_confirmations(store)
    assert list(stored["case_id"]) == ["tiny", "tiny-b"]
    assert list(stored["outcome"]) == ["confirmed", "not reproduced"]
    assert list(stored["after_commit"]) == [shas[BAD_AT - 1], shas[5]]
    assert stored["ab_metric"].eq("DenoisingStage").all()
    # the history site shows each step's latest confirmation beside it
    (page,) = [p for p in write_site(store, tmp_path / "site") if p.name != "index.html"]
    html = page.read_text()
    got = re.findall(r"(confirmed|not reproduced): A/B ([+-]\d+\.\d) %", html)
    assert [(w, round(float(x) / 10)) for w, x in got] == [
        ("confirmed", 3),
        ("not reproduced", 0),
    ]  # +30 %, 0 %
    _untouched(repo, head)


def test_history_confirm_names_a_missing_step(engine_repo, tmp_path, capsys):
    repo, shas = engine_repo
    store = tmp_path / "store"
    _history(store, shas)
    args = ["history", "confirm", "tiny/DenoisingStage_ms", "2", "--store", str(store), "--repo", str(repo)]
    assert main([*args, "--spec", str(_spec(tmp_path / "s.yaml"))]) == 2
    err = capsys.readouterr().err
    assert "has no step 2; its steps: 1: " in err and shas[BAD_AT - 1][:10] in err


def test_the_bisect_example_spec_gives_each_checkout_its_engine_args(tmp_path):
    """examples/bisect (docs/history.md, "Which commit?"): the spec hands the reference engine
    `@{checkout}/engine.args`, which it reads as more options, one a line: the probe's slowdown."""
    from perfkit.bisect.probe import load_spec
    from perfkit.refengine.flags import build_parser

    co = tmp_path / "checkout"
    co.mkdir()
    example = Path(__file__).resolve().parents[1] / "examples/bisect"
    parsed = []
    for text in ("", "--debug-stage-delay\nDenoisingStage=50%\n"):  # commits 1-4, then 5-8
        (co / "engine.args").write_text(text)
        spec, _ = load_spec(example / "spec.yaml", co)
        argv = spec.command(8000, tmp_path / "perf")
        assert argv[-1] == f"@{co.resolve()}/engine.args"
        parsed.append(build_parser().parse_args(argv[argv.index("perfkit.refengine") + 1 :]))
    assert [p.debug_stage_delay for p in parsed] == [[], [("DenoisingStage", 50.0)]]
    assert parsed[1].steps == 64 and parsed[1].cpu_threads == 1 and parsed[1].device == "cpu"
    assert "--paired" in (example / "run.sh").read_text()


def test_a_confirmation_time_without_timezone_is_stored_as_utc(tmp_path, monkeypatch):
    """As everywhere in the store (``store.utc``); it was read as the host's local time."""
    import time

    from perfkit.history.store import CONFIRM_COLUMNS, add_confirmation

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30
    time.tzset()
    try:
        row = dict.fromkeys(CONFIRM_COLUMNS, "x")
        row.update(ratio=1.3, low=1.2, high=1.4, step_ratio=1.3, outcome="confirmed", launches=[1])
        row["time"] = datetime(2026, 12, 5, 12, 0)
        add_confirmation(tmp_path / "store", **row)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    (stored,) = read_confirmations(tmp_path / "store")["time"]
    assert stored == datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
