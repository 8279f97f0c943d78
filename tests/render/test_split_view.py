"""Where TTFT went, as the terminal, the checks' JUnit and Markdown say it under a missed TTFT
check (the split at the target's percentile and what its largest part points to), and as
the report draws and tabulates it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
from rich.console import Console

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.render.report.markdown import render_markdown
from loadgen.render.report.model import build_run_report
from loadgen.render.run_checks import render_run_junit, render_run_markdown
from loadgen.render.split_plot import grouped
from loadgen.render.split_view import split_sentence
from loadgen.render.terminal import render_summary
from loadgen.results.records import RequestRecord, to_frame
from loadgen.results.summary import SplitPoint, Summary, TtftSplit
from loadgen.testing import split_record, streamed_record, write_run
from loadgen.workload.spec import SloTargets

# 200 requests queued 0..199 ms, prefill 150, outside 10: p90 averages ranks 178-182
# (queue 179 of TTFT 339 ms: queueing the cause), p50 ranks 98-102 (queue 99: prefill).
QUEUED = [split_record(i, outside_ms=10, queue_ms=float(i), prefill_ms=150, intended_ms=10.0 * i)
          for i in range(200)]  # fmt: skip
AT_P90 = (
    "chat TTFT p90 339 ms went to queue 179 (53%), prefill 150 (44%), outside the engine 10 "
    "(3%) (200 of 200 ok requests split) → queueing: lower the admission limit or add replicas"
)


def judged(records: list[RequestRecord], ttft_ms: float, percentile: float = 90) -> Summary:
    """`records` as one chat class with a TTFT target at `percentile`."""
    slo = SloTargets(ttft_ms=ttft_ms, percentile=percentile)
    return audit(to_frame(records), run_id="r", planned=len(records),
                 objectives={"chat": Objective(name="chat", slo=slo)})  # fmt: skip


def text(summary: Summary) -> str:
    """The terminal summary as plain text, wide enough for one line per note."""
    console = Console(record=True, width=400, color_system=None)
    console.print(render_summary(summary))
    return console.export_text()


def test_a_missed_ttft_check_says_where_ttft_went_and_what_it_points_to() -> None:
    """TTFT p90 339 ms against 300: the line under the check splits it, queue first."""
    shown = text(judged(QUEUED, ttft_ms=300)).splitlines()
    check = next(i for i, line in enumerate(shown) if "TTFT p90" in line and "MISSED" in line)
    assert shown[check + 1].strip() == AT_P90


def test_at_the_median_prefill_is_the_cause() -> None:
    """A p50 target of 200 ms is missed at 259 ms: 99 queue, 150 prefill: prefill's fix."""
    shown = text(judged(QUEUED, ttft_ms=200, percentile=50))
    assert (
        "chat TTFT p50 259 ms went to queue 99 (38%), prefill 150 (58%), outside the engine 10 "
        "(4%) (200 of 200 ok requests split) → prefill: prompt length, prefix caching, the "
        "prefill chunk budget" in shown
    )


def test_no_split_line_when_the_check_is_met_or_the_server_said_nothing() -> None:
    """A met TTFT check, or a missed one without the server's account, has no split line."""
    assert "went to" not in text(judged(QUEUED, ttft_ms=1000))
    plain = [streamed_record(i, ttft_ms=400, intended_ms=10.0 * i) for i in range(50)]
    missed = text(judged(plain, ttft_ms=300))
    assert "MISSED" in missed
    assert "went to" not in missed


def test_the_clients_lag_and_the_servers_intake_are_named_when_not_zero() -> None:
    """A point with 40 ms before send and 5 ms of intake names both, and a span count."""
    point = SplitPoint(percentile=99.0, requests=1, ttft_ms=255.0, send_lag_ms=40.0,
                       outside_ms=10.0, intake_ms=5.0, queue_ms=0.0, prefill_ms=200.0,
                       cause="prefill_ms")  # fmt: skip
    split = TtftSplit(requests=3, ok=4, from_spans=2, p50=None, p90=None, p99=point,
                      at_target=point, breaching=None)  # fmt: skip
    assert split_sentence(split, point) == (
        "TTFT p99 255 ms went to queue 0.0 (0%), prefill 200 (78%), server intake 5.0 (2%), "
        "outside the engine 10 (4%), before send 40 (16%) (3 of 4 ok requests split, 2 by span)"
        " → prefill: prompt length, prefix caching, the prefill chunk budget"
    )


def test_junit_and_markdown_carry_the_split_in_the_missed_checks_why() -> None:
    """The TTFT testcase's failure message and the Markdown's why line end with the split."""
    summary = judged(QUEUED, ttft_ms=300)
    suites = ElementTree.fromstring(render_run_junit(summary))
    failure = suites.find(".//testcase[@name='ttft_ms p90']/failure")
    assert failure is not None
    expected = AT_P90.removeprefix("chat ")
    assert failure.get("message", "").endswith(f"; {expected}")
    assert f"; {expected}" in render_run_markdown(summary)


def test_the_report_draws_and_tabulates_where_ttft_went(tmp_path: Path) -> None:
    """A run whose server said: the class's report has its TTFT-split figure (a PNG) and a
    table whose p90 row is 339 ms = queue 179 + prefill 150 + outside 10; one that did not
    has neither."""
    t0 = datetime(2026, 12, 6, tzinfo=UTC)
    slo = SloTargets(ttft_ms=300, percentile=90)
    built = build_run_report(write_run(tmp_path, t0, QUEUED, slos=slo, run_id="split"))
    assert built.figures["chat-ttft_split"].startswith(b"\x89PNG\r\n\x1a\n")
    assert built.captions["chat-ttft_split"] == "chat: where TTFT went"
    markdown = render_markdown(built)
    assert (
        "| p90 | 5 | 339 | 0.0 (0%) | 10 (3%) | 0.0 (0%) | 179 (53%) | 150 (44%) | "
        "queueing: lower the admission limit or add replicas |" in markdown
    )
    plain = [streamed_record(i, ttft_ms=400, intended_ms=10.0 * i) for i in range(50)]
    other = build_run_report(write_run(tmp_path, t0, plain, slos=slo, run_id="plain"))
    assert "chat-ttft_split" not in other.figures
    assert "Where TTFT went" not in render_markdown(other)


def test_many_breaching_requests_are_drawn_as_the_means_of_equal_runs() -> None:
    """250 rows become 100 bars (runs of 2 or 3, in order: the first bar the mean of rows
    0-2); 40 rows stay 40 bars."""
    rows = np.arange(250, dtype=np.float64).reshape(-1, 1) * np.ones((1, 5))
    drawn = grouped(rows)
    assert drawn.shape == (100, 5)
    assert drawn[0, 0] == 1.0
    assert drawn[-1, 0] == 248.5
    assert grouped(rows[:40]).shape == (40, 5)


def test_the_report_shows_every_server_timing_the_server_said(tmp_path: Path) -> None:
    """A server that says its TTFT from arrival (vLLM's span, and the in-band TTFT summed
    from queue and prefill) gets a report with that row, not a KeyError."""
    records = [split_record(i, outside_ms=10, queue_ms=5.0, prefill_ms=150, intake_ms=2,
                            intended_ms=10.0 * i) for i in range(20)]  # fmt: skip
    run_dir = write_run(tmp_path, datetime(2026, 12, 6, tzinfo=UTC), records,
                        slos=SloTargets(ttft_ms=300), run_id="said")  # fmt: skip
    markdown = render_markdown(build_run_report(run_dir))
    assert "| server TTFT (arrival → first token) | 20 | 157 ms |" in markdown
