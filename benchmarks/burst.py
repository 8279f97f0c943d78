"""A burst of simultaneous sends, cold and warm: send lag, and TTFT against the server's own.

Drives the real engine (`Engine` on a `Pool`, through the engine harness `loadgen run`
uses, on uvloop when installed) against `loadgen sim` in its own process with its
ground-truth trace (every request's receive time and every chunk's write, on the same
CLOCK_MONOTONIC as the client). Each run starts a fresh simulator: a flat decode step
(`--gap-ms`), a batch that holds every stream, near-instant prefill. Two parts:

* `burst`: N requests all due at t0 (open loop, one instant). Per run: send lag
  (sent − intended: when its bytes went to the kernel, after any connect) p50/p99/max
  over the N; the client's TTFT (first token − intended) mean minus the simulator's own
  TTFT (its first-token write − its receive of the request) mean: the client's over-report,
  split into its two parts, the client's own send lag (mean sent − intended) and the time
  from the write to the simulator's receive stamp (mean; the loopback hop and however long
  the simulator, one process on a shared box, takes to read its share of the burst: its
  receive stamp is when the read that brought a request's last byte returned, before it
  handles any of them); `sim_queue_ms`, the mean time from that stamp to when the
  simulator began to handle the request (its own queue, inside its TTFT); and the
  first-token stamp error (client stamp − the simulator's write of chunk 0) p99.
* `closed`: a closed loop of N streams (one batch flow, concurrency N, `--waves` × N
  documents, the next sent when one ends), the first wave included. TTFT over-report as
  above (all documents, and the first wave alone), and the turnaround: sent − intended of
  the later documents (their intended time is their predecessor's end, so their TTFT holds
  the client's turnaround); `later_from_send_over_ms` is the later documents' TTFT from
  their send over the simulator's, i.e. without the turnaround (what a client that starts
  its timer at the send, as the code before this benchmark did, would report).

* `pass`: where a burst's send lag goes, without a server: the engine's own work per
  write (`Engine.start` on an idle connection whose transport takes the bytes and does
  nothing: the pass's Python) and a bare `socket.send` per request on N warm loopback TCP
  connections whose peer is not read (the kernel's part, with no server process to wake).
  The burst part's send lag per request, (p99 / N), minus these two is what the kernel
  spends when a server reads on the other core, waking it and handing it the bytes.

`cold` opens each connection inside its request (today's `--warm-connections 0`);
`warm` opens N before t0 (`Pool.warm`, what `--warm-connections auto` does). Cold and
warm run back to back per repeat (their order alternating), each printed with the load
average beside it, then median (min–max) over the repeats. Bars: send lag p99 ≤ 10 ms
for 512 simultaneous sends on warm connections; TTFT mean within 15 ms of the
simulator's at 512 closed-loop streams, first wave included.

Usage (from the repository root):

    python benchmarks/burst.py --streams 128,512,1024 --repeats 5
    python benchmarks/burst.py --part closed --streams 512 --repeats 3
    python benchmarks/burst.py --part burst --streams 512 --modes warm --profile burst.prof
    python benchmarks/burst.py --part pass --streams 512 --repeats 7
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from time import perf_counter_ns
from typing import Any

import anyio
import numpy as np
from client_stream import read_trace  # the script's folder is on sys.path

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine.harness import run_engine
from loadgen.engine.host import backend_options, raise_open_files_limit
from loadgen.engine.runner import Engine, EngineConfig
from loadgen.engine.transport import Connection, Pool, make_endpoint
from loadgen.results.records import Outcome, RequestRecord
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import NullTransport
from loadgen.workload.plans import Flow, RequestPlan, Work
from loadgen.workload.spec import Deadlines

START_DELAY_NS = 50_000_000  # t0 this long after warming ends (as a run's t0 is 200 ms on)
BAR_BURST_LAG_P99_MS = 10.0  # at 512 warm
BAR_CLOSED_TTFT_MS = 15.0  # at 512 closed-loop streams


def plans_for(part: str, streams: int, tokens: int, waves: int) -> Work:
    """`burst`: `streams` singles due at 0; `closed`: one batch of `streams × waves` docs."""
    if part == "burst":
        return Work(singles=[_plan(i, tokens) for i in range(streams)])
    docs = tuple(_plan(i, tokens, turn=i) for i in range(streams * waves))
    flow = Flow(
        kind="batch", class_name="bench", session_id=0, start_ns=0, plans=docs, concurrency=streams
    )
    return Work(flows=[flow])


def _plan(request_id: int, tokens: int, turn: int | None = None) -> RequestPlan:
    return RequestPlan(
        request_id=request_id, class_name="bench", intended_ns=0, prompt_tokens=8,
        output_tokens=tokens, deadlines=Deadlines(), session_id=0 if turn is not None else None,
        turn=turn,
    )  # fmt: skip


def run_once(
    part: str, mode: str, args: argparse.Namespace, streams: int, profiler: cProfile.Profile | None
) -> dict[str, Any]:
    """One engine run against a fresh simulator; its figures."""
    work = plans_for(part, streams, args.tokens, args.waves)
    sim_args = [
        "--decode-step-ms", f"{args.gap_ms:g}", "--max-batch", str(streams),
        "--prefill-tokens-per-s", "100000000", "--speed", "1",
    ]  # fmt: skip
    records: list[RequestRecord] = []
    box: dict[str, Any] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "sim.jsonl"
        with running_sim(sim_args, trace_file=trace_path) as sim:
            adapter = adapter_for("openai-chat")
            endpoint = make_endpoint(sim.url, adapter.default_path, {})
            config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0)

            async def session(engine: Engine) -> None:
                if mode == "warm":
                    box["warm"] = await engine.connector.warm(streams)
                t0_ns = perf_counter_ns() + START_DELAY_NS
                box["t0"] = t0_ns
                if profiler is not None:
                    profiler.enable()
                try:
                    await engine.run(t0_ns)
                finally:
                    if profiler is not None:
                        profiler.disable()

            pool = Pool(endpoint)
            run_engine(work, pool, config, records.append, session, quiet=True)
        trace = read_trace(trace_path)
    figures = analyse(part, records, trace, box["t0"], streams)
    warm_opened = getattr(pool, "warm_opened", 0)  # 0 on a tree before warming (A/B baseline)
    figures["opened_during_run"] = pool.opened - warm_opened
    figures["warm_opened"] = warm_opened
    figures["load_avg"] = load
    return figures


def pass_cost(streams: int, tokens: int) -> dict[str, float]:
    """µs per request of one burst pass's writes: the engine's (`_go` on idle connections
    to a sink) and the kernel's (`send` on warm loopback connections nobody reads)."""

    async def engine_part() -> float:
        adapter = adapter_for("openai-chat")
        pool = Pool(make_endpoint("http://127.0.0.1:9", adapter.default_path, {}))
        config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0)
        engine = Engine(plans_for("burst", streams, tokens, 1), pool, config, lambda r: None)
        engine.t0_ns = perf_counter_ns()
        made = [engine.prepare(p) for p in engine.work.singles]  # made ahead, as in a run
        for _ in made:
            conn = Connection(pool)
            conn.connection_made(NullTransport())  # type: ignore[arg-type]
            pool._idle.append(conn)
        now = engine.now_ns()
        start = perf_counter_ns()
        for exchange, request in made:
            engine.start(exchange, request, now)
        return (perf_counter_ns() - start) / streams / 1e3

    engine_us = anyio.run(engine_part, backend_options=backend_options())
    request = b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 300\r\n\r\n" + b"x" * 300
    with socket.create_server(("127.0.0.1", 0), backlog=streams) as server:
        port = server.getsockname()[1]
        pairs = []
        for _ in range(streams):
            client = socket.create_connection(("127.0.0.1", port))
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pairs.append((client, server.accept()[0]))
        for client, _ in pairs:  # one send each first: the kernel's first-use costs
            client.send(request)
        start = perf_counter_ns()
        for client, _ in pairs:
            client.send(request)
        kernel_us = (perf_counter_ns() - start) / streams / 1e3
        for client, peer in pairs:
            client.close()
            peer.close()
    return {"engine_us_per_write": engine_us, "send_us_per_write": kernel_us}


