"""Run report: one run re-audited from its folder, rendered as HTML, Markdown and JSON.

Last stage of the pipeline. `build_run_report` reads only `run.json` and the records
(never the stored summary), recomputes the summary with `analysis.audit`, the time windows
with `windows.time_windows` and every figure from the same frame, so everything a report
shows is recomputable from the records. `write_run_report` writes `report.html` (one
self-contained file: inline CSS, PNGs as data URIs, no network loads; every string from the
records or the workload is HTML-escaped), `report.md` with the PNGs beside it, and
`summary.json`.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from loadgen import __version__
from loadgen.analysis import metrics
from loadgen.analysis.audit import audit_run
from loadgen.analysis.slo import per_request, stop_of
from loadgen.analysis.windows import time_windows
from loadgen.errors import LoadgenError
from loadgen.render import plots
from loadgen.render.terminal import STOP_TEXT, with_unit
from loadgen.results.records import Outcome
from loadgen.results.runfolder import (
    SUMMARY_FILE,
    RecordedClass,
    RunInfo,
    TargetInfo,
    read_run_info,
    write_summary,
)
from loadgen.results.summary import (
    BatchAudit,
    ClassAudit,
    FailureRankedStats,
    GeneratorHealth,
    LatencyStats,
    ServerTimings,
    SessionsAudit,
    SloAudit,
    Summary,
    TrajectoryAudit,
)
from loadgen.workload.spec import SloTargets

TOP_ERRORS = 10
ERROR_TEXT_CHARS = 300  # an error message longer than this is cut in the report (not the JSON)
Percentiles = LatencyStats | FailureRankedStats


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptTokens:
    """Planned vs server-reported prompt tokens, over the requests whose server reported them."""

    requests: int
    target_mean: float | None
    reported_mean: float | None
    mean_relative_diff: float | None  # mean of (reported - target) / target


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorCount:
    """How many failed requests share one (outcome, HTTP status, error message)."""

    count: int
    outcome: str
    http_status: int | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassDetails:
    """What a class's section shows beyond the summary, computed from its records.

    `prompt_tokens`: over requests whose server reported prompt tokens, the mean planned
    (target) and reported counts and the mean of (reported - target) / target.
    `chunks_by_tokens`: tokens carried per chunk -> number of chunks (ok requests).
    `top_errors`: the most frequent (outcome, http_status, error) of failed requests.
    `figures`: names (keys of `RunReport.figures`) of this class's figures, in order.
    """

    name: str
    slug: str
    prompt_tokens: PromptTokens
    chunks_by_tokens: Mapping[int, int]
    top_errors: Sequence[ErrorCount]
    figures: Sequence[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """One run, re-audited: the summary, the windows frame and the figures (PNG bytes)."""

    run_info: RunInfo  # run.json as stored
    summary: Summary  # what summary.json holds
    windows: pl.DataFrame  # `windows.time_windows` of the run
    window_s: float
    step_s: float | None  # None: tumbling windows
    slos_overridden: tuple[str, ...]  # classes whose SLOs differ from run.json's
    classes: Mapping[str, ClassDetails]
    figures: Mapping[str, bytes]  # name -> PNG; the name is also the file stem in report.md
    captions: Mapping[str, str] = field(default_factory=dict)


# --- reading a run folder ---------------------------------------------------------------


# --- building ---------------------------------------------------------------------------


def build_run_report(
    run_dir: Path,
    *,
    slos: Mapping[str, SloTargets] | None = None,
    window_s: float = 10.0,
    sliding_step_s: float | None = None,
) -> RunReport:
    """`audit_run`, plus the time windows, per-class details and figures, all from the records.

    Raises LoadgenError for a folder that is not a run, ValueError for a bad window/step.
    """
    info = read_run_info(run_dir)
    summary, frame, effective = audit_run(run_dir, slos=slos)
    recorded, slos_as_run = info.classes(), info.slos()
    overridden = tuple(n for n in effective if slos_as_run.get(n) != effective[n])
    windows = time_windows(frame, slos=effective, window_s=window_s, step_s=sliding_step_s)
    rows = per_request(frame, slos=effective)
    figures: dict[str, bytes] = {}
    captions: dict[str, str] = {}
    details: dict[str, ClassDetails] = {}
    slugs = _unique_slugs(summary.classes)
    for name in summary.classes:
        as_run = recorded.get(name, RecordedClass(name=name))
        view = ClassView(
            name=name,
            kind=as_run.kind,
            frame=frame.filter(pl.col("class") == name),
            rows=rows.filter(pl.col("class") == name),
            itl_ms=metrics.itl_gaps_ms(frame, name),
            windows=windows.filter(pl.col("class") == name),
            targets=effective.get(name, SloTargets()),
            step_s=sliding_step_s or window_s,
            budget_s=as_run.trajectory_budget_s,
            deadline_s=as_run.batch_deadline_s,
        )
        names = []
        for kind, (caption, png) in class_figures(view).items():
            names.append(f"{slugs[name]}-{kind}")
            figures[names[-1]] = png
            captions[names[-1]] = caption
        details[name] = _class_details(view, slugs[name], names)
    return RunReport(
        run_info=info,
        summary=summary,
        windows=windows,
        window_s=window_s,
        step_s=sliding_step_s,
        slos_overridden=overridden,
        classes=details,
        figures=figures,
        captions=captions,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassView:
    """One class's slice of a run, as the figures and details need it."""

    name: str
    kind: str  # the workload class kind (chat, summarization, agent); "chat" for old runs
    frame: pl.DataFrame  # its records
    rows: pl.DataFrame  # its `slo.per_request` rows
    itl_ms: pl.Series  # gaps of its ok requests, sorted
    windows: pl.DataFrame  # its `time_windows` rows
    targets: SloTargets
    step_s: float
    budget_s: float | None = None  # agent: the trajectory budget
    deadline_s: float | None = None  # summarization: the batch deadline


