"""Issue #16: the server's side of a run: /metrics scraped beside the records, prefix-cache
hits and server ids in every record, and the simulator's true state as the known answer."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import arrivals_end_marks
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.figure import Figure

from loadgen.adapters.anthropic import AnthropicMessages
from loadgen.adapters.openai_chat import OpenAIChat
from loadgen.adapters.openai_responses import OpenAIResponses
from loadgen.analysis.server import (
    _quantile_ms,
    counter_delta,
    figure_series,
    histogram_change,
    parse_server_thresholds,
    server_audit,
    server_deltas,
    server_family,
    server_timeline,
    window_gauges,
)
from loadgen.cli import cli
from loadgen.engine.scrape import Scraper, parse_exposition, within_line_cap
from loadgen.render.terminal import server_line
from loadgen.results.records import reported_timings
from loadgen.results.runfolder import SERVER_PART_SCHEMA, read_server_metrics, server_rows_frame
from loadgen.results.summary import GaugeStats, ServerAudit
from loadgen.results.write import join_server_metrics, write_server_part
from loadgen.sim.config import config_from_mapping
from loadgen.sim.engine import Engine, EngineConfig, SeqRequest, StepResult, simulate
from loadgen.sim.metrics import SimCounters, exposition
from loadgen.sim.prefix import PrefixCache, prompt_words
from loadgen.sim.server import SimServer
from loadgen.sim.trace import NullTrace
from loadgen.testing import ReceivedRequest, ScriptedServer, simple_chat, sse
from loadgen.testing import chunk as http_chunk
from loadgen.testing.builders import workload_file

MS = 1_000_000


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` (the scraper's own thread makes it true); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def scrape_frame(texts: list[tuple[int, str]]) -> pl.DataFrame:
    """Expositions at their t_ns as the rows of server_metrics.parquet."""
    rows = []
    for t_ns, text in texts:
        samples, _ = parse_exposition(text)
        rows += [(t_ns, n, tuple(sorted(labels.items())), v) for n, labels, v in samples]
    return server_rows_frame(rows).rename({"mono_ns": "t_ns"})


# --- the simulator's /metrics and its prefix cache ----------------------------------------


def test_sim_metrics_report_the_engines_true_waiting_running_and_kv_tokens() -> None:
    """Five 100-token prompts on a batch of 2, after one step: 2 run, 3 wait, KV = 2·(100+1)."""
    engine = Engine(EngineConfig(max_batch=2))
    for i in range(5):
        engine.submit(SeqRequest(seq_id=i, prompt_tokens=100, output_tokens=10), 0)
    engine.advance(engine.next_event_ns() or 0)  # start the first step
    engine.advance(engine.next_event_ns() or 0)  # finish it: both prefilled, first tokens out
    state = engine.state()
    assert (state.waiting, state.running, state.kv_tokens) == (3, 2, 2 * (100 + 1))
    text = exposition(state, SimCounters(), kv_capacity_tokens=1000, cache_queries=7,
                      cache_hits=3, model="m").decode()  # fmt: skip
    frame = scrape_frame([(0, text)])
    value = dict(zip(frame["name"], frame["value"], strict=True))
    assert value["vllm:num_requests_waiting"] == 3
    assert value["vllm:num_requests_running"] == 2
    assert value["vllm:kv_cache_usage_perc"] == pytest.approx(202 / 1000)
    assert value["vllm:prefix_cache_queries_total"] == 7
    assert value["vllm:prefix_cache_hits_total"] == 3


def test_sim_inter_token_latency_is_the_engine_time_between_a_requests_tokens() -> None:
    """Steps ending at 0, 20, 40 and 90 ms (simulated): request 1 emits in all four, request 2
    joins at 40 ms. Its gaps are the steps' ends apart (20, 20, 50; 50 for request 2), not
    when the writes happened; a first token is no gap. vLLM's buckets: two at or under
    25 ms, all four at or under 50 ms; the sum 140 ms."""
    sim_ms = 1_000_000

    class Token:
        last_token_sim_ns: int | None = None

        def on_token(self) -> None:
            pass

    async def main() -> SimCounters:
        app = SimServer(config_from_mapping({}, "test"), asyncio.get_running_loop(), NullTrace())
        app.exchanges.update({1: Token(), 2: Token()})  # type: ignore[dict-item]
        for end_ms, seqs in ((0, (1,)), (20, (1,)), (40, (1, 2)), (90, (1, 2))):
            app._deliver(StepResult(start_ns=0, end_ns=end_ms * sim_ms, decode_batch=len(seqs),
                                    prefill_tokens=0, emitted=seqs), 0)  # fmt: skip
        return app.counters

    counters = asyncio.run(main())
    assert counters.itl.count == 4
    assert counters.itl.total == pytest.approx(0.140)
    text = exposition(Engine(EngineConfig()).state(), counters, kv_capacity_tokens=1,
                      cache_queries=0, cache_hits=0, model="m").decode()  # fmt: skip
    bucket = 'vllm:inter_token_latency_seconds_bucket{le="%s",model_name="m"} %s'
    assert bucket % ("0.01", "0.0") in text
    assert bucket % ("0.025", "2.0") in text
    assert bucket % ("0.05", "4.0") in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 4.0' in text


def test_cached_prompt_tokens_are_not_prefilled() -> None:
    """A prompt with C cached tokens prefills P − C: its first token comes (C / rate) sooner."""
    config = EngineConfig(prefill_tokens_per_s=8000.0)
    cold = simulate(config, [(0, SeqRequest(seq_id=1, prompt_tokens=800, output_tokens=2))])
    warm = simulate(
        config, [(0, SeqRequest(seq_id=1, prompt_tokens=800, output_tokens=2, cached_tokens=640))]
    )
    assert cold.token_ns[1][0] == 800 * 1e9 / 8000  # 100 ms of prefill
    assert warm.token_ns[1][0] == 160 * 1e9 / 8000  # 20 ms: only the 160 uncached tokens
    assert warm.steps[0].prefill_tokens == 160


def test_prefix_cache_hits_whole_leading_blocks_of_the_same_prefix_only() -> None:
    """Blocks chain: a prompt hits its leading blocks seen before, never a later block alone,
    and never its last token."""
    cache = PrefixCache(capacity_tokens=1000, block_tokens=4)
    first = [f"w{i}" for i in range(10)]  # two whole blocks and two words
    assert cache.lookup(cache.keys(first), len(first)) == 0
    cache.insert(cache.keys(first))
    assert cache.lookup(cache.keys([*first[:8], "x", "y"]), 10) == 8
    assert cache.lookup(cache.keys(["z"] * 4 + first[4:]), 10) == 0  # block 2 alone misses
    assert cache.lookup(cache.keys(first[:8]), 8) == 7  # the last token is computed
    assert (cache.queries_tokens, cache.hits_tokens) == (10 + 10 + 10 + 8, 8 + 7)


def test_prefix_cache_evicts_the_least_recently_used_blocks() -> None:
    """Past its capacity the cache drops the blocks used longest ago."""
    cache = PrefixCache(capacity_tokens=8, block_tokens=4)  # two blocks
    a, b = [f"a{i}" for i in range(5)], [f"b{i}" for i in range(5)]
    cache.insert(cache.keys(a))
    cache.insert(cache.keys(b))
    assert cache.size_blocks == 2
    cache.insert(cache.keys([f"c{i}" for i in range(5)]))
    assert cache.lookup(cache.keys(a), 5) == 0  # a was the oldest
    assert cache.lookup(cache.keys(b), 5) == 4


def test_prompt_words_follow_the_dialects_prompt_order() -> None:
    """System, then messages' contents (string or parts), as every dialect counts them."""
    body = orjson.dumps({"model": "m", "system": "s1 s2", "messages": [
        {"role": "user", "content": "u1 u2"},
        {"role": "assistant", "content": [{"type": "text", "text": "a1"}]}]})  # fmt: skip
    assert prompt_words(body) == ["s1", "s2", "u1", "u2", "a1"]
    assert prompt_words(b"not json") == []


