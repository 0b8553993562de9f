"""Issue 34: no input hangs a run, loses its data, or is half-read.

A real stand-in engine (tests/fake_engine.py) writes a 1 MiB stderr line, a NaN stage time and
an undecodable stage name; the launch is measured, assembled and saved as the investigations do.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import fake_engine
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.assemble import assemble
from perfkit.measuring.launch_rows import measure_launch
from perfkit.report.render import summary_markdown
from perfkit.report.runinfo import refused_records

MIB = 2**20


def _fake(*args: str) -> EngineSpec:
    return EngineSpec(
        kind="command",
        command_template=fake_engine.command(*args),
        startup_timeout_s=30,
    )


def _no_nan(text: str):
    def refuse(name: str):
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _run(tmp: Path, name: str, *args: str) -> tuple[ResultBundle, float]:
    t0 = time.perf_counter()
    reqs = [VideoRequestSpec(num_frames=9, height=64, width=64, num_inference_steps=2) for _ in range(3)]
    data = measure_launch(_fake(*args), reqs, tmp / name, "L", sample_interval_s=0.5, request_timeout_s=20)
    b = assemble("cold_warm", [data], {}, {"warm_median_ms": float("nan"), "ok": 1.0})
    b.save(tmp / "run" / name)
    return b, time.perf_counter() - t0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    _, plain_s = _run(tmp, "plain")
    bad, bad_s = _run(
        tmp, "bad", "--stderr-line-bytes", str(MIB), "--nan-request", "1", "--bad-utf8-request", "2"
    )
    print(
        f"launch+save wall: plain {plain_s:.2f} s, 1 MiB stderr line + bad records {bad_s:.2f} s",
        file=sys.stderr,
    )
    return tmp, plain_s, bad_s


def test_long_stderr_line_costs_under_10_s_and_is_kept(runs):
    tmp, plain_s, bad_s = runs
    assert bad_s - plain_s < 10, (plain_s, bad_s)
    saved = ResultBundle.load(tmp / "run" / "bad")
    longest = max(len(line) for line in saved.logs["L.stderr.log"].splitlines())
    assert longest == MIB  # kept whole, not cut


def test_refused_records_fail_their_requests_with_file_and_line(runs):
    tmp = runs[0]
    b = ResultBundle.load(tmp / "run" / "bad")
    req = b.requests.sort_values("index")
    measured = req[req["index"] >= 0]
    status = dict(zip(measured["index"], measured["status"]))
    assert status == {0: "completed", 1: "failed", 2: "failed"}
    err = dict(zip(measured["index"], measured["error"]))
    assert "performance.log:3: key 'stages[1].execution_time_ms'" in err[1] and "not a finite" in err[1]
    assert "performance.log:4: key '<utf-8>': invalid UTF-8 at byte" in err[2]
    assert not any("\ufffd" in s for s in b.stages["stage"].astype(str))  # never read with U+FFFD
    assert set(b.stages["request_id"]) == {"warmup-0", "req-0"}
    # summary.md names them (the run directory holds the bundle)
    lines = refused_records(tmp / "run")
    assert len(lines) == 2
    text = summary_markdown(tmp / "run")
    assert "performance.log:3" in text and "performance.log:4" in text
    from perfkit.report.render import page_context  # the report's Warnings box too

    assert sum("performance.log:" in w for w in page_context(tmp / "run")["warnings"]) == 2


def test_json_outputs_have_no_nan(runs):
    tmp = runs[0]
    d = tmp / "run" / "bad"
    for p in d.glob("*.json"):
        _no_nan(p.read_text())
    res = _no_nan((d / "results.json").read_text())
    meta = _no_nan((d / "meta.json").read_text())
    assert res["warm_median_ms"] is None and res["ok"] == 1.0
    assert "warm_median_ms" in meta["results_null"]


# ---- every input validated: baseline fields, params and -p nesting (exit 2, no traceback) ----

FIXTURE_BASELINE = Path(__file__).parent / "fixtures" / "perf_baselines_5090.json"
RECORD = {
    "request_id": "r1",
    "tag": "pipeline_stage_metrics",
    "stages": [{"name": "DenoisingStage", "execution_time_ms": 20.0}],
    "steps": [10.0, 10.0],
    "total_duration_ms": 25.0,
    "memory_snapshots": {},
}


def _invoke(*args: str):
    from click.testing import CliRunner

    from perfkit.cli import cli

    res = CliRunner().invoke(cli, list(args))
    out = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert res.exception is None or isinstance(res.exception, SystemExit), out
    assert "Traceback" not in out, out
    return res.exit_code, out


@pytest.mark.parametrize("threshold", ['"0.2"', "NaN", "-5", '"abc"', "1.5", "true"])
def test_baseline_threshold_refused_naming_file_and_key(tmp_path, threshold):
    doc = FIXTURE_BASELINE.read_text()
    base = json.loads(doc)
    text = json.dumps(base).replace(
        json.dumps({"improvement_reporting": base["improvement_reporting"]})[1:-1],
        f'"improvement_reporting": {{"threshold": {threshold}}}',
    )
    assert f'"threshold": {threshold}' in text
    bpath = tmp_path / "b.json"
    bpath.write_text(text)
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2, out
    assert f"{bpath}: improvement_reporting.threshold:" in out


def test_baseline_without_the_profile_is_refused_naming_the_file(tmp_path):
    """Found by the breaker: a baseline with no ``tolerances`` said "tolerance profile
    'pr_test' not in baseline (has: [])" without naming the file."""
    base = json.loads(FIXTURE_BASELINE.read_text())
    del base["tolerances"]
    bpath = tmp_path / "b.json"
    bpath.write_text(json.dumps(base))
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2, out
    assert f"{bpath}: tolerances: tolerance profile 'pr_test' not in baseline (has: [])" in out


