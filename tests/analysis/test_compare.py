"""Tests for `loadgen compare`: intervals, the regression rule, its false-positive rate, outputs, CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.analysis import metrics
from loadgen.analysis.compare import (
    CHECKS,
    Comparison,
    NoBaseline,
    RefusedSide,
    Side,
    Tolerance,
    Verdict,
    compare_exit,
    compare_sides,
    judge,
    parse_tolerances,
    to_json,
    tolerance_for,
)
from loadgen.analysis.confidence import (
    Estimate,
    min_samples,
    order_statistic_ranks,
    percentile_estimate,
    wilson,
)
from loadgen.analysis.server import ServerDelta
from loadgen.cli.compare import compare
from loadgen.errors import ConfigError
from loadgen.render.compare_view import render_markdown, render_table
from loadgen.render.junit import render_junit
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.testing import builders
from loadgen.workload.identity import identity
from loadgen.workload.spec import SloTargets, loads

NS_PER_MS = 1_000_000
SLO = {"ttft_ms": 400.0, "tpot_ms": 50.0, "percentile": 99.0}
SLOS = {"chat": SloTargets(**SLO)}  # type: ignore[arg-type]  # the literal's values are floats
ZERO = {
    "latency": Tolerance(relative=0.0, absolute=0.0),
    "attainment": Tolerance(absolute=0.0),
    "error_rate": Tolerance(absolute=0.0),
    "goodput": Tolerance(relative=0.0),
}


def request(i: int, rng: random.Random, *, cls: str, slower: float, failed: bool) -> RequestRecord:
    """One request sent at i * 0.1 s: lognormal TTFT (median 200 ms × slower), 2-8 tokens with lognormal gaps."""
    intended = int(i * 0.1e9)
    if failed:
        return RequestRecord(
            request_id=i,
            class_name=cls,
            intended_ns=intended,
            outcome=Outcome.TIMEOUT_STALL,
            end_ns=intended + 5 * 10**9,
        )
    t = intended + round(rng.lognormvariate(math.log(200.0), 0.3) * slower * NS_PER_MS)
    chunks = [t]
    for _ in range(rng.randint(2, 8) - 1):
        chunks.append(chunks[-1] + round(rng.lognormvariate(math.log(20.0), 0.3) * NS_PER_MS))
    return RequestRecord(
        request_id=i,
        class_name=cls,
        intended_ns=intended,
        outcome=Outcome.OK,
        first_token_ns=chunks[0],
        last_token_ns=chunks[-1],
        end_ns=chunks[-1],
        chunk_ns=tuple(chunks),
        chunk_tokens=(1,) * len(chunks),
        output_tokens=len(chunks),
    )


def records(
    seed: int, n: int, *, slower: float = 1.0, failure_rate: float = 0.0, cls: str = "chat"
) -> list[RequestRecord]:
    """n requests of one class from a seeded distribution (optionally slower or failing more)."""
    rng = random.Random(seed)
    return [
        request(i, rng, cls=cls, slower=slower, failed=rng.random() < failure_rate)
        for i in range(n)
    ]


def side(recs: list[RequestRecord], label: str = "run") -> Side:
    """A one-run side from records."""
    frame = to_frame(recs)
    return Side(
        label=label, run_ids=(label,), frame=frame, duration_s=metrics.run_duration_s(frame)
    )


def verdicts(comparison: Comparison, cls: str = "chat") -> dict[str, Verdict]:
    """check name -> verdict for one class."""
    return {r.check.name: r.verdict for r in comparison.results if r.class_name == cls}


# A run of every class of its records at 10 req/s, each with the SLO.
write_run = partial(builders.write_run, slos=SLOS["chat"], rate_per_s=10.0, schema_version=1)


T0 = datetime(2026, 3, 20, 2, tzinfo=UTC)


# --- intervals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "q", "ranks"),
    [
        (100, 0.5, (40, 61)),  # the textbook interval for the median of 100
        (6, 0.5, (1, 6)),
        (5, 0.5, (0, 6)),  # open on both sides: 0.5^5 > 2.5 %
        (1000, 0.9, (881, 919)),
        (30, 0.99, (28, 31)),
        (300, 0.99, (293, 301)),  # the p99 of 300 reaches beyond the largest value
        (2000, 0.99, (1971, 1989)),
    ],
)
def test_order_statistic_ranks_known_answers(n: int, q: float, ranks: tuple[int, int]) -> None:
    """Equal-tailed binomial ranks match hand-checked values, open (0 or n + 1) where the sample is too small."""
    assert order_statistic_ranks(n, q, 0.95) == ranks


def _binomial_cdf(n: int, q: float, k: int) -> float:
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k + 1)) if k >= 0 else 0.0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    q=st.sampled_from([0.5, 0.9, 0.99]),
    confidence=st.sampled_from([0.9, 0.95, 0.99]),
)
def test_ranks_cover_at_least_the_confidence_with_equal_tails(
    n: int, q: float, confidence: float
) -> None:
    """F(u-1) - F(l-1) >= confidence, each tail <= alpha/2, and neither rank can move inward."""
    lower, upper = order_statistic_ranks(n, q, confidence)
    half = (1 - confidence) / 2
    below, above = _binomial_cdf(n, q, lower - 1), 1 - _binomial_cdf(n, q, upper - 1)
    assert below <= half + 1e-12
    assert above <= half + 1e-12
    assert 1 - below - above >= confidence - 1e-12
    assert lower == n or _binomial_cdf(n, q, lower) > half - 1e-12
    assert upper == 1 or 1 - _binomial_cdf(n, q, upper - 2) > half - 1e-12


def test_p99_closes_above_at_368_values() -> None:
    """The p99's upper bound needs 0.99^n <= 2.5 %: open at 367 values, closed at 368."""
    assert min_samples(0.99, 0.95) == (1, 368)
    values = [float(v) for v in range(1, 368)]

    assert percentile_estimate(np.array(values), 99.0, 0.95).high_open
    assert not percentile_estimate(np.array([*values, 368.0]), 99.0, 0.95).high_open