# --- parsing and scraping -------------------------------------------------------------------


def test_a_malformed_line_is_skipped_and_counted_the_rest_kept() -> None:
    """One bad sample line costs only itself."""
    text = '# TYPE a gauge\na 1\nthis is not a sample\nb{x="y"} 2.5\n'
    samples, bad = parse_exposition(text)
    assert bad == 1
    assert samples == [("a", {}, 1.0), ("b", {"x": "y"}, 2.5)]


def test_an_exposition_past_the_line_cap_keeps_its_first_lines_and_known_servers_lines() -> None:
    """Cap 4: the first four lines, then only the vLLM and SGLang lines (a `# TYPE` of one
    too), four at most; the two other sample lines are counted, the comment is not; within
    the cap the text is itself; past the second four known lines, those are dropped too."""
    text = ("# TYPE a gauge\na 1\nb 2\nc 3\nd 4\n# TYPE vllm:x gauge\nvllm:x 5\n# just a note\n"
            'e 6\nsglang:y{m="z"} 7\n')  # fmt: skip
    kept, dropped = within_line_cap(text, 4)
    assert (
        kept == '# TYPE a gauge\na 1\nb 2\nc 3\n# TYPE vllm:x gauge\nvllm:x 5\nsglang:y{m="z"} 7\n'
    )
    assert dropped == 2
    assert within_line_cap(text, 11) == (text, 0)
    assert parse_exposition(kept)[0][-2:] == [("vllm:x", {}, 5.0), ("sglang:y", {"m": "z"}, 7.0)]
    known = [f'vllm:x{{i="{i}"}} {i}\n' for i in range(5)]
    capped = within_line_cap("a 1\nb 2\n" + "".join(known) + "c 3\n", 2)
    assert capped == ("a 1\nb 2\n" + "".join(known[:2]), 4)