def test_ab_side_that_is_a_binary_file_is_refused_naming_it(tmp_path):
    """Found by the breaker: ``perfkit ab --a some.bin`` was a UnicodeDecodeError traceback
    (exit 1)."""
    spec = tmp_path / "a.yaml"
    spec.write_bytes(b"kind: reference\n\xf0\x00\xff")
    ok = str(Path(__file__).resolve().parents[1] / "examples" / "ab" / "tiny-cpu.yaml")
    code, out = _invoke("ab", "--a", str(spec), "--b", ok, "--out", str(tmp_path / "ab"))
    assert code == 2, out
    assert f"--a: {spec}: not UTF-8 text (byte 16)" in out
    assert not (tmp_path / "ab").exists()  # nothing launched


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            "executable: [/nonexistent/venv/bin/sglang]\nmodel_path: /tmp\n",
            "does not exist or is not executable",
        ),
        (
            "executable: [sh]\nmodel_path: /nonexistent/tiny-sana-video\n",
            "'/nonexistent/tiny-sana-video' does not exist",
        ),
    ],
)
def test_ab_with_a_missing_sglang_or_model_exits_2_before_any_launch(tmp_path, fields, says):
    """Found by a new user: ``perfkit ab`` with a missing model directory was a traceback
    (exit 1); an absolute executable path that does not exist was called "not on PATH"."""
    spec = tmp_path / "a.yaml"
    spec.write_text("kind: sglang\n" + fields)
    ok = str(Path(__file__).resolve().parents[1] / "examples" / "ab" / "tiny-cpu.yaml")
    code, out = _invoke("ab", "--a", str(spec), "--b", ok, "--out", str(tmp_path / "ab"))
    assert code == 2, out
    assert f"--a: {spec}: EngineSpec." in out and says in out
    assert "Traceback" not in out and not (tmp_path / "ab").exists()


