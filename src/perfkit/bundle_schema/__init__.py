"""The declared tables of a :class:`perfkit.bundle.ResultBundle`: every column once, with its
pandas dtype, its unit and one line of doc; the version of the bundle files; the upgrade of
older bundles.

Rules (checked by ``tests/test_bundle_schema.py``):

- every column's unit is one of :data:`UNITS`;
- perfkit's own column names end in ``_ms`` / ``_s`` / ``_mib`` / ``_gib`` exactly when their
  unit is ms / s / MiB / GiB (the name's last ``_``-separated word; a column named only by its
  unit, ``ms``, counts). sglang's own files (``performance.log`` records, baseline JSON) keep
  sglang's ``_mb`` keys, which are MiB; they are not tables;
- a startup warmup request is marked one way: ``index == WARMUP_INDEX`` (-1) in requests, stages
  and steps. The raw records keep sglang's ``"tag": "warmup"``; the tables carry no tag.

Versions (:data:`SCHEMA_VERSION`, written to meta.json and results.json):

- 1: MiB columns named ``*_mb``; epoch times ``t``/``t_start``/``t_end``; a ``tag`` column
  (``"warmup"``) besides ``index == -1``; memory ``gpu_util_pct`` (0-100); results.json
  unversioned, memory_budget caps entries with ``peak_reserved_mb``/``peak_allocated_mb``/
  ``load_peak_mb``.
- 2: the declarations in :mod:`~perfkit.bundle_schema.columns`. :func:`upgrade_table` /
  :func:`upgrade_results` turn version 1 into version 2 in memory (files on disk are never rewritten).

The package, one module per job: :mod:`perfkit.bundle_schema.columns` (the declarations),
:mod:`perfkit.bundle_schema.upgrade` (older versions read as the current one),
:mod:`perfkit.bundle_schema.conform` (a frame cast to its declared columns); their public names
are re-exported here.
"""

from __future__ import annotations

# ruff: noqa: F401 (the public names, re-exported)
from perfkit.bundle_schema.columns import (
    SCHEMA_VERSION,
    TABLE_NAMES,
    TABLES,
    UNIT_SUFFIX,
    UNITS,
    WARMUP_INDEX,
    Column,
    Table,
    markdown,
    unit_of_suffix,
)
from perfkit.bundle_schema.conform import MAX_ROWS, check_rows, conform, empty
from perfkit.bundle_schema.upgrade import (
    V1_COLUMN_RENAMES,
    V1_RESULTS_ENTRY_RENAMES,
    sampler_frame,
    upgrade_results,
    upgrade_table,
)
