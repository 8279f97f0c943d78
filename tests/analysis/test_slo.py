"""Known-answer tests for breach accounting, attainment, goodput and the run's verdict."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.analysis import slo
from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.codec import to_json
from loadgen.results.records import OUTCOMES, Outcome, RequestRecord, to_frame
from loadgen.results.summary import Goodput, Summary
from loadgen.testing import failed_record as failed
from loadgen.testing import streamed_record as streamed
from loadgen.workload.spec import SloTargets

MS = 1_000_000


def chat_objectives(slos: dict[str, SloTargets]) -> dict[str, Objective]:
    """Each class judged by its percentile targets alone (the chat kind, no sessions)."""
    return {name: Objective(name=name, slo=targets) for name, targets in slos.items()}


def summary(records: list[RequestRecord], *, rule: str = "interval", **slos: SloTargets) -> Summary:
    """The summary of `records` with `slos` (planned = the records given), judged by `rule`."""
    return audit(
        to_frame(records), run_id="test", objectives=chat_objectives(slos), planned=len(records),
        rule=rule,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("record", "targets", "meets"),
    [
        (streamed(1, ttft_ms=100.0), SloTargets(ttft_ms=100.0), True),
        (streamed(1, ttft_ms=101.0), SloTargets(ttft_ms=100.0), False),
        (streamed(1, gaps_ms=(30.0, 30.0)), SloTargets(tpot_ms=30.0), True),
        (streamed(1, gaps_ms=(30.0, 31.0)), SloTargets(tpot_ms=30.0), False),
        (streamed(1, gaps_ms=()), SloTargets(tpot_ms=1.0), True),  # N = 1: no TPOT to judge
        (streamed(1, gaps_ms=(1.0, 50.0)), SloTargets(tpot_ms=30.0, itl_ms=40.0), False),
        (streamed(1, gaps_ms=(40.0, 1.0)), SloTargets(itl_ms=40.0), True),
        (streamed(1, ttft_ms=100.0, gaps_ms=(50.0,)), SloTargets(e2e_ms=150.0), True),
        (streamed(1, ttft_ms=100.0, gaps_ms=(51.0,)), SloTargets(e2e_ms=150.0), False),
        (failed(1), SloTargets(), False),  # a failure misses even with no targets
        (streamed(1), SloTargets(), True),
    ],
)
def test_meets_slo_per_request(record: RequestRecord, targets: SloTargets, meets: bool) -> None:
    """A request meets its class's SLO when ok and within every threshold that applies."""
    rows = slo.per_request(to_frame([record]), slos={"chat": targets})
    assert rows.item(0, "meets_slo") is meets


def test_per_request_columns() -> None:
    """per_request has the documented columns first, in order."""
    rows = slo.per_request(to_frame([streamed(1)]))
    assert rows.columns[:10] == [
        "request_id",
        "class",
        "outcome",
        "ttft_ms",
        "ttft_from_send_ms",
        "tpot_ms",
        "e2e_ms",
        "max_itl_ms",
        "lag_ms",
        "meets_slo",
    ]


def test_attainment_counts_failures_in_the_denominator() -> None:
    """Three ok requests within target and one rejected give 75 % attainment."""
    result = summary(
        [streamed(1), streamed(2), streamed(3), failed(4)], chat=SloTargets(ttft_ms=200)
    )
    assert result.classes["chat"].slo.attainment == 0.75


@pytest.mark.parametrize(
    ("n_ok", "n_failed", "percentile", "met", "value_ms"),
    [
        (9, 1, 90.0, True, 100.0),  # the failure is the 10th of 10: p90 is rank 9
        (9, 1, 99.0, False, None),  # p99 is rank 10: a failure
        (10, 0, 99.0, True, 100.0),
    ],
)
def test_ttft_check_ranks_failures_worst(
    n_ok: int, n_failed: int, percentile: float, met: bool, value_ms: float | None
) -> None:
    """The TTFT target is judged over every request with failures ranked +inf (here by the
    point rule: ten requests are too few for a p90 bound, see test_verdict.py)."""
    records = [streamed(i) for i in range(n_ok)] + [failed(100 + i) for i in range(n_failed)]
    result = summary(records, rule="point", chat=SloTargets(ttft_ms=150.0, percentile=percentile))
    judged = result.classes["chat"].slo
    assert judged.met is met
    assert judged.checks[0].value_ms == value_ms
    assert judged.checks[0].population == n_ok + n_failed


def test_tpot_check_excludes_single_token_responses() -> None:
    """TPOT stats and checks skip N <= 1 responses, whatever their timing."""
    records = [streamed(1, gaps_ms=(10.0,)), streamed(2, gaps_ms=())]
    result = summary(records, rule="point", chat=SloTargets(tpot_ms=20.0))
    chat = result.classes["chat"]
    assert chat.tpot_ms.count == 1
    assert chat.slo.checks[0].population == 1
    assert chat.slo.met is True


