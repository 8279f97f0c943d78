"""The run report's model: one run re-audited, with its windows, class details and figures.

`build_run_report` reads only run.json and the records (and the scraped
server_metrics.parquet, when the run has one): the summary is `analysis.audit`'s re-audit
(equal to the stored one unless `--slo` replaced targets), the windows
`windows.time_windows` (with the server's gauges averaged per window), each class's details
and figures (`figures`) come from the same frame.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from loadgen.analysis import metrics
from loadgen.analysis.audit import audit_run, run_joined_fields
from loadgen.analysis.server import server_timeline, window_gauges
from loadgen.analysis.slo import per_request
from loadgen.analysis.split import with_split
from loadgen.analysis.windows import (
    WindowError,
    default_window_s,
    schedule_end_ns,
    time_windows,
)
from loadgen.render.report.figures import (
    ClassView,
    chunks_by_tokens,
    class_figures,
    server_figure,
)
from loadgen.results.records import Outcome
from loadgen.results.runfolder import RecordedClass, RunInfo, read_run_info, read_server_metrics
from loadgen.results.summary import Summary
from loadgen.units import NS_PER_S
from loadgen.workload.spec import SloTargets

TOP_ERRORS = 10


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
class Rates:
    """Requests, output tokens and input (prompt) tokens per second of the run's duration."""

    requests: int
    requests_per_s: float | None
    output_tokens_per_s: float | None
    input_tokens_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """A class's throughput (its ok requests) and goodput (those that met every SLO), over
    the run's duration as goodput in summary.json is; input tokens are the server's reported
    prompt tokens, the planned count where it reported none (`input_planned` such requests)."""

    completed: Rates
    good: Rates
    input_planned: int


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
    throughput: Throughput | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """One run, re-audited: the summary, the windows frame and the figures (PNG bytes)."""

    run_info: RunInfo  # run.json as stored
    summary: Summary  # what summary.json holds
    windows: pl.DataFrame  # `windows.time_windows` of the run
    window_s: float  # as given, else `windows.default_window_s` of the run (`window_chosen`)
    step_s: float | None  # None: tumbling windows
    slos_overridden: tuple[str, ...]  # classes whose SLOs differ from run.json's
    classes: Mapping[str, ClassDetails]
    figures: Mapping[str, bytes]  # name -> PNG; the name is also the file stem in report.md
    captions: Mapping[str, str] = field(default_factory=dict)
    server_timeline: pl.DataFrame | None = None  # `analysis.server.server_timeline`, if scraped
    window_chosen: bool = False  # window_s was chosen by the run's length, not given
    schedule_end_s: float | None = None  # when the run's arrivals ended (`windows`)


