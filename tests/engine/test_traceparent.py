"""The W3C traceparent each request carries: a trace of its own per request, on the wire as
the record keeps it; the preflight's own, a retry's new span in the same trace; tracestate
passed through; off with --no-traceparent; a user's header taken as given."""

from __future__ import annotations

import random
import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from loadgen.cli import cli
from loadgen.engine.traceparent import TraceContext, trace_id_of
from loadgen.errors import ConfigError
from loadgen.testing import (
    CLOSE,
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    run_engine,
    simple_chat,
)
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.workload.parse import loads
from loadgen.workload.plans import Deadlines

W3C = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")
REQUESTS = 4


def test_each_traceparent_is_w3c_sampled_and_new() -> None:
    """Version 00, 32 and 16 lower-case hex digits, the sampled flag; no two alike."""
    trace = TraceContext(True, None, {})
    values = [trace.new() for _ in range(1000)]
    assert all(W3C.fullmatch(v) for v in values)
    assert len({trace_id_of(v) for v in values}) == 1000
    assert trace_id_of(values[0]) == values[0][3:35]


class _Zeros(random.Random):
    """Draws 0 the first `zeros` times, then what Random draws: an all-zero id on demand."""

    def __init__(self, zeros: int) -> None:
        super().__init__(1)
        self.zeros = zeros

    def getrandbits(self, k: int) -> int:
        if self.zeros:
            self.zeros -= 1
            return 0
        return super().getrandbits(k)


def test_an_all_zero_id_is_never_sent() -> None:
    """W3C makes an all-zero trace id or span id invalid: a zero draw is drawn again."""
    value = TraceContext(True, None, {}, rng=_Zeros(2)).new()
    trace, span = W3C.fullmatch(value).groups()  # type: ignore[union-attr]
    assert int(trace, 16) != 0
    assert int(span, 16) != 0
    again = TraceContext(True, None, {}, rng=_Zeros(0)).respan(value)
    assert W3C.fullmatch(again)
    assert trace_id_of(again) == trace
    assert again[36:52] != span


def test_off_and_the_users_own() -> None:
    """Off: nothing sent; a user's traceparent (any case) is every request's, tracestate
    only beside loadgen's own and not when the user set one."""
    assert TraceContext(False, "a=1", {}).headers() == ({}, None)
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert TraceContext(True, "a=1", {"TraceParent": mine}).headers() == ({}, mine)
    headers, value = TraceContext(True, "a=1", {}).headers()
    assert headers == {"traceparent": value, "tracestate": "a=1"}
    headers, _ = TraceContext(True, "a=1", {"tracestate": "b=2"}).headers()
    assert list(headers) == ["traceparent"]


def _heads(tmp_path: Path, *extra: str, target: str = "{api: openai-chat, model: m}") -> tuple[
    Result, list[ReceivedRequest], pl.DataFrame
]:  # fmt: skip
    """A run of REQUESTS with its preflight against a scripted server: the CLI's result,
    what the server saw (preflight first) and the records."""
    path = workload_file(tmp_path, chat_workload("t", target=target, rate_per_s=20,
                                                 requests=REQUESTS))  # fmt: skip
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(path), "--url", server.url, "--out", str(tmp_path), "--run-id", "r",
            "-q", "--verdict", "point", "--warm-connections", "0", *extra])  # fmt: skip
        seen = [r for r in server.requests if r.path == "/v1/chat/completions"]
    records = pl.read_parquet(tmp_path / "r" / "records.parquet").sort("request_id")
    return result, seen, records


