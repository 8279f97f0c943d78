"""The built-in OTLP receiver, OTLP/HTTP and OTLP/gRPC: what it accepts, keeps and refuses."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from loadgen.cli import cli
from loadgen.engine.otlp_receiver import GRPC, Address, SpanReceiver, parse_address
from loadgen.errors import OptionError
from loadgen.testing.builders import workload_file

sys.path.insert(0, str(Path(__file__).parents[1] / "results"))
from test_spans import TRACE, check_row, otlp_json, otlp_request


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[SpanReceiver]:
    """A receiver on a free loopback port, its parts in `tmp_path`."""
    started = SpanReceiver(Address("127.0.0.1", 0), tmp_path)
    started.start()
    yield started
    started.close()


@pytest.fixture
def grpc_receiver(tmp_path: Path) -> Iterator[SpanReceiver]:
    """An OTLP/gRPC receiver on a free loopback port, its parts in `tmp_path`."""
    started = SpanReceiver(Address("127.0.0.1", 0, GRPC), tmp_path)
    started.start()
    yield started
    started.close()


def channel_to(receiver: SpanReceiver) -> grpc.Channel:
    """A gRPC channel to the receiver, as an OTLP exporter given its URL opens one."""
    return grpc.insecure_channel(receiver.url.removeprefix("http://").split("/")[0])


def test_protobuf_gzip_and_json_bodies_are_kept(receiver: SpanReceiver, tmp_path: Path) -> None:
    """A gzip'd protobuf export and a JSON one are answered 200 as OTLP says, and their
    spans read back after."""
    body = gzip.compress(otlp_request().SerializeToString())
    with httpx.Client() as client:
        answer = client.post(receiver.url, content=body, headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})  # fmt: skip
        assert (answer.status_code, answer.content) == (200, b"")
        assert answer.headers["content-type"] == "application/x-protobuf"
        answer = client.post(receiver.url, content=json.dumps(otlp_json()),
                             headers={"Content-Type": "application/json"})  # fmt: skip
        assert (answer.status_code, answer.json()) == (200, {})
    assert receiver.posts == 2
    spans = receiver.spans()
    assert spans.get_column("trace_id").to_list() == [TRACE, TRACE]
    check_row(spans.row(1, named=True))
    assert receiver.spans(since=1).height == 1
    assert len(list((tmp_path / "server-spans.parts").iterdir())) == 2


def test_what_is_not_otlp_is_refused(receiver: SpanReceiver) -> None:
    """A body that does not decode is 400 (counted, with its reason), another path 404."""
    with httpx.Client() as client:
        bad = client.post(receiver.url, content=b"\xff\xff\xff",
                          headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert bad.status_code == 400
        bad_json = client.post(
            receiver.url, content=b"{", headers={"Content-Type": "application/json"}
        )
        assert bad_json.status_code == 400
        elsewhere = client.post(receiver.url.replace("/v1/traces", "/v1/metrics"), content=b"")
        assert elsewhere.status_code == 404
    assert (receiver.posts, receiver.refusals) == (0, 2)
    assert receiver.last_refusal


def test_grpc_export_gzip_is_kept(grpc_receiver: SpanReceiver, tmp_path: Path) -> None:
    """An OTLP/gRPC export through the OTLP project's own stub, gzip-compressed as SDK
    exporters may send it, is answered with an empty ExportTraceServiceResponse; its span
    reads back as the HTTP receiver's does."""
    assert grpc_receiver.url.startswith("http://127.0.0.1:")  # what a gRPC exporter is given
    assert not grpc_receiver.url.endswith("/v1/traces")
    with channel_to(grpc_receiver) as channel:
        stub = TraceServiceStub(channel)
        answer = stub.Export(otlp_request(), timeout=30, compression=grpc.Compression.Gzip)
        assert answer == ExportTraceServiceResponse()
        stub.Export(otlp_request(), timeout=30)
    assert (grpc_receiver.posts, grpc_receiver.refusals) == (2, 0)
    spans = grpc_receiver.spans()
    assert spans.get_column("trace_id").to_list() == [TRACE, TRACE]
    check_row(spans.row(0, named=True))
    assert len(list((tmp_path / "server-spans.parts").iterdir())) == 2


def test_grpc_message_that_is_not_otlp_is_invalid_argument(grpc_receiver: SpanReceiver) -> None:
    """A message that does not decode is INVALID_ARGUMENT with the reason, and counted."""
    with channel_to(grpc_receiver) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as refused:
            export(b"\xff\xff\xff", timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OTLP ExportTraceServiceRequest" in refused.value.details()
    assert (grpc_receiver.posts, grpc_receiver.refusals) == (0, 1)


def test_grpc_exporter_at_the_http_receiver_is_told_to_listen_with_grpc(
    receiver: SpanReceiver,
) -> None:
    """vLLM's default exporter is gRPC: one that reaches the OTLP/HTTP receiver fails, and
    the receiver counts it with the fix (`grpc:PORT`) rather than staying silent."""
    with channel_to(receiver) as channel, pytest.raises(grpc.RpcError):
        TraceServiceStub(channel).Export(otlp_request(), timeout=30)
    assert receiver.posts == 0
    assert receiver.refusals >= 1
    assert "--otlp-receiver grpc:PORT" in (receiver.last_refusal or "")


def test_grpc_receiver_with_the_simulator_is_refused(tmp_path: Path) -> None:
    """The built-in simulator exports OTLP/HTTP: `grpc:` without a server is a usage error
    that says what to give instead, before anything starts."""
    workload = workload_file(tmp_path, "name: w\ntarget: {api: openai-chat, model: sim}\n"
                             "classes: {c: {arrival: {process: constant, rate_per_s: 1}, "
                             "requests: 1, prompt_tokens: {dist: fixed, value: 8}, "
                             "output_tokens: {dist: fixed, value: 4}}}\n")  # fmt: skip
    ran = CliRunner().invoke(cli, ["run", str(workload), "--out", str(tmp_path / "runs"),
                                   "--otlp-receiver", "grpc:0"])  # fmt: skip
    assert ran.exit_code == 1, ran.output
    assert "exports its spans over OTLP/HTTP, not gRPC" in ran.output
    assert "--otlp-receiver [HOST:]PORT" in ran.output
    assert "Traceback" not in ran.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4318", Address("127.0.0.1", 4318)), ("0.0.0.0:0", Address("0.0.0.0", 0)),
     ("[::1]:4318", Address("::1", 4318)), ("http:127.0.0.1:4318", Address("127.0.0.1", 4318)),
     ("grpc:4317", Address("127.0.0.1", 4317, GRPC)),
     ("GRPC://[::1]:0", Address("::1", 0, GRPC))],
)  # fmt: skip
def test_address(text: str, expected: Address) -> None:
    """[grpc:|http:][HOST:]PORT, the host 127.0.0.1 unless given, OTLP/HTTP unless grpc:."""
    assert parse_address(text) == expected


def test_bad_address_and_busy_port(receiver: SpanReceiver, tmp_path: Path) -> None:
    """A bad value and a port in use are option errors that say how to fix them."""
    with pytest.raises(OptionError, match="is not"):
        parse_address("host:http")
    with pytest.raises(OptionError, match="is not"):
        parse_address("grpc:")
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OptionError, match="cannot listen"):
        SpanReceiver(Address("127.0.0.1", port), tmp_path)
    with pytest.raises(OptionError, match="cannot listen"):  # gRPC shares no port either
        SpanReceiver(Address("127.0.0.1", port, GRPC), tmp_path)
