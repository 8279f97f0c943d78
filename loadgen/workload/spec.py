"""The workload spec: a YAML file validated into frozen, typed values before any traffic.

First stage of the pipeline (workload YAML → spec → arrivals → plans → engine). Every
error names the file, the key path, what is wrong and how to fix it, as a `ConfigError`;
the CLI turns it into exit code 1 without a traceback. Secrets never live here: the API
key is read from the environment variable the file names (`target.api_key_env`).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from loadgen.adapters import APIS
from loadgen.adapters.generic import GenericSpec, generic_spec
from loadgen.errors import ConfigError
from loadgen.workload.inputs import (
    TRACE_MAX_BYTES,
    WORKLOAD_MAX_BYTES,
    load_yaml,
    read_text,
    size_text,
)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetSpec:
    """Where and how to send: the API family, model name, auth and request options."""

    api: str = "openai-chat"
    model: str = "sim"
    url: str | None = None  # base URL; `--url` overrides; absent = the built-in simulator
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
    tokenizer: str | None = None  # a local tokenizer.json for exact prompt token counts
    generic: GenericSpec | None = None  # the `generic` API's framing, body template and paths
    # Each request's id header (target.request_id): its name (None: off) and format
    # (`uuid`, the default, or `counter`: loadgen-<n>); see loadgen.engine.request_ids.
    request_id_header: str | None = "X-Request-Id"
    request_id_format: str = "uuid"
    # Whether the id also goes in a body field (`request_ids.BODY_FIELDS`): auto, on, off.
    request_id_body: str = "auto"
    # The server's Prometheus endpoint, scraped during the run (`--server-metrics-url`): an
    # absolute URL, or a path (`/metrics`) on the target's origin. None: no scraping.
    server_metrics_url: str | None = None
    server_metrics_interval_s: float = 1.0
    # The metrics endpoint's own headers (its credentials when they differ from the target's,
    # which are sent only to the target's origin); `${VAR}` read from the environment.
    server_metrics_headers: Mapping[str, str] = field(default_factory=dict)


METRICS_MS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class SloTargets:
    """One class's objectives: thresholds in ms (None = no target) at one percentile.

    Each threshold is both a per-request limit (for attainment and goodput) and a
    population target at `percentile` (for `met`).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if not 0.0 < self.percentile <= 100.0:
            raise ValueError(f"SLO percentile must be in (0, 100] (got {self.percentile})")
        for name, value in self.thresholds_ms().items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO {name} must be a finite number > 0 (got {value})")

    def thresholds_ms(self) -> dict[str, float]:
        """The thresholds that are set, by metric name (`ttft_ms`, ...), in ms."""
        values = (self.ttft_ms, self.tpot_ms, self.itl_ms, self.e2e_ms)
        return {name: v for name, v in zip(METRICS_MS, values, strict=True) if v is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSpec:
    """Replay a request trace: its arrival times and token counts (`loadgen.workload.traces`)."""

    path: str  # resolved relative to the workload file
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


MAX_EVENT_BYTES_DEFAULT = (
    1 << 20
)  # loadgen.adapters.sse's default, restated: spec imports no decoder


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one response may make the client hold: the longest stream event or line (bytes).

    Past it the request ends as `stream_error` naming the cap, and its connection closes.
    """

    max_event_bytes: int = MAX_EVENT_BYTES_DEFAULT


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSpec:
    """Prompts from a local file (`loadgen.workload.datasets`); nothing is downloaded.

    `turns: first` sends each conversation's first human turn (with any system prompt);
    `turns: all` replays its human turns in order as a session, each carrying the
    conversation so far, whose assistant turns are the model's real answers (`history:
    model`) or the recorded ones (`history: recorded`). Length filters count tokens with
    `target.tokenizer` when it is given, else words.
    """

    path: str  # resolved relative to the workload file
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
    arrival: ArrivalSpec
    requests: int | None  # exactly one of requests / duration_s is set
    duration_s: float | None
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    slo: SloTargets
    deadlines: Deadlines
    limits: Limits = field(default_factory=Limits)
    kind: str = "chat"  # chat | summarization | agent: how the class is judged
    priority: int | None = None  # sent as the body's `priority` (vLLM) or target.priority_header
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
    source: str
    target: TargetSpec
    classes: Mapping[str, ClassSpec]
    seed: int = 0
    cache: str = "cold"  # one of CACHE_MODES
    sim: Mapping[str, Any] = field(default_factory=dict)  # the built-in simulator's profile
    raw: Mapping[str, Any] = field(default_factory=dict)  # the file as parsed, for run.json


class _Node:
    """A mapping with its key path, so every error says where it happened."""

    def __init__(self, source: str, path: str, value: object) -> None:
        if not isinstance(value, Mapping):
            raise ConfigError(
                source, path or "(top level)", f"must be a mapping, got {_kind(value)}"
            )
        self.source, self.path, self.value = source, path, value

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, problem: str, fix: str = "") -> ConfigError:
        return ConfigError(self.source, self.key(name), problem, fix)

    def allow(self, *names: str) -> None:
        """Reject keys not in `names`, suggesting the closest known key."""
        for k in self.value:
            if k not in names:
                close = difflib.get_close_matches(str(k), names, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(names)}"
                raise self.error(str(k), "unknown key", hint)

    def has(self, name: str) -> bool:
        return name in self.value

    def child(self, name: str) -> _Node:
        if name not in self.value:
            raise self.error(name, "is required", f"add a '{name}:' mapping")
        return _Node(self.source, self.key(name), self.value[name])

    def string(
        self, name: str, default: str | None = None, *, choices: tuple[str, ...] = ()
    ) -> str:
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", _choices_fix(choices) or f"add '{name}: ...'")
        if not isinstance(value, str) or not value:
            raise self.error(name, f"must be a non-empty string, got {_kind(value)}")
        if choices and value not in choices:
            raise self.error(name, f"unknown value '{value}'", _choices_fix(choices))
        return value

    def number(
        self, name: str, default: float | None = None, *, positive: bool = False,
        minimum: float = 0, maximum: float = math.inf, why: str = "",
    ) -> float:  # fmt: skip
        """A finite number in range; `why` says where `maximum` comes from."""
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", f"add '{name}: <number>'")
        self._not_quoted(name, value)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.error(name, f"must be a number, got {_kind(value)}")
        self._in_range(name, value, minimum, maximum, why, positive=positive)
        return float(value)

    def integer(
        self, name: str, default: int | None = None, *, minimum: int = 0,
        maximum: float = math.inf, why: str = "",
    ) -> int:  # fmt: skip
        """An integer in range; a whole float (YAML `1e6`) counts as one."""
        value = self.value.get(name, default)
        if value is None:
            raise self.error(name, "is required", f"add '{name}: <integer>'")
        self._not_quoted(name, value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {_kind(value)}")
        self._in_range(name, value, minimum, maximum, why)
        return value

    def _not_quoted(self, name: str, value: object) -> None:
        """A number written as a string (`"1e-12"`, `'40'`) gets the exact fix."""
        if isinstance(value, str) and _NUMBER.match(value.strip()):
            raise self.error(
                name, f"must be a number, got the string {value!r}",
                f"write it without quotes: {name}: {value.strip()}",
            )  # fmt: skip

    def _in_range(
        self, name: str, value: float, minimum: float, maximum: float, why: str,
        *, positive: bool = False,
    ) -> None:  # fmt: skip
        if positive and value <= 0:
            raise self.error(name, f"must be > 0 (got {_num(value)})")
        if value < minimum:
            raise self.error(name, f"must be >= {_num(minimum)} (got {_num(value)})")
        if value > maximum:
            reason = f" ({why})" if why else ""
            raise self.error(name, f"must be <= {_num(maximum)}{reason} (got {_num(value)})")

    def boolean(self, name: str, default: bool) -> bool:
        value = self.value.get(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"[:80]


_NUMBER = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")


def _num(value: float) -> str:
    """A number as a person writes it: `2,678,400`, `0.5`, `1e-12`."""
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:g}"


def _choices_fix(choices: tuple[str, ...]) -> str:
    return f"use one of: {', '.join(choices)}" if choices else ""


def load(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload file (at most `WORKLOAD_MAX_BYTES`, UTF-8)."""
    text = read_text(
        Path(path), cap_bytes=WORKLOAD_MAX_BYTES, what="workload file",
        fix="a workload describes traffic in a few KB; replay request data from a trace "
        "file (arrival: {process: trace, path: ...})",
    )  # fmt: skip
    return loads(text, str(path))


def loads(text: str, source: str = "<workload>") -> WorkloadSpec:
    """Validate workload YAML text; `source` names it in errors.

    YAML 1.2 floats are numbers (`1e-12`), and a document whose aliases would expand past
    the node budget is refused (see `loadgen.workload.inputs`).
    """
    return parse(load_yaml(text, source), source)


def parse(raw: object, source: str) -> WorkloadSpec:
    """Validate an already-parsed workload mapping."""
    top = _Node(source, "", raw)
    top.allow("name", "description", "target", "classes", "seed", "cache", "sim")
    classes_node = top.child("classes")
    if not classes_node.value:
        raise classes_node.error("", "needs at least one class", "add e.g. 'chat: {...}'")
    classes = {
        str(name): _class(classes_node.child(str(name)), str(name)) for name in classes_node.value
    }
    sim = top.value.get("sim") or {}
    if not isinstance(sim, Mapping):
        raise top.error("sim", f"must be a mapping, got {_kind(sim)}")
    spec = WorkloadSpec(
        name=top.string("name"),
        source=source,
        target=_target(top.child("target") if top.has("target") else _Node(source, "target", {})),
        classes=classes,
        seed=top.integer("seed", 0, maximum=MAX_SEED),
        cache=top.string("cache", "cold", choices=CACHE_MODES),
        sim=dict(sim),
        raw=dict(top.value),
    )
    check_schedule(spec)
    return spec


MAX_SEED = 2**63 - 1


def check_schedule(spec: WorkloadSpec, after: str = "") -> None:
    """Every class's schedule fits the ranges (`MAX_SPAN_S`, `MAX_RATE_PER_S`, periods):
    checked on the file and again after the command line's overrides (`after` names them).

    A class bounded by `requests` spans about start_s + (requests − 1) / mean rate; one
    bounded by `duration_s` spans start_s + duration_s. The plans check the real times.
    """
    for name, cls in spec.classes.items():
        key = f"classes.{name}"
        arrival = cls.arrival
        rates = [arrival.rate_per_s, arrival.on_rate_per_s, arrival.off_rate_per_s]
        rates += [rate for rate, _ in arrival.steps]
        if max(rates) > MAX_RATE_PER_S:
            problem = f"a rate of {_num(max(rates))} req/s{after} is over the limit"
            fix = f"at most {_num(MAX_RATE_PER_S)} req/s"
            raise ConfigError(spec.source, f"{key}.arrival", problem, fix)
        span = _expected_span_s(cls)
        if span > MAX_SPAN_S:
            rate = arrival.mean_rate_per_s
            how = (f"{_num(cls.requests)} requests at {_num(rate)} req/s" if cls.requests and rate
                   and cls.duration_s is None else "its schedule")  # fmt: skip
            raise ConfigError(
                spec.source, key, f"{how}{after} would span ~{_span_text(span)} s: "
                f"more than {_num(MAX_SPAN_S)} s ({SPAN_WHY})",
                "raise the rate or lower requests / duration_s / start_s",
            )  # fmt: skip
        if arrival.process == "onoff":
            periods = span / (arrival.on_mean_s + arrival.off_mean_s)
            if periods > MAX_PERIODS:
                raise ConfigError(
                    spec.source, f"{key}.arrival", f"~{_num(round(periods))} on/off periods "
                    f"over its ~{_num(round(span))} s span (limit {_num(MAX_PERIODS)})",
                    "lengthen on_mean_s / off_mean_s",
                )  # fmt: skip


def _span_text(span_s: float) -> str:
    """Whole seconds, unless that would round down to the limit it exceeds."""
    return f"{span_s:,.0f}" if round(span_s) > MAX_SPAN_S else f"{span_s:,.2f}"


def _expected_span_s(cls: ClassSpec) -> float:
    """Seconds from t0 to the class's last intended arrival, on average (0 if unknown)."""
    start = cls.arrival.start_s
    if cls.duration_s is not None:
        return start + cls.duration_s
    rate = cls.arrival.mean_rate_per_s
    if cls.requests is None or cls.concurrency is not None or not rate:
        return start
    if cls.arrival.process == "ramp":
        return start + sum(d for _, d in cls.arrival.steps)
    return start + (cls.requests - 1) / rate


def _target(node: _Node) -> TargetSpec:
    node.allow(
        "api",
        "model",
        "url",
        "path",
        "api_key_env",
        "headers",
        "include_usage",
        "force_output_tokens",
        "allow_early_stops",
        "extra_body",
        "priority_header",
        "tokenizer",
        "generic",
        "request_id",
        "server_metrics_url",
        "server_metrics_interval_s",
        "server_metrics_headers",
    )
    headers = node.value.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise node.error("headers", "must map header names to string values")
    for name, value in headers.items():
        if problem := header_problem(name, value):
            raise node.error(f"headers.{name}", problem)
        if name.lower() in ("authorization", "x-api-key", "api-key"):
            raise node.error(
                f"headers.{name}",
                "secrets must not be written in the workload file",
                "put the key in an environment variable and name it in target.api_key_env",
            )
    extra_body = node.value.get("extra_body") or {}
    if not isinstance(extra_body, Mapping):
        raise node.error("extra_body", "must be a mapping of JSON fields added to every request")
    try:  # as the request body (orjson) and as run.json (json) will be written
        orjson.dumps(extra_body)
        json.dumps(extra_body, allow_nan=False)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        fix = "use strings, numbers, booleans, lists and string-keyed mappings"
        raise node.error("extra_body", f"is not JSON: {exc}", fix) from None
    url = node.value.get("url")
    if url is not None and (problem := url_problem(url)):
        raise node.error("url", problem)
    if node.has("path") and (problem := path_problem(node.string("path"))):
        raise node.error("path", problem)
    metrics_url = node.string("server_metrics_url") if node.has("server_metrics_url") else None
    if metrics_url is not None and (problem := metrics_url_problem(metrics_url)):
        raise node.error("server_metrics_url", problem)
    api = node.string("api", "openai-chat", choices=APIS)
    if api == "generic" and not node.has("path"):
        raise node.error("path", "is required for api: generic", "e.g. path: /v1/generate")
    if api == "generic" and not node.has("generic"):
        raise node.error("generic", "is required for api: generic",
                         "describe the API: see README 'Generic streaming APIs'")  # fmt: skip
    id_header, id_format, id_body = _request_id(node)
    return TargetSpec(
        request_id_header=id_header,
        request_id_format=id_format,
        request_id_body=id_body,
        api=api,
        model=node.string("model", "sim"),
        url=url,
        path=node.string("path") if node.has("path") else None,
        api_key_env=node.string("api_key_env") if node.has("api_key_env") else None,
        headers=dict(headers),
        include_usage=node.boolean("include_usage", True),
        force_output_tokens=node.boolean("force_output_tokens", True),
        allow_early_stops=node.boolean("allow_early_stops", False),
        extra_body=dict(extra_body),
        priority_header=node.string("priority_header") if node.has("priority_header") else None,
        tokenizer=_local_path(node, "tokenizer") if node.has("tokenizer") else None,
        generic=generic_spec(node.value.get("generic"), node.source, node.key("generic"))
        if node.has("generic")
        else None,
        server_metrics_url=metrics_url,
        server_metrics_interval_s=node.number(
            "server_metrics_interval_s", 1.0, minimum=0.05, maximum=3600
        ),
        server_metrics_headers=_metrics_headers(node),
    )


def _metrics_headers(node: _Node) -> dict[str, str]:
    """`target.server_metrics_headers`: names to string values; a credential's value must be
    read from the environment (`${VAR}`), never written in the file."""
    headers = node.value.get("server_metrics_headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise node.error("server_metrics_headers", "must map header names to string values",
                         "e.g. {Authorization: 'Bearer ${METRICS_TOKEN}'}")  # fmt: skip
    for name, value in headers.items():
        key = f"server_metrics_headers.{name}"
        if problem := header_problem(name, value):
            raise node.error(key, problem)
        if CREDENTIAL_NAMES.search(name) and not ENV_REFERENCE.search(value):
            raise node.error(
                key, "secrets must not be written in the workload file",
                f"read it from the environment: {name}: 'Bearer ${{METRICS_TOKEN}}', "
                "and export METRICS_TOKEN=... before the run",
            )  # fmt: skip
    return dict(headers)


def metrics_url_problem(url: str) -> str:
    """What is wrong with a server-metrics URL (absolute, or a path on the target), or ""."""
    if url.startswith("/"):
        return path_problem(url)
    problem = url_problem(url)
    return f"{problem}, or a path such as /metrics on the target" if problem else ""


REQUEST_ID_FORMATS = ("uuid", "counter")
REQUEST_ID_BODY = ("auto", "on", "off")  # loadgen.engine.request_ids.BODY_FIELDS


def _request_id(node: _Node) -> tuple[str | None, str, str]:
    """`request_id: off`, or `{header: X-Request-Id, format: uuid|counter, body:
    auto|on|off}` (each optional)."""
    raw = node.value.get("request_id", {})
    fix = "e.g. request_id: {header: X-Request-Id, format: uuid, body: auto}, or request_id: off"
    if raw is False or raw == "off":
        return None, "uuid", "off"
    if not isinstance(raw, Mapping) or set(raw) - {"header", "format", "body"}:
        raise node.error("request_id", f"must be off or a mapping of header, format and body "
                         f"(got {raw!r})", fix)  # fmt: skip
    body = raw.get("body", "auto")
    body = {True: "on", False: "off"}.get(body, body) if isinstance(body, bool) else body
    if body not in REQUEST_ID_BODY:
        raise node.error("request_id.body", f"must be auto, on or off (got {body!r})", fix)
    header = raw.get("header", "X-Request-Id")
    if not isinstance(header, str) or header_problem(header, "x"):
        raise node.error("request_id.header", f"is not a header name ({header!r})", fix)
    fmt = raw.get("format", "uuid")
    if fmt not in REQUEST_ID_FORMATS:
        raise node.error("request_id.format", f"must be uuid or counter (got {fmt!r})", fix)
    return header, str(fmt), str(body)


def url_problem(url: object) -> str:
    """What is wrong with a base URL (scheme, host, port), or "" if nothing."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return f"must look like http://host:port or https://host:port (got {url!r:.80})"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number in 0-65535, a bad IPv6 literal
        return f"is not a valid URL ({exc}), e.g. http://127.0.0.1:8000 (got {url!r:.80})"
    if not parts.hostname:
        return f"has no host, e.g. http://127.0.0.1:8000 (got {url!r:.80})"
    if port == 0:
        return f"has port 0: the port must be 1-65535 (got {url!r:.80})"
    if any(c in url for c in "\r\n\t\x00 ") or not url.isascii():
        return (f"must be ASCII without spaces or control characters (percent-encode "
                f"others) (got {url!r:.80})")  # fmt: skip
    if problem := host_problem(parts.hostname):
        return f"{problem} (got {url!r:.80})"
    hostport = parts.netloc.rpartition("@")[2].lower()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    rest = hostport.removeprefix(host.lower())
    if rest == hostport or not re.fullmatch(r"(:[0-9]*)?", rest):  # 127.[::1], [::1]x:80
        return f"has a host and port that do not parse ({hostport:.60}) (got {url!r:.80})"
    return ""


_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def host_problem(host: str) -> str:
    """What is wrong with a URL's host (an IPv4 address past 255, a bad IPv6 literal, an
    empty or over-long DNS label), or "": what every client that connects would refuse."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return f"has host [{host:.60}], which is not an IPv6 address"
        return ""
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return (f"has host {host:.60}, which is not an IPv4 address (four numbers "
                    "0-255, e.g. 127.0.0.1)")  # fmt: skip
        return ""
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return (f"has host {host:.60}, which is not a host name (dot-separated labels of "
                "1-63 letters, digits, - and _)")  # fmt: skip
    return ""


# Header names that carry credentials (engine.secrets redacts their values; a metrics
# header so named must read its value from the environment), and a `${VAR}` reference.
CREDENTIAL_NAMES = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.IGNORECASE)
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field-name characters


def header_problem(name: str, value: str) -> str:
    """What is wrong with a request header (a name that is not a token, a value with CR/LF
    that would inject another header), or "" if nothing."""
    if not _TOKEN.match(name):
        return f"{name!r:.60} is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
    if any(c in value for c in "\r\n\x00"):
        return "a header value must not contain CR, LF or NUL"
    try:
        value.encode("latin-1")  # how the request head is written
    except UnicodeEncodeError:
        return "a header value must be ASCII (or Latin-1) text"
    return ""


def path_problem(path: str) -> str:
    """What is wrong with a request path (it goes into the request line as is), or ""."""
    if not path.startswith("/") or not path.isascii() or any(c in path for c in " \r\n\t\x00"):
        rule = "must start with / and be ASCII without spaces (percent-encode others)"
        return f"{rule} (got {path!r:.80})"
    return ""


def _not_a_file(node: _Node, key: str, resolved: Path) -> None:
    """Refuse a path that exists but is no regular file (not "not found": it is there)."""
    if resolved.is_dir():
        raise node.error(key, f"{resolved} is a directory, not a file", "name the file in it")
    if resolved.exists() and not resolved.is_file():
        raise node.error(
            key, f"{resolved} is not a regular file (a device, FIFO or socket)",
            "give a file on disk: loadgen reads it whole, and a device never ends",
        )  # fmt: skip


def _local_path(node: _Node, key: str) -> str:
    """A file path relative to the workload file; it must be a regular file."""
    path = Path(node.string(key))
    resolved = path if path.is_absolute() else Path(node.source).parent / path
    _not_a_file(node, key, resolved)
    if not resolved.is_file():
        raise node.error(
            key, f"file {resolved} not found", "paths are relative to the workload file"
        )
    return str(resolved)


KIND_KEYS = {
    "chat": ("turns", "think_time_s", "system_prompt_tokens"),
    "summarization": ("concurrency", "batch_deadline_s"),
    "agent": ("hops", "tool_time_s", "trajectory_budget_s", "tool_result_tokens", "context",
              "fanout", "system_prompt_tokens"),
}  # fmt: skip
COMMON_CLASS_KEYS = (
    "kind", "arrival", "requests", "duration_s", "prompt_tokens", "output_tokens", "slo",
    "deadlines", "priority", "limits", "dataset", "prompt", "model", "models",
)  # fmt: skip


def _class(node: _Node, name: str) -> ClassSpec:
    kind = node.string("kind", "chat", choices=CLASS_KINDS)
    node.allow(*COMMON_CLASS_KEYS, *KIND_KEYS[kind])
    arrival = _arrival(node.child("arrival"), node.source)
    has_requests, has_duration = node.has("requests"), node.has("duration_s")
    bounded_by_itself = arrival.process in ("ramp", "trace")
    if (has_requests and has_duration) or not (has_requests or has_duration or bounded_by_itself):
        raise node.error(
            "requests", "exactly one of 'requests' or 'duration_s' must be set",
            "e.g. 'requests: 100' or 'duration_s: 60'",
        )  # fmt: skip
    if arrival.process == "ramp" and not has_requests and not has_duration:
        has_duration = True  # the ramp's own length
    concurrency = (
        node.integer("concurrency", minimum=1, maximum=MAX_CONCURRENCY)
        if node.has("concurrency") else None
    )  # fmt: skip
    if concurrency is not None and not has_requests:
        raise node.error("requests", "a closed-loop batch (concurrency) needs 'requests' documents")
    agent_trace = arrival.trace is not None and arrival.trace.format == "agent"
    if agent_trace:
        _check_agent_trace(node, kind, arrival)
    elif arrival.process == "trace" and (kind == "agent" or node.has("turns") or concurrency):
        what = "turns" if node.has("turns") else "concurrency" if concurrency else "kind: agent"
        raise node.error(
            "arrival.process", f"a trace cannot drive {what}: each trace row is one request",
            "replay the trace as a chat class without turns, or give this class its own arrivals",
        )  # fmt: skip
    empty = _Node(node.source, node.key("slo"), {})

    def optional(key: str) -> _Node | None:
        return node.child(key) if node.has(key) else None

    turns, think, hops, tool = (
        optional(k) for k in ("turns", "think_time_s", "hops", "tool_time_s")
    )
    dataset = _dataset(node.child("dataset")) if node.has("dataset") else None
    shared_prefix = _shared_prefix(node.child("prompt")) if node.has("prompt") else None
    from_dataset = node.value.get("output_tokens") == "from_dataset"
    _check_sources(node, kind, arrival, dataset, shared_prefix, from_dataset)
    return ClassSpec(
        name=name,
        kind=kind,
        arrival=arrival,
        requests=node.integer(
            "requests", minimum=1, maximum=MAX_REQUESTS, why="per class"
        ) if has_requests else None,
        duration_s=(
            node.number("duration_s", positive=True, maximum=MAX_SPAN_S, why=SPAN_WHY)
            if node.has("duration_s")
            else sum(d for _, d in arrival.steps) if has_duration else None
        ),
        prompt_tokens=_prompt_lengths(node, arrival, dataset, shared_prefix),
        output_tokens=LengthDist(dist="fixed", value=1) if from_dataset
        else _length(node.child("output_tokens")) if node.has("output_tokens") or
        arrival.process != "trace" else LengthDist(dist="fixed", value=1),
        slo=_slo(node.child("slo") if node.has("slo") else empty),
        deadlines=_deadlines(
            node.child("deadlines") if node.has("deadlines")
            else _Node(node.source, node.key("deadlines"), {})
        ),
        priority=node.integer("priority", minimum=-(2**31), maximum=2**31 - 1)
        if node.has("priority") else None,
        limits=_limits(node.child("limits")) if node.has("limits") else Limits(),
        turns=_length(turns, MAX_TURNS) if turns else None,
        think_time_s=_seconds(think) if think else None,
        system_prompt_tokens=node.integer("system_prompt_tokens", 0, maximum=MAX_TOKENS),
        hops=_length(hops, MAX_TURNS) if hops else (DEFAULT_HOPS if kind == "agent" else None),
        tool_time_s=_seconds(tool) if tool else None,
        trajectory_budget_s=_optional_number(node, "trajectory_budget_s"),
        concurrency=concurrency,
        batch_deadline_s=_optional_number(node, "batch_deadline_s"),
        dataset=dataset,
        output_from_dataset=from_dataset,
        shared_prefix=shared_prefix,
        models=_models(node),
        tool_result_tokens=_length(node.child("tool_result_tokens"))
        if node.has("tool_result_tokens") else None,
        context=_context(node.child("context")) if node.has("context") else ContextSpec(),
        fanout=_fanout(node, hops) if node.has("fanout") else None,
    )  # fmt: skip


DEFAULT_HOPS = LengthDist(dist="fixed", value=8)


def _check_agent_trace(node: _Node, kind: str, arrival: ArrivalSpec) -> None:
    """`format: agent` replays recorded trajectories: an agent class, whose hops and
    fan-outs come from the trace; only speed, window_s and limit (trajectories) apply."""
    if kind != "agent":
        raise node.error("arrival.format", "an agent trace replays trajectories",
                         "use it in a class with kind: agent")  # fmt: skip
    for key in ("hops", "fanout"):
        if node.has(key):
            raise node.error(key, "the agent trace sets each trajectory's hops and fan-outs",
                             f"remove '{key}'")  # fmt: skip
    trace = arrival.trace
    assert trace is not None
    if trace.rate_scale != 1 or trace.spread_s or trace.include_failed:
        raise node.error("arrival", "an agent trace replays each trajectory once, as recorded",
                         "use speed, window_s and limit; drop rate_scale, spread_s and "
                         "include_failed")  # fmt: skip


def _check_sources(
    node: _Node, kind: str, arrival: ArrivalSpec, dataset: DatasetSpec | None,
    shared_prefix: SharedPrefixSpec | None, from_dataset: bool,
) -> None:  # fmt: skip
    """One source of prompts per class: lengths, a dataset, a shared-prefix set or a trace."""
    if dataset is not None and shared_prefix is not None:
        raise node.error("prompt", "a class takes its prompts from 'dataset' or 'prompt', "
                         "not both", "give this class one of them")  # fmt: skip
    given = dataset is not None or shared_prefix is not None
    if given and node.has("prompt_tokens"):
        source = "dataset" if dataset is not None else "prompt"
        raise node.error("prompt_tokens", f"the prompts come from '{source}': prompt_tokens "
                         "would be ignored", "remove prompt_tokens")  # fmt: skip
    if given and arrival.process == "trace":
        raise node.error(
            "arrival.process",
            "a trace brings its own prompt lengths",
            "drop 'dataset'/'prompt', or give this class its own arrivals",
        )
    if from_dataset and dataset is None:
        raise node.error(
            "output_tokens",
            "'from_dataset' needs a 'dataset'",
            "add dataset: {path: ..., format: ...}, or give a distribution",
        )
    if dataset is not None and dataset.turns == "all" and (kind != "chat" or node.has("turns")):
        raise node.error("dataset.turns", "'turns: all' replays each conversation as a "
                         "chat session: the conversation sets the turns",
                         "use kind: chat without 'turns:'")  # fmt: skip
    if dataset is not None and kind == "agent":
        raise node.error("dataset", "an agent's prompts are built from its trajectory",
                         "replay a dataset in a chat or summarization class")  # fmt: skip


def _prompt_lengths(
    node: _Node, arrival: ArrivalSpec, dataset: DatasetSpec | None,
    shared_prefix: SharedPrefixSpec | None,
) -> LengthDist:  # fmt: skip
    """The class's prompt length distribution (a dataset's is known only once it is read:
    a placeholder of 1, never sampled)."""
    if shared_prefix is not None:
        suffix = shared_prefix.suffix_tokens
        return replace(suffix, value=suffix.value + shared_prefix.shared_prefix_tokens,
                       mean=suffix.mean + shared_prefix.shared_prefix_tokens,
                       min=suffix.min + shared_prefix.shared_prefix_tokens,
                       max=suffix.max + shared_prefix.shared_prefix_tokens)  # fmt: skip
    if dataset is not None or (arrival.process == "trace" and not node.has("prompt_tokens")):
        return LengthDist(dist="fixed", value=1)
    return _length(node.child("prompt_tokens"))


DATASET_KEYS = (
    "path", "format", "prompt_field", "messages_field", "answer_field", "output_tokens_field",
    "sample", "replacement", "limit", "prompt_tokens", "output_tokens", "turns", "history",
)  # fmt: skip


def _dataset(node: _Node) -> DatasetSpec:
    node.allow(*DATASET_KEYS)
    path = _local_path(node, "path")
    size = Path(path).stat().st_size
    if size > TRACE_MAX_BYTES:
        raise node.error("path", f"dataset {path} is {size_text(size)}: over the "
                         f"{size_text(TRACE_MAX_BYTES)} cap (a dataset is read whole)",
                         "cut the rows you replay into a smaller file")  # fmt: skip
    fields = {key: node.string(key) if node.has(key) else None
              for key in ("prompt_field", "messages_field", "answer_field",
                          "output_tokens_field")}  # fmt: skip
    prompt_range = _token_range(node, "prompt_tokens")
    output_range = _token_range(node, "output_tokens")
    return DatasetSpec(
        path=path,
        format=node.string("format", choices=DATASET_FORMATS),
        **fields,
        sample=node.string("sample", "random", choices=DATASET_SAMPLES),
        replacement=node.boolean("replacement", False),
        limit=node.integer("limit", minimum=1, maximum=MAX_REQUESTS) if node.has("limit") else None,
        min_prompt_tokens=prompt_range[0], max_prompt_tokens=prompt_range[1],
        min_output_tokens=output_range[0], max_output_tokens=output_range[1],
        turns=node.string("turns", "first", choices=("first", "all")),
        history=node.string("history", "model", choices=("model", "recorded")),
    )  # fmt: skip


def _token_range(node: _Node, key: str) -> tuple[int, int]:
    """A dataset filter `{min, max}` in tokens (words without a tokenizer)."""
    if not node.has(key):
        return 1, MAX_TOKENS
    child = node.child(key)
    child.allow("min", "max")
    lo = child.integer("min", 1, minimum=1, maximum=MAX_TOKENS)
    hi = child.integer("max", MAX_TOKENS, minimum=1, maximum=MAX_TOKENS)
    if hi < lo:
        raise child.error("max", f"must be >= min ({lo}), got {hi}")
    return lo, hi


def _shared_prefix(node: _Node) -> SharedPrefixSpec:
    node.allow("shared_prefix_tokens", "groups", "suffix_tokens")
    return SharedPrefixSpec(
        shared_prefix_tokens=node.integer("shared_prefix_tokens", minimum=1, maximum=MAX_TOKENS),
        groups=node.integer("groups", minimum=1, maximum=MAX_REQUESTS),
        suffix_tokens=_length(node.child("suffix_tokens")),
    )


def _models(node: _Node) -> tuple[tuple[str, float], ...]:
    """`model: name` or `models: [{name, weight}]` (weights relative, default 1)."""
    if node.has("model") and node.has("models"):
        raise node.error("models", "give 'model' or 'models', not both")
    if node.has("model"):
        return ((node.string("model"), 1.0),)
    if not node.has("models"):
        return ()
    items = node.value["models"]
    fix = "e.g. models: [{name: base, weight: 3}, {name: lora-a, weight: 1}]"
    if not isinstance(items, list) or not items:
        raise node.error("models", f"must be a non-empty list, got {_kind(items)}", fix)
    if len(items) > MAX_MODELS:
        raise node.error("models", f"at most {MAX_MODELS:,} models (got {len(items):,})")
    result: list[tuple[str, float]] = []
    for index, item in enumerate(items):
        entry = _Node(node.source, node.key(f"models[{index}]"), item)
        entry.allow("name", "weight")
        name = entry.string("name")
        if any(name == seen for seen, _ in result):
            raise entry.error("name", f"model {name!r} is listed twice", "merge the weights")
        result.append((name, entry.number("weight", 1.0, positive=True, maximum=1e12)))
    return tuple(result)


def _context(node: _Node) -> ContextSpec:
    node.allow("grow", "max_tokens", "overflow", "summary_tokens")
    spec = ContextSpec(
        grow=node.boolean("grow", True),
        max_tokens=node.integer("max_tokens", minimum=1, maximum=MAX_TOKENS)
        if node.has("max_tokens") else None,
        overflow=node.string("overflow", "drop_oldest", choices=CONTEXT_OVERFLOW),
        summary_tokens=node.integer("summary_tokens", 200, minimum=1, maximum=MAX_TOKENS),
    )  # fmt: skip
    if spec.max_tokens is not None and not spec.grow:
        raise node.error("max_tokens", "a fixed context (grow: false) has nothing to cap")
    if (
        spec.max_tokens is not None
        and spec.overflow == "summarize"
        and (spec.summary_tokens >= spec.max_tokens)
    ):
        raise node.error("summary_tokens", f"must be < max_tokens ({spec.max_tokens})")
    return spec


def _fanout(node: _Node, hops: _Node | None) -> FanoutSpec:
    child = node.child("fanout")
    child.allow("at_hop", "branches")
    fanout = FanoutSpec(at_hop=child.integer("at_hop", minimum=0, maximum=MAX_TURNS),
                        branches=child.integer("branches", minimum=2, maximum=1_000))  # fmt: skip
    length = _length(hops, MAX_TURNS) if hops else DEFAULT_HOPS
    fewest = length.value if length.dist == "fixed" else length.min
    if fanout.at_hop >= fewest:
        raise child.error("at_hop", f"must be < the fewest hops a trajectory has ({fewest})",
                          "hops count from 0")  # fmt: skip
    return fanout


def _optional_number(node: _Node, key: str) -> float | None:
    return _seconds_key(node, key) if node.has(key) else None


def _seconds_key(node: _Node, key: str, default: float | None = None, *,
                 positive: bool = True) -> float:  # fmt: skip
    """A duration in seconds: > 0 (or >= 0), at most `MAX_SPAN_S`."""
    return node.number(key, default, positive=positive, maximum=MAX_SPAN_S, why=SPAN_WHY)


def _rate_key(node: _Node, key: str, *, positive: bool = True) -> float:
    """A rate in req/s, at most `MAX_RATE_PER_S`."""
    default = None if positive else 0.0
    return node.number(key, default, positive=positive, maximum=MAX_RATE_PER_S)


ARRIVAL_KEYS = {
    "constant": ("rate_per_s",),
    "poisson": ("rate_per_s",),
    "gamma": ("rate_per_s", "cv"),
    "onoff": ("on_rate_per_s", "off_rate_per_s", "on_mean_s", "off_mean_s"),
    "ramp": ("steps",),
    "trace": ("path", "format", "window_s", "speed", "rate_scale", "spread_s", "include_failed",
              "limit"),
}  # fmt: skip


def _arrival(node: _Node, source: str) -> ArrivalSpec:
    process = node.string("process", choices=ARRIVAL_PROCESSES)
    node.allow("process", "start_s", *ARRIVAL_KEYS[process])
    start_s = _seconds_key(node, "start_s", 0.0, positive=False)
    if process in ("constant", "poisson", "gamma"):
        return ArrivalSpec(
            process=process,
            rate_per_s=_rate_key(node, "rate_per_s"),
            cv=node.number("cv", 1.0, minimum=MIN_CV, maximum=MAX_CV),
            start_s=start_s,
        )
    if process == "onoff":
        return ArrivalSpec(
            process=process,
            start_s=start_s,
            on_rate_per_s=_rate_key(node, "on_rate_per_s"),
            off_rate_per_s=_rate_key(node, "off_rate_per_s", positive=False),
            on_mean_s=_seconds_key(node, "on_mean_s"),
            off_mean_s=_seconds_key(node, "off_mean_s"),
        )
    if process == "ramp":
        return ArrivalSpec(process=process, start_s=start_s, steps=_ramp_steps(node))
    return ArrivalSpec(process=process, start_s=start_s, trace=_trace(node, source))


def _ramp_steps(node: _Node) -> tuple[tuple[float, float], ...]:
    steps = node.value.get("steps")
    if not isinstance(steps, list) or not steps:
        raise node.error(
            "steps",
            "must be a non-empty list",
            "e.g. steps: [{rate_per_s: 2, duration_s: 30}, {rate_per_s: 4, duration_s: 30}]",
        )
    result = []
    for index, item in enumerate(steps):
        step = _Node(node.source, node.key(f"steps[{index}]"), item)
        step.allow("rate_per_s", "duration_s")
        result.append((_rate_key(step, "rate_per_s", positive=False),
                       _seconds_key(step, "duration_s")))  # fmt: skip
    if not any(rate > 0 for rate, _ in result):
        raise node.error("steps", "every step has rate 0: nothing would be sent")
    total = sum(d for _, d in result)
    if total > MAX_SPAN_S:
        raise node.error("steps", f"the steps last {_num(total)} s: more than "
                         f"{_num(MAX_SPAN_S)} s ({SPAN_WHY})")  # fmt: skip
    return tuple(result)


def _trace(node: _Node, source: str) -> TraceSpec:
    path = node.string("path")
    base = Path(source).parent
    resolved = (base / path) if not Path(path).is_absolute() else Path(path)
    _not_a_file(node, "path", resolved)
    if not resolved.is_file():
        raise node.error("path", f"trace file {resolved} not found",
                         "paths are relative to the workload file")  # fmt: skip
    size = resolved.stat().st_size
    if size > TRACE_MAX_BYTES:
        raise node.error(
            "path", f"trace file {resolved} is {size_text(size)}: over the "
            f"{size_text(TRACE_MAX_BYTES)} cap (a trace is read whole)",
            "cut the rows you replay into a smaller file (window_s still reads the whole file)",
        )  # fmt: skip
    start, end = _trace_window(node)
    return TraceSpec(
        path=str(resolved),
        format=node.string("format", "auto", choices=TRACE_FORMATS),
        start_s=start,
        end_s=end,
        speed=node.number("speed", 1.0, positive=True, maximum=MAX_RATE_PER_S),
        rate_scale=node.number(
            "rate_scale", 1.0, positive=True, maximum=MAX_RATE_SCALE, why="copies superposed"
        ),
        spread_s=_seconds_key(node, "spread_s", 0.0, positive=False),
        include_failed=node.boolean("include_failed", False),
        limit=node.integer("limit", minimum=1, maximum=MAX_REQUESTS) if node.has("limit") else None,
    )


def _trace_window(node: _Node) -> tuple[float, float | None]:
    """`window_s: [start, end]` in seconds of the trace, or the whole trace."""
    window = node.value.get("window_s")
    if window is None:
        return 0.0, None
    fix = "e.g. window_s: [0, 600] (seconds of the trace)"
    if not (isinstance(window, list) and len(window) == 2):
        raise node.error("window_s", f"must be [start, end], got {_kind(window)}", fix)
    pair = _Node(node.source, node.key("window_s"), {"[0]": window[0], "[1]": window[1]})
    limit = 100 * MAX_SPAN_S  # trace seconds: the replay is then divided by speed
    start, end = (pair.number(k, maximum=limit) for k in ("[0]", "[1]"))
    if end <= start:
        raise node.error("window_s", f"end must be after start (got {window})", fix)
    return start, end


def _seconds(node: _Node) -> SecondsDist:
    dist = node.string("dist", choices=LENGTH_DISTS)
    allowed = {
        "fixed": ("value",),
        "uniform": ("min", "max"),
        "lognormal": ("mean", "cv", "min", "max"),
        "exponential": ("mean", "min", "max"),
    }[dist]
    node.allow("dist", *allowed)
    lo = _seconds_key(node, "min", 0.0, positive=False)
    hi = _seconds_key(node, "max", 86_400.0, positive=False)
    if hi < lo:
        raise node.error("max", f"must be >= min ({lo}), got {hi}")
    lognormal_or_exp = dist in ("lognormal", "exponential")
    return SecondsDist(
        dist=dist,
        value=_seconds_key(node, "value", 0.0, positive=False) if dist == "fixed" else 0.0,
        mean=_seconds_key(node, "mean") if lognormal_or_exp else 0.0,
        cv=node.number("cv", positive=True, maximum=MAX_CV) if dist == "lognormal" else 1.0,
        min=lo,
        max=hi,
    )


def _length(node: _Node, maximum: int = MAX_TOKENS) -> LengthDist:
    dist = node.string("dist", choices=LENGTH_DISTS)
    allowed = {
        "fixed": ("value",),
        "uniform": ("min", "max"),
        "lognormal": ("mean", "cv", "min", "max"),
        "exponential": ("mean", "min", "max"),
    }[dist]
    node.allow("dist", *allowed)
    lo = node.integer("min", 1, minimum=1, maximum=maximum)
    hi = node.integer("max", min(1_000_000, maximum), minimum=1, maximum=maximum)
    if dist == "uniform" and not (node.has("min") and node.has("max")):
        raise node.error("min", "uniform needs both 'min' and 'max'")
    if hi < lo:
        raise node.error("max", f"must be >= min ({lo}), got {hi}")
    lognormal_or_exp = dist in ("lognormal", "exponential")
    return LengthDist(
        dist=dist,
        value=node.integer("value", minimum=1, maximum=maximum) if dist == "fixed" else 0,
        mean=node.number("mean", positive=True, maximum=maximum) if lognormal_or_exp else 0.0,
        cv=node.number("cv", positive=True, maximum=MAX_CV) if dist == "lognormal" else 1.0,
        min=lo,
        max=hi,
    )


def _slo(node: _Node) -> SloTargets:
    node.allow("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "percentile")
    percentile = node.number("percentile", 99.0, positive=True)
    if percentile > 100:
        raise node.error("percentile", f"must be in (0, 100] (got {percentile})")

    def opt(key: str) -> float | None:
        if not node.has(key):
            return None
        return node.number(key, positive=True, maximum=MAX_SPAN_S * 1000.0, why=SPAN_WHY)

    return SloTargets(
        ttft_ms=opt("ttft_ms"),
        tpot_ms=opt("tpot_ms"),
        itl_ms=opt("itl_ms"),
        e2e_ms=opt("e2e_ms"),
        percentile=percentile,
    )


def _deadlines(node: _Node) -> Deadlines:
    """The three deadlines; an unset first-token or stall deadline is the default, but never
    longer than `total_s`, and a set one longer than `total_s` is an error: it could never
    fire (the total deadline ends the request first)."""
    node.allow("first_token_s", "stall_s", "total_s")
    default = Deadlines()
    total = _seconds_key(node, "total_s", default.total_s)
    values = {}
    for key in ("first_token_s", "stall_s"):
        if not node.has(key):
            values[key] = min(getattr(default, key), total)
            continue
        values[key] = _seconds_key(node, key)
        if values[key] > total:
            how = f"total_s: {_num(total)}" if node.has("total_s") else \
                f"total_s (default {_num(total)})"  # fmt: skip
            raise node.error(
                key, f"{_num(values[key])} s is longer than {how}: it can never fire, the "
                "total deadline ends the request first",
                f"make {key} <= total_s, or raise total_s",
            )  # fmt: skip
    return Deadlines(total_s=total, **values)


def _limits(node: _Node) -> Limits:
    node.allow("max_event_bytes")
    size = node.integer("max_event_bytes", MAX_EVENT_BYTES_DEFAULT, minimum=64)
    if size > 1 << 30:
        raise node.error("max_event_bytes", f"must be at most 1 GiB (got {size})")
    return Limits(max_event_bytes=size)


def override(
    spec: WorkloadSpec,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    rate: str | None = None,
    api: str | None = None,
    model: str | None = None,
    force_output_tokens: bool | None = None,
    cache: str | None = None,
) -> WorkloadSpec:
    """The spec with the command line's `--requests`, `--duration`, `--rate`, `--api`,
    `--model`, `--force-output-tokens` and `--cache` applied.

    `requests` replaces every class's count; `duration_s` every open-loop class's duration
    (a closed-loop batch, `concurrency`, keeps its `requests` documents: it has no arrivals
    to last for a duration; a spec of batches only is refused). `rate` is either a
    multiplier (`2x`, `0.5x`) applied to every class's rate, or a total rate in req/s that
    every class is scaled to in proportion to its own rate. `api` replaces `target.api`
    (the request path then follows the new API unless `target.path` is set); `model` and
    `force_output_tokens` replace theirs.
    """
    if requests is not None and duration_s is not None:
        raise ConfigError("command line", "--requests/--duration", "give one, not both")
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        raise ConfigError("command line", "--requests",
                          f"must be 1 to {_num(MAX_REQUESTS)} (got {_num(requests)})")  # fmt: skip
    if duration_s is not None and not 0 < duration_s <= MAX_SPAN_S:
        raise ConfigError("command line", "--duration", f"must be > 0 and <= {_num(MAX_SPAN_S)}"
                          f" s ({SPAN_WHY}) (got {duration_s:g})")  # fmt: skip
    if duration_s is not None and all(c.concurrency is not None for c in spec.classes.values()):
        batches = ", ".join(f"{name}: {c.requests} documents, {c.concurrency} in flight"
                            for name, c in spec.classes.items())  # fmt: skip
        raise ConfigError("command line", "--duration",
                          f"every class of {spec.source} is a closed-loop batch ({batches}), "
                          "which sends its documents, not arrivals for a duration",
                          "give --requests N (documents per class) instead")  # fmt: skip
    spec = replace(spec, target=_override_target(spec, api, model, force_output_tokens))
    if cache is not None:
        if cache not in CACHE_MODES:
            raise ConfigError("command line", "--cache", f"unknown mode {cache!r}",
                              f"one of {', '.join(CACHE_MODES)}")  # fmt: skip
        spec = replace(spec, cache=cache)
    scale = rate_scale(spec, rate) if rate else 1.0
    classes = {}
    for name, cls in spec.classes.items():
        count, duration = cls.requests, cls.duration_s
        if requests is not None:
            count, duration = requests, None
        elif duration_s is not None and cls.concurrency is None:
            count, duration = None, duration_s
        classes[name] = replace(
            cls, arrival=cls.arrival.scaled(scale), requests=count, duration_s=duration
        )
    spec = replace(spec, classes=classes)
    given = [flag for flag, value in (("--requests", requests), ("--duration", duration_s),
                                      ("--rate", rate)) if value is not None]  # fmt: skip
    if given:
        check_schedule(spec, after=f" with {'/'.join(given)}")
    return spec


def _override_target(
    spec: WorkloadSpec, api: str | None, model: str | None, force_output_tokens: bool | None
) -> TargetSpec:
    """The target with the command line's API, model and output-length forcing."""
    target = spec.target
    if api is not None and api != target.api:
        if api not in APIS:
            raise ConfigError("command line", "--api", f"unknown API {api!r}",
                              f"one of {', '.join(APIS)}")  # fmt: skip
        if api == "generic" and (target.generic is None or target.path is None):
            raise ConfigError(
                "command line", "--api generic",
                f"{spec.source} has no target.generic section and target.path",
                "describe the API in the workload file (see README 'Generic streaming APIs')",
            )  # fmt: skip
        target = replace(target, api=api)
    if model is not None:
        target = replace(target, model=model)
    if force_output_tokens is not None:
        target = replace(target, force_output_tokens=force_output_tokens)
    return target


def rate_scale(spec: WorkloadSpec, rate: str) -> float:
    """The factor `--rate` applies to every class's rate (see `override`)."""
    text = rate.strip().lower()
    try:
        value = float(text[:-1]) if text.endswith("x") else float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            "command line",
            "--rate",
            f"must be a positive number or multiplier (got {rate!r})",
            "e.g. --rate 8 (total req/s) or --rate 2x",
        )
    if text.endswith("x"):
        return value
    rates = [cls.arrival.mean_rate_per_s for cls in spec.classes.values()]
    if any(r is None for r in rates):
        raise ConfigError(
            "command line", "--rate", "a total rate cannot be split over trace-replay classes",
            "use a multiplier such as --rate 2x",
        )  # fmt: skip
    return value / sum(r for r in rates if r is not None)