def class_figures(view: ClassView) -> dict[str, tuple[str, bytes]]:
    """A class's figures: kind -> (caption, PNG).

    Every kind gets the latency figures; agent classes add per-hop duration boxplots and
    summarization classes the batch's progress against its deadline.
    """
    figures = _latency_figures(view)
    if view.kind == "agent":
        figures["hop_durations"] = (f"{view.name}: duration by hop", _hop_figure(view))
    elif view.kind == "summarization":
        figures["batch_progress"] = (f"{view.name}: batch progress", _batch_figure(view))
    return figures


def _hop_figure(view: ClassView) -> bytes:
    ok = view.frame.filter(pl.col("outcome") == Outcome.OK.value)
    durations: dict[int, list[float]] = {}
    for (hop,), group in ok.group_by("turn", maintain_order=True):
        values = ((group["end_ns"] - group["intended_ns"]) / 1e6).to_list()
        durations[int(hop) if hop is not None else 0] = values
    return plots.hop_boxplot_png(durations, title=f"{view.name}: duration of each hop (ok hops)",
                                 budget_s=view.budget_s)  # fmt: skip


def _batch_figure(view: ClassView) -> bytes:
    frame = view.frame
    start = frame["intended_ns"].min() if frame.height else 0
    ok = frame.filter(pl.col("outcome") == Outcome.OK.value)
    ends = ((ok["end_ns"] - start) / 1e9).to_list() if ok.height else []
    title = f"{view.name}: documents completed over time"
    return plots.batch_progress_png(
        ends, documents=frame.height, deadline_s=view.deadline_s, title=title
    )


