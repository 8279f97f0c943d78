"""The OpenAI Responses dialect of the simulator (POST /v1/responses, SSE with `event:` names).

Stream: `response.created`, `response.in_progress`; when reasoning, a reasoning output item
(`response.output_item.added`, `response.content_part.added`, `response.reasoning_text.delta`
..., `response.reasoning_text.done`, `response.content_part.done`,
`response.output_item.done`); then the message item (`response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` ..., `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`); then `response.completed`
with usage (input_tokens, output_tokens, output_tokens_details.reasoning_tokens). Every
event carries a `sequence_number`. A mid-stream failure is `response.failed`.

Output is exactly `max_output_tokens` when given (else a draw from the output
distribution). The simulator ends with `response.completed` (status `completed`) even when
the limit is what stopped it; `X-Sim-Finish` gives the other ends real servers send
(`END_KINDS`: vLLM's and llama-server's `response.completed` with status `incomplete` or
`cancelled`, OpenAI's `response.incomplete`, `response.failed`). Every Response object
carries every field the spec requires (checked against the openai SDK's types, or the
spec's required lists, by tests/sim/test_sim_dialects.py). Reasoning (a simulator rule):
`reasoning: {effort}` spends floor(f x N) of the N output tokens reasoning, f = 1/4, 1/2,
3/4 for low, medium (also the default when `reasoning` has no effort), high; none and
minimal spend none. `instructions` count as prompt words.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim.openai import error_body as openai_error_body
from loadgen.sim.wire import (
    EFFORT_FRACTIONS,
    SSE_COMMENT,
    VOCAB_JSON,
    BadRequest,
    FormatArgs,
    SimRequest,
    StreamEnd,
    content_words,
    frame,
    load_object,
    model_of,
    optional_int,
    priority,
    sse,
    words,
)

RESPONSES_PATH = "/v1/responses"
error_body = openai_error_body
# X-Sim-Finish word -> (terminal event, response.status, incomplete_details.reason).
END_KINDS: dict[str, tuple[str, str, str | None]] = {
    "": ("response.completed", "completed", None),
    "completed": ("response.completed", "completed", None),
    # vLLM and llama-server: a length stop is a `response.completed` whose status says it.
    "incomplete": ("response.completed", "incomplete", "max_output_tokens"),
    "incomplete-event": ("response.incomplete", "incomplete", "max_output_tokens"),
    "content-filter": ("response.incomplete", "incomplete", "content_filter"),
    "cancelled": ("response.completed", "cancelled", None),  # vLLM: an aborted request
    "failed": ("response.failed", "failed", None),
}


def _input_words(value: object) -> int:
    if isinstance(value, str):
        return content_words(value)
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a string or a non-empty list of items")
    total = 0
    for item in value:
        if isinstance(item, dict):
            total += content_words(item.get("content")) + content_words(item.get("output"))
    return total


def _reasoning_fraction(data: dict[str, Any]) -> float:
    reasoning = data.get("reasoning")
    if reasoning is None:
        return 0.0
    if not isinstance(reasoning, dict):
        raise BadRequest("'reasoning' must be an object")
    effort = reasoning.get("effort") or "medium"
    if effort not in EFFORT_FRACTIONS:
        raise BadRequest(f"'reasoning.effort' must be one of {', '.join(EFFORT_FRACTIONS)}")
    return EFFORT_FRACTIONS[effort]


def parse_responses(body: bytes) -> SimRequest:
    """Parse a Responses request body."""
    data = load_object(body)
    max_tokens = optional_int(data, "max_output_tokens", 1)
    prompt = _input_words(data.get("input")) + content_words(data.get("instructions"))
    return SimRequest(
        api="openai-responses",
        stream=data.get("stream") is True,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        forced=True,
        priority=priority(data),
        model=model_of(data),
        reasoning_fraction=_reasoning_fraction(data),
    )


class ResponsesFormat:
    """Event bytes of one Responses stream; numbers events and tracks the open output item."""

    __slots__ = ("_args", "_item", "_output", "_seq", "_text_head")

    content_type = "text/event-stream"

    def __init__(self, args: FormatArgs) -> None:
        self._args = args
        self._seq = 0
        self._item: str | None = None  # "reasoning" | "message" while an item is open
        self._output: list[dict[str, Any]] = []  # finished output items
        self._text_head = b""

    def _event(self, name: str, fields: dict[str, Any]) -> bytes:
        payload = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(name, payload)

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        """The Response object with every field the spec requires (the openai SDK's
        `Response` type fails without `parallel_tool_calls`, `tool_choice` or `tools`, and
        LiteLLM's `openai/` route with it), and the optional ones OpenAI sends."""
        args = self._args
        return {
            "id": args.response_id,
            "object": "response",
            "created_at": args.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": args.request.max_tokens,
            "model": args.model,
            "output": list(self._output),
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": {},
            **extra,
        }

    def _opening(self) -> bytes:
        created = self._event("response.created", {"response": self._response("in_progress")})
        progress = self._event("response.in_progress", {"response": self._response("in_progress")})
        return created + progress

    def at_accept(self, role: str) -> bytes:
        """`response.created` and `response.in_progress` before queueing (role "early")."""
        return self._opening()

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """The opening events with the first token unless they went out early."""
        return b"" if sent_early else self._opening()

    def _ids(self) -> tuple[str, int]:
        """(item id, output index) of the open item."""
        prefix = "rs_" if self._item == "reasoning" else "msg_"
        return prefix + self._args.response_id, len(self._output)

    def _part(self, text: str) -> dict[str, Any]:
        if self._item == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": []}

    def _item_obj(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        item_id, _ = self._ids()
        if self._item == "reasoning":
            return {"id": item_id, "type": "reasoning", "summary": [], "content": content}
        obj = {"id": item_id, "type": "message", "status": status, "role": "assistant"}
        return {**obj, "content": content}

    def _open_item(self, kind: str) -> bytes:
        self._item = kind
        item_id, index = self._ids()
        added = self._event(
            "response.output_item.added",
            {"output_index": index, "item": self._item_obj("in_progress", [])},
        )
        part = self._event(
            "response.content_part.added",
            {"item_id": item_id, "output_index": index, "content_index": 0, "part": self._part("")},
        )
        if kind == "message":
            self._text_head = b'"item_id":%b,"output_index":%d,"content_index":0,"delta":' % (
                orjson.dumps(item_id),
                index,
            )
        return added + part

    def _close_item(self, end_token: int) -> bytes:
        if self._item is None:
            return b""
        args = self._args
        item_id, index = self._ids()
        reasoning = self._item == "reasoning"
        text = (
            words(1, args.reasoning_tokens)
            if reasoning
            else words(args.reasoning_tokens + 1, end_token)
        )
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        done_name = "response.reasoning_text.done" if reasoning else "response.output_text.done"
        extra: dict[str, Any] = {} if reasoning else {"logprobs": []}
        parts = [
            self._event(done_name, {**where, "text": text, **extra}),
            self._event("response.content_part.done", {**where, "part": self._part(text)}),
        ]
        item = self._item_obj("completed", [self._part(text)])
        parts.append(
            self._event("response.output_item.done", {"output_index": index, "item": item})
        )
        self._output.append(item)
        self._item = None
        return b"".join(parts)

    def token(self, index: int) -> bytes:
        """One `response.output_text.delta` of token `index` in the open message item."""
        seq = self._seq
        self._seq += 1
        return (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"sequence_number":%d,%b%b,"logprobs":[]}\n\n'
            % (seq, self._text_head, VOCAB_JSON[index % len(VOCAB_JSON)])
        )

    def token_frame(self, index: int) -> bytes:
        """`frame(token(index))` (not cached: every event has its own sequence number)."""
        return frame(self.token(index))

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """Item changes as needed, then one delta with tokens first..last."""
        kind = "reasoning" if reasoning else "message"
        head = b""
        if self._item != kind:
            head = self._close_item(first - 1) + self._open_item(kind)
        if kind == "message" and first == last:
            return head + self.token(first)
        item_id, index = self._ids()
        name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        fields = {"item_id": item_id, "output_index": index, "content_index": 0}
        extra: dict[str, Any] = {} if reasoning else {"logprobs": []}
        return head + self._event(name, {**fields, "delta": words(first, last), **extra})

    def _usage(self, end: StreamEnd) -> dict[str, Any]:
        return {
            "input_tokens": end.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": end.cached_tokens or 0,
                "cache_write_tokens": 0,
            },
            "output_tokens": end.output_tokens,
            "output_tokens_details": {"reasoning_tokens": end.reasoning_tokens},
            "total_tokens": end.prompt_tokens + end.output_tokens,
        }

    def finish(self, end: StreamEnd) -> bytes:
        """Close the open item, then the terminal event with usage: `response.completed`,
        or the end `X-Sim-Finish` names (`END_KINDS`)."""
        closing = self._close_item(end.output_tokens)
        event, status, reason = END_KINDS.get(self._args.dialect.finish_word, END_KINDS[""])
        extra: dict[str, Any] = {"usage": self._usage(end)}
        if reason is not None:
            extra["incomplete_details"] = {"reason": reason}
        if status == "failed":
            extra["error"] = {"code": "server_error", "message": "simulated failure at the end"}
        response = self._response(status, **extra)
        return closing + self._event(event, {"response": response})

    def cut(self) -> bytes:
        """Nothing: the body just ends, without the terminal event."""
        return b""

    def empty_token(self) -> bytes:
        """None: no empty text deltas in this dialect."""
        return b""

    def heartbeat(self) -> bytes:
        """An SSE comment (the Responses API has no ping event)."""
        return SSE_COMMENT

    def error_event(self, message: str) -> bytes:
        """`response.failed` with the error in the response object."""
        error = {"code": "server_error", "message": message}
        return self._event("response.failed", {"response": self._response("failed", error=error)})

    def garbage(self, junk: bytes) -> bytes:
        """A delta event whose data is not JSON, then raw bytes."""
        return b"event: response.output_text.delta\ndata: {not json\n\n" + junk + b"\n\n"

    def full_response(self, end: StreamEnd) -> bytes:
        """The non-streaming response object."""
        if end.reasoning_tokens:
            self._item = "reasoning"
            self._close_item(end.reasoning_tokens)
        self._item = "message"
        self._close_item(end.output_tokens)
        return orjson.dumps(self._response("completed", usage=self._usage(end)))
