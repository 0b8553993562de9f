"""Papermill orchestration: run the investigation notebooks, gate the run, assemble its outputs.

``perfkit suite --params params/ci-cpu.yaml --out outputs/RUN`` calls :func:`run_suite`, which

1. validates the params (:func:`perfkit.params.load_params`) before anything is launched;
2. runs each enabled investigation notebook (``cold_warm``, ``warmup_shapes``,
   ``memory_budget``) with papermill; each writes its bundle to ``RUN/<scenario>/`` and its gate
   rows to ``RUN/<scenario>/verdict.json``;
3. runs the baseline gate notebook, which launches nothing: it reuses the bundles measured in
   step 2, writes ``RUN/baseline.json`` (this run's numbers, sglang layout), compares them with
   the params' baseline file when one is set and re-checks the invariants on all results;
4. writes ``RUN/summary.md`` (appended to ``$GITHUB_STEP_SUMMARY`` when set), ``RUN/run.json``
   and ``RUN/report.html`` (:mod:`perfkit.report`), even when a notebook failed.

Before anything runs, a replay directory without bundles, a missing or broken ``baseline.file``
and an ``--out`` already holding another run (without ``--force``) are errors (exit 2). A replay
launches nothing: an investigation whose bundle the replay directory lacks is skipped.

Exit codes (:data:`perfkit.gate.verdicts.EXIT_OK`, :data:`perfkit.gate.verdicts.EXIT_REGRESSION`,
:data:`perfkit.gate.verdicts.EXIT_ERROR`): 0 every gate passed,
1 a gate failed (regression), 2 an error (bad params, engine crash, notebook exception, kernel
death).

The helpers the notebooks call, so notebooks stay thin:
:func:`perfkit.scenarios.runner.load_or_run` (replay a recorded bundle or run a scenario),
:func:`perfkit.gate.verdicts.write_verdict`, :func:`perfkit.gate.run.case_id`,
:func:`perfkit.gate.run.bundle_cases`, :func:`perfkit.gate.run.gate`.

The package, one module per job: :mod:`perfkit.suite.preflight` (checks and the run directory
before anything runs), :mod:`perfkit.suite.execute` (one notebook through papermill),
:mod:`perfkit.suite.orchestrate` (:func:`run_suite`), :mod:`perfkit.suite.replay_shards`
(:func:`merge_runs`, :func:`run_units_suite`); the names other modules use are re-exported here.

Run directory layout::

    RUN/params.yaml            the validated params (resolved, with defaults)
    RUN/run.json               notebook statuses, wall times, errors, exit code
    RUN/notebooks/<nb>.ipynb   executed notebooks (with outputs)
    RUN/<scenario>/            ResultBundle + verdict.json
    RUN/baseline_gate/verdict.json
    RUN/baseline.json  RUN/summary.md  RUN/report.html  RUN/report.png (when chromium is there)
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