def analyse(
    part: str, records: list[RequestRecord], trace: dict[str, dict[str, Any]], t0: int, n: int
) -> dict[str, Any]:
    """Send lag, TTFT over-report (client mean − simulator mean) and stamp error of one run."""
    failed = sum(1 for r in records if r.outcome is not Outcome.OK)
    client_ttft, sim_ttft, first_wave_client, first_wave_sim, stamp_err = [], [], [], [], []
    client_part: list[int] = []
    later_from_send: list[int] = []
    server_part: list[int] = []
    sim_queue: list[int] = []  # the simulator's own: read off the socket → handled
    for r in records:
        sent_id = getattr(r, "request_id_sent", None)  # None on a tree before request ids
        server = trace.get(sent_id or f"loadgen-{r.request_id}")
        if r.first_token_ns is None or server is None or server.get("first_token_ns") is None:
            continue
        client = r.first_token_ns - r.intended_ns
        own = server["first_token_ns"] - server["received_ns"]
        if r.sent_ns is not None:  # the over-report's two parts: the client's, the server's
            client_part.append(r.sent_ns - r.intended_ns)
            server_part.append(server["received_ns"] - (t0 + r.sent_ns))
        if server.get("handled_ns") is not None:  # None: a simulator before read stamps
            sim_queue.append(server["handled_ns"] - server["received_ns"])
        client_ttft.append(client)
        sim_ttft.append(own)
        if r.request_id < n:
            first_wave_client.append(client)
            first_wave_sim.append(own)
        elif r.sent_ns is not None:  # later documents, from their send (no turnaround)
            later_from_send.append(r.first_token_ns - r.sent_ns - own)
        if server.get("chunk_ns"):
            stamp_err.append(t0 + r.first_token_ns - server["chunk_ns"][0])
    scheduled = [r for r in records if r.sent_ns is not None and (r.turn or 0) < n]
    lag = _ms([r.sent_ns - r.intended_ns for r in scheduled if r.sent_ns is not None])
    later = [r for r in records if r.sent_ns is not None and (r.turn or 0) >= n]
    turnaround = _ms([r.sent_ns - r.intended_ns for r in later if r.sent_ns is not None])
    used = [getattr(r, "connection", None) for r in records]  # None: a tree before the column
    kinds = {k: used.count(k) for k in ("new", "warm", "reused")}
    figures: dict[str, Any] = {
        "requests": len(records),
        "failed": failed,
        **_pcts("send_lag", lag),
        "ttft_over_ms": _mean_ms(client_ttft) - _mean_ms(sim_ttft),
        "of_which_send_lag_ms": _mean_ms(client_part),  # sent − intended, mean
        "of_which_to_sim_read_ms": _mean_ms(server_part),  # sim's receive stamp − sent, mean
        "sim_ttft_mean_ms": _mean_ms(sim_ttft),
        "sim_queue_ms": _mean_ms(sim_queue),  # inside sim_ttft: read → handled, mean
        "stamp_err_p99_ms": float(np.percentile(_ms(stamp_err), 99)) if stamp_err else np.nan,
        **{f"conn_{k}": v for k, v in kinds.items()},
    }
    if part == "closed":
        figures["first_wave_ttft_over_ms"] = _mean_ms(first_wave_client) - _mean_ms(first_wave_sim)
        figures["later_from_send_over_ms"] = _mean_ms(later_from_send)
        figures.update(_pcts("turnaround", turnaround))
    return figures


