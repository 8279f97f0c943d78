"""Tests for the terminal summary: it renders the classes, verdicts and generator health."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
from rich.console import Console

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.render import terminal
from loadgen.render.report.document import _generator_table
from loadgen.render.terminal import fmt_ms, render_summary, with_unit
from loadgen.results.records import RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import failed_record, streamed_record
from loadgen.workload.spec import SloTargets

MS = 1_000_000


def record(
    request_id: int, class_name: str, *, lag_ms: float = 0.0, ok: bool = True
) -> RequestRecord:
    """An ok three-token request with TTFT 100 ms and 10 ms gaps, or a rejected one."""
    intended_ms = request_id * 10.0
    if not ok:
        return failed_record(request_id, intended_ms=intended_ms, lag_ms=lag_ms,
                             class_name=class_name)  # fmt: skip
    return streamed_record(request_id, intended_ms=intended_ms, lag_ms=lag_ms,
                           class_name=class_name, end_after_ms=0.0)  # fmt: skip


def summarize(
    frame: pl.DataFrame, *, run_id: str, slos: dict[str, SloTargets], planned: int,
    stopped: str | None = None, rule: str = "interval",
) -> Summary:  # fmt: skip
    """The audit of `frame` with each class judged by its percentile targets alone."""
    objectives = {name: Objective(name=name, slo=targets) for name, targets in slos.items()}
    return audit(frame, run_id=run_id, objectives=objectives, planned=planned, stopped=stopped,
                 rule=rule)  # fmt: skip


def render(summary: Summary) -> str:
    """The summary as plain text at 100 columns."""
    console = Console(record=True, width=100, color_system=None)
    console.print(render_summary(summary))
    return console.export_text()


def test_render_names_classes_and_verdicts() -> None:
    """Each class shows MET or MISSED, the failing check is named, and the exit code shown
    (by the point rule: 16 requests bound no p99, see the INCONCLUSIVE test below)."""
    records = [record(i, "chat") for i in range(10)]
    records += [record(10 + i, "summarization") for i in range(5)] + [
        record(20, "summarization", ok=False)
    ]
    summary = summarize(
        to_frame(records),
        run_id="run-42",
        slos={"chat": SloTargets(ttft_ms=200.0), "summarization": SloTargets(ttft_ms=200.0)},
        planned=len(records),
        rule="point",
    )
    text = render(summary)
    assert "run-42" in text
    assert "chat" in text
    assert "summarization" in text
    assert "MET" in text
    assert "MISSED" in text
    flat = " ".join(text.split())
    assert ("summarization TTFT p99 fail · 95% bounds 100 ms–open (needs 299 requests) · "
            "target ≤ 200 ms · MISSED (p99 falls on a failed request)") in flat  # fmt: skip
    assert "1 rejected" in text
    assert "verdict: SLO MISSED by point estimates (--verdict point) (exit 2)" in text
    assert "FELL BEHIND" not in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_render_says_fell_behind_only_when_the_lag_could_move_the_verdict() -> None:
    """Five sends 20 ms late to a server answering 100 ms after the send (120 ms from
    intended): against 500 ms the MET stands (exit 0) and the lag is said to be charged;
    against 110 ms the MISSED is within the lag (80 ms with the lag and 20 ms of stamp error
    taken out): FELL BEHIND, exit 3, naming the check; against 60 ms even the client's best
    case misses: MISSED, exit 2."""
    records = [streamed_record(i, intended_ms=10.0 * i, lag_ms=20.0, from_send=True)
               for i in range(5)]  # fmt: skip
    frame = to_frame(records)
    for target, exit_code in ((500.0, 0), (110.0, 3), (60.0, 2)):
        slos = {"chat": SloTargets(ttft_ms=target, percentile=50)}
        summary = summarize(frame, run_id="r", slos=slos, planned=5)
        text = " ".join(render(summary).split())
        assert f"(exit {exit_code})" in text
        assert ("FELL BEHIND" in text) is (exit_code == 3)
        assert ("charged to latency; the verdict holds without it" in text) is (exit_code != 3)
    behind = summarize(frame, run_id="r", slos={"chat": SloTargets(ttft_ms=110.0, percentile=50)},
                       planned=5).generator  # fmt: skip
    assert behind.reason is not None
    assert "chat TTFT p50: MISSED as measured" in behind.reason
    assert "MET with the client's time taken out" in behind.reason


def test_render_class_without_targets_or_requests() -> None:
    """A class with no targets says so; one with targets but no requests is MISSED."""
    summary = summarize(
        to_frame([record(1, "batch")]),
        run_id="r",
        slos={"agent": SloTargets(e2e_ms=1.0)},
        planned=1,
    )
    text = render(summary)
    assert "no SLO" in text
    assert "agent: no recorded requests" in text


def test_fmt_ms() -> None:
    """A table's latency keeps 3-4 significant figures in ms whatever its size; a line of
    text says its unit and switches to seconds from 10 s."""
    assert [fmt_ms(v) for v in (None, 1.234, 12.34, 123.4, 12_345.0)] == [
        "—",
        "1.23",
        "12.3",
        "123",
        "12,345",
    ]
    assert [with_unit(v) for v in (None, 412.0, 12_345.0)] == ["—", "412 ms", "12.3 s"]


def test_a_long_e2e_leaves_every_other_column_of_the_run_table_in_ms() -> None:
    """E2E p99 past 10 s (300 gaps of 40-60 ms) once switched the whole table to seconds
    (TPOT `0.0372/0.0579`); each column now keeps ms."""
    gaps = [40.0 + 20.0 * (k % 2) for k in range(300)]
    records = [streamed_record(i, intended_ms=i * 100.0, ttft_ms=80.0, gaps_ms=gaps)
               for i in range(20)]  # fmt: skip
    summary = summarize(to_frame(records), run_id="r", slos={"chat": SloTargets(ttft_ms=200.0)},
                        planned=20)  # fmt: skip
    text = render(summary)
    assert "latencies in ms" in text
    row = next(line for line in text.splitlines() if line.startswith(" chat"))
    assert "50.0/50.0" in row  # TPOT p50/p99 in ms, not 0.0500/0.0500
    assert "15,080" in row  # E2E p99: 80 ms + 300 gaps averaging 50 ms, in ms
    assert row.split()[3] == "80.0/80.0"  # TTFT p50/p99


def test_reasoning_runs_show_time_to_first_visible_token_beside_ttft() -> None:
    """When reasoning streamed first, a line gives TTFVT, which TTFT (first token) does not."""
    records = [
        replace(
            record(i, "chat"),
            first_reasoning_ns=i * 10 * MS + 100 * MS,
            first_content_ns=i * 10 * MS + 120 * MS,
        )
        for i in range(10)
    ]
    summary = summarize(
        to_frame(records), run_id="r", slos={"chat": SloTargets(ttft_ms=200.0)}, planned=10
    )
    text = render(summary)
    assert "reasoning streamed in 10 requests" in text
    assert "first visible token p50/p99 120/120 ms" in text
    plain = render(summarize(to_frame([record(i, "chat") for i in range(10)]), run_id="r",
                             slos={"chat": SloTargets(ttft_ms=200.0)}, planned=10))  # fmt: skip
    assert "first visible token" not in plain


def test_a_run_that_stopped_early_says_partial_and_no_verdict() -> None:
    """Interrupted, watchdog, incomplete: the title says PARTIAL, the class cell "partial", the
    verdict line "none" with the stop's exit code, and no MET or MISSED anywhere, though the
    same records, run to their end, miss the SLO (a rejected request at p99)."""
    records = [record(i, "chat") for i in range(10)] + [record(10, "chat", ok=False)]
    slos = {"chat": SloTargets(ttft_ms=200.0)}
    assert "MISSED" in render(summarize(to_frame(records), run_id="r", slos=slos, planned=11,
                                        rule="point"))  # fmt: skip
    for stop, code in (("interrupted", 130), ("watchdog", 4), ("incomplete", 5)):
        summary = summarize(to_frame(records), run_id="r", slos=slos, planned=11, stopped=stop)
        text = " ".join(render(summary).split())
        assert "PARTIAL figures" in text
        assert f"judge nothing (exit {code})" in text
        assert "partial" in text
        assert "MET" not in text
        assert "MISSED" not in text
        assert "INCONCLUSIVE" not in text
        cell = terminal._class_row("chat", summary.classes["chat"])[4]  # TTFT p99·all
        assert (str(cell), str(cell.style)) == ("fail", "yellow")  # a figure: not a red verdict
    whole = summarize(to_frame(records), run_id="r", slos=slos, planned=11)
    cell = terminal._class_row("chat", whole.classes["chat"])[4]
    assert (str(cell), str(cell.style)) == ("fail", "bold red")


def test_a_slow_next_turn_reaction_is_charged_and_taken_out_like_a_send_lag() -> None:
    """Later turns sent 20 ms after their predecessor ended (the client's reaction, inside
    their TTFT): a MET that holds with it charged stands (exit 0, no warning: the report's
    generator table shows the reaction); a MISSED within it is the client's (exit 3)."""
    records = [streamed_record(0, from_send=True)] + [
        replace(streamed_record(i, intended_ms=10.0 * i, lag_ms=20.0, from_send=True),
                session_id=0, turn=i)
        for i in range(1, 6)
    ]  # fmt: skip
    for target, exit_code in ((500.0, 0), (110.0, 3)):
        summary = summarize(
            to_frame(records), run_id="r",
            slos={"chat": SloTargets(ttft_ms=target, percentile=50)}, planned=6,
        )  # fmt: skip  # six requests bound a median (five would), not a p99
        generator = summary.generator
        assert generator.chained_lag_ms.p99 == 20.0
        assert generator.lag_ms.p99 == 0.0  # the schedule's one send was on time
        assert summary.verdict.exit_code == exit_code
        text = render(summary)
        assert "SLOW REACTION" not in text
        rows = dict(_generator_table(generator).rows)
        shown = rows["next-turn reaction p50 / p99 / max"]
        assert shown.split(" (")[0] == " / ".join([with_unit(20.0)] * 3)