def test_failures_rank_worst_in_the_interval() -> None:
    """With failures ranked worst, a bound on a failure is +inf."""

    e = percentile_estimate(np.arange(1.0, 991.0), 99.0, 0.95, failures=10)
    assert e.n == 1000
    assert e.value == 990.0
    assert e.high == math.inf
    assert e.low is not None


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (95, 100, 0.8882, 0.9785)],
)
def test_wilson_known_answers(successes: int, n: int, low: float, high: float) -> None:
    """Wilson score intervals match published values."""
    e = wilson(successes, n, 0.95)
    assert e.low == pytest.approx(low, abs=1e-4)
    assert e.high == pytest.approx(high, abs=1e-4)


# --- the rule -----------------------------------------------------------------------------


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_same_distribution_is_rarely_flagged_over_50_seed_pairs() -> None:
    """Two samples of one distribution: each check REGRESSED in <= 2 of 50 pairs with zero tolerance, <= 1 with the defaults.

    Non-overlap of two independent 95 % intervals in the worse direction has probability
    ~1 - Phi(1.96 * sqrt(2)) ≈ 0.28 % for roughly normal estimators (and at most 5 %
    whatever the distribution), so Binomial(50, 0.0028) >= 3 has probability ~3e-4 per
    check (~0.6 % over the 24 checks); the tolerances only remove flags, so the
    default rule's count is a subset of the strict one's.
    """
    flagged: Counter[str] = Counter()
    flagged_default: Counter[str] = Counter()
    for seed in range(50):
        base = side(records(2 * seed, 300, failure_rate=0.02))
        cur = side(records(2 * seed + 1, 300, failure_rate=0.02))
        for r in compare_sides(base, cur, slos=SLOS, tolerances=ZERO).results:
            flagged[r.check.name] += r.verdict is Verdict.REGRESSED
            default = tolerance_for(r.check, {})
            verdict, _ = judge(r.check, r.baseline, r.current, default, 0.95)
            flagged_default[r.check.name] += verdict is Verdict.REGRESSED
    assert max(flagged.values(), default=0) <= 2, flagged
    assert sum(flagged.values()) <= 10, flagged
    assert max(flagged_default.values(), default=0) <= 1, flagged_default


def test_thirty_percent_slower_ttft_is_flagged_with_2000_requests() -> None:
    """A 30 % slower TTFT distribution with n = 2,000 REGRESSES every TTFT percentile; TPOT stays ok."""
    result = compare_sides(side(records(1, 2000)), side(records(2, 2000, slower=1.3)), slos=SLOS)
    v = verdicts(result)
    assert {v[f"ttft_p{p}"] for p in (50, 90, 99)} == {Verdict.REGRESSED}
    assert {v[f"ttft_all_p{p}"] for p in (50, 90, 99)} == {Verdict.REGRESSED}
    assert v["tpot_p50"] is Verdict.OK
    assert v["itl_p99"] is Verdict.OK
    assert result.exit_code == 2


def test_thirty_percent_slower_ttft_with_30_requests_is_not_over_read() -> None:
    """The same shift with n = 30: the p99's interval reaches beyond the sample, so it is not enough data."""
    result = compare_sides(side(records(1, 30)), side(records(2, 30, slower=1.3)), slos=SLOS)
    row = next(r for r in result.results if r.check.name == "ttft_p99")
    assert row.verdict is Verdict.NO_DATA
    assert row.baseline.high_open
    assert "368" in row.reason


