"""`run --otlp-receiver`: a built-in OTLP trace receiver for the server's spans, OTLP/HTTP
or OTLP/gRPC.

OTLP/HTTP (`--otlp-receiver [HOST:]PORT`, or `http:[HOST:]PORT`): a server started with
`--otlp-traces-endpoint http://HOST:PORT/v1/traces` POSTs its spans here in batches:
protobuf (`application/x-protobuf`) or JSON (`application/json`), gzip- or
deflate-compressed as collectors and SDKs send them. Each body is checked (it decodes as an
`ExportTraceServiceRequest`), answered at once (200 and an empty response; 400 with the
reason when it does not decode; 413 past `MAX_BODY_BYTES`; 404 elsewhere). A gRPC exporter
that connects here (HTTP/2's preface) is refused and counted with the fix: listen with
`grpc:`.

OTLP/gRPC (`--otlp-receiver grpc:[HOST:]PORT`): vLLM's exporter by default (its
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` unset), SGLang's and most SDKs': the server is given
`--otlp-traces-endpoint http://HOST:PORT` and calls `TraceService/Export`, served by grpcio
(the reference implementation: HTTP/2, its flow control and gzip message compression are
its job, not hand-written here). The message arrives as the same protobuf bytes and is
checked and kept the same way; one that does not decode is `INVALID_ARGUMENT`.

Every accepted body is kept as it came in the run folder's `server-spans.parts/`: turning
spans into rows waits until the run has ended, so during the run a batch costs this process
a socket read, a protobuf parse in C and a file write, on a thread of its own, never the
engine's loop. After the run `SpanReceiver.spans` reads the parts (`results.spans`), and
`results.write.write_spans` joins them into `server-spans.parquet`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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
GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
HTTP, GRPC = "http", "grpc"  # OTLP/HTTP, OTLP/gRPC
H2_PREFACE = b"PRI * HTTP/2.0"  # what a gRPC client sends first
GRPC_WORKERS = 2  # exports are a few a second: a parse and a file write each


@dataclass(frozen=True, slots=True)
class Address:
    """Where the receiver listens, and the OTLP protocol it speaks there."""

    host: str
    port: int
    protocol: str = HTTP

    @property
    def endpoint(self) -> str:
        """The URL a server is given as `--otlp-traces-endpoint` (a fixed port's: a
        listening receiver's `url` says the port 0 picked)."""
        base = f"http://{_shown(self.host)}:{self.port}"
        return base if self.protocol == GRPC else base + TRACES_PATH


def parse_address(text: str) -> Address:
    """`[grpc:|http:][HOST:]PORT` (`4318`, `127.0.0.1:4318`, `[::1]:0`, `grpc:4317`,
    `grpc://0.0.0.0:4317`; 0 picks a free port; OTLP/HTTP unless `grpc:`); an OptionError
    says what is wrong."""
    protocol, rest = HTTP, text
    scheme, colon, after = text.partition(":")
    if colon and scheme.lower() in (HTTP, GRPC):
        protocol, rest = scheme.lower(), after.removeprefix("//")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise OptionError("--otlp-receiver", f"{text!r} is not [grpc:|http:][HOST:]PORT",
                          "give a port (0-65535), e.g. 4318 or 127.0.0.1:4318 (OTLP/HTTP), "
                          "grpc:4317 (OTLP/gRPC)")  # fmt: skip
    return Address(host, int(port), protocol)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection

    def parse_request(self) -> bool:
        """The base's, but a gRPC exporter's HTTP/2 preface is refused with the fix."""
        if getattr(self, "raw_requestline", b"").startswith(H2_PREFACE):  # the base sets it
            self.server.receiver.refused(
                "an OTLP/gRPC exporter connected to this OTLP/HTTP receiver: listen with "
                "--otlp-receiver grpc:PORT, or have the server export http/protobuf "
                "(vLLM: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)"
            )
            self.close_connection = True
            return False
        return super().parse_request()

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
        except (ValueError, orjson.JSONDecodeError) as exc:
            receiver.refused(str(exc))
            self._answer(400, str(exc).encode()[:500], "text/plain")
            return
        if is_json:
            receiver.keep(body, "json")
            self._answer(200, b"{}", "application/json")
        elif (why := receiver.accept(body)) is not None:
            self._answer(400, why.encode()[:500], "text/plain")
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
        self.protocol = address.protocol
        listen = _GrpcListener if address.protocol == GRPC else _HttpListener
        self._listener = listen(address, self)

    @property
    def url(self) -> str:
        """The endpoint to give the server (`--otlp-traces-endpoint`)."""
        return self._listener.url

    def start(self) -> None:
        """Listen, on threads of its own."""
        self._listener.start()
        LOGGER.info("otlp receiver: listening on %s (OTLP/%s)", self.url,
                    "gRPC" if self.protocol == GRPC else "HTTP")  # fmt: skip

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
        self._listener.close()

    def accept(self, body: bytes) -> str | None:
        """Keep one OTLP protobuf body (a gRPC message, or an HTTP body decompressed);
        why it was refused when it does not decode."""
        try:
            parse_protobuf(body)
        except ValueError as exc:
            self.refused(str(exc))
            return str(exc)
        self.keep(body, "pb")
        return None


def _cannot_listen(address: Address, why: str) -> OptionError:
    return OptionError("--otlp-receiver", f"cannot listen on {address.host}:{address.port}: "
                       f"{why}", "choose another port (0 picks a free one)")  # fmt: skip


class _HttpListener:
    """OTLP/HTTP at `/v1/traces`: `http.server` on a thread of its own."""

    def __init__(self, address: Address, receiver: SpanReceiver) -> None:
        try:
            self._server = _Server((address.host, address.port), _Handler)
        except OSError as exc:
            raise _cannot_listen(address, str(exc.strerror)) from None
        self._server.receiver = receiver
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="otlp-receiver", daemon=True)  # fmt: skip

    @property
    def url(self) -> str:
        address, port = self._server.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else str(address)
        return f"http://{_shown(host)}:{port}{TRACES_PATH}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


class _GrpcListener:
    """OTLP/gRPC's `TraceService/Export`: grpcio's server, its own threads. The method is
    served without (de)serializers, so the message is the protobuf bytes as they came."""

    def __init__(self, address: Address, receiver: SpanReceiver) -> None:
        try:
            import grpc  # the [spans] extra; deferred, as for the other optional packages
        except ImportError:
            raise OptionError("--otlp-receiver", "an OTLP/gRPC receiver needs the grpcio "
                              "package", "pip install 'loadgen[spans]'") from None  # fmt: skip

        def export(body: bytes, context: Any) -> bytes:
            why = receiver.accept(body)
            if why is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, why[:500])
            return b""  # an empty ExportTraceServiceResponse

        handler = grpc.method_handlers_generic_handler(
            GRPC_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)}
        )
        self._server = grpc.server(
            ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="otlp-receiver"),
            handlers=(handler,),
            options=[("grpc.max_receive_message_length", MAX_BODY_BYTES),
                     ("grpc.so_reuseport", 0)],  # a port in use is an error, not shared
        )  # fmt: skip
        self._host = address.host
        bind = f"[{address.host}]" if ":" in address.host else address.host
        try:
            self._port = self._server.add_insecure_port(f"{bind}:{address.port}")
        except RuntimeError as exc:  # grpcio raises where older versions returned 0
            raise _cannot_listen(address, str(exc)) from None
        if not self._port:
            raise _cannot_listen(address, "grpcio could not bind it")
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{_shown(self._host)}:{self._port}"

    def start(self) -> None:
        self._server.start()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.stop(grace=None).wait()


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host
