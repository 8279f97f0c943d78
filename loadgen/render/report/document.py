"""The run report as blocks: banners, the run, generator and classes tables, one section per
class (`class_section`), and the closing note on how every figure was computed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from loadgen import __version__
from loadgen.analysis.health import health_text
from loadgen.analysis.slo import stop_of
from loadgen.analysis.windows import MAX_WINDOWS, MIN_COVERAGE, MIN_REQUESTS_PER_WINDOW
from loadgen.errors import LoadgenError
from loadgen.render.cache_view import cache_line
from loadgen.render.cost_view import cost_table
from loadgen.render.report.blocks import Block, Heading, Para, Table, num, pct, verdict_word
from loadgen.render.report.class_section import class_blocks
from loadgen.render.report.model import RunReport
from loadgen.render.report.server_section import server_blocks
from loadgen.render.terminal import STOP_TEXT, asked_text, with_unit
from loadgen.results.runfolder import RunInfo, TargetInfo
from loadgen.results.summary import ClassAudit, GeneratorHealth


def document(report: RunReport) -> list[Block]:
    """The report's content, in order, as plain-text blocks (escaped by each renderer)."""
    summary, info = report.summary, report.run_info
    blocks: list[Block] = [Heading(1, f"loadgen report · {summary.run_id}")]
    blocks.extend(_banners(report))
    blocks.append(_run_table(report))
    blocks.append(_generator_table(summary.generator))
    blocks.append(_classes_table(summary.classes))
    if summary.cost is not None:
        blocks.append(cost_table(summary.cost))
    blocks.extend(server_blocks(report))
    for name, cls in summary.classes.items():
        blocks.extend(class_blocks(name, cls, report))
    mode = f"sliding, step {report.step_s:g} s" if report.step_s else "tumbling"
    blocks.append(
        Para(
            f"Re-audited by loadgen {__version__} from records.parquet and run.json "
            f"(run written by loadgen {info.loadgen_version or '?'}). Latencies are "
            "measured from the intended send time; percentiles are nearest rank; "
            "'failures worst' ranks every failed request as +∞ and shows 'fail' where a "
            f"percentile falls on one. Windows: {_window_text(report)}, {mode}, requests by "
            "intended time, ITL gaps by the time the gap ends. A window's arrival rate is "
            f"over the part of it the arrival schedule covered{_schedule_text(report)}; "
            f"'—' where under {MIN_COVERAGE:.0%} of it was covered."
        )
    )
    return blocks


def _window_text(report: RunReport) -> str:
    """`5 s (chosen for this run: ...)`, or `10 s` as given."""
    if not report.window_chosen:
        return f"{report.window_s:g} s"
    return (
        f"{report.window_s:g} s (chosen for this run: the smallest round size giving at most "
        f"{MAX_WINDOWS} windows and {MIN_REQUESTS_PER_WINDOW}+ requests per window on average; "
        "--window sets one)"
    )


def _schedule_text(report: RunReport) -> str:
    end = report.schedule_end_s
    return "" if end is None else f" (the schedule ended at {end:.1f} s)"


def _banners(report: RunReport) -> list[Block]:
    generator, verdict = report.summary.generator, report.summary.verdict
    banners: list[Block] = []
    stop = stop_of(verdict)
    if stop is not None:
        banners.append(
            Para(
                f"PARTIAL: the run stopped before its end ({STOP_TEXT[stop]}). Requests it never "
                "sent are recorded as not_sent, those it sent but never saw finish as "
                "cancelled; every figure below is partial and no SLO is judged.",
                "bad",
            )
        )
    if not report.run_info.finished and not report.run_info.recovered:
        banners.append(Para(
            "The run never wrote its end: the records its parts kept, and every other planned "
            "request counted as `loadgen report --recover` will record it (cancelled or "
            "not_sent); run that to write them into the folder.", "bad",
        ))  # fmt: skip
    if generator.fell_behind:
        banners.append(
            Para(
                f"GENERATOR FELL BEHIND: {health_text(generator)}. These latencies cannot "
                "tell the server's part from the client's.",
                "bad",
            )
        )
    if report.slos_overridden:
        banners.append(
            Para(
                "SLO targets overridden (not the workload's) for: "
                + ", ".join(report.slos_overridden),
                "warn",
            )
        )
    if stop is not None:
        word = f"none ({STOP_TEXT[stop]}: partial figures)"
    elif verdict.fell_behind:
        word = "GENERATOR FELL BEHIND"
    elif verdict.status == "inconclusive":
        word = "SLO INCONCLUSIVE (nothing missed; not every SLO could be judged at its confidence)"
    else:
        word = "SLO MET" if verdict.slo_met else "SLO MISSED"
    if verdict.rule == "point":
        word += " by point estimates (--verdict point)"
    tone = "" if verdict.exit_code == 0 else "warn" if verdict.status == "inconclusive" else "bad"
    banners.append(Para(f"Verdict: {word} (exit {verdict.exit_code})", tone or "good"))
    if report.summary.cache is not None:  # beside the verdict: what the server had cached
        banners.append(Para(cache_line(report.summary.cache)))
    return banners


