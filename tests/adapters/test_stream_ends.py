"""Both ends of a stream: the request id it carries, how it ended, and how N was counted.

Known answers come from the simulator, which records what it really did (the id it was
sent, the tokens it emitted, whether it cut the stream): a `cut` after k tokens is
`truncated` with k tokens kept in every dialect; a `stop` after k tokens of a forced
length is `truncated` (ok but flagged where the workload allows early stops); every end
kind each API family's servers send is read as its row of the README's table says; a
gateway that ends a cut stream as if it were done (LiteLLM) is `truncated`, its usage
disagreement counted; empty-text token events (llama-cpp-python's partial UTF-8 tokens)
still count in N. Request ids and the preflight's headers are checked on the wire.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loadgen.adapters import REGISTRY, adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.analysis.audit import audit_run
from loadgen.analysis.metrics import stream_ends
from loadgen.cli import cli
from loadgen.engine.exchange import short_stream, stream_end
from loadgen.engine.preflight import preflight
from loadgen.engine.request_ids import PREFLIGHT_ID, RequestIds, plan_number, uuid_for
from loadgen.engine.runner import EngineConfig
from loadgen.engine.transport import Pool, make_endpoint
from loadgen.errors import TargetError
from loadgen.results.records import Outcome, RequestRecord, TokenSource, to_frame
from loadgen.run.processes.simulator import SimProcess, running_sim
from loadgen.testing import (
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    chat_chunk,
    head,
    run_through,
    simple_chat,
    stream_steps,
)
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.workload.prompts import PromptMaker

APIS = list(REGISTRY)  # every built-in family (the simulator speaks each)
FORCING = {"openai-chat", "openai-completions"}  # force_output_tokens reaches the server
TOKENS = 12
CUT_AT = 3
STOP_AT = 4
EMPTY_EVERY = 3
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimProcess, Path]]:
    """One fast simulator with a trace, for every dialect."""
    trace = tmp_path_factory.mktemp("sim") / "trace.jsonl"
    with running_sim(["--speed", "20", "--decode-table", "10"], trace_file=trace) as process:
        yield process, trace


@dataclass
class Run:
    records: list[RequestRecord]
    served: dict[str, dict[str, Any]]  # the simulator's trace records by the id sent


def run_api(
    sim: tuple[SimProcess, Path], api: str, faults: list[dict[str, str]], *, usage: bool = True,
    allow_early_stops: bool = False, request_id_body: str = "auto",
) -> Run:  # fmt: skip
    """One request per fault set through the real engine, and what the simulator did."""
    process, trace = sim
    plans = PlanFactory(output_tokens=TOKENS).at(*[0.05 * i for i in range(len(faults))])
    adapter = adapter_for(api)
    config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m", include_usage=usage),
                          seed=0, headers_for=lambda p: faults[p.request_id],
                          allow_early_stops=allow_early_stops,
                          request_id_body=request_id_body)  # fmt: skip
    endpoint = make_endpoint(process.url, adapter.default_path, adapter.headers(None))
    records = run_through(plans, Pool(endpoint), config)
    sent = {r.request_id_sent for r in records}
    deadline = time.monotonic() + 10
    while True:  # the simulator flushes its trace on its own schedule
        text = trace.read_text()  # read while the simulator writes: its last line may be half
        lines = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]
        served = {r["x_request_id"]: r for r in lines if r.get("x_request_id") in sent}
        if len(served) == len(sent) or time.monotonic() > deadline:
            return Run(records, served)
        time.sleep(0.05)


@pytest.mark.parametrize("api", APIS)
def test_a_cut_stream_is_truncated_in_every_dialect_and_a_short_forced_stop_too(
    sim: tuple[SimProcess, Path], api: str
) -> None:
    """Full: ok with its stop reason; cut after 3: truncated, 3 tokens kept; stop after 4:
    truncated where the length was forced (a stop before it is evidence of a cut), else ok."""
    run = run_api(sim, api, [{}, {"X-Sim-Cut-After": str(CUT_AT)},
                             {"X-Sim-Stop-After": str(STOP_AT)}])  # fmt: skip
    full, cut, stopped = run.records
    assert [run.served[str(r.request_id_sent)]["outcome"] for r in run.records] == [
        "ok", "cut", "ok"
    ]  # fmt: skip
    assert (full.outcome, full.output_tokens, full.stopped_early) == (Outcome.OK, TOKENS, False)
    assert full.finish_reason is not None
    assert cut.outcome is Outcome.TRUNCATED
    assert len(cut.chunk_ns) == run.served[str(cut.request_id_sent)]["output_tokens"] == CUT_AT
    assert cut.finish_reason is None
    assert "finish reason" in str(cut.error)
    assert stopped.outcome is (Outcome.TRUNCATED if api in FORCING else Outcome.OK)
    if api in FORCING:
        assert f"after {STOP_AT} of {TOKENS} forced tokens" in str(stopped.error)
    # TGI's stop is its EOS token, the 4th generated: N counts the visible tokens before it.
    assert stopped.output_tokens == STOP_AT - (api == "tgi")
    assert not stopped.stopped_early


@pytest.mark.parametrize("api", sorted(FORCING))
def test_a_short_forced_stop_is_ok_and_flagged_where_the_workload_allows_early_stops(
    sim: tuple[SimProcess, Path], api: str
) -> None:
    """target.allow_early_stops: the same stop after 4 of 12 forced tokens is ok, flagged."""
    (stopped,) = run_api(sim, api, [{"X-Sim-Stop-After": str(STOP_AT)}],
                         allow_early_stops=True).records  # fmt: skip
    assert (stopped.outcome, stopped.stopped_early) == (Outcome.OK, True)
    assert stopped.output_tokens == STOP_AT


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions"])
def test_n_counts_empty_token_events_without_usage(sim: tuple[SimProcess, Path], api: str) -> None:
    """Every 3rd token as an empty-text event, no usage: N is the simulator's 12, from chunks,
    while only 12 - 12 // 3 chunks carried text (TTFT/ITL stamp those alone)."""
    run = run_api(sim, api, [{"X-Sim-Empty-Every": str(EMPTY_EVERY)}], usage=False)
    (record,) = run.records
    served = run.served[str(record.request_id_sent)]
    assert served["output_tokens"] == TOKENS
    assert (record.outcome, record.token_source) == (Outcome.OK, TokenSource.CHUNKS)
    assert record.output_tokens == TOKENS
    assert len(record.chunk_ns) == TOKENS - TOKENS // EMPTY_EVERY
    assert sum(record.chunk_tokens) == TOKENS