def test_a_p99_from_300_requests_shows_a_wide_interval() -> None:
    """With n = 300 the p99's interval spans ranks 293 to beyond the maximum: shown as `[x, >max]`."""
    result = compare_sides(side(records(1, 300)), side(records(2, 300)), slos=SLOS)
    row = next(r for r in result.results if r.check.name == "ttft_p99")
    assert row.baseline.ranks == (293, 301)
    assert row.verdict is Verdict.NO_DATA
    assert ", >" in render_markdown(result).split("TTFT p99 |")[1].split("\n")[0]


def test_more_failures_flag_error_rate_and_attainment() -> None:
    """8 % failures against none REGRESSES error rate, attainment and the p99 with failures ranked worst."""
    result = compare_sides(
        side(records(1, 1000)), side(records(2, 1000, failure_rate=0.08)), slos=SLOS
    )
    v = verdicts(result)
    assert v["error_rate"] is Verdict.REGRESSED
    assert v["attainment"] is Verdict.REGRESSED
    assert v["ttft_all_p99"] is Verdict.REGRESSED
    assert v["ttft_p50"] is Verdict.OK  # ok requests are as fast as before


def test_a_faster_current_is_improved() -> None:
    """A 30 % faster TTFT is `improved`, never a regression."""
    result = compare_sides(side(records(1, 2000, slower=1.3)), side(records(2, 2000)), slos=SLOS)
    assert verdicts(result)["ttft_p50"] is Verdict.IMPROVED
    assert result.exit_code == 0


INF = math.inf


@pytest.mark.parametrize(
    ("base", "cur", "verdict"),
    [
        (
            Estimate(value=10.0, low=9.0, high=11.0, n=500),
            Estimate(value=20.0, low=19.0, high=21.0, n=500),
            Verdict.REGRESSED,
        ),
        (
            Estimate(value=10.0, low=9.0, high=11.0, n=500),
            Estimate(value=10.5, low=10.0, high=11.5, n=500),
            Verdict.OK,
        ),
        (
            Estimate(value=10.0, low=9.0, high=11.0, n=500),
            Estimate(value=11.5, low=11.2, high=11.8, n=500),
            Verdict.OK,
        ),  # apart, within 10 % / 2 ms
        (
            Estimate(value=20.0, low=19.0, high=21.0, n=500),
            Estimate(value=10.0, low=9.0, high=11.0, n=500),
            Verdict.IMPROVED,
        ),
        (
            Estimate(value=INF, low=INF, high=INF, n=500),
            Estimate(value=INF, low=INF, high=INF, n=500),
            Verdict.OK,
        ),  # both fail
        (
            Estimate(value=10.0, low=9.0, high=11.0, n=500),
            Estimate(value=INF, low=INF, high=INF, n=500),
            Verdict.REGRESSED,
        ),
        (
            Estimate(value=10.0, low=9.0, high=12.0, n=300, high_open=True),
            Estimate(value=20.0, low=19.0, high=21.0, n=500),
            Verdict.NO_DATA,
        ),
        (Estimate(value=None), Estimate(value=20.0, low=19.0, high=21.0, n=500), Verdict.NO_DATA),
    ],
)
def test_judge_table(base: Estimate, cur: Estimate, verdict: Verdict) -> None:
    """The rule on hand-made latency estimates: apart AND beyond tolerance, failures (+inf) and open bounds."""
    check = next(c for c in CHECKS if c.name == "ttft_all_p99")
    assert judge(check, base, cur, tolerance_for(check, {}), 0.95)[0] is verdict


def test_a_tolerance_override_absorbs_the_change() -> None:
    """`ttft=50%` lets a 30 % slower TTFT pass: the change must exceed the tolerance too."""
    base, cur = side(records(1, 2000)), side(records(2, 2000, slower=1.3))
    result = compare_sides(base, cur, slos=SLOS, tolerances=parse_tolerances(["ttft=50%"]))
    assert verdicts(result)["ttft_p50"] is Verdict.OK


@pytest.mark.parametrize(
    ("texts", "key", "tolerance"),
    [
        (["ttft_p99=5%"], "ttft_p99", Tolerance(relative=0.05)),
        (["ttft_p99=5%", "ttft_p99=20ms"], "ttft_p99", Tolerance(relative=0.05, absolute=20.0)),
        (["latency=0.5s"], "latency", Tolerance(absolute=500.0)),
        (["attainment=-2pp"], "attainment", Tolerance(absolute=0.02)),
        (["goodput=5%"], "goodput", Tolerance(relative=0.05)),
    ],
)
def test_parse_tolerances(texts: list[str], key: str, tolerance: Tolerance) -> None:
    """`CHECK=VALUE` with %, ms, s or pp becomes a Tolerance; items for one key merge."""
    assert parse_tolerances(texts)[key] == tolerance


