"""`run --otlp-receiver`: a built-in OTLP/HTTP trace receiver for the server's spans.

A server started with `--otlp-traces-endpoint http://HOST:PORT/v1/traces` (vLLM: and
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`, its exporter being gRPC by default)
POSTs its spans here in batches: protobuf (`application/x-protobuf`) or JSON
(`application/json`), gzip- or deflate-compressed as collectors and SDKs send them. Each
body is checked (it decodes as an `ExportTraceServiceRequest`), answered at once (200 and an
empty response; 400 with the reason when it does not decode; 413 past `MAX_BODY_BYTES`;
404 elsewhere) and kept as it came in the run folder's `server-spans.parts/`: turning
spans into rows waits until the run has ended, so during the run a batch costs this
process a socket read, a protobuf parse in C and a file write, on a thread of its own,
never the engine's loop. After the run `SpanReceiver.spans` reads the parts
(`results.spans`), and `results.write.write_spans` joins them into `server-spans.parquet`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import polars as pl

from loadgen.engine.logs import LOGGER
from loadgen.errors import OptionError
from loadgen.results.spans import (
    MAX_BODY_BYTES,
    decompressed,
    parse_protobuf,
    read_span_parts,
)
from loadgen.results.write import write_span_part

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class Address:
    """Where the receiver listens."""

    host: str
    port: int


def parse_address(text: str) -> Address:
    """`[HOST:]PORT` (`4318`, `127.0.0.1:4318`, `[::1]:0`; 0 picks a free port); an
    OptionError says what is wrong."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise OptionError("--otlp-receiver", f"{text!r} is not [HOST:]PORT",
                          "give a port (0-65535), e.g. 4318 or 127.0.0.1:4318")  # fmt: skip
    return Address(host, int(port))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection

    def do_POST(self) -> None:
        receiver = self.server.receiver
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._answer(404, b"only POST /v1/traces is served here", "text/plain")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._answer(411, b"a Content-Length is needed", "text/plain", close=True)
            return
        if int(length) > MAX_BODY_BYTES:
            self._answer(413, b"body too large", "text/plain", close=True)
            return
        body = self.rfile.read(int(length))
        is_json = "json" in (self.headers.get("Content-Type") or "").lower()
        try:
            body = decompressed(body, self.headers.get("Content-Encoding"))
            if is_json:
                orjson.loads(body)
            else:
                parse_protobuf(body)
        except (ValueError, orjson.JSONDecodeError) as exc:
            receiver.refused(str(exc))
            self._answer(400, str(exc).encode()[:500], "text/plain")
            return
        receiver.keep(body, "json" if is_json else "pb")
        if is_json:
            self._answer(200, b"{}", "application/json")
        else:
            self._answer(200, b"", "application/x-protobuf")  # an empty ExportTraceServiceResponse

    def _answer(self, status: int, body: bytes, content_type: str, *, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # the base's name
        """Quiet: the receiver counts what it took and refused; stderr is the terminal's."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: SpanReceiver


class SpanReceiver:
    """The receiver, listening from `start` to `close` on a thread of its own; each body it
    accepts is a part in `run_dir`'s `server-spans.parts/`."""

    def __init__(self, address: Address, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._lock = threading.Lock()
        self._parts: list[Path] = []
        self.refusals = 0
        self.last_refusal: str | None = None
        try:
            self._server = _Server((address.host, address.port), _Handler)
        except OSError as exc:
            raise OptionError("--otlp-receiver", f"cannot listen on {address.host}:"
                              f"{address.port}: {exc.strerror}",
                              "choose another port (0 picks a free one)") from None  # fmt: skip
        self._server.receiver = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="otlp-receiver", daemon=True)  # fmt: skip

    @property
    def url(self) -> str:
        """The endpoint to give the server (`--otlp-traces-endpoint`)."""
        address, port = self._server.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else str(address)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}{TRACES_PATH}"

    def start(self) -> None:
        """Listen, on a thread of its own."""
        self._thread.start()
        LOGGER.info("otlp receiver: listening on %s", self.url)

    def keep(self, body: bytes, kind: str) -> None:
        """Keep one accepted body as the next part (called on the handler's thread)."""
        with self._lock:
            index = len(self._parts) + 1
            self._parts.append(write_span_part(self._run_dir, index, body, kind))

    def refused(self, why: str) -> None:
        """Count a body that did not decode, keeping the last reason."""
        with self._lock:
            self.refusals += 1
            self.last_refusal = why[:300]

    @property
    def posts(self) -> int:
        """Bodies accepted so far."""
        with self._lock:
            return len(self._parts)

    def spans(self, since: int = 0) -> pl.DataFrame:
        """The spans of the bodies accepted from the `since`-th on (all of them by default)."""
        with self._lock:
            parts = self._parts[since:]
        return read_span_parts(parts)

    def close(self) -> None:
        """Stop listening (idempotent); the parts stay."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
