"""The report: one self-contained HTML page per run (jinja2 templates under ``templates/``),
the Markdown summary, one table formatter for both (:mod:`~perfkit.report.tables`), matplotlib
figures (:mod:`~perfkit.report.plots`) and the notebook display helpers."""

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
