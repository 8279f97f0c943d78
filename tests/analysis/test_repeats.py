"""Repeated runs: Student's t by known values, the between-run interval's coverage by
simulation, the comparison of two sets of repeats, and `run --repeats` / `compare` end to
end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from loadgen.analysis.compare import DEFAULT_TOLERANCES, Tolerance
from loadgen.analysis.confidence import t_quantile
from loadgen.analysis.repeats import (
    HIGHER,
    LOWER,
    NO_DATA,
    OK,
    REGRESSED,
    Repeats,
    compare_repeats,
    repeats_exit,
    spread,
)
from loadgen.cli import cli
from loadgen.cli.run import worst_exit
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file


@pytest.mark.parametrize(("df", "expected"), [
    (1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045), (1000, 1.962),
])  # fmt: skip
def test_t_quantiles_are_the_tables(df: int, expected: float) -> None:
    """t(0.975) at 1, 2, 4, 9, 29 and 1000 degrees of freedom, to the printed tables' 3 decimals."""
    assert round(t_quantile(0.975, df), 3) == expected
    assert t_quantile(0.025, df) == pytest.approx(-t_quantile(0.975, df), abs=1e-9)


@pytest.mark.parametrize("runs", [3, 5, 10])
def test_the_between_run_interval_covers_the_true_mean_at_its_level(runs: int) -> None:
    """4,000 simulated sets of K runs whose figure is normal (mean 100, sd 8): the t-interval
    holds 100 in 95 % of them, within three binomial standard errors; a normal (z) interval
    of the same sets holds it clearly less often at K = 3 (the test has the power to tell)."""
    generator = np.random.default_rng(runs)
    sets = generator.normal(100.0, 8.0, (4000, runs))
    allowance = 3 * math.sqrt(0.95 * 0.05 / 4000)
    spreads = [spread(list(row), 0.95) for row in sets]
    covered = np.mean([s.low <= 100.0 <= s.high for s in spreads])  # type: ignore[operator]
    assert abs(covered - 0.95) <= allowance, covered
    if runs == 3:
        z = [abs(s.mean - 100.0) <= 1.96 * s.sd / math.sqrt(runs) for s in spreads]  # type: ignore[operator]
        assert np.mean(z) < 0.95 - 3 * allowance


def test_a_figure_on_a_failure_in_any_run_has_no_mean() -> None:
    """One run's p99 fell on a failed request: no mean and no interval, the values kept."""
    s = spread([100.0, None, 110.0], 0.95)
    assert (s.values, s.mean, s.low, s.high) == ((100.0, None, 110.0), None, None, None)
    single = spread([42.0], 0.95)
    assert (single.mean, single.low, single.high) == (42.0, None, None)


def repeats(values: dict[str, list[float]]) -> Repeats:
    return Repeats(run_ids=tuple(f"r{i}" for i in range(len(next(iter(values.values()))))),
                   statuses=(), level=0.95,
                   figures={"chat": {f: spread(v, 0.95) for f, v in values.items()}},
                   worse={"ttft_ms p90": HIGHER, "attainment": LOWER})  # fmt: skip


def test_repeats_regress_only_beyond_their_noise_and_the_tolerance() -> None:
    """TTFT p90 from ~100 to ~130 ms over 3 runs a side: REGRESSED (Welch's interval lies
    above 0, the change over 10 % and 2 ms); to ~103 ms: ok (within the tolerance); runs
    that scatter as much as the change: ok; attainment down 5 pp: REGRESSED; a side with
    a failure: not enough data."""
    base = repeats({"ttft_ms p90": [99.0, 100.0, 101.0], "attainment": [0.99, 0.99, 0.98]})
    worse = repeats({"ttft_ms p90": [129.0, 130.0, 131.0], "attainment": [0.94, 0.93, 0.94]})
    status = {c.figure: c.status for c in compare_repeats(base, worse)}
    assert status == {"ttft_ms p90": REGRESSED, "attainment": REGRESSED}
    close = repeats({"ttft_ms p90": [102.0, 103.0, 104.0], "attainment": [0.99, 0.99, 0.98]})
    assert {c.status for c in compare_repeats(base, close)} == {OK}
    noisy = repeats({"ttft_ms p90": [60.0, 190.0, 140.0], "attainment": [0.99, 0.99, 0.98]})
    assert {c.figure: c.status for c in compare_repeats(base, noisy)}["ttft_ms p90"] == OK
    failed = Repeats(run_ids=("a", "b"), statuses=(), level=0.95,
                     figures={"chat": {"ttft_ms p90": spread([100.0, None], 0.95)}},
                     worse={"ttft_ms p90": HIGHER})  # fmt: skip
    assert [c.status for c in compare_repeats(base, failed)] == [NO_DATA]


