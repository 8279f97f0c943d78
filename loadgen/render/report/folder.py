"""The report folder's files: report.html, report.md and one PNG per figure (summary.json
is the report's `Summary`); `results.write.write_report` writes them."""

from __future__ import annotations

from loadgen.render.report.html import render_html
from loadgen.render.report.markdown import render_markdown
from loadgen.render.report.model import RunReport
from loadgen.results.runfolder import REPORT_HTML, REPORT_MD, figure_file


def report_files(report: RunReport) -> dict[str, bytes]:
    """One PNG per figure (which report.md links), report.md and report.html, in that order."""
    files = {figure_file(name): png for name, png in report.figures.items()}
    files[REPORT_MD] = render_markdown(report).encode()
    files[REPORT_HTML] = render_html(report).encode()
    return files
