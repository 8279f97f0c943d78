"""Protocol adapters: one small module per API family, behind one Protocol.

An adapter builds the request body for a plan and turns one decoded stream event into a
`Delta`. It does no I/O and keeps no clock: the runner stamps each chunk's arrival before
the adapter parses it. Registry: a plain dict from the workload's `target.api` name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class BodyOptions:
    """Request options that come from the workload's target section."""

    model: str
    include_usage: bool = True
    force_output_tokens: bool = True
    extra_body: Mapping[str, Any] | None = None


class Delta:
    """What one stream event carried. Counts are characters of text, not tokens.

    `content_chars`/`reasoning_chars`/`has_tool_call` say whether the event carried generated
    output (and so counts for TTFT and ITL); `done` marks an explicit end of stream
    (`[DONE]`), `finish_reason` the model's stop; `error` a server error event (the stream
    failed). Usage-only events carry only the token counts.
    """

    __slots__ = (
        "completion_tokens",
        "content_chars",
        "done",
        "error",
        "finish_reason",
        "has_tool_call",
        "prompt_tokens",
        "reasoning_chars",
        "text",
    )

    def __init__(self) -> None:
        self.content_chars = 0
        self.reasoning_chars = 0
        self.has_tool_call = False
        self.text = ""
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.error: str | None = None

    @property
    def has_output(self) -> bool:
        """True when the event carried generated output of any kind."""
        return bool(self.content_chars or self.reasoning_chars or self.has_tool_call)


Message = tuple[str, str]  # (role: system | user | assistant, text)


class MalformedEvent(ValueError):
    """An event that is not what the API family sends (bad JSON, wrong shape)."""


class Adapter(Protocol):
    """One API family: the default path, the request body, the stream event parser."""

    name: str
    default_path: str

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The JSON body for one streamed request of a conversation (role, text) so far."""
        ...

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One SSE event (name, data) as a Delta; raise MalformedEvent when it is not valid."""
        ...


def adapter_for(api: str) -> Adapter:
    """The adapter registered for `api` (the workload's `target.api`)."""
    from loadgen.adapters.openai_chat import OpenAIChat
    from loadgen.adapters.openai_completions import OpenAICompletions

    registry: dict[str, Adapter] = {
        "openai-chat": OpenAIChat(),
        "openai-completions": OpenAICompletions(),
    }
    return registry[api]
