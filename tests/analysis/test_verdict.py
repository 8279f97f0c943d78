"""The wired verdict, by known answers: records → `audit` (slo.py) → summary → exit code,
judged by the interval rule (and by the point rule where the two must differ), then the
same through the CLI (`run`, `report`, `check`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.audit import audit
from loadgen.analysis.confidence import share_bounds
from loadgen.analysis.objectives import Objective
from loadgen.cli import cli
from loadgen.results.records import RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, failed_record, streamed_record, workload_file
from loadgen.workload.spec import SloTargets


def judged(
    records: list[RequestRecord], *, rule: str = "interval", lag_bound_ms: float = 5.0,
    stopped: str | None = None, **slos: SloTargets,
) -> Summary:  # fmt: skip
    """The summary of `records`, each class judged by its percentile targets and `rule`."""
    objectives = {name: Objective(name=name, slo=targets) for name, targets in slos.items()}
    return audit(to_frame(records), run_id="v", objectives=objectives, planned=len(records),
                 lag_bound_ms=lag_bound_ms, stopped=stopped, rule=rule)  # fmt: skip


def binomial_at_most(k: int, n: int, q: float) -> float:
    """P(K <= k) for K ~ Binomial(n, q), summed term by term (independent of the code)."""
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))


def ranks_by_hand(n: int, q: float, level: float) -> tuple[int, int]:
    """(l, u): the largest l with P(K <= l − 1) <= 1 − level, the smallest u with
    P(K <= u − 1) >= level: x_(l) <= ξ_q and x_(u) >= ξ_q each with probability >= level."""
    ranks = range(1, n + 1)
    low = max((i for i in ranks if binomial_at_most(i - 1, n, q) <= 1 - level), default=0)
    high = min((i for i in ranks if binomial_at_most(i - 1, n, q) >= level), default=n + 1)
    return low, high  # 0 and n + 1: open (beyond the sample)


def ttfts(values_ms: list[float], class_name: str = "chat") -> list[RequestRecord]:
    return [streamed_record(i, intended_ms=10.0 * i, ttft_ms=v, class_name=class_name)
            for i, v in enumerate(values_ms)]  # fmt: skip


def test_the_bounds_are_the_order_statistics_a_binomial_gives() -> None:
    """300 requests of TTFT 1..300 ms at p99: the check's bounds are the l-th and u-th
    values by a term-by-term binomial sum; a target at the upper bound is MET (exit 0),
    between the bounds INCONCLUSIVE (7), under the lower bound MISSED (2)."""
    low, high = ranks_by_hand(300, 0.99, 0.95)
    assert (low, high) == (294, 300)  # x_(294) = 294 ms, x_(300) = 300 ms
    records = ttfts([float(i) for i in range(1, 301)])
    for target, verdict, code in ((300.0, "met", 0), (297.0, "inconclusive", 7),
                                  (293.5, "missed", 2)):  # fmt: skip
        summary = judged(records, chat=SloTargets(ttft_ms=target))
        (check,) = summary.classes["chat"].slo.checks
        assert (check.value_ms, check.low_ms, check.high_ms) == (297.0, float(low), float(high))
        assert (check.verdict, check.passed, check.needed) == (verdict, verdict == "met", None)
        assert (summary.verdict.status, summary.verdict.exit_code) == (verdict, code)
        assert summary.verdict.slo_met is (verdict == "met")


def test_the_point_rule_would_be_caught_in_both_directions() -> None:
    """40 fast requests at p99: the point rule says MET (exit 0), the interval rule
    INCONCLUSIVE, 299 needed (exit 7); add one failure and the point rule says MISSED
    (exit 2: rank 40 of 41 is the failure), the interval rule still INCONCLUSIVE (the lower
    bound, the 39th of 41, is an ok value): either rule used by mistake fails here."""
    fast = ttfts([50.0] * 40)
    target = SloTargets(ttft_ms=1000.0)
    by_interval, by_point = judged(fast, chat=target), judged(fast, rule="point", chat=target)
    (check,) = by_interval.classes["chat"].slo.checks
    assert (check.verdict, check.high_ms, check.high_open, check.needed) == (
        "inconclusive", None, True, 299)  # fmt: skip
    assert (by_interval.verdict.exit_code, by_interval.verdict.rule) == (7, "interval")
    assert (by_point.verdict.exit_code, by_point.verdict.rule) == (0, "point")
    with_failure = [*fast, failed_record(40, intended_ms=400.0)]
    assert judged(with_failure, rule="point", chat=target).verdict.exit_code == 2
    interval = judged(with_failure, chat=target)
    (check,) = interval.classes["chat"].slo.checks
    assert ranks_by_hand(41, 0.99, 0.95) == (39, 42)
    assert (check.verdict, check.low_ms, check.value_ms) == ("inconclusive", 50.0, None)
    assert interval.verdict.exit_code == 7


def test_a_miss_anywhere_beats_inconclusive_and_falling_behind_beats_both() -> None:
    """One class missed, one inconclusive: exit 2; the inconclusive class alone: 7; the
    same records with every send late: 3 whatever the checks say."""
    slow = ttfts([500.0] * 40, "slow")  # 40 over a 100 ms p90 target: the lower bound misses
    short = ttfts([50.0] * 10, "short")  # 10 under a p90 target: 29 would judge it
    slos = {"slow": SloTargets(ttft_ms=100.0, percentile=90),
            "short": SloTargets(ttft_ms=100.0, percentile=90)}  # fmt: skip
    both = judged(slow + short, **slos)
    assert {n: c.slo.verdict for n, c in both.classes.items()} == {
        "slow": "missed", "short": "inconclusive"}  # fmt: skip
    assert (both.verdict.status, both.verdict.exit_code) == ("missed", 2)
    alone = judged(short, short=slos["short"])
    assert (alone.verdict.status, alone.verdict.exit_code) == ("inconclusive", 7)
    late = [streamed_record(i, intended_ms=10.0 * i, ttft_ms=50.0, lag_ms=20.0,
                            class_name="short") for i in range(10)]  # fmt: skip
    behind = judged(late, short=slos["short"])
    assert (behind.verdict.status, behind.verdict.exit_code) == ("fell_behind", 3)


def test_a_stopped_run_judges_nothing_however_its_checks_came_out() -> None:
    """An interrupted run: no class verdict, slo_met null, exit 130, not 7."""
    summary = judged(ttfts([50.0] * 10), stopped="interrupted", chat=SloTargets(ttft_ms=100.0))
    assert (summary.classes["chat"].slo.verdict, summary.verdict.slo_met) == (None, None)
    assert summary.verdict.exit_code == 130


def test_itl_is_judged_by_requests_not_by_gaps() -> None:
    """20 requests of 30 equal 10 ms gaps against a 20 ms p90 ITL target: 600 gaps, but 20
    requests, too few for a p90 bound: INCONCLUSIVE with 29 needed; 30 requests: MET. The
    point estimate is the pooled gaps' p90 either way."""

    def gapped(n: int) -> list[RequestRecord]:
        return [streamed_record(i, intended_ms=10.0 * i, gaps_ms=(10.0,) * 30) for i in range(n)]

    target = SloTargets(itl_ms=20.0, percentile=90)
    (few,) = judged(gapped(20), chat=target).classes["chat"].slo.checks
    assert (few.population, few.value_ms, few.verdict, few.needed) == (600, 10.0, "inconclusive",
                                                                        29)  # fmt: skip
    (enough,) = judged(gapped(30), chat=target).classes["chat"].slo.checks
    assert (enough.verdict, enough.high_ms) == ("met", 10.0)


