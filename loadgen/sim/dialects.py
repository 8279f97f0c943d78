"""Which API dialect answers which path: the simulator's plain registry of `Api` entries.

With `api: all` (the default, and the embedded simulator's) every dialect is served on its
own path at once, so one simulator answers whichever API a workload uses. With one API name
(`--api anthropic`) only that dialect's paths are served, and also `/`, for clients that
post to a bare URL; `openai` means chat and completions (`/` = chat), `ollama` chat and
generate (`/` = chat), `tgi` /generate_stream and /generate (`/` = the stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loadgen.sim import anthropic, ollama, openai, responses, tgi
from loadgen.sim.wire import FormatFactory, SimRequest


@dataclass(frozen=True, slots=True)
class Api:
    """One dialect on one path: how to parse the body, format the answer, say an error."""

    name: str
    path: str
    parse: Callable[[bytes], SimRequest]
    format: FormatFactory
    error_body: Callable[[int, str], bytes]
    id_prefix: str = ""
    plain_content_type: str = "application/json"


APIS: tuple[Api, ...] = (
    Api("openai-chat", openai.CHAT_PATH, openai.parse_chat, openai.EventFormat,
        openai.error_body, "chatcmpl-"),
    Api("openai-completions", openai.COMPLETIONS_PATH, openai.parse_text, openai.EventFormat,
        openai.error_body, "cmpl-"),
    Api("openai-responses", responses.RESPONSES_PATH, responses.parse_responses,
        responses.ResponsesFormat, responses.error_body, "resp_"),
    Api("anthropic", anthropic.MESSAGES_PATH, anthropic.parse_messages,
        anthropic.AnthropicFormat, anthropic.error_body, "msg_"),
    Api("tgi", tgi.STREAM_PATH, tgi.parse_stream, tgi.TgiFormat, tgi.error_body),
    Api("tgi", tgi.GENERATE_PATH, tgi.parse_generate, tgi.TgiFormat, tgi.error_body),
    Api("ollama-chat", ollama.CHAT_PATH, ollama.parse_chat, ollama.OllamaFormat,
        ollama.error_body),
    Api("ollama-generate", ollama.GENERATE_PATH, ollama.parse_generate, ollama.OllamaFormat,
        ollama.error_body),
)  # fmt: skip
GROUPS = {
    "openai": ("openai-chat", "openai-completions"),
    "ollama": ("ollama-chat", "ollama-generate"),
}


def routes(api: str) -> dict[str, Api]:
    """POST path → `Api` for the `api` setting ("all", a group, or one API name)."""
    if api == "all":
        return {entry.path: entry for entry in APIS}
    names = GROUPS.get(api, (api,))
    served = [entry for entry in APIS if entry.name in names]
    return {"/": served[0], **{entry.path: entry for entry in served}}


def error_body_for(path: str) -> Callable[[int, str], bytes]:
    """The error-body shape of the dialect that owns `path` (OpenAI's for any other path)."""
    for entry in APIS:
        if entry.path == path:
            return entry.error_body
    return openai.error_body
