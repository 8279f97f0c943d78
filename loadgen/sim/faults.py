"""Per-request fault and dialect plan: request headers first, then global random draws.

Headers (names exact, values as shown; seconds are simulated, divided by `--speed`):

| header | effect |
|---|---|
| `X-Sim-Drop-After: k` | close (FIN, body unterminated) after k content tokens; 0 = after headers |
| `X-Sim-Stall: k:S` | after k tokens the sequence pauses S s (keeps its slot), then goes on |
| `X-Sim-Status: 503` | answer that status at once with the dialect's error body |
| `X-Sim-Garbage-After: k` | after k tokens write bytes the dialect cannot decode, then end |
| `X-Sim-Error-After: k` | after k tokens the dialect's own error event, then end the body |
| `X-Sim-Cut-After: k` | after k tokens a clean end with no stop reason (see below) |
| `X-Sim-Stop-After: k` | stop after k tokens with reason `stop`, even if the length was forced |
| `X-Sim-Empty-Every: k` | every k-th token after the first as an empty-text token event |
| `X-Sim-Header-Delay-S: S` | hold the response headers S s before the request reaches the engine |
| `X-Sim-Heartbeat-S: S` | a heartbeat (`: ping` comment; Anthropic `ping`) every S s |
| `X-Sim-Role: early\\|first\\|none` | opening event at accept, with token 1 (default), or never |
| `X-Sim-No-Done: 1` | no `data: [DONE]` (OpenAI) / no `message_stop` (Anthropic) |
| `X-Sim-Usage-In-Finish: 1` | usage in the finish chunk instead of a separate chunk |
| `X-Sim-Tokens-Per-Chunk: k` | k tokens per content chunk |
| `X-Sim-Reasoning-Tokens: k` | the first k tokens go out as the dialect's reasoning deltas |
| `X-Sim-Close-After-Stream: 1` | close the connection after the response despite keep-alive |
| `X-Sim-Finish: word` | the closing events say `word` as the stop reason (see below) |
| `X-Sim-Gateway-Cut: k` | after k tokens a normal end with a usage of its own (see below) |
| `X-Sim-Input-Usage-Late: 1` | Anthropic: input tokens only in `message_delta` (0 at start) |
| `X-Sim-Metrics: 1` | OpenAI: vLLM's per-request `metrics` in the final usage chunk |

A cut ends the body cleanly after the dialect's bare terminator: OpenAI `[DONE]` with no
finish chunk (as llama-cpp-python's server ends a stream it interrupts), Anthropic
`message_stop` with no `message_delta`; TGI, Ollama and Responses just end (no details, no
`done: true`, no terminal event). Empty-text token events exist in OpenAI and TGI only.

`X-Sim-Finish` puts its word verbatim in the dialect's stop field: OpenAI `finish_reason`
(`abort` as vLLM ends an aborted request), Anthropic `stop_reason` (`max_tokens`,
`stop_sequence`, `tool_use`, `refusal`, `pause_turn`), Ollama `done_reason`; for Responses
it names the end (`completed`, `incomplete`: `response.completed` with status `incomplete`
and reason `max_output_tokens` as vLLM and llama-server send it, `incomplete-event`:
`response.incomplete` as OpenAI sends it, `cancelled`: `response.completed` with status
`cancelled` as vLLM ends an aborted request, `failed`: `response.failed`); TGI ignores it.

A gateway cut is what LiteLLM's proxy sends when its upstream drops mid-stream: the
dialect's normal end (OpenAI `finish_reason: stop` + usage + `[DONE]`, Anthropic
`end_turn` + `message_stop`, Responses `response.completed`) after k tokens, with a usage it
made up: output tokens k·9 // 7 (more than arrived: 966 chunks claimed as 1241) and prompt
tokens p·9 // 14 of the real p (14 claimed as 9), the ratios of one captured stream.

Per dialect (see `loadgen.sim.dialects`): "opening event" is the OpenAI chat role chunk,
Anthropic `message_start`, Responses `response.created` + `response.in_progress`, an empty
Ollama message; TGI has none. NDJSON (Ollama) has no heartbeat.

A header overrides the global setting of the same fault. Global faults (`SimConfig.faults`)
are drawn per request with their probability; `after_tokens` unset means k is uniform over
the request's output.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loadgen.sim.config import ROLE_MODES, Dialect, FaultRates


class BadFaultHeader(ValueError):
    """An `X-Sim-*` header has a value the simulator cannot use (answered with 400)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """What one request will experience; `applied` is what the trace records."""

    status: int | None = None
    drop_after: int | None = None
    stall_after: int = -1
    stall_s: float = 0.0
    garbage_after: int | None = None
    error_after: int | None = None
    cut_after: int | None = None
    gateway_cut: int | None = None
    stop_after: int | None = None
    header_delay_s: float = 0.0
    dialect: Dialect = field(default_factory=Dialect)
    applied: dict[str, Any] = field(default_factory=dict)


