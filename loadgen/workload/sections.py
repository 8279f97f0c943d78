"""The sections of a workload class, each read from its mapping into its dataclass: the
arrival process (and a trace to replay), length and duration distributions, SLOs,
deadlines, limits, a prompt dataset or shared-prefix set, a model mix, an agent's context
and fan-out. `workload.parse` reads the class around them.

A section's keys are its dataclass's fields (`node.file_keys`), so the file and the model
cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES
from loadgen.workload.checks import number_text
from loadgen.workload.inputs import TRACE_MAX_BYTES, size_text
from loadgen.workload.model import (
    ARRIVAL_PROCESSES,
    CONTEXT_OVERFLOW,
    DATASET_FORMATS,
    DATASET_SAMPLES,
    DEFAULT_CONFIDENCE,
    DEFAULT_HOPS,
    LENGTH_DISTS,
    MAX_CV,
    MAX_MODELS,
    MAX_RATE_PER_S,
    MAX_RATE_SCALE,
    MAX_REQUESTS,
    MAX_SPAN_S,
    MAX_TOKENS,
    MAX_TURNS,
    METRICS_MS,
    MIN_CONFIDENCE,
    MIN_CV,
    SPAN_WHY,
    TRACE_FORMATS,
    ArrivalSpec,
    ContextSpec,
    DatasetSpec,
    Deadlines,
    FanoutSpec,
    LengthDist,
    Limits,
    SecondsDist,
    SharedPrefixSpec,
    SloTargets,
    TraceSpec,
)
from loadgen.workload.node import Node, file_keys, kind_of, local_file, not_a_file

DATASET_KEYS = file_keys(DatasetSpec, {
    "min_prompt_tokens": ("prompt_tokens",), "max_prompt_tokens": ("prompt_tokens",),
    "min_output_tokens": ("output_tokens",), "max_output_tokens": ("output_tokens",),
})  # fmt: skip


def dataset(node: Node) -> DatasetSpec:
    node.allow(*DATASET_KEYS)
    path = local_file(node, "path")
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


def _token_range(node: Node, key: str) -> tuple[int, int]:
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


def shared_prefix(node: Node) -> SharedPrefixSpec:
    node.allow(*file_keys(SharedPrefixSpec))
    return SharedPrefixSpec(
        shared_prefix_tokens=node.integer("shared_prefix_tokens", minimum=1, maximum=MAX_TOKENS),
        groups=node.integer("groups", minimum=1, maximum=MAX_REQUESTS),
        suffix_tokens=length(node.child("suffix_tokens")),
    )


def models(node: Node) -> tuple[tuple[str, float], ...]:
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
        raise node.error("models", f"must be a non-empty list, got {kind_of(items)}", fix)
    if len(items) > MAX_MODELS:
        raise node.error("models", f"at most {MAX_MODELS:,} models (got {len(items):,})")
    result: list[tuple[str, float]] = []
    for index, item in enumerate(items):
        entry = Node(node.source, node.key(f"models[{index}]"), item)
        entry.allow("name", "weight")
        name = entry.string("name")
        if any(name == seen for seen, _ in result):
            raise entry.error("name", f"model {name!r} is listed twice", "merge the weights")
        result.append((name, entry.number("weight", 1.0, positive=True, maximum=1e12)))
    return tuple(result)


def context(node: Node) -> ContextSpec:
    node.allow(*file_keys(ContextSpec))
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


def fanout(node: Node, hops: Node | None) -> FanoutSpec:
    child = node.child("fanout")
    child.allow(*file_keys(FanoutSpec))
    fanout = FanoutSpec(at_hop=child.integer("at_hop", minimum=0, maximum=MAX_TURNS),
                        branches=child.integer("branches", minimum=2, maximum=1_000))  # fmt: skip
    dist = length(hops, MAX_TURNS) if hops else DEFAULT_HOPS
    fewest = dist.value if dist.dist == "fixed" else dist.min
    if fanout.at_hop >= fewest:
        raise child.error("at_hop", f"must be < the fewest hops a trajectory has ({fewest})",
                          "hops count from 0")  # fmt: skip
    return fanout


def optional_seconds(node: Node, key: str) -> float | None:
    return _seconds_key(node, key) if node.has(key) else None


def _seconds_key(node: Node, key: str, default: float | None = None, *,
                 positive: bool = True) -> float:  # fmt: skip
    """A duration in seconds: > 0 (or >= 0), at most `MAX_SPAN_S`."""
    return node.number(key, default, positive=positive, maximum=MAX_SPAN_S, why=SPAN_WHY)


def _rate_key(node: Node, key: str, *, positive: bool = True) -> float:
    """A rate in req/s, at most `MAX_RATE_PER_S`."""
    default = None if positive else 0.0
    return node.number(key, default, positive=positive, maximum=MAX_RATE_PER_S)


ARRIVAL_KEYS = {
    "constant": ("rate_per_s",),
    "poisson": ("rate_per_s",),
    "gamma": ("rate_per_s", "cv"),
    "onoff": ("on_rate_per_s", "off_rate_per_s", "on_mean_s", "off_mean_s"),
    "ramp": ("steps",),
    "trace": file_keys(TraceSpec, {"start_s": ("window_s",), "end_s": ("window_s",)}),
}


def arrival(node: Node, source: str) -> ArrivalSpec:
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


def _ramp_steps(node: Node) -> tuple[tuple[float, float], ...]:
    steps = node.value.get("steps")
    if not isinstance(steps, list) or not steps:
        raise node.error(
            "steps",
            "must be a non-empty list",
            "e.g. steps: [{rate_per_s: 2, duration_s: 30}, {rate_per_s: 4, duration_s: 30}]",
        )
    result = []
    for index, item in enumerate(steps):
        step = Node(node.source, node.key(f"steps[{index}]"), item)
        step.allow("rate_per_s", "duration_s")
        result.append((_rate_key(step, "rate_per_s", positive=False),
                       _seconds_key(step, "duration_s")))  # fmt: skip
    if not any(rate > 0 for rate, _ in result):
        raise node.error("steps", "every step has rate 0: nothing would be sent")
    total = sum(d for _, d in result)
    if total > MAX_SPAN_S:
        raise node.error("steps", f"the steps last {number_text(total)} s: more than "
                         f"{number_text(MAX_SPAN_S)} s ({SPAN_WHY})")  # fmt: skip
    return tuple(result)


def _trace(node: Node, source: str) -> TraceSpec:
    path = node.string("path")
    base = Path(source).parent
    resolved = (base / path) if not Path(path).is_absolute() else Path(path)
    not_a_file(node, "path", resolved)
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


def _trace_window(node: Node) -> tuple[float, float | None]:
    """`window_s: [start, end]` in seconds of the trace, or the whole trace."""
    window = node.value.get("window_s")
    if window is None:
        return 0.0, None
    fix = "e.g. window_s: [0, 600] (seconds of the trace)"
    if not (isinstance(window, list) and len(window) == 2):
        raise node.error("window_s", f"must be [start, end], got {kind_of(window)}", fix)
    pair = Node(node.source, node.key("window_s"), {"[0]": window[0], "[1]": window[1]})
    limit = 100 * MAX_SPAN_S  # trace seconds: the replay is then divided by speed
    start, end = (pair.number(k, maximum=limit) for k in ("[0]", "[1]"))
    if end <= start:
        raise node.error("window_s", f"end must be after start (got {window})", fix)
    return start, end


# The parameters of each distribution (of LengthDist's and SecondsDist's fields).
DIST_KEYS = {
    "fixed": ("value",),
    "uniform": ("min", "max"),
    "lognormal": ("mean", "cv", "min", "max"),
    "exponential": ("mean", "min", "max"),
}


def seconds(node: Node) -> SecondsDist:
    dist = node.string("dist", choices=LENGTH_DISTS)
    node.allow("dist", *DIST_KEYS[dist])
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


def length(node: Node, maximum: int = MAX_TOKENS) -> LengthDist:
    dist = node.string("dist", choices=LENGTH_DISTS)
    node.allow("dist", *DIST_KEYS[dist])
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


def slo(node: Node) -> SloTargets:
    node.allow(*file_keys(SloTargets))
    percentile = node.number("percentile", 99.0, positive=True)
    if percentile > 100:
        raise node.error("percentile", f"must be in (0, 100] (got {percentile})")

    def opt(key: str) -> float | None:
        if not node.has(key):
            return None
        return node.number(key, positive=True, maximum=MAX_SPAN_S * 1000.0, why=SPAN_WHY)

    confidence = node.number("confidence", DEFAULT_CONFIDENCE)
    if not MIN_CONFIDENCE < confidence < 1.0:
        raise node.error(
            "confidence", f"must be in ({MIN_CONFIDENCE:g}, 1) (got {confidence:g})",
            "e.g. 0.95: MET and MISSED are each wrong at most 5 % of the time",
        )  # fmt: skip
    thresholds = {name: opt(name) for name in METRICS_MS}  # each measure's, None: unset
    return SloTargets(**thresholds, percentile=percentile, confidence=confidence)


def deadlines(node: Node) -> Deadlines:
    """The three deadlines; an unset first-token or stall deadline is the default, but never
    longer than `total_s`, and a set one longer than `total_s` is an error: it could never
    fire (the total deadline ends the request first)."""
    node.allow(*file_keys(Deadlines))
    default = Deadlines()
    total = _seconds_key(node, "total_s", default.total_s)
    values = {}
    for key in ("first_token_s", "stall_s"):
        if not node.has(key):
            values[key] = min(getattr(default, key), total)
            continue
        values[key] = _seconds_key(node, key)
        if values[key] > total:
            how = f"total_s: {number_text(total)}" if node.has("total_s") else \
                f"total_s (default {number_text(total)})"  # fmt: skip
            raise node.error(
                key, f"{number_text(values[key])} s is longer than {how}: it can never fire, the "
                "total deadline ends the request first",
                f"make {key} <= total_s, or raise total_s",
            )  # fmt: skip
    return Deadlines(total_s=total, **values)


def limits(node: Node) -> Limits:
    node.allow(*file_keys(Limits))
    size = node.integer("max_event_bytes", DEFAULT_MAX_EVENT_BYTES, minimum=64)
    if size > 1 << 30:
        raise node.error("max_event_bytes", f"must be at most 1 GiB (got {size})")
    return Limits(max_event_bytes=size)
