"""The server's side of a run: its scraped `/metrics` as loadgen's named figures.

Pure functions of `server_metrics.parquet` (rows `t_ns, name, labels, value`). Each known
server's metric names map onto one set of figures, so a report reads "queue depth" whatever
served the run. Checked against each server's source or docs:

The mapping is `FIGURES` below (docs/server-metrics.md shows it whole).

Sources: vLLM vllm/v1/metrics/loggers.py and docs.vllm.ai/en/latest/usage/metrics.html;
SGLang python/sglang/srt/metrics/collector.py and docs/references/production_metrics.md;
TGI docs/source/reference/metrics.md; llama.cpp tools/server/server.cpp (`/metrics`, with
`--metrics`) and tools/server/README.md.

llama.cpp's `prompt_tokens_total` counts only the prompt tokens it evaluated (its
`prompt_tokens_cached_total` the ones it reused): its hit share is cached / (cached +
evaluated). The simulator's prompt counter includes its cached tokens.

Several series of one name (labels: engine, model, method) are summed for counts and
averaged for ratios. A counter's change is reset-aware: a drop counts as a restart from 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from loadgen.percentiles import nearest_rank
from loadgen.results.runfolder import SERVER_METRICS_SCHEMA, ServerMetricsInfo
from loadgen.results.summary import (
    GaugeStats,
    ScrapeAccess,
    ServerAudit,
    ServerHistogram,
    Summary,
)


@dataclass(frozen=True, slots=True)
class Figure:
    """One named figure: its kind, how series of it combine, its names by server."""

    kind: str  # gauge | counter | histogram
    names: Mapping[str, tuple[str, ...]]  # server family -> metric names, preferred first
    combine: str = "sum"  # gauges: sum (counts) or mean (ratios)


FIGURES: dict[str, Figure] = {
    "queue_depth": Figure("gauge", {
        "vllm": ("vllm:num_requests_waiting",), "sglang": ("sglang:num_queue_reqs",),
        "tgi": ("tgi_queue_size",), "llama.cpp": ("llamacpp:requests_deferred",)}),
    "running": Figure("gauge", {
        "vllm": ("vllm:num_requests_running",), "sglang": ("sglang:num_running_reqs",),
        "tgi": ("tgi_batch_current_size",), "llama.cpp": ("llamacpp:requests_processing",)}),
    "kv_usage": Figure("gauge", {
        "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "sglang": ("sglang:token_usage",), "llama.cpp": ("llamacpp:kv_cache_usage_ratio",)},
        combine="mean"),
    "prefix_cache_hit_rate": Figure("gauge", {"sglang": ("sglang:cache_hit_rate",)},
                                    combine="mean"),
    "preemptions": Figure("counter", {"vllm": ("vllm:num_preemptions_total",)}),
    "prompt_tokens": Figure("counter", {
        "vllm": ("vllm:prompt_tokens_total",), "sglang": ("sglang:prompt_tokens_total",),
        "tgi": ("tgi_request_input_length_sum",), "llama.cpp": ("llamacpp:prompt_tokens_total",)}),
    "generation_tokens": Figure("counter", {
        "vllm": ("vllm:generation_tokens_total",), "sglang": ("sglang:generation_tokens_total",),
        "tgi": ("tgi_request_generated_tokens_sum",),
        "llama.cpp": ("llamacpp:tokens_predicted_total",)}),
    "prefix_cache_queries": Figure("counter", {"vllm": ("vllm:prefix_cache_queries_total",)}),
    "prefix_cache_hits": Figure("counter", {
        "vllm": ("vllm:prefix_cache_hits_total",),
        "llama.cpp": ("llamacpp:prompt_tokens_cached_total",)}),
    "ttft": Figure("histogram", {
        "vllm": ("vllm:time_to_first_token_seconds",),
        "sglang": ("sglang:time_to_first_token_seconds",)}),
    "itl": Figure("histogram", {
        "vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "sglang": ("sglang:inter_token_latency_seconds",
                   "sglang:time_per_output_token_seconds")}),
}  # fmt: skip
TIMELINE_FIGURES = ("queue_depth", "running", "kv_usage")  # drawn beside the client's windows
FAMILY_PREFIXES = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("tgi_", "tgi"),
    ("llamacpp:", "llama.cpp"),
)


def server_family(names: Sequence[str]) -> str:
    """The server family that exposes these metric names, or `unknown`."""
    counts = {family: 0 for _, family in FAMILY_PREFIXES}
    for name in names:
        for prefix, family in FAMILY_PREFIXES:
            if name.startswith(prefix):
                counts[family] += 1
    family, n = max(counts.items(), key=lambda kv: kv[1])
    return family if n else "unknown"


def _metric_name(figure: Figure, family: str, present: set[str]) -> str | None:
    for name in figure.names.get(family, ()):
        if name in present:
            return name
    return None


def figure_series(frame: pl.DataFrame, figure_name: str, family: str | None = None) -> pl.DataFrame:
    """A gauge's or counter's value at each scrape (`t_ns`, `value`), series combined;
    empty when the server does not expose it."""
    figure = FIGURES[figure_name]
    family = family or server_family(frame["name"].unique().to_list())
    name = _metric_name(figure, family, set(frame["name"].unique().to_list()))
    if name is None or figure.kind == "histogram":
        return pl.DataFrame(schema={"t_ns": pl.Int64(), "value": pl.Float64()})
    rows = frame.filter(pl.col("name") == name)
    agg = pl.col("value").mean() if figure.combine == "mean" else pl.col("value").sum()
    return rows.group_by("t_ns").agg(agg.alias("value")).sort("t_ns")


def counter_delta(values: Sequence[float]) -> float:
    """The change of a counter over successive values; a drop is a restart from 0."""
    total = 0.0
    for before, after in itertools.pairwise(values):
        total += after - before if after >= before else after
    return total


def _gauge_stats(values: Sequence[float]) -> GaugeStats:
    if not values:
        return GaugeStats(mean=None, p99=None, max=None, samples=0)
    ordered = sorted(values)
    return GaugeStats(
        mean=round(sum(values) / len(values), 6),
        p99=round(ordered[nearest_rank(99, len(ordered)) - 1], 6),
        max=round(ordered[-1], 6),
        samples=len(values),
    )


def histogram_change(frame: pl.DataFrame, name: str) -> ServerHistogram:
    """A histogram's observations between the first and the last scrape, in ms."""
    times = frame.filter(pl.col("name") == f"{name}_count")["t_ns"].unique().sort()
    if len(times) == 0:
        return ServerHistogram(count=0, mean=None, p50=None, p99=None)
    first, last = times[0], times[-1]

    def total(suffix: str, t: int) -> float:
        rows = frame.filter((pl.col("name") == f"{name}{suffix}") & (pl.col("t_ns") == t))
        return float(rows["value"].sum())

    count = total("_count", last) - (total("_count", first) if len(times) > 1 else 0.0)
    sum_s = total("_sum", last) - (total("_sum", first) if len(times) > 1 else 0.0)
    buckets = _bucket_change(frame, f"{name}_bucket", first if len(times) > 1 else None, last)
    if count <= 0:
        return ServerHistogram(count=0, mean=None, p50=None, p99=None)
    return ServerHistogram(
        count=round(count),
        mean=round(sum_s / count * 1e3, 3),
        p50=_quantile_ms(buckets, 0.50),
        p99=_quantile_ms(buckets, 0.99),
    )


