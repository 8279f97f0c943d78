"""Streams that arrived coalesced are named wherever a run is read: the terminal, the report,
JUnit and Markdown; a server writing a few events at once is shown with its figures."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.render.report.markdown import render_markdown
from loadgen.render.report.model import build_run_report
from loadgen.render.run_checks import render_run_junit, render_run_markdown, rows
from loadgen.render.terminal import render_summary
from loadgen.results.records import RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import streamed_record, write_run
from loadgen.workload.spec import SloTargets

SLO = SloTargets(ttft_ms=2000, tpot_ms=50, percentile=90)


def stream(request_id: int, sizes: list[int], gap_ms: float = 21.6) -> RequestRecord:
    """A 32-event stream whose reads carried `sizes` events (equal stamps within a read)."""
    gaps: list[float] = []
    for index, size in enumerate(sizes):
        gaps += [gap_ms * size if index else 0.0] + [0.0] * (size - 1)
    return streamed_record(request_id, intended_ms=250.0 * request_id, gaps_ms=gaps[1:])


def whole(n: int = 40) -> list[RequestRecord]:
    return [stream(i, [32]) for i in range(n)]


def summary_of(records: list[RequestRecord], *, path_buffers: bool = False) -> Summary:
    return audit(to_frame(records), run_id="r", objectives={"chat": Objective(name="chat", slo=SLO)},
                 planned=len(records), path_buffers=path_buffers)  # fmt: skip


def text(summary: Summary) -> str:
    console = Console(record=True, width=100, color_system=None)
    console.print(render_summary(summary))
    return " ".join(console.export_text().split())  # wrapped lines joined


def test_the_terminal_names_coalesced_streams_and_why_tpot_is_not_judged() -> None:
    """Whole responses: a COALESCED line with the share of streams and tokens and the events
    per read, the TPOT check INCONCLUSIVE with its upper bound unknown, exit 7."""
    shown = text(summary_of(whole()))
    assert "COALESCED: 40 of 40 streams (100% of them, 100% of output tokens)" in shown
    assert "32.0 events per network read" in shown
    assert "1.00 tokens per event" in shown
    assert "bounds 0.00 ms–unknown" in shown
    assert "their TPOT is not the server's pace and is judged unknown" in shown
    assert "SLO INCONCLUSIVE (exit 7)" in shown


def test_a_declared_buffering_path_is_said_in_the_verdict_lines() -> None:
    """With path_buffers the class is judged as observed (MET) and both the delivery line and
    the TPOT check say why."""
    shown = text(summary_of(whole(), path_buffers=True))
    assert "their TPOT and ITL are judged as observed, as target.path_buffers says" in shown
    assert "judged as observed, as target.path_buffers says the path buffers" in shown
    assert "SLO MET (exit 0)" in shown


def test_a_server_writing_a_few_events_at_once_is_shown_with_its_figures() -> None:
    """Reads of 2 events (a starved server's writes): a dim line with the figures, no
    COALESCED, the checks judged as observed; a direct stream has no delivery line."""
    shown = text(summary_of([stream(i, [2] * 16) for i in range(40)]))
    assert "delivery: 2.0 events per network read" in shown
    assert "COALESCED" not in shown
    assert "delivery" not in text(summary_of([stream(i, [1] * 32) for i in range(40)]))


def test_the_servers_own_chunking_is_told_apart_from_a_held_back_stream() -> None:
    """Events of 5 tokens each, one a read (vLLM's --stream-interval 5): a dim line naming the
    server's chunking, 5.00 tokens per event, nothing coalesced, TPOT judged."""
    records = [replace(stream(i, [1] * 32), output_tokens=160, chunk_tokens=(5,) * 32)
               for i in range(40)]  # fmt: skip
    shown = text(summary_of(records))
    assert "1.0 events per network read (up to 1.0 in a stream), 5.00 tokens per event" in shown
    assert "the server's own chunking" in shown
    assert "COALESCED" not in shown


def test_junit_and_markdown_name_the_delivery() -> None:
    """A `delivery` testcase fails as inconclusive beside the TPOT case; the Markdown table
    has its row and its sentence; declared buffering makes it a pass that says what came."""
    summary = summary_of(whole())
    row = next(r for r in rows(summary) if r.check == "delivery")
    assert (row.status, row.requests) == ("INCONCLUSIVE", 40)
    assert "40 of 40 streams coalesced (32.0 events/read)" in row.measured
    junit = render_run_junit(summary)
    assert '<testcase name="delivery"' in junit
    assert 'type="inconclusive"' in junit
    markdown = render_run_markdown(summary)
    assert "delivery (events per read)" in markdown
    assert "- inconclusive: delivery of class chat" in markdown
    declared = next(
        r for r in rows(summary_of(whole(), path_buffers=True)) if r.check == "delivery"
    )
    assert (declared.status, declared.target) == ("pass", "path buffers (declared)")


def test_the_report_has_a_delivery_table(tmp_path: Path) -> None:
    """The report's class section shows reads, events per read, tokens per event and the
    coalesced share, re-audited from the records."""
    run_dir = write_run(tmp_path, datetime(2026, 12, 1, tzinfo=UTC), whole(), slos=SLO)
    page = render_markdown(build_run_report(run_dir, window_s=5.0))
    assert "Delivery (how the output arrived)" in page
    assert "40 / 40 / 1,280" in page  # streams / reads / events
    assert "40: 100.0% of streams, 100.0% of output tokens" in page
