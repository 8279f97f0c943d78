"""A plan's request as the bytes the engine writes: the prompt, the body, the headers.

Part of the engine (plans → engine → records), below the scheduler (`runner.Engine`),
which encodes each request ahead of its due time (`runner.Ahead`), so a burst of sends due
together is a run of writes, not of prompt and JSON building. `EngineConfig` says how.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import orjson

from loadgen.adapters.protocol import Adapter, BodyOptions, Message
from loadgen.engine.exchange import NO_SECRETS
from loadgen.engine.logs import LOGGER
from loadgen.engine.request_ids import (
    DEFAULT_HEADER,
    RequestIds,
    merged,
    new_nonce,
    put_in_body,
)
from loadgen.engine.secrets import Redactor
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
    # Where the id also goes in the body (`request_ids.put_in_body`): auto, on or off.
    request_id_body: str = "auto"
    # A forced length that ends short on a stop reason is ok (flagged), not truncated.
    allow_early_stops: bool = False


class RequestEncoder:
    """Each request's bytes for one endpoint: prompts from `prompts`, ids from the run's
    `RequestIds`, body options per model (made once for each model a plan names)."""

    def __init__(self, config: EngineConfig, prompts: PromptMaker, endpoint: Endpoint) -> None:
        self.config, self.prompts, self.endpoint = config, prompts, endpoint
        user_headers = {**endpoint.headers, **config.request_headers}
        self.ids = RequestIds(config.request_id_header, config.request_id_format,
                              config.request_id_nonce, user_headers)  # fmt: skip
        self.user_names = {k.lower() for k in endpoint.headers}  # the endpoint's own headers
        self._by_model: dict[str, BodyOptions] = {}

    def encode(
        self, plan: RequestPlan, messages: Sequence[Message] | None
    ) -> tuple[bytes, str | None]:
        """The request's bytes, the prompt `messages` (None: the plan's own), and the request
        id they carry (None when none is sent), for the record."""
        if messages is None:
            messages = self._messages(plan)
        headers, request_id = self._headers(plan)
        body = self._body(plan, messages, request_id)
        if LOGGER.isEnabledFor(logging.DEBUG):
            point = self.endpoint
            sent = {k: "(secret)" if is_secret_header(k) else v
                    for k, v in {**point.headers, **headers}.items()}  # fmt: skip
            LOGGER.debug("request %d: POST %s headers %s", plan.request_id,
                         redact_url(point.origin + point.target), sent)  # fmt: skip
        return encode_request(self.endpoint, body, headers), request_id

    def _body(
        self, plan: RequestPlan, messages: Sequence[Message], request_id: str | None
    ) -> bytes:
        config = self.config
        body = config.adapter.build_body(messages, plan.output_tokens, self._options(plan.model))
        if plan.priority is not None and config.priority_header is None:
            body["priority"] = plan.priority
        put_in_body(body, config.adapter.name, config.request_id_body, request_id)
        return orjson.dumps(body)

    def _headers(self, plan: RequestPlan) -> tuple[dict[str, str], str | None]:
        """The request's own headers: its id and priority (unless the user set the same
        names: theirs replace loadgen's), then the configured ones; and the id sent."""
        config = self.config
        headers, request_id = self.ids.headers(plan.request_id)
        if plan.priority is not None and config.priority_header is not None:
            headers[config.priority_header] = str(plan.priority)
        headers = {k: v for k, v in headers.items() if k.lower() not in self.user_names}
        headers = merged(headers, config.request_headers)
        if config.headers_for is not None:
            headers = merged(headers, config.headers_for(plan))
        return headers, request_id

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

    def _options(self, model: str | None) -> BodyOptions:
        """The body options for a request to `model` (None: the target's)."""
        if model is None:
            return self.config.body_options
        options = self._by_model.get(model)
        if options is None:
            options = self._by_model[model] = replace(self.config.body_options, model=model)
        return options