def _latency_figures(view: ClassView) -> dict[str, tuple[str, bytes]]:
    """TTFT/TPOT CDFs, the ITL histogram, tokens per chunk and the window timeline."""
    ok = view.rows.filter(pl.col("outcome") == Outcome.OK.value)
    failures = view.rows.height - ok.height
    p, name, targets = view.targets.percentile, view.name, view.targets
    mids = view.windows.select((pl.col("window_start_s") + pl.col("window_end_s")) / 2)
    return {
        "ttft_cdf": (
            f"{name}: TTFT CDF",
            plots.cdf_png(
                ok.get_column("ttft_ms").drop_nulls().to_numpy(),
                failures=failures,
                title=f"{name}: TTFT (intended send → first token)",
                metric="TTFT",
                target_ms=targets.ttft_ms,
                percentile=p,
            ),
        ),
        "tpot_cdf": (
            f"{name}: TPOT CDF",
            plots.cdf_png(
                ok.get_column("tpot_ms").drop_nulls().to_numpy(),
                failures=failures,
                title=f"{name}: TPOT (per request, N > 1)",
                metric="TPOT",
                target_ms=targets.tpot_ms,
                percentile=p,
            ),
        ),
        "itl_histogram": (
            f"{name}: ITL histogram",
            plots.itl_histogram_png(
                view.itl_ms.to_numpy(),
                title=f"{name}: inter-chunk gaps of ok requests",
                target_ms=targets.itl_ms,
            ),
        ),
        "tokens_per_chunk": (
            f"{name}: tokens per chunk",
            plots.tokens_per_chunk_png(
                _chunks_by_tokens(view.frame), title=f"{name}: tokens per chunk (ok requests)"
            ),
        ),
        "timeline": (
            f"{name}: per-window p99 and arrivals",
            plots.timeline_png(
                window_mid_s=mids.to_series().to_numpy(),
                step_s=view.step_s,
                p99_ms={
                    m: view.windows.get_column(f"{m}_p99_ms").to_list()
                    for m in plots.METRIC_COLOURS
                },
                targets_ms={
                    "ttft": targets.ttft_ms,
                    "tpot": targets.tpot_ms,
                    "itl": targets.itl_ms,
                },
                arrival_rate_per_s=view.windows.get_column("arrival_rate_per_s").to_list(),
                failed=view.windows.get_column("failed").to_list(),
                title=f"{name}: p99 per window, arrival rate and failures",
            ),
        ),
    }


def _class_details(view: ClassView, slug: str, figures: list[str]) -> ClassDetails:
    return ClassDetails(
        name=view.name,
        slug=slug,
        prompt_tokens=_prompt_token_stats(view.frame),
        chunks_by_tokens=_chunks_by_tokens(view.frame),
        top_errors=_top_errors(view.frame),
        figures=tuple(figures),
    )


def _prompt_token_stats(frame: pl.DataFrame) -> PromptTokens:
    """Planned vs server-reported prompt tokens over requests whose server reported them."""
    reported = frame.filter(pl.col("prompt_tokens").is_not_null())
    target, got = pl.col("prompt_tokens_target"), pl.col("prompt_tokens")
    row = reported.select(
        target.mean().alias("target_mean"),
        got.mean().alias("reported_mean"),
        pl.when(target > 0).then((got - target) / target).mean().alias("mean_relative_diff"),
    ).row(0, named=True)
    return PromptTokens(requests=reported.height, **row)


def _chunks_by_tokens(frame: pl.DataFrame) -> dict[int, int]:
    counts = (
        frame.filter(pl.col("outcome") == Outcome.OK.value)
        .select(pl.col("chunk_tokens").explode().drop_nulls().value_counts(sort=True))
        .unnest("chunk_tokens")
    )
    return {int(k): int(n) for k, n in counts.iter_rows()}


def _top_errors(frame: pl.DataFrame) -> list[ErrorCount]:
    failed = frame.filter(pl.col("outcome") != Outcome.OK.value)
    top = (
        failed.group_by("outcome", "http_status", "error")
        .len("count")
        .sort(["count", "outcome"], descending=[True, False])
        .head(TOP_ERRORS)
    )
    return [ErrorCount(**row) for row in top.iter_rows(named=True)]


def _unique_slugs(names: Iterable[str]) -> dict[str, str]:
    """A file-name-safe, unique stem per class name (`<script>` -> `script`)."""
    slugs: dict[str, str] = {}
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-_")[:40] or "class"
        slug, n = base, 1
        while slug in slugs.values():
            n += 1
            slug = f"{base}-{n}"
        slugs[name] = slug
    return slugs


