"""The bundle's declared tables and versions: units and name suffixes agree, ``save`` refuses an
undeclared column, version 1 bundles (the committed examples) load with version 2 names and the
same numbers, saved bundles carry schema_version 2 and keep their dtypes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import synthetic
from perfkit import bundle_schema as bs
from perfkit.bundle import SCHEMA_VERSION, TABLE_SCHEMAS, TABLES, WARMUP_INDEX, ResultBundle

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "examples" / "h200" / "bundles"
V1_TWO_STAGE = ROOT / "examples" / "h200" / "bundles-two-stage"

ALL_COLUMNS = [(t.name, c) for t in TABLE_SCHEMAS.values() for c in t.columns]


def test_schema_version_is_2():
    assert SCHEMA_VERSION == 2
    # "traces" (issue 35) and "memory_sites" (issue 36) are additive: a bundle without them
    # loads with empty tables
    assert (
        tuple(TABLE_SCHEMAS)
        == TABLES
        == (
            "requests",
            "stages",
            "steps",
            "memory",
            "launches",
            "traces",
            "memory_sites",
        )
    )


@pytest.mark.parametrize("table,col", ALL_COLUMNS, ids=[f"{t}.{c.name}" for t, c in ALL_COLUMNS])
def test_column_unit_and_suffix_agree(table, col):
    assert col.unit in bs.UNITS, f"{table}.{col.name}: unit {col.unit!r}"
    assert col.doc.strip() and "\n" not in col.doc
    pd.api.types.pandas_dtype(col.dtype)  # a pandas dtype string
    claimed = bs.unit_of_suffix(col.name)
    if col.unit in bs.UNIT_SUFFIX:  # ms/s/MiB/GiB columns are named by their unit ...
        assert claimed == col.unit, f"{table}.{col.name} has unit {col.unit} but not its suffix"
    else:  # ... and only they end in _ms/_s/_mib/_gib
        assert claimed is None, f"{table}.{col.name} ends like {claimed} but its unit is {col.unit}"
    assert not col.name.endswith("_mb"), "perfkit's own MiB columns end in _mib"


def test_host_cap_columns_say_which_cap():
    """Each host cap column of ``launches`` has its own doc; ``host_cap_gib`` (the ask, as
    test_caps reads it) points to the cap in force."""
    docs = {c.name: c.doc for c in TABLE_SCHEMAS["launches"].columns if c.name.startswith("host_cap")}
    assert len(set(docs.values())) == len(docs) == 4, docs
    assert "in force: host_cap_effective_gib" in docs["host_cap_gib"]
    assert "in force" in docs["host_cap_effective_gib"]


def test_unit_of_suffix():
    assert bs.unit_of_suffix("e2e_ms") == "ms" and bs.unit_of_suffix("ms") == "ms"
    assert bs.unit_of_suffix("ready_s") == "s" and bs.unit_of_suffix("steps") is None
    assert bs.unit_of_suffix("peak_reserved_mib") == "MiB" and bs.unit_of_suffix("host_cap_gib") == "GiB"
    assert bs.unit_of_suffix("peak_reserved_mb") is None


def test_warmup_is_marked_by_index_only():
    for name in ("requests", "stages", "steps"):
        t = TABLE_SCHEMAS[name]
        assert "tag" not in t.names
        assert str(WARMUP_INDEX) in next(c.doc for c in t.columns if c.name == "index")


def test_save_refuses_an_undeclared_column(tmp_path):
    b = synthetic.cold_warm()
    b.tables["requests"] = b.tables["requests"].assign(peak_reserved_mb=1.0)
    with pytest.raises(ValueError, match=r"requests.*peak_reserved_mb"):
        b.save(tmp_path / "b")
    assert not (tmp_path / "b" / "meta.json").exists()  # nothing half-written
    b = synthetic.cold_warm()
    b.tables["memory"] = b.tables["memory"].assign(bogus=0)
    with pytest.raises(ValueError, match=r"'memory'.*'bogus'"):
        b.save(tmp_path / "c")


def test_table_has_every_declared_column():
    b = ResultBundle(
        investigation="cold_warm", tables={"requests": pd.DataFrame({"index": [0], "e2e_ms": [5.0]})}
    )
    req = b.table("requests")
    assert list(req.columns) == TABLE_SCHEMAS["requests"].names
    assert req["peak_reserved_mib"].isna().all() and req["e2e_ms"].iloc[0] == 5.0
    assert list(b.table("launches").columns) == TABLE_SCHEMAS["launches"].names  # absent table
    assert b.table("launches").empty
    with pytest.raises(KeyError):
        b.table("nope")


def test_v1_bundle_loads_with_v2_names_and_same_numbers():
    d = V1 / "cold_warm"
    assert json.loads((d / "meta.json").read_text())["schema_version"] == 1  # committed as v1
    raw_req = pd.read_parquet(d / "requests.parquet")
    raw_mem = pd.read_parquet(d / "memory.parquet")
    raw_lt = pd.read_parquet(d / "launches.parquet")
    b = ResultBundle.load(d)
    req = b.requests
    assert list(req.columns) == TABLE_SCHEMAS["requests"].names
    assert "peak_reserved_mb" not in req and "tag" not in req
    pd.testing.assert_series_equal(req["peak_reserved_mib"], raw_req["peak_reserved_mb"], check_names=False)
    pd.testing.assert_series_equal(req["peak_allocated_mib"], raw_req["peak_allocated_mb"], check_names=False)
    pd.testing.assert_series_equal(req["t_start_s"], raw_req["t_start"], check_names=False)
    assert list(req["e2e_ms"]) == list(raw_req["e2e_ms"])
    # the warmup, marked both ways in v1, is index -1 only
    assert list(req["index"] == WARMUP_INDEX) == list(raw_req["tag"] == "warmup")
    assert b.launches["load_peak_mib"].iloc[0] == raw_lt["load_peak_mb"].iloc[0]
    assert b.launches["warmup_peak_mib"].iloc[0] == raw_lt["warmup_peak_mb"].iloc[0]
    assert list(b.memory["t_s"]) == list(raw_mem["t"])
    pd.testing.assert_series_equal(
        b.memory["gpu_util_fraction"], raw_mem["gpu_util_pct"] / 100.0, check_names=False
    )
    stages = b.stages
    raw_st = pd.read_parquet(d / "stages.parquet")
    assert list(stages["ms"]) == list(raw_st["ms"])
    assert b.meta["schema_version"] == SCHEMA_VERSION and b.meta["upgraded_from_schema"] == 1
    assert b.results["cold_ms"] == json.loads((d / "results.json").read_text())["cold_ms"]


def test_v1_results_keys_are_renamed():
    d = V1 / "memory_budget"
    raw = json.loads((d / "results.json").read_text())
    b = ResultBundle.load(d)
    for old, new in zip(raw["caps"], b.results["caps"]):
        assert new["peak_reserved_mib"] == old["peak_reserved_mb"]
        assert new["peak_allocated_mib"] == old["peak_allocated_mb"]
        assert new["load_peak_mib"] == old["load_peak_mb"]
        assert not any(k.endswith("_mb") for k in new)


@pytest.mark.parametrize(
    "d",
    [V1 / "cold_warm", V1 / "warmup_shapes", V1 / "memory_budget", V1_TWO_STAGE / "warmup_shapes"],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_committed_v1_bundles_load_and_resave_as_v2(d, tmp_path):
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    b = ResultBundle.load(d)
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before  # untouched
    out = b.save(tmp_path / d.name)
    assert json.loads((out / "meta.json").read_text())["schema_version"] == 2
    again = ResultBundle.load(out)
    for name in TABLES:
        pd.testing.assert_frame_equal(
            again.table(name).reset_index(drop=True), b.table(name).reset_index(drop=True)
        )
    assert again.results == b.results


def test_saved_bundle_has_version_2_in_meta_and_results(tmp_path):
    b = synthetic.memory_budget()
    out = b.save(tmp_path / "mb")
    assert json.loads((out / "meta.json").read_text())["schema_version"] == 2
    res = json.loads((out / "results.json").read_text())
    assert res["schema_version"] == 2 and "peak_reserved_mib" in res["caps"][0]
    loaded = ResultBundle.load(out)
    assert "schema_version" not in loaded.results and loaded.results == b.results
    assert "upgraded_from_schema" not in loaded.meta


def test_round_trip_keeps_dtypes(tmp_path):
    b = synthetic.cold_warm()
    out = b.save(tmp_path / "cw")
    loaded = ResultBundle.load(out)
    for name in TABLES:
        t = TABLE_SCHEMAS[name]
        got = loaded.table(name)
        assert list(got.columns) == t.names
        assert {c: str(dt) for c, dt in got.dtypes.items()} == {c.name: c.dtype for c in t.columns}
        pd.testing.assert_frame_equal(got.reset_index(drop=True), b.table(name).reset_index(drop=True))
    # every file on disk has every declared column in its dtype
    raw = pd.read_parquet(out / "requests.parquet")
    assert list(raw.columns) == TABLE_SCHEMAS["requests"].names
    assert str(raw["index"].dtype) == "Int64" and str(raw["launch"].dtype) == "string"


def test_newer_schema_is_refused_naming_the_file(tmp_path):
    d = shutil.copytree(V1 / "cold_warm", tmp_path / "cw")
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match=r"meta\.json.*newer"):
        ResultBundle.load(d)
    (d / "meta.json").write_text(json.dumps({**meta, "schema_version": 2}))
    res = json.loads((d / "results.json").read_text())
    (d / "results.json").write_text(json.dumps({**res, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match=r"results\.json.*newer"):
        ResultBundle.load(d)


def test_measured_requests_exclude_the_warmup_by_index():
    b = ResultBundle.load(V1 / "cold_warm")
    m = b.measured_requests()
    assert len(m) == 5 and (m["index"] >= 0).all()