def test_params_nested_20000_levels_exit_2_naming_file(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("engine: " + "[" * 20000 + "]" * 20000 + "\n")
    code, out = _invoke("suite", "--params", str(deep), "--out", str(tmp_path / "out"))
    assert code == 2, out
    assert str(deep) in out and "nested deeper than 64 levels" in out


def test_p_value_nested_20000_levels_exit_2_naming_it(tmp_path):
    nb = Path(__file__).resolve().parents[1] / "notebooks" / "cold_warm.ipynb"
    code, out = _invoke("run", str(nb), "-p", "bundle_dir=" + "[" * 20000 + "]" * 20000)
    assert code == 2, out
    assert "-p bundle_dir:" in out and "nested deeper than 64 levels" in out


# ---- merge compares every part and shard (synthetic shards: no engine, no notebooks) ----


def _make_shards(tmp: Path) -> list[Path]:
    """Two shards of params/ci-cpu.yaml's plan (per-commit tier) as run_shard writes them, each
    part a saved bundle whose meta carries what run_unit and the investigations record."""
    from perfkit.params import load_params
    from perfkit.scaleout import shards
    from perfkit.scaleout.units import partition, plan_units

    root = Path(__file__).resolve().parents[1]
    params = load_params(root / "params" / "ci-cpu.yaml")
    selected, skipped = shards.select(params, tier="per-commit")
    units = plan_units(params, selected)
    parts = partition(units, 2)
    dirs = []
    for i in (1, 2):
        d = tmp / f"s{i}"
        outcomes = []
        for u in parts[i - 1]:
            for p in u.parts:
                meta = {
                    "git_commit": "a" * 40,
                    "perfkit_version": "0.1.0",
                    "params": {"spec": dict(u.engine), "request": dict(u.request)},
                    "commands": {p.id: [sys.executable, "-m", "perfkit.refengine", "--port", str(4000 + i)]},
                    "scaleout": {
                        "unit": u.id,
                        "part": p.id,
                        "planned": {"engine": u.engine, "request": u.request, "params": p.params},
                    },
                }
                ResultBundle(p.investigation, meta=meta).save(d / shards.UNITS_DIR / u.id / p.id)
            outcomes.append({"unit_id": u.id, "status": "ok", "attempts": 1, "wall_s": 1.0})
        manifest = {
            "kind": "perfkit-shard",
            "params_file": "params/ci-cpu.yaml",
            "params_sha256": shards.params_hash(params),
            "params": params.model_dump(),
            "partition": {"index": i, "total": 2},
            "selected": selected,
            "skipped": skipped,
            "tier": "per-commit",
            "units": [u.to_dict() for u in units],
            "outcomes": outcomes,
            "perfkit_commit": "a" * 40,
            "perfkit_version": "0.1.0",
            "executor": "inprocess",
        }
        (d / shards.MANIFEST).write_text(json.dumps(manifest))
        dirs.append(d)
    return dirs


IDENTITY_WORDS = ("measured with another", "records no", "measured for another plan")


def _identity(doc) -> list[str]:
    return [p for p in doc["problems"] if any(w in p for w in IDENTITY_WORDS)]


@pytest.fixture(scope="module")
def shard_dirs(tmp_path_factory):
    return _make_shards(tmp_path_factory.mktemp("shards"))


def _edit_meta(d: Path, edit) -> str:
    """Edit the meta.json of the last part of shard dir ``d``; returns the part id."""
    metas = sorted(d.glob("units/*/*/meta.json"))
    m = json.loads(metas[-1].read_text())
    edit(m)
    metas[-1].write_text(json.dumps(m))
    return metas[-1].parent.name


def test_merge_of_consistent_shards_has_no_identity_problem(shard_dirs, tmp_path):
    from perfkit.scaleout.shards import merge_shards

    doc = merge_shards(shard_dirs, tmp_path / "m")
    assert _identity(doc) == []
    assert doc["commits"] == ["a" * 40] and set(doc["parts"])
    assert doc["notes"] == []  # bundles saved today: nothing absent, every plan recorded


def test_merge_names_a_lost_additive_table_of_a_bundle_that_wrote_it(shard_dirs, tmp_path):
    """traces is additive (older bundles lack it: a note), but a bundle whose meta.tables says it
    was written and whose file is gone has lost data (a problem); without meta.tables (an older
    writer) the same absence is only noted."""
    import shutil

    from perfkit.scaleout.shards import merge_shards

    dirs = [tmp_path / d.name for d in shard_dirs]
    for src, dst in zip(shard_dirs, dirs):
        shutil.copytree(src, dst)
    meta = sorted(dirs[1].glob("units/*/*/meta.json"))[-1]
    part = meta.parent.name
    (meta.parent / "traces.parquet").unlink()
    doc = merge_shards(dirs, tmp_path / "m")
    assert any(p.startswith("unit ") and f"part {part} lacks traces.parquet" in p for p in doc["problems"])
    m = json.loads(meta.read_text())
    del m["tables"]  # as saved before the table existed
    meta.write_text(json.dumps(m))
    doc = merge_shards(dirs, tmp_path / "m2")
    assert not [p for p in doc["problems"] if "lacks" in p], doc["problems"]
    assert [n for n in doc["notes"] if f"part {part} " in n and "traces.parquet absent" in n]


@pytest.mark.parametrize(
    "what, edit",
    [
        ("commit", lambda m: m.update(git_commit="b" * 40)),
        ("perfkit version", lambda m: m.update(perfkit_version="0.2.0")),
        ("request", lambda m: m["params"]["request"].update(num_frames=25, height=96)),
        ("engine spec", lambda m: m["params"]["spec"].update(steps=7)),
        ("engine program", lambda m: m["commands"].update(x=["/usr/bin/sglang", "serve", "--port", "1"])),
        ("plan", lambda m: m["scaleout"]["planned"]["params"].update(repeats=9)),
    ],
)
@pytest.mark.parametrize("shard", [0, 1])
def test_merge_names_each_mismatch_in_any_part_and_shard(shard_dirs, tmp_path, what, edit, shard):
    import shutil

    from perfkit.scaleout.shards import merge_shards

    dirs = [tmp_path / d.name for d in shard_dirs]
    for src, dst in zip(shard_dirs, dirs):
        shutil.copytree(src, dst)
    part = _edit_meta(dirs[shard], edit)
    doc = merge_shards(dirs, tmp_path / "m")
    named = [p for p in _identity(doc) if f"part {part} " in p]
    assert named, doc["problems"]
    word = "measured for another plan" if what == "plan" else f"another {what} than"
    assert any(word in p for p in named), named


def test_merge_names_a_shard_of_another_commit_unless_allowed(shard_dirs, tmp_path):
    import shutil

    from perfkit.scaleout import shards

    dirs = [tmp_path / d.name for d in shard_dirs]
    for src, dst in zip(shard_dirs, dirs):
        shutil.copytree(src, dst)
    m = json.loads((dirs[1] / shards.MANIFEST).read_text())
    m["perfkit_commit"] = "c" * 40
    (dirs[1] / shards.MANIFEST).write_text(json.dumps(m))
    for meta in dirs[1].glob("units/*/*/meta.json"):
        doc = json.loads(meta.read_text())
        doc["git_commit"] = "c" * 40
        meta.write_text(json.dumps(doc))
    doc = shards.merge_shards(dirs, tmp_path / "m")
    assert any(p.startswith("shard 2/2") and "another commit" in p for p in doc["problems"])
    ok = shards.merge_shards(dirs, tmp_path / "m2", allow_mixed_commits=True)
    assert _identity(ok) == [] and ok["commits"] == ["a" * 40, "c" * 40]
    # the page and summary.md show each unit's commit
    from perfkit.report.runinfo import units_frame

    frame = units_frame({"scaleout": ok})
    assert set(frame["commit"].dropna()) == {"a" * 12, "c" * 12}


def test_compare_refuses_undecodable_stage_name_naming_file_and_line(tmp_path):
    log = tmp_path / "performance.log"
    good = json.dumps(RECORD).encode()
    log.write_bytes(good + b"\n" + good.replace(b"DenoisingStage", b"Denois\xff\xfeingStage") + b"\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(FIXTURE_BASELINE))
    assert code == 2, out
    assert f"{log}:2: key '<utf-8>': invalid UTF-8" in out


def test_compare_refuses_a_nan_record_naming_file_and_line(tmp_path):
    log = tmp_path / "performance.log"
    bad = dict(RECORD, total_duration_ms=float("nan"))
    log.write_text(json.dumps(RECORD) + "\n" + json.dumps(bad) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(FIXTURE_BASELINE))
    assert code == 2, out
    assert f"{log}:2: key 'total_duration_ms': nan is not a finite number" in out


def test_a_dropped_poll_connection_is_retried_and_a_gone_engine_is_still_lost(tmp_path):
    """A status poll whose connection the engine closes without an answer (uvicorn does so to a
    keep-alive connection when its loop was busy past the timeout: seen while a CPU engine gzipped
    a profiler trace) is repeated on a new connection; past POLL_RETRIES in a row it is lost."""
    from perfkit.engine.client import POLL_RETRIES

    reqs = [VideoRequestSpec(num_frames=9, height=64, width=64, num_inference_steps=2)]
    ok = measure_launch(
        _fake("--mode", "serve", "--drop-polls", str(POLL_RETRIES)), reqs, tmp_path / "ok", "L"
    )
    assert ok.error is None and [o.status for o in ok.outcomes] == ["completed"]
    lost = measure_launch(_fake("--mode", "serve", "--drop-polls", "100"), reqs, tmp_path / "lost", "L")
    (out,) = lost.outcomes
    assert out.status == "error" and f"({POLL_RETRIES + 1} polls in a row)" in out.error, out.error
    assert "lost the engine while polling" in out.error


def test_ab_whose_engine_rejects_every_request_is_an_error_after_one_launch(tmp_path):
    """Found by a new user: sglang given a model directory its detectors read as an image model
    answered every video request 400; perfkit ab ran all its launches (7 min) and said
    "undecided" (exit 1). Now a launch with every request rejected is a failed launch: the A/B
    ends once each side has run one, exit 2, with the engine's words."""
    spec = tmp_path / "a.yaml"
    spec.write_text(
        "kind: reference\npreset: tiny\ndevice: cpu\ncpu_threads: 1\nextra_args: [--max-frames, 9]\n"
    )
    out = tmp_path / "ab"
    code, text = _invoke(
        "ab", "--a", str(spec), "--b", str(spec), "-n", "2", "--max-launches", "2", "-m", "1",
        "--num-frames", "17", "--out", str(out),
    )  # fmt: skip
    assert code == 2, text
    summary = (out / "summary.md").read_text()
    assert "every request rejected by the engine (2): HTTP 400" in summary and "num_frames" in summary, (
        summary
    )
    assert sorted(p.name for p in (out / "launches").iterdir() if p.is_dir()) == ["A00", "B00"]
    # the terminal's line is plain text (a breaker saw summary.md's <code> in it)
    lines = [ln for ln in text.splitlines() if ln.startswith("perfkit ab: error:")]
    assert lines and all("<code>" not in ln and "&#" not in ln for ln in lines), lines
    assert "every request rejected" in lines[0], lines


def test_a_params_integer_of_5000_digits_exits_2_naming_the_file(tmp_path):
    """Found by a breaker: Python's 4,300-digit int limit escaped as a traceback (exit 1)."""
    p = tmp_path / "big.yaml"
    p.write_text("name: big\ntimeout_s: " + "9" * 5000 + "\n")
    code, out = _invoke("suite", "--params", str(p), "--out", str(tmp_path / "out"))
    assert code == 2, out
    assert str(p) in out and "a number too long to read" in out
    code, out = _invoke(
        "suite", "--params", str(Path(__file__).resolve().parents[1] / "params/ci-cpu.yaml"),
        "--set", "timeout_s=" + "9" * 5000, "--out", str(tmp_path / "out2"),
    )  # fmt: skip
    assert code == 2 and "a number too long to read" in out, out


# ---- issue 54's second breaker round: each found by a breaker, refused naming what was wrong ----


def test_a_renamed_stages_key_is_refused_not_read_as_every_stage_new(tmp_path):
    """``stage_ms`` for ``stages_ms`` passed with every stage "new" (nothing compared)."""
    base = json.loads(FIXTURE_BASELINE.read_text())
    case = next(iter(base["scenarios"]))
    base["scenarios"][case]["stage_ms"] = base["scenarios"][case].pop("stages_ms")
    bpath = tmp_path / "b.json"
    bpath.write_text(json.dumps(base))
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2 and f"scenarios.{case}.stage_ms: unknown key (did you mean 'stages_ms'?)" in out, out
    base["scenarios"][case] = {"notes": "x"}
    bpath.write_text(json.dumps(base))
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2 and f"scenarios.{case}: no metric (keys: notes)" in out, out


def test_an_oversized_baseline_is_refused_by_its_size_before_reading(tmp_path):
    from perfkit.gate.baseline.files import MAX_BASELINE_BYTES

    bpath = tmp_path / "b.json"
    with bpath.open("wb") as fh:
        fh.truncate(MAX_BASELINE_BYTES + 1)  # sparse: no disk, no read
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2 and f"{bpath}: {MAX_BASELINE_BYTES + 1:,} bytes, more than a baseline file holds" in out


def test_a_bundle_compared_with_its_own_runs_baseline_passes():
    """``compare --run RUN/cold_warm --baseline RUN/baseline.json`` named the case "cold_warm"
    and compared nothing; a bundle's cases are named as its run names them."""
    root = Path(__file__).resolve().parents[1]
    base = root / "examples/h200/report/baseline.json"
    code, out = _invoke(
        "compare", "--run", str(root / "examples/h200/bundles/cold_warm"), "--baseline", str(base)
    )
    assert code == 0 and "| ltx-2b_25f_512x768_30s_w17 | expected_e2e_ms |" in out, out
    shapes = str(root / "examples/h200/bundles/warmup_shapes")
    code, out = _invoke("compare", "--run", shapes, "--baseline", str(base), "--case", "nope")
    assert code == 2 and "no case 'nope'; its cases: ltx-2b_17f_512x768_30s_w17_shapes" in out, out


def test_a_huge_case_id_and_a_huge_figures_page_are_refused(tmp_path):
    from perfkit.report.figures import MAX_DOC_BYTES

    root = Path(__file__).resolve().parents[1]
    bundle = str(root / "examples/h200/bundles/cold_warm")
    code, out = _invoke(
        "baseline",
        "update",
        "--bundle",
        bundle,
        "--baseline",
        str(tmp_path / "b.json"),
        "--case",
        "x" * 100_000,
    )
    assert code == 2 and "1 to 200 printable characters" in out and not (tmp_path / "b.json").exists()
    page = tmp_path / "page.md"
    with page.open("wb") as fh:
        fh.truncate(MAX_DOC_BYTES + 1)
    code, out = _invoke("figures", str(page))
    assert code == 2 and "more than a Markdown page holds" in out


def test_a_manifest_of_10_to_the_12_shards_is_refused(shard_dirs, tmp_path):
    from perfkit.scaleout.units import MAX_SHARDS, PartitionError, parse_partition

    m = json.loads((shard_dirs[1] / "shard.json").read_text())
    m["partition"]["total"] = 10**12
    d = tmp_path / "s2"
    d.mkdir()
    (d / "shard.json").write_text(json.dumps(m))
    code, out = _invoke("merge", str(shard_dirs[0]), str(d), "--out", str(tmp_path / "m"))
    assert code == 2 and f"expected 1 <= index <= total <= {MAX_SHARDS}" in out, out
    with pytest.raises(PartitionError, match="N must be between 1 and 1024"):
        parse_partition("1/1025")


def test_a_corrupt_wheel_and_a_truncated_run_record_exit_2_naming_the_file(tmp_path):
    (tmp_path / "wheels").mkdir()
    whl = tmp_path / "wheels" / "foo-1.0-py3-none-any.whl"
    whl.write_bytes(b"PK\x03\x04 truncated")
    code, out = _invoke("wheelhouse", "install", str(tmp_path / "wheels"), "--target", str(tmp_path / "t"))
    assert code == 2 and f"{whl}: not a wheel" in out, out
    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    import shutil

    shutil.copytree(root / "examples/h200/report", run)
    (run / "run.json").write_text((root / "examples/h200/report/run.json").read_text()[:300])
    code, out = _invoke("report", str(run))
    assert code == 2 and f"{run / 'run.json'}: unreadable run record" in out, out
    (run / "run.json").write_text(json.dumps({"notebooks": {"a": 1}}))
    code, out = _invoke("report", str(run))
    assert code == 2 and "not a run record" in out, out


# ---- issue 54's third breaker round ----


def test_a_400_digit_number_in_a_baseline_is_refused_naming_the_key(tmp_path):
    """Was OverflowError in math.isnan, exit 1 (a regression's code) from compare, history add
    and baseline update."""
    root = Path(__file__).resolve().parents[1]
    b = tmp_path / "b.json"
    b.write_text((root / "baselines/h200.json").read_text().replace("973.1", "1" + "0" * 400, 1))
    code, out = _invoke("compare", "--run", str(root / "examples/h200/report"), "--baseline", str(b))
    assert code == 2 and "expected_e2e_ms: 100000000000… (401 digits) is above 1e+09" in out, out
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD).replace("20.0", "1" + "0" * 400) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(FIXTURE_BASELINE), "--case", "x")
    assert code == 2 and "(401 digits) is above 1e+09" in out and "inf" not in out, out