@pytest.mark.parametrize(
    "text", ["ttft_p98=5%", "ttft_p99", "attainment=1%", "goodput=3ms", "e2e=x%"]
)
def test_parse_tolerances_rejects_nonsense(text: str) -> None:
    """Unknown checks, missing values, wrong units and non-numbers are ConfigErrors."""
    with pytest.raises(ConfigError, match="--tolerance"):
        parse_tolerances([text])


def test_classes_in_one_side_are_listed_not_compared() -> None:
    """A class only the current run has is reported; a comparison with no shared class is an error."""
    both = side(records(1, 100) + records(2, 100, cls="batch"))
    result = compare_sides(side(records(3, 100)), both, slos=SLOS)
    assert result.only_in_current == ("batch",)
    assert {r.class_name for r in result.results} == {"chat"}
    with pytest.raises(ConfigError, match="no class to compare"):
        compare_sides(side(records(1, 50)), side(records(2, 50, cls="batch")), slos=SLOS)
    with pytest.raises(ConfigError, match="--class"):
        compare_sides(side(records(1, 50)), both, slos=SLOS, classes=["nope"])


# --- outputs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regressed() -> Comparison:
    """A comparison where TTFT got 30 % slower (n = 2,000) and a class exists only in the baseline."""
    base = side(records(1, 2000) + records(5, 50, cls="batch"), "run-a")
    return compare_sides(base, side(records(2, 2000, slower=1.3), "run-b"), slos=SLOS)


def test_compares_exit_is_2_on_a_regressed_check_or_server_figure(regressed: Comparison) -> None:
    """compare decides its exit in analysis, not the CLI: 2 when a check REGRESSED or a server
    figure passed its threshold, else 0; no baseline yet exits 0, a refused side 1."""
    calm = compare_sides(side(records(1, 300)), side(records(1, 300)), slos=SLOS)
    assert not calm.regressions
    passed = ServerDelta(figure="queue_depth_p99", baseline=2.0, current=5.0, threshold=None,
                         regressed=True)  # fmt: skip
    within = dataclasses.replace(passed, regressed=False)
    assert compare_exit(calm) == compare_exit(calm, [within]) == 0
    assert compare_exit(calm, [within, passed]) == 2
    assert compare_exit(regressed) == compare_exit(regressed, [within]) == 2
    assert (NoBaseline("first night").exit_code, RefusedSide("stopped").exit_code) == (0, 1)


def test_junit_has_a_testcase_per_class_and_check_with_failures(regressed: Comparison) -> None:
    """The JUnit XML parses; one testcase per check of the compared class, a failure with a message per regression."""
    root = ET.fromstring(render_junit(regressed))
    assert root.tag == "testsuites"
    suite = root.find("testsuite[@name='compare.chat']")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c.name for c in CHECKS]
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {r.check.name for r in regressed.regressions}
    assert "ttft_p50" in failed
    failure = suite.find("testcase[@name='ttft_p50']/failure")
    assert failure is not None
    assert "regressed" in (failure.get("message") or "")
    assert suite.get("failures") == str(len(failed))
    assert suite.get("tests") == str(len(CHECKS))
    names = {p.get("name") for p in suite.iter("property")}
    assert {"ttft_p50.baseline", "ttft_p50.current_low", "ttft_p50.verdict"} <= names
    only = root.find("testsuite[@name='compare.batch']/testcase/skipped")
    assert only is not None
    assert "only in the baseline" in (only.get("message") or "")
    assert root.get("tests") == str(len(CHECKS) + 1)


# Elements and attributes of the common JUnit schema (Jenkins xunit junit-10.xsd) that we use.
JUNIT_SCHEMA = {
    "testsuites": {"name", "time", "tests", "failures", "errors"},
    "testsuite": {"name", "tests", "failures", "errors", "skipped", "time"},
    "properties": set(),
    "property": {"name", "value"},
    "testcase": {"name", "classname", "time"},
    "failure": {"message", "type"},
    "skipped": {"message", "type"},
    "system-out": set(),
}
JUNIT_CHILDREN = {
    "testsuites": {"testsuite"},
    "testsuite": {"properties", "testcase", "system-out", "system-err"},
    "properties": {"property"},
    "testcase": {"skipped", "error", "failure", "system-out", "system-err"},
}


