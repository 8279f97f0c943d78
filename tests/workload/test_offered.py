"""The load a rate means: the open-loop classes' arrivals per second, one definition for
`--rate`, `loadgen check`, the workload identity and `capacity`'s loads, labels and axis."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.capacity import base_rate_per_s
from loadgen.cli import cli
from loadgen.cli.capacity import _load_value
from loadgen.render.capacity_axis import load_axis
from loadgen.workload.identity import identity
from loadgen.workload.spec import load, loads, offered_rate, override

MIXED = Path(__file__).parents[2] / "workloads" / "mixed.yaml"
CHAT = Path(__file__).parents[2] / "workloads" / "chat.yaml"

TWO_OPEN_ONE_BATCH = """
name: three
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 3}
    requests: 30
    prompt_tokens: {dist: fixed, value: 10}
    output_tokens: {dist: fixed, value: 10}
  bulk:
    arrival: {process: constant, rate_per_s: 1}
    requests: 10
    prompt_tokens: {dist: fixed, value: 10}
    output_tokens: {dist: fixed, value: 10}
  batch:
    kind: summarization
    arrival: {process: constant, rate_per_s: 5}
    requests: 8
    concurrency: 4
    prompt_tokens: {dist: fixed, value: 10}
    output_tokens: {dist: fixed, value: 10}
"""


def test_mixed_rate_12_offers_chat_12_and_leaves_the_batch_as_written() -> None:
    """mixed.yaml --rate 12: chat (its one open-loop class) at 12 req/s, not 8 (12 × 2/3, the
    old total that counted the closed-loop batch's unused rate_per_s: 1)."""
    spec = load(MIXED)
    assert offered_rate(spec).per_s == 2.0
    scaled = override(spec, rate="12")
    assert scaled.classes["chat"].arrival.rate_per_s == pytest.approx(12.0)
    batch = scaled.classes["summarize"]
    assert (batch.concurrency, batch.requests) == (8, 24)
    assert batch.arrival == spec.classes["summarize"].arrival
    assert offered_rate(scaled).per_s == pytest.approx(12.0)


def test_a_total_splits_over_open_loop_classes_in_proportion() -> None:
    """Two open-loop classes at 3 and 1 and a batch: --rate 12 gives 9 and 3; 2x gives 6 and 2."""
    spec = loads(TWO_OPEN_ONE_BATCH, "three.yaml")
    offered = offered_rate(spec)
    assert (offered.per_s, offered.unit) == (4.0, "req/s")
    assert (offered.open_loop, offered.closed_loop) == (("chat", "bulk"), ("batch",))
    total = override(spec, rate="12")
    assert total.classes["chat"].arrival.rate_per_s == pytest.approx(9.0)
    assert total.classes["bulk"].arrival.rate_per_s == pytest.approx(3.0)
    doubled = override(spec, rate="2x")
    assert doubled.classes["chat"].arrival.rate_per_s == pytest.approx(6.0)
    assert doubled.classes["batch"].arrival.rate_per_s == 5.0


def test_capacity_proposed_limit_12_on_mixed_is_6x_of_12_req_s() -> None:
    """capacity --proposed-limit 12 on mixed.yaml is load 6x, printed `6x (12 req/s)`, and the
    knee's req/s and the plot's axis use the same 2 req/s per 1x."""
    spec = load(MIXED)
    assert _load_value(spec, "rate", "12", "--proposed-limit") == pytest.approx(6.0)
    axis = load_axis(spec, "rate")
    assert axis.text(6.0) == "6x (12 req/s)"
    assert axis.scale == base_rate_per_s(spec) == 2.0
    assert axis.title == "offered load (req/s: chat; summarize closed-loop, outside it)"


def test_sessions_are_counted_in_their_own_unit() -> None:
    """chat.yaml's rate is new sessions per second: the total says sessions/s, not req/s."""
    spec = load(CHAT)
    assert offered_rate(spec).unit == "sessions/s"
    assert load_axis(spec, "rate").text(2.0) == "2x (2 sessions/s)"


def test_the_identity_records_the_same_offered_rate() -> None:
    """run.json's workload identity records the open-loop total, as --rate reads it."""
    assert identity(load(MIXED))["offered_rate_per_s"] == 2.0


def test_check_prints_the_offered_load_as_asked_and_planned() -> None:
    """`loadgen check mixed.yaml --rate 12` plans chat at 12/s and says what the rate counts."""
    result = CliRunner().invoke(cli, ["check", str(MIXED), "--rate", "12"])
    assert result.exit_code == 0, result.output
    assert "poisson @12/s" in result.output
    assert "offered load: 12 req/s (chat; summarize is a closed loop, outside it) asked" in (
        " ".join(result.output.split())
    )


def test_a_rate_total_on_closed_loops_only_is_refused() -> None:
    """--rate 8 on a workload of batches only names why and what to set instead (exit 1)."""
    only_batch = (
        TWO_OPEN_ONE_BATCH.split("  chat:")[0]
        + "  batch:"
        + (TWO_OPEN_ONE_BATCH.split("  batch:")[1])
    )
    spec = loads(only_batch, "batch.yaml")
    with pytest.raises(Exception, match="closed loop: it has no arrival rate"):
        override(spec, rate="8")