def test_a_key_given_twice_is_refused_in_baselines_dumps_and_params(tmp_path):
    """JSON and YAML keep the last of a key given twice: a second "scenarios" dropped every case
    of the first and `baseline update` wrote the file without them (exit 0)."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "baselines/h200.json").read_text()
    b = tmp_path / "b.json"
    b.write_text(text.rstrip()[:-1] + ', "scenarios": {}}')
    bundle = str(root / "examples/h200/bundles/cold_warm")
    code, out = _invoke("baseline", "update", "--bundle", bundle, "--baseline", str(b), "--case", "x")
    assert code == 2 and "key 'scenarios' given twice" in out and b.read_text().endswith('"scenarios": {}}')
    p = tmp_path / "p.yaml"
    p.write_text("name: x\ncold_warm:\n  enabled: true\ncold_warm:\n  enabled: false\n")
    from perfkit.params import ParamsError, load_params

    with pytest.raises(ParamsError, match="key 'cold_warm' given twice in one mapping"):
        load_params(p)
    from perfkit.readings.perfdump import loads_perf_dump
    from perfkit.readings.records import RecordError

    with pytest.raises(RecordError, match="key 'steps' given twice"):
        loads_perf_dump('{"steps": [], "steps": []}', "d.json")


def test_a_key_given_twice_is_refused_in_bundles_performance_logs_and_nightly_files(tmp_path):
    """A breaker's finds: a results.json with ``cold_ms`` given twice replayed as PASS with
    "cold request | 1 ms", a performance.log record's second ``total_duration_ms`` was compared,
    a nightly file's second ``latency_s`` stored; a 400-digit results value was an OverflowError
    naming neither file nor key; 1e400, NaN and Infinity were read as not measured."""
    import shutil

    from perfkit.bundle import ResultBundle, read_results
    from perfkit.history.runs import read_nightly_file
    from perfkit.history.store import HistoryError

    root = Path(__file__).resolve().parents[1]
    b = tmp_path / "cold_warm"
    shutil.copytree(root / "examples/h200/bundles/cold_warm", b)
    res = b / "results.json"
    text = res.read_text()
    assert '"cold_ms": 58427.881' in text
    res.write_text(text.replace('"cold_ms": 58427.881', '"cold_ms": 58427.881, "cold_ms": 1'))
    for read in (ResultBundle.load, read_results):
        with pytest.raises(ValueError, match=r"results\.json: key 'cold_ms' given twice"):
            read(b)
    res.write_text(text.replace('"cold_ms": 58427.881', '"cold_ms": 1' + "0" * 400))
    with pytest.raises(ValueError, match=r"results\.json: an integer of 401 digits"):
        ResultBundle.load(b)
    for bad, shown in (("1e400", "inf"), ("NaN", "nan"), ("-Infinity", "-inf")):
        res.write_text(text.replace('"cold_ms": 58427.881', f'"cold_ms": {bad}'))
        for read in (ResultBundle.load, read_results):
            with pytest.raises(ValueError, match=rf"results\.json: cold_ms: {shown} is not a finite number"):
                read(b)
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD)[:-1] + ', "request_id": "r2"}\n')
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(FIXTURE_BASELINE), "--case", "x")
    assert code == 2 and "key 'request_id' given twice" in out, out
    res.write_text(text)
    meta = b / "meta.json"
    meta.write_text(
        meta.read_text().replace('"scenario": "cold_warm"', '"scenario": "<svg onload=alert(9)>|x"', 1)
    )
    with pytest.raises(
        ValueError, match=r"meta\.json: scenario: '<svg onload=alert\(9\)>\|x' is not an investigation name"
    ):
        ResultBundle.load(b)
    nightly = tmp_path / "n.json"
    src = (root / "tests/fixtures/sglang-nightly/2026-03-19_23294950463.json").read_text()
    nightly.write_text(src.replace('"latency_s": 7.586', '"latency_s": 7.586, "latency_s": 99', 1))
    with pytest.raises(HistoryError, match="n.json: key 'latency_s' given twice"):
        read_nightly_file(nightly, "H100")


def test_a_bundle_table_with_a_row_twice_a_fractional_index_or_millions_of_rows_is_refused(
    tmp_path, monkeypatch
):
    """A breaker's finds: a stage row given twice was summed (DenoisingStage 827 -> 1654 ms, a
    false fail), a request row twice compared the wrong one, an index 1.5 rounded to another
    request's row, 9.6 M stage rows read for 125 s at 4.2 GB."""
    import shutil

    import perfkit.bundle as bundle
    from perfkit.bundle import ResultBundle

    root = Path(__file__).resolve().parents[1]
    b = tmp_path / "cold_warm"
    shutil.copytree(root / "examples/h200/bundles/cold_warm", b)
    stages, requests = b / "stages.parquet", b / "requests.parquet"
    st0, rq0 = pd.read_parquet(stages), pd.read_parquet(requests)
    pd.concat([st0, st0[(st0.stage == "DenoisingStage") & (st0["index"] >= 1)].head(1)]).to_parquet(
        stages, index=False
    )
    with pytest.raises(
        ValueError, match=r"stages\.parquet: two rows for launch .*, index .*, stage 'DenoisingStage'"
    ):
        ResultBundle.load(b)
    st0.to_parquet(stages, index=False)
    pd.concat([rq0, rq0[rq0["index"] == 1]]).to_parquet(requests, index=False)
    with pytest.raises(ValueError, match=r"requests\.parquet: two rows for launch .*, index 1"):
        ResultBundle.load(b)
    frac = rq0.astype({"index": "float64"})
    frac.loc[frac["index"] == 1, "index"] = 1.5
    frac.to_parquet(requests, index=False)
    with pytest.raises(ValueError, match=r"requests\.parquet: column 'index' holds 1\.5, not an integer"):
        ResultBundle.load(b)
    rq0.to_parquet(requests, index=False)
    assert len(ResultBundle.load(b).requests) == len(rq0)
    monkeypatch.setattr(bundle, "MAX_ROWS", len(st0) - 1)
    with pytest.raises(ValueError, match=r"stages\.parquet: \d+ rows, over the limit"):
        ResultBundle.load(b)


