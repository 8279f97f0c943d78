"""The built-in OTLP/HTTP receiver: what it accepts, keeps and refuses."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.engine.otlp_receiver import Address, SpanReceiver, parse_address
from loadgen.errors import OptionError

sys.path.insert(0, str(Path(__file__).parents[1] / "results"))
from test_spans import TRACE, check_row, otlp_json, otlp_request


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[SpanReceiver]:
    """A receiver on a free loopback port, its parts in `tmp_path`."""
    started = SpanReceiver(Address("127.0.0.1", 0), tmp_path)
    started.start()
    yield started
    started.close()


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4318", Address("127.0.0.1", 4318)), ("0.0.0.0:0", Address("0.0.0.0", 0)),
     ("[::1]:4318", Address("::1", 4318))],
)  # fmt: skip
def test_address(text: str, expected: Address) -> None:
    """[HOST:]PORT, the host 127.0.0.1 unless given."""
    assert parse_address(text) == expected


def test_bad_address_and_busy_port(receiver: SpanReceiver, tmp_path: Path) -> None:
    """A bad value and a port in use are option errors that say how to fix them."""
    with pytest.raises(OptionError, match="is not"):
        parse_address("host:http")
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OptionError, match="cannot listen"):
        SpanReceiver(Address("127.0.0.1", port), tmp_path)
