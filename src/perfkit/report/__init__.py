"""The report: one self-contained HTML page per run (jinja2, ``templates/``), summary.md, the one
table formatter (:mod:`~perfkit.report.tables`), figures (:mod:`~perfkit.report.plots`), notebook helpers."""

from perfkit.report.render import (  # noqa: F401
    CHROMIUM_FLAGS,
    chromium_binary,
    external_refs,
    reading,
    render_report,
    screenshot,
    show,
    summary_frame,
    write_summary,
)