def test_oversized_params_logs_and_load_traces_are_refused_before_reading(tmp_path):
    from perfkit.engine.client import VideoRequestSpec
    from perfkit.investigations import load_measure
    from perfkit.investigations.registry import InvestigationError
    from perfkit.params import MAX_YAML_BYTES, ParamsError, load_params
    from perfkit.readings.records import MAX_LINE_BYTES

    def sparse(name: str, size: int) -> Path:
        f = tmp_path / name
        with f.open("wb") as fh:
            fh.truncate(size)  # no disk, and reading it would take the memory
        return f

    with pytest.raises(ParamsError, match="over the limit of 1,048,576"):
        load_params(sparse("p.yaml", MAX_YAML_BYTES + 1))
    log = sparse("performance.log", MAX_LINE_BYTES + 10)
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(FIXTURE_BASELINE), "--case", "x")
    assert code == 2 and f"longer than {MAX_LINE_BYTES:,} bytes" in out, out
    with pytest.raises(InvestigationError, match="bytes, over"):
        load_measure.read_trace(sparse("t.jsonl", load_measure.MAX_BYTES + 1), VideoRequestSpec())
    (tmp_path / "big.jsonl").write_text('{"num_frames": 100000}\n')
    with pytest.raises(InvestigationError, match="big.jsonl:1"):
        load_measure.read_trace(tmp_path / "big.jsonl", VideoRequestSpec())


