"""The run report (and the rolling view) as one self-contained HTML page: inline CSS, PNGs
as data URIs, no network loads, every string escaped."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence

from loadgen.render.report.blocks import Block, Figure, Heading, Para, Table
from loadgen.render.report.document import document
from loadgen.render.report.model import RunReport

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#1b1b1b}
h1{font-size:1.5em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h3{font-size:1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.3em 0 1em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right;vertical-align:top}
td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}
.banner{padding:.6em 1em;border-radius:4px;margin:.5em 0;font-weight:600}
.bad{background:#fde2e1;color:#8a1c17}.warn{background:#fff3cd;color:#6b5200}
.good{background:#e3f4e1;color:#1e5b1a}
td.bad{background:#fde2e1}td.good{background:#e3f4e1}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}details{margin:1em 0}summary{cursor:pointer}
.wide{overflow-x:auto}.wide table{font-size:.9em}.wide td,.wide th{padding:.2em .4em}
.wide td:first-child{white-space:nowrap}
"""
WIDE_COLUMNS = 8  # a table this wide is set smaller and tighter to fit the page
_CELL_TONE = {"MET": "good", "PASS": "good", "MISSED": "bad", "FAIL": "bad", "fail": "bad",
              "INCONCLUSIVE": "warn",
              "not judged": "warn"}  # fmt: skip


def render_html(report: RunReport) -> str:
    """One self-contained HTML page: inline CSS, PNGs as data URIs, every text escaped."""
    return page_html(f"loadgen report · {report.summary.run_id}", document(report),
                     report.figures)  # fmt: skip


def page_html(title: str, blocks: Sequence[Block], figures: Mapping[str, bytes]) -> str:
    """`blocks` as one self-contained page titled `title`; a `Figure` block's PNG is
    `figures[name]`, embedded as a data URI."""
    body = "\n".join(_html_block(b, figures) for b in blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"{body}\n</body>\n</html>\n"
    )


def _html_block(block: Block, figures: Mapping[str, bytes]) -> str:
    e = html.escape
    if isinstance(block, Heading):
        return f"<h{block.level}>{e(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        tone = f' class="banner {block.tone}"' if block.tone else ""
        return f"<p{tone}>{e(block.text)}</p>"
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Figure):
        data = base64.b64encode(figures[block.name]).decode("ascii")
        return (
            f'<figure><img alt="{e(block.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(block.caption)}</figcaption></figure>"
        )
    inner = "\n".join(_html_block(b, figures) for b in block.blocks)
    if block.is_open:
        return f"<details open><summary>{e(block.summary)}</summary>\n{inner}\n</details>"
    folded = f"{e(block.summary)}: folded, click to show"
    return f"<details><summary>{folded}</summary>\n{inner}\n</details>"


def _html_table(table: Table) -> str:
    e = html.escape

    def cell(tag: str, text: str) -> str:
        tone = _CELL_TONE.get(text)
        return f'<{tag} class="{tone}">{e(text)}</{tag}>' if tone else f"<{tag}>{e(text)}</{tag}>"

    head = "".join(cell("th", h) for h in table.headers) if any(table.headers) else ""
    rows = "\n".join("<tr>" + "".join(cell("td", c) for c in row) + "</tr>" for row in table.rows)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    grid = f"<table>{thead}<tbody>\n{rows}\n</tbody></table>"
    if len(table.headers) >= WIDE_COLUMNS:  # the windows table: 16 columns of figures
        grid = f'<div class="wide">{grid}</div>'
    return f"<h3>{e(table.title)}</h3>\n{grid}"