def test_request_ids_are_uuids_naming_the_plan_and_reach_the_server(
    sim: tuple[SimProcess, Path],
) -> None:
    """Each request carries a v4 UUID whose last 12 hex digits are its plan's id; the
    simulator saw exactly the id the record keeps."""
    run = run_api(sim, "openai-chat", [{}, {}, {}])
    for record in run.records:
        assert UUID4.match(str(record.request_id_sent))
        assert plan_number(record.request_id_sent) == record.request_id
        assert run.served[record.request_id_sent]["x_request_id"] == record.request_id_sent
    assert len({r.request_id_sent.split("-")[0] for r in run.records if r.request_id_sent}) == 1


def test_uuid_layout_and_plan_numbers() -> None:
    """The UUID keeps the plan id in its last group; counter ids and the preflight's parse."""
    value = uuid_for(2**74 - 1, 42)
    assert UUID4.match(value)
    assert value.endswith("-00000000002a")
    assert plan_number(value) == 42
    assert plan_number(uuid_for(5, PREFLIGHT_ID)) is None
    assert plan_number("loadgen-7") == 7
    assert plan_number("mine") is None
    assert plan_number(None) is None


def test_a_user_header_replaces_the_id_whatever_its_case() -> None:
    """`x-request-id` set by the user: loadgen adds none and records the user's value."""
    ids = RequestIds("X-Request-Id", "uuid", 1, {"x-request-id": "abc"})
    assert ids.headers(3) == ({}, "abc")
    assert RequestIds(None, "uuid", 1, {}).headers(3) == ({}, None)
    assert RequestIds("X-Request-Id", "counter", 1, {}).headers(3) == (
        {"X-Request-Id": "loadgen-3"}, "loadgen-3"
    )  # fmt: skip


