"""The run report (and the rolling view) as Markdown: the same blocks as the HTML page;
figures link to the PNGs written beside it."""

from __future__ import annotations

from collections.abc import Sequence

from loadgen.render.compare_view import md_cell
from loadgen.render.report.blocks import Block, Figure, Heading, Para, Table
from loadgen.render.report.document import document
from loadgen.render.report.model import RunReport


def render_markdown(report: RunReport) -> str:
    """Markdown: the same blocks; figures link to `<name>.png` beside the file."""
    return page_markdown(document(report))


def page_markdown(blocks: Sequence[Block]) -> str:
    """`blocks` as Markdown; a figure links to `<name>.png` beside the file."""
    return "\n\n".join(_md_block(b) for b in blocks) + "\n"


def _md_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"{'#' * block.level} {_md(block.text)}"
    if isinstance(block, Para):
        return f"**{_md(block.text)}**" if block.tone else _md(block.text)
    if isinstance(block, Table):
        headers = [h or " " for h in block.headers]
        lines = [f"**{_md(block.title)}**", "", "| " + " | ".join(map(_md, headers)) + " |"]
        lines.append("|" + "|".join("---" for _ in headers) + "|")
        lines.extend("| " + " | ".join(map(_md, row)) + " |" for row in block.rows)
        return "\n".join(lines)
    if isinstance(block, Figure):
        return f"![{_md(block.caption)}]({block.name}.png)"
    return f"**{_md(block.summary)}**\n\n" + "\n\n".join(_md_block(b) for b in block.blocks)


def _md(text: str) -> str:
    """Text shown literally in a table cell or a line (`compare_view.md_cell`): a server's
    `![x](http://…)` or `[click](javascript:…)` in a finish reason or an error body is text."""
    return md_cell(text)
