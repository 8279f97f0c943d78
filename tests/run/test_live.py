"""Live figures: the tally folded from records, the Prometheus endpoint, scraped during runs."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client.parser import text_string_to_metric_families

from loadgen.analysis.calibration import QUICK_LADDER, Thresholds
from loadgen.analysis.live import BUCKETS_S, LiveTally
from loadgen.analysis.slo import per_request
from loadgen.cli import cli
from loadgen.results.records import Outcome, to_frame
from loadgen.results.runfolder import read_records
from loadgen.run.execute import RunOptions, execute
from loadgen.run.live import LiveExporter, parse_listen
from loadgen.run.processes.group import Child
from loadgen.run.scale.workers import _Worker, merged_in_flight, merged_tally
from loadgen.studies.calibrate import measure_level
from loadgen.studies.capacity import run_one_against
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, failed_record, streamed_record, workload_file
from loadgen.workload.plans import Work
from loadgen.workload.spec import SloTargets, load

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """One scrape, parsed by prometheus_client's own text-format parser."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over the series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def bucket(tally: LiveTally, measure: str, cls: str, le: float) -> int:
    """The cumulative count at or below bound `le` (the exposition's `_bucket{le=...}`)."""
    hist = tally.histograms[(measure, cls)]
    return hist.cumulative()[BUCKETS_S[measure].index(le)]


def test_tally_buckets_known_answer() -> None:
    """Hand-made records land in the buckets their measured values fall in, a value on a
    bound counting at that bound (`le`), and failures only in the counts."""
    tally = LiveTally({"chat": {"ttft_ms": 200.0, "tpot_ms": 20.0}})
    # TTFT 150 ms (on a bound), gaps 10 and 30 ms: TPOT 20 ms (on a bound), E2E 190 ms.
    tally.observe(streamed_record(0, ttft_ms=150, gaps_ms=(10, 30), lag_ms=0.5))
    # TTFT 250 ms: misses the 200 ms threshold, so not good; one gap of 5 ms.
    tally.observe(streamed_record(1, ttft_ms=250, gaps_ms=(5,)))
    tally.observe(failed_record(2, outcome=Outcome.TIMEOUT_FIRST_TOKEN, lag_ms=3))
    assert tally.requests == {("chat", "ok"): 2, ("chat", "timeout_first_token"): 1}
    assert tally.good_requests == {"chat": 1}
    assert tally.good_output_tokens == {"chat": 3}
    assert tally.output_tokens == {("chat", "ok"): 5, ("chat", "timeout_first_token"): 0}
    assert bucket(tally, "ttft", "chat", 0.1) == 0
    assert bucket(tally, "ttft", "chat", 0.15) == 1
    assert bucket(tally, "ttft", "chat", 0.25) == 2
    assert bucket(tally, "tpot", "chat", 0.015) == 1  # request 1: one 5 ms step
    assert bucket(tally, "tpot", "chat", 0.02) == 2
    assert bucket(tally, "itl", "chat", 0.005) == 1
    assert bucket(tally, "itl", "chat", 0.01) == 2
    assert bucket(tally, "itl", "chat", 0.025) == 2
    assert bucket(tally, "itl", "chat", 0.03) == 3
    assert bucket(tally, "e2e", "chat", 0.25) == 1  # 190 ms; the other is 255 ms
    assert tally.histograms[("e2e", "chat")].sum_s == pytest.approx(0.190 + 0.255)
    assert bucket(tally, "send_lag", "chat", 0.0005) == 2  # 0, 0.5 ms; the failure's 3 ms
    assert bucket(tally, "send_lag", "chat", 0.002) == 2
    assert tally.histograms[("send_lag", "chat")].count == 3