def test_junit_keeps_to_the_common_schema(regressed: Comparison) -> None:
    """Only junit-10.xsd's elements, attributes and nesting; a testsuite's required counts are present."""
    root = ET.fromstring(render_junit(regressed))
    for element in root.iter():
        assert element.tag in JUNIT_SCHEMA, element.tag
        assert set(element.attrib) <= JUNIT_SCHEMA[element.tag], element.tag
        allowed = JUNIT_CHILDREN.get(element.tag, set())
        assert {child.tag for child in element} <= allowed, element.tag
    for suite in root.iter("testsuite"):
        assert {"name", "tests", "failures", "errors"} <= set(suite.attrib)


def test_markdown_holds_the_table(regressed: Comparison) -> None:
    """The Markdown has the header row, a row per check and the verdict."""
    text = render_markdown(regressed)
    assert "| class | metric | n base/cur | baseline [CI] | current [CI] |" in text
    assert sum(line.startswith("| chat |") for line in text.splitlines()) == len(CHECKS)
    assert "**REGRESSED**" in text
    assert "only in baseline" in text


def test_json_and_table_agree(regressed: Comparison) -> None:
    """The JSON form lists the regressions and exit code; the table renders."""
    data = json.loads(json.dumps(to_json(regressed), allow_nan=False))
    assert "chat.ttft_p50" in data["regressions"]
    assert data["exit_code"] == 2
    assert data["classes"]["chat"]["ttft_p99"]["baseline"]["ranks"] == [1971, 1989]
    assert render_table(regressed) is not None


# --- the command --------------------------------------------------------------------------


