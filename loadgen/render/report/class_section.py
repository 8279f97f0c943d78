"""One class's section of the run report: its objective, SLO checks, outcomes, latency
percentiles (nearest rank, failures worst where marked), tokens, server timings, where
TTFT went, top errors, figures and time windows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from loadgen.analysis.metrics import SERVER_MS_FIELDS
from loadgen.analysis.windows import (
    MAX_WINDOWS,
    WINDOW_PERCENTILES,
    WINDOWED,
    percentile_column,
)
from loadgen.measures import GAP, MEASURES, TTFVT
from loadgen.printable import printable
from loadgen.render.report.blocks import (
    Block,
    Details,
    Figure,
    Heading,
    Para,
    Table,
    count,
    met_word,
    num,
    pct,
    verdict_word,
)
from loadgen.render.report.model import ClassDetails, ErrorCount, RunReport
from loadgen.render.run_checks import STATUS
from loadgen.render.split_view import LABELS as SPLIT_LABELS
from loadgen.render.split_view import cause_text, ms
from loadgen.render.terminal import (
    bounds_text,
    delivery_notes,
    fmt_ms,
    fmt_num,
    stream_notes,
    with_unit,
)
from loadgen.results.records import Outcome
from loadgen.results.summary import (
    TTFT_PARTS,
    BatchAudit,
    ClassAudit,
    FailureRankedStats,
    LatencyStats,
    ModelAudit,
    ServerTimings,
    SessionsAudit,
    SloAudit,
    TrajectoryAudit,
    TtftSplit,
)

ERROR_TEXT_CHARS = 300  # an error message longer than this is cut in the report (not the JSON)
Percentiles = LatencyStats | FailureRankedStats


def class_blocks(name: str, cls: ClassAudit, report: RunReport) -> list[Block]:
    details = report.classes[name]
    slo = cls.slo
    blocks: list[Block] = [
        Heading(2, f"Class {name}: {verdict_word(slo)}"),
        *_objective_tables(cls),
        _checks_table(slo),
        Para(
            f"Attainment {pct(slo.attainment)} of {cls.requests:,} requests met every "
            "threshold of the class" + _share_bounds(slo) + "."
        ),
        *_throughput_tables(details, report.summary.duration_s),
        _outcomes_table(cls),
        _percentile_table(cls),
        _tokens_table(cls, details),
        _delivery_table(cls),
    ]
    if cls.models:
        blocks.append(_models_table(cls.models))
    if cls.server_timings_ms.requests:
        blocks.append(_server_table(cls.server_timings_ms, cls))
    if cls.ttft_split.requests:
        blocks.append(_split_table(cls.ttft_split))
    if details.top_errors:
        blocks.append(_errors_table(details.top_errors))
    blocks.extend(Figure(f, report.captions.get(f, f)) for f in details.figures)
    windows = report.windows.filter(pl.col("class") == name)
    blocks.append(_windows_details(name, windows))
    return blocks


def _throughput_tables(details: ClassDetails, duration_s: float) -> list[Block]:
    """Throughput and goodput in requests, output tokens and input tokens per second."""
    t = details.throughput
    if t is None:
        return []
    rows = [
        (label, count(r.requests), num(r.requests_per_s), num(r.output_tokens_per_s),
         num(r.input_tokens_per_s))
        for label, r in (("completed (ok)", t.completed), ("goodput (met every SLO)", t.good))
    ]  # fmt: skip
    headers = ("", "requests", "requests/s", "output tokens/s", "input tokens/s")
    title = f"Throughput (per second of the run's {duration_s:,.1f} s)"
    blocks: list[Block] = [Table(title, headers, rows)]
    if t.input_planned:
        blocks.append(Para(f"Input tokens: planned counts for {t.input_planned:,} ok requests "
                           "whose server reported no prompt tokens."))  # fmt: skip
    return blocks


def _windows_details(name: str, windows: pl.DataFrame) -> Details:
    """The class's windows table, open up to `MAX_WINDOWS` rows (every window a run's fitted
    size gives); past that (a --window or --step the reader chose) folded in the HTML page,
    one click from the whole table (Markdown shows every row)."""
    count, table = windows.height, _windows_table(windows)
    if count <= MAX_WINDOWS:
        return Details(f"{name}: {count} windows", [table], True)
    return Details(f"{name}: {count} windows (over {MAX_WINDOWS})", [table], False)


def _objective_tables(cls: ClassAudit) -> list[Block]:
    """The batch, trajectory or sessions block of a class (summarization, agent, chat)."""
    blocks: list[Block] = []
    if cls.batch:
        blocks.append(_batch_table(cls.batch))
    trajectory = cls.trajectory
    if trajectory and trajectory.trajectories:
        blocks.extend(_trajectory_tables(trajectory))
    if sessions := cls.sessions:
        blocks.append(_sessions_table(sessions))
    return blocks


def _batch_table(batch: BatchAudit) -> Table:
    deadline = batch.deadline_s
    return Table("Batch (judges this class; latency checks below are diagnostic)",
                 ("measure", "value"), [
        ("documents ok", f"{batch.ok:,} / {batch.documents:,}"),
        ("completion time", num(batch.completion_time_s, " s")),
        ("deadline", "none" if deadline is None else num(deadline, " s")),
        ("input tokens/s", num(batch.input_tokens_per_s)),
        ("output tokens/s", num(batch.output_tokens_per_s)),
        ("verdict", met_word(batch.met)),
    ])  # fmt: skip


def _trajectory_tables(trajectory: TrajectoryAudit) -> list[Block]:
    split, duration = trajectory.time_split_s, trajectory.duration_s
    summary = Table("Trajectories (judge this class; latency checks below are diagnostic)",
                    ("measure", "value"), [
        ("trajectories ok", f"{trajectory.ok:,} / {trajectory.trajectories:,}"),
        ("attainment / target", f"{pct(trajectory.attainment)} / "
                                f"{pct(trajectory.target_attainment)}"),
        ("attainment bounds", f"{pct(trajectory.attainment_low)} – "
                              f"{pct(trajectory.attainment_high)}"),
        ("verdict", (trajectory.verdict or met_word(trajectory.met)).upper()
         + (f" ({trajectory.needed:,} trajectories, all ok, would judge it)"
            if trajectory.needed else "")),
        ("budget", num(trajectory.budget_s, " s")),
        ("failed / skipped hops", f"{trajectory.failed_hops} / {trajectory.skipped_hops}"),
        ("duration p50 / p99", f"{num(duration.p50, ' s')} / {num(duration.p99, ' s')}"),
        ("time in TTFT / decode / tools",
         f"{split.ttft} s / {split.decode} s / {split.tool} s"),
    ])  # fmt: skip
    hops = Table("Per-hop duration (intended send → end, ok hops)",
                 ("hop", "p50", "p90", "p99", "n"), [
        (hop, num(v.p50, " ms"), num(v.p90, " ms"), num(v.p99, " ms"), f"{v.count:,}")
        for hop, v in trajectory.per_hop_ms.items()
    ])  # fmt: skip
    growth = Table("Per-hop context and TTFT (ok hops): prefill growth and cache effects",
                   ("hop", "requests", "context tokens mean / max", "server prompt tokens",
                    "TTFT p50", "TTFT p90"), [
        (hop, f"{h.requests:,}", f"{num(h.prompt_tokens_mean)} / {num(h.prompt_tokens_max)}",
         num(h.server_prompt_tokens_mean), num(h.ttft_ms.p50, " ms"), num(h.ttft_ms.p90, " ms"))
        for hop, h in trajectory.per_hop.items()
    ])  # fmt: skip
    return [summary, hops, growth] if trajectory.per_hop else [summary, hops]


def _models_table(models: Mapping[str, ModelAudit]) -> Table:
    """Per model (or LoRA adapter) of a class's mix, against the class's targets."""
    return Table("Per model (each model's requests against the class's targets)",
                 ("model", "requests", "failed", "TTFT p50 / p99", "TPOT p50 / p99",
                  "E2E p99", "attainment", "goodput", "targets"), [
        (model, f"{m.requests:,}", f"{m.failed:,}",
         f"{num(m.ttft_ms.p50, ' ms')} / {num(m.ttft_ms.p99, ' ms')}",
         f"{num(m.tpot_ms.p50, ' ms')} / {num(m.tpot_ms.p99, ' ms')}",
         num(m.e2e_ms.p99, " ms"), pct(m.attainment), num(m.goodput.requests_per_s, " req/s"),
         met_word(m.met) if m.verdict is None or m.met is None else m.verdict.upper())
        for model, m in models.items()
    ])  # fmt: skip


def _sessions_table(sessions: SessionsAudit) -> Table:
    return Table("Sessions", ("measure", "value"), [
        ("sessions", f"{sessions.sessions:,}"),
        ("with every turn ok", f"{sessions.completed:,}"),
        ("turns", f"{sessions.turns:,}"),
    ])  # fmt: skip


NOT_JUDGED = "not judged"  # a check of a run that stopped early: partial figures


def _checks_table(slo: SloAudit) -> Table:
    """One row per check with its bounds and verdict; a run that stopped early (met is
    None) judges none of them, so its rows say "not judged" (never a red FAIL under a
    banner saying nothing is judged)."""
    rows = []
    partial = slo.met is None
    for check in slo.checks:
        p, value = check.percentile, check.value_ms
        shown = with_unit(value, "ms") if value is not None or check.population == 0 else "fail"
        if partial and shown == "fail":
            shown = "on a failure"  # a figure, not a verdict: not toned red
        result = NOT_JUDGED if partial else STATUS[check.judged]
        level = "—" if check.confidence is None else f"{check.confidence:.0%}"
        rows.append(
            (
                check.metric.removesuffix("_ms").upper(),
                f"p{p:g}" if p is not None else "—",
                shown,
                bounds_text(check) if check.confidence is not None else "—",
                level,
                f"≤ {with_unit(check.target_ms, 'ms')}" if check.target_ms is not None else "—",
                f"{check.population:,}",
                result,
                check.note or "",
            )
        )
    if not rows:
        rows.append(("—", "—", "—", "—", "—", "no targets", "—", "—", "nothing was promised"))
    headers = ("check", "percentile", "value", "bounds", "each side", "target", "population",
               "result", "note")  # fmt: skip
    if slo.met is None:  # a run that stopped early: the checks' figures are partial
        return Table("SLO checks on partial figures (failures ranked worst; not judged: the "
                     "run stopped early)", headers, rows)  # fmt: skip
    return Table("SLO checks (failures ranked worst; one-sided order-statistic bounds: MET "
                 "when the upper one meets the target, MISSED when the lower one misses it, "
                 "else INCONCLUSIVE)", headers, rows)  # fmt: skip


def _share_bounds(slo: SloAudit) -> str:
    """`, 95% bounds 91.2%–100.0%` after the attainment (exact one-sided bounds)."""
    if slo.attainment_low is None or slo.attainment_high is None:
        return ""
    level = slo.targets.confidence
    return f" ({level:.0%} bounds {pct(slo.attainment_low)}–{pct(slo.attainment_high)})"


def _outcomes_table(cls: ClassAudit) -> Table:
    total = cls.requests
    rows = [
        (outcome, f"{n:,}", pct(n / total if total else None))
        for outcome, n in cls.outcomes.items()
        if n or outcome == Outcome.OK.value
    ]
    return Table("Outcomes", ("outcome", "requests", "share"), rows)


def _percentile_rows(cls: ClassAudit) -> list[tuple[str, Percentiles, float | None]]:
    """(label, stats, SLO target) per measure, and with failures ranked worst where it ranks
    them; TTFVT only where reasoning streamed (else it is TTFT)."""
    targets = cls.slo.targets.thresholds_ms()
    rows: list[tuple[str, Percentiles, float | None]] = []
    for m in MEASURES:
        target = targets.get(m.column)
        if m is TTFVT and not cls.reasoning_requests:
            continue
        label = f"{m.label} (per gap)" if m.per == GAP else m.label
        if m is TTFVT:  # reasoning streamed: the visible answer came later
            label = f"{m.label} (first visible token; {cls.reasoning_requests:,} with reasoning)"
        rows.append((label, cls.stats(m), target))
        if (ranked := cls.ranked(m)) is not None:
            rows.append((f"{m.label}, failures worst", ranked, target))
    return rows


def _percentile_table(cls: ClassAudit) -> Table:
    p = cls.slo.targets.percentile
    rows = []
    measures = _percentile_rows(cls)
    for label, stats, target in measures:
        missing = "fail" if stats.count else "—"
        points = (stats.p50, stats.p90, stats.p95, stats.p99, stats.max)
        cells = [with_unit(v, "ms") if v is not None else missing for v in points]
        target_text = f"≤ {with_unit(target, 'ms')} at p{p:g}" if target is not None else ""
        rows.append((label, f"{stats.count:,}", *cells, target_text))
    headers = ("measure", "n", "p50", "p90", "p95", "p99", "max", "SLO target")
    return Table("Latency percentiles (ok requests unless 'failures worst')", headers, rows)


SERVER_LABELS = {
    "queue_ms": "server queue",
    "load_ms": "server model load",
    "prefill_ms": "server prefill (prompt eval)",
    "decode_ms": "server decode (eval)",
    "total_ms": "server total",
    "ttft_ms": "server TTFT (arrival → first token)",
    "itl_ms": "server mean ITL",
}
assert set(SERVER_LABELS) == set(SERVER_MS_FIELDS), "a server timing without its label"


def _server_table(server: ServerTimings, cls: ClassAudit) -> Table:
    """What the server reported about its own work, beside the client's TTFT and E2E."""
    measured = [(SERVER_LABELS[name], stats) for name, stats in server.measured().items()]
    client = [("client TTFT from send", cls.ttft_from_send_ms), ("client E2E", cls.e2e_ms)]
    rows = []
    for label, stats in [*measured, *client]:
        cells = [with_unit(v, "ms") if v is not None else "—"
                 for v in (stats.p50, stats.p90, stats.p99, stats.max)]  # fmt: skip
        rows.append((label, f"{stats.count:,}", *cells))
    title = f"Server-reported timings ({server.requests:,} ok requests), beside the client's own"
    return Table(title, ("measure", "n", "p50", "p90", "p99", "max"), rows)