def served_requests(
    user_headers: dict[str, str], *, request_id_header: str | None = "X-Request-Id"
) -> tuple[list[RequestRecord], list[ReceivedRequest]]:
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        adapter = adapter_for("openai-chat")
        config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0,
                              request_id_header=request_id_header)  # fmt: skip
        endpoint = make_endpoint(server.url, adapter.default_path, user_headers)
        records = run_through(PlanFactory().at(0.0, 0.01), Pool(endpoint), config)
    return records, server.requests


def test_the_wire_carries_one_id_header_the_users_when_set() -> None:
    """With `X-REQUEST-ID: mine` from the user, each request has one id header, the user's."""
    records, requests = served_requests({"X-REQUEST-ID": "mine"})
    assert [r.header_names.count("x-request-id") for r in requests] == [1, 1]
    assert {r.headers["x-request-id"] for r in requests} == {"mine"}
    assert {r.request_id_sent for r in records} == {"mine"}
    records, requests = served_requests({}, request_id_header=None)
    assert all("x-request-id" not in r.headers for r in requests)
    assert {r.request_id_sent for r in records} == {None}


def refusing_400(request: ReceivedRequest) -> list[Any]:
    """A server that refuses any X-Request-Id that is not a UUID, with an empty body (as
    llama-cpp-python's RequestIdPlugin does)."""
    value = request.headers.get("x-request-id", "")
    if value and not UUID4.match(value):
        return [head(400, chunked=False, length=0)]
    return simple_chat(2)


def test_preflight_sends_the_runs_id_header_and_names_what_it_sent() -> None:
    """The preflight carries the run's id format: `counter` ids are refused at the preflight
    (exit 1 there, not a run of failures) with the headers and fields it sent named; uuid
    ids pass."""
    adapter = adapter_for("openai-chat")
    with ScriptedServer(refusing_400) as server:
        endpoint = make_endpoint(server.url, adapter.default_path, {"Authorization": "Bearer k"})
        options = BodyOptions(model="m")
        counter, _ = RequestIds("X-Request-Id", "counter", 1, {}).headers(PREFLIGHT_ID)
        with pytest.raises(TargetError) as caught:
            preflight(endpoint, adapter, options, timeout_s=10, extra_headers=counter)
        uuid, _ = RequestIds("X-Request-Id", "uuid", 1, {}).headers(PREFLIGHT_ID)
        preflight(endpoint, adapter, options, timeout_s=10, extra_headers=uuid)
    message = str(caught.value)
    assert "HTTP 400: (no body)" in message
    assert "some refuse a X-Request-Id they cannot parse" in message
    assert f"X-Request-Id: loadgen-{PREFLIGHT_ID}" in message
    assert "Authorization: (secret)" in message
    assert "Bearer k" not in message
    assert "body fields messages, model, max_tokens, stream, stream_options" in message
    # the refused one; the one that passed, and its compression probe
    assert [r.header_names.count("x-request-id") for r in server.requests] == [1, 1, 1]


def test_stream_end_rules() -> None:
    """No reason where the API always sends one, or an abort: truncated; else ok."""
    assert stream_end(None, True)[0] is Outcome.TRUNCATED
    assert stream_end(None, False) == (Outcome.OK, None)
    assert stream_end("abort", True)[0] is Outcome.TRUNCATED
    assert stream_end("length", True) == (Outcome.OK, None)


@pytest.mark.parametrize(
    ("reason", "source", "expected", "allowed"),
    [
        (None, TokenSource.USAGE, (Outcome.TRUNCATED, False), (Outcome.TRUNCATED, False)),
        # chunks may undercount: no verdict
        (None, TokenSource.CHUNKS, (Outcome.OK, False), (Outcome.OK, False)),
        ("stop", TokenSource.CHUNKS, (Outcome.TRUNCATED, False), (Outcome.OK, True)),
        ("eos_token", TokenSource.USAGE, (Outcome.TRUNCATED, False), (Outcome.OK, True)),
        # the server capped the length
        ("length", TokenSource.USAGE, (Outcome.TRUNCATED, False), (Outcome.OK, True)),
        ("length", TokenSource.CHUNKS, (Outcome.OK, False), (Outcome.OK, False)),
    ],
)
def test_short_forced_streams(
    reason: str | None,
    source: TokenSource,
    expected: tuple[Outcome, bool],
    allowed: tuple[Outcome, bool],
) -> None:
    """Fewer tokens than forced: which are cut, which left alone; with early stops allowed,
    which are ok but flagged."""
    outcome, _, flagged = short_stream(reason, source, 5, 16)
    assert (outcome, flagged) == expected
    outcome, _, flagged = short_stream(reason, source, 5, 16, allow_early=True)
    assert (outcome, flagged) == allowed
    assert short_stream(reason, source, 16, 16)[:2] == (Outcome.OK, None)  # at the length


