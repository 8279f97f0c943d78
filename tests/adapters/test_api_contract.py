"""The contract every API family of `loadgen.adapters.REGISTRY` keeps, so that adding one
touches the few places docs/development.md's recipe names and no more: the simulator speaks
it at its default path, a captured stream of it has a known answer that its adapter reads
(its parse test), and docs/apis.md has its rows, which say what its adapter declares.

A family shaped as Gemini's `streamGenerateContent` (the model in the path, its own
request-id field, no `priority` field), built here and never registered, shows that the
engine and the preflight take each request's target, id and priority from the adapter
alone, and that the contract names each place such a family still lacks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from conftest import STREAMS, Capture, captures

from loadgen.adapters import APIS, REGISTRY, adapter_for
from loadgen.adapters.generic import GenericSpec
from loadgen.adapters.protocol import (
    NO_FIELDS,
    Adapter,
    BodyOptions,
    Delta,
    IdField,
    Message,
    json_object,
    new_decoder,
    request_body,
)
from loadgen.cli import cli
from loadgen.engine.preflight import preflight
from loadgen.engine.transport import make_endpoint
from loadgen.errors import ConfigError, TargetError
from loadgen.results.records import Outcome
from loadgen.run.options import RunOptions
from loadgen.run.setup import client_setup
from loadgen.sim.dialects import routes
from loadgen.testing import (
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    head,
    run_engine,
    sse,
    stream_steps,
)
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.workload.spec import loads

DOCS = Path(__file__).resolve().parents[2] / "docs" / "apis.md"
FRAMINGS = {"sse": "SSE", "ndjson": "NDJSON"}


def docs_rows(first_header: str) -> dict[str, list[str]]:
    """The rows of docs/apis.md's table whose header starts `| first_header |`, by the first
    cell (backticks dropped), each as its other cells."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def body_row(adapter: Adapter) -> list[str]:
    """What docs/apis.md's body table must say of `adapter`: its request-id field, its
    priority field and the fields loadgen's options add, from its declarations."""
    field = adapter.request_id_field
    if field is None:
        request_id = "none"
    else:
        name = f"{field.name}.{field.key}" if field.key else field.name
        request_id = f"`{name}` ({'by default' if field.by_default else 'with `body: on`'})"
    priority = f"`{adapter.priority_field}`" if adapter.priority_field else "none"
    added = "; ".join(
        f"{', '.join(f'`{f}`' for f in fields)} (`{option}`)"
        for option, fields in adapter.optional_fields.items()
    )
    return [request_id, priority, added or "none"]


def missing_places(api: str, adapter: Adapter) -> list[str]:
    """The places the recipe names that `api` lacks (empty: it keeps the contract)."""
    missing = []
    path = adapter.target(adapter.default_path, "m").split("?", 1)[0]
    served = routes("all").get(path)
    if served is None or served.name != api:
        missing.append(f"a simulator dialect at {path} (loadgen/sim/dialects.py)")
    if not [c for c in captures() if c.api == api and (STREAMS / c.file).is_file()]:
        missing.append("a captured stream with its known answer (tests/fixtures/streams/)")
    streaming = docs_rows("api | default path").get(api)
    framing = FRAMINGS[adapter.framing]
    if (
        streaming is None
        or streaming[0] != f"`{adapter.default_path}`"
        or not streaming[1].startswith(framing)
    ):
        missing.append(
            f"its Streaming APIs row in docs/apis.md (`{adapter.default_path}`, {framing})"
        )
    if docs_rows("api | request id in the body").get(api) != body_row(adapter):
        missing.append(f"its body row in docs/apis.md: {' | '.join(body_row(adapter))}")
    return missing


@pytest.mark.parametrize("api", sorted(REGISTRY))
def test_each_api_family_has_a_dialect_a_capture_and_its_docs_rows(api: str) -> None:
    """Every registered family: the simulator answers it at its default path, a captured
    stream of it has a known answer, and docs/apis.md's rows say what its adapter declares."""
    assert missing_places(api, REGISTRY[api]) == []


