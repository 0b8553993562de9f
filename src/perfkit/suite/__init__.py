"""Papermill orchestration: run the investigation notebooks, gate the run, assemble its outputs
(:func:`run_suite`, :func:`merge_runs`); what a run directory holds: docs/suite.md, "The run
directory". Exit codes: 0 every gate passed, 1 a regression, 2 an error.
"""

# ruff: noqa: F401 (the public names, re-exported)
from __future__ import annotations

from perfkit.suite.execute import NotebookRun, execute_notebook, notebook_parameters
from perfkit.suite.orchestrate import SuiteResult, run_suite
from perfkit.suite.preflight import (
    SCALEOUT,
    SuiteError,
    check_baseline_file,
    prepare_run_dir,
    replay_plan,
    run_plan,
)
from perfkit.suite.replay_shards import merge_runs, run_units_suite
