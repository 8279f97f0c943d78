"""Workload classes end to end: chat sessions, agent trajectories, closed-loop batches, priority.

Against the built-in simulator at a speed factor. The simulator counts prompt tokens as
words and emits one word per output token, so the prompt it reports for a later turn proves
that the real earlier answers were sent back to it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from loadgen.analysis.objectives import Objective, batch_block, trajectory_block
from loadgen.engine.request_ids import DEFAULT_HEADER
from loadgen.errors import ConfigError
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import ScriptedServer, run_engine, simple_chat
from loadgen.workload.plans import plan_work
from loadgen.workload.spec import loads
from loadgen.workload.traces import TraceOptions, load_trace, trace_stats

NS = 1_000_000_000


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with running_sim(["--speed", "20", "--max-batch", "64"]) as sim:
        yield sim.url


def spec_of(body: str):
    return loads(
        f"name: flows\ntarget: {{api: openai-chat, model: m}}\nclasses:\n{body}", "flows.yaml"
    )


SESSIONS = """
  chat:
    arrival: {process: poisson, rate_per_s: 20}
    requests: 4
    turns: {dist: fixed, value: 3}
    think_time_s: {dist: fixed, value: 0.05}
    system_prompt_tokens: 20
    prompt_tokens: {dist: uniform, min: 5, max: 30}
    output_tokens: {dist: uniform, min: 5, max: 30}
"""


def test_session_turns_carry_the_conversation_with_the_real_answers(sim_url: str) -> None:
    """Turn k's prompt = turn k−1's prompt + its real answer + the new user message."""
    work = plan_work(spec_of(SESSIONS), seed=1)
    records = run_engine(work, sim_url)
    assert len(records) == 12
    assert all(r.outcome is Outcome.OK for r in records)
    plans = {p.request_id: p for p in work.plans}
    for session, turns in pl.DataFrame([_row(r) for r in records]).group_by("session_id"):
        turns = turns.sort("turn")
        rows = turns.to_dicts()
        assert [r["turn"] for r in rows] == [0, 1, 2]
        for row in rows:
            assert (
                row["prompt_tokens"] == row["prompt_tokens_target"]
            )  # the server counted what we sent
        for before, after in itertools.pairwise(rows):
            new_words = plans[after["request_id"]].prompt_tokens
            assert (
                after["prompt_tokens_target"]
                == before["prompt_tokens_target"] + before["output_tokens"] + new_words
            )
            assert after["intended_ns"] >= before["end_ns"] + int(0.05 * NS)
        assert rows[0]["prompt_tokens_target"] == 20 + plans[rows[0]["request_id"]].prompt_tokens
        del session


def _row(record: RequestRecord) -> dict:
    return {
        "request_id": record.request_id,
        "session_id": record.session_id,
        "turn": record.turn,
        "prompt_tokens": record.prompt_tokens,
        "prompt_tokens_target": record.prompt_tokens_target,
        "output_tokens": record.output_tokens,
        "intended_ns": record.intended_ns,
        "end_ns": record.end_ns,
        "outcome": record.outcome.value,
    }


AGENT = """
  agent:
    kind: agent
    arrival: {process: constant, rate_per_s: 20}
    requests: 2
    hops: {dist: fixed, value: 5}
    tool_time_s: {dist: fixed, value: 0.02}
    trajectory_budget_s: 60
    prompt_tokens: {dist: fixed, value: 40}
    output_tokens: {dist: fixed, value: 10}
    slo: {ttft_ms: 5000, percentile: 50}
