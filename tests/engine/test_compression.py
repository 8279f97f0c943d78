"""Compression as the users' clients meet it: the preflight probes the route with the OpenAI
SDK's Accept-Encoding and warns when it compresses event streams; `--accept-encoding` makes
the run read them as those clients do."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.cli import cli
from loadgen.engine.preflight import preflight
from loadgen.engine.transport import make_endpoint
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, compressed_chat, simple_chat
from loadgen.testing.builders import chat_workload, workload_file

GAP_S = 0.02


def gzip_when_asked(request: ReceivedRequest) -> list[Step]:
    """A route that compresses event streams for clients that accept gzip, as nginx with
    `gzip on` for text/event-stream does: its compressor holds the stream to its end."""
    if "gzip" in request.headers.get("accept-encoding", ""):
        return compressed_chat(4, sync=False, gap_s=GAP_S)
    return simple_chat(4, gap_s=GAP_S)


def notes_for(handler, headers: dict[str, str] | None = None) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    """The preflight's warnings against `handler`, and the requests the server saw."""
    adapter = adapter_for("openai-chat")
    with ScriptedServer(handler) as server:
        endpoint = make_endpoint(server.url, adapter.default_path, headers or {})
        notes = preflight(endpoint, adapter, BodyOptions(model="m"), timeout_s=10)
        return notes, len(server.requests)


def test_the_preflight_warns_when_the_route_compresses_for_clients_that_accept_it() -> None:
    """A run that asks for no compression probes once more with `gzip, deflate` and warns:
    the coding, the first token such a client got (after the whole 7-event stream: ≥ 120 ms
    of its 20 ms gaps, in one read) beside the plain one, and --accept-encoding."""
    notes, requests = notes_for(gzip_when_asked)
    assert requests == 2
    (note,) = notes
    assert "compresses event streams (Content-Encoding: gzip) for clients that send " in note
    assert "Accept-Encoding: gzip, deflate (the OpenAI SDK does)" in note
    assert "its 4 output events in 1 read" in note
    assert "add --accept-encoding to measure what they see" in note
    first_ms = float(note.split("reached such a client ")[1].split(" ms")[0].replace(",", ""))
    assert first_ms >= 6 * GAP_S * 1000  # the last byte's time, not the first token's


def test_a_route_that_never_compresses_gets_no_warning() -> None:
    """Plain either way: two requests, nothing to say."""
    assert notes_for(lambda r: simple_chat(4)) == ([], 2)


def test_a_run_that_asks_for_compression_reads_its_preflight_inflated() -> None:
    """With Accept-Encoding asked for, the one preflight request reads the compressed stream
    to its end and says what it saw (no probe: it is the probe)."""
    notes, requests = notes_for(gzip_when_asked, {"Accept-Encoding": "gzip, deflate"})
    assert requests == 1
    assert "this run reads the streams as they do" in notes[0]


def run(tmp_path: Path, *args: str, handler=gzip_when_asked) -> tuple[int, str, Path]:  # type: ignore[no-untyped-def]
    """`loadgen run` of 10 requests against `handler`: exit code, output, run folder."""
    tmp_path.mkdir()
    workload = workload_file(tmp_path, chat_workload(requests=10, output_tokens=4))
    with ScriptedServer(handler) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out",
                                          str(tmp_path), "--run-id", "r", "--lag-bound-ms", "1000",
                                          *args])  # fmt: skip
    return result.exit_code, result.output, tmp_path / "r"


def test_a_run_says_what_gzip_clients_see_and_measures_it_with_the_flag(tmp_path: Path) -> None:
    """Without the flag the run reads plain streams (MET, exit 0) and prints the preflight's
    warning; with --accept-encoding every request carries `gzip, deflate` and its stream,
    held by the compressor, arrives inflated in one read as the SDK gets it: ok, TTFT after
    the whole stream, every stream coalesced, TPOT INCONCLUSIVE (exit 7); run.json keeps the
    codings."""
    code, output, plain_dir = run(tmp_path / "plain")
    assert code == 0, output
    assert "preflight: " in output
    assert "add --accept-encoding" in output
    code, output, run_dir = run(tmp_path / "gzip", "--accept-encoding")
    assert code == 7, output
    summary = json.loads((run_dir / "summary.json").read_text())
    chat = summary["classes"]["chat"]
    assert (chat["outcomes"]["ok"], chat["delivery"]["reads"], chat["delivery"]["events"]) == (
        10, 10, 40)  # fmt: skip
    assert chat["delivery"]["coalesced"] == 10
    plain = json.loads((plain_dir / "summary.json").read_text())["classes"]["chat"]
    assert chat["ttft_ms"]["p50"] >= plain["ttft_ms"]["p50"] + 3 * GAP_S * 1000
    spec = json.loads((run_dir / "run.json").read_text())["workload"]["spec"]
    assert spec["target"]["accept_encoding"] == ["gzip", "deflate"]


def test_codings_loadgen_cannot_inflate_are_refused_before_traffic(tmp_path: Path) -> None:
    """`--accept-encoding br` and `target.accept_encoding: [zstd]` are exit 1, naming what
    loadgen inflates, before any request."""
    code, output, _ = run(tmp_path / "a", "--accept-encoding", "br")
    assert code == 1
    assert "--accept-encoding: 'br' is not a coding loadgen inflates as it arrives" in output
    assert "gzip, deflate" in output
    text = chat_workload(target="{api: openai-chat, model: m, accept_encoding: [zstd]}")
    path = workload_file(tmp_path, text, "z.yaml")
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert "target.accept_encoding: 'zstd' is not a coding loadgen inflates" in result.output


def test_the_workload_key_sends_the_codings_it_names(tmp_path: Path) -> None:
    """`target.accept_encoding: gzip` sends exactly `gzip`; `true` the SDK's pair."""
    seen: list[str] = []

    def record(request: ReceivedRequest) -> list[Step]:
        seen.append(request.headers.get("accept-encoding", ""))
        return simple_chat(3)

    for value, sent in (("gzip", "gzip"), ("true", "gzip, deflate")):
        seen.clear()
        text = chat_workload(requests=5, target=f"{{api: openai-chat, model: m, "
                             f"accept_encoding: {value}}}")  # fmt: skip
        path = workload_file(tmp_path, text, f"{value}.yaml")
        with ScriptedServer(record) as server:
            result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                              str(tmp_path / value), "-q"])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert set(seen) == {sent}
