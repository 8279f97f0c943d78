"""Delivery through real parts of the path: nginx with buffering off and on, a proxy that
forwards 4 KiB blocks or whole responses, and nginx's gzip, against the simulator in real
time (21.6 ms a token), as `loadgen run` and an SDK-like client read them.

Known answers: direct, nginx unbuffered and nginx buffered (which forwards what it reads to
a client that keeps up) are never coalesced, and nginx's TTFT/TPOT agree with direct's
request by request (the runs share one simulator and one seed: each request has a twin
sent at the same instant, in the same decode steps); blocks and whole responses are always
coalesced and their TPOT/ITL INCONCLUSIVE unless declared; nginx's gzip holds a stream to
its end for clients that accept it, and `--accept-encoding` sees that as they do.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from loadgen.testing import netpath
from loadgen.testing.bufferproxy import buffering_proxy

pytestmark = [pytest.mark.slow, pytest.mark.realserver]

WORKLOAD = Path(__file__).parents[2] / "workloads" / "chat-smoke.yaml"  # 40 × 32 tokens, 4/s
DECODE_STEP_MS = 21.6  # the simulator's decode step at its seed parameters, at --speed 1


@pytest.fixture(scope="module")
def sim1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulator in real time (a token every 21.6 ms) for the module: its URL."""
    with netpath.simulator(tmp_path_factory.mktemp("sim1"), "--speed", "1") as sim:
        yield sim.url


@dataclass(frozen=True, slots=True)
class Ran:
    """One `loadgen run`: its exit code, what it printed, summary.json and records."""

    exit_code: int
    output: str
    summary: dict[str, Any]
    records: pl.DataFrame

    @property
    def chat(self) -> dict[str, Any]:
        return dict(self.summary["classes"]["chat"])

    def check(self, metric: str) -> dict[str, Any]:
        return next(c for c in self.chat["slo"]["checks"] if c["metric"] == metric)