def test_a_hung_capped_launch_is_an_error_not_a_held_budget(tmp_path):
    """A capped launch whose engine stopped answering (SIGSTOP: request 0 timed out, perfkit
    ended it) read "did not complete, held" and PASS."""
    import shutil

    from perfkit.investigations import memory_budget as mb
    from perfkit.investigations.registry import InvestigationError

    root = Path(__file__).resolve().parents[1]
    d = tmp_path / "mb"
    shutil.copytree(root / "examples/h200/bundles/memory_budget", d)
    b = ResultBundle.load(d)
    mb.check_bundle(b)  # as recorded: every request completed
    req = b.requests
    last = req.index[req["launch"] == req["launch"].iloc[-1]][0]
    req.loc[last, ["status", "error"]] = ["timeout", "request r not finished after 15 s"]
    with pytest.raises(
        InvestigationError,
        match=r"launch cap\d: request -?\d+ timed out .*: the engine hung, not a budget verdict",
    ):
        mb.check_bundle(b)


def test_load_levels_are_validated_together_in_the_notebook():
    """`--set load.concurrency=[1] --set load.requests_per_level=2` passed the suite and failed
    in the notebook: each field was checked against the other's default."""
    from perfkit.nbparams import validate
    from perfkit.params import ParamsError

    assert validate("load", {"concurrency": [1], "requests_per_level": 2})["concurrency"] == [1]
    with pytest.raises(ParamsError, match=r"load: concurrency \[5\] above requests_per_level 2"):
        validate("load", {"concurrency": [1, 5], "requests_per_level": 2})