def test_a_gateways_own_count_does_not_hide_a_cut() -> None:
    """Usage 16 of 16 forced, but 12 chunks arrived and the end was `stop`: judged by the 12
    that arrived (truncated); the same with a `length` end is left to the usage (ok)."""
    outcome, error, _ = short_stream("stop", TokenSource.USAGE, 16, 16, counted=12)
    assert outcome is Outcome.TRUNCATED
    assert "12 arrived, usage said 16" in str(error)
    assert short_stream("length", TokenSource.USAGE, 16, 16, counted=12)[0] is Outcome.OK


def test_summary_counts_stream_ends_and_sources_of_n() -> None:
    """Per class: stop reasons, truncated, stopped early, and the share of N from usage."""

    def record(i: int, **fields: Any) -> RequestRecord:
        return RequestRecord(request_id=i, class_name="c", intended_ns=0, first_token_ns=1,
                             **fields)  # fmt: skip

    frame = to_frame([
        record(0, outcome=Outcome.OK, finish_reason="length", token_source=TokenSource.USAGE),
        record(1, outcome=Outcome.OK, finish_reason="stop", token_source=TokenSource.USAGE,
               stopped_early=True),
        record(2, outcome=Outcome.TRUNCATED, token_source=TokenSource.CHUNKS),
        record(3, outcome=Outcome.OK, finish_reason="length", token_source=TokenSource.CHUNKS),
    ])  # fmt: skip
    ends = stream_ends(frame)["c"]
    assert ends.finish_reasons == {"length": 2, "stop": 1, "none": 1}
    assert (ends.truncated, ends.stopped_early) == (1, 1)
    assert ends.n_from == {"usage": 2, "chunks": 2}
    assert ends.n_from_usage_share == 0.5
    assert ends.n_counted


DONE_MARKER = {"openai-chat", "openai-completions", "anthropic"}  # an explicit end event


@pytest.mark.parametrize("api", APIS)
def test_a_cut_before_any_token_is_truncated_where_the_end_is_explicit(
    sim: tuple[SimProcess, Path], api: str
) -> None:
    """Cut at 0 tokens: `[DONE]`/`message_stop` alone is the same cut (truncated); a body
    that just ends with nothing in it stays a stream error."""
    (record,) = run_api(sim, api, [{"X-Sim-Cut-After": "0"}]).records
    expected = Outcome.TRUNCATED if api in DONE_MARKER else Outcome.STREAM_ERROR
    assert (record.outcome, record.output_tokens) == (expected, 0)


def test_the_rate_asked_for_is_kept_beside_the_sampled_schedules(tmp_path: Path) -> None:
    """Poisson at 50/s over 20 requests: the summary keeps 50 as asked, the schedule's own
    rate is what the sampled gaps give ((n - 1) / span, rarely exactly 50); re-auditing the
    run folder from run.json gives the same asked rate."""
    text = chat_workload(rate_per_s=50).replace("process: constant", "process: poisson")
    path = workload_file(tmp_path, text)
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "-q",
                                          "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    generator = json.loads((tmp_path / "r" / "summary.json").read_text())["generator"]
    intended = sorted(pl.read_parquet(tmp_path / "r" / "records.parquet")["intended_ns"])
    schedule = (len(intended) - 1) * 1e9 / (intended[-1] - intended[0])
    assert generator["requested_rate_per_s"] == 50.0
    assert generator["target_rate_per_s"] == pytest.approx(schedule, abs=1e-3)
    assert audit_run(tmp_path / "r")[0].generator.requested_rate_per_s == 50.0


