"""What does scraping the server's /metrics cost the client: CPU per chunk, and send lag?

Runs the same workload through `loadgen.run.execute` (the code `loadgen run` runs) against
one `loadgen sim` process (`running_sim`: its CPU is another process's), alternately without
scraping and with `--server-metrics-url /metrics` at `--interval` (default 1 s), `--repeats`
times each. Per run it reports chunks received and this process's user + system CPU time
during `execute` ÷ chunks (µs per chunk: the engine, the scraper thread and the run's own
bookkeeping, which is the same in both arms); then per arm the median (min–max) over repeats,
and the difference of the medians. It also times the scraper's own work in isolation: one GET
+ parse of the simulator's exposition (`Scraper.scrape_once`), median of 200.

The simulator's physics are set so the client is busy: a flat decode step of `--gap-ms`, a
batch that holds every stream, near-instant prefill; `--streams` sessions of `--tokens`
tokens each, all started within the first second.

With `--send-lag` it measures instead what a real server's exposition costs the sends: a
static vLLM-shaped body (`vllm_exposition`: ~51 KB, ~500 samples, the size of vLLM's) is
served by a separate `python -m http.server` process, and `--lag-requests` requests at
`--lag-rate` req/s go to the simulator (its default physics) without scraping and with
scraping that body every `--lag-interval` s, alternated, `--repeats` pairs; per arm the
generator's send lag p99 (sent − intended, summary.json), median (min–max). The scraper runs
where `loadgen run` runs it (its own process); `--placement thread` puts it on a thread of
the sending process instead, as before issue #26, to show what that cost.

Usage (from the repository root):

    python benchmarks/scrape_overhead.py
    python benchmarks/scrape_overhead.py --streams 128 --tokens 200 --gap-ms 20 --repeats 5
    python benchmarks/scrape_overhead.py --send-lag
    python benchmarks/scrape_overhead.py --send-lag --placement thread
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from statistics import median

import httpx
import polars as pl

import loadgen.run.host
from loadgen.analysis.server import current_gauges, with_server
from loadgen.engine.scrape import Scraper, ScrapeStats
from loadgen.results.runfolder import read_server_metrics
from loadgen.results.summary import ScrapeAccess
from loadgen.results.write import write_server_part
from loadgen.run.execute import RunOptions, execute
from loadgen.run.processes.simulator import running_sim
from loadgen.workload.spec import load

WORKLOAD = """\
name: scrape-overhead
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: {rate}}}
    requests: {streams}
    prompt_tokens: {{dist: fixed, value: 16}}
    output_tokens: {{dist: fixed, value: {tokens}}}
    deadlines: {{first_token_s: 30, stall_s: 30, total_s: 120}}
"""


LAG_WORKLOAD = """\
name: scrape-send-lag
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: {rate}}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 128}}
    output_tokens: {{dist: fixed, value: 64}}
    deadlines: {{first_token_s: 60, stall_s: 60, total_s: 120}}
"""


def cpu_s() -> float:
    """This process's user + system CPU seconds (every thread: the scraper's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(
    spec_path: Path, url: str, out: Path, run_id: str, scrape_s: float | None
) -> dict[str, float]:
    """One `execute`; CPU per chunk (µs) and what it received."""
    options = RunOptions(url=url, out_dir=out, run_id=run_id, quiet=True, lag_bound_ms=1000.0,
                         server_metrics_url="/metrics" if scrape_s else None,
                         server_metrics_interval_s=scrape_s)  # fmt: skip
    spec = load(spec_path)
    before = cpu_s()
    result = execute(spec, options, log=io.StringIO())
    cpu = cpu_s() - before
    records = pl.read_parquet(result.run_dir / "records.parquet")
    chunks = int(records["chunk_ns"].list.len().sum())
    failed = int((records["outcome"] != "ok").sum())
    scrapes = result.summary.server.scrapes if result.summary.server else 0
    audit_cpu = 0.0
    if scrape_s:  # the end-of-run work on the scraped rows, done again to time it alone
        before = cpu_s()
        with_server(result.summary, read_server_metrics(result.run_dir),
                    result.run_info.server_metrics, records)  # fmt: skip
        audit_cpu = cpu_s() - before
    return {"chunks": chunks, "cpu_us_per_chunk": cpu / chunks * 1e6, "failed": failed,
            "scrapes": scrapes, "audit_us_per_chunk": audit_cpu / chunks * 1e6}  # fmt: skip