# --- the document: blocks both renderers share ------------------------------------------


@dataclass(frozen=True, slots=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True, slots=True)
class Para:
    text: str
    tone: str = ""  # "", "warn" or "bad": a banner


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    caption: str


@dataclass(frozen=True, slots=True)
class Details:
    summary: str
    blocks: Sequence[Block]
    is_open: bool


Block = Heading | Para | Table | Figure | Details


def document(report: RunReport) -> list[Block]:
    """The report's content, in order, as plain-text blocks (escaped by each renderer)."""
    summary, info = report.summary, report.run_info
    blocks: list[Block] = [Heading(1, f"loadgen report · {summary.run_id}")]
    blocks.extend(_banners(report))
    blocks.append(_run_table(report))
    blocks.append(_generator_table(summary.generator))
    blocks.append(_classes_table(summary.classes))
    for name, cls in summary.classes.items():
        blocks.extend(_class_blocks(name, cls, report))
    mode = f"sliding, step {report.step_s:g} s" if report.step_s else "tumbling"
    blocks.append(
        Para(
            f"Re-audited by loadgen {__version__} from records.parquet and run.json "
            f"(run written by loadgen {info.loadgen_version or '?'}). Latencies are "
            "measured from the intended send time; percentiles are nearest rank; "
            "'failures worst' ranks every failed request as +∞ and shows 'fail' where a "
            f"percentile falls on one. Windows: {report.window_s:g} s, {mode}, requests by "
            "intended time, ITL gaps by the time the gap ends."
        )
    )
    return blocks


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
    if not report.run_info.finished:
        banners.append(Para("The run never finished: these are the records its parts kept.", "bad"))
    if generator.fell_behind:
        banners.append(
            Para(
                f"GENERATOR FELL BEHIND: send lag p99 {with_unit(generator.lag_ms.p99)} "
                f"> bound {generator.lag_bound_ms:g} ms. These latencies describe the load "
                "generator, not the server.",
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
    else:
        word = "SLO MET" if verdict.slo_met else "SLO MISSED"
    tone = "" if verdict.exit_code == 0 else "bad"
    banners.append(Para(f"Verdict: {word} (exit {verdict.exit_code})", tone or "good"))
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
            f"planned {generator.planned} · sent {generator.sent} · recorded {generator.recorded}",
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
    lag, send = generator.lag_ms, generator.send_lag_ms
    health = "FELL BEHIND" if generator.fell_behind else "OK"
    rows = [
        ("health", f"{health} (late: over {generator.lag_bound_ms:g} ms; fails at > 1 %)"),
        ("start lag p50 / p99 / max", " / ".join(map(with_unit, (lag.p50, lag.p99, lag.max)))),
        ("send lag p50 / p99 / max", " / ".join(map(with_unit, (send.p50, send.p99, send.max)))),
        (
            "rate target / achieved",
            f"{_num(generator.target_rate_per_s, ' req/s')} / "
            f"{_num(generator.achieved_rate_per_s, ' req/s')}",
        ),
        ("retries", str(generator.retries)),
    ]
    return Table("Generator health", ("", ""), rows)


def _classes_table(classes: Mapping[str, ClassAudit]) -> Table:
    rows = [
        (name, str(cls.requests), str(cls.failed), _pct(cls.slo.attainment),
         _num(cls.goodput.requests_per_s, " req/s"), _verdict(cls.slo))
        for name, cls in classes.items()
    ]  # fmt: skip
    return Table("Classes", ("class", "requests", "failed", "attainment", "goodput", "SLO"), rows)


def _class_blocks(name: str, cls: ClassAudit, report: RunReport) -> list[Block]:
    details = report.classes[name]
    slo, goodput = cls.slo, cls.goodput
    blocks: list[Block] = [
        Heading(2, f"Class {name}: {_verdict(slo)}"),
        *_objective_tables(cls),
        _checks_table(slo),
        Para(
            f"Attainment {_pct(slo.attainment)} of {cls.requests} requests met every "
            f"threshold of the class. Goodput {_num(goodput.requests_per_s, ' req/s')}, "
            f"{_num(goodput.output_tokens_per_s, ' output tokens/s')}."
        ),
        _outcomes_table(cls),
        _percentile_table(cls),
        _tokens_table(cls, details),
    ]
    if cls.server_timings_ms.requests:
        blocks.append(_server_table(cls.server_timings_ms, cls))
    if details.top_errors:
        blocks.append(_errors_table(details.top_errors))
    blocks.extend(Figure(f, report.captions.get(f, f)) for f in details.figures)
    windows = report.windows.filter(pl.col("class") == name)
    table = _windows_table(windows)
    blocks.append(Details(f"{name}: {windows.height} windows", [table], windows.height <= 30))
    return blocks


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
        ("documents ok", f"{batch.ok} / {batch.documents}"),
        ("completion time", _num(batch.completion_time_s, " s")),
        ("deadline", "none" if deadline is None else _num(deadline, " s")),
        ("input tokens/s", _num(batch.input_tokens_per_s)),
        ("output tokens/s", _num(batch.output_tokens_per_s)),
        ("verdict", _met_word(batch.met)),
    ])  # fmt: skip


