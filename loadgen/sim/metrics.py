"""The simulator's `/metrics`: its true internal state in vLLM's Prometheus names.

Written by hand in the Prometheus text format (version 0.0.4), so the client's parser is
checked against an exposition it shares no code with. Names and meanings follow vLLM's V1
engine (vllm/v1/metrics/loggers.py; docs.vllm.ai "Production Metrics"): gauges are read
from the engine at the moment of the scrape, counters count since the simulator started.

| name | type | what the simulator puts there |
|---|---|---|
| vllm:num_requests_waiting | gauge | requests submitted and not yet holding a batch slot |
| vllm:num_requests_running | gauge | sequences holding a slot (prefilling, decoding, stalled) |
| vllm:kv_cache_usage_perc | gauge | KV tokens held / `kv_capacity_tokens` (see below) |
| vllm:num_preemptions_total | counter | 0: the simulator never preempts |
| vllm:prompt_tokens_total | counter | prompt tokens of requests whose prefill finished |
| vllm:generation_tokens_total | counter | tokens emitted by the engine |
| vllm:request_success_total | counter | streams finished, by `finished_reason` (length, stop) |
| vllm:prefix_cache_queries_total | counter | prompt tokens looked up in the prefix cache |
| vllm:prefix_cache_hits_total | counter | of them, found |
| vllm:time_to_first_token_seconds | histogram | received → first token, simulated seconds |
| vllm:inter_token_latency_seconds | histogram | token after a first: engine time since the last |

Inter-token latency is the engine's time between a request's two tokens, the simulated
ends of the steps that emitted them (vLLM times its iterations, not the stream's writes).
Simulated seconds are real seconds × `speed`, the physics' own time. KV usage is 0..1, and
above 1 when `kv_capacity_tokens` is set below what the batch holds (the simulator never
preempts). Prompt tokens include the cached ones, as vLLM counts them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen.sim.engine import EngineState

# vLLM's buckets for time_to_first_token_seconds (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)

# vLLM's buckets for inter_token_latency_seconds (and time_per_output_token_seconds, its
# older name, same buckets and meaning: vllm/v1/metrics/loggers.py).
ITL_BUCKETS_S = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)


@dataclass(slots=True)
class Histogram:
    """A cumulative Prometheus histogram (bucket counts kept per bucket, summed on output)."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass(slots=True)
class SimCounters:
    """Counters since start; the server bumps them as requests progress."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    success: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))


def exposition(
    state: EngineState,
    counters: SimCounters,
    *,
    kv_capacity_tokens: int,
    cache_queries: int,
    cache_hits: int,
    model: str,
) -> bytes:
    """The text a scrape of `/metrics` returns."""
    label = f'model_name="{_escape(model)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for suffix_labels, value in samples:
            out.append(f"{suffix_labels} {_number(value)}")

    def one(name: str, value: float) -> list[tuple[str, float]]:
        return [(f"{name}{{{label}}}", value)]

    usage = state.kv_tokens / kv_capacity_tokens
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           one("vllm:num_requests_waiting", state.waiting))  # fmt: skip
    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           one("vllm:num_requests_running", state.running))  # fmt: skip
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           one("vllm:kv_cache_usage_perc", usage))  # fmt: skip
    counter_rows = (
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", counters.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.",
         counters.generation_tokens),
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
         "tokens.", cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         cache_hits),
    )  # fmt: skip
    for name, help_text, value in counter_rows:
        metric(name, "counter", help_text, one(f"{name}_total", value))
    success = [
        (f'vllm:request_success_total{{finished_reason="{reason}",{label}}}', float(n))
        for reason, n in sorted(counters.success.items())
    ]
    metric("vllm:request_success", "counter", "Count of successfully processed requests.",
           success)  # fmt: skip
    ttft = "vllm:time_to_first_token_seconds"
    metric(ttft, "histogram", "Histogram of time to first token in seconds.",
           _histogram(ttft, counters.ttft, label))  # fmt: skip
    itl = "vllm:inter_token_latency_seconds"
    metric(itl, "histogram", "Histogram of inter-token latency in seconds.",
           _histogram(itl, counters.itl, label))  # fmt: skip
    return ("\n".join(out) + "\n").encode()


def _histogram(name: str, hist: Histogram, label: str) -> list[tuple[str, float]]:
    rows: list[tuple[str, float]] = []
    running = 0
    counts = hist.counts or [0] * len(hist.bounds)
    for bound, n in zip(hist.bounds, counts, strict=True):
        running += n
        rows.append((f'{name}_bucket{{le="{_number(bound)}",{label}}}', running))
    rows.append((f'{name}_bucket{{le="+Inf",{label}}}', hist.count))
    rows.append((f"{name}_sum{{{label}}}", hist.total))
    rows.append((f"{name}_count{{{label}}}", hist.count))
    return rows


def _number(value: float) -> str:
    return repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
