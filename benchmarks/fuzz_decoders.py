"""Fuzz the per-chunk decoders: SSE, NDJSON, every adapter and the HTTP/1.1 framing.

For each decoder, `--inputs` generated cases (default 1,000,000): ~15 % random bytes, ~55 %
mutations of valid streams (bit flips, interesting bytes, inserted / deleted / duplicated
ranges, truncations, splices with other seeds, duplicated / removed / swapped delimiters,
repeated blocks, rewritten numbers) and ~30 % structured cases (token soup for SSE and
NDJSON, random JSON values in a seed event's slots for the adapters, freshly built valid
responses for HTTP). SSE, NDJSON and HTTP cases are decoded twice, whole and split at random
(byte by byte, 1-8 random cuts) into successive reads; the two results must agree. SSE and
NDJSON are decoded again under a small event cap (8-520 bytes, from the input's length):
whether the cap ends the stream, and the events before it, must agree too.

Per decoder it prints: inputs, crashes (any exception but the adapters' MalformedEvent, an
adapter returning something that is not a Delta, or an HTTP sink seeing more than one
terminal callback or callbacks out of order), split mismatches, inputs slower than
`--slow-ms`, the slowest input (ms, both decodes), total time and inputs/s. A watchdog thread
interrupts an input that runs longer than `--hang-s` (counted as a hang). The first input of
every distinct crash (exception type + innermost loadgen frame) and the first split mismatch
are saved under `--out` (`.bin` raw bytes, `.txt` with the reads and the traceback).

The HTTP framing is driven like the event loop drives it: a real `Pool`, a fake transport,
`data_received` for each read, except that `Connection.process()` is called right after it
(so an exception surfaces here instead of in the loop's handler) and the loop runs one
iteration per case to let the pool's scheduled drain finish; `connection_lost(None)` ends it.

Usage: python benchmarks/fuzz_decoders.py [--inputs 1000000] [--seed 0]
       [--decoders sse,chat,completions,http,ndjson,anthropic,tgi,ollama-chat,ollama-generate,
       responses,generic] [--max-seconds S] [--out reports/fuzz]
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import itertools
import json
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.adapters import adapter_for
from loadgen.adapters.generic import generic_spec
from loadgen.adapters.ndjson import NdjsonDecoder
from loadgen.adapters.protocol import Delta, MalformedEvent
from loadgen.adapters.sse import EventTooLarge, SseDecoder
from loadgen.engine.transport import MAX_HEAD_BYTES, Connection, Pool, make_endpoint

NS_PER_MS = 1_000_000
ENDPOINT = make_endpoint("http://127.0.0.1:1", "/v1/chat/completions", {})

# -- seeds and dictionaries ---------------------------------------------------------------

CHAT_PAYLOADS = [
    b'{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":null},"finish_reason":null}]}',
    b'{"choices":[{"index":0,"delta":{"content":" hello"},"finish_reason":null}]}',
    b'{"choices":[{"delta":{"reasoning_content":"think"}}]}',
    b'{"choices":[{"delta":{"reasoning":"r","content":""}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}',
    b'{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
    b'{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}',
    b'{"error":{"message":"overloaded","type":"server_error","code":503}}',
    b'{"error":"plain string error"}',
    b"[DONE]",
]
COMPLETION_PAYLOADS = [
    b'{"id":"x","object":"text_completion","choices":[{"index":0,"text":" hi",'
    b'"logprobs":null,"finish_reason":null}]}',
    b'{"choices":[{"text":"","finish_reason":"stop"}]}',
    b'{"choices":[{"text":"\\u00e9\\ud83d\\ude00"}],"usage":null}',
    b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}',
    b'{"error":{"message":"bad"}}',
    b"[DONE]",
]
ANTHROPIC_PAYLOADS = [
    b'{"type":"message_start","message":{"id":"m","role":"assistant","content":[],'
    b'"usage":{"input_tokens":25,"cache_read_input_tokens":3,"output_tokens":1}}}',
    b'{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}',
    b'{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hm"}}',
    b'{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"E"}}',
    b'{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello"}}',
    b'{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t",'
    b'"name":"f","input":{}}}',
    b'{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta",'
    b'"partial_json":"{\\"a\\": "}}',
    b'{"type":"content_block_start","index":3,"content_block":{"type":"redacted_thinking"}}',
    b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}',
    b'{"type":"message_stop"}',
    b'{"type":"ping"}',
    b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
]
TGI_PAYLOADS = [
    b'{"index":1,"token":{"id":1849,"text":" Deep","logprob":-0.5,"special":false},'
    b'"generated_text":null,"details":null}',
    b'{"index":4,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},"generated_text":'
    b'" Deep","details":{"finish_reason":"eos_token","generated_tokens":4,"seed":null,'
    b'"input_length":7}}',
    b'{"error":"Out of available cache blocks","error_type":"generation"}',
]
OLLAMA_CHAT_PAYLOADS = [
    b'{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant",'
    b'"content":"","thinking":"Hm"},"done":false}',
    b'{"model":"m","message":{"role":"assistant","content":"The"},"done":false}',
    b'{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":'
    b'{"name":"f","arguments":{}}}]},"done":false}',
    b'{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
    b'"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,'
    b'"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000}',
    b'{"error":"model not found"}',
]
OLLAMA_GENERATE_PAYLOADS = [
    b'{"model":"m","response":"","thinking":"a","done":false}',
    b'{"model":"m","response":" b","done":false}',
    b'{"model":"m","response":"","done":true,"context":[1,2],"done_reason":"length",'
    b'"total_duration":10,"prompt_eval_count":2,"eval_count":3,"eval_duration":7}',
    b'{"error":"bad"}',
]
RESPONSES_PAYLOADS = [
    b'{"type":"response.created","sequence_number":0,"response":{"id":"r","status":'
    b'"in_progress","output":[],"usage":null}}',
    b'{"type":"response.reasoning_summary_text.delta","item_id":"rs","delta":"**Plan**"}',
    b'{"type":"response.reasoning_text.delta","item_id":"rs","delta":"step"}',
    b'{"type":"response.output_text.delta","item_id":"msg","output_index":1,"delta":"Hi"}',
    b'{"type":"response.function_call_arguments.delta","delta":"{\\"a\\""}',
    b'{"type":"response.output_text.done","text":"Hi"}',
    b'{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":12,'
    b'"output_tokens":30,"output_tokens_details":{"reasoning_tokens":20}}}}',
    b'{"type":"response.incomplete","response":{"incomplete_details":{"reason":'
    b'"max_output_tokens"},"usage":{"output_tokens":8}}}',
    b'{"type":"response.failed","response":{"error":{"message":"boom"}}}',
    b'{"type":"error","code":"ERR","message":"Something went wrong"}',
]
GENERIC_PAYLOADS = [*CHAT_PAYLOADS, b'{"done":true,"usage":{"completion_tokens":3}}']
GENERIC = generic_spec(
    {
        "body": {"p": "$prompt", "n": "$max_tokens"}, "content": "choices[0].delta.content",
        "reasoning": "choices[0].delta.reasoning", "done": {"path": "done", "equals": True},
        "output_tokens": "usage.completion_tokens", "prompt_tokens": "usage.prompt_tokens",
        "error": "error",
    },
    "fuzz",
)  # fmt: skip
NDJSON_SEEDS = [
    b"".join(p + b"\n" for p in OLLAMA_CHAT_PAYLOADS),
    b"".join(p + b"\r\n" for p in OLLAMA_GENERATE_PAYLOADS),
    b'{"a":1}\n\n  \n\t{"b":2}  \r\n{"c"',
    b"\n\n\n",
]
NDJSON_TOKENS = [b"\n", b"\r\n", b"\r", b" ", b"\t", b"\x0b", b"\x0c", b"{}", b"x", b"\xff",
                 b'{"done":true}']  # fmt: skip
NDJSON_DELIMS = [b"\n", b"\r\n", b" ", b"{", b"}"]
SSE_SEEDS = [
    b"".join(b"data: " + p + b"\n\n" for p in CHAT_PAYLOADS),
    b"".join(b"data: " + p + b"\r\n\r\n" for p in COMPLETION_PAYLOADS),
    b": ping\n\nevent: delta\r\ndata: a\r\ndata: b\r\n\r\nid: 7\rretry: 10\rdata:x\r\r",
    b"data: last event without its blank line",
    b":\n:\n\ndata\n\ndata:\n\nevent:\n\n",
]
JSON_TOKENS = [
    b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"null", b"true", b"false", b"0", b"-1",
    b"1e999", b"18446744073709551616", b'"choices"', b'"delta"', b'"text"', b'"usage"',
    b'"error"', b"[]", b"{}", b'"\\ud800"', b"\\u0000", b"\xff", b"\xc3\xa9", b" ",
]  # fmt: skip
SSE_TOKENS = [
    b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n", b"data:", b"data: ", b"event:", b": ", b":",
    b"id:", b"retry:", b"[DONE]", b" ", b"\x00", b"\xef\xbb\xbf",
]  # fmt: skip
HTTP_TOKENS = [
    b"\r\n", b"\n", b"\r\n\r\n", b"\r", b";", b":", b" ", b"0", b"0\r\n\r\n", b"HTTP/1.1 ",
    b"HTTP/1.0 ", b"HTTP/1.1 100 Continue\r\n\r\n", b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: ", b"Connection: close\r\n", b"chunked", b"ffffffff", b"-1", b"0x10",
    b"1_0", b"+5",
]  # fmt: skip
INTERESTING_BYTES = b'\x00\x01\x7f\x80\xff\r\n :;0019afAFx-+_"{}[],\\'
SOUP_TOKENS = [*SSE_TOKENS, b"x", b"{}", b"[DONE]"]
SSE_DELIMS = [b"\n", b"\r\n", b"\r", b"\n\n", b":", b"data:", b" "]
JSON_DELIMS = [b",", b":", b"{", b"}", b"[", b"]", b'"']
HTTP_DELIMS = [b"\r\n", b"\r\n\r\n", b"\n", b":", b" ", b";", b"HTTP/"]
OPENAI_KEYS = ["choices", "delta", "content", "text", "reasoning", "reasoning_content"]
OPENAI_KEYS += ["tool_calls", "usage", "completion_tokens", "prompt_tokens", "error"]
OPENAI_KEYS += ["message", "finish_reason", "index", "role"]
OPENAI_KEYS += ["type", "content_block", "partial_json", "thinking", "token", "special",
                "details", "generated_tokens", "response", "done", "eval_count",
                "total_duration", "incomplete_details", "reason", "input_tokens",
                "output_tokens"]  # fmt: skip


def http_response(
    rng: random.Random, body_chunks: list[bytes]
) -> tuple[bytes, tuple[int, bytes, str]]:
    """A valid response carrying `body_chunks`, and the (status, body, terminal) it must give."""
    status = rng.choice([200, 200, 200, 201, 400, 429, 500, 503])
    framing = rng.choice(["chunked", "chunked", "length", "close"])
    head = [f"HTTP/1.{rng.choice('10')} {status} {rng.choice(['OK', 'Whatever', ''])}".encode()]
    extra = [b"Content-Type: text/event-stream", b"Cache-Control: no-cache", b"X-Request-Id: 7"]
    rng.shuffle(extra)
    head += extra[: rng.randint(0, 3)]
    if rng.random() < 0.3:
        head.append(b"Connection: " + rng.choice([b"keep-alive", b"close", b"Keep-Alive"]))
    body_chunks = [c for c in body_chunks if c]
    body = b"".join(body_chunks)
    if framing == "chunked":
        head.append(b"Transfer-Encoding: " + rng.choice([b"chunked", b"Chunked", b"gzip, chunked"]))
        ext = rng.choice([b"", b"", b";x=1", b"; name"])
        hex_case = rng.choice([str.lower, str.upper])
        payload = b"".join(
            hex_case(f"{len(c):x}").encode() + ext + b"\r\n" + c + b"\r\n" for c in body_chunks
        )
        payload += b"0\r\n" + rng.choice([b"", b"", b"X-Trailer: 1\r\n"]) + b"\r\n"
    elif framing == "length":
        head.append(f"Content-Length: {len(body)}".encode())
        payload = body
    else:
        payload = body
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if rng.random() < 0.1 else b""
    return interim + b"\r\n".join(head) + b"\r\n\r\n" + payload, (status, body, "end")


def split_into_events(rng: random.Random, stream: bytes) -> list[bytes]:
    """An SSE stream cut at event boundaries, as a server would flush it into chunks."""
    events = [e + b"\n\n" for e in stream.split(b"\n\n") if e]
    return events[: rng.randint(0, len(events))] if rng.random() < 0.2 else events


# -- mutation ---------------------------------------------------------------------------------


class Mutator:
    """AFL-style byte mutations of a seed, with a dictionary and delimiters per input format."""

    def __init__(
        self, rng: random.Random, seeds: list[bytes], tokens: list[bytes], delims: list[bytes]
    ) -> None:
        self.rng = rng
        self.seeds = seeds
        self.tokens = tokens
        self.delims = delims
        self.ops: list[Callable[[bytearray], bytearray]] = [
            self.flip_bit, self.set_byte, self.insert_random, self.insert_token,
            self.delete_range, self.duplicate_range, self.truncate, self.splice,
            self.edit_delimiter, self.repeat_block, self.rewrite_number,
        ]  # fmt: skip

    def mutate(self, data: bytes) -> bytes:
        buf = bytearray(data)
        for _ in range(self.rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
            buf = self.rng.choice(self.ops)(buf)
        return bytes(buf)

    def _pos(self, buf: bytearray, *, end: bool = False) -> int:
        return self.rng.randint(0, len(buf)) if end or not buf else self.rng.randrange(len(buf))

    def flip_bit(self, buf: bytearray) -> bytearray:
        if buf:
            buf[self._pos(buf)] ^= 1 << self.rng.randrange(8)
        return buf

    def set_byte(self, buf: bytearray) -> bytearray:
        if buf:
            pool = INTERESTING_BYTES if self.rng.random() < 0.7 else bytes(range(256))
            buf[self._pos(buf)] = self.rng.choice(pool)
        return buf

    def insert_random(self, buf: bytearray) -> bytearray:
        at = self._pos(buf, end=True)
        buf[at:at] = self.rng.randbytes(self.rng.randint(1, 8))
        return buf

    def insert_token(self, buf: bytearray) -> bytearray:
        at = self._pos(buf, end=True)
        buf[at:at] = self.rng.choice(self.tokens)
        return buf

    def delete_range(self, buf: bytearray) -> bytearray:
        at = self._pos(buf, end=True)
        del buf[at : at + self.rng.randint(1, 16)]
        return buf

    def duplicate_range(self, buf: bytearray) -> bytearray:
        at = self._pos(buf, end=True)
        piece = buf[at : at + self.rng.randint(1, 32)]
        to = self._pos(buf, end=True)
        buf[to:to] = piece
        return buf

    def truncate(self, buf: bytearray) -> bytearray:
        return buf[: self._pos(buf, end=True)]

    def splice(self, buf: bytearray) -> bytearray:
        other = self.rng.choice(self.seeds)
        return buf[: self._pos(buf, end=True)] + other[self.rng.randint(0, len(other)) :]

    def _delimiter_at(self, buf: bytearray) -> tuple[bytes, int] | None:
        delim = self.rng.choice(self.delims)
        starts, at = [], buf.find(delim)
        while at >= 0 and len(starts) < 64:
            starts.append(at)
            at = buf.find(delim, at + 1)
        return (delim, self.rng.choice(starts)) if starts else None

    def edit_delimiter(self, buf: bytearray) -> bytearray:
        """Remove, double or swap one occurrence of a delimiter."""
        found = self._delimiter_at(buf)
        if found is None:
            return buf
        delim, at = found
        action = self.rng.randrange(3)
        new = b"" if action == 0 else delim * 2 if action == 1 else self.rng.choice(self.delims)
        buf[at : at + len(delim)] = new
        return buf

    def repeat_block(self, buf: bytearray) -> bytearray:
        """Repeat the block from a delimiter (or the start) to the next: 2-4 times, rarely 3,000."""
        found = self._delimiter_at(buf)
        if found is None:
            return buf
        delim, start = found
        if self.rng.random() < 0.3:
            start = 0
        end = buf.find(delim, start + 1)
        end = len(buf) if end < 0 else end + len(delim)
        times = 3000 if self.rng.random() < 0.01 else self.rng.randint(2, 4)
        buf[start:end] = buf[start:end] * times
        return buf

    def rewrite_number(self, buf: bytearray) -> bytearray:
        """Replace a run of hex digits (a length, a chunk size, a status) with another number."""
        at = self._pos(buf, end=True)
        while at < len(buf) and chr(buf[at]) not in "0123456789abcdefABCDEF":
            at += 1
        end = at
        while end < len(buf) and chr(buf[end]) in "0123456789abcdefABCDEF":
            end += 1
        value = self.rng.choice([0, 1, 7, 16, 255, 4096, 2**31, 2**63, 2**64 + 1, -1])
        forms = [str(value), f"{value:x}", f"{value:X}", f"0x{value:x}", f" {value} ", "9" * 40]
        buf[at:end] = self.rng.choice(forms).encode()
        return buf


def random_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(
        rng.choice((rng.randint(0, 16), rng.randint(0, 128), rng.randint(0, 1024)))
    )


def random_splits(rng: random.Random, data: bytes) -> list[bytes]:
    """`data` as successive reads: byte by byte, or cut at 1-8 random offsets."""
    if len(data) <= 2048 and rng.random() < 0.15:
        return [data[i : i + 1] for i in range(len(data))]
    cuts = sorted({0, len(data), *(rng.randint(0, len(data)) for _ in range(rng.randint(1, 8)))})
    return [data[a:b] for a, b in itertools.pairwise(cuts)]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**64, rng.randint(-999, 999)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e308, -1e-308])
    if kind in (4, 5):
        return rng.choice(["", "x", " hi", "\u00e9", "\ud83d", "\x00", "stop", "[DONE]"])
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = [
        rng.choice(OPENAI_KEYS) if rng.random() < 0.8 else "k" for _ in range(rng.randint(0, 4))
    ]
    return {k: random_json(rng, depth + 1) for k in keys}


def replace_subtree(rng: random.Random, obj: Any) -> Any:
    """`obj` with one random node (maybe the root) replaced by a random JSON value."""
    if rng.random() < 0.25 or not isinstance(obj, dict | list) or not obj:
        return random_json(rng)
    key = rng.choice(list(obj)) if isinstance(obj, dict) else rng.randrange(len(obj))
    obj[key] = replace_subtree(rng, obj[key])
    return obj


# -- decoders under test ----------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    """One fuzz input: what is fed, and (SSE/HTTP) the same bytes as successive reads."""

    data: bytes
    event: bytes = b""
    pieces: list[bytes] = field(default_factory=list)
    expected: Any = None  # for freshly built valid HTTP responses


class SplitMismatch(Exception):
    """Decoding whole and split gave different results (not a crash, counted apart by kind)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class InvariantBroken(AssertionError):
    """A decoder returned something it must not (counted as a crash)."""