def _split_table(split: TtftSplit) -> Table:
    """Where TTFT went at p50, p90, p99, the target's percentile and over the target: each
    part's mean ms and share, and what the largest points to (`analysis.split`)."""
    points = [*split.points().values()]
    target = split.at_target
    if target is not None and target.percentile not in [p.percentile for p in points]:
        points.append(target)
    points += [split.breaching] if split.breaching is not None else []
    rows = []
    for point in points:
        where = "over the target" if point.percentile is None else f"p{point.percentile:g}"
        shares = [f"{ms(v)} ({v / point.ttft_ms:.0%})" if point.ttft_ms > 0 else ms(v)
                  for v in point.parts().values()]  # fmt: skip
        rows.append((where, f"{point.requests:,}", ms(point.ttft_ms), *shares,
                     cause_text(point)))  # fmt: skip
    spans = f", {split.from_spans:,} by span" if split.from_spans else ""
    title = (f"Where TTFT went, ms ({split.requests:,} of {split.ok:,} ok requests split by the "
             f"server's account{spans})")  # fmt: skip
    headers = ("at", "requests", "TTFT", *(SPLIT_LABELS[p] for p in TTFT_PARTS), "points to")
    return Table(title, headers, rows)


def _tokens_table(cls: ClassAudit, details: ClassDetails) -> Table:
    out, chunking, prompt = cls.output_tokens, cls.tokens_per_chunk, details.prompt_tokens
    diff = prompt.mean_relative_diff
    rows = [
        (
            "output tokens (ok) mean / p50 / max / total",
            f"{num(out.mean)} / {num(out.p50)} / {num(out.max)} / {num(out.total)}",
        ),
        (
            "prompt tokens planned vs server-reported (mean)",
            f"{num(prompt.target_mean)} vs {num(prompt.reported_mean)} "
            f"over {prompt.requests:,} requests with usage",
        ),
        (
            "prompt tokens mean relative difference",
            fmt_num(diff, 2, sign=True, percent=True) if diff is not None else "—",
        ),
        ("tokens per chunk mean / max", f"{num(chunking.mean)} / {num(chunking.max)}"),
    ]
    ends = cls.stream_ends
    if ends.n_from:
        sources = ", ".join(f"{n:,} {source}" for source, n in ends.n_from.items())
        rows.append(("N from (requests with output)",
                     f"{sources}; {pct(ends.n_from_usage_share)} from usage"))  # fmt: skip
    if ends.finish_reasons:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in ends.finish_reasons.items())
        rows.append(("stop reasons (requests with output)", reasons))
    rows.append(("truncated / stopped early", f"{ends.truncated} / {ends.stopped_early}"))
    usage = f"{ends.usage_disagrees} / {ends.usage_not_taken} / {ends.usage_problems}"
    rows.append(("usage disagrees with the stream / beyond it (not N) / usage problems", usage))
    if chunking.mean is not None and chunking.mean > 1 and not ends.n_counted:
        rows.append(("note", "chunks carry several tokens: ITL figures are per chunk"))
    cache = cls.prefix_cache
    if cache is not None:
        rows.append((
            "prefix-cache hit share (cached / prompt tokens)",
            f"{pct(cache.hit_share)}: {num(cache.cached_tokens)} of {num(cache.prompt_tokens)} "
            f"over {cache.requests} requests whose server said",
        ))  # fmt: skip
    rows.extend(("note", note) for note in stream_notes(cls))
    return Table("Tokens and stream ends", ("", ""), rows)