label_sets = st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=4)


@given(st.lists(st.tuples(st.integers(0, 2**40), st.text(max_size=8), label_sets,
                          st.floats(allow_nan=False)), max_size=30))  # fmt: skip
def test_spilled_rows_are_the_rows_whatever_their_labels(rows: list[Any]) -> None:
    """A part frame built column by column holds each row's time, name, labels (in order,
    none for a row without) and value: the frame a dict per label built."""
    frame = server_rows_frame([(t, n, tuple(labels), v) for t, n, labels, v in rows])
    by_dicts = pl.DataFrame(
        {"mono_ns": [r[0] for r in rows], "name": [r[1] for r in rows],
         "labels": [[{"name": k, "value": v} for k, v in r[2]] for r in rows],
         "value": [r[3] for r in rows]},
        schema=SERVER_PART_SCHEMA,
    )  # fmt: skip
    assert frame.equals(by_dicts)


def _metrics_server(bodies: list[bytes], status: int = 200) -> ScriptedServer:
    def handler(request: ReceivedRequest) -> list[bytes]:
        body = bodies[min(len(handler.calls), len(bodies) - 1)]  # type: ignore[attr-defined]
        handler.calls.append(request)  # type: ignore[attr-defined]
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        return [head + body]

    handler.calls = []  # type: ignore[attr-defined]
    return ScriptedServer(handler)


def test_scraper_counts_failed_scrapes_and_never_raises() -> None:
    """A 500 and an unreachable endpoint are failures with their error, not exceptions."""
    with _metrics_server([b"x 1\n"], status=500) as server:
        scraper = Scraper(server.url + "/metrics", 0.05)
        scraper.start()
        wait_until(lambda: scraper.failures >= 2)
        stats = scraper.stop()
    assert stats.scrapes == 0
    assert stats.failures >= 2
    assert stats.last_error is not None
    assert "HTTP 500" in stats.last_error
    lone = Scraper("http://127.0.0.1:9/metrics", 0.05, timeout_s=0.5)
    lone.start()
    stats = lone.stop()
    assert stats.failures >= 1  # the first scrape, and the last one stop() makes
    assert stats.scrapes == 0


def test_scraper_stamps_each_scrape_on_the_injected_clock() -> None:
    """Every row of one scrape carries the clock's reading at that scrape's start."""

    class Clock:
        t = 1_000

        def now_ns(self) -> int:
            self.t += 7
            return self.t

        def wall_ns(self) -> int:
            return 0

    spilled: list[Any] = []
    with _metrics_server([b"a 1\nb 2\n", b"a 3\nbad line\nb 4\n"]) as server:
        scraper = Scraper(server.url + "/metrics", 0.05, clock=Clock(), spill=spilled.extend)
        scraper.start()
        wait_until(lambda: scraper.scrapes >= 2)
        stats = scraper.stop()
    times = sorted({row[0] for row in spilled})
    assert len(times) == stats.scrapes >= 2
    assert [row[3] for row in spilled if row[0] == times[1]] == [3.0, 4.0]
    assert stats.malformed_lines >= 1


# --- named figures ----------------------------------------------------------------------------


def test_counter_delta_survives_a_server_restart() -> None:
    """A drop is a restart from 0: 10→15 then reset→4 counts 5 + 4."""
    assert counter_delta([10, 15, 4, 6]) == 5 + 4 + 2


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    """Prometheus' histogram_quantile: 100 observations, 50 ≤ 0.1 s and 100 ≤ 0.2 s → p99 in
    (0.1, 0.2] at 0.1 + 0.1·(99 − 50)/50 s."""
    buckets = [(0.1, 50.0), (0.2, 100.0), (math.inf, 100.0)]
    assert _quantile_ms(buckets, 0.99) == pytest.approx(198.0)
    assert _quantile_ms(buckets, 0.50) == pytest.approx(100.0)


def test_server_histogram_is_the_change_over_the_run() -> None:
    """Observations before the first scrape are not the run's: only the difference counts."""

    def text(n_fast: int, n_slow: int) -> str:
        return (f'h_bucket{{le="0.1"}} {n_fast}\nh_bucket{{le="1.0"}} {n_fast + n_slow}\n'
                f'h_bucket{{le="+Inf"}} {n_fast + n_slow}\nh_count {n_fast + n_slow}\n'
                f"h_sum {0.05 * n_fast + 0.5 * n_slow}\n")  # fmt: skip

    frame = scrape_frame([(0, text(1000, 0)), (10, text(1000, 10))])
    change = histogram_change(frame, "h")
    assert change.count == 10
    assert change.mean == pytest.approx(500.0)  # only the 10 slow ones
    assert change.p99 is not None
    assert 100.0 < change.p99 <= 1000.0