def test_a_check_with_no_values_to_judge_never_passes() -> None:
    """Every response one token long: the TPOT check has no values, so it is missed (a
    promise nothing measured is not kept), the class is missed, and the run exits 2; the
    TTFT check beside it, three values for a p99, is inconclusive, which a miss outranks."""
    records = [streamed(i, gaps_ms=()) for i in range(3)]
    result = summary(records, chat=SloTargets(ttft_ms=1000.0, tpot_ms=20.0))
    ttft, tpot = result.classes["chat"].slo.checks
    assert (ttft.metric, ttft.verdict, ttft.needed) == ("ttft_ms", "inconclusive", 299)
    assert tpot.verdict == "missed"
    assert (tpot.metric, tpot.population, tpot.value_ms, tpot.passed) == ("tpot_ms", 0, None, False)
    assert tpot.note is not None
    assert "no values to judge" in tpot.note
    assert result.classes["chat"].slo.met is False
    assert (result.verdict.status, result.verdict.exit_code) == ("missed", 2)


@pytest.mark.parametrize(
    ("n_failed", "met", "value_ms"), [(0, True, 10.0), (1, True, 10.0), (2, False, None)]
)
def test_itl_check_allows_failures_only_within_the_percentile(
    n_failed: int, met: bool, value_ms: float | None
) -> None:
    """ITL judges gaps of ok requests, and fails when failures exceed the request allowance
    (the point rule; the interval rule's ITL answers are in test_verdict.py)."""
    records = [streamed(i, gaps_ms=(10.0,) * 5) for i in range(20 - n_failed)]
    records += [failed(100 + i) for i in range(n_failed)]  # p95 of 20 allows one failure
    result = summary(records, rule="point", chat=SloTargets(itl_ms=20.0, percentile=95.0))
    check = result.classes["chat"].slo.checks[0]
    assert (check.passed, check.value_ms) == (met, value_ms)


def test_a_class_without_requests_cannot_be_met() -> None:
    """A class with targets and no records is listed, with null stats, and not met."""
    result = summary([streamed(1)], chat=SloTargets(ttft_ms=200.0), agent=SloTargets(ttft_ms=1.0))
    agent = result.classes["agent"]
    assert agent.requests == 0
    assert agent.ttft_ms.p99 is None
    assert agent.ttft_ms.count == 0
    assert agent.slo.met is False
    assert agent.slo.checks[0].metric == "requests"
    assert result.verdict.exit_code == 2


def test_a_class_without_targets_is_met_and_audited() -> None:
    """A class found only in the frame is audited with no targets and counts as met."""
    result = summary([streamed(1), failed(2, class_name="batch")], chat=SloTargets(ttft_ms=200.0))
    assert list(result.classes) == ["chat", "batch"]
    batch = result.classes["batch"].slo
    assert (batch.met, batch.checks, batch.attainment) == (True, (), 0.0)


def test_goodput_divides_by_the_whole_run() -> None:
    """Goodput counts requests within every threshold over the run's duration, for every class."""
    records = [
        streamed(1, intended_ms=0.0, ttft_ms=100.0, gaps_ms=(10.0, 10.0)),  # 3 tokens, meets
        streamed(2, intended_ms=100.0, ttft_ms=900.0, gaps_ms=(10.0,)),  # misses TTFT
        streamed(3, intended_ms=1000.0, ttft_ms=100.0, gaps_ms=(8.0,), class_name="agent"),
    ]  # duration: 0 -> agent's end at 1000 + 100 + 8 + 1 = 1109 ms
    result = summary(records, chat=SloTargets(ttft_ms=200.0))
    assert result.duration_s == 1.109
    chat, agent = result.classes["chat"].goodput, result.classes["agent"].goodput
    assert chat == Goodput(
        requests_per_s=round(1 / 1.109, 3), output_tokens_per_s=round(3 / 1.109, 3)
    )
    assert agent.requests_per_s == round(1 / 1.109, 3)


@pytest.mark.parametrize(
    ("judged", "fell_behind", "code"),
    [
        ("met", False, 0),
        ("missed", False, 2),
        ("inconclusive", False, 7),
        ("met", True, 3),
        ("missed", True, 3),
        ("inconclusive", True, 3),
    ],
)
def test_exit_code(judged: str, fell_behind: bool, code: int) -> None:
    """Falling behind outranks a missed SLO, which outranks an inconclusive one, which
    outranks success."""
    assert slo.exit_code(judged, fell_behind=fell_behind) == code


