"""The typed summary: summary.json is its JSON, key for key and value for value, and back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.codec import from_json, to_json
from loadgen.errors import LoadgenError
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import read_summary
from loadgen.results.summary import AskedLoad, Summary, TrajectoryAudit
from loadgen.results.write import write_summary
from loadgen.testing import streamed_record
from loadgen.workload.spec import SloTargets

KNOWN = Path(__file__).parents[1] / "schema" / "summary-known-answer.json"
MS = 1_000_000


def hop(
    request_id: int, session: int, turn: int, start_ms: float, outcome: Outcome
) -> RequestRecord:
    """One agent hop: 50 ms to its first token, then 2 tokens 10 ms apart (unless it failed)."""
    record = streamed_record(request_id, intended_ms=start_ms, ttft_ms=50.0, class_name="agent")
    if outcome is Outcome.OK:
        return replace(record, session_id=session, turn=turn)
    return RequestRecord(request_id=request_id, class_name="agent", intended_ns=int(start_ms * MS),
                         outcome=outcome, sent_ns=int(start_ms * MS),
                         end_ns=int((start_ms + 5) * MS), session_id=session, turn=turn)  # fmt: skip


def known_records() -> list[RequestRecord]:
    """Chat sessions (one turn rejected), a summarization batch and two agent trajectories."""
    records = [
        replace(streamed_record(i, intended_ms=100.0 * i, ttft_ms=80.0 + 7 * i),
                session_id=i // 3, turn=i % 3)
        for i in range(9)
    ]  # fmt: skip
    records[4] = replace(records[4], outcome=Outcome.REJECTED, first_token_ns=None,
                         last_token_ns=None, chunk_ns=(), chunk_tokens=(), output_tokens=0)  # fmt: skip
    records += [
        replace(streamed_record(20 + i, intended_ms=50.0 * i, ttft_ms=300.0, gaps_ms=(5.0,) * 4,
                                class_name="docs"), prompt_tokens=900, prompt_tokens_target=1000)
        for i in range(4)
    ]  # fmt: skip
    records += [hop(40 + i, 0, i, 200.0 * i, Outcome.OK) for i in range(3)]
    records += [hop(50, 1, 0, 0.0, Outcome.OK), hop(51, 1, 1, 200.0, Outcome.HTTP_ERROR)]
    records += [hop(52, 1, 2, 400.0, Outcome.SKIPPED)]
    return records


def known_objectives() -> dict[str, Objective]:
    """A chat class with sessions, a batch with a deadline, an agent with a budget."""
    return {
        "chat": Objective(name="chat", slo=SloTargets(ttft_ms=120, tpot_ms=20, percentile=90),
                          has_sessions=True, asked=AskedLoad(unit="sessions", rate_per_s=3.0)),
        "docs": Objective(name="docs", kind="summarization", slo=SloTargets(ttft_ms=500),
                          batch_deadline_s=2, concurrency=2,
                          asked=AskedLoad(unit="closed_loop", concurrency=2)),
        "agent": Objective(name="agent", kind="agent", slo=SloTargets(ttft_ms=100, percentile=50),
                           trajectory_budget_s=1.5,
                           asked=AskedLoad(unit="trajectories", rate_per_s=0.5)),
        "idle": Objective(name="idle", kind="agent", slo=SloTargets(ttft_ms=100)),
    }  # fmt: skip


def known_summary(stopped: str | None = None, rule: str = "interval") -> Summary:
    return audit(to_frame(known_records()), run_id="known", objectives=known_objectives(),
                 planned=25, stopped=stopped, rule=rule)  # fmt: skip


def test_summary_json_is_the_known_answer_key_for_key() -> None:
    """Every key, its order, every value, null and float of summary.json, as loadgen wrote them
    before the summary was typed (regenerate the file only with a schema_version bump): by
    the point rule (`None`, `interrupted`: every value schema 14 wrote is unchanged, the
    confidence fields are added) and by the interval rule (`interval`: the same records
    judged by their bounds)."""
    known = json.loads(KNOWN.read_text())
    for stopped, rule, key in ((None, "point", "None"), ("interrupted", "point", "interrupted"),
                               (None, "interval", "interval")):  # fmt: skip
        text = json.dumps(to_json(known_summary(stopped, rule)), indent=2)
        assert text == json.dumps(known[key], indent=2)


def test_the_interval_rule_judges_the_known_records_by_their_bounds() -> None:
    """The known records by the interval rule: chat's TTFT p90 is missed (its lower bound,
    the 6th of 9 values, 122 ms, is over 120), its TPOT inconclusive (9 of the 29 requests a
    p90 needs): the class is missed, a miss outranking inconclusive; the agent's share, 1
    of 2 trajectories against 50 %, is inconclusive (its exact bounds 2.5 %–97.5 %); the
    batch, a fact of this run, is met; the run exits 2."""
    summary = known_summary()
    chat = summary.classes["chat"].slo
    assert [(c.metric, c.verdict, c.low_ms, c.needed) for c in chat.checks] == [
        ("ttft_ms", "missed", 122.0, 29), ("tpot_ms", "inconclusive", 10.0, 29)]  # fmt: skip
    assert (chat.verdict, chat.met) == ("missed", False)
    trajectory = summary.classes["agent"].trajectory
    assert trajectory is not None
    assert (trajectory.verdict, trajectory.attainment_low, trajectory.attainment_high) == (
        "inconclusive", 0.025321, 0.974679)  # fmt: skip
    assert summary.classes["docs"].slo.verdict == "met"
    assert (summary.verdict.status, summary.verdict.exit_code) == ("missed", 2)


@pytest.mark.parametrize("stopped", [None, "watchdog"])
def test_summary_round_trips_through_its_json(stopped: str | None, tmp_path: Path) -> None:
    """summary.json read back is the summary written: typed values, tuples and blocks alike."""
    summary = known_summary(stopped)
    assert from_json(Summary, json.loads(json.dumps(to_json(summary)))) == summary
    write_summary(tmp_path, summary)
    assert read_summary(tmp_path) == summary


def test_a_class_without_trajectories_keeps_its_four_keys() -> None:
    """An agent class with no records writes trajectories, ok, attainment and met alone."""
    block = known_summary().classes["idle"].trajectory
    assert block == TrajectoryAudit(trajectories=0, ok=0, attainment=None, met=False)
    assert to_json(block) == {"trajectories": 0, "ok": 0, "attainment": None, "met": False}


def test_optional_blocks_appear_only_for_their_kind() -> None:
    """sessions for chat with turns, batch and judged_by for summarization, trajectory for agents."""
    summary = to_json(known_summary())
    chat, docs, agent = (summary["classes"][n] for n in ("chat", "docs", "agent"))
    assert "sessions" in chat
    assert not {"batch", "trajectory"} & set(chat)
    assert "judged_by" not in chat["slo"]
    assert (docs["slo"]["judged_by"], agent["slo"]["judged_by"]) == ("batch", "trajectory")
    assert list(docs)[-3:] == ["batch", "stream_ends", "delivery"]  # optional, then newer ones


def test_a_damaged_summary_is_refused_with_the_key_that_is_wrong(tmp_path: Path) -> None:
    """A summary.json without a required key, or with a block of the wrong type, names it."""
    data = to_json(known_summary())
    del data["classes"]["chat"]["slo"]["checks"]
    with pytest.raises(ValueError, match=r"classes\.chat\.slo\.checks is missing"):
        from_json(Summary, data)
    (tmp_path / "summary.json").write_text(json.dumps({**to_json(known_summary()), "verdict": 3}))
    with pytest.raises(LoadgenError, match="verdict is not an object"):
        read_summary(tmp_path)