def _delivery_table(cls: ClassAudit) -> Table:
    """How the class's output arrived: reads, events per read, tokens per event, and the
    streams that arrived coalesced (their share, and how their TPOT/ITL were judged)."""
    d = cls.delivery
    rows = [
        ("streams (ok, with output) / network reads / output events",
         f"{d.streams:,} / {d.reads:,} / {d.events:,}"),
        ("events per read (the most of one stream)",
         f"{num(d.events_per_read)} ({num(d.events_per_read_max)})"),
        ("tokens per event", num(d.tokens_per_event)),
        (f"coalesced streams (half their reads at {d.coalesced_at_events}+ events)",
         f"{d.coalesced:,}: {pct(d.coalesced_share)} of streams, "
         f"{pct(d.coalesced_token_share)} of output tokens"),
    ]  # fmt: skip
    if d.coalesced:
        rows.append(("note", "; ".join(note for note, _ in delivery_notes(cls))))
    return Table("Delivery (how the output arrived)", ("", ""), rows)


def _errors_table(errors: Sequence[ErrorCount]) -> Table:
    rows = []
    for e in errors:
        message = printable(e.error or "(no message)")  # records of any loadgen: escaped here too
        if len(message) > ERROR_TEXT_CHARS:
            message = message[:ERROR_TEXT_CHARS] + "…"
        status = str(e.http_status) if e.http_status is not None else "—"
        rows.append((f"{e.count:,}", e.outcome, status, message))
    return Table("Top errors", ("count", "outcome", "HTTP", "message"), rows)