def test_good_is_the_audits_meets_slo() -> None:
    """Over records on and around every threshold, the tally's good count and good tokens
    equal `slo.per_request`'s `meets_slo` (the audit's attainment and goodput)."""
    targets = SloTargets(ttft_ms=100.0, tpot_ms=20.0, itl_ms=30.0, e2e_ms=200.0)
    records = []
    for i, (ttft, gaps) in enumerate(
        [(100, (20, 20)), (100.001, (20, 20)), (50, (30, 10)), (50, (30.001, 5)), (50, ()),
         (60, (70, 70)), (99, (25, 25, 25, 25)), (10, (20.001, 20))]
    ):  # fmt: skip
        records.append(streamed_record(i, ttft_ms=ttft, gaps_ms=gaps))
    records.append(failed_record(len(records)))
    tally = LiveTally({"chat": targets.thresholds_ms()})
    for record in records:
        tally.observe(record)
    rows = per_request(to_frame(records), slos={"chat": targets})
    good = rows.filter(pl.col("meets_slo"))
    assert 0 < good.height < len(records)
    assert tally.good_requests.get("chat", 0) == good.height
    assert tally.good_output_tokens.get("chat", 0) == good.get_column("output_tokens").sum()


def test_tally_merges_and_travels() -> None:
    """Two tallies merged equal one tally of both record sets, also through `to_wire`."""
    records = [streamed_record(i, ttft_ms=40 + 30 * i, gaps_ms=(i + 1,) * 3) for i in range(6)]
    one, a, b = LiveTally(), LiveTally(), LiveTally()
    for i, record in enumerate(records):
        one.observe(record)
        (a if i % 2 else b).observe(record)
    merged = LiveTally.from_wire(a.to_wire())
    merged.merge(b)
    assert merged.to_wire()["requests"] == one.to_wire()["requests"]
    for key, hist in one.histograms.items():
        assert merged.histograms[key].counts == hist.counts
        assert merged.histograms[key].sum_s == pytest.approx(hist.sum_s)