def test_the_generic_apis_body_row_says_what_its_adapter_declares() -> None:
    """`generic` has no dialect or capture of its own (it is the workload's), but its body
    row is its adapter's."""
    assert APIS[-1] == "generic"
    generic = adapter_for("generic", GenericSpec())
    assert docs_rows("api | request id in the body")["generic"] == body_row(generic)


def test_apis_are_the_registry_and_generic_and_every_capture_is_of_one() -> None:
    """`APIS` is derived from the registry (plus `generic`); every known answer names a
    registered family and every captured file has one."""
    assert (*REGISTRY, "generic") == APIS
    assert {c.api for c in captures()} <= set(REGISTRY)
    files = {p.name for p in STREAMS.iterdir() if p.name != "README.md"}
    assert files == {c.file for c in captures()}


def replay(api: str, body: bytes) -> Capture:
    """A whole response body read by `api`'s adapter, as its known answer is written: output
    events, the last usage counts and stop reason, up to an error event or the event that
    ends the stream (as the engine reads it: LiteLLM's `[DONE]` after a Responses stream's
    terminal event is never parsed)."""
    adapter = adapter_for(api)
    decoder = new_decoder(adapter, 1 << 24)
    events, output, prompt, finish, error = 0, None, None, None, False
    for event, data in [*decoder.feed(body), *decoder.close()]:
        delta = adapter.parse(event, data)
        if delta.error:
            error = True
            break
        events += delta.has_output
        output = delta.completion_tokens if delta.completion_tokens is not None else output
        prompt = delta.prompt_tokens if delta.prompt_tokens is not None else prompt
        finish = delta.finish_reason or finish
        if delta.done:
            break
    return Capture(file="", api=api, output_events=events, output_tokens=output,
                   prompt_tokens=prompt, finish=finish, error=error)  # fmt: skip


@pytest.mark.parametrize("capture", captures(), ids=lambda c: c.file)
def test_each_captured_stream_reads_as_its_known_answer(capture: Capture) -> None:
    """Each family's parse test on what real software sent: its adapter reads the capture's
    output events, usage, stop reason and error as they were counted from the bytes."""
    read = replay(capture.api, (STREAMS / capture.file).read_bytes())
    assert dataclasses.replace(read, file=capture.file) == capture


# -- a family with the model in its path ----------------------------------------------------


