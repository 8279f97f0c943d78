"""The new API families' adapters on realistic streams: what is content, reasoning, tool
call, usage, end and error (event shapes from each API's public documentation)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.ndjson import NdjsonDecoder
from loadgen.adapters.protocol import BodyOptions, Delta, MalformedEvent, new_decoder
from loadgen.results.records import ServerTimings, reported_timings


def sse_event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


def replay(api: str, body: bytes) -> list[Delta]:
    """Decode a whole response body with the API's framing and parse every event."""
    adapter = adapter_for(api)
    decoder = new_decoder(adapter)
    events = decoder.feed(body) + decoder.close()
    return [adapter.parse(name, data) for name, data in events]


def kinds(deltas: list[Delta]) -> list[str]:
    """What each event was, as the runner sees it: c(ontent) r(easoning) t(ool) or -."""
    out = []
    for d in deltas:
        out.append(
            "c"
            if d.content_chars
            else "r"
            if d.reasoning_chars
            else "t"
            if d.has_tool_call
            else "-"
        )
    return out


# -- Anthropic Messages --------------------------------------------------------------------

ANTHROPIC_THINKING = b"".join(
    [
        sse_event("message_start", {"type": "message_start", "message": {
            "id": "msg_01", "type": "message", "role": "assistant", "content": [],
            "model": "claude", "stop_reason": None,
            "usage": {"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 1}}}),
        sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "thinking", "thinking": ""}}),
        sse_event("ping", {"type": "ping"}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "thinking_delta", "thinking": "Let"}}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "signature_delta", "signature": "Eq"}}),
        sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse_event("content_block_start", {"type": "content_block_start", "index": 1,
                                          "content_block": {"type": "text", "text": ""}}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                          "delta": {"type": "text_delta", "text": "Hello"}}),
        sse_event("content_block_start", {"type": "content_block_start", "index": 2,
                                          "content_block": {"type": "tool_use", "id": "toolu_1",
                                                            "name": "get_weather", "input": {}}}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                          "delta": {"type": "input_json_delta",
                                                    "partial_json": ""}}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                          "delta": {"type": "input_json_delta",
                                                    "partial_json": "{\"city\": "}}),
        sse_event("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                    "usage": {"output_tokens": 15}}),
        sse_event("message_stop", {"type": "message_stop"}),
    ]
)  # fmt: skip


def test_anthropic_stream_content_reasoning_tool_usage_and_stop() -> None:
    """Thinking is reasoning, text is content, tool_use start and JSON deltas are tool calls;
    message_start/ping/signature/empty deltas carry nothing; message_delta gives N."""
    deltas = replay("anthropic", ANTHROPIC_THINKING)
    assert kinds(deltas) == ["-", "-", "-", "r", "-", "-", "-", "c", "t", "-", "t", "-", "-"]
    assert deltas[0].prompt_tokens == 30  # input + cache read
    assert deltas[0].completion_tokens is None  # message_start's 1 is not the answer's N
    assert deltas[7].text == "Hello"
    assert (deltas[11].completion_tokens, deltas[11].finish_reason) == (15, "tool_use")
    assert deltas[12].done
    assert not any(d.done for d in deltas[:12])


def test_anthropic_error_event_mid_stream() -> None:
    """An `error` event carries the server's message."""
    body = sse_event("error", {"type": "error",
                               "error": {"type": "overloaded_error", "message": "Overloaded"}})  # fmt: skip
    assert replay("anthropic", body)[0].error == "Overloaded"


def test_anthropic_body_and_headers() -> None:
    """System messages go to `system`; the key goes in x-api-key with anthropic-version."""
    adapter = adapter_for("anthropic")
    body = adapter.build_body(
        [("system", "be brief"), ("user", "hi"), ("assistant", "yo"), ("user", "again")],
        64,
        BodyOptions(model="claude", extra_body={"temperature": 0}),
    )
    assert body == {
        "model": "claude", "max_tokens": 64, "stream": True, "system": "be brief",
        "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                     {"role": "user", "content": "again"}],
    }  # fmt: skip
    assert adapter.headers("sk-1") == {"anthropic-version": "2023-06-01", "x-api-key": "sk-1"}
    assert adapter.headers(None) == {"anthropic-version": "2023-06-01"}


# -- TGI ----------------------------------------------------------------------------------


def tgi(text: str, *, special: bool = False, final: dict[str, Any] | None = None) -> bytes:
    obj = {
        "index": 1, "token": {"id": 7, "text": text, "logprob": -0.1, "special": special},
        "generated_text": "all" if final else None, "details": final,
    }  # fmt: skip
    return b"data:" + json.dumps(obj).encode() + b"\n\n"


