"""Several traces read at once (perfkit.readings.trace_files): the process pool gives what
reading them one by one gives, in order, with unreadable files as named errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from perfkit.readings import trace_files

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "examples/h200/evidence/ab-2pct-profiled/a/traces").glob("*.trace.json.gz"))[:2]


def test_the_pool_reads_what_one_by_one_reads_in_order_with_bad_files_named(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad-rank0.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    paths = [TRACES[0], tmp_path / "missing.trace.json.gz", bad, TRACES[1]]
    alone = [trace_files.read_one(p) for p in paths]
    monkeypatch.setattr(trace_files, "PARALLEL_MIN_BYTES", 1)
    with caplog.at_level(logging.DEBUG, logger=trace_files.__name__):
        pooled = trace_files.read_many(paths)
    if trace_files._cores() > 1:
        assert "reading 4 traces" in caplog.text and "in 2 processes" in caplog.text, caplog.text
    assert [x.error is None for x in pooled] == [True, False, False, True]
    assert "missing.trace.json.gz" in pooled[1].error and str(bad) in pooled[2].error
    for x, y in zip(pooled, alone):
        assert x.error == y.error
        if x.error is None:
            assert len(x.events) > 1000 and (x.events["cat"] == "kernel").any()  # an H200 trace
            pd.testing.assert_frame_equal(x.events, y.events)
            pd.testing.assert_frame_equal(x.overhead, y.overhead)