"""


def test_a_failed_hop_skips_the_rest_and_breaches_the_trajectory(sim_url: str) -> None:
    """Hop 2 of the first trajectory answers 500: hops 3-4 are `skipped`, nothing is lost."""
    spec = spec_of(AGENT)
    work = plan_work(spec, seed=1)
    first = work.flows[0].session_id
    records = run_engine(
        work, sim_url,
        headers_for=lambda p: {"X-Sim-Status": "500"} if (p.session_id, p.turn) == (first, 2) else {},
    )  # fmt: skip
    assert len(records) == 10
    broken = sorted((r for r in records if r.session_id == first), key=lambda r: r.turn or 0)
    assert [r.outcome for r in broken] == [
        Outcome.OK,
        Outcome.OK,
        Outcome.HTTP_ERROR,
        Outcome.SKIPPED,
        Outcome.SKIPPED,
    ]
    healthy = sorted((r for r in records if r.session_id != first), key=lambda r: r.turn or 0)
    assert all(r.outcome is Outcome.OK for r in healthy)
    for before, after in itertools.pairwise(healthy):
        # each hop carries the trajectory so far: the last context, the previous hop's real
        # output and its tool result (100 words by default)
        assert after.prompt_tokens == after.prompt_tokens_target
        assert after.prompt_tokens == before.prompt_tokens + before.output_tokens + 100

    block = trajectory_block(to_frame(records), Objective.of(spec.classes["agent"]))
    assert (block.trajectories, block.ok, block.skipped_hops, block.failed_hops) == (2, 1, 2, 1)
    assert block.attainment == 0.5
    assert set(block.per_hop_ms) == {"0", "1", "2", "3", "4"}


def test_a_fixed_context_agent_sends_the_context_and_the_last_output(sim_url: str) -> None:
    """`context: {grow: false}`: every hop is the retained context plus the last answer."""
    spec = spec_of(
        AGENT.replace("    prompt_tokens:", "    context: {grow: false}\n    prompt_tokens:")
    )
    records = run_engine(plan_work(spec, seed=1), sim_url)
    assert len(records) == 10
    assert all(r.outcome is Outcome.OK for r in records)
    for session in {r.session_id for r in records}:
        hops = sorted((r for r in records if r.session_id == session), key=lambda r: r.turn or 0)
        for before, after in itertools.pairwise(hops):
            assert after.prompt_tokens == after.prompt_tokens_target == 40 + before.output_tokens


BATCH = """
  docs:
    kind: summarization
    arrival: {process: constant, rate_per_s: 1}
    requests: 12
    concurrency: 3
    batch_deadline_s: 120
    prompt_tokens: {dist: fixed, value: 200}
    output_tokens: {dist: fixed, value: 20}
"""


def test_closed_loop_batch_keeps_exactly_its_concurrency(sim_url: str) -> None:
    """Documents go three at a time: never more in flight, and all three slots are used."""
    spec = spec_of(BATCH)
    records = run_engine(plan_work(spec), sim_url)
    assert len(records) == 12
    assert all(r.outcome is Outcome.OK for r in records)
    events = sorted([(r.sent_ns, 1) for r in records] + [(r.end_ns, -1) for r in records])
    level, peak = 0, 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 3
    block = batch_block(to_frame(records), Objective.of(spec.classes["docs"]))
    assert block.met is True
    assert block.documents == block.ok == 12
    assert block.input_tokens_per_s > 0


def test_stopping_mid_flow_still_records_every_plan(sim_url: str) -> None:
    """An interrupt while sessions think between turns: planned == recorded, and the turns
    that were still to come are not_sent (never sent), not failures of the server."""
    slow = SESSIONS.replace("value: 0.05", "value: 5")
    work = plan_work(spec_of(slow), seed=2)
    records = run_engine(work, sim_url, stop_after_s=0.5)
    assert sorted(r.request_id for r in records) == [p.request_id for p in work.plans]
    assert any(r.outcome is Outcome.NOT_SENT for r in records)


def test_priority_goes_in_the_body_or_a_header() -> None:
    """A class priority is sent as the body's `priority`, or as the named header."""
    spec = spec_of("""
  chat:
    arrival: {process: constant, rate_per_s: 50}
    requests: 2
    priority: 7
    prompt_tokens: {dist: fixed, value: 3}
    output_tokens: {dist: fixed, value: 2}
""")
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        run_engine(plan_work(spec), server.url)
        run_engine(plan_work(spec), server.url, priority_header="X-Priority")
    bodies = [r.body for r in server.requests]
    assert [b.get("priority") for b in bodies] == [7, 7, None, None]
    assert [r.headers.get("x-priority") for r in server.requests] == [None, None, "7", "7"]


