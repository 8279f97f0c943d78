"""Cache warmth: a cold run's nonce, a warm run's identical bytes, a reset run's reset, and the
prefix-cache hit shares they come out at on the simulator (known answers from its blocks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.engine.cache_reset import reset_order
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, head, simple_chat
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.workload.plans import plan_work
from loadgen.workload.prompts import NONCE_WORDS, PromptMaker, nonce_words, prompt_text
from loadgen.workload.spec import load

BLOCK = 16  # the simulator's prefix_block_tokens (vLLM's default block size)
PREFIX, SUFFIX = 64, 20  # the shared-prefix class: 4 whole shared blocks, then its own words

# One class per way a workload shares within a run: shared-prefix groups and dataset rows
# (closed loops of one at a time, so each request's prefill ends before the next starts),
# a session with a system prompt and an agent trajectory (each turn after the last).
WORKLOAD = f"""\
name: warmth
target: {{api: openai-chat, model: sim, server_metrics_url: /metrics,
         server_metrics_interval_s: 0.2}}
classes:
  docs:
    kind: summarization
    arrival: {{process: constant, rate_per_s: 1}}
    requests: 10
    concurrency: 1
    prompt: {{shared_prefix_tokens: {PREFIX}, groups: 3, suffix_tokens: {{dist: fixed, value: {SUFFIX}}}}}
    output_tokens: {{dist: fixed, value: 4}}
  rows:
    kind: summarization
    arrival: {{process: constant, rate_per_s: 1}}
    requests: 6
    concurrency: 1
    dataset: {{path: rows.jsonl, format: jsonl}}
    output_tokens: {{dist: fixed, value: 4}}
  chat:
    arrival: {{process: constant, rate_per_s: 1}}
    requests: 1
    turns: {{dist: fixed, value: 4}}
    think_time_s: {{dist: fixed, value: 0.02}}
    system_prompt_tokens: 40
    prompt_tokens: {{dist: fixed, value: 30}}
    output_tokens: {{dist: fixed, value: 8}}
  agent:
    kind: agent
    arrival: {{process: constant, rate_per_s: 1}}
    requests: 1
    hops: {{dist: fixed, value: 3}}
    tool_time_s: {{dist: fixed, value: 0.02}}
    prompt_tokens: {{dist: fixed, value: 50}}
    output_tokens: {{dist: fixed, value: 8}}
    tool_result_tokens: {{dist: fixed, value: 20}}
"""
ROWS = [
    " ".join(f"alpha{i}" for i in range(37)),  # 37 words: not a whole number of blocks
    " ".join(f"beta{i}" for i in range(40)),
]


# --- the nonce in the prompt text -------------------------------------------------------------


def test_a_cold_first_message_starts_with_the_nonce_and_keeps_its_token_count() -> None:
    """The nonce's words take the place of the prompt's first words: same length, and the
    rest of the text, and every later message, as a warm run sends them."""
    warm, cold = PromptMaker(7), PromptMaker(7, nonce="ab12cd34")
    text = cold.text(3, 100, first=True).split(" ")
    assert len(text) == 100
    assert tuple(text[:NONCE_WORDS]) == nonce_words("ab12cd34") == cold.lead
    assert text[NONCE_WORDS:] == prompt_text(7, 3, 100 - NONCE_WORDS).split(" ")
    assert cold.text(3, 100) == warm.text(3, 100) == prompt_text(7, 3, 100)  # not first
    assert warm.text(3, 100, first=True) == prompt_text(7, 3, 100)  # no nonce: as before


def test_the_same_nonce_gives_the_same_bytes_and_another_nonce_other_first_words() -> None:
    """Reproducible from file, seed and nonce; 200 nonces give 200 different leads."""
    assert PromptMaker(1, nonce="x").text(5, 50, first=True) == PromptMaker(
        1, nonce="x").text(5, 50, first=True)  # fmt: skip
    leads = {nonce_words(f"run-{i}") for i in range(200)}
    assert len(leads) == 200


def test_a_shared_prefix_starts_with_the_nonce_and_stays_shared_within_the_run() -> None:
    """Two requests of one group share their whole `prefix_tokens` (nonce included); the
    prompt keeps its length; the group's prefix differs between two nonces."""
    first = PromptMaker(0, nonce="a")
    one, two = (first.shared(i, 2, PREFIX, PREFIX + SUFFIX).split(" ") for i in (10, 11))
    assert len(one) == len(two) == PREFIX + SUFFIX
    assert one[:PREFIX] == two[:PREFIX]
    assert one[PREFIX] != two[PREFIX]
    assert one[:NONCE_WORDS] == list(nonce_words("a"))
    other = PromptMaker(0, nonce="b").shared(10, 2, PREFIX, PREFIX + SUFFIX).split(" ")
    assert other[:NONCE_WORDS] != one[:NONCE_WORDS]
    assert other[NONCE_WORDS:PREFIX] == one[NONCE_WORDS:PREFIX]