@pytest.mark.parametrize(
    ("names", "family"),
    [
        (["vllm:num_requests_waiting", "python_gc_objects_collected_total"], "vllm"),
        (["sglang:num_queue_reqs"], "sglang"),
        (["tgi_queue_size", "tgi_batch_current_size"], "tgi"),
        (["llamacpp:requests_processing"], "llama.cpp"),
        (["my_server_queue"], "unknown"),
    ],
)
def test_server_family_from_metric_names(names: list[str], family: str) -> None:
    """The family is read from the names' prefixes; anything else is unknown."""
    assert server_family(names) == family


def test_series_of_one_name_are_summed_for_counts_and_averaged_for_ratios() -> None:
    """Two engines' waiting requests add up; their KV usage is their mean."""
    text = ('vllm:num_requests_waiting{engine="0"} 3\nvllm:num_requests_waiting{engine="1"} 4\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n')  # fmt: skip
    frame = scrape_frame([(0, text)])
    assert figure_series(frame, "queue_depth")["value"].to_list() == [7.0]
    assert figure_series(frame, "kv_usage")["value"].to_list() == [pytest.approx(0.3)]


@pytest.mark.parametrize(("first_ns", "counted"), [(-5, True), (0, True), (5, False)])
def test_counters_and_histograms_need_a_baseline_read_before_t0(
    first_ns: int, counted: bool
) -> None:
    """A counter's figure is its change from the first scrape: one first read after t0 (the
    scraper's first scrapes failed or came late, and the run had already sent) would miss
    what the run did before it (a short run read as 0 tokens), so it has no figure; gauges
    stay. Known answer: 100 tokens and 2 observations between the scrapes."""

    def text(tokens: int, count: int) -> str:
        return (f"vllm:generation_tokens_total {tokens}\nvllm:num_requests_running 2\n"
                f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {count}\n'
                f"vllm:time_to_first_token_seconds_count {count}\n"
                f"vllm:time_to_first_token_seconds_sum {0.1 * count}\n")  # fmt: skip

    frame = scrape_frame([(first_ns, text(900, 8)), (first_ns + 10, text(1000, 10))])
    audit = server_audit(frame, url="u", interval_s=1, scrapes=2, failures=0,
                         malformed_lines=0, last_error=None)  # fmt: skip
    assert audit.gauges["running"].max == 2
    if counted:
        assert audit.counters["generation_tokens"] == 100
        assert audit.histograms_ms["ttft"].count == 2
    else:
        assert "generation_tokens" not in audit.counters
        assert not audit.histograms_ms


def test_an_unknown_server_names_no_figures_but_keeps_every_series() -> None:
    """No mapping, no guessing: the raw rows stay for whoever reads the parquet."""
    frame = scrape_frame([(0, "my_queue 3\n"), (5, "my_queue 4\n")])
    audit = server_audit(frame, url="u", interval_s=1, scrapes=2, failures=0,
                         malformed_lines=0, last_error=None)  # fmt: skip
    assert audit.server == "unknown"
    assert not audit.gauges
    assert not audit.counters
    assert frame.height == 2


# --- what adapters read -----------------------------------------------------------------------


def test_openai_usage_cached_tokens_and_the_response_id() -> None:
    """vLLM's usage.prompt_tokens_details.cached_tokens and the chunk's id."""
    usage = {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53,
             "prompt_tokens_details": {"cached_tokens": 32}}  # fmt: skip
    data = orjson.dumps({"id": "chatcmpl-7", "choices": [], "usage": usage})
    delta = OpenAIChat().parse(b"", data)
    assert (delta.cached_tokens, delta.response_id, delta.prompt_tokens) == (32, "chatcmpl-7", 50)


def test_llama_cpp_timings_give_cached_tokens_and_server_timings() -> None:
    """llama-server's final chunk `timings`: cache_n cached, prompt/predicted ms and counts."""
    timings = {"cache_n": 12, "prompt_n": 8, "prompt_ms": 4.5, "predicted_n": 3,
               "predicted_ms": 9.0}  # fmt: skip
    data = orjson.dumps({"id": "x", "choices": [{"index": 0, "delta": {},
                         "finish_reason": "stop"}], "timings": timings})  # fmt: skip
    delta = OpenAIChat().parse(b"", data)
    assert delta.cached_tokens == 12
    t = reported_timings(delta.server_timings)
    assert t is not None
    assert (t.prefill_ms, t.decode_ms, t.total_ms) == (4.5, 9.0, 13.5)
    assert (t.prefill_tokens, t.decode_tokens, t.cached_tokens) == (8, 3, 12)


def test_anthropic_cache_reads_are_the_cached_tokens() -> None:
    """cache_read_input_tokens are hits; cache writes are computed tokens, not hits."""
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 20}
    data = orjson.dumps({"type": "message_start", "message": {"id": "msg_1", "usage": usage}})
    delta = AnthropicMessages().parse(b"message_start", data)
    assert (delta.cached_tokens, delta.prompt_tokens, delta.response_id) == (20, 35, "msg_1")


