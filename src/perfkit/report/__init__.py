"""The report: one self-contained HTML page per run (jinja2 templates), the Markdown summary,
matplotlib figures (:mod:`~perfkit.report.plots`) and the notebook display helpers."""
from perfkit.report.render import (  # noqa: F401
    chromium_binary,
    external_refs,
    reading,
    render_report,
    screenshot,
    show,
    summary_frame,
    summary_markdown,
    write_summary,
)