def test_tgi_tokens_special_eos_and_details() -> None:
    """Token texts are content; the special EOS is no output and is not counted in N."""
    final = {"finish_reason": "eos_token", "generated_tokens": 4, "seed": None, "input_length": 7}
    body = tgi(" Deep") + tgi(" learn") + tgi("ing") + tgi("</s>", special=True, final=final)
    deltas = replay("tgi", body)
    assert kinds(deltas) == ["c", "c", "c", "-"]
    last = deltas[-1]
    assert last.done
    assert (last.completion_tokens, last.prompt_tokens) == (3, 7)
    assert last.finish_reason == "eos_token"


def test_tgi_length_stop_counts_every_token_and_errors() -> None:
    """A length stop's last token is output and counted; an error object fails the stream."""
    final = {"finish_reason": "length", "generated_tokens": 2, "seed": 1}
    deltas = replay("tgi", tgi("a") + tgi("b", final=final))
    assert kinds(deltas) == ["c", "c"]
    assert deltas[-1].completion_tokens == 2
    error = b'data:{"error":"Out of available cache blocks","error_type":"generation"}\n\n'
    assert replay("tgi", error)[0].error == "generation: Out of available cache blocks"


def test_tgi_body() -> None:
    """The conversation is flattened into `inputs`; details are asked for."""
    body = adapter_for("tgi").build_body(
        [("system", "s"), ("user", "u")], 9,
        BodyOptions(model="m", extra_body={"parameters": {"top_p": 0.9}}),
    )  # fmt: skip
    assert body == {
        "inputs": "s\n\nu",
        "parameters": {"max_new_tokens": 9, "details": True, "top_p": 0.9},
    }


# -- Ollama --------------------------------------------------------------------------------

OLLAMA_DONE = {
    "done": True, "done_reason": "length", "total_duration": 4_883_583_458,
    "load_duration": 1_334_875, "prompt_eval_count": 26, "prompt_eval_duration": 342_546_000,
    "eval_count": 3, "eval_duration": 4_535_599_000,
}  # fmt: skip


def ndjson(*objects: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objects)


def test_ollama_chat_thinking_content_and_server_timings() -> None:
    """message.thinking is reasoning, message.content is content; the last object gives N,
    prompt tokens and the server's durations in ms."""
    msg = {"model": "qwen3", "created_at": "2025-01-01T00:00:00Z", "done": False}
    body = ndjson(
        {**msg, "message": {"role": "assistant", "content": "", "thinking": "Hmm"}},
        {**msg, "message": {"role": "assistant", "content": "The"}},
        {**msg, "message": {"role": "assistant", "content": ""}},
        {**msg, **OLLAMA_DONE, "message": {"role": "assistant", "content": ""}},
    )
    deltas = replay("ollama-chat", body)
    assert kinds(deltas) == ["r", "c", "-", "-"]
    last = deltas[-1]
    assert last.done
    assert (last.completion_tokens, last.prompt_tokens) == (3, 26)
    assert reported_timings(last.server_timings) == ServerTimings(
        total_ms=4883.583458, load_ms=1.334875, prefill_ms=342.546, decode_ms=4535.599,
        prefill_tokens=26, decode_tokens=3,
    )  # fmt: skip


def test_ollama_generate_and_error() -> None:
    """/api/generate's `response` and `thinking`; `{"error": ...}` fails the stream."""
    body = ndjson(
        {"response": "", "thinking": "a", "done": False},
        {"response": " b", "done": False},
        {"response": "", "context": [1, 2], **OLLAMA_DONE},
    )
    deltas = replay("ollama-generate", body)
    assert kinds(deltas) == ["r", "c", "-"]
    assert deltas[-1].completion_tokens == 3
    assert replay("ollama-chat", b'{"error": "model \\"x\\" not found"}\n')[0].error == (
        'model "x" not found'
    )


def test_ollama_bodies() -> None:
    """num_predict carries the planned length; generate puts system messages in `system`."""
    options = BodyOptions(model="tiny", extra_body={"options": {"temperature": 0}})
    chat = adapter_for("ollama-chat").build_body([("user", "hi")], 5, options)
    assert chat == {
        "messages": [{"role": "user", "content": "hi"}], "model": "tiny", "stream": True,
        "options": {"num_predict": 5, "temperature": 0},
    }  # fmt: skip
    generate = adapter_for("ollama-generate").build_body(
        [("system", "s"), ("user", "u")], 5, BodyOptions(model="tiny")
    )
    assert generate == {
        "prompt": "u", "system": "s", "model": "tiny", "stream": True,
        "options": {"num_predict": 5},
    }  # fmt: skip


# -- OpenAI Responses ------------------------------------------------------------------------


def responses(kind: str, **fields: Any) -> bytes:
    return sse_event(kind, {"type": kind, "sequence_number": 1, **fields})


RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
USAGE = {
    "input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 42,
}  # fmt: skip