def scrape_cost_us(url: str, n: int = 200) -> float:
    """Median wall µs of one scrape (GET + parse + rows) of the simulator's /metrics."""
    scraper = Scraper(url + "/metrics", 1.0)
    times = []
    with httpx.Client(timeout=5) as client:
        for _ in range(n):
            start = time.perf_counter_ns()
            scraper.scrape_once(client)
            times.append((time.perf_counter_ns() - start) / 1e3)
    return median(times)


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


# --- send lag against a vLLM-sized exposition ------------------------------------------------


def vllm_exposition(model: str = "sim", seed: int = 0) -> str:
    """A vLLM-shaped /metrics body: its metric families, label sets and histogram buckets
    (vLLM 0.x V1 engine, prometheus_client and the FastAPI instrumentator's http_*), ~51 KB
    and ~500 samples as a real one is; values are seeded noise."""
    rng = random.Random(seed)
    lines: list[str] = []
    base = f'engine="0",model_name="{model}"'

    def family(name, kind, help_text):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    def hist(name, help_text, buckets, labelsets=(base,), created=True):
        family(name, "histogram", help_text)
        for labels in labelsets:
            total = rng.randint(200, 5000)
            counts = sorted(rng.randint(0, total) for _ in buckets)
            sep = "," if labels else ""
            for le, count in zip(buckets, counts, strict=True):
                lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {float(count)}')
            lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(total)}')
            lines.append(f"{name}_count{{{labels}}} {float(total)}")
            lines.append(f"{name}_sum{{{labels}}} {rng.uniform(1, 1e4)!r}")
        if created:
            family(f"{name}_created", "gauge", help_text)
            for labels in labelsets:
                lines.append(f"{name}_created{{{labels}}} 1.7512345678901234e+09")

    def counter(name, help_text, labelsets):
        family(name, "counter", help_text)
        for labels in labelsets:
            lines.append(f"{name}_total{{{labels}}} {float(rng.randint(0, 10**6))}")
        family(f"{name}_created", "gauge", help_text)
        for labels in labelsets:
            lines.append(f"{name}_created{{{labels}}} 1.7512345678901234e+09")

    def gauge(name, help_text, value, labels=base):
        family(name, "gauge", help_text)
        lines.append(f"{name}{{{labels}}} {value!r}")

    for kind, help_text in (
        ("objects_collected", "Objects collected during gc"),
        ("objects_uncollectable", "Uncollectable objects found during GC"),
        ("collections", "Number of times this generation was collected"),
    ):
        family(f"python_gc_{kind}_total", "counter", help_text)
        for gen in range(3):
            lines.append(
                f'python_gc_{kind}_total{{generation="{gen}"}} {float(rng.randint(0, 10**5))}'
            )
    gauge(
        "python_info",
        "Python platform information",
        1.0,
        'implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"',
    )
    for name, value in (
        ("virtual_memory_bytes", 2.1e10),
        ("resident_memory_bytes", 1.3e9),
        ("start_time_seconds", 1.75e9),
        ("open_fds", 61.0),
        ("max_fds", 1048576.0),
    ):
        family(f"process_{name}", "gauge", name.replace("_", " "))
        lines.append(f"process_{name} {value!r}")
    family(
        "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."
    )
    lines.append("process_cpu_seconds_total 1234.56")
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", 12.0)
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 3.0)
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", 0.4375)
    gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", 0.4375)
    gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        1.7512345e9,
        'max_lora="0",running_lora_adapters="",waiting_lora_adapters=""',
    )
    gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        1.0,
        'block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",'
        'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
        'is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="7281",'
        'num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",'
        'sliding_window="None",swap_space="4",swap_space_bytes="4294967296"',
    )
    for name, help_text in (
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
        ("vllm:prompt_tokens", "Number of prefill tokens processed."),
        ("vllm:generation_tokens", "Number of generation tokens processed."),
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ):
        counter(name, help_text, [base])
    counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [
            f'engine="0",finished_reason="{r}",model_name="{model}"'
            for r in ("stop", "length", "abort")
        ],
    )
    seconds = (
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    )
    itl = (
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
    )
    latency = (
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    )
    tokens = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
    hist(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    )
    hist(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", seconds
    )
    hist(
        "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", itl
    )
    hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl)
    for name in (
        "e2e_request_latency",
        "request_queue_time",
        "request_inference_time",
        "request_prefill_time",
        "request_decode_time",
    ):
        hist(f"vllm:{name}_seconds", f"Histogram of {name.replace('_', ' ')} in seconds.", latency)
    for name in (
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_max_num_generation_tokens",
        "request_params_max_tokens",
    ):
        hist(f"vllm:{name}", f"Number of {name.replace('_', ' ')}.", tokens)
    hist(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill.",
        tokens,
    )
    family(
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping.",
    )
    for state in ("awake", "weights_offloaded", "discard_all"):
        lines.append(f'vllm:engine_sleep_state{{{base},sleep_state="{state}"}} 1.0')
    hist("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
    handlers = (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/metrics",
        "/health",
        "/v1/models",
    )
    http = [f'handler="{h}",method="{m}",status="2xx"' for h in handlers for m in ("GET", "POST")]
    counter("http_requests", "Total number of requests by method, status and handler.", http)
    for name in ("http_request_size_bytes", "http_response_size_bytes"):
        family(name, "summary", "Content length of incoming requests by handler.")
        for h in handlers:
            lines.append(f'{name}_count{{handler="{h}"}} {float(rng.randint(1, 10**4))}')
            lines.append(f'{name}_sum{{handler="{h}"}} {float(rng.randint(1, 10**7))}')
    hist(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels.",
        (
            0.01,
            0.025,
            0.05,
            0.075,
            0.1,
            0.25,
            0.5,
            0.75,
            1.0,
            1.5,
            2.0,
            2.5,
            3.0,
            3.5,
            4.0,
            4.5,
            5.0,
            7.5,
            10.0,
            30.0,
            60.0,
        ),
        labelsets=("",),
        created=False,
    )
    hist(
        "http_request_duration_seconds",
        "Latency with only few buckets by handler.",
        (0.1, 0.5, 1.0),
        [f'handler="{h}",method="{m}"' for h in handlers for m in ("GET", "POST")],
        created=False,
    )
    return "\n".join(lines) + "\n"


class ThreadScraper:
    """`run.processes.scraper.ScraperProcess`'s interface over the in-process `Scraper`
    thread: where `loadgen run` scraped before issue #26 (`--placement thread`)."""

    def __init__(self, url: str, interval_s: float, *, run_dir: Path, auth: object,
                 redactor: object = None) -> None:  # fmt: skip
        self._scraper = Scraper(url, interval_s, spill=partial(write_server_part, run_dir),
                                auth=auth, redactor=redactor)  # type: ignore[arg-type]  # fmt: skip
        self.first_done, self.timeout_s = self._scraper.first_done, self._scraper.timeout_s

    @property
    def failures(self) -> int:
        return self._scraper.failures

    def start(self) -> None:
        self._scraper.start()

    def stop(self) -> ScrapeStats:
        return self._scraper.stop()

    def access(self) -> ScrapeAccess:
        return self._scraper.access()

    def live_gauges(self) -> dict[str, float]:
        return current_gauges(self._scraper.latest)


@contextlib.contextmanager
def static_metrics(folder: Path) -> Iterator[str]:
    """`vllm_exposition()` served at `<url>/metrics` by another process; yields the URL."""
    (folder / "static").mkdir()
    (folder / "static" / "metrics").write_text(vllm_exposition())
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(folder / "static")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...) ..."
        port = int(line.split(" port ")[1].split()[0])
        url = f"http://127.0.0.1:{port}/metrics"
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=1).raise_for_status()
                break
            time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def send_lag(args: argparse.Namespace) -> None:
    """Send lag p99 without and with scraping a vLLM-sized /metrics, alternated pairs."""
    if args.placement == "thread":
        loadgen.run.host.ScraperProcess = ThreadScraper  # type: ignore[misc, assignment]
    with tempfile.TemporaryDirectory() as tmp, running_sim([]) as sim:
        folder = Path(tmp)
        spec_path = folder / "w.yaml"
        spec_path.write_text(LAG_WORKLOAD.format(rate=args.lag_rate, requests=args.lag_requests))
        with static_metrics(folder) as metrics_url:
            body = httpx.get(metrics_url).text
            samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            print(f"static /metrics: {len(body.encode()):,} bytes, {samples} samples; "
                  f"{args.lag_requests} requests at {args.lag_rate:g} req/s; scraper on a "
                  f"{args.placement} ({'its own' if args.placement == 'process' else 'the sending'}"
                  " process)")  # fmt: skip
            scraping = f"scraping every {args.lag_interval:g} s"
            arms: dict[str, list[float]] = {"without scraping": [], scraping: []}
            for repeat in range(args.repeats):
                for arm, interval in zip(arms, (None, args.lag_interval), strict=True):
                    run_id = f"l{repeat}-{interval}"
                    options = RunOptions(url=sim.url, out_dir=folder, run_id=run_id,
                                         quiet=True, lag_bound_ms=1000.0,
                                         server_metrics_url=metrics_url if interval else None,
                                         server_metrics_interval_s=interval)  # fmt: skip
                    result = execute(load(spec_path), options, log=io.StringIO())
                    p99 = result.summary.generator.send_lag_ms.p99 or 0.0
                    scrapes = result.summary.server.scrapes if result.summary.server else 0
                    arms[arm].append(p99)
                    print(f"pair {repeat} {arm:>24}: send lag p99 {p99:.2f} ms, {scrapes} scrapes")
        print()
        for arm, values in arms.items():
            print(f"{arm:>26}: send lag p99 {spread(values)} ms (median (min–max) of "
                  f"{args.repeats})")  # fmt: skip
        base, scraped = (median(v) for v in arms.values())
        print(f"{'difference':>26}: {scraped - base:+.2f} ms (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval (s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--send-lag",
        action="store_true",
        help="measure send lag against a vLLM-sized /metrics instead",
    )
    parser.add_argument("--lag-requests", type=int, default=160)
    parser.add_argument("--lag-rate", type=float, default=8.0, help="req/s")
    parser.add_argument("--lag-interval", type=float, default=0.25, help="scrape interval (s)")
    parser.add_argument("--placement", choices=("process", "thread"), default="process")
    args = parser.parse_args()
    if args.send_lag:
        send_lag(args)
        return
    sim = ["--decode-step-ms", f"{args.gap_ms:g}", "--max-batch", str(args.streams),
           "--prefill-tokens-per-s", "100000000"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, running_sim(sim) as server:
        folder = Path(tmp)
        spec_path = folder / "w.yaml"
        spec_path.write_text(WORKLOAD.format(rate=args.streams, streams=args.streams,
                                             tokens=args.tokens))  # fmt: skip
        arms: dict[str, list[float]] = {
            "without scraping": [],
            f"scraping every {args.interval:g} s": [],
        }
        audits: list[float] = []
        for repeat in range(args.repeats):
            for arm, interval in zip(arms, (None, args.interval), strict=True):
                row = one_run(spec_path, server.url, folder, f"r{repeat}-{interval}", interval)
                arms[arm].append(row["cpu_us_per_chunk"])
                if interval:
                    audits.append(row["audit_us_per_chunk"])
                print(f"repeat {repeat} {arm:>24}: {row['chunks']:,} chunks, "
                      f"{row['cpu_us_per_chunk']:.2f} µs CPU/chunk, {row['scrapes']} scrapes, "
                      f"{row['failed']} failed")  # fmt: skip
        print()
        for arm, values in arms.items():
            print(f"{arm:>26}: {spread(values)} µs CPU per chunk "
                  f"(median (min–max) of {args.repeats})")  # fmt: skip
        base, scraped = (median(v) for v in arms.values())
        print(f"{'difference':>26}: {scraped - base:+.2f} µs per chunk "
              f"({(scraped - base) / base:+.1%})")  # fmt: skip
        print(f"{'of which end-of-run audit':>26}: {spread(audits)} µs per chunk (the server "
              "block from the rows: once per run, not per chunk)")  # fmt: skip
        print(f"{'one scrape':>26}: {scrape_cost_us(server.url):.0f} µs wall "
              "(GET + parse, median of 200)")  # fmt: skip


if __name__ == "__main__":
    main()