def _k(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be >= 0")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError("must be >= 0")
    return number


def _stall(value: str) -> tuple[int, float]:
    k, sep, seconds = value.partition(":")
    if not sep:
        raise ValueError("must be k:S")
    return _k(k), _seconds(seconds)


def _status(value: str) -> int:
    number = int(value)
    if not 100 <= number <= 599:
        raise ValueError("must be an HTTP status")
    return number


def _role(value: str) -> str:
    if value not in ROLE_MODES:
        raise ValueError(f"must be one of {', '.join(ROLE_MODES)}")
    return value


def _flag(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes"}


_HEADERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "x-sim-drop-after": ("drop_after", _k),
    "x-sim-stall": ("stall", _stall),
    "x-sim-status": ("status", _status),
    "x-sim-garbage-after": ("garbage_after", _k),
    "x-sim-error-after": ("error_after", _k),
    "x-sim-cut-after": ("cut_after", _k),
    "x-sim-stop-after": ("stop_after", lambda v: max(1, _k(v))),
    "x-sim-empty-every": ("empty_every", _k),
    "x-sim-header-delay-s": ("header_delay", _seconds),
    "x-sim-heartbeat-s": ("heartbeat_s", _seconds),
    "x-sim-role": ("role", _role),
    "x-sim-no-done": ("no_done", _flag),
    "x-sim-usage-in-finish": ("usage_in_finish", _flag),
    "x-sim-tokens-per-chunk": ("tokens_per_chunk", lambda v: max(1, _k(v))),
    "x-sim-reasoning-tokens": ("reasoning_tokens", _k),
    "x-sim-close-after-stream": ("close_after_stream", _flag),
    "x-sim-finish": ("finish_word", str),
    "x-sim-gateway-cut": ("gateway_cut", _k),
    "x-sim-input-usage-late": ("input_usage_late", _flag),
    "x-sim-metrics": ("per_request_metrics", _flag),
}
_DIALECT_KEYS = frozenset(Dialect.__dataclass_fields__)


def _from_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for header, (name, parse) in _HEADERS.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            found[name] = parse(raw.strip())
        except ValueError as exc:
            raise BadFaultHeader(f"header {header}: {raw!r} {exc}") from None
    return found


def _draw(rates: FaultRates, rng: random.Random, output_tokens: int) -> dict[str, Any]:
    """Global faults this request gets, by probability, with their parameters."""
    drawn: dict[str, Any] = {}
    for name, probability in rates.probabilities:
        if probability <= 0 or rng.random() >= probability:
            continue
        k = rates.after_tokens
        if k is None:
            k = rng.randrange(output_tokens)
        values: dict[str, Any] = {
            "drop_after": k,
            "garbage_after": k,
            "error_after": k,
            "cut_after": k,
            "stall": (k, rates.stall_s),
            "status": rates.status,
            "header_delay": rates.header_delay_s,
        }
        drawn[name] = values[name]
    return drawn


def plan_faults(
    headers: Mapping[str, str],
    dialect: Dialect,
    rates: FaultRates,
    rng: random.Random,
    output_tokens: int,
) -> FaultPlan:
    """Merge header faults over global draws; raises `BadFaultHeader` for bad values."""
    from_headers = _from_headers(headers)
    chosen = (
        {**_draw(rates, rng, output_tokens), **from_headers}
        if rates.probabilities
        else (from_headers)
    )
    if not chosen:
        return FaultPlan(dialect=dialect)
    dialect_overrides = {k: v for k, v in chosen.items() if k in _DIALECT_KEYS}
    stall = chosen.get("stall", (-1, 0.0))
    applied = {
        name: {
            "value": list(v) if isinstance(v, tuple) else v,
            "by": "header" if name in from_headers else "random",
        }
        for name, v in chosen.items()
    }
    return FaultPlan(
        status=chosen.get("status"),
        drop_after=chosen.get("drop_after"),
        stall_after=stall[0],
        stall_s=stall[1],
        garbage_after=chosen.get("garbage_after"),
        error_after=chosen.get("error_after"),
        cut_after=chosen.get("cut_after"),
        gateway_cut=chosen.get("gateway_cut"),
        stop_after=chosen.get("stop_after"),
        header_delay_s=chosen.get("header_delay", 0.0),
        dialect=Dialect(**{**_dialect_dict(dialect), **dialect_overrides}),
        applied=applied,
    )


def _dialect_dict(dialect: Dialect) -> dict[str, Any]:
    return {name: getattr(dialect, name) for name in _DIALECT_KEYS}
