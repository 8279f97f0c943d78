"""Is the simulator ever the bottleneck? Drive N concurrent streams and read its own trace.

Starts `loadgen sim` via `running_sim` (its own process) with a trace file and a max batch
large enough to hold every stream, opens N keep-alive connections with a minimal raw
asyncio client (deliberately not loadgen's client), sends one streaming request on each
at once, waits for every stream to end, and reports, per repeat and as medians
(min–max) over repeats:

* step-time error, actual − intended wake-up of each engine step (p50/p99/max, ms), over
  all steps and in steady state (steps ending after the last request arrived; the
  first steps overlap the burst of N arrivals the loop is busy parsing),
* write lag, last chunk of a step written − intended (p50/p99/max, ms),
* content chunks written per second and the largest decode batch seen,
* simulator CPU time per chunk (µs), from /proc/<pid>/stat utime+stime during the load.

Usage: python benchmarks/sim_load.py --streams 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadgen.run.processes.simulator import running_sim

_END = b"\r\n0\r\n\r\n"


class _Stream(asyncio.Protocol):
    """One connection carrying one streaming request; done when the chunked body ends."""

    def __init__(self, done: asyncio.Future[int]) -> None:
        self.done = done
        self.events = 0
        self._tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.events += data.count(b"data: ")
        tail = self._tail + data[-16:]
        self._tail = tail[-16:]
        if tail.endswith(_END) and not self.done.done():
            self.done.set_result(self.events)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed early after {self.events} events"))


def _request(host: str, port: int, prompt_words: int, output_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "sim",
            "messages": [{"role": "user", "content": " ".join(["word"] * prompt_words)}],
            "stream": True,
            "max_tokens": output_tokens,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _drive(url: str, streams: int, prompt_words: int, output_tokens: int) -> list[int]:
    """Connect `streams` sockets, then send every request at once; events per stream."""
    loop = asyncio.get_running_loop()
    host, port_text = url.removeprefix("http://").rsplit(":", 1)
    port = int(port_text)
    protocols: list[_Stream] = []
    for _ in range(streams):
        done: asyncio.Future[int] = loop.create_future()
        _, protocol = await loop.create_connection(lambda d=done: _Stream(d), host, port)
        protocols.append(protocol)
    payload = _request(host, port, prompt_words, output_tokens)
    for protocol in protocols:
        assert protocol.transport is not None
        protocol.transport.write(payload)
    counts = await asyncio.gather(*(p.done for p in protocols))
    for protocol in protocols:
        assert protocol.transport is not None
        protocol.transport.close()
    return list(counts)


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _analyse(trace: Path, cpu_s: float) -> dict[str, float]:
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    chunk_ns = [t for r in records if r["type"] == "request" for t in r["chunk_ns"]]
    error_ms = [(s["actual_ns"] - s["intended_ns"]) / 1e6 for s in steps]
    last_arrival_ns = max(r["received_ns"] for r in records if r["type"] == "request")
    steady_ms = [
        (s["actual_ns"] - s["intended_ns"]) / 1e6
        for s in steps
        if s["intended_ns"] > last_arrival_ns
    ]
    lag_ms = [(s["written_ns"] - s["intended_ns"]) / 1e6 for s in steps]
    span_s = (max(chunk_ns) - min(chunk_ns)) / 1e9
    return {
        "steps": len(steps),
        "max_batch_seen": max(s["batch"] for s in steps),
        "error_p50_ms": _pct(error_ms, 0.50),
        "error_p99_ms": _pct(error_ms, 0.99),
        "error_max_ms": max(error_ms),
        "steady_error_p99_ms": _pct(steady_ms, 0.99),
        "steady_error_max_ms": max(steady_ms),
        "lag_p50_ms": _pct(lag_ms, 0.50),
        "lag_p99_ms": _pct(lag_ms, 0.99),
        "lag_max_ms": max(lag_ms),
        "chunks": len(chunk_ns),
        "chunks_per_s": len(chunk_ns) / span_s,
        "cpu_us_per_chunk": cpu_s / len(chunk_ns) * 1e6,
        "cpu_share": cpu_s / span_s,
    }


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


def run_once(args: argparse.Namespace) -> dict[str, float]:
    """One repeat: a fresh simulator, one burst of `args.streams` streams."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "sim.jsonl"
        sim_args = ["--max-batch", str(args.max_batch), "--speed", str(args.speed)]
        with running_sim(sim_args + args.sim_arg, trace_file=trace) as proc:
            cpu_before = _cpu_s(proc.pid)
            loop = _event_loop()
            try:
                counts = loop.run_until_complete(
                    _drive(proc.url, args.streams, args.prompt_words, args.output_tokens)
                )
            finally:
                loop.close()
            cpu_s = _cpu_s(proc.pid) - cpu_before
            time.sleep(0.1)
        expected = args.output_tokens + 3  # role + content + finish + [DONE]
        assert all(c == expected for c in counts), f"short streams: {set(counts)}"
        return _analyse(trace, cpu_s)


def _summary(name: str, values: list[float]) -> str:
    return f"{name:>18}: {statistics.median(values):10.3f}  ({min(values):.3f}–{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--prompt-words", type=int, default=8)
    parser.add_argument("--output-tokens", type=int, default=200)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sim-arg", action="append", default=[], help="extra simulator argument (repeatable)"
    )
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for i in range(args.repeats):
        result = run_once(args)
        results.append(result)
        print(f"repeat {i + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in result.items()))
    print(
        f"\n{args.streams} streams × {args.output_tokens} tokens; "
        f"median (min–max) of {args.repeats} repeats:"
    )
    for key in results[0]:
        print(_summary(key, [r[key] for r in results]))


if __name__ == "__main__":
    main()