def test_every_request_and_the_preflight_carry_their_own(tmp_path: Path) -> None:
    """On by default: each request's traceparent on the wire is its record's, a trace of its
    own; the preflight's is another; a workload's tracestate goes beside each."""
    target = "{api: openai-chat, model: m, tracestate: 'loadgen=run1,vendor=x'}"
    result, seen, records = _heads(tmp_path, target=target)
    assert result.exit_code == 0, result.output
    preflight, probe, *sent = seen  # the compression probe repeats the preflight's headers
    assert len(sent) == REQUESTS
    assert probe.headers["traceparent"] == preflight.headers["traceparent"]
    assert all(W3C.fullmatch(r.headers["traceparent"]) for r in seen)
    assert all(r.headers["tracestate"] == "loadgen=run1,vendor=x" for r in seen)
    by_id = {r.headers["x-request-id"]: r.headers["traceparent"] for r in sent}
    kept = dict(zip(records["request_id_sent"], records["traceparent"], strict=True))
    assert kept == by_id
    traces = {trace_id_of(r.headers["traceparent"]) for r in [preflight, *sent]}
    assert len(traces) == REQUESTS + 1  # the preflight's is none of the requests'


def test_no_traceparent_sends_none(tmp_path: Path) -> None:
    """--no-traceparent: no traceparent or tracestate on any request, the column null."""
    target = "{api: openai-chat, model: m, tracestate: 'a=1'}"
    result, seen, records = _heads(tmp_path, "--no-traceparent", target=target)
    assert result.exit_code == 0, result.output
    assert not any("traceparent" in r.headers or "tracestate" in r.headers for r in seen)
    assert records["traceparent"].null_count() == REQUESTS


def test_a_users_traceparent_header_is_every_requests(tmp_path: Path) -> None:
    """A --header traceparent is the user's choice: every request carries exactly it (one
    header, one trace for the run), the records keep it, and the run warns of the shared
    trace."""
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    result, seen, records = _heads(tmp_path, "--header", f"Traceparent: {mine}")
    assert result.exit_code == 0, result.output
    assert all(r.header_names.count("traceparent") == 1 for r in seen)
    assert {r.headers["traceparent"] for r in seen} == {mine}
    assert set(records["traceparent"]) == {mine}
    assert "every request carries your traceparent" in result.output


def test_a_retry_is_a_new_span_of_the_same_trace() -> None:
    """A request retried after its reused connection died unanswered keeps its trace id with
    a new span id, and its record keeps what the retry carried."""
    seen: dict[int, int] = {}

    def handler(request: ReceivedRequest) -> list:
        seen[request.connection] = seen.get(request.connection, 0) + 1
        if request.connection == 0 and seen[0] == 2:
            return [CLOSE]  # the second request on the first connection is dropped unanswered
        return simple_chat(2)

    fast = Deadlines(first_token_s=3, stall_s=0.4, total_s=6)
    with ScriptedServer(handler) as server:
        records = run_engine(PlanFactory(deadlines=fast).at(0.0, 0.3), server.url)
        sent = [r.headers["traceparent"] for r in server.requests]
    assert [r.retries for r in records] == [0, 1]
    first, lost, retry = sent
    assert trace_id_of(lost) == trace_id_of(retry)
    assert lost != retry
    assert trace_id_of(first) != trace_id_of(lost)
    assert records[1].traceparent == retry


@pytest.mark.parametrize(
    ("value", "why"),
    [("", "is empty"), ("Upper=1", "not a key=value member"), ("a=1,b", "not a key=value"),
     ("a=x,b=y " + ",c=1" * 40, "at most 32"), ("a=b=c", "not a key=value")],
)  # fmt: skip
def test_a_bad_tracestate_is_refused_at_load(value: str, why: str) -> None:
    """target.tracestate is checked against W3C's list syntax when the file is loaded."""
    text = chat_workload("t", target=f"{{api: openai-chat, model: m, tracestate: '{value}'}}")
    with pytest.raises(ConfigError, match=why):
        loads(text, "w.yaml")


def test_tracestate_in_two_places_is_refused() -> None:
    """target.tracestate and a tracestate in target.headers: one of the two."""
    target = "{api: openai-chat, model: m, tracestate: 'a=1', headers: {TraceState: 'b=2'}}"
    with pytest.raises(ConfigError, match=r"also set in target\.headers"):
        loads(chat_workload("t", target=target), "w.yaml")
