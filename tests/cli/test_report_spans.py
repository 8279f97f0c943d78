"""`report RUN --spans FILE` and `--spans-from URL`: a finished run joined to the server's
spans later, from a collector's file or from Jaeger's or Tempo's HTTP API."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.engine import span_query
from loadgen.results.runfolder import SPANS_FILE
from loadgen.testing.builders import streamed_record, write_run
from loadgen.workload.spec import SloTargets

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
T0_NS = int(T0.timestamp() * 1e9)
QUEUE_S = (0.5, 0.25, 0.125, 0.0625)


def trace(n: int) -> str:
    return f"{0xABC0 + n:032x}"


def run_folder(tmp_path: Path) -> Path:
    """Four ok requests, each with a traceparent, sent 10 ms apart."""
    records = [streamed_record(n, intended_ms=10.0 * n, request_id_sent=f"id-{n}",
                               traceparent=f"00-{trace(n)}-{n + 1:016x}-01")
               for n in range(4)]  # fmt: skip
    return write_run(tmp_path / "runs", T0, records, slos=SloTargets(ttft_ms=1000.0))


def otlp_span(n: int) -> dict[str, Any]:
    """vLLM's span of request n, as OTLP JSON: it arrived 0.5 ms after the send."""
    start = T0_NS + n * 10_000_000 + 500_000
    attributes = {"gen_ai.latency.time_in_queue": QUEUE_S[n], "gen_ai.usage.prompt_tokens": 100}
    return {"traceId": trace(n), "spanId": f"{n + 100:016x}", "parentSpanId": f"{n + 1:016x}",
            "name": "llm_request", "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 200_000_000),
            "attributes": [{"key": k, "value": {"doubleValue": v} if isinstance(v, float)
                            else {"intValue": str(v)}} for k, v in attributes.items()]}  # fmt: skip


def export(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}


def server_spans(output: str) -> dict[str, Any]:
    """summary.json's `server_spans` from `report --format json`."""
    block: dict[str, Any] = json.loads(output)["server_spans"]
    return block