def test_parse_listen() -> None:
    """`--prometheus-port` takes a port (on loopback) or ADDRESS:PORT, and refuses the rest."""
    assert parse_listen("9464") == ("127.0.0.1", 9464)
    assert parse_listen("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    with pytest.raises(Exception, match="is not a port"):
        parse_listen("http://x")


class Scraper(threading.Thread):
    """Scrapes `url` every `every_s` until stopped, keeping each scrape."""

    def __init__(self, url: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.scrapes: list[Samples] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.scrapes.append(scrape(self.url))
            self.halt.wait(self.every_s)


def check_final_counts(final: Samples, run_dir: Path) -> None:
    """The last scrape's counts are summary.json's (and the records')."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_records(run_dir)
    assert value(final, "loadgen_run_finished") == 1.0
    for cls, block in summary["classes"].items():
        for outcome, n in block["outcomes"].items():
            assert value(final, "loadgen_requests_total", **{"class": cls, "outcome": outcome}) == n
        assert total(final, "loadgen_requests_total", **{"class": cls}) == block["requests"]
        ok_tokens = value(final, "loadgen_output_tokens_total", **{"class": cls, "outcome": "ok"})
        assert ok_tokens == block["output_tokens"]["total"]
        good = value(final, "loadgen_good_requests_total", **{"class": cls})
        assert good == round(block["slo"]["attainment"] * block["requests"])
        good_tokens = value(final, "loadgen_good_output_tokens_total", **{"class": cls})
        rate = good_tokens / summary["duration_s"]
        assert rate == pytest.approx(block["goodput"]["output_tokens_per_s"], abs=6e-4)
        count = value(final, "loadgen_ttft_seconds_count", **{"class": cls})
        assert count == block["ttft_ms"]["count"]
        assert (
            value(final, "loadgen_itl_seconds_count", **{"class": cls}) == block["itl_ms"]["count"]
        )
        assert value(final, "loadgen_requests_in_flight", **{"class": cls}) == 0
    assert total(final, "loadgen_requests_total") == records.height


@pytest.mark.slow  # ~4 s on 2 cores: left to .ci/run's second part
def test_scraped_during_a_run(tmp_path: Path) -> None:
    """A run scraped every 0.2 s: counts rise while it runs (monotone, some scrapes in the
    middle), and the last scrape equals summary.json and the records."""
    text = chat_workload(rate_per_s=20, requests=60, output_tokens=4,
                         slo="{ttft_ms: 2000, tpot_ms: 1000, percentile: 90}")  # fmt: skip
    spec = load(workload_file(tmp_path, text))
    live = LiveExporter(port=0, grace_s=0)
    assert live.url is not None
    scraper = Scraper(live.url, 0.2)
    with ScriptedServer(lambda r: simple_chat(4, gap_s=0.01)) as server:
        scraper.start()
        options = RunOptions(url=server.url, out_dir=tmp_path, run_id="r", quiet=True,
                             lag_bound_ms=1000, seed=1)  # fmt: skip
        result = execute(spec, options, live=live)
        final = scrape(live.url)
        scraper.halt.set()
        scraper.join()
    live.close()
    counts = [total(s, "loadgen_requests_total") for s in scraper.scrapes]
    assert counts == sorted(counts), "a counter went down"
    assert any(0 < c < 60 for c in counts), f"no scrape saw the run in progress: {counts}"
    info = [k for k in final if k[0] == "loadgen_run_info"]
    assert info
    assert ("run_id", "r") in info[0][1]
    assert value(final, "loadgen_requests_planned", **{"class": "chat"}) == 60
    check_final_counts(final, result.run_dir)


SERVER_WORKLOAD = """\
name: live-server
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 1000}
    requests: 6
    prompt_tokens: {dist: fixed, value: 16}
    output_tokens: {dist: fixed, value: 40}
    deadlines: {first_token_s: 60, stall_s: 30, total_s: 120}
sim: {max_batch: 2, decode_table: 20, prefill_tokens_per_s: 1000000000}
"""


@pytest.mark.slow  # ~5 s on 2 cores: left to .ci/run's second part
def test_the_servers_own_gauges_are_republished(tmp_path: Path) -> None:
    """The simulator's /metrics scraped every 0.1 s is re-published live as
    loadgen_server_*. Known answer from its physics: 6 requests 1 ms apart into 2 slots
    (the first decodes alone for one 20 ms step while the other 5 arrive): never more than
    2 running nor 6 held in all; once all 6 are in, the count only falls (each stream
    leaves after its 40 steps, a waiting one takes its slot); 2 running and 4 waiting lasts
    0.8 s, so a scrape every 0.1 s sees it; after the run the figures are the last scrape
    in server_metrics.parquet."""
    from loadgen.analysis.server import figure_series  # the parquet side of the same scrape

    spec = load(workload_file(tmp_path, SERVER_WORKLOAD))
    live = LiveExporter(port=0, grace_s=0)
    assert live.url is not None
    scraper = Scraper(live.url, 0.1)
    scraper.start()
    options = RunOptions(out_dir=tmp_path, run_id="s", quiet=True, lag_bound_ms=1000, seed=1,
                         server_metrics_url="/metrics", server_metrics_interval_s=0.1)  # fmt: skip
    result = execute(spec, options, live=live)
    final = scrape(live.url)
    scraper.halt.set()
    scraper.join()
    live.close()
    assert result.exit_code == 0
    queue = [value(s, "loadgen_server_queue_depth") for s in scraper.scrapes]
    running = [value(s, "loadgen_server_running") for s in scraper.scrapes]
    states = list(zip(running, queue, strict=True))
    assert (2, 4) in states, states
    assert all(held <= 2 and held + waiting <= 6 for held, waiting in states), states
    held_in_all = [held + waiting for held, waiting in states]
    after_all_in = held_in_all[held_in_all.index(6) :]
    assert after_all_in == sorted(after_all_in, reverse=True), states  # only leaving
    frame = pl.read_parquet(result.run_dir / "server_metrics.parquet")
    for figure in ("queue_depth", "running", "kv_usage"):
        last = figure_series(frame, figure)["value"][-1]
        assert value(final, f"loadgen_server_{figure}") == pytest.approx(last), figure
    assert value(final, "loadgen_server_running") == 0


@pytest.mark.slow
def test_workers_publish_one_endpoint(tmp_path: Path) -> None:
    """With --workers 2 the parent serves one endpoint whose last scrape holds both
    processes' records, equal to summary.json."""
    text = chat_workload(rate_per_s=30, requests=60, output_tokens=3)
    spec = load(workload_file(tmp_path, text))
    live = LiveExporter(port=0, grace_s=0)
    assert live.url is not None
    scraper = Scraper(live.url, 0.25)
    with ScriptedServer(lambda r: simple_chat(3, gap_s=0.01)) as server:
        scraper.start()
        options = RunOptions(url=server.url, out_dir=tmp_path, run_id="w", quiet=True,
                             lag_bound_ms=1000, seed=1, workers=2)  # fmt: skip
        result = execute(spec, options, live=live)
        final = scrape(live.url)
        scraper.halt.set()
        scraper.join()
    live.close()
    counts = [total(s, "loadgen_requests_total") for s in scraper.scrapes]
    assert counts == sorted(counts)
    assert any(0 < c < 60 for c in counts), counts
    check_final_counts(final, result.run_dir)


def test_cli_port_in_use_is_a_clean_error(tmp_path: Path) -> None:
    """A port already taken: exit 1 and a line naming the flag, before any traffic."""
    path = workload_file(tmp_path, chat_workload())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", "http://127.0.0.1:9", "--out", str(tmp_path),
                  "--prometheus-port", str(port), "-q"],
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "--prometheus-port" in result.output
    assert "choose a free port" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("*/records.parquet"))


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_cli_run_serves_and_keeps_a_grace(tmp_path: Path) -> None:
    """`run --prometheus-port 0` says where it serves and stays up the grace it was given."""
    path = workload_file(tmp_path, chat_workload(requests=5))
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        start = time.monotonic()
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", server.url, "--out", str(tmp_path), "-q",
                  "--prometheus-port", "0", "--prometheus-grace", "1", "--lag-bound-ms", "1000"],
        )  # fmt: skip
        waited = time.monotonic() - start
    assert result.exit_code == 0, result.output
    assert "prometheus: serving the live figures at http://127.0.0.1:" in result.output
    assert "stays up 1 s for a last scrape" in result.output
    assert waited >= 1.0  # a lower bound only: the grace is a sleep


