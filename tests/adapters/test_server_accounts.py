"""The server's own account of a request, read in-band from its stream: vLLM's per-request
`metrics`, NVIDIA Dynamo's `nvext.timing`, llama.cpp's `timings`, by the record's
ServerTimings fields (known answers from the shapes each server serializes)."""

from __future__ import annotations

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import new_decoder
from loadgen.results.records import ServerTimings, reported_timings

# vLLM 0.32's final usage chunks with `--enable-per-request-metrics`, serialized by its own
# response classes (ChatCompletionStreamResponse / CompletionStreamResponse, dumped as
# chat_completion/serving.py and completion/serving.py dump them) from
# `build_per_request_timing_metrics` over a RequestStateStats whose engine stamps were
# queued 50.0 s, scheduled 50.125 s, first token 50.2 s, last token 50.95 s, 16 tokens:
# queue 125 ms, prefill 75 ms (its float arithmetic kept), generation 750 ms, ITL 50 ms.
VLLM_CHAT_USAGE = (
    b'{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":600,"total_tokens":616,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":512}},"metrics":{"time_to_first_token_ms":'
    b'75.00000000000284,"generation_time_ms":750.0,"queue_time_ms":125.0,"mean_itl_ms":50.0,'
    b'"tokens_per_second":19.393939393939327}}'
)
VLLM_COMPLETIONS_USAGE = (
    b'{"id":"cmpl-abc","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":600,"total_tokens":616,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":512}},"metrics":{"time_to_first_token_ms":'
    b'75.00000000000284,"generation_time_ms":750.0,"queue_time_ms":125.0,"mean_itl_ms":50.0,'
    b'"tokens_per_second":19.393939393939327}}'
)
# One output token: vLLM leaves mean_itl_ms out (no gap), generation time is 0.
VLLM_ONE_TOKEN_METRICS = (
    b'{"time_to_first_token_ms":75.00000000000284,"generation_time_ms":0.0,'
    b'"queue_time_ms":125.0,"tokens_per_second":13.333333333332828}'
)
PREFILL_MS = 75.00000000000284


def stream(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


def final_timings(api: str, body: bytes) -> ServerTimings | None:
    """The server timings the last event that carried any reported, as the engine keeps them."""
    adapter = adapter_for(api)
    decoder = new_decoder(adapter)
    kept = None
    for name, data in decoder.feed(body) + decoder.close():
        delta = adapter.parse(name, data)
        if delta.server_timings is not None:
            kept = delta.server_timings
    return reported_timings(kept)


@pytest.mark.parametrize(
    ("api", "usage_chunk", "content"),
    [
        ("openai-chat", VLLM_CHAT_USAGE,
         b'{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"content":"hi"}}]}'),
        ("openai-completions", VLLM_COMPLETIONS_USAGE,
         b'{"id":"cmpl-abc","choices":[{"index":0,"text":"hi"}]}'),
    ],
)  # fmt: skip
def test_vllm_metrics_in_the_final_usage_chunk(
    api: str, usage_chunk: bytes, content: bytes
) -> None:
    """vLLM's metrics: queue = scheduled − queued, prefill = first token − scheduled, decode =
    generation time, ITL its mean; TTFT and total are summed from the engine's queue."""
    finish = content.replace(b'"hi"', b'""').replace(b"}]}", b',"finish_reason":"length"}]}')
    body = stream(content, finish, usage_chunk, b"[DONE]")
    assert final_timings(api, body) == ServerTimings(
        queue_ms=125.0, prefill_ms=PREFILL_MS, decode_ms=750.0, ttft_ms=125.0 + PREFILL_MS,
        total_ms=125.0 + PREFILL_MS + 750.0, itl_ms=50.0,
    )  # fmt: skip


def test_vllm_metrics_of_one_token_have_no_gap() -> None:
    """A one-token stream: no mean gap (vLLM leaves it out), decode 0, the rest as given."""
    chunk = b'{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1},' \
            b'"metrics":' + VLLM_ONE_TOKEN_METRICS + b"}"  # fmt: skip
    timings = final_timings("openai-chat", stream(chunk))
    assert timings is not None
    assert (timings.queue_ms, timings.decode_ms, timings.itl_ms) == (125.0, 0.0, None)


def test_vllm_metrics_missing_or_absurd_fields_are_null() -> None:
    """A field vLLM left out (no queue stamp) or one no duration can be (negative, text, a
    bool) is null, and so is every sum that needs it; an empty object is no account."""
    chunk = (b'{"id":"c","choices":[],"usage":{"completion_tokens":3},"metrics":'
             b'{"time_to_first_token_ms":-4,"generation_time_ms":"9","mean_itl_ms":true}}')  # fmt: skip
    assert final_timings("openai-chat", stream(chunk)) is None
    chunk = b'{"id":"c","choices":[],"usage":{"completion_tokens":3},' \
            b'"metrics":{"time_to_first_token_ms":40.0,"generation_time_ms":90.0}}'  # fmt: skip
    assert final_timings("openai-chat", stream(chunk)) == ServerTimings(
        prefill_ms=40.0, decode_ms=90.0
    )


def test_metrics_on_a_content_chunk_are_not_read() -> None:
    """Only closing chunks (usage or finish) are read for an account: a per-token chunk that
    carried one would cost every chunk a lookup, and no server sends it there."""
    chunk = b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],' \
            b'"metrics":{"queue_time_ms":1.0}}'  # fmt: skip
    assert final_timings("openai-chat", stream(chunk)) is None


# NVIDIA Dynamo's final chunk with `nvext: {extra_fields: ["timing"]}` in the request: the
# response's `nvext.timing` is its `TimingInfo` (lib/llm/src/protocols/common/timing.rs),
# Option fields skipped when None, `request_received_ms` epoch ms.
DYNAMO_FINISH = (
    b'{"id":"chatcmpl-d","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"nvext":{"worker_id":{"prefill_worker_id":7,"decode_worker_id":7},"timing":'
    b'{"request_received_ms":1764990000123,"prefill_wait_time_ms":31.5,"prefill_time_ms":'
    b'12.25,"ttft_ms":44.0,"total_time_ms":410.75,"kv_hit_rate":0.5}}}'
)


def test_dynamo_nvext_timing() -> None:
    """Dynamo's timing: queue = prefill wait, prefill, TTFT and total from its receipt of the
    request; no decode time or mean gap (it gives none)."""
    body = stream(b'{"id":"chatcmpl-d","choices":[{"index":0,"delta":{"content":"a"}}]}',
                  DYNAMO_FINISH, b"[DONE]")  # fmt: skip
    assert final_timings("openai-chat", body) == ServerTimings(
        queue_ms=31.5, prefill_ms=12.25, ttft_ms=44.0, total_ms=410.75
    )


def test_dynamo_nvext_without_timing_is_no_account() -> None:
    """`nvext` with only worker ids (timing not asked for) reports no timings."""
    finish = DYNAMO_FINISH.split(b',"timing"')[0] + b"}}"
    assert final_timings("openai-chat", stream(finish)) is None


def test_llama_timings_still_read() -> None:
    """llama.cpp's `timings` on the finish chunk keep their mapping beside the new accounts."""
    chunk = (b'{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
             b'"timings":{"prompt_n":10,"prompt_ms":4.0,"predicted_n":5,"predicted_ms":20.0}}')  # fmt: skip
    assert final_timings("openai-chat", stream(chunk)) == ServerTimings(
        prefill_ms=4.0, decode_ms=20.0, total_ms=24.0, prefill_tokens=10, decode_tokens=5
    )