def test_report_joins_a_collectors_file(tmp_path: Path) -> None:
    """A file exporter's lines (three of four traces): three joined by trace id, each with
    its own queue; the spans are kept in the run, and a later plain report joins them again."""
    run_dir = run_folder(tmp_path)
    lines = tmp_path / "otel-traces.json"
    lines.write_text("\n".join(json.dumps(export([otlp_span(n)])) for n in range(3)) + "\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["report", str(run_dir), "--spans", str(lines), "--format", "json"])
    assert result.exit_code == 0, result.output
    block = server_spans(result.stdout)
    assert (block["ok"], block["ok_joined"], block["by_trace_id"]) == (4, 3, 3)
    assert block["source"] == "otel-traces.json"
    assert block["clocks"]["arrival_after_send_ms"]["p50"] == pytest.approx(0.5)
    assert "3 of 4 ok requests joined" in result.stderr
    kept = pl.read_parquet(run_dir / SPANS_FILE)
    assert sorted(kept.get_column("queue_ms").to_list()) == [125.0, 250.0, 500.0]
    again = runner.invoke(cli, ["report", str(run_dir), "--format", "json"])
    assert server_spans(again.stdout) == block


class _Tracing(BaseHTTPRequestHandler):
    """Jaeger's query API for traces 0 and 2, Tempo's for 1; 404 for the rest."""

    def do_GET(self) -> None:
        trace_id = self.path.rsplit("/", 1)[-1]
        n = next((n for n in range(4) if trace(n) == trace_id), None)
        if n is None or n == 3 or not self.path.startswith("/api/traces/"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if n == 1:
            body = {"batches": export([otlp_span(1)])["resourceSpans"]}
        else:
            span = otlp_span(n)
            tags = [{"key": a["key"], "value": next(iter(a["value"].values()))}
                    for a in span["attributes"]]  # fmt: skip
            body = {"data": [{"traceID": trace_id, "processes": {}, "spans": [{
                "traceID": trace_id, "spanID": span["spanId"], "operationName": "llm_request",
                "startTime": int(span["startTimeUnixNano"]) // 1000, "duration": 200_000,
                "tags": [{"key": t["key"], "value": float(t["value"]) if "queue" in t["key"]
                          else int(t["value"])} for t in tags]}]}]}  # fmt: skip
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def tracing() -> Iterator[str]:
    """A scripted Jaeger/Tempo on loopback: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Tracing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_report_asks_jaeger_or_tempo_by_trace_id(tmp_path: Path, tracing: str) -> None:
    """One query per record's trace id: Jaeger's and Tempo's answers both read, a trace the
    backend lacks (404) left unjoined and counted."""
    run_dir = run_folder(tmp_path)
    result = CliRunner().invoke(cli, ["report", str(run_dir), "--spans-from", tracing,
                                      "--format", "json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    block = server_spans(result.stdout)
    assert (block["ok_joined"], block["unjoined"], block["source"]) == (3, {"ok": 1}, tracing)
    kept = pl.read_parquet(run_dir / SPANS_FILE).sort("trace_id")
    assert kept.get_column("queue_ms").to_list() == [500.0, 250.0, 125.0]


def test_spans_options_are_refused_where_they_cannot_apply(tmp_path: Path, tracing: str) -> None:
    """On a results store, or with both sources, the options are refused (exit 1, no traceback);
    a run without traceparents has no trace id to ask for."""
    run_dir = run_folder(tmp_path)
    lines = tmp_path / "t.json"
    lines.write_text(json.dumps(export([otlp_span(0)])))
    runner = CliRunner()
    store = runner.invoke(cli, ["report", str(run_dir.parent), "--spans", str(lines)])
    assert store.exit_code == 1
    assert "give a run folder" in store.output
    both = runner.invoke(
        cli, ["report", str(run_dir), "--spans", str(lines), "--spans-from", tracing]
    )
    assert both.exit_code == 1
    assert "give one source" in both.output
    bare = write_run(tmp_path / "bare", T0, [streamed_record(0)], slos=SloTargets(ttft_ms=1000.0))
    none = runner.invoke(cli, ["report", str(bare), "--spans-from", tracing])
    assert none.exit_code == 1
    assert "no traceparent" in none.output


class _TlsServer(ThreadingHTTPServer):
    """The scripted backend over TLS, each handshake in its connection's own thread (a
    client that refuses the certificate never holds up the accept loop)."""

    context: ssl.SSLContext
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), address  # fmt: skip

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A refused handshake is the point of the test, not an error to print."""


def test_spans_from_takes_the_commands_tls_trust_and_caps_the_answer(
    tmp_path: Path, test_ca: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https Jaeger whose certificate a test CA signed: without --cacert, exit 1 naming
    the unknown issuer and --cacert (httpx's own bundle is not asked); with it, joined; an
    answer over the cap is refused with what it was, not read whole."""
    leaf = test_ca.leaf("tracing")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(leaf.cert), str(leaf.key))
    server = _TlsServer(("127.0.0.1", 0), _Tracing)
    server.context = context
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    clean = {"SSL_CERT_FILE": None, "SSL_CERT_DIR": None}
    try:
        run_dir = run_folder(tmp_path)
        runner = CliRunner()
        untrusted = runner.invoke(cli, ["report", str(run_dir), "--spans-from", url], env=clean)
        assert untrusted.exit_code == 1, untrusted.output
        assert "unknown issuer" in untrusted.output
        assert "--cacert" in untrusted.output
        trusted = runner.invoke(cli, ["report", str(run_dir), "--spans-from", url, "--cacert",
                                      str(test_ca.pem), "--format", "json"], env=clean)  # fmt: skip
        assert trusted.exit_code == 0, trusted.output
        assert server_spans(trusted.stdout)["ok_joined"] == 3
        monkeypatch.setattr(span_query, "MAX_TRACE_BYTES", 100)
        capped = runner.invoke(cli, ["report", str(run_dir), "--spans-from", url, "--cacert",
                                     str(test_ca.pem)], env=clean)  # fmt: skip
        assert capped.exit_code == 1, capped.output
        assert "answered 200: an answer over 16 MiB" in capped.output
    finally:
        server.shutdown()
        server.server_close()