def test_responses_stream() -> None:
    """Reasoning summary and reasoning text deltas are reasoning, output text is content,
    function-call arguments are tool calls; created/added/done events carry nothing."""
    body = b"".join([
        responses("response.created", response=RESPONSE),
        responses("response.in_progress", response=RESPONSE),
        responses("response.output_item.added", output_index=0,
                  item={"id": "rs_1", "type": "reasoning", "summary": []}),
        responses("response.reasoning_summary_text.delta", item_id="rs_1", delta="**Plan**"),
        responses("response.reasoning_text.delta", item_id="rs_1", delta="step"),
        responses("response.content_part.added", part={"type": "output_text", "text": ""}),
        responses("response.output_text.delta", item_id="msg_1", delta="Hi"),
        responses("response.output_text.delta", item_id="msg_1", delta=""),
        responses("response.output_text.done", text="Hi"),
        responses("response.function_call_arguments.delta", delta="{\"a\""),
        responses("response.completed", response={**RESPONSE, "status": "completed",
                                                   "usage": USAGE}),
    ])  # fmt: skip
    deltas = replay("openai-responses", body)
    assert kinds(deltas) == ["-", "-", "-", "r", "r", "-", "c", "-", "-", "t", "-"]
    last = deltas[-1]
    assert last.done
    assert (last.completion_tokens, last.prompt_tokens) == (30, 12)


def test_responses_incomplete_failed_and_error() -> None:
    """Incomplete at max_output_tokens is the planned end; other reasons, failed and error fail."""
    at_length = responses("response.incomplete", response={
        **RESPONSE, "status": "incomplete", "usage": USAGE,
        "incomplete_details": {"reason": "max_output_tokens"}})  # fmt: skip
    (end,) = replay("openai-responses", at_length)
    assert end.done
    assert end.error is None
    assert end.finish_reason == "length"
    filtered = responses("response.incomplete", response={
        **RESPONSE, "incomplete_details": {"reason": "content_filter"}})  # fmt: skip
    assert "content_filter" in str(replay("openai-responses", filtered)[0].error)
    failed = responses("response.failed", response={
        **RESPONSE, "status": "failed", "error": {"code": "server_error", "message": "boom"}})  # fmt: skip
    assert replay("openai-responses", failed)[0].error == "boom"
    error = responses("error", code="ERR", message="Something went wrong", param=None)
    assert replay("openai-responses", error)[0].error == "Something went wrong"


def test_responses_body() -> None:
    """input messages, each with an explicit `"type": "message"` (llama-server refuses an
    assistant item without it), and max_output_tokens; no OpenAI chat-only fields."""
    adapter = adapter_for("openai-responses")
    body = adapter.build_body([("user", "hi")], 8, BodyOptions(model="m"))
    assert body == {
        "model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}],
        "max_output_tokens": 8, "stream": True,
    }  # fmt: skip
    history = [("system", "s"), ("user", "hi"), ("assistant", "yo"), ("tool", "42"),
               ("user", "again")]  # fmt: skip
    items = adapter.build_body(history, 8, BodyOptions(model="m"))["input"]
    messages = [i for i in items if i.get("role")]
    assert [i["role"] for i in messages] == ["system", "user", "assistant", "user"]
    assert all(i["type"] == "message" for i in messages)
    assert [i["type"] for i in items if not i.get("role")] == ["function_call",
                                                              "function_call_output"]  # fmt: skip


@pytest.mark.parametrize(
    "api", ["anthropic", "tgi", "ollama-chat", "ollama-generate", "openai-responses"]
)
@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b'"text"'])
def test_new_adapters_reject_what_is_not_a_json_object(api: str, data: bytes) -> None:
    """Data that is not a JSON object raises MalformedEvent (the engine: stream_error)."""
    with pytest.raises(MalformedEvent):
        adapter_for(api).parse(b"", data)


# -- NDJSON decoder ---------------------------------------------------------------------------


def test_ndjson_lines_blank_lines_crlf_and_a_last_line_without_newline() -> None:
    """One event per non-blank line; CR before LF dropped; close() returns an unterminated line."""
    decoder = NdjsonDecoder()
    assert decoder.feed(b'{"a":1}\r\n\n  \n{"b"') == [(b"", b'{"a":1}')]
    assert decoder.feed(b':2}\n{"c":3}') == [(b"", b'{"b":2}')]
    assert decoder.close() == [(b"", b'{"c":3}')]
    assert decoder.close() == []


def _parse(api: str, obj: dict[str, Any]) -> Delta:
    return adapter_for(api).parse(b"", json.dumps(obj).encode())


def _completed(status: str | None, **response: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "resp_1", **response}
    if status is not None:
        body["status"] = status
    return {"type": "response.completed", "response": body}


