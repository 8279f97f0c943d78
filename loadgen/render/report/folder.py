"""The report folder: report.html, report.md with one PNG per figure, and summary.json."""

from __future__ import annotations

import os
from pathlib import Path

from loadgen.render.report.html import render_html
from loadgen.render.report.markdown import render_markdown
from loadgen.render.report.model import RunReport
from loadgen.results.runfolder import SUMMARY_FILE, write_summary


def write_run_report(report: RunReport, out_dir: Path) -> list[Path]:
    """Write report.html, report.md (+ one PNG per figure beside it) and summary.json.

    Each file is written to a temp name and renamed into place. Returns the paths written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in report.figures.items():
        written.append(_write_atomic(out_dir / f"{name}.png", png))
    written.append(_write_atomic(out_dir / "report.md", render_markdown(report).encode()))
    written.append(_write_atomic(out_dir / "report.html", render_html(report).encode()))
    write_summary(out_dir, report.summary)
    written.append(out_dir / SUMMARY_FILE)
    return written


def _write_atomic(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
