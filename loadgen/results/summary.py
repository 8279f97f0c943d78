"""The summary of a run, typed: what the audit produces, summary.json holds and reports read.

`analysis.audit.audit` builds a `Summary` from the records; `runfolder.write_summary` writes
it (through `loadgen.codec`: field order is key order) and `runfolder.read_summary` reads it
back. The reports (`render.terminal`, `render.report`) and the capacity search read its
fields, never string keys. Every value is JSON-ready: ms rounded to µs, shares to 1e-6,
rates to 1e-3, and None where a figure does not exist: an empty population, or a percentile
that falls on a failed request (a "with failures" figure ranks every failure +inf, and
+inf is not a number JSON has). Percentiles are nearest rank (see `analysis.metrics`).

Defined here, beside the records, rather than in `analysis`: the run folder, which owns
summary.json, sits below the analysis that fills it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from loadgen.codec import OMIT_NONE, omitted_when
from loadgen.measures import Measure
from loadgen.workload.spec import SloTargets


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyStats:
    """Nearest-rank percentiles, max and mean (ms) of one measure over completed requests."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    mean: float | None
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRankedStats:
    """Percentiles and max (ms) with every failed request ranked +inf: None where one falls
    on a failure. `count` is the whole population, `failures` how many of it failed."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    count: int
    failures: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputTokens:
    """Output tokens of completed requests: mean, median, max and total."""

    mean: float | None
    p50: int | None
    max: int | None
    total: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TokensPerChunk:
    """Tokens carried per output chunk of ok requests: 1.0 means ITL is a per-token gap."""

    mean: float | None = None
    max: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """How a class's output arrived at the client (`analysis.delivery`), over its ok
    requests that streamed output (`streams`).

    `reads`: the network reads that carried their output; `events`: their output events;
    `events_per_read` = events / reads (1.0 on a direct path that kept up),
    `events_per_read_max` the most of one stream; `tokens_per_event` = output tokens / events (the
    server's own chunking: vLLM's stream interval makes it > 1). `coalesced`: streams at
    least half of whose reads carried `coalesced_at_events` or more events each: held back
    between the server and the client (a buffering proxy, gateway or compression) or written
    in bursts by the server; `coalesced_share` of the streams, `coalesced_token_share` of
    their output tokens. Their TPOT and ITL are not the server's pace: the class's checks
    judge them as unknown, unless `path_buffers` (the workload or `--path-buffers` says the
    path buffers): then as observed.
    """

    streams: int = 0
    reads: int = 0
    events: int = 0
    events_per_read: float | None = None
    events_per_read_max: float | None = None
    tokens_per_event: float | None = None
    coalesced: int = 0
    coalesced_share: float | None = None
    coalesced_token_share: float | None = None
    coalesced_at_events: int = 4
    path_buffers: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnds:
    """How a class's streams ended, and where their N came from (over requests with output;
    `truncated` over all: a cut may come before any output).

    `finish_reasons`: requests per stop reason in the API's words (`none`: no reason came).
    `truncated`: cut short (also in `outcomes`: a breach). `stopped_early`: ok, but a stop
    reason ended them before their forced length: their TPOT and goodput are not like for
    like with full-length requests. `n_from`: requests per source of N (`usage`, `text`:
    the streamed text by `target.tokenizer`, `chunks`: token-bearing events counted);
    `n_from_usage_share` is the usage share. `n_counted` is true when any N was counted by
    loadgen (text or chunks): N, TPOT and tokens/s may then differ from the server's count.
    `usage_disagrees`: requests whose usage count disagrees with the token-bearing events
    that arrived (`records.usage_disagrees`), of which `usage_over_counted` claimed more
    (chunks carrying several tokens, hidden reasoning, or a gateway's own count after a
    cut), and `usage_not_taken` claimed more than their output events could carry
    (`Exchange.carried_tokens`): kept as the server's count, N counted from the stream;
    `usage_problems`: requests whose usage held a number no count can be (negative, not an
    integer, beyond what the exchange could hold): not taken, the request a `stream_error`.
    `itl_summarised`: requests that streamed more output chunks than their stamp cap
    (`records.RequestRecord.unstamped_chunks`): their ITL gaps past it are summarised by
    the largest, N, TPOT and E2E are whole.
    """

    finish_reasons: Mapping[str, int] = field(default_factory=dict)
    truncated: int = 0
    stopped_early: int = 0
    n_from: Mapping[str, int] = field(default_factory=dict)
    n_from_usage_share: float | None = None
    n_counted: bool = False
    usage_disagrees: int = 0
    usage_over_counted: int = 0
    usage_problems: int = 0
    itl_summarised: int = 0
    usage_not_taken: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTimings:
    """What the server reported about its own work, over the ok requests that carried it
    (`requests`: 0 when the API reports nothing)."""

    requests: int
    queue_ms: LatencyStats
    load_ms: LatencyStats
    prefill_ms: LatencyStats
    decode_ms: LatencyStats
    total_ms: LatencyStats
    ttft_ms: LatencyStats
    itl_ms: LatencyStats

    def measured(self) -> dict[str, LatencyStats]:
        """The timings the server did report, by name (`queue_ms`, ...), in field order."""
        timings = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "requests"}
        return {name: stats for name, stats in timings.items() if stats.count}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanClocks:
    """How the server's span times sit on the records' clock (`analysis.join`): its
    arrival stamp (the span's start, unix ns) placed through run.json's t0 anchor, against
    each joined request's send. A negative lead means the two clocks disagree by at least
    that much (another host, an unsynchronised clock): the split then carries that error."""

    anchor_ms: float  # the t0 anchor's own uncertainty: its wall-clock reads' disagreement
    arrival_after_send_ms: LatencyStats  # span start − the record's sent_ns, per joined request
    before_send: int  # joined spans that start before their request was sent (clock error)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanJoin:
    """The server's spans joined to the records, request by request (`analysis.join`): by
    the trace id of the record's `traceparent`, else by request id (vLLM's
    `gen_ai.request.id` is "chatcmpl-" + the X-Request-Id sent)."""

    source: str  # where the spans came from: the run's receiver, a file, a query URL
    spans: int  # every span received
    request_spans: int  # of them, spans with a server field (one per request served)
    ok: int  # ok requests
    ok_joined: int  # of them, joined to a span
    join_rate: float | None  # ok_joined / ok (None: no ok request)
    joined: int  # requests joined, whatever their outcome
    by_trace_id: int
    by_request_id: int
    unjoined: Mapping[str, int]  # requests sent but not joined, by outcome
    unjoined_spans: int  # request spans no record claimed (the preflight's, other traffic)
    clocks: SpanClocks | None = field(default=None, metadata=OMIT_NONE)


# The parts of a TTFT, in the order the request met them (`analysis.split`): the client's
# wait before the request's bytes went, the path and the server's HTTP front end outside
# its engine, the server's intake (arrival to queue), its queue and its prefill.
TTFT_PARTS = ("send_lag_ms", "outside_ms", "intake_ms", "queue_ms", "prefill_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitPoint:
    """Where TTFT went for some requests: each part's mean over them in ms (`TTFT_PARTS`),
    which add up to `ttft_ms`, their mean TTFT. At a percentile: the requests whose TTFT
    ranks nearest it (`analysis.split.BAND`); else the requests over the TTFT threshold."""

    percentile: float | None  # None: the requests over the class's TTFT threshold
    requests: int  # the requests averaged
    ttft_ms: float
    send_lag_ms: float
    outside_ms: float
    intake_ms: float
    queue_ms: float
    prefill_ms: float
    cause: str  # the largest part, a name of TTFT_PARTS

    def parts(self) -> dict[str, float]:
        """Each part's ms by its name, in `TTFT_PARTS` order."""
        return {name: float(getattr(self, name)) for name in TTFT_PARTS}