def test_a_tiny_prompt_keeps_one_word_of_its_own() -> None:
    """A 1-token prompt has no nonce (its one token is always computed, never cached); a
    3-token one has 2 nonce words and 1 of its own."""
    cold = PromptMaker(0, nonce="n")
    assert cold.text(1, 1, first=True) == prompt_text(0, 1, 1)
    three = cold.text(1, 3, first=True).split(" ")
    assert three[:2] == list(cold.lead[:2])
    assert len(three) == 3


def test_dataset_text_gets_the_nonce_in_front_of_its_first_message_only() -> None:
    """A dataset's text cannot be cut: the nonce goes in front (4 more tokens)."""
    cold = PromptMaker(0, nonce="n")
    messages = (("system", "be brief"), ("user", "hello there"))
    led = cold.lead_messages(messages)
    assert led[0] == ("system", " ".join(cold.lead) + " be brief")
    assert led[1] == messages[1]
    assert cold.lead_tokens == NONCE_WORDS
    assert PromptMaker(0).lead_messages(messages) == messages


def test_with_a_tokenizer_a_cold_prompt_is_still_exactly_its_planned_tokens(
    tmp_path: Path,
) -> None:
    """With target.tokenizer the nonce is fitted in: every first message encodes to exactly
    its planned count, and one long enough for the nonce's words (this toy tokenizer spends
    several tokens on a word it never saw) starts with them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["the people of the world know the time and place " * 40, "water light city " * 40]
    tokenizer.train_from_iterator(
        corpus, trainer=trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    )
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    cold = PromptMaker(0, str(path), nonce="ab")
    for request_id, tokens in enumerate([2, 20, 77, 300]):
        text = cold.text(request_id, tokens, first=True)
        assert len(tokenizer.encode(text, add_special_tokens=False).ids) == tokens
        if tokens >= 20:
            assert text.split(" ")[:NONCE_WORDS] == list(cold.lead)
    shared = cold.shared(5, 1, PREFIX, PREFIX + SUFFIX)
    assert len(tokenizer.encode(shared, add_special_tokens=False).ids) == PREFIX + SUFFIX
    assert shared.split(" ")[:NONCE_WORDS] == list(cold.lead)


# --- on the simulator: hit shares with known answers -----------------------------------------


@pytest.fixture
def sim_url() -> Iterator[str]:
    """A simulator with a prefix cache that holds everything, kept across the test's runs."""
    with running_sim(["--speed", "10", "--prefix-cache-tokens", "1000000"]) as sim:
        yield sim.url


def workload(tmp_path: Path) -> Path:
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": text}) + "\n" for text in ROWS), encoding="utf-8"
    )
    return workload_file(tmp_path, WORKLOAD)