def test_batch_and_trajectory_blocks_known_answers() -> None:
    """Batch completion spans first intended to last end; a trajectory over budget fails."""
    spec = spec_of(AGENT.replace("trajectory_budget_s: 60", "trajectory_budget_s: 1"))

    def rec(
        rid: int, session: int, turn: int, start_s: float, end_s: float, outcome=Outcome.OK
    ) -> RequestRecord:
        start, end = int(start_s * NS), int(end_s * NS)
        return RequestRecord(
            request_id=rid, class_name="agent", intended_ns=start, sent_ns=start, outcome=outcome,
            first_token_ns=start + 1000, last_token_ns=end, end_ns=end, chunk_ns=(start + 1000, end),
            chunk_tokens=(1, 1), output_tokens=2, session_id=session, turn=turn,
        )  # fmt: skip

    records = [
        rec(0, 0, 0, 0.0, 0.4),
        rec(1, 0, 1, 0.5, 0.9),
        rec(2, 2, 0, 0.0, 0.8),
        rec(3, 2, 1, 0.9, 1.5),
    ]
    block = trajectory_block(to_frame(records), Objective.of(spec.classes["agent"]))
    assert (block.trajectories, block.ok) == (2, 1)  # the second took 1.5 s > 1 s budget
    assert block.time_split_s.tool == pytest.approx(0.2)  # 0.1 + 0.1 between hops
    batch_spec = spec_of(BATCH)
    docs = [
        RequestRecord(request_id=i, class_name="docs", intended_ns=i * NS, outcome=Outcome.OK,
                      end_ns=(i + 2) * NS, output_tokens=10, prompt_tokens=100)
        for i in range(3)
    ]  # fmt: skip
    batch = batch_block(to_frame(docs), Objective.of(batch_spec.classes["docs"]))
    assert batch.completion_time_s == 4.0  # 0 s → 4 s
    assert batch.input_tokens_per_s == 75.0
    assert batch.output_tokens_per_s == 7.5


ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "workloads" / "traces" / "azure-conv-2023-slice.csv"


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_trace_replay_reproduces_the_trace_count_and_gaps(sim_url: str) -> None:
    """30 s of the shipped Azure slice at 10× speed: same requests, rate and gap CV as the file.

    Intended times are the trace's times exactly; sent times differ by the generator's lag,
    so the rate may differ by at most 2 × max lag / span (plus rounding).
    """
    speed = 10
    spec = spec_of(f"""
  conv:
    arrival: {{process: trace, path: {SLICE}, format: azure, window_s: [0, 30], speed: {speed}}}
    deadlines: {{first_token_s: 30, total_s: 60}}
""")
    expected = load_trace(SLICE, TraceOptions(format="azure", end_s=30))
    stats = trace_stats(expected)
    work = plan_work(spec)
    assert [p.prompt_tokens for p in work.plans] == [r.prompt_tokens for r in expected]
    intended = np.array([p.intended_ns for p in work.plans], dtype=float) / NS * speed
    # trace_stats gives count / (last − first): the same definition here
    assert len(intended) / (intended[-1] - intended[0]) == pytest.approx(
        stats["rate_per_s"], rel=1e-6
    )
    records = run_engine(work, sim_url)
    assert len(records) == stats["count"]
    assert all(r.outcome not in (Outcome.CANCELLED, Outcome.NOT_SENT) for r in records)
    sent = (
        np.sort(np.array([r.sent_ns for r in records], dtype=float)) / NS * speed
    )  # trace seconds
    max_lag = max(r.sent_ns - r.intended_ns for r in records) / NS * speed
    span = sent[-1] - sent[0]
    rate = len(sent) / span
    assert rate == pytest.approx(stats["rate_per_s"], rel=2 * max_lag / span + 1e-3)
    gaps = np.diff(sent)
    assert gaps.std() / gaps.mean() == pytest.approx(stats["gap_cv"], rel=0.10)