@dataclass(frozen=True, slots=True, kw_only=True)
class TtftSplit:
    """A class's TTFT split by the server's account of each request (`analysis.split`):
    over its ok requests whose server said its queue and prefill times (`requests` of
    `ok`; `from_spans` of them by a joined span, the rest by the stream's own account)."""

    requests: int
    ok: int
    from_spans: int
    p50: SplitPoint | None
    p90: SplitPoint | None
    p99: SplitPoint | None
    at_target: SplitPoint | None  # at the TTFT target's percentile (None: no TTFT target)
    breaching: SplitPoint | None  # the split requests over the TTFT threshold (None: none)

    def points(self) -> dict[str, SplitPoint]:
        """The percentile points that exist, by key (`p50`, `p90`, `p99`)."""
        found = {"p50": self.p50, "p90": self.p90, "p99": self.p99}
        return {key: point for key, point in found.items() if point is not None}


NO_SPLIT = TtftSplit(requests=0, ok=0, from_spans=0, p50=None, p90=None, p99=None,
                     at_target=None, breaching=None)  # fmt: skip


# A check's (and a class's) verdict as summary.json holds it; `analysis.confidence` judges it
MET, MISSED, INCONCLUSIVE = "met", "missed", "inconclusive"
VERDICTS = (MET, MISSED, INCONCLUSIVE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One population target: the p-th percentile of `metric` (failures worst) <= target.

    `metric` is `requests` (percentile and target None) for a class with targets but no
    recorded request: it cannot pass. `value_ms` None: no values (the check then fails:
    nothing measured passes), or a failure.

    `verdict` (one of VERDICTS) is the check's, by the run's rule (`Verdict.rule`): with
    `interval`, met when the upper bound `high_ms` meets the target, missed when the lower
    bound `low_ms` misses it, else inconclusive; with `point`, met when `value_ms` does.
    `passed` is `verdict == "met"`. The bounds are one-sided order-statistic bounds at
    `confidence` each (`analysis.confidence`; together an interval at 2 × confidence − 1);
    None where a bound is open (`low_open`, `high_open`: the sample is too small to reach
    it; `needed` requests would close the upper one) or falls on a failed request (ranked
    +inf, which JSON cannot hold). Summaries written before the verdict had a confidence
    lack these keys: read `passed`.
    """

    metric: str
    percentile: float | None
    target_ms: float | None
    value_ms: float | None
    passed: bool
    population: int
    note: str | None
    verdict: str | None = None
    confidence: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    low_open: bool = False
    high_open: bool = False
    needed: int | None = None
    # Values judged unknown: those of streams that arrived coalesced (`Delivery`), ranked
    # worst for `high_ms` (None there: "unknown"), best for `low_ms`. None when there were
    # none, or the path is declared to buffer (judged as observed: the note says so).
    coalesced: int | None = field(default=None, metadata=OMIT_NONE)

    @property
    def judged(self) -> str:
        """The verdict, or what `passed` said in a summary written before verdicts."""
        return self.verdict or (MET if self.passed else MISSED)


@dataclass(frozen=True, slots=True, kw_only=True)
class SloAudit:
    """A class's SLO audit: its targets, attainment, the checks and whether it met them.

    `met` is None in a run that stopped before its end (nothing is judged); `judged_by`
    names the objective that decides `met` instead of the checks (`batch`, `trajectory`).
    """

    targets: SloTargets
    attainment: float | None
    met: bool | None
    checks: tuple[Check, ...]
    judged_by: str | None = field(default=None, metadata=OMIT_NONE)
    # The class's verdict (VERDICTS; `met` is verdict == "met"): the worst of its checks
    # (missed, then inconclusive), or its objective's. None where `met` is None (a stopped
    # run), and in summaries written before verdicts.
    verdict: str | None = None
    # Exact (Clopper-Pearson) one-sided bounds on `attainment` at the class's confidence.
    attainment_low: float | None = None
    attainment_high: float | None = None

    @property
    def judged(self) -> str | None:
        """The verdict, or what `met` said in a summary written before verdicts."""
        if self.verdict is not None or self.met is None:
            return self.verdict
        return MET if self.met else MISSED


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """Requests and output tokens per second from requests that met every threshold."""

    requests_per_s: float | None
    output_tokens_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchAudit:
    """A summarization class's batch: done by its deadline, and its token throughput."""

    documents: int
    ok: int
    completion_time_s: float | None
    deadline_s: float | None
    met_deadline: bool
    met: bool | None
    input_tokens_per_s: float | None
    output_tokens_per_s: float | None
    concurrency: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DurationStats:
    """Nearest-rank p50/p90/p99 of durations (s or ms, as the field name says) and count."""

    p50: float | None
    p90: float | None
    p99: float | None
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeSplit:
    """Seconds summed over ok hops: queueing and prefill, decode, and tool time between."""

    ttft: float
    decode: float
    tool: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HopStats:
    """One hop index of a class's trajectories, over its ok requests: the context it sent
    (`prompt_tokens`: counted by the client, `server_prompt_tokens`: the server's usage)
    and its TTFT, so prefill growth and cache effects show hop by hop."""

    requests: int
    prompt_tokens_mean: float | None
    prompt_tokens_max: int | None
    server_prompt_tokens_mean: float | None
    ttft_ms: DurationStats


NO_DURATIONS = DurationStats(p50=None, p90=None, p99=None, count=0)
NO_TIME = TimeSplit(ttft=0.0, decode=0.0, tool=0.0)


def _without_trajectories(document: TrajectoryAudit, _value: Any) -> bool:
    return document.trajectories == 0


NO_TRAJECTORIES = omitted_when(_without_trajectories)  # a class with no records: four keys


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryAudit:
    """An agent class's trajectories: attainment against the SLO percentile as a share,
    hop failures, duration percentiles and where the time went."""

    trajectories: int
    ok: int
    attainment: float | None
    target_attainment: float | None = field(default=None, metadata=NO_TRAJECTORIES)
    met: bool | None
    # The share judged at the class's confidence like any share (`Check`): its exact
    # one-sided bounds, the verdict, and the trajectories that would close the lower bound.
    verdict: str | None = field(default=None, metadata=NO_TRAJECTORIES)
    attainment_low: float | None = field(default=None, metadata=NO_TRAJECTORIES)
    attainment_high: float | None = field(default=None, metadata=NO_TRAJECTORIES)
    needed: int | None = field(default=None, metadata=NO_TRAJECTORIES)
    budget_s: float | None = field(default=None, metadata=NO_TRAJECTORIES)
    failed_hops: int = field(default=0, metadata=NO_TRAJECTORIES)
    skipped_hops: int = field(default=0, metadata=NO_TRAJECTORIES)
    duration_s: DurationStats = field(default=NO_DURATIONS, metadata=NO_TRAJECTORIES)
    per_hop_ms: Mapping[str, DurationStats] = field(default_factory=dict, metadata=NO_TRAJECTORIES)
    time_split_s: TimeSplit = field(default=NO_TIME, metadata=NO_TRAJECTORIES)
    per_hop: Mapping[str, HopStats] = field(default_factory=dict, metadata=NO_TRAJECTORIES)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionsAudit:
    """A chat class's multi-turn sessions: how many, and how many completed every turn ok."""

    sessions: int
    completed: int
    turns: int
    turns_per_session_mean: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelAudit:
    """One model's (or LoRA adapter's) share of a class with a model mix: its requests,
    latency stats, attainment against the class's thresholds, goodput and whether its own
    requests met the class's percentile targets (`met`)."""

    requests: int
    failed: int
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    e2e_ms: LatencyStats
    itl_ms: LatencyStats
    output_tokens: OutputTokens
    attainment: float | None
    met: bool | None
    goodput: Goodput
    verdict: str | None = None  # met, missed or inconclusive (`met`: verdict == "met")

    def stats(self, measure: Measure) -> LatencyStats:
        """A measure's stats over the model's ok requests (one field per measure that can
        carry an SLO, `measures.SLO_MEASURES`)."""
        found: LatencyStats = getattr(self, measure.column)
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixCacheShare:
    """A class's prompt tokens the server said it served from its prefix cache, over the
    requests whose response said (`cached_prompt_tokens` not null)."""

    requests: int  # requests whose response reported cached tokens
    prompt_tokens: int
    cached_tokens: int
    hit_share: float | None  # cached / prompt tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassAudit:
    """One class's block: outcomes, latency stats, the SLO audit, goodput, and the block of
    the objective its kind is judged by (batch, trajectory) or adds (sessions)."""

    requests: int
    outcomes: Mapping[str, int]  # every outcome of `records.OUTCOMES`, zeros included
    ttft_ms: LatencyStats
    ttft_ms_with_failures: FailureRankedStats
    ttft_from_send_ms: LatencyStats
    ttfvt_ms: LatencyStats
    tpot_ms: LatencyStats
    tpot_ms_with_failures: FailureRankedStats
    e2e_ms: LatencyStats
    e2e_ms_with_failures: FailureRankedStats
    itl_ms: LatencyStats
    output_tokens: OutputTokens
    reasoning_requests: int
    server_timings_ms: ServerTimings
    ttft_split: TtftSplit = NO_SPLIT  # older runs have none
    tokens_per_chunk: TokensPerChunk
    slo: SloAudit
    goodput: Goodput
    batch: BatchAudit | None = field(default=None, metadata=OMIT_NONE)
    trajectory: TrajectoryAudit | None = field(default=None, metadata=OMIT_NONE)
    sessions: SessionsAudit | None = field(default=None, metadata=OMIT_NONE)
    stream_ends: StreamEnds = field(default_factory=StreamEnds)
    delivery: Delivery = field(default_factory=Delivery)
    # a class whose requests named more than one model: one block per model, by name
    models: Mapping[str, ModelAudit] | None = field(default=None, metadata=OMIT_NONE)
    prefix_cache: PrefixCacheShare | None = field(default=None, metadata=OMIT_NONE)

    @property
    def failed(self) -> int:
        """Requests of the class that did not end ok."""
        return self.requests - self.outcomes.get("ok", 0)

    def stats(self, measure: Measure) -> LatencyStats:
        """A measure's stats over ok requests: its field (`measure.column`; one per
        measure of `measures.MEASURES`, which a test holds)."""
        found: LatencyStats = getattr(self, measure.column)
        return found

    def ranked(self, measure: Measure) -> FailureRankedStats | None:
        """A measure's stats with every failure ranked worst (None: it ranks none)."""
        if not measure.failures_worst:
            return None
        found: FailureRankedStats = getattr(self, measure.with_failures)
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class LagStats:
    """Nearest-rank p50/p99 and max of a lag, in ms."""

    p50: float | None
    p99: float | None
    max: float | None


ASKED_UNITS = ("requests", "sessions", "trajectories")  # what an arrival process brings


@dataclass(frozen=True, slots=True, kw_only=True)
class AskedLoad:
    """What one class's workload asked for, in its own unit: an arrival rate of requests,
    sessions (multi-turn chat: later turns follow earlier answers) or trajectories (agents:
    hops follow hops); a closed loop's concurrency; or a trace's recorded times.

    `unit`: one of `ASKED_UNITS`, `closed_loop` or `trace`. `rate_per_s`: the arrival
    process's long-run mean in `unit`s per second (None for a closed loop or a trace).
    """

    unit: str
    rate_per_s: float | None = None
    concurrency: int | None = None

    @classmethod
    def of(
        cls, *, kind: str, sessions: bool, concurrency: int | None, process: str,
        mean_rate_per_s: float | None,
    ) -> AskedLoad:  # fmt: skip
        """A class's asked load from its spec's kind, sessions, concurrency and arrival."""
        if concurrency is not None:
            return cls(unit="closed_loop", concurrency=concurrency)
        if process == "trace" or mean_rate_per_s is None:
            return cls(unit="trace")
        unit = "trajectories" if kind == "agent" else "sessions" if sessions else "requests"
        return cls(unit=unit, rate_per_s=round(mean_rate_per_s, 6))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientEffect:
    """What the client's own time could do to the run's verdict (`analysis.health`): the
    verdict as measured, with the client's time taken out (each request's send lag and the
    stamp error out of its latencies: the server's best case), and with the stamps at their
    worst for the server; `moved`, each check the client's time could move, in words."""

    stamp_error_ms: float  # E: the send-lag p99, taken as how late any stamp may be
    as_measured: str
    client_out: str
    stamps_worst: str
    moved: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratorHealth:
    """How well the generator kept to its schedule (see `analysis.metrics.generator_health`)
    and whether its own time could have changed the verdict (`analysis.health`)."""

    planned: int
    sent: int
    recorded: int
    retries: int
    lag_ms: LagStats
    send_lag_ms: LagStats
    chained_lag_ms: LagStats
    target_rate_per_s: float | None
    achieved_rate_per_s: float | None
    client_errors: int
    fell_behind: bool  # the run is no measure of the server: `reason` says why (exit 3)
    lag_bound_ms: float | None  # `--lag-bound-ms`, a strict bound when given (None: none)
    # The rate the user asked for (the workload's arrival rates summed; None for traces,
    # closed-loop and chained work): `target_rate_per_s` is the sampled schedule's.
    requested_rate_per_s: float | None = None
    # Per class, what was asked in the class's own unit (sessions/s, a closed loop's
    # concurrency, ...): the rate asked where `requested_rate_per_s` has none to sum.
    asked: Mapping[str, AskedLoad] = field(default_factory=dict)
    # 1 − achieved / scheduled rate: how much less load the sends offered than scheduled
    # (the send lag's least-squares trend; None with fewer than 3 scheduled sends).
    rate_shortfall: float | None = None
    rate_shortfall_low: float | None = None  # its one-sided 99.9 % lower bound (the lag's scatter)
    client: ClientEffect | None = None  # None: a stopped run, or written before schema 20
    reason: str | None = None  # why the run fell behind, in one sentence (None: it did not)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The run's verdict: status `met` (exit 0), `missed` (2), `inconclusive` (7: no class
    missed, but a target lies within its interval or too few requests bound it),
    `fell_behind` (3), or the stop of a run that ended early (`interrupted` 130, `watchdog`
    4, `incomplete` 5: `slo_met` None, no verdict on the server). `slo_met` is true only
    when every class is met. `rule`: how the checks were judged (`interval`, `point`);
    None in summaries written before."""

    status: str
    slo_met: bool | None
    fell_behind: bool
    exit_code: int
    rule: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GaugeStats:
    """A server gauge over the run's scrapes (t0 to the end): nearest-rank p99, max, mean."""

    mean: float | None
    p99: float | None
    max: float | None
    samples: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHistogram:
    """A server-side latency histogram's change over the run, in ms: mean (Δsum/Δcount) and
    p50/p99 interpolated within buckets (Prometheus' histogram_quantile)."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeAccess:
    """How the scraper asked the metrics endpoint, and what it answered when it refused.

    `headers`: the header names sent with every GET (values are never stored), each with
    where it came from: `target` (the target's own credentials, sent only when the metrics
    URL has the target's origin), `server_metrics_headers` (given for the endpoint), `url`
    (the metrics URL's user-info, as Basic auth). `withheld`: the target's credential
    headers not sent because the metrics URL is another origin. `failed_by`: failed scrapes
    by kind (`unauthorized` 401, `forbidden` 403, `not_found` 404, `http_error` other
    non-2xx, `connect`, `timeout`, `too_large`, `not_text`, `redirect`, `error`); `problem` the
    latest failure as a note that says what, where and how to fix it (None: none failed).
    """

    headers: Mapping[str, str] = field(default_factory=dict)
    same_origin: bool = False
    withheld: tuple[str, ...] = ()
    failed_by: Mapping[str, int] = field(default_factory=dict)
    problem: str | None = None
    problem_kind: str | None = None
    problem_status: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAudit:
    """summary.json's `server` block: what the server's /metrics said over the run.

    `server` is the family recognised from the metric names (vllm, sglang, tgi, llama.cpp or
    unknown); `gauges` and `counters` hold loadgen's named figures (`analysis.server`);
    counters are the change from the first scrape to the last. An unknown server keeps every
    series raw in server_metrics.parquet and names none here.
    """

    url: str
    server: str
    interval_s: float
    scrapes: int
    failures: int | None  # None: not known (a recovered run's scraper never wrote its tally)
    malformed_lines: int | None
    last_error: str | None
    gauges: Mapping[str, GaugeStats]
    counters: Mapping[str, float]
    prefix_cache_hit_share: float | None  # Δhits / Δqueries of the server's own counters
    histograms_ms: Mapping[str, ServerHistogram]
    # How it was asked and why it refused (schema 12; None: a run written before).
    access: ScrapeAccess | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionKind:
    """The requests written on one kind of connection: how many, their send lag (sent −
    intended, ms: a new connection's setup is inside it) and TTFT (first token − intended,
    ms, ok requests)."""

    requests: int
    send_lag_ms: LagStats
    ttft_ms: LagStats


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionUse:
    """Which connection each request was written on (the records' `connection` column):
    `new` (opened for it during the run), `warm` (opened before t0, `--warm-connections`),
    `reused` (kept alive from an earlier request). Side by side, they show what connection
    setup adds to a latency."""

    new: ConnectionKind
    warm: ConnectionKind
    reused: ConnectionKind


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassCost:
    """One class's share of the run's cost (`analysis.cost`): by its share of output tokens."""

    output_tokens: int  # ok requests'
    good_output_tokens: int  # requests meeting every per-request threshold
    cost_share: float | None
    cost: float | None
    per_million_output_tokens: float | None
    per_million_good_output_tokens: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """summary.json's `cost`: the fleet's price over the run's tokens (`analysis.cost`)."""

    price_per_hour: float  # as given: one replica's (or the fleet's, with replicas 1)
    replicas: int
    fleet_per_hour: float
    duration_s: float
    run_cost: float
    output_tokens: int
    good_output_tokens: int
    per_million_output_tokens: float | None
    per_million_good_output_tokens: float | None
    classes: Mapping[str, ClassCost]


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheWarmth:
    """How the run stood to the server's prefix cache (docs/cache-warmth.md): run.json's
    `cache` (mode, nonce, reset) and, in summary.json, the hit shares it came out at."""

    mode: str  # cold | warm | reset (`loadgen.workload.spec.CACHE_MODES`)
    nonce: str | None = field(default=None, metadata=OMIT_NONE)  # cold: prompts start with it
    nonce_words: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)  # as sent
    reset: str | None = field(default=None, metadata=OMIT_NONE)  # reset: what the server said
    # The server's own Δhits / Δqueries (scraped /metrics), and cached / prompt tokens of
    # every response that reported them (usage), over all classes: None when nobody said.
    server_hit_share: float | None = field(default=None, metadata=OMIT_NONE)
    usage_hit_share: float | None = field(default=None, metadata=OMIT_NONE)

    @property
    def hit_share(self) -> float | None:
        """The run's prefix-cache hit share: the server's counters, else the usage blocks'."""
        return self.server_hit_share if self.server_hit_share is not None else self.usage_hit_share


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """summary.json: generator health, one audit per class, and the verdict."""

    schema_version: int
    loadgen_version: str
    run_id: str
    interrupted: bool  # stopped before its end (see `verdict.status`)
    duration_s: float  # first intended send → last end, over every class
    generator: GeneratorHealth
    classes: Mapping[str, ClassAudit]
    verdict: Verdict
    connections: ConnectionUse | None = field(default=None, metadata=OMIT_NONE)
    cost: Cost | None = field(default=None, metadata=OMIT_NONE)  # with --price-per-hour
    server: ServerAudit | None = field(default=None, metadata=OMIT_NONE)
    cache: CacheWarmth | None = field(default=None, metadata=OMIT_NONE)
    server_spans: SpanJoin | None = field(default=None, metadata=OMIT_NONE)
