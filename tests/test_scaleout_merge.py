"""Partitions and merge, for real on the tiny reference engine (CPU): a small suite derived from
params/ci-cpu.yaml (shared launches: warmup_shapes' 17-frame warmup, memory_budget's unlimited
budget and offload mode none reuse cold_warm's session; multi-launch investigations split into units:
warmup_shapes, memory_budget, offload_modes; an investigation of tier ``extra``: overhead) run
unsplit (through a local Ray: test_ray_suite's subject too; the in-process executor's unsplit
run is test_suite's live ci-cpu run), then as shards 1/2 and 2/2 through the CLI (in process)
and merged: same verdict, same tables bar timing values. A deleted shard, a failed unit and shards of other params exit 2, named; the six
malformed manifests are six copies of shard 2/2 in one merge, a failed unit and a lost table
file one broken copy in one merge. The executor's mechanics (the
inprocess executor, every unit failing) run the stand-in engine (tests/fake_engine.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import fake_engine
from perfkit.bundle import ResultBundle
from perfkit.gate import verdicts
from perfkit.investigations.cold_warm import NAME as COLD_WARM
from perfkit.investigations.memory_budget import NAME as MEMORY_BUDGET
from perfkit.investigations.offload_modes import NAME as OFFLOAD_MODES
from perfkit.investigations.overhead import NAME as OVERHEAD
from perfkit.investigations.warmup_shapes import NAME as WARMUP_SHAPES
from perfkit.params import load_yaml
from perfkit.scaleout import merge as shard_manifest
from perfkit.scaleout import shards
from perfkit.suite import SCALEOUT

ROOT = Path(__file__).resolve().parents[1]
TIERED = "tier extra, not selected by --tier per-commit"


def perfkit(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=os.environ.copy(),
    )


def small_params(path: Path, **changes) -> Path:
    """params/ci-cpu.yaml made smaller; timing invariants off (a shared 2-core runner makes
    them differ between two runs; the deterministic ones stay: compiles, caps)."""
    doc = load_yaml((ROOT / "params" / "ci-cpu.yaml").read_text())
    doc["name"] = "ci-cpu-scaleout"
    doc[COLD_WARM] = {"enabled": True, "repeats": 3}
    doc[WARMUP_SHAPES] = {"enabled": True, "warmup_frames": [17, 25], "request_frames": [25], "repeats": 2}
    # two budgets (the unlimited one reuses cold_warm's session) and two modes (none reuses it
    # too; model is refused by the CPU engine: "not applicable"): both split into units
    doc[OFFLOAD_MODES] = {**doc[OFFLOAD_MODES], "modes": ["none", "model"]}
    doc[OVERHEAD] = {"enabled": True, "tier": "extra"}
    for key in (
        "warm_cold_ratio_max",
        "covered_first_request_max_ratio",
        "latency_drift_max",
        "host_anon_slope_mib_per_request_max",
        "offload_warm_not_slower",  # warm within 10 % of cold: the VM's two speeds break it
    ):
        doc["invariants"][key] = None
    doc.update(changes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def stand_in_params(path: Path, *engine_args: str) -> Path:
    """:func:`small_params` on the stand-in engine (tests/fake_engine.py, mode serve, no load or
    warmup wait; ``engine_args`` appended): for the tests of the executor's mechanics (units,
    attempts, manifest, report), where the model is not the subject. The warm/cold ratio check
    is back on (ci-cpu's limit): the stand-in compiles nothing and reports no memory, so without
    it every check would be skipped (exit 2, nothing measured); it may pass or fail (exit 0/1)."""
    doc = load_yaml(small_params(path).read_text())
    doc["invariants"]["warm_cold_ratio_max"] = 1.0
    doc["engine"] = {
        "kind": "command",
        "command": fake_engine.command("--mode", "serve", "--load-s", "0", "--warmup-s", "0", *engine_args),
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def make_runs(tmp: Path) -> dict:
    """Unsplit, shard 1/2, shard 2/2, merged (all --tier per-commit) in ``tmp``, with wall times:
    conftest's session fixture ``scaleout_runs`` (shared with test_ray_suite) calls it once. The
    unsplit run goes through ``--executor ray`` (``executor``: "ray", or "default" without Ray),
    so one suite run serves both modules: merged in-process shards equal to the Ray run."""
    params = small_params(tmp / "params.yaml")
    walls = {}
    ray = importlib.util.find_spec("ray") is not None
    out = {"params": params, "tmp": tmp, "walls": walls, "executor": "ray" if ray else "default"}
    tier = ["--tier", "per-commit"]
    quiet = ["-q", "--no-screenshot"]
    executor = ["--executor", "ray"] if ray else []
    for key, args in (
        (
            "unsplit",
            ["suite", "--params", str(params), *executor, "--out", str(tmp / "unsplit"), *tier, *quiet],
        ),
        (
            "s1",
            ["suite", "--params", str(params), "--partition", "1/2", "--out", str(tmp / "s1"), *tier, "-q"],
        ),
        (
            "s2",
            ["suite", "--params", str(params), "--partition", "2/2", "--out", str(tmp / "s2"), *tier, "-q"],
        ),
        ("merged", ["merge", str(tmp / "s1"), str(tmp / "s2"), "--out", str(tmp / "merged"), *quiet]),
    ):
        t0 = time.monotonic()
        out[key] = perfkit(*args)
        walls[key] = round(time.monotonic() - t0, 1)
        out[f"{key}_dir"] = tmp / key
    (tmp / "walls.json").write_text(json.dumps(walls))
    print("wall times (s):", walls, file=sys.stderr)
    return out


@pytest.fixture(scope="module")
def runs(scaleout_runs):
    """:func:`make_runs`' outputs (the session's ``scaleout_runs``)."""
    return scaleout_runs


def _verdict_rows(run: Path) -> list[tuple]:
    df = verdicts.collect_verdicts(run)
    cols = [c for c in ("notebook", "scenario", "check", "metric", "status") if c in df.columns]
    return sorted(map(tuple, df[cols].astype(str).to_numpy().tolist()))


#: columns compared between runs (labels, shapes, counts, statuses: no timing values)
_REQ_COLS = ["launch", "index", "num_frames", "height", "width", "status", "latent_shape", "compiles"]


def _tables(bundle: ResultBundle) -> dict[str, object]:
    req = bundle.requests
    keep = [c for c in _REQ_COLS if c in req.columns]
    return {
        "requests": req[keep].astype(str).sort_values(keep).to_numpy().tolist(),
        "launches": sorted(bundle.launches["launch"].astype(str)),
        "stages": sorted(bundle.stages[["launch", "stage"]].astype(str).itertuples(index=False, name=None))
        if not bundle.stages.empty
        else [],
        "steps": len(bundle.steps),
        "records": {k: len(v) for k, v in bundle.records.items()},
        "params": bundle.meta.get("params"),
    }


def test_shards_exit_0_and_write_manifests(runs):
    for key in ("s1", "s2"):
        assert runs[key].returncode == 0, runs[key].stdout + runs[key].stderr[-3000:]
        m = json.loads((runs[f"{key}_dir"] / shards.MANIFEST).read_text())
        assert m["partition"]["total"] == 2 and m["perfkit_commit"]
        # all shards' units, the same plan: one launch of 300 s (default) each, since the parts
        # that reuse cold_warm's launch cost nothing; equal estimates go in unit-id order to
        # the least-loaded shard (ties: the lower one), two units a shard
        assert [(u["id"], u["shard"]) for u in m["units"]] == [
            (COLD_WARM, 1),
            (f"{WARMUP_SHAPES}.warmup25", 2),
            (f"{MEMORY_BUDGET}.cap1", 2),
            (f"{OFFLOAD_MODES}.model", 1),
        ]
        assert all(o["status"] == "ok" and o["wall_s"] > 0 for o in m["outcomes"])
        assert m["skipped"][OVERHEAD] == TIERED
        # bundles only: no notebooks, no report
        assert (
            not list(runs[f"{key}_dir"].rglob("*.ipynb"))
            and not (runs[f"{key}_dir"] / "report.html").exists()
        )
    m1 = json.loads((runs["s1_dir"] / shards.MANIFEST).read_text())
    m2 = json.loads((runs["s2_dir"] / shards.MANIFEST).read_text())
    assert m1["units"] == m2["units"] and m1["params_sha256"] == m2["params_sha256"]
    # the shared launch: warmup17 ran in cold_warm's unit, after it, in one shard
    first = m1["units"][0]
    assert [p["investigation"] for p in first["parts"]] == [
        COLD_WARM,
        WARMUP_SHAPES,
        MEMORY_BUDGET,
        OFFLOAD_MODES,
    ]


def test_merged_equals_unsplit(runs):
    un, mg = runs["unsplit"], runs["merged"]
    assert un.returncode in (0, 1), un.stdout + un.stderr[-3000:]
    assert mg.returncode == un.returncode, mg.stdout + mg.stderr[-3000:]
    a, b = runs["unsplit_dir"], runs["merged_dir"]
    ra, rb = json.loads((a / "run.json").read_text()), json.loads((b / "run.json").read_text())
    assert ra["status"] == rb["status"]
    sa = {n["name"]: (n["status"], n.get("reason")) for n in ra["notebooks"]}
    sb = {n["name"]: (n["status"], n.get("reason")) for n in rb["notebooks"]}
    assert sa == sb
    assert sa[OVERHEAD] == ("skipped", TIERED)  # --tier per-commit ran only those
    assert not (a / OVERHEAD).exists() and not (b / OVERHEAD).exists()
    assert _verdict_rows(a) == _verdict_rows(b)
    for name in (COLD_WARM, WARMUP_SHAPES, MEMORY_BUDGET, OFFLOAD_MODES):
        ba, bb = ResultBundle.load(a / name), ResultBundle.load(b / name)
        assert _tables(ba) == _tables(bb), name
        assert ba.results.get("reused_launches") == bb.results.get("reused_launches"), name
    mb_a, mb_b = ResultBundle.load(a / MEMORY_BUDGET), ResultBundle.load(b / MEMORY_BUDGET)
    keys = ("label", "host_cap_gib", "completed", "n_completed", "cap_held")
    assert [{k: c.get(k) for k in keys} for c in mb_a.results["caps"]] == [
        {k: c.get(k) for k in keys} for c in mb_b.results["caps"]
    ]
    om_a, om_b = ResultBundle.load(a / OFFLOAD_MODES), ResultBundle.load(b / OFFLOAD_MODES)
    keys = ("mode", "label", "status", "reused_from")
    assert [{k: e.get(k) for k in keys} for e in om_a.results["modes"]] == [
        {k: e.get(k) for k in keys} for e in om_b.results["modes"]
    ]
    assert om_a.results.get("device") == om_b.results.get("device")
    wa, wb = ResultBundle.load(a / WARMUP_SHAPES), ResultBundle.load(b / WARMUP_SHAPES)
    assert wa.results["reused_launches"] == wb.results["reused_launches"] == ["warmup17"]
    cov = [
        {k: c.get(k) for k in ("warmup_frames", "request_frames", "covered", "compiles")}
        for c in wa.results["coverage"]
    ]
    assert cov == [
        {k: c.get(k) for k in ("warmup_frames", "request_frames", "covered", "compiles")}
        for c in wb.results["coverage"]
    ]
    assert len(wb.results["warm_across_warmups"]) == len(wa.results["warm_across_warmups"]) == 1
    # baseline cases, summary table rows
    ja, jb = json.loads((a / "baseline.json").read_text()), json.loads((b / "baseline.json").read_text())
    assert sorted(ja["scenarios"]) == sorted(jb["scenarios"])
    # merged bundles name their units; the merge file records outcomes and concurrency (none here)
    merge = json.loads((b / shards.MERGED_DIR / shards.MERGE_FILE).read_text())
    assert merge["problems"] == [] and merge["concurrent"] == []
    assert wb.meta["scaleout"]["parts"] == [f"{WARMUP_SHAPES}.warmup17", f"{WARMUP_SHAPES}.warmup25"]
    assert rb["scaleout"]["problems"] == []
    # the merged run lists every unit, each ok once (a plain run's lack of one: test_suite)
    units = (b / "summary.md").read_text().split("### Units of work", 1)[1].split("###", 1)[0]
    units = units.split("<details>", 1)[0]  # the passing gate rows follow, collapsed
    rows = [ln for ln in units.splitlines() if ln.startswith("| ") and not ln.startswith("| unit")]
    assert len(rows) == len(merge["units"]) and all("| ok | 1 |" in ln for ln in rows), units
    print("wall times (s):", runs["walls"], file=sys.stderr)


def _summary_and_report(run: Path) -> tuple[str, str, dict]:
    return (
        (run / "summary.md").read_text(),
        (run / "report.html").read_text(),
        json.loads((run / "run.json").read_text()),
    )


def test_deleted_shard_exits_2_naming_it(runs, tmp_path):
    out = tmp_path / "merged"
    proc = perfkit("merge", str(runs["s1_dir"]), "--out", str(out), "-q", "--no-screenshot")
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    summary, report, run = _summary_and_report(out)
    for text in (summary, report, json.dumps(run)):
        assert "shard 2/2 missing" in text and f"{WARMUP_SHAPES}.warmup25" in text
    assert run["exit_code"] == 2
    assert any(n["name"] == SCALEOUT and n["status"] == "error" for n in run["notebooks"])


def test_deleted_unit_output_and_failed_unit_exit_2(runs, tmp_path):
    s2 = tmp_path / "s2"
    shutil.copytree(runs["s2_dir"], s2)
    shutil.rmtree(s2 / shards.UNITS_DIR)  # the manifest stays, the outputs are gone
    s1 = tmp_path / "s1"
    shutil.copytree(runs["s1_dir"], s1)
    m = json.loads((s1 / shards.MANIFEST).read_text())
    m["outcomes"][0].update(status="error", error="RuntimeError: engine crashed")
    (s1 / shards.MANIFEST).write_text(json.dumps(m))
    out = tmp_path / "merged"
    proc = perfkit("merge", str(s1), str(s2), "--out", str(out), "-q", "--no-screenshot")
    # nothing could be merged: exit 2 with every problem named (no report without bundles)
    assert proc.returncode == 2
    assert "engine crashed" in proc.stderr and "is missing" in proc.stderr and "warmup25" in proc.stderr


def test_shards_of_other_params_exit_2(runs, tmp_path):
    other = small_params(tmp_path / "other.yaml", description="another")
    out = tmp_path / "merged"
    proc = perfkit(
        "merge", str(runs["s1_dir"]), str(runs["s2_dir"]), "--params", str(other), "--out", str(out), "-q"
    )
    assert proc.returncode == 2
    # every shard is refused: nothing merged, both named
    assert "other params" in proc.stderr and "shard 1/2" in proc.stderr and "shard 2/2" in proc.stderr
    # the key that differs is named, with both values
    assert 'description "another" ≠' in proc.stderr or "description" in proc.stderr.split("other params")[1]


@pytest.fixture(scope="module")
def broken_s2(runs, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, dict, str]:
    """One ``perfkit merge`` of shard 1/2 with a copy of shard 2/2 broken two ways, one unit each:
    its first unit (warmup25) failed (the manifest's outcome: an error after 2 attempts), and its
    second unit (cap1) ran but lost a table file (requests.parquet deleted). Each is read per unit,
    so each is named on its own: one merge (its notebooks, gate and report) instead of two.
    Returns (the merge, its run dir, the lost table's unit, the lost table's part id)."""
    tmp = tmp_path_factory.mktemp("broken-s2")
    s2 = tmp / "s2"
    shutil.copytree(runs["s2_dir"], s2)
    m = json.loads((s2 / shards.MANIFEST).read_text())
    m["outcomes"][0].update(status="error", error="RuntimeError: node lost", attempts=2)
    (s2 / shards.MANIFEST).write_text(json.dumps(m))
    unit = [u for u in m["units"] if u["shard"] == 2][1]
    assert unit["id"] != m["outcomes"][0]["unit_id"]  # the lost table is in a unit that ran
    part = unit["parts"][0]
    pid = part["investigation"] + (f".{part['key']}" if part.get("key") else "")
    (s2 / shards.UNITS_DIR / unit["id"] / pid / "requests.parquet").unlink()
    out = tmp / "merged"
    proc = perfkit("merge", str(runs["s1_dir"]), str(s2), "--out", str(out), "-q", "--no-screenshot")
    return proc, out, unit, pid


def test_failed_unit_with_other_bundles_is_named_in_the_report(broken_s2):
    proc, out, _, _ = broken_s2
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    summary, report, run = _summary_and_report(out)
    for text in (summary, report, json.dumps(run)):
        assert "node lost" in text and f"{WARMUP_SHAPES}.warmup25" in text
    # the investigation missing a part is not replayed as if complete
    st = {n["name"]: n["status"] for n in run["notebooks"]}
    assert st[WARMUP_SHAPES] == "skipped"
    # the units table names the failed unit, its attempts and its error, on the page too
    units = summary.split("### Units of work", 1)[1].split("###", 1)[0]
    failed = [ln for ln in units.splitlines() if "node lost" in ln]
    assert len(failed) == 1 and "| error | 2 |" in failed[0], units
    assert 'id="units"' in report and "node lost" in report.split('id="units"', 1)[1].split("</table>", 1)[0]


def test_executor_inprocess_runs_units_then_the_report(tmp_path):
    """``perfkit suite --executor inprocess``: every unit (one shard of one), merged, replayed.
    On the stand-in engine: what is tested is the executor (its unit, manifest, merge, report)."""
    params = stand_in_params(tmp_path / "params.yaml")
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        str(params),
        "--executor",
        "inprocess",
        "--only",
        COLD_WARM,
        "--out",
        str(out),
        "-q",
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    st = {n["name"]: n["status"] for n in run["notebooks"]}
    assert st[COLD_WARM] == "ok" and st[WARMUP_SHAPES] == "skipped"
    assert run["scaleout"]["problems"] == [] and [o["unit_id"] for o in run["scaleout"]["outcomes"]] == [
        COLD_WARM
    ]
    assert (out / "shards" / "1" / shards.MANIFEST).is_file() and (out / "report.html").is_file()


def test_a_lost_table_file_is_named_not_read_as_empty(broken_s2):
    proc, out, unit, pid = broken_s2
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    summary, report, run = _summary_and_report(out)
    for text in (summary, report, json.dumps(run["scaleout"]["problems"])):
        assert f"unit {unit['id']}: part {pid} lacks requests.parquet" in text


#: six ways a shard manifest can be malformed, and the words its problem must hold
MALFORMED = [
    (lambda m: m.update(units=None), "units must be a list"),
    (lambda m: m["units"].__setitem__(1, None), "units[1] must be a mapping"),
    (lambda m: m["units"][0].pop("parts"), "missing key 'parts'"),
    (lambda m: m["partition"].update(index="two"), "partition.index must be an integer"),
    (lambda m: m["units"][0].update(shard="1"), ".shard must be an integer"),
    (lambda m: m["outcomes"][0].pop("status"), "outcomes must be a list"),
]


@pytest.fixture(scope="module")
def malformed(runs, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, dict[str, Path]]:
    """One ``perfkit merge`` of shard 1/2 with six copies of shard 2/2, each copy's manifest
    malformed one way (:data:`MALFORMED`): each manifest is read on its own (``_read_manifest``
    per directory), so each copy is a problem of its own, named by its path; one merge (its
    notebooks, gate and report) instead of six."""
    tmp = tmp_path_factory.mktemp("malformed")
    copies = {}
    for i, (edit, words) in enumerate(MALFORMED):
        s2 = tmp / f"s2-{i}"
        shutil.copytree(runs["s2_dir"], s2)
        m = json.loads((s2 / shards.MANIFEST).read_text())
        edit(m)
        (s2 / shards.MANIFEST).write_text(json.dumps(m))
        copies[words] = s2
    out = tmp / "merged"
    proc = perfkit(
        "merge", str(runs["s1_dir"]), *map(str, copies.values()), "--out", str(out), "-q", "--no-screenshot"
    )
    return proc, out, copies


@pytest.mark.parametrize("edit, words", MALFORMED)
def test_a_malformed_manifest_is_a_named_problem(malformed, edit, words):
    proc, out, copies = malformed
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    _, report, run = _summary_and_report(out)  # summary.md clips long errors; these are whole
    problems = json.dumps(run["scaleout"]["problems"])
    assert "malformed shard manifest" in problems and words in problems, problems
    # the problem naming this copy's manifest is the one that says it
    mine = [p for p in run["scaleout"]["problems"] if p.startswith(f"{copies[words] / shards.MANIFEST}: ")]
    assert len(mine) == 1 and "malformed shard manifest" in mine[0] and words in mine[0], problems
    assert "malformed shard manifest" in report


_RAY_SHARD = Path(__file__).resolve().parents[1] / "examples" / "h200x2" / "scaleout" / "ray"


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda o: o.update(wall_s="164.26"),
            "outcomes[0] (cold_warm).wall_s: Input should be a valid number, got '164.26'",
        ),
        (
            lambda o: o.update(wall_s=float("inf")),
            "outcomes[0] (cold_warm).wall_s: Input should be a finite number",
        ),
        (
            lambda o: o.update(wall_s=-5),
            "outcomes[0] (cold_warm).wall_s: Input should be greater than or equal to 0",
        ),
        (
            lambda o: o.update(attempts="1"),
            "outcomes[0] (cold_warm).attempts: Input should be a valid integer",
        ),
        (
            lambda o: o.update(started_at="yesterday"),
            "outcomes[0] (cold_warm).started_at: Input should be a valid number",
        ),
        (
            lambda o: o.update(gpu_uuids="GPU-1"),
            "outcomes[0] (cold_warm).gpu_uuids: Input should be a valid list",
        ),
    ],
)
def test_a_mistyped_outcome_is_a_named_problem(tmp_path, edit, words):
    """Found by the breaker: an outcome's wall_s "164.26" was float()ed, started_at "yesterday"
    was a bare 'could not convert string to float' naming no file (read on the committed
    example shard: no launch)."""
    shutil.copytree(_RAY_SHARD, tmp_path / "s", ignore=shutil.ignore_patterns("*.parquet"))
    assert shard_manifest._read_manifest(tmp_path / "s") == json.loads(
        (tmp_path / "s" / shards.MANIFEST).read_text()
    )
    m = json.loads((tmp_path / "s" / shards.MANIFEST).read_text())
    edit(m["outcomes"][0])
    (tmp_path / "s" / shards.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ValueError) as exc:
        shard_manifest._read_manifest(tmp_path / "s")
    err = str(exc.value)
    assert err.startswith(f"{tmp_path / 's' / shards.MANIFEST}: malformed shard manifest: ") and words in err


def test_a_shard_stopped_by_sigterm_keeps_what_finished_and_exits_2(runs, tmp_path):
    # shard 2/2: two units of about 10 s each, so SIGTERM lands while the second runs (shard
    # 1/2 ends about 1 s after its first unit, its second being a mode the CPU refuses at once:
    # a SIGTERM during interpreter exit is Python's default, -15, not an interrupted shard)
    out = tmp_path / "k"
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfkit.cli", "suite", "--params", str(runs["params"]), "--partition", "2/2"]
        + ["--tier", "per-commit", "--out", str(out), "-q"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        f = out / shards.MANIFEST
        if f.is_file() and json.loads(f.read_text() or "{}").get("outcomes"):
            break  # a unit finished: the manifest says so before the shard ends
        time.sleep(0.5)
    assert proc.poll() is None, "the shard ended before it could be interrupted"
    proc.terminate()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert "interrupted" in err
    m = json.loads((out / shards.MANIFEST).read_text())
    assert "interrupted" in m["interrupted"] and len(m["outcomes"]) >= 1
    merged = tmp_path / "merged"
    res = perfkit("merge", str(runs["s1_dir"]), str(out), "--out", str(merged), "-q", "--no-screenshot")
    assert res.returncode == 2
    summary, _, run = _summary_and_report(merged)
    assert any("shard 2/2" in p and "was interrupted" in p for p in run["scaleout"]["problems"])
    finished = m["outcomes"][0]["unit_id"]
    row = next(ln for ln in summary.split("### Units of work", 1)[1].splitlines() if f"| {finished} |" in ln)
    assert "| ok |" in row, row


def test_every_unit_failing_still_writes_the_report(runs, tmp_path):
    # the stand-in engine given a flag it does not know: its argparse exits 2 at once, naming it
    params = stand_in_params(tmp_path / "crash.yaml", "--no-such-flag")
    doc = load_yaml(params.read_text())
    doc["scaleout"] = {"retries": 1}
    params.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "run"
    proc = perfkit(
        "suite", "--params", str(params), "--executor", "inprocess", "--only", COLD_WARM,
        "--out", str(out), "-q", "--no-screenshot",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    summary, report, run = _summary_and_report(out)
    assert run["exit_code"] == 2
    assert "failed after 2 attempt(s)" in report and "--no-such-flag" in report
    assert "| cold_warm | cold_warm | 1 | error | 2 |" in summary
    st = {n["name"]: n["status"] for n in run["notebooks"]}
    assert st[SCALEOUT] == "error" and st[COLD_WARM] == "skipped"


def test_the_committed_examples_readme_merge_command_exits_0_with_notes(tmp_path):
    """examples/h200x2/scaleout/README.md's own ``perfkit merge`` line, run as written (its --out
    into tmp_path): the parts were measured by an older perfkit (no recorded plan, no
    traces.parquet) and the manifest's params lack fields added since (defaults); all honest, so
    it merges (exit 0) with each note shown in merge.json, summary.md and the page's units table.
    Without --params the shards' own params merge the same way (merge_shards, no notebooks)."""
    example = ROOT / "examples" / "h200x2" / "scaleout"
    line = next(
        ln for ln in (example / "README.md").read_text().splitlines() if ln.startswith("perfkit merge ")
    )
    argv = line.split()[1:]
    out = tmp_path / "report"
    argv[argv.index("--out") + 1] = str(out)
    proc = perfkit(*argv, "-q", "--no-screenshot")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    doc = json.loads((out / shards.MERGED_DIR / shards.MERGE_FILE).read_text())
    assert doc["problems"] == []
    parts = ["cold_warm", "warmup_shapes.warmup17", "memory_budget", "warmup_shapes.warmup25"]
    for pid in parts:
        assert doc["parts"][pid]["notes"][0] == shards.PLAN_NOT_RECORDED
        assert any(n.startswith(f"part {pid} ") and "traces.parquet absent" in n for n in doc["notes"])
    summary, report, run = _summary_and_report(out)
    assert "### Merge notes" in summary and run["scaleout"]["notes"] == doc["notes"]
    units = summary.split("### Units of work")[1].split("###")[0]
    assert units.count(shards.PLAN_NOT_RECORDED) == 2  # one row per unit
    assert report.count(shards.PLAN_NOT_RECORDED) >= 2  # the page's units table
    own = shards.merge_shards([example / "ray"], tmp_path / "own")
    assert own["problems"] == [] and set(own["merged"]) == {COLD_WARM, WARMUP_SHAPES, MEMORY_BUDGET}
    assert [n for n in own["notes"] if shards.PLAN_NOT_RECORDED in n] == [
        n for n in doc["notes"] if shards.PLAN_NOT_RECORDED in n
    ]
