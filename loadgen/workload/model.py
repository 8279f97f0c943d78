"""The workload spec's model: frozen, typed values a workload file is validated into.

What a workload is, and nothing of how a file is read (`workload.parse`), checked
(`workload.checks`) or changed by the command line (`workload.overrides`): the value sets
and sane ranges, and one dataclass per section of the file. A field's metadata says how
the workload's fingerprint treats it (`workload.identity`): `NOT_TRAFFIC` for a setting
that does not shape the traffic (left out), `BY_FILE_NAME` for a file that counts by its
name, not where it lies; every other field is hashed, so a new field is part of the
workload unless it says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from loadgen.adapters.generic import GenericSpec
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES
from loadgen.measures import SLO_MEASURES

ARRIVAL_PROCESSES = ("constant", "poisson", "gamma", "onoff", "ramp", "trace")
CLASS_KINDS = ("chat", "summarization", "agent")
TRACE_FORMATS = ("auto", "azure", "mooncake", "burstgpt", "plain", "agent")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "exponential")
DATASET_FORMATS = ("sharegpt", "jsonl", "json", "csv", "parquet", "openai-batch")
DATASET_SAMPLES = ("random", "sequential")
CONTEXT_OVERFLOW = ("drop_oldest", "summarize")
# How a run stands to the server's prefix cache (README "Cache warmth"): `cold` prompts
# start with a run nonce, so no prefix is shared with an earlier run; `warm` sends the same
# bytes as every run of this file and seed; `reset` sends those and first asks the server
# to empty its cache.
CACHE_MODES = ("cold", "warm", "reset")
MAX_MODELS = 1_000  # models (or LoRA adapters) in one class's mix

# Sane ranges: past these a plan is a typo, an overflow (ns since t0 are int64) or a plan
# no host can hold. Each limit's reason is printed with the error.
MAX_REQUESTS = 100_000_000  # per class (the memory estimate usually refuses far fewer)
MAX_SPAN_S = 31 * 86_400  # every intended send within 31 days of t0; also caps any duration
MAX_RATE_PER_S = 1_000_000.0
MAX_TOKENS = 10_000_000  # any token count (prompt, output, system prompt)
MAX_TURNS = 10_000  # turns of a chat session, hops of a trajectory
MAX_CV = 100.0
MIN_CV = 0.001
MAX_CONCURRENCY = 100_000
MAX_RATE_SCALE = 1_000.0  # copies of a trace superposed
MAX_PERIODS = 1_000_000  # on/off periods over a class's span
SPAN_WHY = "31 days, the longest schedule loadgen plans"
MAX_SEED = 2**63 - 1
REQUEST_ID_FORMATS = ("uuid", "counter")
REQUEST_ID_BODY = ("auto", "on", "off")  # the adapters' `request_id_field`
# The content codings loadgen can ask for and inflate as they arrive, and what it asks for
# when told to accept compression without naming codings: the OpenAI SDK's (httpx's)
# `Accept-Encoding: gzip, deflate`.
CONTENT_CODINGS = ("gzip", "deflate")
CLIENT_CODINGS = ("gzip", "deflate")

# How the workload fingerprint (`workload.identity`) treats a field (its metadata).
FINGERPRINT = "fingerprint"
NOT_TRAFFIC = {FINGERPRINT: "left out"}  # seed, run length, where it is sent, ids, scrapes
BY_FILE_NAME = {FINGERPRINT: "file name"}  # a file counts by its name, not where it lies


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetSpec:
    """Where and how to send: the API family, model name, auth and request options."""

    api: str = "openai-chat"
    model: str = "sim"
    # The base URL; `--url` overrides; absent = the built-in simulator.
    url: str | None = field(default=None, metadata=NOT_TRAFFIC)
    path: str | None = None  # request path; default from the API family
    api_key_env: str | None = None  # name of the env var holding the key, never the key
    headers: Mapping[str, str] = field(default_factory=dict)
    include_usage: bool = True  # stream_options.include_usage
    force_output_tokens: bool = True  # send ignore_eos + min_tokens so N is what was planned
    # A forced length that ends short on a stop reason is ok (flagged `stopped_early`), not
    # `truncated`: for a server that ignores ignore_eos/min_tokens.
    allow_early_stops: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    priority_header: str | None = None  # send class priority as this header, not in the body
    # A local tokenizer.json for exact prompt token counts.
    tokenizer: str | None = field(default=None, metadata=BY_FILE_NAME)
    generic: GenericSpec | None = None  # the `generic` API's framing, body template and paths
    # Each request's id header (target.request_id): its name (None: off) and format
    # (`uuid`, the default, or `counter`: loadgen-<n>); see loadgen.engine.request_ids.
    request_id_header: str | None = field(default="X-Request-Id", metadata=NOT_TRAFFIC)
    request_id_format: str = field(default="uuid", metadata=NOT_TRAFFIC)
    # Whether the id also goes in a body field (the adapter's `request_id_field`): auto, on, off.
    request_id_body: str = "auto"
    # Each request's W3C `traceparent` (a trace of its own; `--no-traceparent` or false: none
    # of loadgen's), and a `tracestate` sent beside it as given; see
    # loadgen.engine.traceparent.
    traceparent: bool = field(default=True, metadata=NOT_TRAFFIC)
    tracestate: str | None = field(default=None, metadata=NOT_TRAFFIC)
    # The server's Prometheus endpoint, scraped during the run (`--server-metrics-url`): an
    # absolute URL, or a path (`/metrics`) on the target's origin. None: no scraping.
    server_metrics_url: str | None = field(default=None, metadata=NOT_TRAFFIC)
    server_metrics_interval_s: float = field(default=1.0, metadata=NOT_TRAFFIC)
    # The metrics endpoint's own headers (its credentials when they differ from the target's,
    # which are sent only to the target's origin); `${VAR}` read from the environment.
    server_metrics_headers: Mapping[str, str] = field(default_factory=dict, metadata=NOT_TRAFFIC)
    # `Accept-Encoding` sent with every request (`--accept-encoding`), as the users' clients
    # send it: () sends none. A compressed stream is inflated as it arrives and timed by the
    # arrival of its compressed bytes, so a route that compresses (and holds back) event
    # streams is measured as those clients see it.
    accept_encoding: tuple[str, ...] = ()
    # The path to the server is known to buffer (a proxy, gateway or CDN that holds streams
    # back; `--path-buffers`): streams that arrive coalesced are judged as observed, not as
    # unknown (`loadgen.analysis.delivery`). How runs are judged, not traffic.
    path_buffers: bool = field(default=False, metadata=NOT_TRAFFIC)


# The measures a target can be set on (`measures.SLO_MEASURES`), by their keys: `ttft_ms`, ...
METRICS_MS: tuple[str, ...] = tuple(m.column for m in SLO_MEASURES)
# The confidence a target is judged at unless `slo.confidence` or `--confidence` says
# otherwise, and the bound below which a "confidence" would be a coin toss: a one-sided
# bound at 50 % is the point estimate itself.
DEFAULT_CONFIDENCE = 0.95
MIN_CONFIDENCE = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class SloTargets:
    """One class's objectives: thresholds in ms (None = no target) at one percentile.

    Each threshold is both a per-request limit (for attainment and goodput) and a
    population target at `percentile` (for `met`). One field per measure that can carry an
    SLO (`METRICS_MS`; its name is the workload file's key, so it is spelled here too: a
    test holds the two equal).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    percentile: float = 99.0
    # The level of the one-sided bounds a target is judged by (`analysis.confidence`): how
    # sure MET and MISSED are. Not traffic: a run judged at 90 % pools with one at 95 %.
    confidence: float = field(default=DEFAULT_CONFIDENCE, metadata=NOT_TRAFFIC)

    def __post_init__(self) -> None:
        if not 0.0 < self.percentile <= 100.0:
            raise ValueError(f"SLO percentile must be in (0, 100] (got {self.percentile})")
        if not MIN_CONFIDENCE < self.confidence < 1.0:
            raise ValueError(
                f"SLO confidence must be in ({MIN_CONFIDENCE:g}, 1) (got {self.confidence:g})"
            )
        for name, value in self.thresholds_ms().items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO {name} must be a finite number > 0 (got {value})")

    def thresholds_ms(self) -> dict[str, float]:
        """The thresholds that are set, by metric name (`ttft_ms`, ...), in ms."""
        values = {name: getattr(self, name) for name in METRICS_MS}
        return {name: v for name, v in values.items() if v is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSpec:
    """Replay a request trace: its arrival times and token counts (`loadgen.workload.traces`)."""

    path: str = field(metadata=BY_FILE_NAME)  # resolved relative to the workload file
    format: str = "auto"
    start_s: float = 0.0  # a window of the trace, seconds from its first row
    end_s: float | None = None
    speed: float = 1.0  # times divided by speed
    rate_scale: float = 1.0  # thin (< 1) or superpose (> 1) the trace's requests
    spread_s: float = 0.0  # spread requests sharing a coarse timestamp inside this bucket
    include_failed: bool = False
    limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrivalSpec:
    """An arrival process.

    constant: gaps of 1/rate; poisson: exponential gaps; gamma: gamma gaps with mean 1/rate
    and coefficient of variation `cv` (cv > 1 is bursty); onoff: a two-state modulated
    Poisson process (Poisson at `on_rate_per_s` for exponential periods of mean `on_mean_s`,
    then at `off_rate_per_s` for periods of mean `off_mean_s`); ramp: Poisson at each
    step's rate for its duration; trace: the times of a recorded trace.
    """

    process: str
    rate_per_s: float = 0.0
    cv: float = 1.0
    start_s: float = 0.0
    on_rate_per_s: float = 0.0
    off_rate_per_s: float = 0.0
    on_mean_s: float = 0.0
    off_mean_s: float = 0.0
    steps: tuple[tuple[float, float], ...] = ()  # (rate_per_s, duration_s)
    trace: TraceSpec | None = None

    @property
    def mean_rate_per_s(self) -> float | None:
        """The long-run mean rate (None for a trace: known only once it is read)."""
        if self.process == "onoff":
            period = self.on_mean_s + self.off_mean_s
            return (
                self.on_rate_per_s * self.on_mean_s + self.off_rate_per_s * self.off_mean_s
            ) / period
        if self.process == "ramp":
            total = sum(d for _, d in self.steps)
            return sum(r * d for r, d in self.steps) / total
        if self.process == "trace":
            return None
        return self.rate_per_s

    def scaled(self, factor: float) -> ArrivalSpec:
        """The same process with every rate multiplied by `factor`."""
        trace = self.trace
        if trace is not None:
            trace = replace(trace, rate_scale=trace.rate_scale * factor)
        return replace(
            self,
            rate_per_s=self.rate_per_s * factor,
            on_rate_per_s=self.on_rate_per_s * factor,
            off_rate_per_s=self.off_rate_per_s * factor,
            steps=tuple((r * factor, d) for r, d in self.steps),
            trace=trace,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SecondsDist:
    """A duration distribution in seconds (think time, tool time); clamped to [min, max]."""

    dist: str
    value: float = 0.0
    mean: float = 0.0
    cv: float = 1.0
    min: float = 0.0
    max: float = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDist:
    """A token-count distribution; samples are rounded and clamped to [min, max], at least 1."""

    dist: str
    value: int = 0  # fixed
    mean: float = 0.0  # lognormal, exponential
    cv: float = 1.0  # lognormal
    min: int = 1
    max: int = 1_000_000

    @property
    def expected(self) -> float:
        """The mean before clamping (what `check` prints as the expected size)."""
        if self.dist == "fixed":
            return float(self.value)
        if self.dist == "uniform":
            return (self.min + self.max) / 2
        return self.mean


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadlines:
    """Per-request deadlines, each its own outcome (seconds; measured from the intended time)."""

    first_token_s: float = 60.0
    stall_s: float = 30.0
    total_s: float = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one response may make the client hold: the longest stream event or line (bytes).

    Past it the request ends as `stream_error` naming the cap, and its connection closes.
    """

    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSpec:
    """Prompts from a local file (`loadgen.workload.datasets`); nothing is downloaded.

    `turns: first` sends each conversation's first human turn (with any system prompt);
    `turns: all` replays its human turns in order as a session, each carrying the
    conversation so far, whose assistant turns are the model's real answers (`history:
    model`) or the recorded ones (`history: recorded`). Length filters count tokens with
    `target.tokenizer` when it is given, else words.
    """

    path: str = field(metadata=BY_FILE_NAME)  # resolved relative to the workload file
    format: str
    prompt_field: str | None = None  # None: the first of prompt, text_input, text
    messages_field: str | None = None  # None: messages
    answer_field: str | None = None  # None: the first of completion, response, output
    output_tokens_field: str | None = None  # None: the first of output_tokens, output_length
    sample: str = "random"
    replacement: bool = False
    limit: int | None = None  # rows read (after the file's order), before the filters
    min_prompt_tokens: int = 1
    max_prompt_tokens: int = MAX_TOKENS
    min_output_tokens: int = 1
    max_output_tokens: int = MAX_TOKENS
    turns: str = "first"  # first | all
    history: str = "model"  # model | recorded


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedPrefixSpec:
    """G groups of P shared tokens; each request is one group's prefix then a fresh suffix.

    As vLLM's `prefix_repetition` and SGLang's `generated-shared-prefix` datasets: a
    server with prefix caching prefills only the suffix once a group's prefix is cached.
    The group of each request is drawn uniformly (seeded).
    """

    shared_prefix_tokens: int
    groups: int
    suffix_tokens: LengthDist


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextSpec:
    """How an agent's context grows from hop to hop.

    `grow` (the default): each hop carries the whole trajectory so far (the task, every
    earlier answer as an assistant tool call and its tool result). With `max_tokens`, the
    oldest hops are dropped (`drop_oldest`), or replaced by one summary message of
    `summary_tokens` (`summarize`), until the context fits. `grow: false` is the older
    model: every hop is the fixed context plus the previous hop's answer.
    """

    grow: bool = True
    max_tokens: int | None = None
    overflow: str = "drop_oldest"
    summary_tokens: int = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class FanoutSpec:
    """At hop `at_hop` (0-based), `branches` sub-agent requests run at once, then join."""

    at_hop: int
    branches: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassSpec:
    """One workload class: how requests arrive, how big they are, and what they must meet."""

    name: str
    kind: str = "chat"  # chat | summarization | agent: how the class is judged
    arrival: ArrivalSpec
    # Exactly one of requests / duration_s is set: the run's length, which a nightly varies.
    requests: int | None = field(metadata=NOT_TRAFFIC)
    duration_s: float | None = field(metadata=NOT_TRAFFIC)
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    slo: SloTargets
    deadlines: Deadlines
    priority: int | None = None  # sent as the body's `priority` (vLLM) or target.priority_header
    limits: Limits = field(default_factory=Limits)
    # chat sessions: turns per session (None = single requests), think time between turns,
    # and a system prompt shared by every session of the class (prefix caching, opt-in).
    turns: LengthDist | None = None
    think_time_s: SecondsDist | None = None
    system_prompt_tokens: int = 0
    # agent trajectories: hops in sequence, tool time between hops, a trajectory budget.
    hops: LengthDist | None = None
    tool_time_s: SecondsDist | None = None
    trajectory_budget_s: float | None = None
    # summarization: closed loop at a fixed concurrency (else open loop by `arrival`),
    # and a completion deadline for the whole batch.
    concurrency: int | None = None
    batch_deadline_s: float | None = None
    # real traffic (#17): prompts from a dataset, shared prefixes, a model mix, agent context.
    dataset: DatasetSpec | None = None
    output_from_dataset: bool = False  # output_tokens: from_dataset (the recorded answer)
    shared_prefix: SharedPrefixSpec | None = None
    models: tuple[tuple[str, float], ...] = ()  # (name, weight); () = target.model
    tool_result_tokens: LengthDist | None = None  # agents: the tool message after each hop
    context: ContextSpec = field(default_factory=ContextSpec)
    fanout: FanoutSpec | None = None

    @property
    def arrival_unit(self) -> str | None:
        """What one arrival of this class starts: `requests`, `sessions` (multi-turn chat, a
        dataset's replayed conversations) or `trajectories` (agents); None for a closed loop
        (`concurrency`), which has no arrivals: it sends as its requests end."""
        if self.concurrency is not None:
            return None
        if self.kind == "agent":
            return "trajectories"
        replayed = self.dataset is not None and self.dataset.turns == "all"
        return "sessions" if self.turns is not None or replayed else "requests"

    @property
    def is_flow(self) -> bool:
        """True when requests depend on each other (sessions, trajectories, closed loop)."""
        return (
            self.turns is not None
            or self.kind == "agent"
            or self.concurrency is not None
            or (self.dataset is not None and self.dataset.turns == "all")
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """A validated workload file."""

    name: str
    source: str = field(metadata=NOT_TRAFFIC)  # the file's path
    target: TargetSpec
    classes: Mapping[str, ClassSpec]
    seed: int = field(default=0, metadata=NOT_TRAFFIC)
    cache: str = "cold"  # one of CACHE_MODES
    sim: Mapping[str, Any] = field(default_factory=dict)  # the built-in simulator's profile
    # The file as parsed, for run.json.
    raw: Mapping[str, Any] = field(default_factory=dict, metadata=NOT_TRAFFIC)


DEFAULT_HOPS = LengthDist(dist="fixed", value=8)  # an agent class's hops when it gives none
