"""Terminal report: the run's summary as a compact rich table, readable in 100 columns, and
the lines beside it (each engine process, each shard of a merge, what a recovery did).

Last stage for a person at a terminal: it reads only the typed `Summary` that
`analysis.audit.audit` returns (or `runfolder.read_summary` reads back) and returns a
renderable; printing is the CLI's job. Latencies are ms, percentiles nearest rank;
"p99·all" is the p99 with failures ranked worst, shown as "fail" when it falls on a failed
request. A run that stopped before its end (interrupted, watchdog, killed and recovered)
shows its figures labelled partial and no verdict: nothing says MET or MISSED.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.analysis.health import health_text
from loadgen.analysis.slo import stop_of
from loadgen.measures import TTFT
from loadgen.render.cache_view import cache_line
from loadgen.render.cost_view import cost_line
from loadgen.render.split_view import missed_point, split_sentence
from loadgen.results.recover import Recovery
from loadgen.results.runfolder import DAMAGED_DIR, RunInfo, ShardTable, TargetInfo
from loadgen.results.summary import (
    AskedLoad,
    Check,
    ClassAudit,
    ConnectionUse,
    FailureRankedStats,
    GeneratorHealth,
    ModelAudit,
    ServerAudit,
    SloAudit,
    Summary,
    TrajectoryAudit,
    Verdict,
)

# `verdict.status` of a run that stopped before its end -> what the title and verdict say.
STOP_TEXT = {
    "interrupted": "interrupted by Ctrl-C or SIGTERM",
    "watchdog": "stopped by the watchdog",
    "incomplete": "killed outright; its plans without a record are counted cancelled or not_sent",
}


def render_summary(summary: Summary) -> RenderableType:
    """One table row per class; then failures and failed checks, the generator, the verdict."""
    stop = stop_of(summary.verdict)
    parts: list[RenderableType] = [_class_table(summary)]
    parts.extend(_notes(summary.classes, partial=stop is not None))
    parts.append(_generator_line(summary.generator))
    if summary.connections is not None:
        parts.append(_connections_line(summary.connections))
    if summary.cost is not None:
        parts.append(Text(cost_line(summary.cost)))
    if summary.server is not None:
        parts.append(server_line(summary.server))
    if summary.cache is not None:
        parts.append(Text(cache_line(summary.cache)))
    parts.append(_verdict_line(summary.verdict, stop))
    return Group(*parts)


def server_line(server: ServerAudit) -> Text:
    """`server: vllm · 29 scrapes (0 failed) · queue max 4 · running max 13 · KV max 15.6%`."""
    failed = "?" if server.failures is None else str(server.failures)
    family = server.server if server.scrapes else "no scrape answered"
    parts = [f"server: {family} · {server.scrapes} scrapes ({failed} failed)"]
    for name, label in (("queue_depth", "queue"), ("running", "running")):
        stats = server.gauges.get(name)
        if stats is not None and stats.max is not None and stats.mean is not None:
            parts.append(f"{label} max {stats.max:g}, mean {stats.mean:.1f}")
    kv = server.gauges.get("kv_usage")
    if kv is not None and kv.max is not None:
        parts.append(f"KV max {kv.max:.1%}")
    if server.prefix_cache_hit_share is not None:
        parts.append(f"prefix-cache hits {server.prefix_cache_hit_share:.1%}")
    if server.counters.get("preemptions"):
        parts.append(f"{server.counters['preemptions']:g} preemptions")
    style = "yellow" if server.failures or server.scrapes == 0 else ""
    text = " · ".join(parts)
    if server.access is not None and server.access.problem:
        text += f"\n  {server.access.problem}"  # what failed, where, how to fix it
    return Text(text, style=style)


def _class_table(summary: Summary) -> Table:
    stop = stop_of(summary.verdict)
    stopped = f" · stopped early ({STOP_TEXT[stop]}): PARTIAL figures" if stop else ""
    duration = f"{summary.duration_s:.1f} s"
    title = f"run {summary.run_id}{stopped} · {duration} · latencies in ms"
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    table.add_column("class", no_wrap=True)
    for header in ("reqs", "failed"):
        table.add_column(header, justify="right", no_wrap=True)
    for header in ("TTFT\np50/p99", "TTFT\np99·all", "TPOT\np50/p99", "ITL\np99", "E2E\np99"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("attain", justify="right", no_wrap=True)
    table.add_column("good\nreq/s", justify="right", no_wrap=True)
    table.add_column("SLO", no_wrap=True)
    for name, cls in summary.classes.items():
        table.add_row(*_class_row(name, cls))
        for model, part in (cls.models or {}).items():
            table.add_row(*_model_row(model, part))
    return table


def _model_row(model: str, part: ModelAudit) -> list[RenderableType]:
    """One model of a class's mix: its own requests against the class's targets."""
    attainment = part.attainment
    return [
        Text(f"  └ {model}", style="dim"),
        f"{part.requests:,}",
        Text(f"{part.failed:,}", style="red" if part.failed else ""),
        f"{fmt_ms(part.ttft_ms.p50)}/{fmt_ms(part.ttft_ms.p99)}",
        "",
        f"{fmt_ms(part.tpot_ms.p50)}/{fmt_ms(part.tpot_ms.p99)}",
        fmt_ms(part.itl_ms.p99),
        fmt_ms(part.e2e_ms.p99),
        f"{attainment * 100:.1f}%" if attainment is not None else "—",
        _rate(part.goodput.requests_per_s),
        _model_verdict(part),
    ]


def _model_verdict(part: ModelAudit) -> Text:
    """A model's verdict against its class's targets (MET, MISSED, INCONCLUSIVE, partial)."""
    if part.met is None or part.verdict is None:
        return Text(_met_text(part.met), style=_met_style(part.met))
    return Text(part.verdict.upper(), style=VERDICT_STYLE[part.verdict].removeprefix("bold "))


def _class_row(name: str, cls: ClassAudit) -> list[RenderableType]:
    attainment = cls.slo.attainment
    failed = sum(n for k, n in cls.outcomes.items() if k != "ok")
    return [
        name,
        f"{cls.requests:,}",
        Text(f"{failed:,}", style="red" if failed else ""),
        f"{fmt_ms(cls.ttft_ms.p50)}/{fmt_ms(cls.ttft_ms.p99)}",
        _with_failures(cls.ttft_ms_with_failures, judged=cls.slo.met is not None),
        f"{fmt_ms(cls.tpot_ms.p50)}/{fmt_ms(cls.tpot_ms.p99)}",
        fmt_ms(cls.itl_ms.p99),
        fmt_ms(cls.e2e_ms.p99),
        f"{attainment * 100:.1f}%" if attainment is not None else "—",
        _rate(cls.goodput.requests_per_s),
        _verdict_cell(cls.slo),
    ]


def fmt_ms(value: float | None) -> str:
    """A latency in a table's ms column: ms whatever its size (a column never switches
    unit), 3-4 significant figures, thousands separated ("12,345"); "—" when missing."""
    return fmt_in(value, "ms")


def with_unit(value: float | None, unit: str | None = None) -> str:
    """A latency with its unit, for a line of text: "412 ms", from 10 s up "24.0 s"; with
    `unit` ("ms" or "s") always in that unit: "20,000 ms", "0.412 s"."""
    if value is None:
        return "—"
    if unit is None:
        unit = "s" if value >= 10_000 else "ms"
    return f"{fmt_in(value, unit)} {unit}"


def fmt_in(value: float | None, unit: str) -> str:
    """A latency given in ms, shown in `unit` ("ms" or "s") with 3-4 significant figures."""
    if value is None:
        return "—"
    shown = value / 1000 if unit == "s" else value
    if shown >= 100:
        return f"{shown:,.0f}"
    if shown >= 10:
        return f"{shown:.1f}"
    return f"{shown:.2f}" if unit == "ms" or shown >= 1 else f"{shown:.3g}"


def fmt_num(value: float, decimals: int, *, sign: bool = False, percent: bool = False) -> str:
    """A number with thousands separators and `decimals` decimals (`sign`: always signed;
    `percent`: a share as `12.5%`), never a negative zero: -0.004 is `0.00`, not `-0.00`."""
    shown = value * 100 if percent else value
    rounded = round(shown, decimals) or 0.0  # -0.0 is falsy: a rounded-away minus is dropped
    return f"{rounded:{'+' if sign else ''},.{decimals}f}" + ("%" if percent else "")


def _with_failures(stats: FailureRankedStats, *, judged: bool = True) -> Text:
    """The p99 with failures worst: "fail" in red when it falls on a failure (yellow in a
    run that stopped early, which judges nothing: a figure, not a verdict)."""
    if stats.count == 0:
        return Text("—")
    if stats.p99 is None:
        return Text("fail", style="bold red" if judged else "yellow")
    return Text(fmt_ms(stats.p99))


def _rate(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


VERDICT_STYLE = {"met": "bold green", "missed": "bold red", "inconclusive": "bold yellow"}


def _verdict_cell(slo: SloAudit) -> Text:
    """MET / MISSED / INCONCLUSIVE with the checks that were not met named / "no SLO" for a
    class without targets / "partial" in a run that stopped before its end (`met` is null:
    nothing was judged)."""
    judged = slo.judged
    if judged is None:
        return Text("partial", style="bold yellow")
    word = judged.upper()
    if slo.judged_by:  # a batch or trajectory objective, shown on its own line below the table
        return Text(f"{word}\n({slo.judged_by})", style=VERDICT_STYLE[judged])
    if not slo.checks:
        return Text("no SLO", style="dim")
    if judged == "met":
        return Text("MET", style=VERDICT_STYLE[judged])
    named = [c.metric.removesuffix("_ms") for c in slo.checks if c.judged == judged]
    return Text(f"{word}\n{','.join(named)}", style=VERDICT_STYLE[judged])


def _notes(classes: Mapping[str, ClassAudit], *, partial: bool = False) -> list[RenderableType]:
    """Per class: failures by kind, then each failed check against its target (not for
    partial figures: their checks judge nothing)."""
    lines: list[RenderableType] = []
    for name, cls in classes.items():
        kinds = [f"{n:,} {k}" for k, n in cls.outcomes.items() if k != "ok" and n]
        if kinds:
            lines.append(Text(f"  {name} failures: {', '.join(kinds)}", style="yellow"))
        lines.extend(_objective_lines(name, cls))
        lines.extend(Text(f"  {name}: {note}", style="yellow") for note in stream_notes(cls))
        lines.extend(Text(f"  {name}: {note}", style=style) for note, style in delivery_notes(cls))
        lines.extend(_reasoning_and_server_lines(name, cls))
        if partial:
            continue
        checks = [check_line(name, c) for c in cls.slo.checks]
        if cls.slo.judged_by:  # percentiles are diagnostic for batches and agents
            for line in checks:
                line.stylize("dim")
                line.append(" (diagnostic)")
        for check, line in zip(cls.slo.checks, checks, strict=True):
            lines.extend([line, *_ttft_split_lines(name, cls, check)])
    return lines


def _ttft_split_lines(name: str, cls: ClassAudit, check: Check) -> list[Text]:
    """Under a missed TTFT check, where TTFT went, if the server said (`split_view`)."""
    point = missed_point(cls.ttft_split)
    if check.metric != TTFT.column or check.judged != "missed" or point is None:
        return []
    return [Text(f"  {name} {split_sentence(cls.ttft_split, point)}", style="yellow")]


def stream_notes(cls: ClassAudit) -> list[str]:
    """What a reader must know about N and stream ends: N counted (not the server's usage),
    requests that stopped before their forced length (not like for like), usage that
    disagrees with the stream, and usage that could not be taken."""
    ends, notes = cls.stream_ends, []
    total = sum(ends.n_from.values())
    if ends.n_counted:
        counted = [f"{ends.n_from[s]} from {s}" for s in ("chunks", "text") if ends.n_from.get(s)]
        share = ends.n_from_usage_share or 0.0
        notes.append(
            f"N counted by loadgen ({', '.join(counted)} of {total}; {share:.0%} from usage): "
            "N from chunks may differ from the server's count, and TPOT with it"
        )
    if ends.stopped_early:
        notes.append(
            f"{ends.stopped_early} ok requests stopped early (a stop reason before the forced "
            "length): their TPOT and goodput are not like for like"
        )
    if ends.usage_disagrees:
        over, under = ends.usage_over_counted, ends.usage_disagrees - ends.usage_over_counted
        beyond = (f" ({ends.usage_not_taken} more than their stream's bytes could carry: N "
                  "counted from the stream)" if ends.usage_not_taken else "")  # fmt: skip
        notes.append(
            f"usage disagrees with the tokens that arrived in {ends.usage_disagrees} requests "
            f"({over} claimed more: chunks carrying several tokens, hidden reasoning, or a "
            f"gateway's own count; {under} fewer than the chunks): N is the server's{beyond}, "
            "records keep both (usage_output_tokens, counted_output_tokens)"
        )
    if ends.usage_problems:
        notes.append(
            f"{ends.usage_problems} requests sent usage no count can be (negative, not an "
            "integer, beyond what the stream held): not taken, each a stream_error "
            "(records: usage_problem)"
        )
    if ends.itl_summarised:
        notes.append(
            f"{ends.itl_summarised} requests streamed more output chunks than the stamps a "
            "request keeps: ITL percentiles count their stamped gaps, their largest ITL the "
            "largest of the rest; N, TPOT and E2E count every chunk (records: "
            "unstamped_chunks)"
        )
    return notes


# Events per read (or tokens per event) from which a class's delivery is shown when no stream
# was coalesced: events shared reads (a server writing several at once, a late reader), or
# carried several tokens (the server's own chunking).
SHOWN_EVENTS_PER_READ = 1.5


def delivery_notes(cls: ClassAudit) -> list[tuple[str, str]]:
    """How a class's output arrived, with its style: streams that arrived coalesced (their
    share of streams and tokens, and how their TPOT/ITL were judged), else the figures when
    events shared reads or carried several tokens noticeably (the server's own chunking);
    nothing for a stream read one token an event, an event a read."""
    d = cls.delivery
    if d.events_per_read is None:
        return []
    shared = d.events_per_read >= SHOWN_EVENTS_PER_READ
    chunked = (d.tokens_per_event or 0.0) >= SHOWN_EVENTS_PER_READ
    if not (d.coalesced or shared or chunked):
        return []
    figures = (
        f"{d.events_per_read:,.1f} events per network read (up to "
        f"{d.events_per_read_max or 0:,.1f} in a stream), {_per(d.tokens_per_event)} tokens "
        "per event"
    )
    if not d.coalesced and not shared:
        return [(
            f"delivery: {figures}: the server's own chunking (several tokens an event, as "
            "vLLM's --stream-interval makes them), read one event at a time: paced as "
            "observed, ITL per event", "dim",
        )]  # fmt: skip
    if not d.coalesced:
        return [(
            f"delivery: {figures}: events shared reads (the server writing several at once, "
            f"or a late reader), but no stream had half its reads at {d.coalesced_at_events}+ "
            "events: paced as observed", "dim",
        )]  # fmt: skip
    judged = (
        "judged as observed, as target.path_buffers says the path buffers"
        if d.path_buffers
        else "not the server's pace: the TPOT/ITL checks take them as unknown "
        "(target.path_buffers: true or --path-buffers judges them as observed)"
    )
    return [(
        f"COALESCED: {d.coalesced:,} of {d.streams:,} streams ({_share(d.coalesced_share)} of "
        f"them, {_share(d.coalesced_token_share)} of output tokens) arrived in reads of "
        f"{d.coalesced_at_events}+ events: {figures}; held back between the server and "
        f"loadgen (a buffering proxy or gateway, compression) or written in bursts by the "
        f"server; their TPOT and ITL are {judged}", "yellow" if d.path_buffers else "bold yellow",
    )]  # fmt: skip


def _per(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _reasoning_and_server_lines(name: str, cls: ClassAudit) -> list[Text]:
    """TTFVT beside TTFT when reasoning streamed; the server's own timings when it sent any."""
    lines = []
    visible = cls.ttfvt_ms
    if cls.reasoning_requests and visible.count:
        lines.append(Text(
            f"  {name}: reasoning streamed in {cls.reasoning_requests:,} requests; time to "
            f"first visible token p50/p99 {fmt_ms(visible.p50)}/{fmt_ms(visible.p99)} ms "
            "(TTFT counts the first reasoning token)"
        ))  # fmt: skip
    server = cls.server_timings_ms
    if server.requests:
        parts = [f"{key.removesuffix('_ms')} p50 {fmt_ms(stats.p50)}"
                 for key, stats in server.measured().items()]  # fmt: skip
        lines.append(Text(
            f"  {name}: server-reported timings (ms, {server.requests:,} responses): "
            + ", ".join(parts), style="dim"
        ))  # fmt: skip
    return lines


def _objective_lines(name: str, cls: ClassAudit) -> list[RenderableType]:
    """The batch, trajectory or session block of a class, one line each."""
    lines: list[RenderableType] = []
    if batch := cls.batch:
        deadline = f" (deadline {batch.deadline_s:g} s)" if batch.deadline_s else ""
        took = batch.completion_time_s
        lines.append(Text(
            f"  {name} batch: {batch.ok:,}/{batch.documents:,} documents ok in "
            f"{'-' if took is None else f'{took:,.1f}'} s{deadline} · "
            f"{_rate(batch.input_tokens_per_s)} input tok/s · "
            f"{_rate(batch.output_tokens_per_s)} output tok/s · {_met_text(batch.met)}",
            style=_met_style(batch.met),
        ))  # fmt: skip
    trajectory = cls.trajectory
    if trajectory and trajectory.trajectories:
        split = trajectory.time_split_s
        budget = f" within {trajectory.budget_s:g} s" if trajectory.budget_s else ""
        lines.append(Text(
            f"  {name} trajectories: {trajectory.ok:,}/{trajectory.trajectories:,} ok{budget} "
            f"({trajectory.attainment:.1%}{_share_bounds(trajectory)}, target "
            f"{trajectory.target_attainment:.0%}) · "
            f"{trajectory.failed_hops} failed, {trajectory.skipped_hops} skipped hops · "
            f"time in ttft {split.ttft:,.1f} s, decode {split.decode:,.1f} s, "
            f"tools {split.tool:,.1f} s",
            style=_judged_style(trajectory.verdict, trajectory.met),
        ))  # fmt: skip
    if trajectory and trajectory.per_hop:
        lines.append(Text(f"  {name} per hop (context tokens sent · TTFT p50 ms): " + ", ".join(
            f"{hop}: {_tokens(h.prompt_tokens_mean)} · {fmt_ms(h.ttft_ms.p50)}"
            for hop, h in trajectory.per_hop.items()
        )))  # fmt: skip
    if sessions := cls.sessions:
        lines.append(Text(
            f"  {name} sessions: {sessions.sessions:,} ({sessions.completed:,} with every "
            f"turn ok), {sessions.turns:,} turns",
        ))  # fmt: skip
    return lines


def _share_bounds(trajectory: TrajectoryAudit) -> str:
    """`, bounds 74.1%–100.0%`: a trajectory share's exact one-sided bounds, and the
    trajectories that would judge it when it is inconclusive for want of them."""
    low, high = trajectory.attainment_low, trajectory.attainment_high
    if low is None or high is None:
        return ""
    needed = f", needs {trajectory.needed:,} all ok" if trajectory.needed else ""
    return f", bounds {low:.1%}–{high:.1%}{needed}"


def _tokens(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _met_text(met: bool | None) -> str:
    return "partial" if met is None else ("MET" if met else "MISSED")


def _met_style(met: bool | None) -> str:
    return "yellow" if met is None else ("green" if met else "red")


def _judged_style(verdict: str | None, met: bool | None) -> str:
    """The colour of a verdict (of `met`, for summaries written before verdicts)."""
    if met is None or verdict is None:
        return _met_style(met)
    return VERDICT_STYLE[verdict].removeprefix("bold ")


def check_line(name: str, check: Check) -> Text:
    """One check with its interval: `chat TTFT p90 84.9 ms · 95 % bounds 61.2–84.9 ms ·
    target ≤ 1,000 ms · MET`; an open bound says how many requests would close it."""
    judged = check.judged
    style = VERDICT_STYLE[judged].removeprefix("bold ")
    if check.percentile is None:
        return Text(f"  {name}: {check.note} · {judged.upper()}", style=style)
    metric = check.metric.removesuffix("_ms").upper()
    value = "fail" if check.value_ms is None and check.population else with_unit(check.value_ms)
    parts = [f"  {name} {metric} p{check.percentile:g} {value}"]
    if check.confidence is not None:
        parts.append(f"{check.confidence:.0%} bounds {bounds_text(check)}")
    parts.append(f"target ≤ {with_unit(check.target_ms)}")
    parts.append(judged.upper())
    line = " · ".join(parts)
    if check.note and (judged == "missed" or (judged != "met" and check.needed is None)):
        line += f" ({check.note})"
    return Text(line, style=style)


def bounds_text(check: Check) -> str:
    """`61.2–84.9 ms`, `61.2 ms–open (needs 299 requests)`, `61.2 ms–failure`, `0.00
    ms–unknown` (a coalesced stream's): a check's one-sided bounds, an open one with the
    requests that would close it."""
    if check.population == 0:
        return "none (no values)"
    low = "open" if check.low_open else "failure" if check.low_ms is None else None
    high: str | None
    if check.high_open:
        high = "open" if check.needed is None else (
            f"open (needs {check.needed:,} requests)")  # fmt: skip
    elif check.high_ms is None:
        high = "unknown" if check.coalesced else "failure"  # a coalesced stream's, or a failure
    else:
        high = None
    if low is None and high is None:  # both numbers: one unit for the pair, the high one's
        unit = "s" if check.high_ms is not None and check.high_ms >= 10_000 else "ms"
        return f"{fmt_in(check.low_ms, unit)}–{with_unit(check.high_ms, unit)}"
    return f"{low or with_unit(check.low_ms)}–{high or with_unit(check.high_ms)}"


def _rates_text(generator: GeneratorHealth) -> str:
    """`rate 5.0 req/s asked, 6.5 req/s scheduled, 6.4 req/s achieved`: the rate asked for
    (when the workload has one), the sampled schedule's, and the achieved one, each with its
    unit. A workload that asked for no request rate (sessions, trajectories, a closed loop)
    says what it asked for, in its unit, apart from the request rates:
    `asked 1.0 sessions/s; requests 1.7 req/s scheduled, 1.7 req/s achieved`."""
    target, achieved = generator.target_rate_per_s, generator.achieved_rate_per_s
    rates = f"{_rate(target)} req/s scheduled, {_rate(achieved)} req/s achieved"
    if generator.requested_rate_per_s is None:
        asked = asked_text(generator)
        if asked is not None:
            return f"asked {asked}; requests {rates}"
        return f"rate {_rate(target)} req/s target, {_rate(achieved)} req/s achieved"
    return f"rate {_asked_rate(generator.requested_rate_per_s)} req/s asked, {rates}"


def _asked_rate(value: float) -> str:
    """A rate as the workload wrote it: `2.0`, `0.25` (not `0.2`), `0.333`."""
    return f"{value:.1f}" if round(value, 1) == value else f"{value:.3g}"


ASKED_UNIT_TEXT = {"requests": "req/s", "sessions": "sessions/s",
                   "trajectories": "trajectories/s"}  # fmt: skip


def asked_text(generator: GeneratorHealth) -> str | None:
    """What the workload asked for, each class in its own unit: `2.0 req/s`, `1.0
    sessions/s`, `chat 2.0 req/s + summarize closed loop of 8`; None when the summary does
    not say (written before loadgen recorded it)."""
    if generator.requested_rate_per_s is not None:
        return f"{_asked_rate(generator.requested_rate_per_s)} req/s"
    if not generator.asked:
        return None
    parts = {name: _asked_one(load) for name, load in generator.asked.items()}
    if len(parts) == 1:
        return next(iter(parts.values()))
    return " + ".join(f"{name} {part}" for name, part in parts.items())


def _asked_one(load: AskedLoad) -> str:
    if load.unit == "closed_loop":
        return f"closed loop of {load.concurrency}"
    if load.unit == "trace" or load.rate_per_s is None:
        return "a trace's times"
    return f"{_asked_rate(load.rate_per_s)} {ASKED_UNIT_TEXT.get(load.unit, load.unit + '/s')}"


def _generator_line(generator: GeneratorHealth) -> Text:
    lag = generator.lag_ms
    line = Text(
        f"generator: planned {generator.planned:,} · sent {generator.sent:,} · "
        f"recorded {generator.recorded:,} · retries {generator.retries:,} · "
        f"lag p99 {with_unit(lag.p99)}, max {with_unit(lag.max)}"
        + (" (charged to latency; the verdict holds without it)" if _stands(generator) else "")
        + " · "
        + _rates_text(generator)
    )
    if generator.chained_lag_ms.p99 is not None:
        line.append(f" · next-turn reaction p99 {with_unit(generator.chained_lag_ms.p99)}")
    if generator.client_errors:
        line.append(f"\nCLIENT ERRORS: {health_text(generator)}: the run is invalid",
                    style="bold red")  # fmt: skip
    elif generator.fell_behind:
        line.append(
            f"\nFELL BEHIND: {health_text(generator)}; these latencies cannot tell the "
            "server's part from the client's (rerun on a quieter or bigger machine, or with "
            "--workers)",
            style="bold red",
        )
    return line


def _stands(generator: GeneratorHealth) -> bool:
    """The generator-health rule judged the run and it stands (`analysis.health`)."""
    return generator.client is not None and not generator.fell_behind


def _connections_line(use: ConnectionUse) -> Text:
    """Requests by the connection they were written on, with each kind's TTFT p50."""
    kinds = (("warm", use.warm), ("reused", use.reused), ("new", use.new))
    shown = [
        f"{kind.requests:,} {name}"
        + (f" (TTFT p50 {with_unit(kind.ttft_ms.p50)})" if kind.requests else "")
        for name, kind in kinds
    ]
    return Text("connections: " + " · ".join(shown))


def _verdict_line(verdict: Verdict, stop: str | None) -> Text:
    if stop is not None:
        return Text(
            f"verdict: none: the run stopped before its end ({STOP_TEXT[stop]}); the figures "
            f"above are partial and judge nothing (exit {verdict.exit_code})",
            "bold yellow",
        )
    if verdict.fell_behind:
        return Text(f"verdict: GENERATOR FELL BEHIND (exit {verdict.exit_code})", "bold red")
    rule = " by point estimates (--verdict point)" if verdict.rule == "point" else ""
    if verdict.slo_met:
        return Text(f"verdict: SLO MET{rule} (exit {verdict.exit_code})", "bold green")
    if verdict.status == "inconclusive":
        return Text(
            f"verdict: SLO INCONCLUSIVE (exit {verdict.exit_code}): nothing missed, but not "
            "every SLO could be judged at its confidence (see the checks above)",
            "bold yellow",
        )
    return Text(f"verdict: SLO MISSED{rule} (exit {verdict.exit_code})", "bold red")


def render_processes(run_info: RunInfo) -> list[Text]:
    """One line per engine process of a multi-process run, and the shard line of a shard;
    nothing for a plain single-process run."""
    lines: list[Text] = []
    processes = run_info.workers.processes if run_info.workers else ()
    if len(processes) > 1:
        for p in processes:
            late = p.late_share
            who = f"worker {p.index}" if p.shard is None else f"shard {p.shard} worker {p.index}"
            lines.append(Text(
                f"{who}: pid {p.pid} · {p.records:,} records · lag p99 "
                f"{with_unit(p.lag_ms_p99)} · "
                + ("" if late is None else f"over --lag-bound-ms {late:.2%} · ")
                + "t0 skew "
                f"{'—' if p.t0_skew_us is None else f'{p.t0_skew_us:g} µs'}"
                + (f" · exit {p.exit_code}" if p.exit_code else ""),
                style="red" if p.fell_behind or p.exit_code else "",
            ))  # fmt: skip
    if shard := run_info.shard:
        skew = shard.t0_skew_ms
        lines.append(Text(
            f"shard {shard.index}/{shard.count}: agreed start {shard.start_at_utc} · "
            f"t0 anchor skew {'—' if skew is None else f'{skew:g} ms'}"
        ))  # fmt: skip
    return lines


def shard_lines(table: ShardTable) -> list[str]:
    """One line per shard (records, skew, whether it fell behind) and the spread."""
    lines = [
        f"shard {row.index}/{table.count}: {row.records:,} records · host {row.host} · "
        f"t0 skew {fmt_num(row.skew_ms, 3, sign=True)} ms · "
        f"reached t0 {row.reached_late_ms} ms late" + (" · FELL BEHIND" if row.fell_behind else "")
        for row in table.shards
    ]
    lines.append(
        f"shards: t0 anchors within {table.spread_ms:.3f} ms of each other, at most "
        f"{table.max_abs_skew_ms:.3f} ms from the agreed start"
    )
    return lines


SIM_NOTE = "the built-in simulator (no --url): these figures are the simulator's, not a server's"


def target_line(target: TargetInfo | None) -> Text | None:
    """`target: the built-in simulator (no --url): …`, said after every run against it
    (`-q` too), so a job that lost its --url cannot pass for a test of the server; None
    for a run against a URL (its table is the server's)."""
    if target is None or not target.builtin_sim:
        return None
    return Text(f"target: {SIM_NOTE}", style="bold yellow")


def recovery_line(run_dir: Path, done: Recovery) -> str:
    """What `report --recover` did: the records it kept and the plans it recorded, and how."""
    line = (
        f"recovered {run_dir}: planned {done.planned:,} · {done.kept:,} records kept from its "
        f"parts · {done.cancelled:,} cancelled (sent, no record survived) · {done.not_sent:,} "
        + ("not_sent; marked interrupted (stopped by the user: no verdict, exit 130)"
           if done.stopped == "interrupted"
           else "not_sent; marked incomplete (killed outright: no verdict, exit 5)")
    )  # fmt: skip
    for name, reason in done.skipped.items():
        line += (f"\n  skipped {name} (kept in {DAMAGED_DIR}/): {reason}; its plans are "
                 "counted above as the others without a record")  # fmt: skip
    return line