def test_with_a_tokenizer_n_is_the_streamed_texts_tokens(tmp_path: Path) -> None:
    """No usage, three chunks of several words: with target.tokenizer N is the tokenizer's
    count of the whole streamed text (source `text`), not the 3 chunks."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["the people of the world know the time and place " * 40]
    tokenizer.train_from_iterator(
        corpus, trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"])
    )
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    pieces = [" the people of", " the world know the", " time and place"]
    events = [chat_chunk(p) for p in pieces] + [chat_chunk(finish="length")]
    expected = len(tokenizer.encode("".join(pieces), add_special_tokens=False).ids)
    assert expected != len(pieces)
    with ScriptedServer(lambda r: stream_steps(events)) as server:
        adapter = adapter_for("openai-chat")
        config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0,
                              prompts=PromptMaker(0, str(path)))  # fmt: skip
        endpoint = make_endpoint(server.url, adapter.default_path, {})
        (record,) = run_through(PlanFactory(output_tokens=expected).at(0.0), Pool(endpoint),
                                config)  # fmt: skip
    assert (record.outcome, record.token_source) == (Outcome.OK, TokenSource.TEXT)
    assert record.output_tokens == sum(record.chunk_tokens) == expected
    assert not record.stopped_early


# Each end a real server sends, per API family (`X-Sim-Finish`), and what loadgen records:
# (api, the word, outcome, finish_reason recorded). The README's "How a stream ends" table.
END_ROWS = [
    ("openai-chat", "stop", Outcome.OK, "stop"),
    ("openai-chat", "length", Outcome.OK, "length"),
    ("openai-chat", "abort", Outcome.TRUNCATED, "abort"),  # vLLM, SGLang: an aborted request
    ("openai-chat", "error", Outcome.TRUNCATED, "error"),  # vLLM: the engine failed it
    ("openai-completions", "abort", Outcome.TRUNCATED, "abort"),
    ("openai-completions", "length", Outcome.OK, "length"),
    ("openai-responses", "completed", Outcome.OK, "stop"),
    ("openai-responses", "incomplete", Outcome.OK, "length"),  # vLLM, llama-server
    ("openai-responses", "incomplete-event", Outcome.OK, "length"),  # OpenAI
    ("openai-responses", "content-filter", Outcome.STREAM_ERROR, None),
    ("openai-responses", "cancelled", Outcome.TRUNCATED, "cancelled"),  # vLLM: aborted
    ("openai-responses", "failed", Outcome.STREAM_ERROR, None),
    ("anthropic", "end_turn", Outcome.OK, "end_turn"),
    ("anthropic", "max_tokens", Outcome.OK, "max_tokens"),
    ("anthropic", "stop_sequence", Outcome.OK, "stop_sequence"),
    ("anthropic", "tool_use", Outcome.OK, "tool_use"),
    ("anthropic", "refusal", Outcome.OK, "refusal"),  # a complete answer: the model's refusal
    ("anthropic", "pause_turn", Outcome.OK, "pause_turn"),
    ("ollama-chat", "length", Outcome.OK, "length"),
    ("ollama-chat", "stop", Outcome.OK, "stop"),
]


@pytest.mark.parametrize(("api", "word", "outcome", "finish"), END_ROWS,
                         ids=[f"{r[0]}-{r[1]}" for r in END_ROWS])  # fmt: skip
def test_every_end_a_server_sends_is_read_as_its_row_says(
    sim: tuple[SimProcess, Path], api: str, word: str, outcome: Outcome, finish: str | None
) -> None:
    """The simulator ends a full 12-token stream with `word` in the API's stop field:
    loadgen records the row's outcome and finish reason, all 12 tokens kept."""
    (record,) = run_api(sim, api, [{"X-Sim-Finish": word}]).records
    assert (record.outcome, record.finish_reason) == (outcome, finish), record.error
    assert len(record.chunk_ns) == TOKENS
    if word == "failed":
        assert "simulated failure at the end" in str(record.error)  # the server's words kept
    elif outcome is Outcome.STREAM_ERROR:
        assert "content_filter" in str(record.error)


