"""Protocol adapters: one small module per API family, behind one Protocol.

The registry: a plain dict from the workload's `target.api` name to its adapter (one
instance serves every request). The protocol every adapter implements, and the pieces they
share, are `loadgen.adapters.protocol`; bytes are cut into events by `loadgen.adapters.sse`
or `loadgen.adapters.ndjson`, as the adapter's `framing` says.
"""

from __future__ import annotations

from loadgen.adapters.anthropic import AnthropicMessages
from loadgen.adapters.generic import GenericAdapter, GenericSpec
from loadgen.adapters.ollama import OllamaChat, OllamaGenerate
from loadgen.adapters.openai_chat import OpenAIChat
from loadgen.adapters.openai_completions import OpenAICompletions
from loadgen.adapters.openai_responses import OpenAIResponses
from loadgen.adapters.protocol import Adapter
from loadgen.adapters.tgi import TgiGenerateStream

REGISTRY: dict[str, Adapter] = {
    "openai-chat": OpenAIChat(),
    "openai-completions": OpenAICompletions(),
    "openai-responses": OpenAIResponses(),
    "anthropic": AnthropicMessages(),
    "tgi": TgiGenerateStream(),
    "ollama-chat": OllamaChat(),
    "ollama-generate": OllamaGenerate(),
}

GENERIC = GenericAdapter.name  # configured by the workload's target.generic, so not one instance

# Every `target.api` name: the registry's, then `generic`.
APIS: tuple[str, ...] = (*REGISTRY, GENERIC)


def adapter_for(api: str, generic: GenericSpec | None = None) -> Adapter:
    """The adapter registered for `api` (the workload's `target.api`).

    `generic` is the workload's `target.generic` section, which the `generic` API needs.
    """
    if api == GENERIC:
        if generic is None:
            raise ValueError("the generic adapter needs the workload's target.generic section")
        return GenericAdapter(generic)
    return REGISTRY[api]
