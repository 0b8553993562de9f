"""perfkit.history on synthetic series (seeded) and on its store: steps at their index, no step
on a step-free series, drift, outliers, gaps; the same run stored once, two writers at once,
bad files refused naming file and key."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from perfkit.cli import main
from perfkit.history import changepoints as cp
from perfkit.history.check import check_runs
from perfkit.history.store import HistoryError, HistoryRun, Value, add_runs, read_store, stored_run_keys

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def points(values) -> list[cp.Point]:
    return [
        cp.Point(f"k{i}", str(i), f"c{i:04d}", T0 + timedelta(days=i), None if v is None else float(v))
        for i, v in enumerate(values)
    ]


def noisy(seed: int, n: int = 60, noise: float = 0.03) -> np.ndarray:
    """``n`` runs of 100 ms with log-normal noise of ``noise`` (3 % run to run)."""
    return 100 * np.exp(np.random.default_rng(seed).normal(0, noise, n))


def with_step(seed: int, at: int = 30, step: float = 0.05) -> np.ndarray:
    v = noisy(seed)
    v[at:] *= 1 + step
    return v


def test_a_5pct_step_on_3pct_noise_is_found_at_its_index():
    a = cp.analyse(points(with_step(1)), metric="e2e_ms")
    assert [s.index for s in a.steps] == [30]
    s = a.steps[0]
    assert s.kind == "regression" and s.before.commit == "c0029" and s.after.commit == "c0030"
    assert s.low < 1.05 < s.high and s.low > 1.0  # the interval holds the true step, excludes none
    assert a.outliers == [] and a.gaps == []


def test_step_and_step_free_rates_over_seeds():
    """20 seeds each. Measured: every stepped series gives exactly one step, 16 of 20 at the
    true index ± 1 (a 5 % step is 1.7 noise units: the others land 2–12 runs off); 19 of 20
    step-free series give no step (seed 0 has a 4-run bump at p = 4e-5)."""
    found = [cp.analyse(points(with_step(s)), metric="e2e_ms").steps for s in range(20)]
    assert all(len(f) == 1 for f in found)
    assert sum(abs(f[0].index - 30) <= 1 for f in found) >= 15
    clean = [cp.analyse(points(noisy(s)), metric="e2e_ms") for s in range(20)]
    assert sum(not a.steps for a in clean) >= 18
    assert all(not a.outliers for a in clean)  # 3 % noise has no 6-sigma run


def test_an_improvement_of_a_time_and_a_rate():
    v = with_step(1, step=-0.1)
    assert cp.analyse(points(v), metric="e2e_ms").steps[0].kind == "improvement"
    assert cp.analyse(points(v), metric="throughput_qps").steps[0].kind == "regression"


def test_drift_is_reported_as_regression_steps():
    """Creep: ten +1 % changes (every 8 runs, 0.3 % noise), each below the 2 % a step needs.
    It is not invisible: it comes out as regression steps only (measured: +4.1 % and +3.0 %),
    between levels that average several +1 % stages, so their product (+7.3 %) is below the
    whole +10.5 % and above half of it."""
    v = noisy(3, n=88, noise=0.003) * np.repeat(1.01 ** np.arange(11), 8)
    a = cp.analyse(points(v), metric="e2e_ms")
    assert len(a.steps) >= 2 and all(s.kind == "regression" for s in a.steps)
    assert 1.05 < math.prod(s.ratio for s in a.steps) < 1.01**10, [s.ratio for s in a.steps]
    assert cp.analyse(points(noisy(3, n=88, noise=0.003)), metric="e2e_ms").steps == []


def test_single_run_outliers_are_outliers_never_steps():
    v = with_step(1)
    spikes = {10: 2.0, 20: 5.0, 45: 10.0, 50: 0.4}
    for i, f in spikes.items():
        v[i] *= f
    a = cp.analyse(points(v), metric="e2e_ms")
    assert sorted(int(p.run_id) for p, _ in a.outliers) == sorted(spikes)
    assert [s.index for s in a.steps] == [30]
    assert {int(p.run_id): round(r) for p, r in a.outliers}[45] == 10


def test_gaps_are_gaps_never_zero_and_the_step_spans_them():
    v: list[float | None] = list(with_step(1))
    v[30] = v[31] = None  # the first runs of the new level failed
    pts = points(v)
    a = cp.analyse(pts, metric="e2e_ms")
    assert [p.run_id for p in a.gaps] == ["30", "31"]
    (s,) = a.steps
    assert (s.before.run_id, s.after.run_id) == ("29", "32")
    assert [p.run_id for p in s.between] == ["30", "31"]
    assert s.mean_before > 90  # no 0 pulled any level down


def test_the_5pct_rule_skips_gaps():
    # run 3 has only 2 measured runs before it; run 6 is 11.1 / mean(10, 12, 10) = +4.1 %
    assert cp.last3_alarms(points([10, 10, None, 12, 10, None, 11.1, 10.4])) == []
    assert [p.run_id for p, _ in cp.last3_alarms(points([10, 10, None, 12, 10, 10, 11.4]))] == ["6"]
    assert cp.last3_alarms(points([10, 10, None, 12])) == []


def test_events_group_steps_of_one_commit_range():
    a1 = cp.analyse(points(with_step(1)), case_id="a", metric="e2e_ms", hardware="H")
    a2 = cp.analyse(points(with_step(2)), case_id="b", metric="e2e_ms", hardware="H")
    a3 = cp.analyse(points(with_step(4, at=45, step=0.2)), case_id="c", metric="e2e_ms", hardware="H")
    evs = cp.events([a1, a2, a3])
    assert [sorted(a.case_id for a, _ in e.members) for e in evs] == [["a", "b"], ["c"]]
    assert (evs[0].before.commit, evs[0].after.commit) == ("c0029", "c0030")


# --------------------------------------------------------------------------- the store


def run(i: int, value: float | None = 100.0, *, hw: str = "H", error: str | None = None) -> HistoryRun:
    return HistoryRun(
        source="test",
        run_id=f"r{i}",
        hardware=hw,
        commit=f"c{i:04d}",
        time=T0 + timedelta(days=i),
        values=[Value("case", "e2e_ms", "ms", value, error), Value("case", "DenoisingStage_ms", "ms", 80.0)],
        source_file=f"r{i}.json",
    )


def test_the_same_run_added_twice_is_stored_once(tmp_path: Path):
    first = add_runs(tmp_path, [run(1), run(2), run(2)])
    assert len(first.added) == 2 and len(first.skipped) == 1
    again = add_runs(tmp_path, [run(2), run(3)])
    assert len(again.added) == 1 and again.skipped == [run(2).key]
    df = read_store(tmp_path)
    assert len(df) == 6 and df["run_id"].value_counts().to_dict() == {"r1": 2, "r2": 2, "r3": 2}
    assert set(df["schema_version"]) == {1}


def test_a_gap_is_stored_as_null_with_its_error(tmp_path: Path):
    add_runs(tmp_path, [run(1, None, error="500 Server Error")])
    row = read_store(tmp_path).query("metric == 'e2e_ms'").iloc[0]
    assert pd.isna(row["value"]) and row["error"] == "500 Server Error"


_WRITER = textwrap.dedent(
    """
    import sys, time
    from datetime import datetime, timedelta, timezone
    from pathlib import Path
    from perfkit.history.store import HistoryRun, Value, add_runs
    store, start, first = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def run(i):  # as tests/test_history.py's run(i)
        return HistoryRun("test", f"r{i}", "H", f"c{i:04d}", T0 + timedelta(days=i),
                          [Value("case", "e2e_ms", "ms", 100.0), Value("case", "DenoisingStage_ms", "ms", 80.0)],
                          source_file=f"r{i}.json")

    while not start.exists():
        time.sleep(0.005)
    for i in range(first, first + 12):  # 12 adds each, interleaved with the other writer
        add_runs(store, [run(i), run(1000)])
    """
)


def test_a_null_in_a_runs_baseline_is_a_gap_as_compare_reads_it(tmp_path: Path, capsys):
    """Found by a breaker: `compare` read a null as "not measured" while `history add` refused
    the same file ("not a finite number: None")."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    shutil.copytree(root / "examples/h200/report", run_dir)
    doc = json.loads((run_dir / "baseline.json").read_text())
    case = next(iter(doc["scenarios"]))
    doc["scenarios"][case]["expected_e2e_ms"] = None
    doc["scenarios"][case]["stages_ms"]["DenoisingStage"] = None
    (run_dir / "baseline.json").write_text(json.dumps(doc))
    assert main(["history", "add", str(run_dir), "--store", str(tmp_path / "s"), "--commit", "c1"]) == 0
    df = read_store(tmp_path / "s").set_index(["case_id", "metric"])
    for metric, key in (("e2e_ms", "expected_e2e_ms"), ("DenoisingStage_ms", "stages_ms.DenoisingStage")):
        row = df.loc[(case, metric)]
        assert math.isnan(row["value"]) and row["error"].endswith(f"scenarios.{case}.{key})"), row["error"]