def build_run_report(
    run_dir: Path,
    *,
    slos: Mapping[str, SloTargets] | None = None,
    window_s: float | None = None,
    sliding_step_s: float | None = None,
    rule: str | None = None,
) -> RunReport:
    """`audit_run`, plus the time windows, per-class details and figures, all from the records.

    `window_s` None: `windows.default_window_s` of the run's records. `rule` None: the
    verdict rule run.json recorded.
    Raises LoadgenError for a folder that is not a run, WindowError for a bad window/step.
    """
    info = read_run_info(run_dir)
    summary, frame, effective = audit_run(run_dir, slos=slos, rule=rule)
    recorded, slos_as_run = info.classes(), info.slos()
    overridden = tuple(n for n in effective if slos_as_run.get(n) != effective[n])
    chosen = window_s is None
    if window_s is None:
        window_s = default_window_s(frame)
        if sliding_step_s is not None and sliding_step_s > window_s:
            raise WindowError(
                f"window step {sliding_step_s:g} s is longer than the window chosen for this "
                f"run ({window_s:g} s): give --window too"
            )
    windows = time_windows(frame, slos=effective, window_s=window_s, step_s=sliding_step_s)
    schedule_end_s = schedule_end_ns(frame) / NS_PER_S if frame.height else None
    scraped = read_server_metrics(run_dir) if info.server_metrics is not None else None
    timeline = server_timeline(scraped) if scraped is not None and scraped.height else None
    if timeline is not None and timeline.width == 1:
        timeline = None  # an unknown server: no named figure to draw (its rows stay raw)
    if timeline is not None:
        spans = ["window_start_s", "window_end_s"]
        windows = windows.join(window_gauges(timeline, windows), on=spans, how="left")
    x_end_s = _time_axis_end_s(windows, timeline)
    rows = per_request(frame, slos=effective)
    if (joined := run_joined_fields(run_dir, frame)) is not None:  # the spans' split first
        rows = with_split(rows, joined)
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
            schedule_end_s=schedule_end_s,
            x_end_s=x_end_s,
            checks=summary.classes[name].slo.checks,
        )
        names = []
        for kind, (caption, png) in class_figures(view).items():
            names.append(f"{slugs[name]}-{kind}")
            figures[names[-1]] = png
            captions[names[-1]] = caption
        details[name] = _class_details(view, slugs[name], names, summary.duration_s)
    if timeline is not None:
        caption, png = server_figure(
            windows, timeline, step_s=sliding_step_s or window_s, schedule_end_s=schedule_end_s,
            x_end_s=x_end_s,
        )  # fmt: skip
        figures["server-timeline"], captions["server-timeline"] = png, caption
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
        server_timeline=timeline,
        window_chosen=chosen,
        schedule_end_s=schedule_end_s,
    )


def _time_axis_end_s(windows: pl.DataFrame, timeline: pl.DataFrame | None) -> float | None:
    """Where every timeline's time axis ends: the last window's end or the last scrape,
    whichever is later (None: nothing to draw)."""
    columns = [windows["window_end_s"]]
    if timeline is not None:
        columns.append(timeline["t_s"])
    ends = [float(c.cast(pl.Float64).max() or 0.0) for c in columns if len(c)]  # type: ignore[arg-type]
    return max(ends) if ends else None


def _class_details(
    view: ClassView, slug: str, figures: list[str], duration_s: float
) -> ClassDetails:
    return ClassDetails(
        name=view.name,
        slug=slug,
        prompt_tokens=_prompt_token_stats(view.frame),
        chunks_by_tokens=chunks_by_tokens(view.frame),
        top_errors=_top_errors(view.frame),
        figures=tuple(figures),
        throughput=throughput(view.frame, view.rows, duration_s),
    )


def throughput(frame: pl.DataFrame, rows: pl.DataFrame, duration_s: float) -> Throughput:
    """Per second of `duration_s`: ok requests and their output and input tokens, and the
    same for those that met every SLO (`rows`: `slo.per_request` of `frame`, row by row)."""
    both = pl.concat([rows.select("outcome", "output_tokens", "meets_slo"),
                      frame.select("prompt_tokens", "prompt_tokens_target")],
                     how="horizontal")  # fmt: skip
    ok = both.filter(pl.col("outcome") == Outcome.OK.value)

    def rates(part: pl.DataFrame) -> Rates:
        if duration_s <= 0:
            return Rates(requests=part.height, requests_per_s=None, output_tokens_per_s=None,
                         input_tokens_per_s=None)  # fmt: skip
        output = int(part.get_column("output_tokens").fill_null(0).sum())
        prompt = part.select(pl.coalesce("prompt_tokens", "prompt_tokens_target").fill_null(0))
        return Rates(requests=part.height, requests_per_s=part.height / duration_s,
                     output_tokens_per_s=output / duration_s,
                     input_tokens_per_s=int(prompt.to_series().sum()) / duration_s)  # fmt: skip

    planned = int(ok.get_column("prompt_tokens").is_null().sum())
    return Throughput(completed=rates(ok), good=rates(ok.filter(pl.col("meets_slo"))),
                      input_planned=planned)  # fmt: skip


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