def loadgen_run(url: str, folder: Path, *flags: str) -> Ran:
    """`loadgen run workloads/chat-smoke.yaml --url URL` in a process of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(WORKLOAD), "--url", url, "--out",
         str(folder), "--run-id", "r", *flags],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert (folder / "r" / "summary.json").exists(), output
    summary = json.loads((folder / "r" / "summary.json").read_text())
    return Ran(done.returncode, output, summary, pl.read_parquet(folder / "r" / "records.parquet"))


START_AFTER_S = 20.0  # the runs' agreed start: time for each process to start on a busy box


def side_by_side(runs: dict[str, tuple[str, tuple[str, ...]]], folder: Path) -> dict[str, Ran]:
    """The runs at once, from one agreed start (`--start-at`) and one seed: each request has
    a twin in every run, sent at the same instant, meeting one simulator and one box."""
    start = f"{time.time() + START_AFTER_S:.3f}"
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(loadgen_run, url, folder / name, "--start-at", start, *flags)
                   for name, (url, flags) in runs.items()}  # fmt: skip
        return {name: future.result() for name, future in futures.items()}


def paired_ms(a: Ran, b: Ran, column: str) -> list[float]:
    """Per request id, b's measure minus a's (ok in both), in ms: twins sent together."""

    def measure(ran: Ran) -> pl.DataFrame:
        frame = ran.records.filter(pl.col("outcome") == "ok")
        tokens = pl.col("output_tokens")
        value = {
            "ttft": pl.col("first_token_ns") - pl.col("intended_ns"),
            "tpot": (pl.col("last_token_ns") - pl.col("first_token_ns")) / (tokens - 1),
        }[column]
        return frame.select("request_id", (value / 1e6).alias(column))

    joined = measure(a).join(measure(b), on="request_id", suffix="_b")
    return (joined[f"{column}_b"] - joined[column]).to_list()


@contextlib.contextmanager
def nginx_in_front(upstream: str, folder: Path, **route: Any) -> Iterator[str]:
    with netpath.nginx(netpath.ReverseProxy(upstream=upstream, **route), folder) as proxy:
        yield proxy.url


@pytest.mark.usefixtures("need_nginx")
def test_direct_and_nginx_buffering_off_and_on_are_paced_and_agree(
    sim1: str, tmp_path: Path
) -> None:
    """Direct, nginx proxy_buffering off and on, side by side: no stream coalesced in any
    (their events per read within a stall's reach of 1), and through nginx each request's
    TTFT and TPOT are its direct twin's: the median paired difference within one decode step
    (21.6 ms, the simulator's time quantum: twins can land a step apart) for TTFT, within a
    tenth of a step for TPOT (an average over 31 gaps; the hop's constant delay cancels)."""
    with (
        nginx_in_front(sim1, tmp_path / "off", buffering=False) as off,
        nginx_in_front(sim1, tmp_path / "on", buffering=True) as on,
    ):
        runs = side_by_side({"direct": (sim1, ()), "nginx-off": (off, ()),
                             "nginx-on": (on, ())}, tmp_path)  # fmt: skip
    for name, ran in runs.items():
        delivery = ran.chat["delivery"]
        assert delivery["coalesced"] == 0, (name, delivery, ran.output)
        assert delivery["events_per_read"] < 2.0, (name, delivery)
        assert "arrived coalesced" not in json.dumps(ran.chat["slo"]), name
    for name in ("nginx-off", "nginx-on"):
        ttft = statistics.median(paired_ms(runs["direct"], runs[name], "ttft"))
        tpot = statistics.median(paired_ms(runs["direct"], runs[name], "tpot"))
        assert abs(ttft) < DECODE_STEP_MS, (name, ttft)
        assert abs(tpot) < DECODE_STEP_MS / 10, (name, tpot)


def test_block_and_whole_response_proxies_are_always_coalesced(sim1: str, tmp_path: Path) -> None:
    """Behind 4 KiB blocks and whole responses every stream is coalesced; TTFT is late (the
    first block, or the whole stream), TPOT is INCONCLUSIVE saying why (exit 7, unless TTFT
    missed or the generator fell behind); with --path-buffers the same path is judged as
    observed: TPOT MET, the check saying the path was declared to buffer."""
    with (
        buffering_proxy(tmp_path / "p4k", sim1, block=4096) as blocks,
        buffering_proxy(tmp_path / "pw", sim1) as whole,
    ):
        runs = side_by_side({"blocks": (blocks.url, ()), "whole": (whole.url, ()),
                             "declared": (whole.url, ("--path-buffers",))}, tmp_path)  # fmt: skip
    for name in ("blocks", "whole"):
        ran = runs[name]
        delivery = ran.chat["delivery"]
        assert delivery["coalesced"] == delivery["streams"] == 40, (name, delivery)
        check = ran.check("tpot_ms")
        assert check["verdict"] == "inconclusive", (name, check)
        assert "40 of 40 streams arrived coalesced" in check["note"]
        # 7, unless another check (TTFT: the whole stream's wait) missed (2) or the generator
        # fell behind (3), each of which outranks it
        missed = any(c["verdict"] == "missed" for c in ran.chat["slo"]["checks"])
        fell_behind = ran.summary["generator"]["fell_behind"]
        assert ran.exit_code == (3 if fell_behind else 2 if missed else 7), (name, ran.output)
        assert "COALESCED: 40 of 40 streams" in " ".join(ran.output.split())
    assert runs["whole"].chat["tpot_ms"]["p50"] == 0.0  # what was read: no pace at all
    assert runs["whole"].chat["ttft_ms"]["p50"] > 30 * DECODE_STEP_MS  # the whole stream
    assert runs["blocks"].chat["delivery"]["events_per_read"] >= 10
    declared = runs["declared"]
    assert declared.check("tpot_ms")["verdict"] == "met"
    assert "as target.path_buffers says" in declared.check("tpot_ms")["note"]


def sdk_like_first_tokens(url: str, requests: int, gap_s: float) -> list[tuple[float, float]]:
    """(first content token, end) in ms for `requests` streams read as the OpenAI SDK reads
    them: httpx with `Accept-Encoding: gzip, deflate`, inflated as it arrives, one every
    `gap_s`, each on its own connection's turn."""
    body = {"model": "sim", "stream": True, "max_tokens": 32, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hello " * 200}]}  # fmt: skip
    times = []
    with httpx.Client(timeout=30, headers={"Accept-Encoding": "gzip, deflate"}) as client:
        for _ in range(requests):
            start = time.perf_counter()
            first = None
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                assert response.headers.get("content-encoding") == "gzip"
                for line in response.iter_lines():
                    if first is None and '"content":"' in line.replace(" ", ""):
                        first = time.perf_counter()
            end = time.perf_counter()
            assert first is not None
            times.append(((first - start) * 1e3, (end - start) * 1e3))
            time.sleep(gap_s)
    return times


@pytest.mark.usefixtures("need_nginx")
def test_nginx_gzip_holds_streams_for_clients_that_accept_it(sim1: str, tmp_path: Path) -> None:
    """nginx with gzip on for text/event-stream: an SDK-like client gets its first token with
    the rest (TTFT ≥ 90 % of the stream's end), and so does loadgen with --accept-encoding
    (every stream coalesced, TPOT INCONCLUSIVE); loadgen without it reads the plain stream
    (TTFT under a third of the end), and its preflight says what gzip clients see."""
    with nginx_in_front(sim1, tmp_path / "gz", buffering=True, gzip=True) as url:
        sdk = sdk_like_first_tokens(url, 10, 0.25)
        plain = loadgen_run(url, tmp_path / "plain")
        gzip = loadgen_run(url, tmp_path / "gzip", "--accept-encoding")
    sdk_ttft = statistics.median(t for t, _ in sdk)
    assert all(t >= 0.9 * end for t, end in sdk), sdk
    assert "compresses event streams (Content-Encoding: gzip)" in " ".join(plain.output.split())
    assert plain.chat["delivery"]["coalesced"] == 0
    plain_ttft, plain_e2e = plain.chat["ttft_ms"]["p50"], plain.chat["e2e_ms"]["p50"]
    assert plain_ttft < plain_e2e / 3, (plain_ttft, plain_e2e)
    delivery = gzip.chat["delivery"]
    assert delivery["coalesced"] == delivery["streams"] == 40, delivery
    gzip_ttft, gzip_e2e = gzip.chat["ttft_ms"]["p50"], gzip.chat["e2e_ms"]["p50"]
    assert gzip_ttft >= 0.9 * gzip_e2e, (gzip_ttft, gzip_e2e)
    assert gzip.check("tpot_ms")["verdict"] == "inconclusive"
    print(f"nginx gzip: SDK-like TTFT p50 {sdk_ttft:.0f} ms; loadgen --accept-encoding "
          f"{gzip_ttft:.0f} ms; loadgen plain {plain_ttft:.0f} ms")  # fmt: skip