SERVER_WINDOW_COLUMNS = {"server_queue_depth": "server queue (mean)",
                         "server_running": "server running (mean)",
                         "server_kv_usage": "server KV use (mean)"}  # fmt: skip


def _server_cell(w: dict[str, object], column: str) -> str:
    value = w[column]
    if not isinstance(value, float | int):
        return "—"
    return pct(float(value)) if column == "server_kv_usage" else f"{value:.1f}"


def _rate_cell(w: Mapping[str, Any]) -> str:
    """`2.00`; `2.00 (over 4.5 s)` for a partly covered window; `— (arrivals ended 1.2 s
    in)` when too little of it was covered to estimate a rate (`analysis.windows`)."""
    rate, covered = w["arrival_rate_per_s"], w["covered_s"]
    span = w["window_end_s"] - w["window_start_s"]
    if rate is None:
        return (
            "— (after arrivals ended)" if covered == 0 else f"— (arrivals ended {covered:.2g} s in)"
        )
    whole = covered >= span - 1e-6  # seconds from ns: float noise is not a partial window
    return f"{rate:.2f}" if whole else f"{rate:.2f} (over {covered:.1f} s)"


def _windows_table(windows: pl.DataFrame) -> Table:
    server = [c for c in SERVER_WINDOW_COLUMNS if c in windows.columns]
    rows = []
    latency = [(m, p) for m in WINDOWED for p in WINDOW_PERCENTILES]
    for w in windows.iter_rows(named=True):
        rows.append(
            (
                f"{w['window_start_s']:g}–{w['window_end_s']:g} s",
                count(w["requests"]),
                _rate_cell(w),
                count(w["in_flight"]),
                count(w["ok"]),
                count(w["failed"]),
                pct(w["attainment"]),
                *(fmt_ms(w[percentile_column(m, p)]) for m, p in latency),
                *(_server_cell(w, c) for c in server),
            )
        )
    headers = (
        "window",
        "requests",
        "req/s",
        "in flight at end",
        "ok",
        "failed",
        "attainment",
        *(f"{m.label} p{p:g} ({m.unit})" for m, p in latency),
        *(SERVER_WINDOW_COLUMNS[c] for c in server),
    )
    return Table("Time windows (ok requests' percentiles, ms)", headers, rows)