def run(path: Path, url: str, run_id: str, *args: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """One run (no preflight: the server's counters then hold only the records' requests)."""
    result = CliRunner().invoke(cli, ["run", str(path), "--url", url, "--out",
                                      str(path.parent / "out"), "--run-id", run_id, "-q",
                                      "--no-preflight", "--lag-bound-ms", "1000",
                                      "--verdict", "point",  # one trajectory judges no share
                                      *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    run_dir = path.parent / "out" / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["cache"]["mode"] in result.output  # the line beside the verdict
    frame = pl.read_parquet(run_dir / "records.parquet").sort("request_id")
    assert (frame["outcome"] == "ok").all()
    return frame, summary


def within_run(frame: pl.DataFrame, path: Path) -> dict[int, int]:
    """Cached tokens per request id when only the run's own sharing can hit: a group's or a
    row's first request misses, a later one hits its shared whole blocks; a turn or hop hits
    the whole blocks of the previous one's prompt and answer (the last token is computed)."""
    plans = {p.request_id: p for p in plan_work(load(path)).plans}
    expected, seen = {}, set()
    for row in frame.iter_rows(named=True):
        rid, prompt, plan = row["request_id"], row["prompt_tokens"], plans[row["request_id"]]
        shared = {"docs": PREFIX, "rows": prompt}.get(row["class"])
        if shared is not None:
            key = plan.shared_prefix or plan.messages
            expected[rid] = min(shared // BLOCK * BLOCK, prompt - 1) if key in seen else 0
            seen.add(key)
    for name in ("chat", "agent"):
        turns = frame.filter(pl.col("class") == name).sort("turn").iter_rows(named=True)
        previous = None
        for row in turns:
            reused = (
                0 if previous is None else previous["prompt_tokens"] + previous["output_tokens"]
            )
            expected[row["request_id"]] = min(reused // BLOCK * BLOCK, row["prompt_tokens"] - 1)
            previous = row
    return expected


def cached(frame: pl.DataFrame) -> dict[int, int]:
    return dict(zip(frame["request_id"], frame["cached_prompt_tokens"], strict=True))


def share(expected: dict[int, int], frame: pl.DataFrame) -> float:
    return sum(expected.values()) / frame["prompt_tokens"].sum()


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_two_cold_runs_each_hit_only_what_the_workload_shares(tmp_path: Path, sim_url: str) -> None:
    """Two default (cold) runs on one server: each request's cached tokens are exactly what
    the run's own sharing gives (groups, rows, history, trajectory), the second run no more
    than the first; the server's hit share is that sum over the prompt tokens. Replaying the
    first run's nonce sends its bytes again: then every prompt is found whole."""
    path = workload(tmp_path)
    first, first_summary = run(path, sim_url, "a")
    second, second_summary = run(path, sim_url, "b")
    for frame, summary in ((first, first_summary), (second, second_summary)):
        expected = within_run(frame, path)
        assert cached(frame) == expected
        assert summary["cache"]["server_hit_share"] == pytest.approx(share(expected, frame),
                                                                      abs=1e-5)  # fmt: skip
    assert 0.4 < first_summary["cache"]["server_hit_share"] < 0.7  # sharing, not a warm cache
    nonces = first_summary["cache"]["nonce"], second_summary["cache"]["nonce"]
    assert nonces[0] != nonces[1]
    info = json.loads((tmp_path / "out" / "a" / "run.json").read_text())
    assert info["cache"] == {k: first_summary["cache"][k] for k in ("mode", "nonce", "nonce_words")}
    # Prompt tokens as planned: the nonce took the place of generated words; a dataset row
    # carries it in front (4 more tokens), and the plan's target says so.
    rows = first.filter(pl.col("class") == "rows")
    assert (rows["prompt_tokens"] == rows["prompt_tokens_target"]).all()
    assert set(rows["prompt_tokens"]) == {37 + NONCE_WORDS, 40 + NONCE_WORDS}
    docs = first.filter(pl.col("class") == "docs")
    assert set(docs["prompt_tokens"]) == set(docs["prompt_tokens_target"]) == {PREFIX + SUFFIX}
    again, _ = run(path, sim_url, "a-again", "--nonce", nonces[0])
    docs = again.filter(pl.col("class") == "docs")
    whole = (PREFIX + SUFFIX) // BLOCK * BLOCK  # every whole block of its prompt, cached
    assert set(docs["cached_prompt_tokens"]) == {whole}


@pytest.mark.slow  # ~4 s on 2 cores: left to .ci/run's second part
def test_a_warm_rerun_finds_its_prompts_cached_and_a_reset_one_does_not(
    tmp_path: Path, sim_url: str
) -> None:
    """`--cache warm` twice: the second run finds every prompt of the first (each request's
    whole blocks); `--cache reset` after it sends the same bytes but the simulator emptied its
    cache first: exactly the within-run share again. `compare` says they differ in warmth."""
    path = workload(tmp_path)
    first, _ = run(path, sim_url, "c", "--cache", "warm")
    second, warm = run(path, sim_url, "d", "--cache", "warm")
    reset, reset_summary = run(path, sim_url, "e", "--cache", "reset")
    assert cached(first) == within_run(first, path)
    found = second.filter(pl.col("class").is_in(["docs", "rows"]) | (pl.col("turn") == 0))
    whole = [min(p // BLOCK * BLOCK, p - 1) for p in found["prompt_tokens"]]
    assert found["cached_prompt_tokens"].to_list() == whole
    assert warm["cache"]["server_hit_share"] > 0.9
    assert cached(reset) == within_run(reset, path) == cached(first)
    assert reset_summary["cache"]["reset"] == "POST /reset_prefix_cache: HTTP 200"
    out = tmp_path / "out"
    same_mode = CliRunner().invoke(cli, ["compare", str(out / "c"), str(out / "d")])
    assert (
        "the two differ in cache warmth: their prefix-cache hit shares differ" in same_mode.output
    )
    other_mode = CliRunner().invoke(cli, ["compare", str(out / "d"), str(out / "e")])
    assert other_mode.exit_code == 1  # another workload: refused, naming the setting
    assert 'cache: "warm" vs "reset"' in other_mode.output
    forced = CliRunner().invoke(cli, ["compare", str(out / "d"), str(out / "e"), "--force"])
    assert "cache: BASELINE warm" in forced.output
    assert "CURRENT reset" in forced.output
    assert "they ran in different cache modes" in forced.output


# --- reset: which endpoint, and when there is none ---------------------------------------------


def answering(statuses: dict[str, int]) -> Any:
    """A scripted server: `statuses` for these paths, a chat stream for the rest."""

    def handler(request: ReceivedRequest) -> list[Step]:
        status = statuses.get(request.path)
        if status is None:
            return simple_chat(3)
        return [head(status, chunked=False, length=2), b"{}"]

    return handler


def run_scripted(tmp_path: Path, handler: Any, *args: str) -> tuple[Any, ScriptedServer]:
    path = workload_file(tmp_path, chat_workload("reset", requests=5))  # 5 judge a median
    with ScriptedServer(handler) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(tmp_path / "out"), "--run-id", "r", "-q",
                                          "--lag-bound-ms", "1000", *args])  # fmt: skip
    return result, server


def test_reset_tries_vllm_then_sglang_before_any_load(tmp_path: Path) -> None:
    """vLLM's endpoint 404s, SGLang's answers: the run goes on and records which one reset,
    both asked before the first request of the load."""
    handler = answering({"/reset_prefix_cache": 404, "/flush_cache": 200})
    result, server = run_scripted(tmp_path, handler, "--cache", "reset", "--no-preflight")
    assert result.exit_code == 0, result.output
    paths = [r.path for r in server.requests]
    assert paths[:2] == ["/reset_prefix_cache", "/flush_cache"]
    assert paths[2:] == ["/v1/chat/completions"] * 5
    info = json.loads((tmp_path / "out" / "r" / "run.json").read_text())
    assert info["cache"] == {"mode": "reset", "reset": "POST /flush_cache: HTTP 200"}
    assert reset_order("sglang") == ["/flush_cache", "/reset_prefix_cache"]
    assert reset_order("unknown") == ["/reset_prefix_cache", "/flush_cache"]


def test_a_server_without_a_reset_endpoint_is_an_error_before_any_load(tmp_path: Path) -> None:
    """404 from both endpoints: exit 1 saying what was tried and how to fix it (vLLM's dev
    mode, or --cache cold), no traceback, no request of the load sent."""
    handler = answering({"/reset_prefix_cache": 404, "/flush_cache": 404})
    result, server = run_scripted(tmp_path, handler, "--cache", "reset", "--no-preflight")
    assert result.exit_code == 1
    assert (
        "offers no prefix-cache reset (POST /reset_prefix_cache: HTTP 404; POST "
        "/flush_cache: HTTP 404)" in result.output
    )
    assert "VLLM_SERVER_DEV_MODE=1" in result.output
    assert "--cache cold" in result.output
    assert "Traceback" not in result.output
    assert all(r.path != "/v1/chat/completions" for r in server.requests)


def test_a_refused_reset_is_an_error_with_the_servers_answer(tmp_path: Path) -> None:
    """An answer other than 2xx, 404 or 405 (SGLang's 400 while requests run) is final."""
    handler = answering({"/reset_prefix_cache": 400})
    result, _ = run_scripted(tmp_path, handler, "--cache", "reset", "--no-preflight")
    assert result.exit_code == 1
    assert "refused to reset its prefix cache (POST /reset_prefix_cache: HTTP 400" in result.output


def test_a_nonce_outside_cold_mode_or_of_odd_characters_is_refused(tmp_path: Path) -> None:
    """--nonce names a cold run's bytes: with --cache warm, or holding a slash, exit 1."""
    result, _ = run_scripted(tmp_path, answering({}), "--cache", "warm", "--nonce", "abc")
    assert result.exit_code == 1
    assert "--nonce: applies to cache: cold, not warm" in result.output
    result, _ = run_scripted(tmp_path, answering({}), "--nonce", "a/b")
    assert result.exit_code == 1
    assert "is not a nonce" in result.output


def test_check_says_the_cache_mode_a_run_would_use(tmp_path: Path) -> None:
    """`check` prints the mode (the file's, or --cache's) and whether the nonce is drawn."""
    path = workload_file(tmp_path, chat_workload("c", requests=3) + "cache: warm\n")
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert "cache: warm: the same bytes as every run" in result.output
    result = CliRunner().invoke(cli, ["check", str(path), "--cache", "cold", "--nonce", "n1"])
    assert "cache: cold: prompts start with a run nonce (n1, given)" in result.output


# --- capacity: every step its own run to the cache --------------------------------------------

CAPACITY = """\
name: steps
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 20}
    requests: 40
    prompt_tokens: {dist: fixed, value: 20}
    output_tokens: {dist: fixed, value: 4}
    slo: {ttft_ms: 5000, percentile: 50}
sim: {speed: 10, prefix_cache_tokens: 100000}
"""


def capacity_steps(tmp_path: Path, *args: str) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """Two capacity steps (1x, 2x) on one built-in simulator: each step's summary cache and
    records. No step fails, so the search finds no knee in range (exit 2)."""
    tmp_path.mkdir()
    path = workload_file(tmp_path, CAPACITY)
    out = tmp_path / "capacity"
    result = CliRunner().invoke(cli, ["capacity", str(path), "--steps", "1x,2x", "--min-tail",
                                      "1", "--min-lifetimes", "1", "--out", str(out), "-q",
                                      "--lag-bound-ms", "1000", *args])  # fmt: skip
    assert result.exit_code == 2, result.output
    steps = []
    for step in sorted((out / "steps").iterdir()):
        cache = json.loads((step / "summary.json").read_text())["cache"]
        assert f"cache: {cache['mode']}" in result.output  # under each step's line
        steps.append((cache, pl.read_parquet(step / "records.parquet")))
    return steps


@pytest.mark.slow  # ~4 s on 2 cores: left to .ci/run's second part
def test_each_cold_capacity_step_starts_cold_of_the_steps_before(tmp_path: Path) -> None:
    """Every prompt is its own (no sharing within a step): cold steps hit nothing, each with
    its own nonce (`X.step-NN` from --nonce X); warm, step 2's requests that step 1 sent too
    (the same ids: the same bytes) find their whole 16-token block of 20, the others nothing."""
    cold = capacity_steps(tmp_path / "cold", "--nonce", "x")
    assert [c["nonce"] for c, _ in cold] == ["x.step-01", "x.step-02"]
    assert [c["usage_hit_share"] for c, _ in cold] == [0.0, 0.0]
    (first, sent), (second, again) = capacity_steps(tmp_path / "warm", "--cache", "warm")
    assert first["usage_hit_share"] == 0.0
    repeated = pl.col("request_id") < sent.height
    assert set(again.filter(repeated)["cached_prompt_tokens"]) == {BLOCK}
    assert set(again.filter(~repeated)["cached_prompt_tokens"]) <= {0}
    assert second["usage_hit_share"] > 0