def _trajectory_tables(trajectory: TrajectoryAudit) -> list[Block]:
    split, duration = trajectory.time_split_s, trajectory.duration_s
    summary = Table("Trajectories (judge this class; latency checks below are diagnostic)",
                    ("measure", "value"), [
        ("trajectories ok", f"{trajectory.ok} / {trajectory.trajectories}"),
        ("attainment / target", f"{_pct(trajectory.attainment)} / "
                                f"{_pct(trajectory.target_attainment)}"),
        ("budget", _num(trajectory.budget_s, " s")),
        ("failed / skipped hops", f"{trajectory.failed_hops} / {trajectory.skipped_hops}"),
        ("duration p50 / p99", f"{_num(duration.p50, ' s')} / {_num(duration.p99, ' s')}"),
        ("time in TTFT / decode / tools",
         f"{split.ttft} s / {split.decode} s / {split.tool} s"),
    ])  # fmt: skip
    hops = Table("Per-hop duration (intended send → end, ok hops)",
                 ("hop", "p50", "p90", "p99", "n"), [
        (hop, _num(v.p50, " ms"), _num(v.p90, " ms"), _num(v.p99, " ms"), str(v.count))
        for hop, v in trajectory.per_hop_ms.items()
    ])  # fmt: skip
    return [summary, hops]


def _sessions_table(sessions: SessionsAudit) -> Table:
    return Table("Sessions", ("measure", "value"), [
        ("sessions", str(sessions.sessions)),
        ("with every turn ok", str(sessions.completed)),
        ("turns", str(sessions.turns)),
    ])  # fmt: skip


def _checks_table(slo: SloAudit) -> Table:
    rows = []
    for check in slo.checks:
        p, value = check.percentile, check.value_ms
        shown = with_unit(value) if value is not None or check.population == 0 else "fail"
        rows.append(
            (
                check.metric.removesuffix("_ms").upper(),
                f"p{p:g}" if p is not None else "—",
                shown,
                f"≤ {with_unit(check.target_ms)}" if check.target_ms is not None else "—",
                str(check.population),
                "PASS" if check.passed else "FAIL",
                check.note or "",
            )
        )
    if not rows:
        rows.append(("—", "—", "—", "no targets", "—", "—", "nothing was promised"))
    headers = ("check", "percentile", "value", "target", "population", "result", "note")
    if slo.met is None:  # a run that stopped early: the checks' figures are partial
        return Table("SLO checks on partial figures (failures ranked worst; judge nothing)",
                     headers, rows)  # fmt: skip
    return Table("SLO checks (failures ranked worst)", headers, rows)


def _outcomes_table(cls: ClassAudit) -> Table:
    total = cls.requests
    rows = [
        (outcome, str(n), _pct(n / total if total else None))
        for outcome, n in cls.outcomes.items()
        if n or outcome == Outcome.OK.value
    ]
    return Table("Outcomes", ("outcome", "requests", "share"), rows)