def _run_table(report: RunReport) -> Table:
    info, summary, generator = report.run_info, report.summary, report.summary.generator
    target = info.target or TargetInfo(url="?", api="?", model="?")
    source = info.workload.source if info.workload else None
    sim = " (built-in simulator)" if target.builtin_sim else ""
    cap = info.options.max_in_flight if info.options else None
    rows = [
        ("run id", summary.run_id),
        ("workload", f"{_workload_key(info)} ({Path(source or '?').name})"),
        ("started", _utc(info.t0.utc if info.t0 else None)),
        ("target", f"{target.url}{sim}"),
        ("API · model", f"{target.api} · {target.model}"),
        ("duration", f"{summary.duration_s:.1f} s (first intended send → last end)"),
        (
            "requests",
            f"planned {generator.planned:,} · sent {generator.sent:,} · "
            f"recorded {generator.recorded:,}",
        ),
        ("seed", "?" if info.seed is None else str(info.seed)),
        ("max in flight", "open loop (no cap)" if cap is None else str(cap)),
    ]
    return Table("Run", ("", ""), rows)


def _workload_key(info: RunInfo) -> str:
    """`name@fingerprint`: what the results store pools this run by (`workload.identity`)."""

    try:
        return str(info.identity()["key"])
    except LoadgenError:
        return info.workload.name if info.workload else "?"


def _utc(text: object) -> str:
    try:
        return datetime.fromisoformat(str(text)).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return "unknown"


def _generator_table(generator: GeneratorHealth) -> Table:
    """The generator's health in words and its rates, one unit per row: the rate asked
    (req/s, sessions/s, ...) on its own row, the request rates scheduled and achieved on
    theirs."""
    lag, send = generator.lag_ms, generator.send_lag_ms
    rows = [
        (
            "generator health",
            f"{'FELL BEHIND' if generator.fell_behind else 'OK'} — {health_text(generator)}",
        ),
        ("start lag p50 / p99 / max", " / ".join(map(with_unit, (lag.p50, lag.p99, lag.max)))),
        ("send lag p50 / p99 / max", " / ".join(map(with_unit, (send.p50, send.p99, send.max)))),
        *_reaction_rows(generator),
        ("rate asked", f"{asked_text(generator) or '—'}{_asked_note(generator)}"),
        (
            "request rate scheduled",
            f"{num(generator.target_rate_per_s, ' req/s')} (over the sampled send times)",
        ),
        (
            "request rate achieved",
            f"{num(generator.achieved_rate_per_s, ' req/s')} (the "
            "scheduled rate less the send lag's trend)",
        ),
        ("retries", f"{generator.retries:,}"),
    ]
    return Table("Generator health", ("", ""), rows)


def _reaction_rows(generator: GeneratorHealth) -> list[tuple[str, str]]:
    """The client's next-turn reaction (later turns and documents), when there were any."""
    react = generator.chained_lag_ms
    if react.p99 is None:
        return []
    note = "the client's own, inside those turns' TTFT, and taken out with the send lag"
    values = " / ".join(map(with_unit, (react.p50, react.p99, react.max)))
    return [("next-turn reaction p50 / p99 / max", f"{values} ({note})")]


def _asked_note(generator: GeneratorHealth) -> str:
    """Why no request rate was asked, when the workload asked for something else."""
    if generator.requested_rate_per_s is not None or not generator.asked:
        return ""
    units = {load.unit for load in generator.asked.values()}
    why = []
    if "sessions" in units:
        why.append("a session's later turns follow its earlier answers")
    if "trajectories" in units:
        why.append("an agent's hops follow its earlier hops")
    if "closed_loop" in units:
        why.append("a closed loop sends when a request ends")
    if "trace" in units:
        why.append("a trace's times are read from its file")
    return " (no run-wide request rate was asked: " + ", ".join(why) + ")" if why else ""


def _classes_table(classes: Mapping[str, ClassAudit]) -> Table:
    rows = [
        (name, f"{cls.requests:,}", f"{cls.failed:,}", pct(cls.slo.attainment),
         num(cls.goodput.requests_per_s, " req/s"), verdict_word(cls.slo))
        for name, cls in classes.items()
    ]  # fmt: skip
    return Table("Classes", ("class", "requests", "failed", "attainment", "goodput", "SLO"), rows)
