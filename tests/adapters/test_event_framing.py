"""Each adapter's event framing: the bytes an output event spends on anything but its
text, at the least. It bounds the tokens a stream can carry (`Exchange.carried_tokens`), so
it must never exceed what a real output event spends: tested against each adapter's own
parser and against the streams real servers sent (tests/fixtures/streams/)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import STREAMS, captures

from loadgen.adapters import REGISTRY, adapter_for
from loadgen.adapters.protocol import Adapter, MalformedEvent
from loadgen.engine.exchange import Exchange
from loadgen.testing import PlanFactory

# Every other shape of output event each adapter reads, with one byte of text (or a bare
# tool call): each must be at least as long as the adapter's smallest.
SHAPES = {
    "openai-chat": [b'{"choices":[{"delta":{"reasoning":"x"}}]}',
                    b'{"choices":[{"delta":{"reasoning_content":"x"}}]}',
                    b'{"choices":[{"delta":{"tool_calls":1}}]}'],
    "openai-completions": [b'{"choices":[{"text":"x","finish_reason":null}]}'],
    "openai-responses": [b'{"type":"response.output_text.delta","delta":"x"}',
                         b'{"type":"response.reasoning_text.delta","delta":"x"}',
                         b'{"type":"response.reasoning_summary_text.delta","delta":"x"}',
                         b'{"type":"response.function_call_arguments.delta","delta":"x"}',
                         b'{"type":"response.custom_tool_call_input.delta","delta":"x"}'],
    "anthropic": [b'{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}',
                  b'{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"x"}}',
                  b'{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"x"}}',
                  b'{"type":"content_block_start","content_block":{"type":"server_tool_use"}}',
                  b'{"type":"content_block_start","content_block":{"type":"redacted_thinking"}}'],
    "tgi": [b'{"token":{"text":"x","special":false}}'],
    "ollama-chat": [b'{"message":{"thinking":"x"}}', b'{"message":{"tool_calls":1}}'],
    "ollama-generate": [b'{"thinking":"x"}'],
}  # fmt: skip


def is_output(adapter: Adapter, payload: bytes) -> bool:
    """True when `adapter` reads `payload` as an event carrying output."""
    try:
        return adapter.parse(b"", payload).has_output
    except MalformedEvent:
        return False


@pytest.mark.parametrize("api", sorted(REGISTRY))
def test_the_smallest_output_event_is_the_framing_and_one_byte(api: str) -> None:
    """The adapter's smallest output event is output and event_framing + 1 bytes long;
    every other output shape it reads is at least as long; and no event one byte shorter
    (any byte of it deleted) is output: the framing is no more than any output event's."""
    adapter = adapter_for(api)
    smallest = adapter.smallest_output_event
    assert is_output(adapter, smallest)
    assert len(smallest) == adapter.event_framing + 1
    for shape in SHAPES[api]:
        assert is_output(adapter, shape), shape
        assert len(shape) >= len(smallest), shape
    shorter = [smallest[:i] + smallest[i + 1 :] for i in range(len(smallest))]
    assert not [s for s in shorter if is_output(adapter, s)]


def carried_and_usage(name: str, api: str) -> tuple[int, int | None, int]:
    """A captured stream of `api` fed to an exchange: the tokens it could carry, its usage
    count, and its output events."""

    async def feed() -> Exchange:
        exchange = Exchange(PlanFactory().at(0.0)[0], adapter_for(api), 0)
        exchange.on_head(200, {"content-type": "text/event-stream"}, 1)
        exchange.on_body((STREAMS / name).read_bytes(), 2)
        return exchange

    exchange = asyncio.run(feed())
    return exchange.carried_tokens(), exchange.usage_completion, len(exchange.chunk_ns)


@pytest.mark.parametrize(("name", "api"), sorted((c.file, c.api) for c in captures()))
def test_no_real_servers_usage_is_beyond_what_its_stream_carried(name: str, api: str) -> None:
    """Every captured stream as its server sent it (vLLM's and LiteLLM's usage, LiteLLM's own
    count after an upstream cut, 424 for 347 chunks; llama-server's; the simulator's TGI and
    Ollama): every usage count is within what the stream could carry, so none loses its N
    to the bound; and the bound is at least the events."""
    carried, usage, events = carried_and_usage(name, api)
    assert carried > events
    if usage is not None:
        assert usage <= carried