def test_an_output_directory_under_a_file_exits_2_in_one_line(tmp_path, capsys):
    from perfkit.cli import main

    (tmp_path / "afile").write_text("")
    root = Path(__file__).resolve().parents[1]
    code = main(
        [
            "ab",
            "--replay",
            str(root / "examples/ab/aa/a"),
            str(root / "examples/ab/aa/b"),
            "--out",
            str(tmp_path / "afile/ab"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "perfkit ab: error: [Errno 20] Not a directory" in err and "Traceback" not in err


def test_only_and_tier_that_select_nothing_are_refused_before_anything_runs(tmp_path):
    from perfkit.params import ParamsError, load_params
    from perfkit.scaleout.shards import select

    p = load_params(Path(__file__).resolve().parents[1] / "params/ci-cpu.yaml")
    with pytest.raises(
        ParamsError, match="nothing selected: cold_warm: tier per-commit, not selected by --tier extra"
    ):
        select(p, only=["cold_warm"], tier="extra")


def test_hostile_stage_names_stay_inert_in_the_ab_summary(tmp_path):
    """Side stage names went raw into summary.md's "still inconclusive"/"undecided" lines (a live
    <svg>, a newline splitting the bullet) and split the console line."""
    import shutil

    import pandas as pd

    from perfkit.ab.decide import AbResult

    root = Path(__file__).resolve().parents[1]
    hostile = "TextEnc`x`<svg onload=alert(1)>|a\nb<script>alert(2)</script>"
    for side in ("a", "b"):
        shutil.copytree(root / "examples/ab/aa" / side, tmp_path / side)
        f = tmp_path / side / "stages.parquet"
        s = pd.read_parquet(f)
        s["stage"] = s["stage"].replace("TextEncodingStage", hostile)
        s.to_parquet(f)
    out = tmp_path / "out"
    code, text = _invoke(
        "ab",
        "--replay",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "--out",
        str(out),
    )
    md = (out / "summary.md").read_text()
    assert "<svg" not in md and "<script>" not in md and "&lt;svg onload=alert(1)&gt;" in md, md
    assert AbResult.load(out).table["metric"].str.contains("svg onload").any()
    assert all("\n" not in ln or ln.startswith("perfkit") for ln in text.splitlines())


def test_a_baseline_whose_every_metric_is_null_compares_nothing_exit_2(tmp_path):
    """Every metric of the run's case null in the baseline: nothing compared (exit 2, the file
    named), never a regression (exit 1)."""
    from perfkit.gate import baseline as bl

    doc = bl.new_baseline("cpu")
    doc["scenarios"]["performance"] = {"stages_ms": {"DenoisingStage": None}, "expected_e2e_ms": None}
    bpath = tmp_path / "b.json"
    bl.save_baseline(doc, bpath)
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2 and f"every metric of {bpath}" in out, out


def test_a_run_whose_params_yaml_is_a_list_is_refused_naming_it(tmp_path):
    from perfkit.gate.run import run_cases

    (tmp_path / "params.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="params.yaml: top level must be a mapping, got list"):
        run_cases(tmp_path)
    code, out = _invoke("compare", "--run", str(tmp_path), "--baseline", str(FIXTURE_BASELINE))
    assert code == 2 and f"{tmp_path / 'params.yaml'}: top level must be a mapping" in out, out
