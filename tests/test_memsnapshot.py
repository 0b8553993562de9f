"""The allocator snapshot reader and diff, on the committed H200 snapshots
(tests/fixtures/memory-snapshots/: tiny reference engine, leak 64 MiB and off, after requests 0
and 3), and the files it must refuse."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from perfkit.readings.memsnapshot import (
    MemSnapshotError,
    diff_snapshots,
    live_by_site,
    peak_by_site,
    read_snapshot,
)

FIX = Path(__file__).parent / "fixtures" / "memory-snapshots"
LEAK_MIB = 64


def _records(run: str) -> list[dict]:
    return [json.loads(ln) for ln in (FIX / f"{run}-records.jsonl").read_text().splitlines()]


def _snapshots(run: str) -> dict[int, Path]:
    """request index -> the fixture file, as the records name them."""
    out = {}
    for r in _records(run):
        snap = r["perfkit"].get("memory_snapshot")
        if snap:
            out[snap["request_index"]] = FIX / f"{run}-request-{snap['request_index']}.pickle.gz"
    return out


@pytest.fixture(scope="module")
def leak():
    return {i: read_snapshot(p) for i, p in _snapshots("leak64").items()}


@pytest.fixture(scope="module")
def noleak():
    return {i: read_snapshot(p) for i, p in _snapshots("noleak").items()}


def test_records_name_a_snapshot_after_the_cold_and_a_warm_request():
    recs = _records("leak64")
    assert [r["perfkit"]["request_index"] for r in recs] == [0, 1, 2, 3]
    assert [bool(r["perfkit"].get("memory_snapshot")) for r in recs] == [True, False, False, True]
    assert sorted(_snapshots("leak64")) == [0, 3]


def test_diff_after_cold_and_warm_k_names_the_injected_leak_first(leak):
    k = max(leak)  # warm request k (the cold request is 0)
    diff = diff_snapshots(leak[0], leak[k])
    top = diff.iloc[0]
    assert top["site"].startswith("inject_debug_leak (perfkit/refengine/server.py:"), diff
    assert bool(top["in_engine"]) is True
    assert abs(top["grown_mib"] - LEAK_MIB * k) <= 0.1 * LEAK_MIB * k, diff
    assert top["new_blocks"] == k and top["gone_blocks"] == 0
    # nothing else grew by more than a MiB between the two
    assert (diff["grown_mib"].iloc[1:].abs() < 1.0).all(), diff


def test_without_the_leak_no_site_grows_beyond_the_allocator_noise(noleak):
    diff = diff_snapshots(noleak[0], noleak[max(noleak)])
    # measured on the H200: between the cold request and warm request 3 no block changed
    assert diff.empty or diff["grown_mib"].abs().max() < 1.0, diff


def test_live_blocks_by_site_sum_to_the_records_allocated_memory(leak):
    recs = _records("leak64")
    for i, snap in leak.items():
        live = live_by_site(snap)
        allocated = recs[i]["memory_snapshots"]["runtime_peak"]["allocated_mb"]
        assert live["mib"].sum() == pytest.approx(allocated, abs=0.01)
    # the leak is kept after every completed run: the startup warmup and requests 0..3
    assert live_by_site(leak[3]).iloc[0]["mib"] == pytest.approx(LEAK_MIB * 5)


def test_peak_replay_matches_the_records_peak(leak, noleak):
    for run, snaps in (("leak64", leak), ("noleak", noleak)):
        recs = _records(run)
        for i, snap in snaps.items():
            peak = peak_by_site(snap, since_s=recs[i]["perfkit"]["t_start"])
            want = recs[i]["memory_snapshots"]["runtime_peak"]["peak_allocated_mb"]
            assert peak.mib == pytest.approx(want, abs=0.01), (run, i)
            assert peak.by_site["mib"].sum() == pytest.approx(peak.mib)
            assert peak.time_us >= recs[i]["perfkit"]["t_start"] * 1e6


def test_peak_after_the_last_event_is_refused_naming_the_file(leak):
    with pytest.raises(MemSnapshotError, match="request-3.pickle.gz: no trace events after"):
        peak_by_site(leak[3], since_s=4e9)


# -- refused files ---------------------------------------------------------------------------


def _raw() -> bytes:
    return gzip.decompress((FIX / "leak64-request-0.pickle.gz").read_bytes())


@pytest.mark.parametrize(
    "name,content",
    [
        ("truncated.pickle", lambda: _raw()[: len(_raw()) // 2]),
        ("truncated.pickle.gz", lambda: (FIX / "leak64-request-0.pickle.gz").read_bytes()[:5000]),
        ("garbage.pickle", lambda: b"not a pickle at all\n" * 10),
        ("empty.pickle", lambda: b""),
    ],
)
def test_a_corrupted_snapshot_is_refused_naming_the_file(tmp_path, name, content):
    p = tmp_path / name
    p.write_bytes(content())
    with pytest.raises(MemSnapshotError, match=rf"{name}: not a readable snapshot"):
        read_snapshot(p)


def test_a_snapshot_naming_a_class_is_refused_unexecuted(tmp_path):
    target = tmp_path / "touched"

    class Touch:
        def __reduce__(self):
            return (Path.touch, (target,))

    p = tmp_path / "evil.pickle"
    p.write_bytes(pickle.dumps({"segments": [Touch()]}))
    with pytest.raises(MemSnapshotError, match=r"evil.pickle: names the class pathlib"):
        read_snapshot(p)
    assert not target.exists()


def test_a_schema_error_names_the_file_and_key(tmp_path):
    data = pickle.loads(_raw())
    del data["segments"][2]["blocks"][0]["size"]
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps(data))
    with pytest.raises(MemSnapshotError, match=r"bad.pickle: key segments.2.blocks.0.size: Field required"):
        read_snapshot(p)
    p.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(MemSnapshotError, match=r"bad.pickle: expected torch's snapshot dict, got list"):
        read_snapshot(p)


@pytest.mark.parametrize("size", [10**400, 2**70])
def test_an_impossible_size_is_refused_naming_the_key(tmp_path, size):
    """Found by the breaker: 10**400 passed the reader and overflowed later, 2**70 read as a
    1e15 MiB block."""
    data = pickle.loads(_raw())
    data["segments"][2]["blocks"][0]["size"] = size
    p = tmp_path / "huge.pickle"
    p.write_bytes(pickle.dumps(data))
    with pytest.raises(
        MemSnapshotError, match=r"huge.pickle: key segments.2.blocks.0.size: .*less than or equal"
    ):
        read_snapshot(p)


def test_a_gzip_bomb_is_refused_before_it_fills_the_memory(tmp_path):
    p = tmp_path / "bomb.pickle.gz"
    p.write_bytes(gzip.compress(b"\0" * (4 * 2**20)))  # 4 MiB of zeros in a few KiB
    with pytest.raises(
        MemSnapshotError, match=r"bomb.pickle.gz: more than 1 MiB of snapshot \(decompressed\)"
    ):
        read_snapshot(p, max_bytes=2**20)
    assert read_snapshot(FIX / "leak64-request-0.pickle.gz").live_mib > 0  # the real ones stay readable


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(MemSnapshotError, match=r"nope.pickle: cannot read the snapshot"):
        read_snapshot(tmp_path / "nope.pickle")


# -- the investigation side: the bundle's memory_sites rows and the leak verdict's sites ----------


def test_collect_from_the_h200_records_names_the_leak_in_table_reading_and_verdict(tmp_path):
    from perfkit.checks import check_table
    from perfkit.gate.run import investigation_checks
    from perfkit.measuring.launch_rows import LaunchData
    from perfkit.measuring.profiled import SnapshotParams, collect, sites_markdown, top_sites_text

    lines = []
    for r in _records("leak64"):  # the records name the engine's files: point them at the fixture
        snap = r["perfkit"].get("memory_snapshot")
        if snap:
            raw = tmp_path / f"request-{snap['request_index']:03d}.pickle"
            raw.write_bytes(
                gzip.decompress((FIX / f"leak64-request-{snap['request_index']}.pickle.gz").read_bytes())
            )
            snap["path"] = str(raw)
        lines.append(json.dumps(r))
    table, res, files = collect(LaunchData("session", record_lines=lines), SnapshotParams(), repeats=4)
    assert res["status"] == "ok" and (res["from"], res["to"]) == (0, 3)
    grew = table[table["kind"] == "grew"]
    assert grew.iloc[0]["site"].startswith("inject_debug_leak (perfkit/refengine/server.py:")
    assert grew.iloc[0]["mib"] == pytest.approx(3 * LEAK_MIB) and grew.iloc[0]["blocks"] == 3
    peak = table[table["kind"] == "peak"]
    assert peak["mib"].sum() == pytest.approx(res["peak_mib"]) and res["peak_mib"] == pytest.approx(
        353.57, abs=0.01
    )
    assert sorted(files) == ["memsnap-session-request-0.pickle.gz", "memsnap-session-request-3.pickle.gz"]
    assert read_snapshot(files["memsnap-session-request-3.pickle.gz"]).live_mib == pytest.approx(
        353.57, abs=0.01
    )
    assert "<code>inject_debug_leak (perfkit/refengine/server.py:586)</code> +192.0 MiB" in sites_markdown(
        {"memory_sites": res}
    )
    # a leak verdict comes with its top allocation sites
    results = {
        "memory_sites": res,
        "leak_checks": [{"name": "device_reserved_slope_mib_per_request", "value": 64.0, "measured": True}],
    }
    results["leak_checks"][0]["sites"] = top_sites_text(results)
    rows = check_table(
        investigation_checks("cold_warm", results, {"device_reserved_slope_mib_per_request_max": 16.0})
    )
    row = rows[rows["metric"] == "device_reserved_slope_mib_per_request"].iloc[0]
    assert row["status"] == "fail"
    assert (
        "top allocation sites: inject_debug_leak (perfkit/refengine/server.py:586) +192.0 MiB"
        in row["reason"]
    )


def test_collect_without_the_leak_names_no_growing_site(tmp_path):
    from perfkit.measuring.launch_rows import LaunchData
    from perfkit.measuring.profiled import SnapshotParams, collect, sites_markdown

    lines = []
    for r in _records("noleak"):
        snap = r["perfkit"].get("memory_snapshot")
        if snap:
            raw = tmp_path / f"n{snap['request_index']}.pickle"
            raw.write_bytes(
                gzip.decompress((FIX / f"noleak-request-{snap['request_index']}.pickle.gz").read_bytes())
            )
            snap["path"] = str(raw)
        lines.append(json.dumps(r))
    table, res, _ = collect(LaunchData("session", record_lines=lines), SnapshotParams(), repeats=4)
    assert res["status"] == "ok" and res["grew"] == []
    assert table[table["kind"] == "grew"].empty and not table[table["kind"] == "peak"].empty
    assert sites_markdown({"memory_sites": res}).endswith("no allocation site grew by 1 MiB or more.")


# -- the live H200 run (examples/h200/memsnap: params/h200-memsnap*.yaml through perfkit.measure) --

LIVE = Path(__file__).parent.parent / "examples" / "h200" / "memsnap"


def test_live_h200_bundle_gives_the_leak_verdict_with_its_allocation_site():
    from perfkit.bundle import ResultBundle
    from perfkit.checks import check_table
    from perfkit.gate.run import investigation_checks

    b = ResultBundle.load(LIVE / "leak" / "cold_warm")
    grew = b.tables["memory_sites"].query("kind == 'grew'")
    top = grew.iloc[0]
    k = int(top["to_index"])  # the cold request 0 -> warm request k = 4: k leaks of 64 MiB
    assert top["site"].startswith("inject_debug_leak (") and top["mib"] == pytest.approx(
        LEAK_MIB * k, rel=0.1
    )
    # the kept files give the same diff
    a, z = (read_snapshot(b.traces[f"memsnap-session-request-{i}.pickle.gz"]) for i in (0, k))
    assert diff_snapshots(a, z).iloc[0]["grown_mib"] == pytest.approx(top["mib"])
    rows = check_table(
        investigation_checks("cold_warm", b.results, {"device_reserved_slope_mib_per_request_max": 16.0})
    )
    slope = rows[rows["metric"] == "device_reserved_slope_mib_per_request"].iloc[0]
    assert slope["status"] == "fail" and slope["actual"] == pytest.approx(LEAK_MIB, rel=0.1)
    assert (
        "top allocation sites: inject_debug_leak (perfkit/refengine/server.py:586) +256.0 MiB"
        in slope["reason"]
    )
    # without the leak no site grows beyond the allocator's noise (measured: 0 MiB net)
    quiet = ResultBundle.load(LIVE / "noleak" / "cold_warm")
    sites = quiet.tables["memory_sites"]
    assert not sites.empty and sites.query("kind == 'grew'")["mib"].abs().max() < 1.0, sites
    assert quiet.results["memory_sites"]["status"] == "ok"


def test_an_engine_without_snapshots_is_said_so_not_failed():
    from perfkit.engine.spec import EngineSpec
    from perfkit.measuring.launch_rows import LaunchData
    from perfkit.measuring.profiled import SnapshotParams, ask_engine, collect, sites_markdown

    sgl = EngineSpec(kind="sglang", model_path="Lightricks/LTX-Video")
    spec, why = ask_engine(sgl, SnapshotParams(), 5)
    assert spec is sgl and why.startswith("not available for engine kind 'sglang'")
    table, res, files = collect(LaunchData("session"), SnapshotParams(), 5, why)
    assert table.empty and files == {} and res["status"] == why
    assert sites_markdown({"memory_sites": res}) == f"**Allocation sites** (allocator snapshots): {why}."
    ref, why = ask_engine(EngineSpec(kind="reference"), SnapshotParams(warm=2, max_entries=500), 5)
    assert why is None and (ref.memory_snapshot_after, ref.memory_snapshot_entries) == ([0, 2], 500)


def test_a_small_pickle_of_shared_references_is_refused_within_a_second(tmp_path):
    """Found by the breaker: 20 KB of shared references expanded to 25 million blocks and ran into
    MemoryError after 28 s at 2.8 GiB."""
    block = {"address": 0, "size": 512, "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": 0, "total_size": 512, "blocks": [block] * 5000}
    p = tmp_path / "shared.pickle"
    p.write_bytes(pickle.dumps({"segments": [seg] * 5000}))
    assert p.stat().st_size < 25_000
    t0 = time.monotonic()
    with pytest.raises(MemSnapshotError, match=r"shared.pickle: segments.\d+ expands .* more than 1024 MiB"):
        read_snapshot(p)
    assert time.monotonic() - t0 < 1.0
    # the same through a shared stack: one event's frames list of 5000 references, 5000 events
    frame = {"name": "f", "filename": "x.py", "line": 1}
    event = {"action": "alloc", "addr": 0, "size": 512, "frames": [frame] * 5000}
    trace = [event] * 5000
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace] * 20}))
    t0 = time.monotonic()
    with pytest.raises(MemSnapshotError, match=r"shared.pickle: device_traces.\d+.\d+ expands"):
        read_snapshot(p)
    assert time.monotonic() - t0 < 1.0
    # a shared stack as torch writes it stays readable (the fixtures share their frame dicts)
    assert read_snapshot(FIX / "leak64-request-3.pickle.gz").live_mib > 0


def _set_calls(n: int, calls: int) -> bytes:
    """A pickle (protocol 4) of ``{"segments": [set(L)] * calls}``, L n distinct ints: each call
    is 6 bytes (memo GETs of ``set`` and L, TUPLE1, REDUCE) building a set of n entries."""
    ints = b"".join(b"M" + struct.pack("<H", i) for i in range(n))  # BININT2
    head = b"\x80\x04}\x8c\x08segments]("  # {  'segments'  [  MARK
    lst = b"](" + ints + b"e\x94"  # L, memo 0
    fn = b"\x8c\x08builtins\x8c\x03set\x93\x94"  # STACK_GLOBAL builtins.set, memo 1
    return head + lst + b"0" + fn + b"0" + b"h\x01h\x00\x85R" * calls + b"es."  # POPs keep the memo


@pytest.mark.parametrize(
    "name,content,why",
    [
        # the C unpickler sizes its memo by a PUT's index: 8 bytes took 1.6 GiB (found by a breaker)
        (
            "memo.pickle",
            b"\x80\x04}r" + struct.pack("<I", 50_000_000) + b".",
            r"memo index 50000000 at opcode 2",
        ),
        # 63 KB of set(L) calls building 400 sets of 20,000 entries (800 MiB unguarded)
        ("sets.pickle", _set_calls(20_000, 400), r"unpickling would build more than 64 MiB \(by opcode"),
    ],
)
def test_a_small_pickle_that_expands_when_unpickled_is_refused_before_it(tmp_path, name, content, why):
    """Refused by the opcode scan before the unpickler builds anything: within a second, under
    32 MiB traced (the unguarded reads took 800 MiB each)."""
    p = tmp_path / name
    p.write_bytes(content)
    assert p.stat().st_size < 64_000
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(MemSnapshotError, match=rf"{name}: {why}"):
            read_snapshot(p, max_build_bytes=64 * 2**20)
        wall, peak = time.monotonic() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert wall < 1.0 and peak < 32 * 2**20, (wall, peak / 2**20)
    assert len(read_snapshot(FIX / "leak64-request-0.pickle.gz", max_build_bytes=64 * 2**20).segments) > 0