def test_responses_input_tokens_details_cached_tokens() -> None:
    """The Responses API's usage.input_tokens_details.cached_tokens and the response id."""
    response = {"id": "resp_1", "usage": {"input_tokens": 9, "output_tokens": 2,
                "input_tokens_details": {"cached_tokens": 4}}}  # fmt: skip
    data = orjson.dumps({"type": "response.completed", "response": response})
    delta = OpenAIResponses().parse(b"response.completed", data)
    assert (delta.cached_tokens, delta.response_id) == (4, "resp_1")


def test_x_request_id_header_is_the_server_id_when_the_body_has_none(tmp_path: Path) -> None:
    """A response without an `id` (TGI, Ollama, some proxies) is named by its x-request-id."""

    def handler(request: ReceivedRequest) -> list[bytes]:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"X-Request-Id: srv-42\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        token = {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": " hi"}, "finish_reason": None}]}  # fmt: skip
        return [head, http_chunk(sse(token)), http_chunk(sse("[DONE]")), b"0\r\n\r\n"]

    workload = workload_file(tmp_path, _tiny("hdr", requests=2))
    with ScriptedServer(handler) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "-q",
                                          "--no-preflight", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    assert records["server_request_id"].to_list() == ["srv-42", "srv-42"]
    assert records["cached_prompt_tokens"].to_list() == [None, None]  # the server did not say


def _tiny(name: str, *, requests: int) -> str:
    return (f"name: {name}\ntarget: {{api: openai-chat, model: m}}\nclasses:\n  chat:\n"
            f"    arrival: {{process: constant, rate_per_s: 50}}\n    requests: {requests}\n"
            "    prompt_tokens: {dist: fixed, value: 5}\n"
            "    output_tokens: {dist: fixed, value: 1}\n")  # fmt: skip


# --- end to end against the built-in simulator ----------------------------------------------