def _percentile_rows(cls: ClassAudit) -> list[tuple[str, Percentiles, float | None]]:
    """(label, stats, SLO target) per measure; TTFVT only where reasoning streamed."""
    t = cls.slo.targets
    rows: list[tuple[str, Percentiles, float | None]] = [
        ("TTFT", cls.ttft_ms, t.ttft_ms),
        ("TTFT, failures worst", cls.ttft_ms_with_failures, t.ttft_ms),
        ("TTFT from send", cls.ttft_from_send_ms, None),
        ("TPOT", cls.tpot_ms, t.tpot_ms),
        ("TPOT, failures worst", cls.tpot_ms_with_failures, t.tpot_ms),
        ("ITL (per gap)", cls.itl_ms, t.itl_ms),
        ("E2E", cls.e2e_ms, t.e2e_ms),
        ("E2E, failures worst", cls.e2e_ms_with_failures, t.e2e_ms),
    ]
    if cls.reasoning_requests:  # reasoning streamed: the visible answer came later
        label = f"TTFVT (first visible token; {cls.reasoning_requests} with reasoning)"
        rows.insert(3, (label, cls.ttfvt_ms, None))
    return rows


def _percentile_table(cls: ClassAudit) -> Table:
    p = cls.slo.targets.percentile
    rows = []
    for label, stats, target in _percentile_rows(cls):
        missing = "fail" if stats.count else "—"
        points = (stats.p50, stats.p90, stats.p95, stats.p99, stats.max)
        cells = [with_unit(v) if v is not None else missing for v in points]
        target_text = f"≤ {with_unit(target)} at p{p:g}" if target is not None else ""
        rows.append((label, str(stats.count), *cells, target_text))
    headers = ("measure", "n", "p50", "p90", "p95", "p99", "max", "SLO target")
    return Table("Latency percentiles (ok requests unless 'failures worst')", headers, rows)


SERVER_LABELS = {
    "queue_ms": "server queue",
    "load_ms": "server model load",
    "prefill_ms": "server prefill (prompt eval)",
    "decode_ms": "server decode (eval)",
    "total_ms": "server total",
}


def _server_table(server: ServerTimings, cls: ClassAudit) -> Table:
    """What the server reported about its own work, beside the client's TTFT and E2E."""
    measured = [(SERVER_LABELS[name], stats) for name, stats in server.measured().items()]
    client = [("client TTFT from send", cls.ttft_from_send_ms), ("client E2E", cls.e2e_ms)]
    rows = []
    for label, stats in [*measured, *client]:
        cells = [with_unit(v) if v is not None else "—"
                 for v in (stats.p50, stats.p90, stats.p99, stats.max)]  # fmt: skip
        rows.append((label, str(stats.count), *cells))
    title = f"Server-reported timings ({server.requests} ok requests), beside the client's own"
    return Table(title, ("measure", "n", "p50", "p90", "p99", "max"), rows)


def _tokens_table(cls: ClassAudit, details: ClassDetails) -> Table:
    out, chunking, prompt = cls.output_tokens, cls.tokens_per_chunk, details.prompt_tokens
    diff = prompt.mean_relative_diff
    rows = [
        (
            "output tokens (ok) mean / p50 / max / total",
            f"{_num(out.mean)} / {_num(out.p50)} / {_num(out.max)} / {_num(out.total)}",
        ),
        (
            "prompt tokens planned vs server-reported (mean)",
            f"{_num(prompt.target_mean)} vs {_num(prompt.reported_mean)} "
            f"over {prompt.requests} requests with usage",
        ),
        ("prompt tokens mean relative difference", f"{diff:+.2%}" if diff is not None else "—"),
        ("tokens per chunk mean / max", f"{_num(chunking.mean)} / {_num(chunking.max)}"),
    ]
    if chunking.mean is not None and chunking.mean > 1:
        rows.append(("note", "chunks carry several tokens: ITL figures are per chunk"))
    return Table("Tokens", ("", ""), rows)