def _bucket_change(
    frame: pl.DataFrame, name: str, first: int | None, last: int
) -> list[tuple[float, float]]:
    rows = frame.filter(pl.col("name") == name).with_columns(
        pl.col("labels").list.eval(
            pl.element().filter(pl.element().struct.field("name") == "le")
            .struct.field("value")).list.first().alias("le"))  # fmt: skip

    def at(t: int) -> dict[float, float]:
        part = rows.filter(pl.col("t_ns") == t).group_by("le").agg(pl.col("value").sum())
        return {float(le): v for le, v in part.iter_rows() if le is not None}

    end = at(last)
    start = at(first) if first is not None else {}
    return sorted((le, end[le] - start.get(le, 0.0)) for le in end)


def _quantile_ms(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding rank q·count."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return round(lower_le * 1e3, 3)  # in the +Inf bucket: the highest finite bound
            width = count - lower_count
            frac = (rank - lower_count) / width if width > 0 else 1.0
            return round((lower_le + (le - lower_le) * frac) * 1e3, 3)
        lower_le, lower_count = le, count
    return None


def server_audit(
    frame: pl.DataFrame,
    *,
    url: str,
    interval_s: float,
    scrapes: int,
    failures: int | None,
    malformed_lines: int | None,
    last_error: str | None,
    end_ns: int | None = None,
    access: ScrapeAccess | None = None,
) -> ServerAudit:
    """summary.json's `server` block from the scraped rows (gauges over t0..end_ns).

    Counters and histograms are changes from the first scrape to the last, so only a series
    first read before t0 has one: a baseline read after the run began (its first scrapes
    failed, or came late) would leave out what the run did before it, a figure too low
    with nothing to say so; such a series has none."""
    names = frame["name"].unique().to_list() if len(frame) else []
    before_t0 = bool(len(frame)) and frame["t_ns"].min() <= 0  # type: ignore[operator]
    family = server_family(names)
    gauges: dict[str, GaugeStats] = {}
    counters: dict[str, float] = {}
    histograms: dict[str, ServerHistogram] = {}
    for figure_name, figure in FIGURES.items():
        if figure.kind == "histogram":
            name = _metric_name(figure, family, {n.removesuffix("_count") for n in names})
            if name is not None and before_t0:
                histograms[figure_name] = histogram_change(frame, name)
            continue
        series = figure_series(frame, figure_name, family) if names else None
        if series is None or len(series) == 0:
            continue
        if figure.kind == "gauge":
            window = series.filter(pl.col("t_ns") >= 0)
            if end_ns is not None:
                window = window.filter(pl.col("t_ns") <= end_ns)
            gauges[figure_name] = _gauge_stats(window["value"].to_list())
        elif series["t_ns"][0] <= 0:  # a baseline before t0 (see above)
            counters[figure_name] = round(counter_delta(series["value"].to_list()), 6)
    queries, hits = counters.get("prefix_cache_queries"), counters.get("prefix_cache_hits")
    if family == "llama.cpp" and hits is not None and "prompt_tokens" in counters:
        queries = hits + counters["prompt_tokens"]  # its prompt counter excludes cached tokens
    share = round(hits / queries, 6) if queries and hits is not None else None
    return ServerAudit(
        url=url, server=family, interval_s=interval_s, scrapes=scrapes, failures=failures,
        malformed_lines=malformed_lines, last_error=last_error, gauges=gauges,
        counters=counters, prefix_cache_hit_share=share, histograms_ms=histograms,
        access=access,
    )  # fmt: skip


def with_server(
    summary: Summary,
    frame: pl.DataFrame | None,
    info: ServerMetricsInfo | None,
    records: pl.DataFrame,
) -> Summary:
    """`summary` with its `server` block, when the run scraped a server (else unchanged);
    gauges are summarised from t0 to the last record's end."""
    if info is None:
        return summary
    frame = frame if frame is not None else pl.DataFrame(schema=SERVER_METRICS_SCHEMA)
    scrapes = info.scrapes if info.scrapes is not None else frame["t_ns"].n_unique()
    block = server_audit(
        frame, url=info.url, interval_s=info.interval_s, scrapes=scrapes,
        failures=info.failures, malformed_lines=info.malformed_lines,
        last_error=info.last_error, end_ns=_last_end_ns(records), access=info.access,
    )  # fmt: skip
    return dataclasses.replace(summary, server=block)


def _last_end_ns(records: pl.DataFrame) -> int | None:
    if records.height == 0 or "end_ns" not in records.columns:
        return None
    value = records["end_ns"].max()
    return int(value) if isinstance(value, int | float) else None


LIVE_FIGURES = ("queue_depth", "running", "kv_usage", "prefix_cache_hit_rate")  # re-published


def current_gauges(samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, float]:
    """The gauge figures of `LIVE_FIGURES` one scrape's samples give, series combined as in
    `figure_series` (NaN samples skipped); absent figures left out."""
    family = server_family([name for name, _, _ in samples])
    present = {name for name, _, _ in samples}
    out: dict[str, float] = {}
    for figure_name in LIVE_FIGURES:
        figure = FIGURES[figure_name]
        name = _metric_name(figure, family, present)
        if name is None:
            continue
        values = [v for n, _, v in samples if n == name and not math.isnan(v)]
        if values:
            out[figure_name] = (
                sum(values) / len(values) if figure.combine == "mean" else sum(values)
            )
    return out


def server_timeline(frame: pl.DataFrame) -> pl.DataFrame:
    """The timeline figures at every scrape: `t_s` (since t0) and one column per figure of
    `TIMELINE_FIGURES` the server exposes (absent ones left out)."""
    family = server_family(frame["name"].unique().to_list()) if frame.height else "unknown"
    out = frame.select(pl.col("t_ns").unique().sort())
    for figure_name in TIMELINE_FIGURES:
        series = figure_series(frame, figure_name, family)
        if series.height:
            out = out.join(series.rename({"value": figure_name}), on="t_ns", how="left")
    return out.select((pl.col("t_ns") / 1e9).alias("t_s"), pl.exclude("t_ns"))


def window_gauges(timeline: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per time window (`window_start_s`, `window_end_s`), the mean of each timeline figure
    over the scrapes in [start, end), as `server_<figure>` (null: no scrape in the window)."""
    figures = [c for c in timeline.columns if c != "t_s"]
    spans = windows.select("window_start_s", "window_end_s").unique()
    if not figures or spans.height == 0:
        return spans
    joined = spans.join(timeline, how="cross").filter(
        (pl.col("t_s") >= pl.col("window_start_s")) & (pl.col("t_s") < pl.col("window_end_s"))
    )
    means = joined.group_by("window_start_s", "window_end_s").agg(
        pl.col(f).mean().alias(f"server_{f}") for f in figures
    )
    return spans.join(means, on=["window_start_s", "window_end_s"], how="left")


# --- compare: the server's side of two runs -------------------------------------------------
# Informational unless a threshold is set: a server figure is sampled every interval (a
# gauge) or read twice (a counter), not measured per request, so there is no interval to
# judge it by; a threshold is a plain limit on the change in the worse direction.

LOWER_IS_WORSE = ("prefix_cache_hit_share",)


def compared_figures(audit: ServerAudit) -> dict[str, float]:
    """The figures `compare` sets side by side: gauges' mean and p99, counter changes, the
    prefix-cache hit share, the server's own histograms' p50/p99 (ms)."""
    out: dict[str, float] = {}
    for name, stats in audit.gauges.items():
        for stat in ("mean", "p99"):
            value = getattr(stats, stat)
            if value is not None:
                out[f"{name}_{stat}"] = value
    for name in ("preemptions",):
        if name in audit.counters:
            out[name] = audit.counters[name]
    if audit.prefix_cache_hit_share is not None:
        out["prefix_cache_hit_share"] = audit.prefix_cache_hit_share
    for name, hist in audit.histograms_ms.items():
        for stat in ("p50", "p99"):
            value = getattr(hist, stat)
            if value is not None:
                out[f"server_{name}_{stat}_ms"] = value
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerThreshold:
    """A limit on a server figure's change in the worse direction: relative (0.5 = +50 %)
    or absolute (in the figure's unit)."""

    relative: float | None = None
    absolute: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerDelta:
    """One server figure on both sides (the baseline the mean over its runs that have it)."""

    figure: str
    baseline: float | None
    current: float | None
    threshold: ServerThreshold | None
    regressed: bool

    @property
    def change(self) -> float | None:
        """current − baseline."""
        if self.baseline is None or self.current is None:
            return None
        return self.current - self.baseline


def parse_server_thresholds(texts: Sequence[str]) -> dict[str, ServerThreshold]:
    """`queue_depth_p99=50%` (relative) or `kv_usage_mean=0.1` (absolute), each once.

    ValueError (what and how to fix) for a malformed one.
    """
    out: dict[str, ServerThreshold] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name, value = name.strip(), value.strip().lstrip("+")
        try:
            if not sep or not name:
                raise ValueError
            if value.endswith("%"):
                out[name] = ServerThreshold(relative=float(value[:-1]) / 100)
            else:
                out[name] = ServerThreshold(absolute=float(value))
        except ValueError:
            raise ValueError(
                f"{text!r} is not FIGURE=VALUE: e.g. queue_depth_p99=50% or kv_usage_mean=0.1"
            ) from None
    return out


def server_deltas(
    baseline: Sequence[ServerAudit],
    current: ServerAudit,
    thresholds: Mapping[str, ServerThreshold],
) -> list[ServerDelta]:
    """Every figure either side has; `regressed` only where a threshold is set and the change
    in the worse direction exceeds it."""
    base_values: dict[str, list[float]] = {}
    for audit in baseline:
        for name, value in compared_figures(audit).items():
            base_values.setdefault(name, []).append(value)
    cur = compared_figures(current)
    deltas = []
    for name in sorted(set(base_values) | set(cur)):
        values = base_values.get(name)
        base = sum(values) / len(values) if values else None
        threshold = thresholds.get(name)
        regressed = _beyond(base, cur.get(name), threshold, name)
        deltas.append(ServerDelta(figure=name, baseline=base, current=cur.get(name),
                                  threshold=threshold, regressed=regressed))  # fmt: skip
    return deltas


def _beyond(
    base: float | None, cur: float | None, threshold: ServerThreshold | None, name: str
) -> bool:
    if threshold is None or base is None or cur is None:
        return False
    worse = (base - cur) if name in LOWER_IS_WORSE else (cur - base)
    if threshold.relative is not None:
        return worse > threshold.relative * abs(base)
    return threshold.absolute is not None and worse > threshold.absolute