@pytest.mark.parametrize(
    ("event", "done", "finish", "error"),
    [
        (_completed("completed"), True, "stop", None),
        (_completed(None), True, "stop", None),  # a server that leaves the status out
        (_completed("incomplete", incomplete_details={"reason": "max_output_tokens"}),
         True, "length", None),  # vLLM, llama-server
        ({"type": "response.incomplete", "response": {
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}},
         True, "length", None),  # OpenAI
        (_completed("incomplete", incomplete_details={"reason": "content_filter"}),
         False, None, "response.completed (status 'incomplete', content_filter)"),
        (_completed("cancelled"), True, "cancelled", None),  # vLLM: an aborted request
        (_completed("incomplete", incomplete_details={"reason": "other"}), False, None,
         "response.completed (status 'incomplete', other)"),
        (_completed("failed", error={"message": "engine died"}), False, None, "engine died"),
        ({"type": "response.failed", "response": {"status": "failed"}}, False, None,
         "response.failed (status 'failed')"),
    ],
)  # fmt: skip
def test_a_responses_end_is_its_status_whichever_event_carries_it(
    event: dict[str, Any], done: bool, finish: str | None, error: str | None
) -> None:
    """The status inside the terminal event decides the end, not the event's name."""
    delta = _parse("openai-responses", event)
    assert (delta.done, delta.finish_reason, delta.error) == (done, finish, error)


@pytest.mark.parametrize("api", ["anthropic", "openai-responses", "openai-chat"])
@pytest.mark.parametrize(
    "event",
    [
        {"error": {"message": "upstream failed, code 503", "type": "None"}},  # LiteLLM
        {"error": "upstream failed, code 503"},
        {"type": "error", "error": {"type": "api_error", "message": "upstream failed, code 503"}},
    ],
)
def test_an_error_event_fails_the_stream_with_or_without_a_type(
    api: str, event: dict[str, Any]
) -> None:
    """A mid-stream error object, typed or bare (a gateway's), is an error with its words."""
    assert _parse(api, event).error == "upstream failed, code 503"


def test_a_responses_error_event_keeps_its_top_level_message() -> None:
    """OpenAI's own `error` event puts message and code at the top level."""
    delta = _parse("openai-responses", {"type": "error", "code": "x", "message": "went wrong"})
    assert delta.error == "went wrong"


def test_anthropic_input_tokens_come_from_message_delta_when_message_start_says_0() -> None:
    """LiteLLM: `input_tokens: 0` at the start, the count in message_delta; 0 is nobody's
    count (null), and a later count replaces it."""
    start = _parse("anthropic", {"type": "message_start", "message": {
        "id": "msg_1", "usage": {"input_tokens": 0, "output_tokens": 1}}})  # fmt: skip
    assert start.prompt_tokens is None
    end = _parse("anthropic", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                               "usage": {"input_tokens": 14, "output_tokens": 30}})  # fmt: skip
    assert (end.prompt_tokens, end.completion_tokens, end.finish_reason) == (14, 30, "end_turn")
    only_output = _parse("anthropic", {"type": "message_delta", "delta": {},
                                       "usage": {"output_tokens": 30}})  # fmt: skip
    assert only_output.prompt_tokens is None  # does not replace message_start's count


@pytest.mark.parametrize(
    ("value", "shown"),
    [("1e18", "1e+18"), ("-8", "-8"), ("2147483648", "2147483648"), ('"12"', '"12"'),
     ("true", "true"), ("7.0", "7.0"), ("1180591620717411303424", "1.1805916207174113e+21")],
)  # fmt: skip
@pytest.mark.parametrize(
    ("api", "event"),
    [
        ("openai-chat", '{"choices": [], "usage": {"completion_tokens": %s}}'),
        ("openai-responses", '{"type": "response.completed", "response": {"usage": '
                             '{"output_tokens": %s}}}'),
        ("anthropic", '{"type": "message_delta", "usage": {"output_tokens": %s}}'),
        ("ollama-chat", '{"done": true, "eval_count": %s}'),
        ("tgi", '{"token": {"text": "", "special": true}, "details": {"generated_tokens": %s}}'),
    ],
)  # fmt: skip
def test_a_usage_count_no_server_can_mean_is_a_problem_not_a_figure(
    api: str, event: str, value: str, shown: str
) -> None:
    """Negative, fractional, string, bool or past 2**31: no count taken, the value kept as
    text (as parsed: a number past 64 bits arrives as a float)."""
    delta = adapter_for(api).parse(b"", (event % value).encode())
    assert delta.completion_tokens is None
    assert delta.usage_problem is not None
    assert delta.usage_problem.endswith(f"={shown}")
    ok = adapter_for(api).parse(b"", (event % "2147483647").encode())
    assert (ok.completion_tokens, ok.usage_problem) == (2**31 - 1 - (api == "tgi"), None)
