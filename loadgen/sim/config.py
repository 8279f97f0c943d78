"""The simulator's settings: one table of keys shared by CLI flags, `--config` YAML and `sim:`.

A key is a flag name with underscores (`--max-batch` ↔ `max_batch`). Every value is
validated here, at the boundary, into a frozen `SimConfig`; a bad value raises
`ConfigError(source, key, problem, fix)`. Values may arrive as YAML natives or as CLI
strings; the parsers accept both.

Faults and dialects (see `loadgen.sim.faults` for the per-request headers):

* `faults` maps a fault name to the probability that a request gets it
  (`--fault stall=0.01`, repeatable; YAML `faults: {stall: 0.01}`). Names:
  `drop_after`, `stall`, `status`, `garbage_after`, `error_after`, `header_delay`,
  `cut_after`. Their parameters: `fault_after_tokens` (k for drop/stall/garbage/error/
  cut; unset = uniform over the request's output), `stall_s`, `fault_status`, `header_delay_s`.
* Dialect settings apply to every request: `role`, `no_done`, `usage_in_finish`,
  `tokens_per_chunk`, `reasoning_tokens`, `heartbeat_s`, `close_after_stream`,
  `empty_every`, `per_request_metrics`.
* `api`: `all` (default) serves every dialect on its own path; one API name serves only
  that dialect, on its paths and on `/` (see `loadgen.sim.dialects`).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadgen.errors import ConfigError
from loadgen.sim.engine import DecodeTable, EngineConfig

FAULT_NAMES = ("drop_after", "stall", "status", "garbage_after", "error_after", "header_delay",
               "cut_after")  # fmt: skip
ROLE_MODES = ("early", "first", "none")
OUTPUT_DIST_KINDS = ("fixed", "exponential", "lognormal")
API_NAMES = (
    *("all", "openai", "openai-chat", "openai-completions", "openai-responses", "anthropic"),
    *("tgi", "ollama", "ollama-chat", "ollama-generate"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputDist:
    """Distribution of a request's natural output length in tokens (before max_tokens)."""

    kind: str = "fixed"
    mean_tokens: float = 300.0
    cv: float = 1.0  # lognormal only: standard deviation / mean

    def sample(self, rng: random.Random) -> int:
        """One output length, at least 1 token."""
        if self.kind == "exponential":
            value = rng.expovariate(1.0 / self.mean_tokens)
        elif self.kind == "lognormal":
            sigma2 = math.log(1.0 + self.cv**2)
            mu = math.log(self.mean_tokens) - sigma2 / 2.0
            value = rng.lognormvariate(mu, math.sqrt(sigma2))
        else:
            value = self.mean_tokens
        return max(1, round(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """How every stream is shaped, mimicking one real server or another."""

    role: str = "first"  # early | first | none
    no_done: bool = False
    usage_in_finish: bool = False
    tokens_per_chunk: int = 1
    reasoning_tokens: int = 0
    heartbeat_s: float = 0.0  # simulated seconds; 0 = no heartbeats
    close_after_stream: bool = False
    # Every k-th token after the first goes out as an empty-text token event (OpenAI,
    # TGI), as llama-cpp-python sends tokens that end inside a UTF-8 character; 0 = never.
    empty_every: int = 0
    # The end the closing events say, verbatim in the dialect's stop field, in place of its
    # own word for the planned end (OpenAI `finish_reason`, Anthropic `stop_reason`, Ollama
    # `done_reason`; Responses: see `loadgen.sim.responses.END_KINDS`); "" = the dialect's.
    finish_word: str = ""
    # Anthropic: `message_start` says `input_tokens: 0` and `message_delta.usage` carries
    # the real count, as LiteLLM's proxy sends it.
    input_usage_late: bool = False
    # OpenAI: vLLM's per-request `metrics` object (`--enable-per-request-metrics`) in the final
    # usage chunk, from the engine's own queue, prefill and generation times.
    per_request_metrics: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRates:
    """Global fault probabilities and their parameters."""

    probabilities: tuple[tuple[str, float], ...] = ()
    after_tokens: int | None = None  # None = uniform over the request's output
    stall_s: float = 2.0
    status: int = 503
    header_delay_s: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Everything the simulator needs, validated."""

    host: str = "127.0.0.1"
    port: int = 8000
    engine: EngineConfig = field(default_factory=EngineConfig)
    speed: float = 1.0
    output_dist: OutputDist = field(default_factory=OutputDist)
    dialect: Dialect = field(default_factory=Dialect)
    faults: FaultRates = field(default_factory=FaultRates)
    trace_file: Path | None = None
    otlp_traces_endpoint: str | None = None  # spans to this OTLP/HTTP URL (`loadgen.sim.spans`)
    seed: int = 0
    model: str = "loadgen-sim"
    api: str = "all"
    prefix_cache_tokens: int = 0  # prefix cache capacity; 0 = no prefix cache
    prefix_block_tokens: int = 16  # its block size (vLLM's default block size)
    kv_capacity_tokens: int = 262_144  # the denominator of vllm:kv_cache_usage_perc


def _int(value: object, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be an integer (got {value!r})")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"must be an integer (got {value!r})") from None
    if number < minimum or (maximum is not None and number > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"must be >= {minimum}{upper} (got {number})")
    return number


def _float(value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a number (got {value!r})")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"must be a number (got {value!r})") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"must be {'> 0' if positive else '>= 0'} (got {value!r})")
    return number


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "1", "yes", "false", "0", "no"}:
        return value.lower() in {"true", "1", "yes"}
    raise ValueError(f"must be true or false (got {value!r})")


def _str(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string (got {value!r})")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)} (got {value!r})")
        return str(value)

    return parse


def parse_decode_table(value: object) -> DecodeTable:
    """`"16:20,32:30,64:55"`, a single number (flat), or a YAML mapping {batch: ms}."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return DecodeTable(((1, _float(value, positive=True)),))
    pairs: list[tuple[object, object]]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str) and ":" not in value:
        return DecodeTable(((1, _float(value.strip(), positive=True)),))
    elif isinstance(value, str):
        pairs = [tuple(p.split(":", 1)) for p in value.split(",") if p.strip()]  # type: ignore[misc]
    else:
        raise ValueError(f"must be 'B:MS,B:MS,...' or a number (got {value!r})")
    points = sorted((_int(b, 1), _float(ms, positive=True)) for b, ms in pairs)
    if not points or len({b for b, _ in points}) != len(points):
        raise ValueError(f"needs distinct batch sizes (got {value!r})")
    return DecodeTable(tuple(points))


def format_decode_table(table: DecodeTable) -> str:
    """The CLI form of a decode table, e.g. "16:20,32:30,64:55"."""
    return ",".join(f"{b}:{ms:g}" for b, ms in table.points)


def parse_output_dist(value: object) -> OutputDist:
    """`fixed:300`, `exponential:mean=200`, `lognormal:mean=200,cv=1` (or a bare number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return OutputDist(kind="fixed", mean_tokens=_float(value, positive=True))
    if not isinstance(value, str):
        raise ValueError(f"must be a string like 'lognormal:mean=200,cv=1' (got {value!r})")
    kind, _, rest = value.partition(":")
    if kind.replace(".", "").isdigit() and not rest:
        kind, rest = "fixed", kind
    if kind not in OUTPUT_DIST_KINDS:
        raise ValueError(f"kind must be one of {', '.join(OUTPUT_DIST_KINDS)} (got {value!r})")
    params: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        name, eq, number = part.partition("=")
        if not eq and kind == "fixed":
            name, number = "mean", name
        if name not in {"mean", "cv"}:
            raise ValueError(f"unknown parameter {name!r} (use mean= and, for lognormal, cv=)")
        params[name] = _float(number, positive=True)
    if "mean" not in params:
        raise ValueError(f"needs a mean, e.g. '{kind}:mean=200' (got {value!r})")
    return OutputDist(kind=kind, mean_tokens=params["mean"], cv=params.get("cv", 1.0))


def parse_faults(value: object) -> dict[str, float]:
    """A mapping {name: probability}, or CLI `NAME=PROB` strings (one or a list)."""
    items: list[tuple[object, object]]
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str | list | tuple):
        specs = [value] if isinstance(value, str) else list(value)
        items = []
        for spec in specs:
            spec_name, eq, spec_prob = str(spec).partition("=")
            if not eq:
                raise ValueError(f"must be NAME=PROB (got {spec!r})")
            items.append((spec_name.strip(), spec_prob.strip()))
    else:
        raise ValueError(f"must be a mapping of fault name to probability (got {value!r})")
    faults: dict[str, float] = {}
    for name, prob in items:
        if name not in FAULT_NAMES:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(FAULT_NAMES)})")
        p = _float(prob)
        if p > 1:
            raise ValueError(f"probability for {name} must be in [0, 1] (got {prob!r})")
        faults[str(name)] = p
    return faults


def _path(value: object) -> Path:
    return Path(_str(value))


SETTINGS: dict[str, tuple[Callable[[object], Any], str]] = {
    "host": (_str, "an address such as 127.0.0.1"),
    "port": (lambda v: _int(v, 0, 65535), "a TCP port; 0 picks a free one"),
    "prefill_tokens_per_s": (lambda v: _float(v, positive=True), "tokens per second, e.g. 8000"),
    "decode_table": (parse_decode_table, "e.g. '16:20,32:30,64:55' or a number"),
    "max_batch": (lambda v: _int(v, 1), "an integer >= 1"),
    "chunk_tokens": (_int, "an integer >= 0; 0 = whole prompts"),
    "queue_cap": (_int, "an integer >= 0; 0 = no cap"),
    "prefill_replicas": (_int, "an integer >= 0; 0 = colocated prefill"),
    "kv_transfer_ms": (_float, "milliseconds >= 0"),
    "speed": (lambda v: _float(v, positive=True), "a time scale > 0; 10 = ten times faster"),
    "output_dist": (parse_output_dist, "e.g. 'fixed:300' or 'lognormal:mean=200,cv=1'"),
    "seed": (_int, "an integer >= 0"),
    "model": (_str, "the model id to report"),
    "api": (_choice(API_NAMES), f"one of {', '.join(API_NAMES)}"),
    "trace_file": (_path, "a file path for the JSON Lines trace"),
    "otlp_traces_endpoint": (_str, "an OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces"),
    "faults": (parse_faults, f"names: {', '.join(FAULT_NAMES)}; probabilities in [0, 1]"),
    "fault_after_tokens": (_int, "an integer >= 0"),
    "stall_s": (_float, "simulated seconds >= 0"),
    "fault_status": (lambda v: _int(v, 100, 599), "an HTTP status such as 503"),
    "header_delay_s": (_float, "simulated seconds >= 0"),
    "role": (_choice(ROLE_MODES), f"one of {', '.join(ROLE_MODES)}"),
    "no_done": (_bool, "true or false"),
    "usage_in_finish": (_bool, "true or false"),
    "per_request_metrics": (_bool, "true or false"),
    "tokens_per_chunk": (lambda v: _int(v, 1), "an integer >= 1"),
    "reasoning_tokens": (_int, "an integer >= 0"),
    "heartbeat_s": (_float, "simulated seconds >= 0; 0 = none"),
    "close_after_stream": (_bool, "true or false"),
    "empty_every": (_int, "an integer >= 0"),
    "prefix_cache_tokens": (_int, "tokens >= 0; 0 = no prefix cache"),
    "prefix_block_tokens": (lambda v: _int(v, 1), "tokens per cache block, >= 1 (e.g. 16)"),
    "kv_capacity_tokens": (lambda v: _int(v, 1), "KV-cache tokens >= 1 (e.g. 262144)"),
}


# A key's old name -> its name now (`plan --decode-step-ms` is one step time, a table is
# `--decode-table` everywhere). The old name still works and says its new one on stderr.
RENAMED = {"decode_step_ms": "decode_table"}
_SAID: set[tuple[str, str]] = set()  # (source, old key) already warned about


def validate(mapping: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """Parse every key of `mapping`; unknown keys and bad values raise `ConfigError`; a key
    under its old name (`RENAMED`) is read as its new one, saying so on stderr."""
    parsed: dict[str, Any] = {}
    for old_key, raw in mapping.items():
        key = RENAMED.get(str(old_key), str(old_key))
        if key != old_key:
            if key in mapping:
                raise ConfigError(source, f"{prefix}{old_key}", f"is the old name of {prefix}{key}",
                                  "give one of them")  # fmt: skip
            if (source, old_key) not in _SAID:  # once per file, though it is read twice
                _SAID.add((source, str(old_key)))
                print(f"warning: {source}: {prefix}{old_key} is deprecated: its new name is "
                      f"{prefix}{key} (the old one still works)", file=sys.stderr)  # fmt: skip
        entry = SETTINGS.get(str(key))
        if entry is None:
            known = ", ".join(sorted(SETTINGS))
            raise ConfigError(source, f"{prefix}{key}", "unknown key", f"known keys: {known}")
        parse, fix = entry
        try:
            parsed[str(key)] = parse(raw)
        except ValueError as exc:
            raise ConfigError(source, f"{prefix}{key}", str(exc), fix) from None
    return parsed


def config_from_mapping(mapping: Mapping[str, Any], source: str) -> SimConfig:
    """Build a `SimConfig` from settings (defaults: the serving model's default parameter set)."""
    v = validate(mapping, source)
    engine = EngineConfig()
    engine = EngineConfig(
        prefill_tokens_per_s=v.get("prefill_tokens_per_s", engine.prefill_tokens_per_s),
        decode_table=v.get("decode_table", engine.decode_table),
        max_batch=v.get("max_batch", engine.max_batch),
        chunk_tokens=v.get("chunk_tokens", engine.chunk_tokens),
        queue_cap=v.get("queue_cap", engine.queue_cap),
        prefill_replicas=v.get("prefill_replicas", engine.prefill_replicas),
        kv_transfer_ms=v.get("kv_transfer_ms", engine.kv_transfer_ms),
    )
    dialect_keys = set(Dialect.__dataclass_fields__)
    dialect = Dialect(**{k: val for k, val in v.items() if k in dialect_keys})
    rates = FaultRates()
    faults = FaultRates(
        probabilities=tuple(sorted(v.get("faults", {}).items())),
        after_tokens=v.get("fault_after_tokens"),
        stall_s=v.get("stall_s", rates.stall_s),
        status=v.get("fault_status", rates.status),
        header_delay_s=v.get("header_delay_s", rates.header_delay_s),
    )
    base = SimConfig()
    return SimConfig(
        host=v.get("host", base.host),
        port=v.get("port", base.port),
        engine=engine,
        speed=v.get("speed", base.speed),
        output_dist=v.get("output_dist", base.output_dist),
        dialect=dialect,
        faults=faults,
        trace_file=v.get("trace_file"),
        otlp_traces_endpoint=v.get("otlp_traces_endpoint"),
        seed=v.get("seed", base.seed),
        model=v.get("model", base.model),
        api=v.get("api", base.api),
        prefix_cache_tokens=v.get("prefix_cache_tokens", base.prefix_cache_tokens),
        prefix_block_tokens=v.get("prefix_block_tokens", base.prefix_block_tokens),
        kv_capacity_tokens=v.get("kv_capacity_tokens", base.kv_capacity_tokens),
    )


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a `--config` YAML file: a mapping of settings keys."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read: {exc.strerror}", "check the path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"invalid YAML: {exc}", "fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", "must be a mapping of settings", "e.g. 'max_batch: 32'")
    return data