def _errors_table(errors: Sequence[ErrorCount]) -> Table:
    rows = []
    for e in errors:
        message = e.error or "(no message)"
        if len(message) > ERROR_TEXT_CHARS:
            message = message[:ERROR_TEXT_CHARS] + "…"
        status = str(e.http_status) if e.http_status is not None else "—"
        rows.append((str(e.count), e.outcome, status, message))
    return Table("Top errors", ("count", "outcome", "HTTP", "message"), rows)


def _windows_table(windows: pl.DataFrame) -> Table:
    rows = []
    for w in windows.iter_rows(named=True):
        rows.append(
            (
                f"{w['window_start_s']:g}–{w['window_end_s']:g} s",
                str(w["requests"]),
                f"{w['arrival_rate_per_s']:.2f}",
                str(w["in_flight"]),
                str(w["ok"]),
                str(w["failed"]),
                _pct(w["attainment"]),
                *(with_unit(w[c]) for c in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")),
                *(with_unit(w[c]) for c in ("tpot_p99_ms", "itl_p50_ms", "itl_p99_ms")),
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
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "ITL p50",
        "ITL p99",
    )
    return Table("Time windows (ok requests' percentiles)", headers, rows)


def _verdict(slo: SloAudit) -> str:
    if not slo.checks and slo.met is not None:
        return "no SLO"
    return _met_word(slo.met)


def _met_word(met: bool | None) -> str:
    """MET / MISSED; "partial" where nothing was judged (a run that stopped early)."""
    return "partial" if met is None else ("MET" if met else "MISSED")


def _pct(value: float | None) -> str:
    return f"{value * 100:.1f}%" if value is not None else "—"


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}{unit}"
    return f"{value:,.2f}{unit}" if abs(value) < 1000 else f"{value:,.0f}{unit}"


# --- rendering ----------------------------------------------------------------------------

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
"""
_CELL_TONE = {"MET": "good", "PASS": "good", "MISSED": "bad", "FAIL": "bad", "fail": "bad"}


def render_html(report: RunReport) -> str:
    """One self-contained HTML page: inline CSS, PNGs as data URIs, every text escaped."""
    e = html.escape
    body = "\n".join(_html_block(b, report) for b in document(report))
    title = e(f"loadgen report · {report.summary.run_id}")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _html_block(block: Block, report: RunReport) -> str:
    e = html.escape
    if isinstance(block, Heading):
        return f"<h{block.level}>{e(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        tone = f' class="banner {block.tone}"' if block.tone else ""
        return f"<p{tone}>{e(block.text)}</p>"
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Figure):
        data = base64.b64encode(report.figures[block.name]).decode("ascii")
        return (
            f'<figure><img alt="{e(block.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(block.caption)}</figcaption></figure>"
        )
    inner = "\n".join(_html_block(b, report) for b in block.blocks)
    is_open = " open" if block.is_open else ""
    return f"<details{is_open}><summary>{e(block.summary)}</summary>\n{inner}\n</details>"


def _html_table(table: Table) -> str:
    e = html.escape

    def cell(tag: str, text: str) -> str:
        tone = _CELL_TONE.get(text)
        return f'<{tag} class="{tone}">{e(text)}</{tag}>' if tone else f"<{tag}>{e(text)}</{tag}>"

    head = "".join(cell("th", h) for h in table.headers) if any(table.headers) else ""
    rows = "\n".join("<tr>" + "".join(cell("td", c) for c in row) + "</tr>" for row in table.rows)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<h3>{e(table.title)}</h3>\n<table>{thead}<tbody>\n{rows}\n</tbody></table>"


def render_markdown(report: RunReport) -> str:
    """Markdown: the same blocks; figures link to `<name>.png` beside the file."""
    return "\n\n".join(_md_block(b) for b in document(report)) + "\n"


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
    """Text safe in a Markdown table cell: HTML-escaped, pipes escaped, on one line."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ").replace("\r", " ")


# --- writing ------------------------------------------------------------------------------


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
