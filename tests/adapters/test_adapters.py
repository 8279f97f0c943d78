"""OpenAI adapters: what counts as generated output, usage, errors and the request body."""

from __future__ import annotations

import json

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions, MalformedEvent

CHAT = adapter_for("openai-chat")
COMPLETIONS = adapter_for("openai-completions")


def chat(delta: dict, **extra: object) -> bytes:
    return json.dumps(
        {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}
    ).encode()


@pytest.mark.parametrize(
    ("data", "has_output", "content", "reasoning"),
    [
        (chat({"role": "assistant"}), False, 0, 0),
        (chat({"role": "assistant", "content": None}), False, 0, 0),
        (chat({"content": ""}), False, 0, 0),
        (chat({"content": " hello"}), True, 6, 0),
        (chat({"reasoning_content": "hmm"}), True, 0, 3),
        (chat({"reasoning": "hm"}), True, 0, 2),
        (chat({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), True, 0, 0),
        (
            json.dumps(
                {"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 9}}
            ).encode(),
            False,
            0,
            0,
        ),
    ],
)
def test_chat_output_bearing_events(
    data: bytes, has_output: bool, content: int, reasoning: int
) -> None:
    """Only content, reasoning and tool-call deltas are generated output; role/empty/usage are not."""
    delta = CHAT.parse(b"", data)
    assert delta.has_output is has_output
    assert (delta.content_chars, delta.reasoning_chars) == (content, reasoning)


def test_usage_finish_done_and_errors() -> None:
    """Usage (separate or in the last chunk), finish reason, [DONE] and error objects are read."""
    last = CHAT.parse(
        b"",
        json.dumps(
            {
                "choices": [{"delta": {"content": "x"}, "finish_reason": "length"}],
                "usage": {"completion_tokens": 7, "prompt_tokens": 3},
            }
        ).encode(),
    )
    assert (last.completion_tokens, last.prompt_tokens, last.finish_reason) == (7, 3, "length")
    assert last.has_output
    assert CHAT.parse(b"", b"[DONE]").done
    error = CHAT.parse(b"", b'{"error": {"message": "overloaded", "code": 503}}')
    assert error.error == "overloaded"


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b'{"choices": ["x"]}'])
def test_malformed_events_raise(data: bytes) -> None:
    """Data that is not an OpenAI chunk raises MalformedEvent (the engine maps it to stream_error)."""
    with pytest.raises(MalformedEvent):
        CHAT.parse(b"", data)


def test_completions_text() -> None:
    """Completions output is choices[0].text; an empty text is not output."""
    assert (
        COMPLETIONS.parse(b"", b'{"choices":[{"text":" hi","finish_reason":null}]}').content_chars
        == 3
    )
    assert not COMPLETIONS.parse(
        b"", b'{"choices":[{"text":"","finish_reason":"stop"}]}'
    ).has_output


def test_request_bodies() -> None:
    """Bodies stream, ask for usage, force the output length, and add extra fields."""
    options = BodyOptions(model="m", extra_body={"priority": 1})
    body = CHAT.build_body([("user", "hi there")], 32, options)
    assert body["messages"] == [{"role": "user", "content": "hi there"}]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["ignore_eos"], body["min_tokens"], body["priority"]) == (
        32,
        True,
        32,
        1,
    )
    plain = COMPLETIONS.build_body(
        [("user", "p")], 5, BodyOptions(model="m", include_usage=False, force_output_tokens=False)
    )
    assert plain["prompt"] == "p"
    assert "stream_options" not in plain
    assert "ignore_eos" not in plain