class GeminiSketch:
    """Gemini's `streamGenerateContent` with `alt=sse`, as docs/development.md sketches it:
    the model in the path, the request id in `labels`, no `priority` field."""

    name = "gemini-sketch"
    default_path = "/v1beta/models/{model}:streamGenerateContent?alt=sse"
    framing = "sse"
    finish_signal = True  # the last chunk's candidates[0].finishReason
    forces_length = False
    smallest_output_event = b'{"candidates":[{"content":{"parts":[{"text":"x"}]}}]}'
    event_framing = len(smallest_output_event) - 1
    request_id_field: IdField | None = IdField("labels", "request_id", by_default=True)
    priority_field: str | None = None
    optional_fields = NO_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `x-goog-api-key`."""
        return {"x-goog-api-key": api_key} if api_key else {}

    def target(self, path: str, model: str) -> str:
        """The run's path with the model in it."""
        return path.replace("{model}", quote(model, safe=""))

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """`contents` with `user`/`model` roles; the length in `generationConfig`."""
        contents = [{"role": "model" if r == "assistant" else "user", "parts": [{"text": t}]}
                    for r, t in messages if r != "system"]  # fmt: skip
        body: dict[str, Any] = {"contents": contents,
                                "generationConfig": {"maxOutputTokens": max_tokens}}  # fmt: skip
        return {**body, **(options.extra_body or {})}

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One chunk: text parts (reasoning when `thought`), finish, usage."""
        delta, obj = Delta(), json_object(data)
        candidate = (obj.get("candidates") or [{}])[0]
        for part in (candidate.get("content") or {}).get("parts") or []:
            text = part.get("text") or ""
            if part.get("thought"):
                delta.reasoning_chars += len(text)
            elif text:
                delta.content_chars += len(text)
                delta.text += text
        if candidate.get("finishReason"):
            delta.finish_reason = str(candidate["finishReason"])
        usage = obj.get("usageMetadata") or {}
        delta.completion_tokens = usage.get("candidatesTokenCount")
        delta.prompt_tokens = usage.get("promptTokenCount")
        return delta


def gemini_stream(request: ReceivedRequest) -> list[Any]:
    """Two text chunks, the second with its finish and usage."""
    first = {"candidates": [{"content": {"parts": [{"text": "Hi"}], "role": "model"}}]}
    last = {"candidates": [{"content": {"parts": [{"text": " there"}], "role": "model"},
                            "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2}}  # fmt: skip
    return stream_steps([sse(first), sse(last)], done=False)


@pytest.fixture
def gemini(monkeypatch: pytest.MonkeyPatch) -> GeminiSketch:
    """The sketch, registered for this test only."""
    adapter = GeminiSketch()
    monkeypatch.setitem(REGISTRY, adapter.name, adapter)
    return adapter


def test_a_model_in_the_path_goes_per_request_with_its_own_id_field_and_no_priority(
    gemini: GeminiSketch,
) -> None:
    """The engine asks the adapter for each model's target: the run's model and a plan's
    own in their request lines (the URL's query after the path's own), the id in `labels`,
    no `priority` (the API has no field: a header carries it); both streams read ok."""
    plans = PlanFactory().at(0.0, 0.05)
    plans = [plans[0], dataclasses.replace(plans[1], model="gemini 2/flash", priority=3)]
    with ScriptedServer(gemini_stream) as server:
        records = run_engine(plans, server.url + "/?trace=1", api=gemini.name,
                             priority_header="X-Priority")  # fmt: skip
    lines = [r.head.split(b"\r\n", 1)[0].decode() for r in server.requests]
    assert lines == [
        "POST /v1beta/models/m:streamGenerateContent?alt=sse&trace=1 HTTP/1.1",
        "POST /v1beta/models/gemini%202%2Fflash:streamGenerateContent?alt=sse&trace=1 HTTP/1.1",
    ]
    bodies = [r.body for r in server.requests]
    ids = [r.headers["x-request-id"] for r in server.requests]
    assert [b["labels"] for b in bodies] == [{"request_id": i} for i in ids]
    assert all("priority" not in b for b in bodies)
    assert server.requests[1].headers["x-priority"] == "3"
    assert [(r.outcome, r.output_tokens, r.finish_reason) for r in records] == [
        (Outcome.OK, 2, "STOP"), (Outcome.OK, 2, "STOP")
    ]  # fmt: skip


def test_the_preflight_posts_to_the_models_target(gemini: GeminiSketch) -> None:
    """The preflight's request goes where the run's do: the model in the path."""
    with ScriptedServer(gemini_stream) as server:
        endpoint = make_endpoint(server.url, gemini.default_path, {})
        preflight(endpoint, gemini, BodyOptions(model="pro"), timeout_s=10)
    assert server.requests[0].path.startswith("/v1beta/models/pro:streamGenerateContent")


def test_a_priority_with_no_field_and_no_header_is_refused_at_set_up(
    gemini: GeminiSketch,
) -> None:
    """A class priority the API cannot carry is a ConfigError naming the class and the fix,
    never silently dropped."""
    spec = loads(chat_workload(), "w.yaml")
    name = next(iter(spec.classes))
    spec = dataclasses.replace(
        spec, target=dataclasses.replace(spec.target, api=gemini.name),
        classes={name: dataclasses.replace(spec.classes[name], priority=1)},
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        client_setup(spec, RunOptions())
    assert f"classes.{name}.priority" in str(caught.value)
    assert "target.priority_header" in str(caught.value)


def test_the_body_is_shaped_in_one_place_for_every_family() -> None:
    """`request_body` puts the id where each adapter says (auto: metadata only; on: `user`
    too) and the priority in its field, leaving a field `extra_body` set as written."""
    chat, responses = adapter_for("openai-chat"), adapter_for("openai-responses")
    options = BodyOptions(model="m", extra_body={"metadata": {"team": "a"}})
    hello: list[Message] = [("user", "hi")]
    assert "user" not in request_body(chat, hello, 4, options, request_id="r")
    assert request_body(chat, hello, 4, options, request_id="r", id_mode="on")["user"] == "r"
    shaped = request_body(responses, hello, 4, options, request_id="r", priority=2)
    assert (shaped["metadata"], shaped["priority"]) == ({"request_id": "r", "team": "a"}, 2)
    assert "metadata" not in request_body(responses, hello, 4, BodyOptions(model="m"),
                                          request_id="r", id_mode="off")  # fmt: skip


def test_the_contract_names_what_an_unregistered_family_lacks(gemini: GeminiSketch) -> None:
    """The sketch, registered but given none of its places, fails the contract naming
    each: the simulator dialect, the capture, both docs rows."""
    missing = missing_places(gemini.name, gemini)
    expected = [
        "a simulator dialect at /v1beta/models/m:streamGenerateContent (",
        "a captured stream with its known answer (",
        "its Streaming APIs row in docs/apis.md (`/v1beta/models/{model}:streamGenerate",
        "its body row in docs/apis.md: `labels.request_id` (by default) | none | none",
    ]
    assert len(missing) == len(expected)
    assert all(m.startswith(e) for m, e in zip(missing, expected, strict=True)), missing


def anthropic_stream(request: ReceivedRequest) -> list[Any]:
    """A two-token Anthropic Messages stream, whatever was asked."""
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return stream_steps([sse(e) for e in events], done=False)


def test_the_preflight_sends_the_runs_headers_and_body_fields(tmp_path: Path) -> None:
    """`loadgen run`'s preflight is shaped where the run's requests are: the same header
    names in the same order, the same body fields (its id in Anthropic's metadata, the
    class priority), its own id `…-ffffffffffff`."""
    text = chat_workload(target="{api: anthropic, model: m}", requests=2).replace(
        "  chat:\n", "  chat:\n    priority: 2\n"
    )
    workload = workload_file(tmp_path, text)
    with ScriptedServer(anthropic_stream) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "-q"])  # fmt: skip
    assert result.exit_code in (0, 7), result.output
    first, *_, last = server.requests  # the preflight (then its compression probe), a request
    assert first.headers["x-request-id"].endswith("-ffffffffffff")
    assert first.header_names == last.header_names
    assert list(first.body) == list(last.body)
    assert first.body["metadata"] == {"user_id": first.headers["x-request-id"]}
    assert last.body["metadata"] == {"user_id": last.headers["x-request-id"]}
    assert first.body["priority"] == last.body["priority"] == 2


@pytest.mark.parametrize(
    ("api", "hint"),
    [("openai-chat", "try target.force_output_tokens: false or target.include_usage: false"),
     ("anthropic", "check target.extra_body")],
)  # fmt: skip
def test_a_422_suggests_only_the_options_that_add_fields_to_that_apis_body(
    api: str, hint: str
) -> None:
    """The preflight's hint for a refused field comes from the adapter's `optional_fields`:
    OpenAI's bodies carry the fields two options add; Anthropic's none."""
    body = b'{"detail": "bad field"}'

    def refuse(_request: ReceivedRequest) -> list[Any]:
        return [head(422, chunked=False, length=len(body)), body]

    adapter = adapter_for(api)
    with ScriptedServer(refuse) as server:
        endpoint = make_endpoint(server.url, adapter.default_path, {})
        with pytest.raises(TargetError) as caught:
            preflight(endpoint, adapter, BodyOptions(model="m"), timeout_s=10)
    assert f"HTTP 422: {body.decode()} (the server rejected a request field: {hint})" in str(
        caught.value
    )