def invoke(*args: str | Path) -> tuple[int, str, str]:
    """Run `compare` as its own command; (exit code, stdout, stderr)."""
    result = CliRunner().invoke(compare, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_cli_exit_codes(tmp_path: Path) -> None:
    """0 for two samples of one distribution, 2 for a slower one; files written on request."""
    a = write_run(tmp_path, T0, records(1, 2000), run_id="a")
    b = write_run(tmp_path, T0 + timedelta(hours=1), records(2, 2000), run_id="b")
    slow = write_run(tmp_path, T0 + timedelta(hours=2), records(3, 2000, slower=1.3), run_id="slow")
    code, out, _ = invoke(a, b)
    assert code == 0
    assert "no regression" in out
    junit, md = tmp_path / "c.xml", tmp_path / "c.md"
    code, out, _ = invoke(a, slow, "--junit", junit, "--markdown", md)
    assert code == 2
    assert "REGRESSED" in out
    assert ET.parse(junit).getroot().find(".//failure") is not None
    assert "| chat |" in md.read_text()
    code, out, _ = invoke(a, slow, "--format", "json", "--class", "chat")
    assert code == 2
    assert "chat.ttft_p50" in json.loads(out)["regressions"]


AGENT_YAML = Path(__file__).parents[2] / "workloads" / "agent.yaml"


def agent_run(store: Path, t0: datetime, run_id: str, *, grow: bool) -> Path:
    """A run of workloads/agent.yaml with its context growing (as shipped) or fixed, its
    run.json's workload block as `loadgen run` writes it."""
    text = AGENT_YAML.read_text()
    if not grow:
        text = text.replace("    kind: agent\n", "    kind: agent\n    context: {grow: false}\n")
    spec = loads(text)
    stored = dataclasses.asdict(spec)
    stored.pop("raw")
    stored["target"]["headers"] = []
    run_dir = write_run(store, t0, records(1 + grow, 300, cls="agent"), run_id=run_id,
                        workload=spec.name)  # fmt: skip
    info = json.loads((run_dir / "run.json").read_text())
    info["workload"] = {"name": spec.name, "spec": json.loads(json.dumps(stored)),
                        "identity": identity(spec)}  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def test_two_runs_differing_in_an_agent_context_mode_are_refused_naming_it(tmp_path: Path) -> None:
    """A fixed vs a growing context: exit 1 naming the class, the setting, both values and
    how to align them; --force compares them and names the setting in the table, the JSON
    and the JUnit properties;
    a baseline window holding only the other workload's run names it too."""
    fixed = agent_run(tmp_path, T0, "fixed", grow=False)
    growing = agent_run(tmp_path, T0 + timedelta(hours=1), "growing", grow=True)
    code, _, err = invoke(fixed, growing)
    assert code == 1
    named = "classes.agent.context.grow: false vs true (class agent's context: fixed vs growing)"
    assert named in " ".join(err.split())
    assert "give class agent one context mode in both workloads" in " ".join(err.split())
    assert "--force" in err
    code, out, _ = invoke(fixed, growing, "--force", "--format", "json")
    assert json.loads(out)["workload_differences"] == [named]
    code, out, _ = invoke(fixed, growing, "--force")
    assert named in " ".join(out.split())
    junit = tmp_path / "forced.xml"
    code, _, _ = invoke(fixed, growing, "--force", "--junit", junit)
    names = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert names["forced"] == "true"
    assert names["workload_differences"] == named  # the CI report says why they differ
    code, out, _ = invoke(growing, "--baseline-window", "1d")  # the window holds only `fixed`
    assert code == 0  # a new series: the first night of `growing`, which names the other
    assert out.startswith("no baseline yet: ")
    assert f"(it vs CURRENT: {named})" in " ".join(out.split())


def test_runs_keyed_apart_by_another_fingerprint_rule_say_no_setting_differs(
    tmp_path: Path,
) -> None:
    """Two runs of one spec whose recorded keys differ (one written under another rule):
    the refusal says no hashed setting differs, not a made-up one; --force says so too."""
    a = agent_run(tmp_path, T0, "a", grow=True)
    b = agent_run(tmp_path, T0 + timedelta(hours=1), "b", grow=True)
    info = json.loads((b / "run.json").read_text())
    info["workload"]["identity"] = {**info["workload"]["identity"], "key": "agent@00000000"}
    (b / "run.json").write_text(json.dumps(info))
    code, _, err = invoke(a, b)
    assert code == 1
    assert "no setting this loadgen hashes differs" in " ".join(err.split())
    assert "They differ in" not in err
    code, out, _ = invoke(a, b, "--force", "--format", "json")
    assert json.loads(out)["workload_differences"][0].startswith("no setting this loadgen")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/missing", "{tmp}/a"], "not a run folder"),
        (["{tmp}/a"], "BASELINE and CURRENT"),
        (["{tmp}/a", "{tmp}/batch"], "different workloads"),
        (["{tmp}/a", "{tmp}/batch", "--force"], "no class to compare"),
        (["{tmp}/a", "--baseline-window", "1d", "--force"], "--force applies to BASELINE"),
        (["{tmp}/a", "{tmp}/a", "--tolerance", "ttft_p99=5"], "--tolerance"),
        (["{tmp}/a", "{tmp}/a", "--confidence", "1.5"], "confidence"),
        (["{tmp}/a", "{tmp}/a", "--baseline-window", "30d"], "only CURRENT"),
        (["{tmp}/a", "--baseline-window", "soon"], "--baseline-window"),
        (["{tmp}/a", "{tmp}/a", "--bogus"], "No such option"),
    ],
)
def test_cli_usage_errors_exit_1(tmp_path: Path, args: list[str], message: str) -> None:
    """Missing runs, no shared class, bad flags: exit 1 with a message, never a traceback."""
    write_run(tmp_path, T0, records(1, 20), run_id="a")
    write_run(tmp_path, T0 + timedelta(hours=1), records(2, 20, cls="batch"), run_id="batch")
    result = CliRunner().invoke(compare, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


def test_baseline_window_pools_the_runs_before_current(tmp_path: Path) -> None:
    """`--baseline-window 7d` pools the runs of the 7 days before CURRENT: not older ones, later ones or CURRENT."""
    day = timedelta(days=1)
    write_run(tmp_path, T0 - 10 * day, records(1, 500, slower=3.0), run_id="old")
    for k, name in enumerate(("d-5", "d-3", "d-1")):
        write_run(tmp_path, T0 - (5 - 2 * k) * day, records(10 + k, 700), run_id=name)
    current = write_run(tmp_path, T0, records(20, 2000, slower=1.3), run_id="now")
    write_run(tmp_path, T0 + day, records(30, 500, slower=3.0), run_id="later")
    code, out, _ = invoke(current, "--baseline-window", "7d", "--format", "json")
    data = json.loads(out)
    assert data["baseline"]["runs"] == ["d-5", "d-3", "d-1"]
    assert data["classes"]["chat"]["ttft_p50"]["baseline"]["n"] == 2100  # pooled records
    assert code == 2
    assert "chat.ttft_p99" in data["regressions"]
    elsewhere = tmp_path / "elsewhere"
    moved = write_run(elsewhere, T0, records(20, 200), run_id="now")
    code, out, _ = invoke(moved, "--baseline-window", "7d", "--store", tmp_path, "--format", "json")
    assert json.loads(out)["baseline"]["runs"] == ["d-5", "d-3", "d-1"]


def test_runs_of_different_workloads_are_not_compared_unless_forced(tmp_path: Path) -> None:
    """Another name, or the same name at 3x the rate: exit 1 naming both workloads; --force
    compares them and says so in the table, the JSON and the JUnit properties."""
    a = write_run(tmp_path, T0, records(1, 500), run_id="a")
    fast = write_run(
        tmp_path, T0 + timedelta(hours=1), records(2, 500), run_id="fast", rate_per_s=30.0
    )
    other = write_run(tmp_path, T0 + timedelta(hours=2), records(3, 500), run_id="other", workload="chat-smoke")  # fmt: skip
    for b in (fast, other):
        code, _, err = invoke(a, b)
        assert code == 1
        assert "different workloads" in err
        assert "--force" in err
    code, out, _ = invoke(a, fast, "--force")
    assert code == 0
    assert "FORCED" in out
    junit = tmp_path / "j.xml"
    code, out, _ = invoke(a, fast, "--force", "--format", "json", "--junit", junit)
    data = json.loads(out)
    assert data["forced"] is True
    assert data["baseline"]["workload"] != data["current"]["workload"]
    assert data["baseline"]["workload"].startswith("chat@")
    names = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert names["forced"] == "true"
    code, out, _ = invoke(a, write_run(tmp_path, T0 + timedelta(hours=3), records(4, 500), run_id="same"),
                          "--format", "json")  # fmt: skip
    assert (code, json.loads(out)["forced"]) == (0, False)


def test_baseline_window_pools_only_currents_workload_and_complete_runs(tmp_path: Path) -> None:
    """In one store, three workloads each with a class "chat": the window pools only CURRENT's,
    leaves out its interrupted and recovered runs unless --include-incomplete, and names the
    workload. Pooling any of the 3x-slower runs would move the baseline p50 by ~3x."""
    hour = timedelta(hours=1)
    write_run(tmp_path, T0 - 5 * hour, records(1, 700), run_id="w1-a")
    write_run(tmp_path, T0 - 4 * hour, records(2, 700), run_id="w1-b")
    write_run(
        tmp_path, T0 - 3 * hour, records(3, 700, slower=3.0), run_id="w2", workload="chat-smoke"
    )
    write_run(tmp_path, T0 - 2.5 * hour, records(4, 700, slower=3.0), run_id="w3", rate_per_s=30.0)
    write_run(
        tmp_path, T0 - 2 * hour, records(5, 100, slower=3.0), run_id="w1-int", stopped="interrupted"
    )
    write_run(
        tmp_path, T0 - hour, records(6, 100, slower=3.0), run_id="w1-rec", stopped="incomplete"
    )
    current = write_run(tmp_path, T0, records(7, 700), run_id="now")
    code, out, _ = invoke(current, "--baseline-window", "1d", "--format", "json")
    data = json.loads(out)
    assert data["baseline"]["runs"] == ["w1-a", "w1-b"]
    assert data["baseline"]["workload"] == data["current"]["workload"]
    left_out = data["baseline"]["left_out"]
    assert [r.split(" ")[0] for r in left_out] == ["w2", "w3", "w1-int", "w1-rec"]
    assert left_out[0].startswith("w2 (chat-smoke@")
    assert left_out[2:] == ["w1-int (stopped before its end (interrupted))",
                            "w1-rec (stopped before its end (incomplete))"]  # fmt: skip
    assert data["incomplete_runs"] == []
    assert code == 0, out  # the same distribution: nothing regressed
    base_p50 = data["classes"]["chat"]["ttft_p50"]["baseline"]["value"]
    assert 150 < base_p50 < 260  # median 200 ms; a pooled 3x-slower run would lift it
    code, out, _ = invoke(current, "--baseline-window", "1d", "--format", "json",
                          "--include-incomplete")  # fmt: skip
    assert json.loads(out)["baseline"]["runs"] == ["w1-a", "w1-b", "w1-int", "w1-rec"]
    assert json.loads(out)["incomplete_runs"] == ["w1-int", "w1-rec"]
    code, _, err = invoke(tmp_path / "w1-rec", tmp_path / "now")
    assert code == 1
    assert "stopped before its end (incomplete)" in err
    code, out, _ = invoke(tmp_path / "w2", "--baseline-window", "1d")
    assert code == 0  # w2's workload has no earlier run: its first night
    assert "no baseline yet: " in out
    assert "holds no valid run of workload chat-smoke@" in " ".join(out.split())


BEHIND = "the client's own time could have changed the verdict (a test's words)"


def test_the_first_night_is_no_baseline_yet_exit_0_with_junit_and_markdown(tmp_path: Path) -> None:
    """A store holding only tonight's run: "no baseline yet", exit 0, the window in words
    (not a raw timedelta), and the JUnit (a skipped case) and Markdown written, so a CI
    job's summary step finds them. A --store that does not exist is an error (exit 1)."""
    store = tmp_path / "store"
    tonight = write_run(store, T0, records(1, 200), run_id="night-1")
    junit, markdown = tmp_path / "junit.xml", tmp_path / "summary.md"
    code, out, _ = invoke("--baseline-window", "30d", "--store", store, tonight,
                          "--junit", junit, "--markdown", markdown)  # fmt: skip
    said = " ".join(out.split())
    assert code == 0, said
    assert said.startswith("no baseline yet: ")
    assert "in the 30 days before night-1" in said
    assert "0:00:00" not in said
    assert "days," not in said
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures")) == ("1", "0")
    skipped = root.find("testsuite/testcase/skipped")
    assert skipped is not None
    assert skipped.get("message", "").startswith("no baseline yet")
    assert markdown.read_text().startswith("### loadgen compare: no baseline yet\n")
    data = json.loads(invoke("--baseline-window", "30d", "--store", store, tonight,
                             "--format", "json")[1])  # fmt: skip
    assert (data["compared"], data["exit_code"]) == (False, 0)
    code, _, err = invoke("--baseline-window", "30d", "--store", tmp_path / "nope", tonight)
    assert code == 1
    assert "no such folder" in err


def test_a_run_whose_generator_fell_behind_is_refused_and_left_out(tmp_path: Path) -> None:
    """A night whose generator fell behind (exit 3) is no measure of the server: as CURRENT
    or BASELINE it is refused with its reason (exit 1, the JUnit failing as `invalid` and
    the Markdown saying why), and a later night's window leaves it out, naming it, though
    pooling its 3x-slower figures would have moved the baseline. Never "no regression"."""
    store = tmp_path / "store"
    day = timedelta(days=1)
    write_run(store, T0 - 2 * day, records(1, 700), run_id="n1")
    behind = write_run(store, T0 - day, records(2, 700, slower=3.0), run_id="n2",
                       fell_behind=BEHIND)  # fmt: skip
    tonight = write_run(store, T0, records(3, 700), run_id="n3")
    data = json.loads(invoke(tonight, "--baseline-window", "30d", "--format", "json")[1])
    assert data["baseline"]["runs"] == ["n1"]
    assert data["baseline"]["left_out"] == [f"n2 (the generator fell behind: {BEHIND})"]
    assert data["exit_code"] == 0
    junit, markdown = tmp_path / "junit.xml", tmp_path / "summary.md"
    code, out, err = invoke(behind, "--baseline-window", "30d", "--junit", junit,
                            "--markdown", markdown)  # fmt: skip
    assert code == 1, out
    assert f"CURRENT n2 is not compared: the generator fell behind: {BEHIND}" in " ".join(
        err.split()
    )
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.get("type") == "invalid"
    assert markdown.read_text().startswith("### loadgen compare: not compared\n")
    code, _, err = invoke(behind, tonight)
    assert code == 1
    assert "BASELINE n2 is not compared: the generator fell behind" in " ".join(err.split())
    code, out, _ = invoke(behind, tonight, "--include-incomplete", "--format", "json")
    assert json.loads(out)["incomplete_runs"] == ["n2"]


def test_help_has_an_example() -> None:
    """`compare --help` shows an Example: block and the exit codes."""
    code, out, _ = invoke("--help")
    assert code == 0
    assert "Example:" in out
    assert "Exit codes" in out


def test_cache_warmth_differs_by_mode_or_by_ten_points_of_hit_share() -> None:
    """Two modes differ; one mode differs when the hit shares are 10 points apart or more; a
    run recorded before cache modes counts as warm; an unknown share never differs."""
    from loadgen.render.cache_view import CacheSide, cache_contrast, compare_cache_line
    from loadgen.results.summary import CacheWarmth

    def side(mode: str | None, share: float | None) -> CacheSide:
        return CacheSide.of([None if mode is None else
                             CacheWarmth(mode=mode, server_hit_share=share)])  # fmt: skip

    assert (
        cache_contrast(side("cold", 0.05), side("warm", 0.05))
        == "they ran in different cache modes"
    )
    assert cache_contrast(side("warm", 0.10), side("warm", 0.19)) is None
    assert "differ by 67%" in (cache_contrast(side("warm", 0.10), side("warm", 0.77)) or "")
    assert cache_contrast(side(None, None), side("warm", None)) is None  # old runs were warm
    assert cache_contrast(side("cold", None), side("cold", 0.9)) is None
    line, differs = compare_cache_line(side("cold", 0.03), side("warm", 0.77))
    assert differs
    assert line.startswith("cache: BASELINE cold, prefix-cache hit share 3.0% · CURRENT warm")