@pytest.mark.parametrize(
    ("ttft_ms", "lag_ms", "bound_ms", "code"),
    [(100.0, 0.0, 5.0, 7), (300.0, 0.0, 5.0, 2), (100.0, 9.0, 5.0, 3), (100.0, 9.0, 10.0, 7)],
)
def test_verdict_of_a_run(ttft_ms: float, lag_ms: float, bound_ms: float, code: int) -> None:
    """The summary's verdict follows the SLO audit and the generator's lag bound: five
    requests cannot show a p99 under its target (7), but five over it show it missed (2:
    the lower bound of a p99 from five values is their maximum), and a generator that
    fell behind is 3 whatever the checks say."""
    records = [streamed(i, intended_ms=10.0 * i, ttft_ms=ttft_ms, lag_ms=lag_ms) for i in range(5)]
    result = audit(
        to_frame(records),
        run_id="r",
        objectives=chat_objectives({"chat": SloTargets(ttft_ms=200.0)}),
        planned=5,
        lag_bound_ms=bound_ms,
    )
    assert result.verdict.exit_code == code
    assert result.generator.lag_bound_ms == bound_ms


def test_every_outcome_key_is_present() -> None:
    """Outcome counts list every outcome, zeros included."""
    result = summary([streamed(1), failed(2, outcome=Outcome.TIMEOUT_STALL)])
    outcomes = result.classes["chat"].outcomes
    assert list(outcomes) == list(OUTCOMES)
    assert outcomes["ok"] == 1
    assert outcomes["timeout_stall"] == 1
    assert sum(outcomes.values()) == 2


def test_summary_shape_and_json() -> None:
    """The summary has the documented keys and is strict JSON, failures and empties included."""
    records = [streamed(1), failed(2), streamed(3, class_name="other")]
    result = to_json(
        summary(records, chat=SloTargets(ttft_ms=50.0, tpot_ms=5.0), agent=SloTargets())
    )
    json.dumps(result, allow_nan=False)
    assert set(result) == {"schema_version", "loadgen_version", "run_id", "interrupted",
                           "duration_s", "generator", "classes", "verdict"}  # fmt: skip
    chat = result["classes"]["chat"]
    for key in (
        "requests",
        "outcomes",
        "ttft_ms",
        "ttft_ms_with_failures",
        "ttft_from_send_ms",
        "tpot_ms",
        "tpot_ms_with_failures",
        "itl_ms",
        "e2e_ms",
        "e2e_ms_with_failures",
        "output_tokens",
        "tokens_per_chunk",
        "slo",
        "goodput",
    ):
        assert key in chat
    check = chat["slo"]["checks"][0]
    assert set(check) >= {"metric", "percentile", "target_ms", "value_ms", "passed"}
    assert set(result["generator"]) >= {
        "planned",
        "sent",
        "recorded",
        "retries",
        "lag_ms",
        "target_rate_per_s",
        "achieved_rate_per_s",
        "fell_behind",
        "lag_bound_ms",
    }


def test_empty_frame_summarizes() -> None:
    """A run with no records gives a JSON summary whose targeted classes are not met."""
    result = summary([], chat=SloTargets(ttft_ms=1.0))
    json.dumps(to_json(result), allow_nan=False)
    assert result.duration_s == 0.0
    assert result.classes["chat"].goodput.requests_per_s is None
    assert result.verdict.exit_code == 2


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5_000), min_size=0, max_size=30),
    st.integers(0, 3),
    st.sampled_from([o for o in Outcome if o is not Outcome.OK]),
)
def test_adding_a_failed_request_never_improves_a_percentile(
    ttfts_ms: list[int], n_failed: int, outcome: Outcome
) -> None:
    """Every with-failures percentile is as bad or worse after one more failed request."""
    records = [streamed(i, ttft_ms=float(t)) for i, t in enumerate(ttfts_ms)]
    records += [failed(1000 + i) for i in range(n_failed)]
    before = to_json(summary(records))["classes"].get("chat")
    after = to_json(summary([*records, failed(2000, outcome=outcome)]))["classes"]["chat"]
    for name in ("ttft_ms_with_failures", "tpot_ms_with_failures", "e2e_ms_with_failures"):
        for key in ("p50", "p90", "p95", "p99", "max"):
            old = before[name][key] if before and before[name][key] is not None else None
            new = after[name][key]
            worse_or_equal = new is None or (old is not None and new >= old)
            assert worse_or_equal, (name, key, old, new)


@pytest.mark.parametrize(
    "kwargs", [{"percentile": 0.0}, {"percentile": 100.5}, {"ttft_ms": 0.0}, {"itl_ms": -1.0}]
)
def test_slo_targets_reject_nonsense(kwargs: dict[str, float]) -> None:
    """Targets must be positive and the percentile in (0, 100]."""
    with pytest.raises(ValueError, match="SLO"):
        SloTargets(**kwargs)