class OtlpReceiver(ThreadingHTTPServer):
    """A loopback OTLP/HTTP metrics receiver: decodes each POST with the OTLP protobuf and
    answers `status` (400: a collector refusing the data, which the SDK does not retry)."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[Any] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportMetricsServiceRequest()
                message.ParseFromString(body)
                receiver.requests.append(message)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def otlp_values(message: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    """Each metric point of one export request by (name, attributes): a number or a
    histogram point."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
    for resource in message.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    attrs = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                    if kind == "histogram":
                        out[(metric.name, attrs)] = point
                    else:
                        out[(metric.name, attrs)] = point.as_int or point.as_double
    return out


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_otlp_push_reaches_a_receiver(tmp_path: Path) -> None:
    """--otlp-endpoint pushes through the SDK's OTLP/HTTP exporter to a loopback receiver:
    the last push carries summary.json's counts and the histogram of every ITL gap."""
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/metrics"
    spec = load(workload_file(tmp_path, chat_workload(rate_per_s=20, requests=30)))
    live = LiveExporter(otlp_endpoint=endpoint, otlp_interval_s=0.3, grace_s=0)
    with ScriptedServer(lambda r: simple_chat(3, gap_s=0.005)) as server:
        options = RunOptions(url=server.url, out_dir=tmp_path, run_id="o", quiet=True,
                             lag_bound_ms=1000, seed=2)  # fmt: skip
        result = execute(spec, options, live=live)
    live.close()
    receiver.shutdown()
    receiver.server_close()
    assert len(receiver.requests) >= 3  # pushes during the run, at its end, at close
    last = otlp_values(receiver.requests[-1])
    summary = json.loads((result.run_dir / "summary.json").read_text())["classes"]["chat"]
    ok = (("class", "chat"), ("outcome", "ok"))
    assert last[("loadgen_requests", ok)] == summary["outcomes"]["ok"] == 30
    assert last[("loadgen_output_tokens", ok)] == summary["output_tokens"]["total"]
    itl = last[("loadgen_itl_seconds", (("class", "chat"),))]
    assert itl.count == summary["itl_ms"]["count"] == sum(itl.bucket_counts)
    assert list(itl.explicit_bounds) == list(BUCKETS_S["itl"])
    assert last[("loadgen_run_finished", ())] == 1
    info = [k for k in last if k[0] == "loadgen_run_info"]
    assert ("run_id", "o") in info[0][1]


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_capacity_steps_share_one_endpoint(tmp_path: Path) -> None:
    """A capacity search's steps (`run_one_against`, one `execute` each) publish on one
    endpoint: its counters go on rising from step to step and end at the steps' sum."""
    live = LiveExporter(port=0, grace_s=0)
    assert live.url is not None
    specs = [load(workload_file(tmp_path, chat_workload(requests=n, rate_per_s=40),
                                name=f"s{n}.yaml")) for n in (10, 25)]  # fmt: skip
    counts = []
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        run_one = run_one_against(server.url, seed=1, out=tmp_path, lag_bound_ms=1000,
                                  quiet=True, live=live)  # fmt: skip
        dirs = []
        for i, spec in enumerate(specs):
            _, _, _, run_dir = run_one(spec, None, f"step-{i:02d}")
            dirs.append(run_dir)
            counts.append(scrape(live.url))
    live.close()
    totals = [total(s, "loadgen_requests_total") for s in counts]
    assert totals == [10, 35]
    final = counts[-1]
    summaries = [json.loads((d / "summary.json").read_text())["classes"]["chat"] for d in dirs]
    assert value(final, "loadgen_requests_planned", **{"class": "chat"}) == 35
    tokens = value(final, "loadgen_output_tokens_total", **{"class": "chat", "outcome": "ok"})
    assert tokens == sum(s["output_tokens"]["total"] for s in summaries)
    ttft = value(final, "loadgen_ttft_seconds_count", **{"class": "chat"})
    assert ttft == sum(s["ttft_ms"]["count"] for s in summaries)
    info = [k for k in final if k[0] == "loadgen_run_info"]
    assert ("run_id", "step-01") in info[0][1]


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_a_calibration_level_is_published(tmp_path: Path) -> None:
    """`calibrate --prometheus-port`: a level of 8 streams of 50 tokens against the
    simulator ends with 8 ok requests, 8 × 50 tokens and 8 × 49 ITL gaps on the endpoint."""
    live = LiveExporter(port=0, grace_s=0)
    assert live.url is not None
    ladder = replace(QUICK_LADDER, streams=(8,))
    level = measure_level(8, ladder, Thresholds(), live=live)
    final = scrape(live.url)
    live.close()
    assert level.chunks == 8 * 50
    labels = {"class": "calibrate", "outcome": "ok"}
    assert value(final, "loadgen_requests_total", **labels) == 8
    assert value(final, "loadgen_output_tokens_total", **labels) == 8 * 50
    assert value(final, "loadgen_itl_seconds_count", **{"class": "calibrate"}) == 8 * 49
    assert value(final, "loadgen_run_finished") == 1