GATEWAY_CUT = 7  # claimed as 7 * 9 // 7 = 9 output tokens: more than arrived
GATEWAY_APIS = ["openai-chat", "openai-completions", "anthropic", "openai-responses"]


@pytest.mark.parametrize("api", GATEWAY_APIS)
def test_a_cut_behind_a_gateway_is_truncated_where_forced_and_its_usage_disagreement_kept(
    sim: tuple[SimProcess, Path], api: str
) -> None:
    """The upstream drops after 7 of 12 tokens and the gateway ends the stream as done, with
    a usage of 9 it made up: where the length was forced the record is `truncated`; in
    every API both counts are kept (9 from usage beside the 7 that arrived) and the class's
    summary counts the disagreement."""
    run = run_api(sim, api, [{"X-Sim-Gateway-Cut": str(GATEWAY_CUT)}])
    (record,) = run.records
    assert run.served[str(record.request_id_sent)]["outcome"] == "gateway_cut"
    assert (record.usage_output_tokens, record.counted_output_tokens) == (9, GATEWAY_CUT)
    assert len(record.chunk_ns) == GATEWAY_CUT
    assert record.output_tokens == 9
    assert record.token_source is TokenSource.USAGE
    if api in FORCING:
        assert record.outcome is Outcome.TRUNCATED
        assert f"after 7 of {TOKENS} forced tokens (7 arrived, usage said 9)" in str(record.error)
    else:  # nothing forced the length: a clean end with a stop reason is all there is
        assert record.outcome is Outcome.OK
    ends = stream_ends(to_frame(run.records))["chat"]
    assert (ends.usage_disagrees, ends.usage_over_counted, ends.usage_problems) == (1, 1, 0)


def test_a_usage_that_agrees_is_not_counted_as_a_disagreement(
    sim: tuple[SimProcess, Path],
) -> None:
    """A full stream (usage 12, 12 chunks) and a cut one (no usage): no disagreement."""
    run = run_api(sim, "openai-chat", [{}, {"X-Sim-Cut-After": "5"}])
    full, cut = run.records
    assert (full.usage_output_tokens, full.counted_output_tokens) == (TOKENS, TOKENS)
    assert (cut.usage_output_tokens, cut.counted_output_tokens) == (None, 5)
    assert stream_ends(to_frame(run.records))["chat"].usage_disagrees == 0


def test_anthropic_prompt_tokens_are_read_from_message_delta_behind_a_gateway(
    sim: tuple[SimProcess, Path],
) -> None:
    """`input_tokens: 0` in message_start and the count in message_delta (LiteLLM): the
    record's prompt tokens are the simulator's count, not 0."""
    run = run_api(sim, "anthropic", [{"X-Sim-Input-Usage-Late": "1"}, {}])
    late, plain = run.records
    served = run.served[str(late.request_id_sent)]["prompt_tokens"]
    assert served > 0
    assert late.prompt_tokens == plain.prompt_tokens == served


@pytest.mark.parametrize(("api", "field"), [("openai-responses", ("metadata", "request_id")),
                                            ("anthropic", ("metadata", "user_id"))])  # fmt: skip
def test_the_request_id_rides_in_the_body_where_the_api_has_a_field(
    api: str, field: tuple[str, str]
) -> None:
    """Responses and Anthropic bodies carry the id header's value in their metadata by
    default (a gateway that drops the header still passes it on); chat only with `on`."""
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        for name, mode in ((api, "auto"), ("openai-chat", "auto"), ("openai-chat", "on"),
                           (api, "off")):  # fmt: skip
            adapter = adapter_for(name)
            config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0,
                                  request_id_body=mode)  # fmt: skip
            endpoint = make_endpoint(server.url, adapter.default_path, {})
            run_through(PlanFactory().at(0.0), Pool(endpoint), config)
    bodies = [r.body for r in server.requests]
    ids = [r.headers["x-request-id"] for r in server.requests]
    outer, key = field
    assert bodies[0][outer] == {key: ids[0]}
    assert "user" not in bodies[1]
    assert bodies[2]["user"] == ids[2]
    assert outer not in bodies[3]