def test_trace_prefix_blocks_become_shared_prompt_prefixes(tmp_path: Path) -> None:
    """Requests whose hash_ids start alike get the same first 512·k prompt words, others differ."""
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 3]},
        {"timestamp": 10, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 4]},
        {"timestamp": 20, "input_length": 600, "output_length": 2, "hash_ids": [1, 5]},
        {"timestamp": 30, "input_length": 600, "output_length": 2, "hash_ids": [9, 8]},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = spec_of(f"""
  t:
    arrival: {{process: trace, path: {trace}, format: mooncake}}
""")
    with ScriptedServer(lambda r: simple_chat(1)) as server:
        records = run_engine(plan_work(spec), server.url)
    # In plan order, by the id each request carried (a busy box may deliver them out of order).
    by_id = {r.headers[DEFAULT_HEADER.lower()]: r for r in server.requests}
    sent = [by_id[rec.request_id_sent] for rec in sorted(records, key=lambda r: r.request_id)]
    words = [r.body["messages"][0]["content"].split() for r in sent]
    assert [len(w) for w in words] == [1100, 1100, 600, 600]
    assert words[0][:1024] == words[1][:1024]  # two shared blocks
    assert words[0][1024:] != words[1][1024:]
    assert words[2][:512] == words[0][:512]  # one shared block
    assert words[2][512:1024] != words[0][512:1024]
    assert words[3][:512] != words[0][:512]  # nothing shared


def test_a_local_tokenizer_file_makes_prompt_lengths_exact(tmp_path: Path) -> None:
    """With target.tokenizer, every prompt encodes to exactly its planned token count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        "the people of the world know the time and place " * 40,
        "water light city road " * 40,
    ]
    tokenizer.train_from_iterator(
        corpus, trainer=trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    )
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    from loadgen.workload.prompts import PromptMaker

    maker = PromptMaker(0, str(path))
    for request_id, tokens in enumerate([1, 20, 77, 300, 1000]):
        text = maker.text(request_id, tokens)
        assert len(tokenizer.encode(text, add_special_tokens=False).ids) == tokens
    with pytest.raises(ConfigError, match="tokenizer file not found"):
        PromptMaker(0, str(tmp_path / "missing.json"))


def test_fell_behind_judges_the_schedule_not_the_reaction_time_of_chained_turns() -> None:
    """A later turn's lag is reported as chained_lag_ms, apart from the schedule's send lag
    (the figure a strict --lag-bound-ms reads)."""
    from loadgen.analysis.metrics import generator_health

    def rec(rid: int, turn: int, lag_ms: float) -> RequestRecord:
        return RequestRecord(request_id=rid, class_name="c", intended_ns=rid * NS, outcome=Outcome.OK,
                             dispatched_ns=rid * NS + int(lag_ms * 1e6), session_id=0, turn=turn)  # fmt: skip

    health = generator_health(
        to_frame([rec(0, 0, 1.0), rec(1, 1, 50.0), rec(2, 2, 40.0)]), planned=3
    )
    assert health.fell_behind is False
    assert health.lag_ms.max == 1.0
    assert health.chained_lag_ms.max == 50.0
    starts = [rec(0, 0, 9.0), rec(1, 0, 9.5), rec(2, 1, 0.1)]  # two late first turns
    late_start = generator_health(to_frame(starts), planned=3, lag_bound_ms=5.0)
    assert late_start.fell_behind is True  # a strict bound reads the schedule's sends