def test_refused_pushes_are_counted_and_said_once(tmp_path: Path) -> None:
    """A collector that refuses every push (HTTP 400): the run is not disturbed, and closing
    says how many pushes failed, once, instead of a warning per push."""
    receiver = OtlpReceiver(status=400)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/metrics"
    live = LiveExporter(otlp_endpoint=endpoint, otlp_interval_s=3600, grace_s=0)
    assert live.otlp is not None
    assert live.otlp.push() is False
    said: list[str] = []
    live.close(log=said.append)
    receiver.shutdown()
    receiver.server_close()
    assert len(receiver.requests) == 2  # the push above and the last one at close
    assert len(said) == 1
    assert said[0].startswith(f"otlp: 2 of 2 pushes to {endpoint} failed")


def test_the_parent_sums_its_workers_tallies() -> None:
    """`--workers`: the parent's endpoint is the sum of the tallies its workers last sent,
    and the in-flight gauge the sum of the running workers' counts."""
    tallies = [LiveTally(), LiveTally()]
    for i in range(7):
        tallies[i % 2].observe(streamed_record(i, ttft_ms=30 + 10 * i, gaps_ms=(5, 5)))
    workers = [
        _Worker(child=Child(index=i, process=None, conn=None), share=Work(),
                live=(t.to_wire(), {"chat": 2 + i}))
        for i, t in enumerate(tallies)
    ]  # fmt: skip
    merged = merged_tally(workers)
    assert merged.requests == {("chat", "ok"): 7}
    assert merged.histograms[("itl", "chat")].count == 14
    assert merged_in_flight(workers) == {"chat": 5}
    workers[1].child.closed = True  # a finished worker's last count is not in flight
    assert merged_in_flight(workers) == {"chat": 2}