def decode_sse(pieces: list[bytes]) -> tuple[list[tuple[bytes, bytes]], int]:
    decoder = SseDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    events.extend(decoder.close())
    return events, decoder.comments


class FakeTransport:
    """The transport methods `Connection` uses."""

    aborted = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class Recorder:
    """An ExchangeSink that keeps the callbacks in order, without timestamps."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.calls.append(("head", status))

    def on_body(self, data: bytes, t_ns: int) -> None:
        self.calls.append(("body", data))

    def on_end(self, t_ns: int) -> None:
        self.calls.append(("end",))

    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
        self.calls.append(("lost", got_response_bytes))

    def outcome(self) -> tuple[int | None, bytes, str | None]:
        """(status, body bytes joined, terminal callback); raise InvariantBroken on bad order."""
        kinds = [c[0] for c in self.calls]
        terminals = [k for k in kinds if k in ("end", "lost")]
        if kinds.count("head") > 1 or len(terminals) > 1:
            raise InvariantBroken(f"callbacks {kinds}")
        if terminals and kinds[-1] not in ("end", "lost"):
            raise InvariantBroken(f"callbacks after the terminal one: {kinds}")
        if "body" in kinds and ("head" not in kinds or kinds.index("head") > kinds.index("body")):
            raise InvariantBroken(f"body before head: {kinds}")
        status = self.calls[0][1] if kinds and kinds[0] == "head" else None
        body = b"".join(c[1] for c in self.calls if c[0] == "body")
        return status, body, terminals[0] if terminals else None


def feed_http(pieces: list[bytes]) -> tuple[int | None, bytes, str | None]:
    """Feed reads to a fresh Connection (inside the running loop), close it, return the outcome."""
    recorder = Recorder()
    conn = Connection(Pool(ENDPOINT))
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]  # duck-typed, like uvloop's
    conn.sink = recorder
    for piece in pieces:
        conn.data_received(piece)
        conn.process()
    conn.connection_lost(None)
    return recorder.outcome()


@dataclass(slots=True)
class Target:
    """A decoder: how to make a case from the rng, and how to run one (raise on a problem)."""

    name: str
    make: Callable[[random.Random, Mutator], Case]
    run: Callable[[Case], None]
    seeds: list[bytes]
    tokens: list[bytes]
    delims: list[bytes]


def make_sse(rng: random.Random, mut: Mutator) -> Case:
    roll = rng.random()
    if roll < 0.15:
        data = random_bytes(rng)
    elif roll < 0.7:
        data = mut.mutate(rng.choice(mut.seeds))
    else:
        data = b"".join(rng.choice(SOUP_TOKENS) for _ in range(rng.randint(0, 60)))
    return Case(data, pieces=random_splits(rng, data))


def decode_capped(decoder: SseDecoder | NdjsonDecoder, pieces: list[bytes]) -> tuple[Any, ...]:
    """Events, comments and whether the event cap ended the stream."""
    events: list[tuple[bytes, bytes]] = []
    try:
        for piece in pieces:
            events.extend(decoder.feed(piece))
        events.extend(decoder.close())
    except EventTooLarge as exc:
        return events + exc.events, decoder.comments, True
    return events, decoder.comments, False


def check_cap(case: Case, make: Callable[[int], SseDecoder | NdjsonDecoder]) -> None:
    """Under a small cap (from the input's length: 8 to 520 bytes), the verdict and the events
    before it do not depend on the split either."""
    cap = 8 + len(case.data) % 513
    if decode_capped(make(cap), case.pieces) != decode_capped(make(cap), [case.data]):
        raise SplitMismatch(f"capped at {cap} bytes, events or verdict differ")


def run_sse(case: Case) -> None:
    whole = decode_sse([case.data])
    if decode_sse(case.pieces) != whole:
        raise SplitMismatch("SSE events or comments differ between whole and split")
    check_cap(case, SseDecoder)


def make_adapter_case(payloads: list[bytes]) -> Callable[[random.Random, Mutator], Case]:
    parsed = [json.loads(p) for p in payloads if p.startswith(b"{")]

    def make(rng: random.Random, mut: Mutator) -> Case:
        roll = rng.random()
        if roll < 0.15:
            data = random_bytes(rng)
        elif roll < 0.7:
            data = mut.mutate(rng.choice(mut.seeds))
        else:
            obj = replace_subtree(rng, json.loads(json.dumps(rng.choice(parsed))))
            data = json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        event = b"" if rng.random() < 0.9 else rng.choice([b"message", b"error", b"\xff"])
        return Case(data, event=event)

    return make


def make_ndjson(rng: random.Random, mut: Mutator) -> Case:
    roll = rng.random()
    if roll < 0.15:
        data = random_bytes(rng)
    elif roll < 0.7:
        data = mut.mutate(rng.choice(mut.seeds))
    else:
        data = b"".join(rng.choice(NDJSON_TOKENS) for _ in range(rng.randint(0, 60)))
    return Case(data, pieces=random_splits(rng, data))


def decode_ndjson(pieces: list[bytes]) -> list[tuple[bytes, bytes]]:
    decoder = NdjsonDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    return events + decoder.close()


def run_ndjson(case: Case) -> None:
    whole = decode_ndjson([case.data])
    if any(not line or line != line.strip() for _, line in whole):
        raise InvariantBroken("a blank or padded NDJSON line")
    if decode_ndjson(case.pieces) != whole:
        raise SplitMismatch("NDJSON lines differ between whole and split")
    check_cap(case, NdjsonDecoder)


def make_adapter_run(api: str) -> Callable[[Case], None]:
    adapter = adapter_for(api, GENERIC)

    def run(case: Case) -> None:
        try:
            delta = adapter.parse(case.event, case.data)
        except MalformedEvent:
            return
        if not isinstance(delta, Delta):
            raise InvariantBroken(f"parse returned {type(delta).__name__}, not a Delta")

    return run


def make_http(rng: random.Random, mut: Mutator) -> Case:
    roll = rng.random()
    expected = None
    if roll < 0.1:
        data = random_bytes(rng)
    elif roll < 0.2:
        line = rng.choice([b"HTTP/1.1 200 OK", b"HTTP/1.0 404 Nope", b"HTTP/1.1 100 Continue"])
        data = line + b"\r\n" + random_bytes(rng)
    elif roll < 0.75:
        data = mut.mutate(rng.choice(mut.seeds))
    else:
        body = split_into_events(rng, rng.choice(SSE_SEEDS))
        if rng.random() < 0.3:
            body = [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(0, 5))]
        data, expected = http_response(rng, body)
    return Case(data, pieces=random_splits(rng, data), expected=expected)


def run_http(case: Case) -> None:
    whole = feed_http([case.data])
    if case.expected is not None and whole != case.expected:
        raise SplitMismatch("a valid response decoded wrongly", f"{whole!r:.300}")
    split = feed_http(case.pieces)
    if split != whole:
        big = f", input > {MAX_HEAD_BYTES // 1024} KiB" if len(case.data) > MAX_HEAD_BYTES else ""
        kind = f"whole → {whole[2]}, split → {split[2]}{big}"
        raise SplitMismatch(kind, f"whole {whole!r:.300} != split {split!r:.300}")


def targets(rng: random.Random) -> dict[str, Target]:
    http_seeds = [http_response(rng, split_into_events(rng, s))[0] for s in SSE_SEEDS * 8]
    return {
        "sse": Target("sse", make_sse, run_sse, SSE_SEEDS, SSE_TOKENS, SSE_DELIMS),
        "chat": Target(
            "chat",
            make_adapter_case(CHAT_PAYLOADS),
            make_adapter_run("openai-chat"),
            CHAT_PAYLOADS,
            JSON_TOKENS,
            JSON_DELIMS,
        ),
        "completions": Target(
            "completions",
            make_adapter_case(COMPLETION_PAYLOADS),
            make_adapter_run("openai-completions"),
            COMPLETION_PAYLOADS,
            JSON_TOKENS,
            JSON_DELIMS,
        ),
        "http": Target("http", make_http, run_http, http_seeds, HTTP_TOKENS, HTTP_DELIMS),
        "ndjson": Target(
            "ndjson", make_ndjson, run_ndjson, NDJSON_SEEDS, NDJSON_TOKENS, NDJSON_DELIMS
        ),
        **{
            name: Target(
                name, make_adapter_case(payloads), make_adapter_run(api), payloads, JSON_TOKENS,
                JSON_DELIMS,
            )
            for name, api, payloads in (
                ("anthropic", "anthropic", ANTHROPIC_PAYLOADS),
                ("tgi", "tgi", TGI_PAYLOADS),
                ("ollama-chat", "ollama-chat", OLLAMA_CHAT_PAYLOADS),
                ("ollama-generate", "ollama-generate", OLLAMA_GENERATE_PAYLOADS),
                ("responses", "openai-responses", RESPONSES_PAYLOADS),
                ("generic", "generic", GENERIC_PAYLOADS),
            )
        },
    }  # fmt: skip


# -- the fuzz loop ----------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """What one decoder's run found."""

    inputs: int = 0
    crashes: int = 0
    mismatches: int = 0
    hangs: int = 0
    slow: int = 0
    slowest_ns: int = 0
    slowest_bytes: int = 0  # size of the slowest input
    elapsed_s: float = 0.0
    signatures: dict[str, int] = field(default_factory=dict)


class Watchdog:
    """Interrupts the main thread when one input runs longer than `limit_s`."""

    def __init__(self, limit_s: float) -> None:
        self.limit_ns = int(limit_s * 1e9)
        self.started_ns = 0  # 0: idle
        self.fired = False
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            started = self.started_ns
            if started and time.perf_counter_ns() - started > self.limit_ns and not self.fired:
                self.fired = True
                _thread.interrupt_main()


def signature(exc: BaseException) -> str:
    """Exception type and the innermost loadgen frame: one line per distinct crash."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "loadgen" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def save(out: Path, stem: str, case: Case, exc: BaseException) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.bin").write_bytes(case.data)
    tb = "".join(traceback.format_exception(exc))
    reads = f"reads = {case.pieces!r}\n" if case.pieces else ""
    (out / f"{stem}.txt").write_text(
        f"event = {case.event!r}\ndata = {case.data!r}\n{reads}\n{tb}", encoding="utf-8"
    )


async def fuzz(target: Target, args: argparse.Namespace, dog: Watchdog) -> Tally:
    """Run `args.inputs` cases through one decoder; the loop turns once per case for HTTP."""
    rng = random.Random(f"{args.seed}-{target.name}")
    mut = Mutator(rng, target.seeds, target.tokens, target.delims)
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    tally, slow_ns = Tally(), int(args.slow_ms * NS_PER_MS)
    is_http = target.name == "http"
    t0 = time.perf_counter()
    deadline = t0 + args.max_seconds if args.max_seconds else float("inf")
    for i in range(args.inputs):
        case = target.make(rng, mut)
        start = time.perf_counter_ns()
        dog.started_ns = start
        try:
            target.run(case)
        except SplitMismatch as exc:
            tally.mismatches += 1
            kind = f"split mismatch: {exc.kind}"
            if kind not in tally.signatures:
                save(args.out, f"{target.name}-mismatch-{len(tally.signatures) + 1}", case, exc)
            tally.signatures[kind] = tally.signatures.get(kind, 0) + 1
        except KeyboardInterrupt as exc:
            if not dog.fired:
                raise
            dog.fired = False
            tally.hangs += 1
            save(args.out, f"{target.name}-hang-{tally.hangs}", case, exc)
        except Exception as exc:
            tally.crashes += 1
            sig = signature(exc)
            if sig not in tally.signatures:
                save(args.out, f"{target.name}-crash-{len(tally.signatures) + 1}", case, exc)
            tally.signatures[sig] = tally.signatures.get(sig, 0) + 1
        took = time.perf_counter_ns() - start
        dog.started_ns = 0
        if took > tally.slowest_ns:
            tally.slowest_ns, tally.slowest_bytes = took, len(case.data)
        if took > slow_ns:
            tally.slow += 1
            if tally.slow == 1:
                save(args.out, f"{target.name}-slow", case, TimeoutError(f"{took / 1e9:.1f} s"))
        tally.inputs = i + 1
        if is_http:
            await asyncio.sleep(0)  # the pools' scheduled drains run (they find nothing left)
        if tally.inputs % 100_000 == 0:
            print(f"  {target.name}: {tally.inputs:,} inputs", file=sys.stderr, flush=True)
        if time.perf_counter() > deadline:
            break
    tally.elapsed_s = time.perf_counter() - t0
    if loop_errors:
        tally.signatures["exception in an event-loop callback"] = len(loop_errors)
        tally.crashes += len(loop_errors)
    return tally


def report(name: str, t: Tally) -> None:
    rate = t.inputs / t.elapsed_s if t.elapsed_s else 0.0
    print(
        f"{name:<12} {t.inputs:>10,} {t.crashes:>8,} {t.mismatches:>10,} {t.hangs:>6} {t.slow:>6}"
        f" {t.slowest_ns / NS_PER_MS:>11.2f} {t.elapsed_s:>9.1f} {rate:>10,.0f}"
    )
    print(f"{'':<12}   slowest input: {t.slowest_bytes:,} bytes")
    for sig, count in sorted(t.signatures.items(), key=lambda kv: -kv[1]):
        print(f"{'':<12}   {count:>8,} × {sig}")


async def main_async(args: argparse.Namespace) -> int:
    dog = Watchdog(args.hang_s)
    chosen = targets(random.Random(args.seed))
    tallies = {}
    for name in args.decoders.split(","):
        tallies[name] = await fuzz(chosen[name], args, dog)
    slow = f">{args.slow_ms:g}ms"
    print(
        f"{'decoder':<12} {'inputs':>10} {'crashes':>8} {'split-diff':>10} {'hangs':>6}"
        f" {slow:>6} {'slowest ms':>11} {'total s':>9} {'inputs/s':>10}"
    )
    for name, tally in tallies.items():
        report(name, tally)
    found = any(t.crashes or t.mismatches or t.hangs or t.slow for t in tallies.values())
    if found:
        print(f"first inputs saved under {args.out}/")
    return 1 if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="cases per decoder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--decoders",
        default="sse,chat,completions,http,ndjson,anthropic,tgi,ollama-chat,ollama-generate,"
        "responses,generic",
    )
    parser.add_argument("--max-seconds", type=float, default=0, help="stop a decoder early (0: no)")
    parser.add_argument("--slow-ms", type=float, default=1000, help="count inputs slower than this")
    parser.add_argument("--hang-s", type=float, default=30, help="interrupt an input after this")
    parser.add_argument("--out", type=Path, default=Path("reports/fuzz"))
    args = parser.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