def test_two_writers_at_once_lose_nothing(tmp_path: Path):
    """Two processes add 12 runs each (one add per run) at the same time, both also adding
    one shared run every time: every run is stored, each once."""
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    store, start = tmp_path / "store", tmp_path / "start"
    procs = [
        subprocess.Popen([sys.executable, str(script), str(store), str(start), str(first)], env=os.environ)
        for first in (100, 200)
    ]
    start.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    df = read_store(store)
    ids = df.query("metric == 'e2e_ms'")["run_id"]
    assert sorted(ids) == sorted([f"r{i}" for i in (*range(100, 112), *range(200, 212), 1000)])
    assert ids.is_unique and len(stored_run_keys(store)) == 25
    assert [f.name for f in store.rglob(".*")] == [".lock"]  # no half-written file left


def test_a_store_file_of_a_newer_schema_is_refused_naming_it(tmp_path: Path):
    add_runs(tmp_path, [run(1)])
    (f,) = tmp_path.glob("hw-*/*.parquet")
    t = pq.read_table(f).to_pandas()
    t["schema_version"] = 99
    t.to_parquet(f)
    with pytest.raises(HistoryError, match=f"{f.name}.*schema_version 99"):
        read_store(tmp_path)


def test_a_store_file_that_is_not_parquet_is_refused_naming_it(tmp_path: Path, capsys):
    """Found by the breaker: a truncated or stray .parquet file in the store was a pyarrow
    traceback from check, add and site."""
    add_runs(tmp_path, [run(1)])
    bad = tmp_path / "hw-H" / "zz.parquet"
    bad.write_bytes(b"junk\n")
    with pytest.raises(HistoryError, match=r"zz.parquet: not a history file \(not parquet\)"):
        read_store(tmp_path)
    with pytest.raises(HistoryError, match=r"zz.parquet: not a history file"):
        add_runs(tmp_path, [run(2)])
    assert main(["history", "site", str(tmp_path / "site"), "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "zz.parquet: not a history file" in err and "Traceback" not in err


def test_a_store_rewritten_by_pandas_reads_and_text_values_are_refused(tmp_path: Path, capsys):
    """Found by a breaker: a store file rewritten by pandas (large_string, int64, ns timestamps)
    was an ArrowInvalid traceback from `history changes`; ``value`` as text read as nothing."""
    import pyarrow as pa

    add_runs(tmp_path, [run(i, 100.0 + i) for i in range(4)])
    (f,) = tmp_path.glob("hw-*/*.parquet")
    t = pq.read_table(f)
    wide = {
        n: t[n].cast(pa.large_string()) if pa.types.is_string(t[n].type) else t[n] for n in t.column_names
    }
    pq.write_table(pa.table(wide), f)
    assert read_store(tmp_path).query("metric == 'e2e_ms'")["value"].tolist() == pytest.approx(
        [100, 101, 102, 103]
    )
    assert main(["history", "changes", "--store", str(tmp_path)]) == 0
    df = t.to_pandas()
    df["value"] = df["value"].astype(str)
    df.to_parquet(f)
    with pytest.raises(HistoryError, match=f"{f.name}: column 'value' is (large_)?string, not double"):
        read_store(tmp_path)
    capsys.readouterr()
    assert main(["history", "changes", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "column 'value'" in err and "Traceback" not in err


def test_history_changes_cut_by_its_reader_is_141_not_a_verdict(tmp_path: Path):
    """Found by a breaker: `perfkit history changes | head` exited 1, which reads "regression"."""
    add_runs(tmp_path, [run(i, 100.0 * (1.3 if i > 8 else 1)) for i in range(16)])  # click.echo flushes
    p = subprocess.Popen(
        [sys.executable, "-m", "perfkit", "history", "changes", "--store", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    p.stdout.close()  # the reader leaves before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err, err[-2000:]


def test_history_check_summary_stays_under_githubs_limit_with_a_huge_error(tmp_path: Path):
    """Found by a breaker: a 100 KB error text was copied whole into summary.md."""
    from perfkit.common import SUMMARY_LIMIT
    from perfkit.history.check import summary_markdown

    add_runs(tmp_path, [run(i, 100.0) for i in range(6)])
    frame = read_store(tmp_path)
    res = check_runs(frame, [run(100, None, error="x " * 50_000)])
    text = summary_markdown(res)
    assert len(text) < SUMMARY_LIMIT and "x x" in text and " …" in text
    many = check_runs(frame, [run(100, None, error=f"<b>{k}</b> " * 80) for k in range(400)])
    text = summary_markdown(many)
    assert len(text) < SUMMARY_LIMIT and "more values left out" in text and "<b>" not in text


def test_a_writers_temporary_file_is_not_read(tmp_path: Path):
    """Found by the breaker: a half-written ``.tmp-*.parquet`` (a writer at work, or killed)
    was read by check and site (pathlib's glob matches dot files)."""
    add_runs(tmp_path, [run(1)])
    (tmp_path / "hw-H" / ".tmp-abc.parquet").write_bytes(b"PAR1")
    assert add_runs(tmp_path, [run(2)]).added == [run(2).key]
    assert sorted(read_store(tmp_path)["run_id"].unique()) == ["r1", "r2"]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_store_files_take_the_process_umask(tmp_path: Path, umask: int, mode: int):
    """Issue 54: every file was 0600 (mkstemp): a store shared by a CI group was unreadable to
    the rest of the group."""
    old = os.umask(umask)
    try:
        add_runs(tmp_path, [run(1)])
        add_runs(tmp_path, [run(2)])
    finally:
        os.umask(old)
    modes = [f.stat().st_mode & 0o777 for f in tmp_path.glob("hw-*/*.parquet")]
    assert modes == [mode, mode]


def test_the_readmes_duckdb_query_never_reads_a_file_being_written(tmp_path: Path, monkeypatch):
    """Issue 54: the README's (now docs/history.md's) glob matched a writer's ``.tmp-*.parquet``: 2 of 253 reads during
    concurrent adds failed ("too small to be a Parquet file"). The query runs here while the
    writer's temporary file exists, still empty."""
    import re

    import duckdb

    readme = (Path(__file__).resolve().parents[1] / "docs" / "history.md").read_text()
    (glob,) = set(re.findall(r"read_parquet\('outputs/history/([^']+)'\)", readme))
    query = f"SELECT count(*) FROM read_parquet('{tmp_path}/{glob}')"
    add_runs(tmp_path, [run(1)])
    seen = []
    write_table = pq.write_table

    def query_while_writing(table, where, **kw):
        seen.append((Path(where).name, Path(where).stat().st_size, duckdb.sql(query).fetchall()[0][0]))
        return write_table(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", query_while_writing)
    add_runs(tmp_path, [run(2)])
    ((name, size, rows),) = seen
    assert name.startswith(".") and size == 0  # the temporary file existed, empty
    assert rows == 2  # run 1's two rows: the temporary file was not read
    monkeypatch.undo()
    assert duckdb.sql(query).fetchall()[0][0] == 4


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("https://x/{sha}", "unknown field {sha}"),
        ("https://x/", "no {commit} field"),
        ("https://x/{commit", "expected '}'"),
        ("javascript:alert('{commit}')", "must start with https:// or http://"),
    ],
)
def test_a_commit_url_without_its_commit_field_exits_2(tmp_path: Path, template, why):
    """Found by the breaker: ``history site --commit-url 'https://x/{sha}'`` was a KeyError
    traceback after the store was read."""
    from click.testing import CliRunner

    from perfkit.cli import cli

    add_runs(tmp_path, [run(1)])
    for cmd in (["site", str(tmp_path / "site")], ["check", str(tmp_path / "nowhere")]):
        res = CliRunner().invoke(cli, ["history", *cmd, "--store", str(tmp_path), "--commit-url", template])
        assert res.exit_code == 2 and "--commit-url" in res.output and why in res.output, res.output
        assert "Traceback" not in res.output


def test_a_bad_nightly_file_is_refused_naming_file_and_key(tmp_path: Path, capsys):
    good = {
        "timestamp": "2026-07-01T00:00:00+00:00",
        "commit_sha": "abc",
        "run_id": "1",
        "results": [{"case_id": "x", "framework": "sglang", "latency_s": 1.0, "error": None}],
    }
    (tmp_path / "a.json").write_text(json.dumps(good))
    bad = json.loads(json.dumps(good))
    bad["results"][0]["latency_s"] = "fast"
    (tmp_path / "b.json").write_text(json.dumps(bad))
    store = tmp_path / "store"
    assert main(["history", "import", str(tmp_path), "--hardware", "H100", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "b.json: results.0.latency_s:" in err and "Traceback" not in err
    assert read_store(store).empty  # nothing of the batch was stored
    del bad["results"][0]["latency_s"]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert main(["history", "import", str(tmp_path), "--hardware", "H100", "--store", str(store)]) == 2
    assert "b.json: results.0.latency_s: Field required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("latency", "why"),
    [
        ("7.5", "Input should be a valid number"),  # a string is a mistyped key, not 7.5
        (True, "Input should be a valid number"),  # not 1.0
        ("NaN", "finite number"),
        ("1e400", "finite number"),  # reads as inf
        (-3, "greater than or equal to 0"),
        (1e308, "less than or equal to 10000000"),  # `history site` overflowed on it (issue 54)
    ],
)
def test_a_nightly_latency_that_is_not_a_finite_number_is_refused(tmp_path: Path, capsys, latency, why):
    """Found by the breaker: "7.5", true and 1e400 (inf) were stored as 7.5, 1.0 and inf."""
    doc = {
        "timestamp": "2026-07-01T00:00:00+00:00",
        "commit_sha": "abc",
        "run_id": "1",
        "results": [{"case_id": "x", "framework": "sglang", "latency_s": 0.0, "error": None}],
    }
    text = json.dumps(doc)
    raw = latency if latency in ("NaN", "1e400") else json.dumps(latency)
    (tmp_path / "n.json").write_text(text.replace('"latency_s": 0.0', f'"latency_s": {raw}'))
    store = tmp_path / "store"
    assert (
        main(["history", "import", str(tmp_path / "n.json"), "--hardware", "H100", "--store", str(store)])
        == 2
    )
    err = capsys.readouterr().err
    assert "n.json: results.0.latency_s:" in err and why in err and "Traceback" not in err
    assert read_store(store).empty


def test_an_oversized_nightly_file_is_refused_before_parsing(tmp_path: Path, capsys):
    """Found by a breaker: a 32 MB file took 2.1 GiB, 96 MB aborted the process. Refused within
    a second (unloaded: tens of ms) under 8 MiB traced, the 2 MiB read the most."""
    import time
    import tracemalloc

    from perfkit.history.runs import read_nightly_file

    r = {"case_id": "x", "framework": "sglang", "latency_s": 1.0, "error": None}
    doc = {"timestamp": "2026-07-01T00:00:00+00:00", "commit_sha": "abc", "run_id": "1"}
    results = [{**r, "case_id": f"c{i}"} for i in range(60_000)]  # 4 MiB
    (tmp_path / "big.json").write_text(json.dumps({**doc, "results": results}))
    args = [
        "history",
        "import",
        str(tmp_path / "big.json"),
        "--hardware",
        "H",
        "--store",
        str(tmp_path / "s"),
    ]
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(HistoryError, match=r"big.json: more than 2 MiB: refused before parsing"):
            read_nightly_file(tmp_path / "big.json", "H")
        wall, peak = time.monotonic() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert wall < 1.0 and peak < 8 * 2**20, (wall, peak / 2**20)
    assert main(args) == 2  # the command: exit 2 naming the file
    assert "big.json: more than 2 MiB: refused before parsing" in capsys.readouterr().err
    (tmp_path / "big.json").write_text(json.dumps({**doc, "results": results[:20_000]}))  # 1.4 MiB
    assert main(args) == 0 and len(read_store(tmp_path / "s")) == 20_000


def test_a_nightly_file_with_an_empty_commit_or_a_case_twice_is_refused(tmp_path: Path, capsys):
    r = {"case_id": "x", "framework": "sglang", "latency_s": 1.0, "error": None}
    doc = {"timestamp": "2026-07-01T00:00:00+00:00", "commit_sha": "", "run_id": "1", "results": [r]}
    (tmp_path / "n.json").write_text(json.dumps(doc))
    args = ["history", "import", str(tmp_path / "n.json"), "--hardware", "H", "--store", str(tmp_path / "s")]
    assert main(args) == 2
    assert "n.json: commit_sha: String should have at least 1 character" in capsys.readouterr().err
    doc.update(commit_sha="abc", results=[r, {**r, "latency_s": 2.0}])
    (tmp_path / "n.json").write_text(json.dumps(doc))
    assert main(args) == 2
    assert "n.json: results.1.case_id: 'x' (sglang) appears twice" in capsys.readouterr().err


def test_add_runs_refuses_inf_and_bool_values(tmp_path: Path):
    for bad in (float("inf"), True):
        r = HistoryRun(
            "test", "r1", "H", "c1", T0, [Value("case", "e2e_ms", "ms", bad)], source_file="r1.json"
        )
        with pytest.raises(HistoryError, match=r"r1.json: case.e2e_ms: not a number"):
            add_runs(tmp_path, [r])
    assert read_store(tmp_path).empty


def test_check_with_nothing_to_compare_is_exit_2_and_a_new_step_is_exit_1(tmp_path: Path):
    frame = read_store(tmp_path)  # empty
    new = run(100, 130.0)
    assert check_runs(frame, [new]).exit_code == 2
    add_runs(tmp_path, [run(i, float(v)) for i, v in enumerate(noisy(7, n=20, noise=0.01))])
    frame = read_store(tmp_path)
    res = check_runs(frame, [new])  # the default: a first run above the level only warns
    assert res.rows[0].status == "unconfirmed" and res.exit_code == 0
    res = check_runs(frame, [new], cp.Settings(confirm_runs=1))
    by = {r.metric: r for r in res.rows}
    assert by["e2e_ms"].status == "regression" and by["e2e_ms"].before.commit == "c0019"
    assert by["DenoisingStage_ms"].status == "ok" and res.exit_code == 1
    assert check_runs(frame, [run(100, 100.5)]).exit_code == 0
    assert check_runs(frame, [run(100, None, error="boom")]).rows[0].status == "not measured"


def test_history_add_stores_a_suite_run_and_both_ab_sides_once(tmp_path: Path, capsys):
    """The committed H200 report (a replayed suite run) and the A/A example (two sides).

    The report's bundles were measured at two commits (memory_budget at 641b3be, the others at
    cd7aa53): found by the breaker, all its values were stored as cd7aa53's; now the add is
    refused naming both until ``--commit`` says which commit to store."""
    root = Path(__file__).resolve().parents[1]
    args = [
        "history",
        "add",
        str(root / "examples/h200/report"),
        str(root / "examples/ab/aa"),
        "--store",
        str(tmp_path),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "report: its bundles were measured at several commits: cd7aa53b840fa5a8af34f76bdc554080726b16db ("
        in err
    )
    assert "641b3be85dedd0ca4c589d909781a7bf3e714200 (memory_budget); give --commit" in err
    assert read_store(tmp_path).empty
    args += ["--commit", "cd7aa53b840fa5a8af34f76bdc554080726b16db"]
    assert main(args) == 0
    assert "3 run(s) added, 0 already stored" in capsys.readouterr().out
    assert main(args) == 0
    assert "0 run(s) added, 3 already stored" in capsys.readouterr().out
    df = read_store(tmp_path)
    assert sorted(df["source"].unique()) == ["ab-A", "ab-B", "suite"]
    suite = df[df["source"] == "suite"].set_index(["case_id", "metric"])
    assert suite.loc[("ltx-2b_25f_512x768_30s_w17", "e2e_ms"), "value"] == 973.1  # baseline.json's
    assert suite.loc[("ltx-2b_25f_512x768_30s_w17", "runtime_peak_vram_mib"), "unit"] == "MiB"
    assert set(suite["commit"]) == {"cd7aa53b840fa5a8af34f76bdc554080726b16db"}  # --commit
    assert set(suite["hardware"]) == {"NVIDIA H200"}
    assert main(["history", "add", str(tmp_path / "nowhere"), "--store", str(tmp_path)]) == 2
    assert "nowhere: not a perfkit run" in capsys.readouterr().err


def _commit_versions(repo: Path, f: Path, versions: list[str]) -> list[str]:
    """Commit each text as the next version of ``f`` in the git repository ``repo``, a day
    apart from 2026-06-01; returns the commits."""
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    if not (repo / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for i, text in enumerate(versions):
        f.write_text(text)
        subprocess.run([*git, "add", "."], check=True)
        when = f"2026-06-{i + 1:02d}T00:00:00+00:00"
        env = {**os.environ, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when}
        subprocess.run([*git, "commit", "-q", "-m", f"v{i}"], check=True, env=env)
        out = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        shas.append(out.stdout.strip())
    return shas


def test_perf_baselines_versions_across_git_history(tmp_path: Path, capsys):
    """A git history of sglang's perf_baselines file as its real history runs: flat tolerances
    first (``stage`` alone, then the two stage keys), then profiles; one version that is not
    JSON and one with a string for a number. Each readable version is a run of expected values
    at its commit, its tolerances read as sglang reads them; the two others are skipped with a
    note naming the commit and why, and the others are still imported."""
    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "tests/fixtures/perf_baselines_5090.json").read_text())
    profiled = doc["tolerances"]
    vram = {k: doc.pop(k) for k in ("load_peak_vram_mb", "runtime_peak_vram_mb")}  # added later
    case = "wan2_1_t2v_1.3b"
    old_flat = {"e2e": 0.25, "stage": 0.3, "denoise_step": 0.1, "denoise_agg": 0.1}
    two_keys = {
        "e2e": 0.25,
        "denoise_stage": 0.25,
        "non_denoise_stage": 0.8,
        "denoise_step": 0.3,
        "denoise_agg": 0.2,
    }
    versions = []
    for tols, decoding, e2e in (
        (old_flat, 26550.0, 30000.0),
        (old_flat, 26550.0, 27000.0),
        (two_keys, 26550.0, 27000.0),
        (None, 0, 0),  # broken: not JSON
        (profiled, 13000.0, 23418.73),  # DecodingStage tightened by hand
        ("string", 0, 0),  # broken: a string for a number
        (profiled, 495.01, 23418.73),
    ):
        if tols is None:
            versions.append('{"metadata": {}, "scenarios": {')
            continue
        v = copy.deepcopy(doc)
        v["tolerances"] = profiled if tols == "string" else tols
        v["scenarios"][case]["stages_ms"]["DecodingStage"] = decoding
        v["scenarios"][case]["expected_e2e_ms"] = "fast" if tols == "string" else e2e
        if tols is profiled:
            v.update(vram)
        versions.append(json.dumps(v, indent=4))
    repo = tmp_path / "sglang"
    repo.mkdir()
    f = repo / "perf_baselines.json"
    shas = _commit_versions(repo, f, versions)
    good = [shas[i] for i in (0, 1, 2, 4, 6)]
    store = tmp_path / "store"
    args = ["history", "import", str(repo), "--baselines", f.name, "--store", str(store)]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "5 version(s) imported, 2 skipped" in out and "5 run(s) added" in out
    assert f"{repo}:{shas[3][:10]}:{f.name}: invalid JSON at line 1 column 32" in err
    assert (
        f"{repo}:{shas[5][:10]}:{f.name}: scenarios.{case}.expected_e2e_ms: 'fast' (str) is not a number"
        in err
    )
    assert err.count("(version skipped)") == 2
    df = read_store(store)
    assert sorted(set(df["commit"])) == sorted(good) and set(df["hardware"]) == {"CI RTX 5090 pool"}
    series = df[df["case_id"] == case].sort_values("time").groupby("metric")
    assert series.get_group("DecodingStage_ms")["value"].tolist() == [
        26550.0,
        26550.0,
        26550.0,
        13000.0,
        495.01,
    ]
    assert series.get_group("e2e_ms")["value"].tolist() == [30000.0, 27000.0, 27000.0, 23418.73, 23418.73]
    assert series.get_group("DecodingStage_ms")["commit"].tolist() == good
    assert series.get_group("runtime_peak_vram_mib")["value"].tolist() == [18246.0, 18246.0]
    tols = {c: json.loads(p)["tolerances"] for c, p in zip(df["commit"], df["provenance"])}
    flat_read = {"profile": "legacy/flat", **old_flat, "denoise_stage": 0.3, "non_denoise_stage": 0.3}
    assert tols[good[0]] == {**flat_read, "load_peak_vram": 0.01, "runtime_peak_vram": 0.02}
    assert tols[good[2]] == {
        "profile": "legacy/flat",
        **two_keys,
        "load_peak_vram": 0.01,
        "runtime_peak_vram": 0.02,
    }
    assert tols[good[3]] == {"profile": "pr_test", **profiled["pr_test"]}
    assert main(args) == 0
    assert "0 run(s) added, 5 already stored" in capsys.readouterr().out
    # a file none of whose versions can be read imports nothing and says so (exit 2)
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (bad_sha,) = _commit_versions(only_bad, only_bad / "perf_baselines.json", ["{not json"])
    assert main([*args[:2], str(only_bad), *args[3:]]) == 2
    err = capsys.readouterr().err
    assert "perf_baselines.json: no version could be read" in err and bad_sha[:10] in err


def test_history_check_of_a_run_with_no_history_is_exit_2_and_keeps_the_runs_summary(tmp_path: Path, capsys):
    import shutil

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "report"
    shutil.copytree(root / "examples/h200/report", run_dir)
    before = (run_dir / "summary.md").read_text()
    # its bundles were measured at two commits: --commit says which one this check is for
    commit = ["--commit", "cd7aa53b840fa5a8af34f76bdc554080726b16db"]
    assert main(["history", "check", str(run_dir), "--store", str(tmp_path / "store"), "-q", *commit]) == 2
    text = (run_dir / "history" / "summary.md").read_text()
    assert text.startswith("# History check: ERROR: nothing compared")
    assert "0 run(s) at the series' current level (needs 3)" in text
    assert (run_dir / "summary.md").read_text() == before


def test_a_real_step_alarms_on_its_second_run_and_with_confirm_1_on_its_first():
    """40 runs of 100 ms (1 % noise), then +10 %: by default (2 runs) the first run above is
    "unconfirmed" and the second a regression; a single slow run followed by a normal one never
    is; with --confirm 1 the first run above is a regression."""
    from perfkit.history.check import judge

    base = points(noisy(3, n=40, noise=0.01))
    j = judge(base, 110.0, metric="e2e_ms")
    assert j.status == "unconfirmed" and 98 < j.level < 102 and j.high < 105.5
    one = cp.Settings(confirm_runs=1)
    assert judge(base, 110.0, metric="e2e_ms", settings=one).status == "regression"
    after = base + points([110.0] * 41)[40:]  # one more run at +10 %, the next day
    assert judge(after, 110.5, metric="e2e_ms").status == "regression"
    slow_then_ok = base + points([110.0] * 41)[40:]
    slow_then_ok[-1] = cp.Point("k40", "40", "c0040", T0 + timedelta(days=40), 100.2)
    assert judge(slow_then_ok, 110.0, metric="e2e_ms").status == "unconfirmed"
    assert judge(base, 103.0, metric="e2e_ms").status == "ok"  # below the 5 % floor


def test_a_two_level_series_is_one_level_with_two_modes():
    """Runs alternating at random between 88 and 108 ms (0.5 % noise each): one level with two
    modes, no outlier; a run in either mode or between them is ok, one 10 % above the upper mode
    a regression (--confirm 1: the first such run); 100 unimodal series (1 % noise, 30 runs) are never split in two."""
    from perfkit.history.check import judge

    rng = np.random.default_rng(5)
    vals = np.where(rng.random(40) < 0.5, 88.0, 108.0) * np.exp(rng.normal(0, 0.005, 40))
    a = cp.analyse(points(vals), metric="e2e_ms")
    assert a.steps == [] and a.outliers == []
    lv = a.level()
    assert len(lv.modes) == 2 and sum(m.n for m in lv.modes) == 40
    assert abs(lv.modes[0].mean - 88) < 1 and abs(lv.modes[1].mean - 108) < 1
    for v, status in (
        (88.5, "ok"),
        (107.0, "ok"),
        (98.0, "ok"),
        (119.0, "regression"),
        (79.0, "improvement"),
    ):
        assert (
            judge(points(vals), v, metric="e2e_ms", settings=cp.Settings(confirm_runs=1)).status == status
        ), v
    split = [cp.two_modes(np.log(noisy(s, n=30, noise=0.01)), cp.Settings()) for s in range(100)]
    assert all(x is None for x in split)


def test_a_level_too_noisy_to_gate_says_not_gated_never_ok():
    """30 % noise: the smallest step the gate could see is far above 50 %, so a run inside and a
    run 50 % above both get "not gated" with the noise, and nothing is compared (exit 2)."""
    from perfkit.history.check import judge

    base = points(noisy(11, n=40, noise=0.3))
    for v in (100.0, 150.0):
        j = judge(base, v, metric="e2e_ms")
        assert j.status == "not gated", j
        assert j.reason.startswith("noise 2") or j.reason.startswith("noise 3"), j.reason
        assert "the smallest step it could see is +" in j.reason


def test_a_nightly_case_id_with_a_line_break_is_refused(tmp_path: Path, capsys):
    """Found by a breaker: a case id holding a newline was stored (case ids name files and rows)."""
    doc = {
        "commit_sha": "abc",
        "timestamp": "2026-11-01T00:00:00Z",
        "run_id": "1",
        "results": [{"case_id": "a\nb", "framework": "sglang", "latency_s": 1.0}],
    }
    f = tmp_path / "n.json"
    f.write_text(json.dumps(doc))
    assert main(["history", "import", str(f), "--store", str(tmp_path / "s"), "--hardware", "H"]) == 2
    assert "results.0.case_id: String should match pattern" in capsys.readouterr().err


def test_a_run_json_time_without_a_timezone_is_utc_whatever_the_local_zone(tmp_path: Path, monkeypatch):
    """run.json's ``finished`` without an offset is read as UTC, as the store and check read such times
    (it was read as the importing machine's local time)."""
    import shutil
    import time

    from perfkit.history.runs import read_suite_run

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "report"
    shutil.copytree(root / "examples/h200/report", run)
    doc = json.loads((run / "run.json").read_text())
    doc["replay"] = str(root / doc["replay"])
    (run / "run.json").write_text(json.dumps(doc | {"finished": "2026-03-01T10:00:00"}))
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        r = read_suite_run(run, commit="c1")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert r.time == datetime(2026, 3, 1, 10, tzinfo=timezone.utc)
    assert r.run_id == "report@2026-03-01T10:00:00+00:00"
