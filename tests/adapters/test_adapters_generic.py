"""The generic adapter: a workload-described API (body template, JSON paths, framing) and
the ConfigErrors that catch a bad description before any traffic."""

from __future__ import annotations

import json

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.generic import generic_spec, parse_path, walk
from loadgen.adapters.protocol import BodyOptions, new_decoder
from loadgen.errors import ConfigError
from loadgen.workload.spec import loads

WORKLOAD = """
name: generic
target:
  api: generic
  path: /v1/stream
  generic:
    framing: sse
    body:
      model: $model
      input: {system: $system, text: "Q: $prompt"}
      params: {max_new: $max_tokens, stream: true}
    content: choices[0].delta.content
    reasoning: choices[0].delta.reasoning
    done: "[DONE]"
    output_tokens: usage.completion_tokens
    prompt_tokens: usage.prompt_tokens
    error: error
classes:
  chat:
    arrival: {process: constant, rate_per_s: 1}
    requests: 1
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
"""


def test_paths_parse_and_walk() -> None:
    """Dotted paths with [index] become key/index tuples; a missing step gives None."""
    path = parse_path("choices[0].delta.content", "w.yaml", "k")
    assert path == ("choices", 0, "delta", "content")
    assert parse_path("a[1][2].b", "w.yaml", "k") == ("a", 1, 2, "b")
    assert walk({"choices": [{"delta": {"content": "x"}}]}, path) == "x"
    assert walk({"choices": []}, path) is None
    assert walk({"choices": {"0": 1}}, path) is None


def test_workload_described_sse_api() -> None:
    """The template is filled (typed whole values, text inside strings); paths are read."""
    spec = loads(WORKLOAD, "w.yaml")
    adapter = adapter_for("generic", spec.target.generic)
    body = adapter.build_body([("system", "s"), ("user", "u")], 3, BodyOptions(model="m"))
    assert body == {
        "model": "m", "input": {"system": "s", "text": "Q: u"},
        "params": {"max_new": 3, "stream": True},
    }  # fmt: skip
    decoder = new_decoder(adapter)
    stream = [
        {"choices": [{"delta": {"reasoning": "hm"}}]},
        {"choices": [{"delta": {"content": "hi"}}]},
        {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 4}},
    ]
    raw = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in stream)
    events = decoder.feed(raw + b"data: [DONE]\n\n")
    deltas = [adapter.parse(e, d) for e, d in events]
    assert [(d.reasoning_chars, d.content_chars) for d in deltas[:2]] == [(2, 0), (0, 2)]
    assert (deltas[2].completion_tokens, deltas[2].prompt_tokens) == (2, 4)
    assert deltas[3].done
    assert not any(d.done for d in deltas[:3])
    assert adapter.parse(b"", b'{"error": {"message": "busy"}}').error == "busy"


def test_ndjson_framing_and_a_done_path() -> None:
    """framing: ndjson with done: {path, equals} and messages as a whole value."""
    raw = {
        "framing": "ndjson", "body": {"messages": "$messages", "n": "$max_tokens"},
        "content": "message.content", "done": {"path": "done", "equals": True},
    }  # fmt: skip
    adapter = adapter_for("generic", generic_spec(raw, "w.yaml"))
    assert adapter.framing == "ndjson"
    assert adapter.build_body([("user", "u")], 2, BodyOptions(model="m")) == {
        "messages": [{"role": "user", "content": "u"}], "n": 2,
    }  # fmt: skip
    lines = new_decoder(adapter).feed(b'{"message":{"content":"a"},"done":false}\n{"done":true}\n')
    first, last = (adapter.parse(e, d) for e, d in lines)
    assert first.content_chars == 1
    assert not first.done
    assert last.done


def test_done_by_event_name() -> None:
    """done: {event: name} ends the stream at that SSE event."""
    raw = {"body": {"p": "$prompt", "n": "$max_tokens"}, "content": "t",
           "done": {"event": "end"}}  # fmt: skip
    adapter = adapter_for("generic", generic_spec(raw, "w.yaml"))
    assert adapter.parse(b"end", b"{}").done
    assert not adapter.parse(b"", b'{"t": "x"}').done


VALID = {"body": {"p": "$prompt", "n": "$max_tokens"}, "content": "t"}


@pytest.mark.parametrize(
    ("change", "key", "fragment"),
    [
        ({"framing": "grpc"}, "target.generic.framing", "sse or ndjson"),
        ({"content": None}, "target.generic.content", "JSON path"),
        ({"content": "a..b"}, "target.generic.content", "not a valid path"),
        ({"colour": 1}, "target.generic.colour", "unknown key"),
        ({"body": {"p": "$prompt"}}, "target.generic.body", "output length"),
        ({"body": {"n": "$max_tokens"}}, "target.generic.body", "no prompt"),
        ({"body": {"p": "$promt", "n": "$max_tokens"}}, "target.generic.body", "$promt"),
        ({"body": {"p": "x $messages", "n": "$max_tokens"}}, "target.generic.body", "whole"),
        ({"done": {"data": "x", "event": "y"}}, "target.generic.done", "exactly one"),
        ({"done": 3}, "target.generic.done", "string or a mapping"),
        ({"done": {"event": ""}}, "target.generic.done.event", "non-empty"),
    ],
)
def test_bad_generic_sections_name_the_key(change: dict, key: str, fragment: str) -> None:
    """Each mistake in target.generic is a ConfigError naming its key."""
    raw = {**VALID, **change}
    with pytest.raises(ConfigError) as err:
        generic_spec(raw, "w.yaml")
    assert err.value.key == key
    assert fragment in str(err.value)


def test_generic_needs_its_section() -> None:
    """api: generic without target.generic names the missing key."""
    text = WORKLOAD.split("  generic:")[0] + WORKLOAD.split("    error: error\n")[1]
    with pytest.raises(ConfigError) as err:
        loads(text, "w.yaml")
    assert err.value.key == "target.generic"