SESSIONS = """\
name: cache-e2e
target: {api: openai-chat, model: sim, server_metrics_url: /metrics,
         server_metrics_interval_s: 0.1}
classes:
  chat:
    kind: chat
    arrival: {process: constant, rate_per_s: 40}
    requests: 8
    turns: {dist: uniform, min: 3, max: 3}
    think_time_s: {dist: fixed, value: 0.05}
    system_prompt_tokens: 64
    prompt_tokens: {dist: fixed, value: 40}
    output_tokens: {dist: fixed, value: 32}
    deadlines: {first_token_s: 10, stall_s: 5, total_s: 20}
sim: {prefix_cache_tokens: 100000, speed: 4, max_batch: 2}
"""


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_scraped_counters_equal_what_the_records_measured(tmp_path: Path) -> None:
    """Over the run the simulator's counters moved by exactly the records' totals: prompt and
    generated tokens, prefix-cache queries and hits, one inter-token gap per token after the
    first, their mean the client's (in simulated ms); its running gauge never passed max_batch
    (8 sessions 25 ms apart share a batch of 2); the class's hit share is cached / prompt
    tokens of its records."""
    workload = workload_file(tmp_path, SESSIONS)
    result = CliRunner().invoke(cli, ["run", str(workload), "--out", str(tmp_path), "--run-id",
                                      "r", "-q", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "r"
    records = pl.read_parquet(run_dir / "records.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    server = summary["server"]
    assert server["server"] == "vllm"
    assert server["failures"] == 0
    assert server["scrapes"] >= 2
    counters = server["counters"]
    assert counters["generation_tokens"] == records["output_tokens"].sum()
    assert counters["prompt_tokens"] == records["prompt_tokens"].sum()
    assert counters["prefix_cache_queries"] == records["prompt_tokens"].sum()
    assert counters["prefix_cache_hits"] == records["cached_prompt_tokens"].sum() > 0
    assert counters["preemptions"] == 0
    itl = server["histograms_ms"]["itl"]  # one gap per generated token after a stream's first
    assert itl["count"] == (records["output_tokens"] - 1).clip(lower_bound=0).sum()
    assert itl["mean"] >= 20.0  # no step is shorter than the decode step at batch <= 16
    client_itl_ms = summary["classes"]["chat"]["itl_ms"]["mean"] * 4  # speed 4: sim ms
    assert client_itl_ms == pytest.approx(itl["mean"], rel=0.1)  # the two sides agree
    assert server["gauges"]["running"]["max"] <= 2  # max_batch
    later_turns = records.filter(pl.col("turn") > 0)
    assert (later_turns["cached_prompt_tokens"] > 0).all()  # each repeats the turn before
    share = summary["classes"]["chat"]["prefix_cache"]
    cached = float(records["cached_prompt_tokens"].sum())
    prompt = float(records["prompt_tokens"].sum())
    assert share["hit_share"] == pytest.approx(cached / prompt, abs=1e-6)
    assert records["server_request_id"].n_unique() == records.height
    scraped = read_server_metrics(run_dir)
    assert scraped is not None
    assert set(scraped.columns) == {"t_ns", "name", "labels", "value"}
    assert not (run_dir / "server_metrics.parts").exists()
    info = json.loads((run_dir / "run.json").read_text())["server_metrics"]
    assert info["scrapes"] == server["scrapes"]


STALL = """\
name: stall-itl
target: {api: openai-chat, model: sim, server_metrics_url: /metrics,
         server_metrics_interval_s: 0.5}
sim: {speed: 4, max_batch: 64, chunk_tokens: 0}
classes:
  victims:
    arrival: {process: constant, rate_per_s: 40000}
    requests: 32
    prompt_tokens: {dist: fixed, value: 16}
    output_tokens: {dist: fixed, value: 300}
  long:
    arrival: {process: constant, rate_per_s: 1, start_s: 0.25}
    requests: 1
    prompt_tokens: {dist: fixed, value: 4000}
    output_tokens: {dist: fixed, value: 300}
"""


@pytest.mark.slow  # ~4 s on 2 cores: left to .ci/run's second part
def test_the_servers_inter_token_histogram_holds_the_seeds_530_ms_stall(tmp_path: Path) -> None:
    """The seed's stall: 32 victims decoding when a 4,000-token prompt arrives, unchunked at
    8,000 tok/s (500 ms of prefill plus a ~30 ms decode step in one step). The simulator's
    ITL histogram counts one gap per token after a stream's first, exactly one per victim in
    (0.5 s, 0.75 s], none longer. (Steps that also prefill victims arriving a step late
    are longer than a decode step, by how many joined: not asserted.)"""
    workload = workload_file(tmp_path, STALL)
    result = CliRunner().invoke(cli, ["run", str(workload), "--out", str(tmp_path), "--run-id",
                                      "s", "-q", "--no-preflight", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    frame = read_server_metrics(tmp_path / "s")
    assert frame is not None
    last = frame["t_ns"].max()
    rows = frame.filter((pl.col("name") == "vllm:inter_token_latency_seconds_bucket")
                        & (pl.col("t_ns") == last))  # fmt: skip
    cumulative = {{x["name"]: x["value"] for x in labels}["le"]: value
                  for labels, value in zip(rows["labels"], rows["value"], strict=True)}  # fmt: skip
    records = pl.read_parquet(tmp_path / "s" / "records.parquet")
    gaps = int((records["output_tokens"] - 1).sum())
    assert cumulative["+Inf"] == gaps
    assert cumulative["0.75"] - cumulative["0.5"] == 32  # the stall, once per victim
    assert cumulative["0.75"] == gaps  # and no gap longer


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_report_re_audits_the_server_block_from_the_folder(tmp_path: Path) -> None:
    """`loadgen report` reads server_metrics.parquet again: the same server block."""
    workload = workload_file(tmp_path, SESSIONS.replace("requests: 8", "requests: 2"))
    runner = CliRunner()
    result = runner.invoke(cli, ["run", str(workload), "--out", str(tmp_path), "--run-id", "r",
                                 "-q", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "r" / "summary.json").read_text())["server"]
    report = runner.invoke(cli, ["report", str(tmp_path / "r"), "--format", "json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["server"] == written


def test_a_failing_metrics_endpoint_is_counted_and_the_run_goes_on(tmp_path: Path) -> None:
    """Nothing listening on the metrics port: every scrape fails, the verdict is the SLO's."""
    workload = workload_file(tmp_path, _tiny("fail", requests=3))
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "-q",
                                          "--server-metrics-url", "http://127.0.0.1:9/metrics",
                                          "--server-metrics-interval", "0.05",
                                          "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server_block = json.loads((tmp_path / "r" / "summary.json").read_text())["server"]
    assert server_block["scrapes"] == 0
    assert server_block["failures"] >= 1
    assert "ConnectError" in server_block["last_error"]


def test_a_bad_metrics_url_is_a_clear_error(tmp_path: Path) -> None:
    """Neither a URL nor a path: exit 1, saying what to give instead."""
    workload = workload_file(tmp_path, _tiny("bad", requests=1))
    result = CliRunner().invoke(cli, ["run", str(workload), "--server-metrics-url", "metrics"])
    assert result.exit_code == 1
    assert "or a path such as /metrics" in result.output
    assert "Traceback" not in result.output


def test_window_gauges_average_the_scrapes_inside_each_window() -> None:
    """Scrapes at 0.5, 1.5, 2.5 s with queue 1, 3, 5: windows [0, 2) and [2, 4) get 2 and 5."""
    frame = scrape_frame([(500 * MS, "vllm:num_requests_waiting 1\n"),
                          (1500 * MS, "vllm:num_requests_waiting 3\n"),
                          (2500 * MS, "vllm:num_requests_waiting 5\n")])  # fmt: skip
    timeline = server_timeline(frame)
    assert timeline.columns == ["t_s", "queue_depth"]
    windows = pl.DataFrame({"window_start_s": [0.0, 2.0, 4.0], "window_end_s": [2.0, 4.0, 6.0]})
    means = window_gauges(timeline, windows).sort("window_start_s")
    assert means["server_queue_depth"].to_list() == [2.0, 5.0, None]


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_the_report_draws_the_server_beside_the_client(tmp_path: Path, drawn: list[Figure]) -> None:
    """A scraped run's report has the server section, its timeline figure and per-window
    server columns; the server timeline marks where arrivals ended where the client's does:
    at the last intended time plus the mean gap between intended times; both share one time
    axis, from t0 to the later of the last window's end and the last scrape."""
    workload = workload_file(tmp_path, SESSIONS.replace("requests: 8", "requests: 2"))
    runner = CliRunner()
    result = runner.invoke(cli, ["run", str(workload), "--out", str(tmp_path), "--run-id", "r",
                                 "-q", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    intended = sorted(pl.read_parquet(tmp_path / "r" / "records.parquet")["intended_ns"])
    end_s = (intended[-1] + (intended[-1] - intended[0]) / (len(intended) - 1)) / 1e9
    drawn.clear()
    report = runner.invoke(cli, ["report", str(tmp_path / "r"), "--window", "0.2"])
    timelines = [arrivals_end_marks(f) for f in drawn if "per window" in f.get_suptitle()]
    server = [arrivals_end_marks(f) for f in drawn if "server's state" in f.get_suptitle()]
    assert len(timelines) == len(server) == 1
    for marks in (*timelines, *server):
        assert [xs for xs, _ in marks] == [[pytest.approx(end_s)]] * len(marks)
    spans = {f.axes[0].get_xlim() for f in drawn if "per window" in f.get_suptitle()
             or "server's state" in f.get_suptitle()}  # fmt: skip
    assert len(spans) == 1  # one time axis: the same second at the same place in both
    start, end = spans.pop()
    assert start == 0
    assert end > end_s  # to the last window's end or the last scrape, past the arrivals
    assert report.exit_code == 0, report.output
    markdown = (tmp_path / "r" / "report" / "report.md").read_text()
    assert "## Server: vllm metric names" in markdown
    assert "server-timeline.png" in markdown
    assert "server queue (mean)" in markdown
    assert "prefix-cache hit share" in markdown
    png = (tmp_path / "r" / "report" / "server-timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG")


# --- compare ------------------------------------------------------------------------------


def _audit(queue_p99: float, hit_share: float | None) -> ServerAudit:
    gauge = GaugeStats(mean=queue_p99 / 2, p99=queue_p99, max=queue_p99, samples=10)
    return ServerAudit(url="u", server="vllm", interval_s=1, scrapes=10, failures=0,
                       malformed_lines=0, last_error=None, gauges={"queue_depth": gauge},
                       counters={"preemptions": 0.0}, prefix_cache_hit_share=hit_share,
                       histograms_ms={})  # fmt: skip


def test_server_deltas_are_informational_until_a_threshold_is_set() -> None:
    """Queue p99 4 → 8 is +100 %: info without a threshold, regressed past +50 %, ok under
    +150 %; a falling hit share is the worse direction."""
    base, cur = [_audit(4, 0.8), _audit(4, 0.6)], _audit(8, 0.5)
    plain = {d.figure: d for d in server_deltas(base, cur, {})}
    assert plain["queue_depth_p99"].change == 4
    assert plain["prefix_cache_hit_share"].baseline == pytest.approx(0.7)  # mean of the runs
    assert not any(d.regressed for d in plain.values())
    judged = {d.figure: d for d in server_deltas(base, cur, parse_server_thresholds(
        ["queue_depth_p99=50%", "queue_depth_mean=+150%", "prefix_cache_hit_share=0.1"]))}  # fmt: skip
    assert judged["queue_depth_p99"].regressed
    assert not judged["queue_depth_mean"].regressed
    assert judged["prefix_cache_hit_share"].regressed  # 0.7 → 0.5: 0.2 worse than 0.1
    with pytest.raises(ValueError, match="FIGURE=VALUE"):
        parse_server_thresholds(["queue_depth_p99"])


def _server_with_queue(queue: int) -> ScriptedServer:
    def handler(request: ReceivedRequest) -> list[bytes]:
        if request.path == "/metrics":
            body = f"vllm:num_requests_waiting {queue}\n".encode()
            return [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body]  # fmt: skip
        return simple_chat(2)

    return ScriptedServer(handler)


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_compare_shows_server_deltas_and_exits_2_past_a_threshold(tmp_path: Path) -> None:
    """Two runs whose servers said queue 2 and 5: compare lists +3, and with
    --server-threshold queue_depth_p99=50% exits 2 on it alone."""
    workload = workload_file(tmp_path, _tiny("cmp", requests=25))  # 0.5 s: scrapes inside
    runner = CliRunner()
    for run_id, queue in (("a", 2), ("b", 5)):
        with _server_with_queue(queue) as server:
            result = runner.invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                         str(tmp_path), "--run-id", run_id, "-q",
                                         "--server-metrics-url", "/metrics",
                                         "--server-metrics-interval", "0.05",
                                         "--lag-bound-ms", "1000"])  # fmt: skip
        assert result.exit_code == 0, result.output
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    plain = runner.invoke(cli, ["compare", *runs, "--format", "json"])
    assert plain.exit_code == 0, plain.output
    server = json.loads(plain.output)["server"]["queue_depth_p99"]
    assert (server["baseline"], server["current"], server["verdict"]) == (2, 5, "info")
    judged = runner.invoke(cli, ["compare", *runs, "--server-threshold", "queue_depth_p99=50%"])
    assert judged.exit_code == 2, judged.output
    assert "REGRESSED" in judged.output


def test_the_terminal_summary_names_the_servers_figures() -> None:
    """One line after the generator's: family, scrapes, queue/running max and mean."""
    line = server_line(_audit(4, 0.25)).plain
    assert line == ("server: vllm · 10 scrapes (0 failed) · queue max 4, mean 2.0 · "
                    "prefix-cache hits 25.0%")  # fmt: skip


def test_spilled_parts_join_on_t0_into_one_file(tmp_path: Path) -> None:
    """Parts hold the monotonic clock; the joined file counts from t0 (what a finished run
    and `report --recover` both do), and the parts are gone."""
    write_server_part(tmp_path, [(1_000, "a", (("k", "v"),), 1.0)])
    write_server_part(tmp_path, [(3_000, "a", (("k", "v"),), 2.0), (3_000, "b", (), 5.0)])
    frame = join_server_metrics(tmp_path, t0_mono_ns=2_000)
    assert frame is not None
    assert frame["t_ns"].to_list() == [-1_000, 1_000, 1_000]
    assert frame["labels"].to_list()[0] == [{"name": "k", "value": "v"}]
    assert not (tmp_path / "server_metrics.parts").exists()
    again = read_server_metrics(tmp_path)
    assert again is not None
    assert again.equals(frame)


def test_a_counter_keeps_the_name_the_server_wrote() -> None:
    """The parser would call a counter written without `_total` `<name>_total`; the rows keep
    what was exposed (llama.cpp's `llamacpp:n_tokens_max` is such a counter)."""
    text = ("# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 7\n"
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 9\n")  # fmt: skip
    samples, _ = parse_exposition(text)
    assert [name for name, _, _ in samples] == [
        "llamacpp:n_tokens_max",
        "llamacpp:prompt_tokens_total",
    ]


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_the_sending_process_never_parses_a_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run scrapes from a process of its own: the run's scrapes all counted, yet the
    exposition parser was never called in the process that sent (issue #26)."""
    import loadgen.engine.scrape as scrape_module

    calls: list[int] = []
    parse = scrape_module.text_string_to_metric_families

    def counted(text: str) -> Any:
        calls.append(os.getpid())
        return parse(text)

    monkeypatch.setattr(scrape_module, "text_string_to_metric_families", counted)
    workload = workload_file(tmp_path, SESSIONS)
    result = CliRunner().invoke(cli, ["run", str(workload), "--out", str(tmp_path), "--run-id",
                                      "r", "-q", "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = json.loads((tmp_path / "r" / "summary.json").read_text())["server"]
    assert server["scrapes"] >= 2
    assert server["failures"] == 0
    assert read_server_metrics(tmp_path / "r") is not None
    assert calls == []
    scrape_module.parse_exposition("up 1\n")  # a parse in this process is seen: it can fail
    assert calls == [os.getpid()]


def test_the_scraper_process_reports_its_pid_its_tally_and_its_log(tmp_path: Path) -> None:
    """The scraper runs in another process; a refused scrape's note reaches this process's
    log and the tally, as the in-process scraper's would."""
    import logging

    from loadgen.engine.scrape import scrape_auth
    from loadgen.run.processes.scraper import ScraperProcess

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    keep = Keep()
    logger = logging.getLogger("loadgen")
    logger.addHandler(keep)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with ScriptedServer(lambda r: _answer_404()) as server:
            url = server.url + "/metrics"
            scraper = ScraperProcess(url, 0.05, run_dir=tmp_path, auth=scrape_auth(url, url, {}))
            scraper.start()
            assert scraper.pid is not None
            assert scraper.pid != os.getpid()
            assert scraper.first_done.wait(30)
            stats = scraper.stop()
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    assert stats.scrapes == 0
    assert stats.failures >= 2  # the first, and the last one asked for at stop
    assert stats.access is not None
    assert (stats.access.problem_kind, stats.access.problem_status) == ("not_found", 404)
    assert any("no metrics at this path" in line for line in lines)
    assert scraper.stop() == stats  # a second stop changes nothing


def _answer_404() -> list[bytes]:
    return [b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"]