def test_attainment_carries_its_exact_bounds() -> None:
    """37 of 40 requests within every threshold: attainment 0.925 with the Clopper-Pearson
    one-sided bounds at the class's confidence beside it."""
    records = ttfts([50.0] * 37 + [500.0] * 3)
    slo = judged(records, chat=SloTargets(ttft_ms=100.0, percentile=50, confidence=0.9))
    low, high = share_bounds(37, 40, 0.9)
    assert (slo.classes["chat"].slo.attainment, slo.classes["chat"].slo.attainment_low,
            slo.classes["chat"].slo.attainment_high) == (0.925, round(low, 6), round(high, 6))  # fmt: skip


# -- the same end to end through the CLI ---------------------------------------------------


def run(tmp_path: Path, run_id: str, text: str, *extra: str) -> tuple[int, str, Path]:
    """`loadgen run` of the workload `text` against a fast scripted server."""
    path = workload_file(tmp_path, text, f"{run_id}.yaml")
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(path), "--url", server.url, "--out", str(tmp_path), "--run-id", run_id,
            "-q", "--lag-bound-ms", "1000", "--no-preflight", *extra])  # fmt: skip
    return result.exit_code, result.output, tmp_path / run_id


P90 = "{ttft_ms: 2000, tpot_ms: 1000, percentile: 90}"


