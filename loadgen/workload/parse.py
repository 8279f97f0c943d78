"""A workload file read into its model: YAML → `WorkloadSpec`, validated before any traffic.

First stage of the pipeline (workload YAML → spec → arrivals → plans → engine). Every
error names the file, the key path, what is wrong and how to fix it, as a `ConfigError`;
the CLI turns it into exit code 1 without a traceback. Secrets never live here: the API
key is read from the environment variable the file names (`target.api_key_env`).

Here: the top level, the target and each class as a whole (which keys its kind takes,
how long it runs, where its prompts come from); the class's sections are read by
`workload.sections`. Every mapping's keys are its dataclass's fields (`node.file_keys`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import orjson

from loadgen.adapters import APIS
from loadgen.adapters.generic import GenericSpec, generic_spec
from loadgen.workload import sections
from loadgen.workload.checks import (
    ACCEPT_ENCODING_FIX,
    API_KEY_HEADERS,
    CREDENTIAL_NAMES,
    ENV_REFERENCE,
    accept_encoding_codings,
    check_schedule,
    header_problem,
    metrics_url_problem,
    path_problem,
    tracestate_problem,
    url_problem,
)
from loadgen.workload.inputs import WORKLOAD_MAX_BYTES, load_yaml, read_text
from loadgen.workload.model import (
    CACHE_MODES,
    CLASS_KINDS,
    CLIENT_CODINGS,
    DEFAULT_HOPS,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SPAN_S,
    MAX_TOKENS,
    MAX_TURNS,
    REQUEST_ID_BODY,
    REQUEST_ID_FORMATS,
    SPAN_WHY,
    ArrivalSpec,
    ClassSpec,
    ContextSpec,
    DatasetSpec,
    LengthDist,
    Limits,
    SharedPrefixSpec,
    TargetSpec,
    WorkloadSpec,
)
from loadgen.workload.node import Node, file_keys, kind_of, local_file

# The keys of each mapping, from its dataclass: a field is a key of its own name unless
# named here. `description` is for people (kept in `raw` only); `request_id` sets three.
WORKLOAD_KEYS = file_keys(WorkloadSpec, {"name": ("name", "description"), "source": (), "raw": ()})
TARGET_KEYS = file_keys(TargetSpec, dict.fromkeys(
    ("request_id_header", "request_id_format", "request_id_body"), ("request_id",)))  # fmt: skip
# A class's name is its key in `classes`; `output_tokens: from_dataset` sets
# output_from_dataset; a shared-prefix set is `prompt`, a model mix `model` or `models`.
CLASS_KEYS = file_keys(ClassSpec, {
    "name": (), "output_from_dataset": (), "shared_prefix": ("prompt",),
    "models": ("model", "models"),
})  # fmt: skip
# The class keys only some kinds take; every other key of CLASS_KEYS, every kind.
KIND_KEYS = {
    "chat": ("turns", "think_time_s", "system_prompt_tokens"),
    "summarization": ("concurrency", "batch_deadline_s"),
    "agent": ("hops", "tool_time_s", "trajectory_budget_s", "tool_result_tokens", "context",
              "fanout", "system_prompt_tokens"),
}  # fmt: skip
COMMON_CLASS_KEYS = tuple(
    key for key in CLASS_KEYS if not any(key in keys for keys in KIND_KEYS.values())
)


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
    top = Node(source, "", raw)
    top.allow(*WORKLOAD_KEYS)
    classes_node = top.child("classes")
    if not classes_node.value:
        raise classes_node.error("", "needs at least one class", "add e.g. 'chat: {...}'")
    classes = {
        str(name): _class(classes_node.child(str(name)), str(name)) for name in classes_node.value
    }
    sim = top.value.get("sim") or {}
    if not isinstance(sim, Mapping):
        raise top.error("sim", f"must be a mapping, got {kind_of(sim)}")
    spec = WorkloadSpec(
        name=top.string("name"),
        source=source,
        target=_target(top.section("target")),
        classes=classes,
        seed=top.integer("seed", 0, maximum=MAX_SEED),
        cache=top.string("cache", "cold", choices=CACHE_MODES),
        sim=dict(sim),
        raw=dict(top.value),
    )
    check_schedule(spec)
    return spec


# --- the target ----------------------------------------------------------------------------


def _target(node: Node) -> TargetSpec:
    node.allow(*TARGET_KEYS)
    headers = _headers(node)
    extra_body = _extra_body(node)
    url, path, metrics_url = _addresses(node)
    api = _api(node)
    id_header, id_format, id_body = _request_id(node)
    return TargetSpec(
        request_id_header=id_header,
        request_id_format=id_format,
        request_id_body=id_body,
        api=api,
        model=node.string("model", "sim"),
        url=url,
        path=path,
        api_key_env=node.optional_string("api_key_env"),
        headers=headers,
        include_usage=node.boolean("include_usage", True),
        force_output_tokens=node.boolean("force_output_tokens", True),
        allow_early_stops=node.boolean("allow_early_stops", False),
        extra_body=extra_body,
        priority_header=node.optional_string("priority_header"),
        tokenizer=local_file(node, "tokenizer") if node.has("tokenizer") else None,
        generic=_generic(node),
        server_metrics_url=metrics_url,
        server_metrics_interval_s=node.number(
            "server_metrics_interval_s", 1.0, minimum=0.05, maximum=3600
        ),
        server_metrics_headers=_metrics_headers(node),
        accept_encoding=_accept_encoding(node),
        path_buffers=node.boolean("path_buffers", False),
        traceparent=node.boolean("traceparent", True),
        tracestate=_tracestate(node, headers),
    )


def _accept_encoding(node: Node) -> tuple[str, ...]:
    """`target.accept_encoding`: true (the OpenAI SDK's `gzip, deflate`), false, or the
    codings as a list or a comma-separated string, each one loadgen inflates."""
    value = node.value.get("accept_encoding", False)
    if isinstance(value, bool):
        return CLIENT_CODINGS if value else ()
    try:
        return accept_encoding_codings(value)
    except ValueError as exc:
        raise node.error("accept_encoding", str(exc), ACCEPT_ENCODING_FIX) from None


def _headers(node: Node) -> dict[str, str]:
    """`target.headers`: names to string values, none of them an API key's header."""
    headers = node.value.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise node.error("headers", "must map header names to string values")
    for name, value in headers.items():
        if problem := header_problem(name, value):
            raise node.error(f"headers.{name}", problem)
        if name.lower() in API_KEY_HEADERS:
            raise node.error(
                f"headers.{name}",
                "secrets must not be written in the workload file",
                "put the key in an environment variable and name it in target.api_key_env",
            )
    return dict(headers)


def _extra_body(node: Node) -> dict[str, object]:
    """`target.extra_body`: JSON fields added to every request body."""
    extra_body = node.value.get("extra_body") or {}
    if not isinstance(extra_body, Mapping):
        raise node.error("extra_body", "must be a mapping of JSON fields added to every request")
    try:  # as the request body (orjson) and as run.json (json) will be written
        orjson.dumps(extra_body)
        json.dumps(extra_body, allow_nan=False)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        fix = "use strings, numbers, booleans, lists and string-keyed mappings"
        raise node.error("extra_body", f"is not JSON: {exc}", fix) from None
    return dict(extra_body)


def _addresses(node: Node) -> tuple[str | None, str | None, str | None]:
    """The base URL, the request path and the server-metrics URL, each checked."""
    url = node.value.get("url")
    if url is not None and (problem := url_problem(url)):
        raise node.error("url", problem)
    path = node.optional_string("path")
    if path is not None and (problem := path_problem(path)):
        raise node.error("path", problem)
    metrics_url = node.optional_string("server_metrics_url")
    if metrics_url is not None and (problem := metrics_url_problem(metrics_url)):
        raise node.error("server_metrics_url", problem)
    return url, path, metrics_url


def _api(node: Node) -> str:
    """The API family; `generic` needs the path and the description of its API."""
    api = node.string("api", "openai-chat", choices=APIS)
    if api == "generic" and not node.has("path"):
        raise node.error("path", "is required for api: generic", "e.g. path: /v1/generate")
    if api == "generic" and not node.has("generic"):
        raise node.error("generic", "is required for api: generic",
                         "describe the API: docs/apis.md, 'Generic streaming APIs'")  # fmt: skip
    return api


def _generic(node: Node) -> GenericSpec | None:
    if not node.has("generic"):
        return None
    return generic_spec(node.value.get("generic"), node.source, node.key("generic"))


def _metrics_headers(node: Node) -> dict[str, str]:
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


def _tracestate(node: Node, headers: Mapping[str, str]) -> str | None:
    """`target.tracestate`: a W3C tracestate list sent beside each traceparent, or None."""
    if not node.has("tracestate"):
        return None
    value = node.value.get("tracestate")
    fix = "e.g. tracestate: 'vendor=value,other=1' (lower-case keys, printable values)"
    if not isinstance(value, str):
        raise node.error("tracestate", f"must be a string (got {kind_of(value)})", fix)
    if problem := tracestate_problem(value):
        raise node.error("tracestate", problem, fix)
    if any(name.lower() == "tracestate" for name in headers):
        raise node.error("tracestate", "is also set in target.headers",
                         "keep one of the two")  # fmt: skip
    return value


def _request_id(node: Node) -> tuple[str | None, str, str]:
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


# --- a class -------------------------------------------------------------------------------


def _class(node: Node, name: str) -> ClassSpec:
    """One class: its kind's keys, its run length, its sources of prompts, its sections."""
    kind = node.string("kind", "chat", choices=CLASS_KINDS)
    node.allow(*COMMON_CLASS_KEYS, *KIND_KEYS[kind])
    arrival = sections.arrival(node.child("arrival"), node.source)
    has_requests, has_duration = _bounds(node, arrival)
    concurrency = _concurrency(node, has_requests)
    _check_trace_drives(node, kind, arrival, concurrency)
    turns, think, hops, tool = (
        node.child(k) if node.has(k) else None
        for k in ("turns", "think_time_s", "hops", "tool_time_s")
    )
    dataset = node.optional("dataset", sections.dataset)
    shared_prefix = node.optional("prompt", sections.shared_prefix)
    from_dataset = node.value.get("output_tokens") == "from_dataset"
    _check_one_source(node, arrival, dataset, shared_prefix)
    _check_dataset_use(node, kind, dataset, from_dataset)
    requests, duration_s = _run_length(node, arrival, has_requests, has_duration)
    return ClassSpec(
        name=name,
        kind=kind,
        arrival=arrival,
        requests=requests,
        duration_s=duration_s,
        prompt_tokens=_prompt_lengths(node, arrival, dataset, shared_prefix),
        output_tokens=_output_lengths(node, arrival, from_dataset),
        slo=sections.slo(node.section("slo")),
        deadlines=sections.deadlines(node.section("deadlines")),
        priority=node.integer("priority", minimum=-(2**31), maximum=2**31 - 1)
        if node.has("priority") else None,
        limits=node.optional("limits", sections.limits) or Limits(),
        turns=sections.length(turns, MAX_TURNS) if turns else None,
        think_time_s=sections.seconds(think) if think else None,
        system_prompt_tokens=node.integer("system_prompt_tokens", 0, maximum=MAX_TOKENS),
        hops=_hops(hops, kind),
        tool_time_s=sections.seconds(tool) if tool else None,
        trajectory_budget_s=sections.optional_seconds(node, "trajectory_budget_s"),
        concurrency=concurrency,
        batch_deadline_s=sections.optional_seconds(node, "batch_deadline_s"),
        dataset=dataset,
        output_from_dataset=from_dataset,
        shared_prefix=shared_prefix,
        models=sections.models(node),
        tool_result_tokens=node.optional("tool_result_tokens", sections.length),
        context=node.optional("context", sections.context) or ContextSpec(),
        fanout=sections.fanout(node, hops) if node.has("fanout") else None,
    )  # fmt: skip


def _bounds(node: Node, arrival: ArrivalSpec) -> tuple[bool, bool]:
    """Whether the class runs for a number of requests, or for a duration: exactly one, or
    neither for a ramp (its steps' length) or a trace (its rows)."""
    has_requests, has_duration = node.has("requests"), node.has("duration_s")
    bounded_by_itself = arrival.process in ("ramp", "trace")
    if (has_requests and has_duration) or not (has_requests or has_duration or bounded_by_itself):
        raise node.error(
            "requests", "exactly one of 'requests' or 'duration_s' must be set",
            "e.g. 'requests: 100' or 'duration_s: 60'",
        )  # fmt: skip
    if arrival.process == "ramp" and not has_requests and not has_duration:
        has_duration = True  # the ramp's own length
    return has_requests, has_duration


def _concurrency(node: Node, has_requests: bool) -> int | None:
    """A closed-loop batch's documents in flight (None: open loop, by the arrivals)."""
    if not node.has("concurrency"):
        return None
    concurrency = node.integer("concurrency", minimum=1, maximum=MAX_CONCURRENCY)
    if not has_requests:
        raise node.error("requests", "a closed-loop batch (concurrency) needs 'requests' documents")
    return concurrency


def _run_length(
    node: Node, arrival: ArrivalSpec, has_requests: bool, has_duration: bool
) -> tuple[int | None, float | None]:
    """The class's `requests`, or its `duration_s` (given, or a ramp's steps' length)."""
    requests = (
        node.integer("requests", minimum=1, maximum=MAX_REQUESTS, why="per class")
        if has_requests else None
    )  # fmt: skip
    if node.has("duration_s"):
        return requests, node.number("duration_s", positive=True, maximum=MAX_SPAN_S, why=SPAN_WHY)
    return requests, sum(d for _, d in arrival.steps) if has_duration else None


def _hops(hops: Node | None, kind: str) -> LengthDist | None:
    """An agent's hops per trajectory (`DEFAULT_HOPS` when it gives none)."""
    if hops is not None:
        return sections.length(hops, MAX_TURNS)
    return DEFAULT_HOPS if kind == "agent" else None


def _check_trace_drives(
    node: Node, kind: str, arrival: ArrivalSpec, concurrency: int | None
) -> None:
    """A trace drives single requests: an agent trace replays trajectories, any other
    cannot drive sessions, a batch or an agent."""
    if arrival.trace is not None and arrival.trace.format == "agent":
        _check_agent_trace(node, kind, arrival)
    elif arrival.process == "trace" and (kind == "agent" or node.has("turns") or concurrency):
        what = "turns" if node.has("turns") else "concurrency" if concurrency else "kind: agent"
        raise node.error(
            "arrival.process", f"a trace cannot drive {what}: each trace row is one request",
            "replay the trace as a chat class without turns, or give this class its own arrivals",
        )  # fmt: skip


def _check_agent_trace(node: Node, kind: str, arrival: ArrivalSpec) -> None:
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


def _check_one_source(
    node: Node, arrival: ArrivalSpec, dataset: DatasetSpec | None,
    shared_prefix: SharedPrefixSpec | None,
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


def _check_dataset_use(
    node: Node, kind: str, dataset: DatasetSpec | None, from_dataset: bool
) -> None:
    """What a dataset can give: recorded answers' lengths, chat sessions, not agents."""
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
    node: Node, arrival: ArrivalSpec, dataset: DatasetSpec | None,
    shared_prefix: SharedPrefixSpec | None,
) -> LengthDist:  # fmt: skip
    """The class's prompt length distribution (a dataset's is known only once it is read:
    a placeholder of 1, never sampled)."""
    if shared_prefix is not None:
        suffix, shared = shared_prefix.suffix_tokens, shared_prefix.shared_prefix_tokens
        return replace(suffix, value=suffix.value + shared, mean=suffix.mean + shared,
                       min=suffix.min + shared, max=suffix.max + shared)  # fmt: skip
    if dataset is not None or (arrival.process == "trace" and not node.has("prompt_tokens")):
        return LengthDist(dist="fixed", value=1)
    return sections.length(node.child("prompt_tokens"))


def _output_lengths(node: Node, arrival: ArrivalSpec, from_dataset: bool) -> LengthDist:
    """The class's output length distribution (a placeholder of 1 where each request's
    comes from the dataset's answer or the trace's row)."""
    if from_dataset or (arrival.process == "trace" and not node.has("output_tokens")):
        return LengthDist(dist="fixed", value=1)
    return sections.length(node.child("output_tokens"))