def test_an_inconclusive_run_shows_each_checks_bounds_and_the_requests_needed() -> None:
    """Ten requests far under a p99 target: the class says INCONCLUSIVE (naming the check),
    its line gives the lower bound and an open upper one needing 299 requests, and the
    verdict is exit 7; the same records at p50 (which five requests bound) are MET with
    both bounds shown."""
    records = [record(i, "chat") for i in range(10)]
    frame = to_frame(records)
    summary = summarize(frame, run_id="r", slos={"chat": SloTargets(ttft_ms=200.0)}, planned=10)
    text = " ".join(render(summary).split())
    assert "INCONCLUSIVE" in text
    assert "chat TTFT p99 100 ms · 95% bounds 100 ms–open (needs 299 requests)" in text
    assert "verdict: SLO INCONCLUSIVE (exit 7)" in text
    median = SloTargets(ttft_ms=200.0, percentile=50)
    text = " ".join(render(summarize(frame, run_id="r", slos={"chat": median}, planned=10)).split())
    assert "chat TTFT p50 100 ms · 95% bounds 100–100 ms · target ≤ 200 ms · MET" in text
    assert "verdict: SLO MET (exit 0)" in text


def test_a_merged_runs_process_lines_name_their_shard() -> None:
    """Each shard's engine processes are all `worker 0..`: a merged run's line says which
    shard each is, so two shards of one worker each are not two lines of `worker 0`."""
    from loadgen.results.runfolder import ProcessInfo, RunInfo, WorkersInfo

    def lines(processes: tuple[ProcessInfo, ...]) -> list[str]:
        info = RunInfo(run_id="r", workers=WorkersInfo(count=len(processes), processes=processes))
        return [line.plain.split(":")[0] for line in terminal.render_processes(info)]

    merged = (ProcessInfo(index=0, pid=1, shard=0, t0_skew_us=0.0),
              ProcessInfo(index=0, pid=2, shard=1, t0_skew_us=0.0))  # fmt: skip
    assert lines(merged) == ["shard 0 worker 0", "shard 1 worker 0"]
    workers = (ProcessInfo(index=0, pid=1, t0_skew_us=0.0), ProcessInfo(index=1, pid=2))
    assert lines(workers) == ["worker 0", "worker 1"]
    info = RunInfo(run_id="r", workers=WorkersInfo(count=2, processes=workers))
    assert "t0 skew —" in terminal.render_processes(info)[1].plain  # unknown, not a crash