def test_the_exit_code_end_to_end(tmp_path: Path) -> None:
    """Ten quick requests at p90: exit 7 by default, with the rule and level in run.json and
    summary.json; `--verdict point`: exit 0."""
    ten = chat_workload(requests=10, slo=P90)
    code, output, folder = run(tmp_path, "ten", ten)
    assert code == 7, output
    assert "INCONCLUSIVE" in output
    info = json.loads((folder / "run.json").read_text())
    assert info["options"]["verdict"] == "interval"
    assert info["workload"]["spec"]["classes"]["chat"]["slo"]["confidence"] == 0.95
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["verdict"]["status"], summary["verdict"]["rule"]) == (
        "inconclusive",
        "interval",
    )
    assert summary["verdict"]["slo_met"] is False  # an old reader must not read a pass
    assert {c["needed"] for c in summary["classes"]["chat"]["slo"]["checks"]} == {29}
    code, output, folder = run(tmp_path, "point", ten, "--verdict", "point")
    assert code == 0, output
    assert json.loads((folder / "run.json").read_text())["options"]["verdict"] == "point"
    assert "by point estimates" in output


@pytest.mark.slow
def test_the_level_the_size_and_a_re_judging_report_end_to_end(tmp_path: Path) -> None:
    """The same ten requests with `--confidence 0.6` (9 requests bound a p90 there): exit 0;
    30 requests at 95 %: exit 0. `report` re-judges by the recorded rule (7), or by
    `--verdict point` (0), or `--slo confidence=0.6` (0)."""
    ten = chat_workload(requests=10, slo=P90)
    code, output, _ = run(tmp_path, "ten", ten)
    assert code == 7, output
    code, output, _ = run(tmp_path, "loose", ten, "--confidence", "0.6")
    assert code == 0, output
    code, output, _ = run(tmp_path, "thirty", chat_workload(requests=30, slo=P90))
    assert code == 0, output
    for extra, expected in (([], 7), (["--verdict", "point"], 0), (["--slo", "confidence=0.6"], 0)):
        again = CliRunner().invoke(cli, ["report", str(tmp_path / "ten"), *extra])
        assert again.exit_code == expected, (extra, again.output)


def test_check_says_how_many_requests_the_slo_needs(tmp_path: Path) -> None:
    """`check` of 40 requests at p99: a warning that 299 are needed, suggesting p95 (59 >
    40, so p90); at p90: the count needed and the plan's, no warning; `--confidence 0.99`
    raises the need (44 for a p90)."""
    p99 = workload_file(tmp_path, chat_workload(requests=40, slo="{ttft_ms: 1000}"), "a.yaml")
    result = CliRunner().invoke(cli, ["check", str(p99)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "WARNING chat: p99 at 95% needs ≥ 299 requests to be MET; the plan has 40" in said
    assert "or judge p90." in said
    p90 = workload_file(tmp_path, chat_workload(requests=40, slo=P90), "b.yaml")
    result = CliRunner().invoke(cli, ["check", str(p90)])
    said = " ".join(result.output.split())
    assert "chat: p90 judged at 95%: needs ≥ 29 requests to be MET; the plan has 40" in said
    assert "WARNING" not in said
    result = CliRunner().invoke(cli, ["check", str(p90), "--confidence", "0.99"])
    assert "WARNING chat: p90 at 99% needs ≥ 44 requests" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "slo", "message"),
    [
        (["--confidence", "1"], P90, "--confidence"),
        (["--confidence", "0.4"], P90, "--confidence"),
        (
            [],
            "{ttft_ms: 1000, confidence: 1.5}",
            "classes.chat.slo.confidence: must be in (0.5, 1)",
        ),
        (["--verdict", "median"], P90, "--verdict"),
    ],
)
def test_a_bad_level_or_rule_is_a_clear_usage_error(
    tmp_path: Path, args: list[str], slo: str, message: str
) -> None:
    """A level outside (0.5, 1), in the file or on the command line, or an unknown rule:
    exit 1 naming it, no traceback, nothing sent."""
    path = workload_file(tmp_path, chat_workload(requests=5, slo=slo))
    result = CliRunner().invoke(cli, ["run", str(path), "--url", "http://127.0.0.1:9", *args])
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output
