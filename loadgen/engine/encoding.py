"""A plan's request as the bytes the engine writes: the prompt, the target, the body, the
headers.

Part of the engine (plans → engine → records), below the scheduler (`runner.Engine`),
which encodes each request ahead of its due time (`runner.Ahead`), so a burst of sends due
together is a run of writes, not of prompt and JSON building. `EngineConfig` says how.
What belongs to the API family comes from the adapter, asked once per run or per model
(the target, the body options), never per chunk: its body, shaped with the request id and
priority by `adapters.protocol.request_body`, the one place that does it, for the engine's
requests and the preflight's alike (`RequestEncoder.preflight_request`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from loadgen.adapters.protocol import Adapter, BodyOptions, Message, request_body
from loadgen.engine.exchange import NO_SECRETS
from loadgen.engine.logs import LOGGER
from loadgen.engine.request_ids import (
    DEFAULT_HEADER,
    PREFLIGHT_ID,
    RequestIds,
    merged,
    new_nonce,
)
from loadgen.engine.secrets import Redactor
from loadgen.engine.traceparent import HEADER as TRACEPARENT
from loadgen.engine.traceparent import TraceContext
from loadgen.engine.transport import Endpoint, encode_request
from loadgen.workload.plans import RequestPlan
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.spec import is_secret_header, redact_url


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """How the engine sends: the adapter, body options, extra headers, in-flight cap."""

    adapter: Adapter
    body_options: BodyOptions
    seed: int
    max_in_flight: int | None = None
    request_headers: Mapping[str, str] = field(default_factory=dict)
    headers_for: Callable[[RequestPlan], Mapping[str, str]] | None = None  # tests, faults
    priority_header: str | None = None  # send plan.priority as this header, not in the body
    prompts: PromptMaker | None = None  # default: words, seeded by `seed`
    redactor: Redactor = NO_SECRETS  # quotes server text into errors, secrets hidden
    # The cap on one stream event or line, by class name (`limits.max_event_bytes`).
    max_event_bytes: Mapping[str, int] = field(default_factory=dict)
    # Each request's id header (`loadgen.engine.request_ids`): name (None: none sent),
    # format, and the run's random UUID prefix.
    request_id_header: str | None = DEFAULT_HEADER
    request_id_format: str = "uuid"
    request_id_nonce: int = field(default_factory=new_nonce)
    # Where the id also goes in the body (the adapter's `request_id_field`): auto, on or off.
    request_id_body: str = "auto"
    # A forced length that ends short on a stop reason is ok (flagged), not truncated.
    allow_early_stops: bool = False
    # Each request's W3C traceparent (`loadgen.engine.traceparent`), and a tracestate sent
    # beside it unchanged (None: none).
    traceparent: bool = True
    tracestate: str | None = None


# The preflight's request: one short user message, a few tokens.
PREFLIGHT_MESSAGES: tuple[Message, ...] = (("user", "Say hello."),)
PREFLIGHT_TOKENS = 4


@dataclass(frozen=True, slots=True)
class Shaped:
    """A request before it is bytes: its target, the headers it adds to the endpoint's, and
    its JSON body (what the preflight sends, as the run's requests are sent)."""

    target: str
    headers: dict[str, str]
    body: dict[str, Any]


class RequestEncoder:
    """Each request's bytes for one endpoint: prompts from `prompts`, ids from the run's
    `RequestIds`, body options and target per model (made once for each model a plan
    names: the adapter's `target` may put the model in the path)."""

    def __init__(
        self, config: EngineConfig, prompts: PromptMaker | None, endpoint: Endpoint
    ) -> None:
        self.config, self.endpoint = config, endpoint
        self.prompts = prompts or config.prompts or PromptMaker(config.seed)
        user_headers = {**endpoint.headers, **config.request_headers}
        self.ids = RequestIds(config.request_id_header, config.request_id_format,
                              config.request_id_nonce, user_headers)  # fmt: skip
        self.trace = TraceContext(config.traceparent, config.tracestate, user_headers)
        self.user_names = {k.lower() for k in endpoint.headers}  # the endpoint's own headers
        options = config.body_options
        self._default = (options, config.adapter.target(endpoint.target, options.model))
        self._by_model: dict[str, tuple[BodyOptions, str]] = {}

    def encode(
        self, plan: RequestPlan, messages: Sequence[Message] | None
    ) -> tuple[bytes, str | None, str | None]:
        """The request's bytes, the prompt `messages` (None: the plan's own), and the request
        id and traceparent they carry (None when none is sent), for the record."""
        if messages is None:
            messages = self._messages(plan)
        headers, request_id, traceparent = self._headers(plan.request_id, plan.priority)
        if self.config.headers_for is not None:
            headers = merged(headers, self.config.headers_for(plan))
        options, target = self._for_model(plan.model)
        body = self._body(messages, plan.output_tokens, options, plan.priority, request_id)
        if LOGGER.isEnabledFor(logging.DEBUG):
            point = self.endpoint
            sent = {k: "(secret)" if is_secret_header(k) else v
                    for k, v in {**point.headers, **headers}.items()}  # fmt: skip
            LOGGER.debug("request %d: POST %s headers %s", plan.request_id,
                         redact_url(point.origin + target), sent)  # fmt: skip
        request = encode_request(self.endpoint, orjson.dumps(body), headers, target)
        return request, request_id, traceparent

    def respan(self, request: bytes, traceparent: str | None) -> tuple[bytes, str | None]:
        """A retry's bytes and traceparent: the same trace with a new span id when loadgen made
        the traceparent (a user's is left as it is). The header is a fixed length, so the
        bytes are the first attempt's with its value replaced."""
        if traceparent is None or not self.trace.owns:
            return request, traceparent
        again = self.trace.respan(traceparent)
        line = f"{TRACEPARENT}: ".encode()
        return request.replace(line + traceparent.encode(), line + again.encode(), 1), again

    def preflight_request(self, priority: int | None) -> Shaped:
        """The preflight's request, shaped as the run's are: the same headers (its id is the
        preflight's own, `…-ffffffffffff`, its traceparent a trace of its own; `priority` as
        the run's header, when it has one) and body fields (the id's, the priority's), to the
        target of the workload's model."""
        options, target = self._default
        headers, request_id, _ = self._headers(PREFLIGHT_ID, priority)
        body = self._body(PREFLIGHT_MESSAGES, PREFLIGHT_TOKENS, options, priority, request_id)
        return Shaped(target, headers, body)

    def _body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions,
        priority: int | None, request_id: str | None,
    ) -> dict[str, Any]:  # fmt: skip
        config = self.config
        return request_body(
            config.adapter, messages, max_tokens, options, request_id=request_id,
            priority=priority if config.priority_header is None else None,
            id_mode=config.request_id_body,
        )  # fmt: skip

    def _headers(
        self, number: int, priority: int | None
    ) -> tuple[dict[str, str], str | None, str | None]:
        """A request's own headers: its id, traceparent and priority (unless the user set the
        same names: theirs replace loadgen's), then the configured ones; and the id and
        traceparent sent."""
        config = self.config
        headers, request_id = self.ids.headers(number)
        trace, traceparent = self.trace.headers()
        headers.update(trace)
        if priority is not None and config.priority_header is not None:
            headers[config.priority_header] = str(priority)
        headers = {k: v for k, v in headers.items() if k.lower() not in self.user_names}
        return merged(headers, config.request_headers), request_id, traceparent

    def _messages(self, plan: RequestPlan) -> Sequence[Message]:
        """A single request's prompt: its dataset messages, a shared prefix and a fresh
        suffix, or generated words (each starting with a cold run's nonce)."""
        prompts = self.prompts
        if plan.messages:
            return prompts.lead_messages(plan.messages)
        if plan.shared_prefix is not None:
            group, prefix = plan.shared_prefix
            return [("user", prompts.shared(plan.request_id, group, prefix, plan.prompt_tokens))]
        return [("user", prompts.text(plan.request_id, plan.prompt_tokens, plan.prefix_groups,
                                      first=True))]  # fmt: skip

    def _for_model(self, model: str | None) -> tuple[BodyOptions, str]:
        """The body options and target of a request to `model` (None: the target's)."""
        if model is None:
            return self._default
        found = self._by_model.get(model)
        if found is None:
            options = replace(self.config.body_options, model=model)
            target = self.config.adapter.target(self.endpoint.target, model)
            found = self._by_model[model] = (options, target)
        return found