def _ms(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / 1e6


def _mean_ms(values: Sequence[int]) -> float:
    return float(np.mean(_ms(values))) if values else float("nan")


def _pcts(name: str, values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {f"{name}_{k}_ms": float("nan") for k in ("p50", "p99", "max")}
    p50, p99 = np.percentile(values, [50, 99])
    return {f"{name}_p50_ms": p50, f"{name}_p99_ms": p99, f"{name}_max_ms": float(values.max())}


def show(figures: dict[str, Any]) -> str:
    """One line of a run's figures."""
    return " ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
    )


def summarize(label: str, runs: list[dict[str, Any]]) -> None:
    """Median (min–max) of every numeric figure over the repeats."""
    print(f"{label}: median (min–max) of {len(runs)} repeats")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"  {key:>26}: {median(values):10.3f}  ({min(values):.3f}–{max(values):.3f})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog="Example: python benchmarks/burst.py --streams 128,512,1024 --repeats 5",
    )
    parser.add_argument("--part", choices=["all", "burst", "closed", "pass"], default="all")
    parser.add_argument("--streams", default="128,512,1024", help="burst sizes, comma-separated")
    parser.add_argument("--modes", default="cold,warm", help="cold, warm or both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="the sim's decode step")
    parser.add_argument("--waves", type=int, default=3, help="closed: documents per stream")
    parser.add_argument("--profile", type=Path, metavar="FILE", help="cProfile the engine runs")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.streams.split(",")]
    except ValueError:
        parser.error(f"--streams: comma-separated counts (got {args.streams!r})")
    args.mode_list = [m.strip() for m in args.modes.split(",")]
    if not set(args.mode_list) <= {"cold", "warm"} or min(args.sizes) < 1 or args.repeats < 1:
        parser.error("--modes: cold and/or warm; --streams and --repeats ≥ 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Every part × size × mode, repeats back to back; 1 when any request failed."""
    args = parse_args(argv)
    raise_open_files_limit()
    anyio.run(anyio.sleep, 0, backend_options=backend_options())  # one-time imports, untimed
    profiler = cProfile.Profile() if args.profile else None
    if args.part == "pass":
        for streams in args.sizes:
            runs = [pass_cost(streams, args.tokens) for _ in range(args.repeats)]
            for repeat, figures in enumerate(runs):
                print(f"pass {streams} #{repeat + 1}: {show(figures)}", flush=True)
            summarize(f"pass, {streams} writes", runs)
        return 0
    parts = ["burst", "closed"] if args.part == "all" else [args.part]
    any_failed = False
    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for part in parts:
        for streams in args.sizes:
            for repeat in range(args.repeats):
                order = args.mode_list if repeat % 2 == 0 else args.mode_list[::-1]
                for mode in order:
                    figures = run_once(part, mode, args, streams, profiler)
                    any_failed |= figures["failed"] > 0
                    print(f"{part} {streams} {mode} #{repeat + 1}: {show(figures)}", flush=True)
                    results.setdefault((part, streams, mode), []).append(figures)
    print()
    for (part, streams, mode), runs in results.items():
        summarize(f"{part}, {streams} streams, {mode}", runs)
    bars(results)
    if profiler is not None:
        profiler.dump_stats(args.profile)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if any_failed:
        print("!!! SOME REQUESTS FAILED: see the runs above !!!", file=sys.stderr)
    return 1 if any_failed else 0


def bars(results: dict[tuple[str, int, str], list[dict[str, Any]]]) -> None:
    """The issue's two bars, judged on the worst repeat, where they were measured."""
    burst = results.get(("burst", 512, "warm"))
    if burst:
        worst = max(r["send_lag_p99_ms"] for r in burst)
        verdict = "meets" if worst <= BAR_BURST_LAG_P99_MS else "MISSES"
        print(f"bar: 512 warm simultaneous sends, send lag p99 ≤ 10 ms: {verdict} ({worst:.3f})")
    closed = results.get(("closed", 512, "warm"))
    if closed:
        worst = max(abs(r["ttft_over_ms"]) for r in closed)
        verdict = "meets" if worst <= BAR_CLOSED_TTFT_MS else "MISSES"
        print(f"bar: 512 closed-loop, TTFT mean within 15 ms of the sim's: {verdict} ({worst:.3f})")


if __name__ == "__main__":
    sys.exit(main())