def test_repeats_judge_by_compares_default_tolerances(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tolerance is compare's, not a copy: TTFT p90 from ~100 to ~130 ms regresses at
    the default (+10 % and +2 ms) and is ok once the latency default is +50 %; attainment
    down 5 pp is ok once its default is 10 pp."""
    base = repeats({"ttft_ms p90": [99.0, 100.0, 101.0], "attainment": [0.99, 0.99, 0.98]})
    worse = repeats({"ttft_ms p90": [129.0, 130.0, 131.0], "attainment": [0.94, 0.93, 0.94]})
    assert {c.status for c in compare_repeats(base, worse)} == {REGRESSED}
    monkeypatch.setitem(DEFAULT_TOLERANCES, "latency", Tolerance(relative=0.5, absolute=2.0))
    monkeypatch.setitem(DEFAULT_TOLERANCES, "attainment", Tolerance(absolute=0.10))
    assert {c.status for c in compare_repeats(base, worse)} == {OK}


def test_repeats_exit_2_when_a_figure_regressed() -> None:
    """`compare` of two repeats folders exits by `analysis.repeats`: 2 for ~100 -> ~130 ms,
    0 for ~100 -> ~103 ms (within the tolerance)."""
    base = repeats({"ttft_ms p90": [99.0, 100.0, 101.0]})
    assert repeats_exit(compare_repeats(base, repeats({"ttft_ms p90": [129.0, 130.0, 131.0]}))) == 2
    assert repeats_exit(compare_repeats(base, repeats({"ttft_ms p90": [102.0, 103.0, 104.0]}))) == 0


def test_the_worst_run_speaks_for_the_repeats() -> None:
    """A stop beats fell behind, which beats missed, which beats inconclusive, then met."""
    assert worst_exit([0, 7, 0]) == 7
    assert worst_exit([0, 2, 7]) == 2
    assert worst_exit([2, 3]) == 3
    assert worst_exit([0, 130]) == 130
    assert worst_exit([0, 0]) == 0


P50 = "{ttft_ms: 2000, tpot_ms: 1000, percentile: 50}"


def repeat_runs(tmp_path: Path, run_id: str, delay_s: float, *extra: str) -> tuple[int, str]:
    path = workload_file(tmp_path, chat_workload(requests=10, slo=P50), f"{run_id}.yaml")
    with ScriptedServer(lambda r: simple_chat(3, first_delay_s=delay_s)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(path), "--url", server.url, "--out", str(tmp_path), "--run-id", run_id,
            "-q", "--lag-bound-ms", "1000", "--no-preflight", "--repeats", "3", *extra])  # fmt: skip
    return result.exit_code, result.output


@pytest.mark.slow
def test_run_repeats_and_compare_them_end_to_end(tmp_path: Path) -> None:
    """`run --repeats 3` writes three run folders (id-r1..r3) and id/repeats.json with each
    figure's three values, and one JUnit and one Markdown of the three; `compare` of two
    repeats folders: a server 100 ms slower to its first token REGRESSED (exit 2), the same
    server again: no regression (exit 0)."""
    junit, markdown = tmp_path / "j.xml", tmp_path / "s.md"
    code, output = repeat_runs(tmp_path, "before", 0.0, "--junit", str(junit),
                               "--markdown", str(markdown))  # fmt: skip
    assert code == 0, output
    assert "between-run spread of 3 repeats" in output
    assert junit.read_text().count('<testsuite name="before-r') == 3 * 2  # chat, generator
    assert markdown.read_text().startswith("### loadgen run --repeats 3: SLO MET (exit 0")
    assert sorted(p.name for p in tmp_path.glob("before-r*")) == ["before-r1", "before-r2",
                                                                   "before-r3"]  # fmt: skip
    data = json.loads((tmp_path / "before" / "repeats.json").read_text())
    assert data["runs"] == ["before-r1", "before-r2", "before-r3"]
    assert len(data["classes"]["chat"]["ttft_ms p50"]["values"]) == 3
    assert repeat_runs(tmp_path, "again", 0.0)[0] == 0
    assert repeat_runs(tmp_path, "slower", 0.1)[0] == 0
    slower = CliRunner().invoke(cli, ["compare", str(tmp_path / "before"),
                                      str(tmp_path / "slower"), "--format", "json"])  # fmt: skip
    assert slower.exit_code == 2, slower.output
    status = {c["figure"]: c["status"] for c in json.loads(slower.output)["changes"]}
    assert status["ttft_ms p50"] == REGRESSED
    same = CliRunner().invoke(cli, ["compare", str(tmp_path / "before"), str(tmp_path / "again")])
    assert same.exit_code == 0, same.output
    assert "REGRESSED" not in same.output


@pytest.mark.parametrize("extra", [["--shard", "0/2", "--start-at", "0"]])
def test_repeats_refuse_what_describes_one_run(tmp_path: Path, extra: list[str]) -> None:
    """--repeats with --shard: exit 1, nothing sent."""
    path = workload_file(tmp_path, chat_workload(requests=5))
    result = CliRunner().invoke(cli, ["run", str(path), "--url", "http://127.0.0.1:9",
                                      "--repeats", "2", *extra])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "--repeats" in result.output or "--junit" in result.output
    assert not list(tmp_path.glob("*/run.json"))
