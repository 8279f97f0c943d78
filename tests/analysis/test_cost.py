"""Cost from measured goodput: hand arithmetic, and the run, report, compare and rolling views."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.compare import compare_sides, load_sides
from loadgen.analysis.cost import Price, run_cost
from loadgen.analysis.rolling import _Bin, _window_cost, rolling_windows
from loadgen.cli import cli
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file


def test_cost_by_hand() -> None:
    """2.50/h a replica × 4 replicas for 36 s is 0.10; 100,000 tokens of which 90,000 good:
    1.00 per M tokens, 1.111111 per M good; chat (half the tokens, 40,000 good) pays 0.05:
    1.25 per M good; docs (all 50,000 good) 1.00."""
    cost = run_cost(
        Price(per_hour=2.5, replicas=4), duration_s=36.0,
        tokens={"chat": (50_000, 40_000), "docs": (50_000, 50_000)},
    )  # fmt: skip
    assert cost.fleet_per_hour == 10.0
    assert cost.run_cost == pytest.approx(0.1)
    assert cost.per_million_output_tokens == pytest.approx(1.0)
    assert cost.per_million_good_output_tokens == pytest.approx(1.111111)
    chat, docs = cost.classes["chat"], cost.classes["docs"]
    assert chat.cost_share == 0.5
    assert chat.cost == pytest.approx(0.05)
    assert chat.per_million_output_tokens == pytest.approx(1.0)
    assert chat.per_million_good_output_tokens == pytest.approx(1.25)
    assert docs.per_million_good_output_tokens == pytest.approx(1.0)


def test_no_tokens_no_figure() -> None:
    """A run whose requests all failed has a cost but no cost per token (null, not inf)."""
    cost = run_cost(Price(per_hour=1.0), duration_s=3600, tokens={"chat": (0, 0)})
    assert cost.run_cost == 1.0
    assert cost.per_million_output_tokens is None
    assert cost.classes["chat"].per_million_good_output_tokens is None


def priced_run(tmp: Path, run_id: str, price: str | None, *, ttft_ms: int = 2000) -> Path:
    """A 20-request run of 3 tokens each; with `ttft_ms` below the server's 30 ms wait, no
    request is good. At p85, which 19 requests bound at 95 %: the run has a verdict."""
    path = workload_file(tmp, chat_workload(
        requests=20, rate_per_s=40, slo=f"{{ttft_ms: {ttft_ms}, tpot_ms: 1000, percentile: 85}}"
    ), name=f"{run_id}.yaml")  # fmt: skip
    extra = ["--price-per-hour", price, "--replicas", "2"] if price else []
    with ScriptedServer(lambda r: simple_chat(3, first_delay_s=0.03)) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out", str(tmp),
                                          "--run-id", run_id, "-q", "--lag-bound-ms", "1000",
                                          *extra])  # fmt: skip
    assert result.exit_code in (0, 2), result.output
    return tmp / run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results store: two priced runs of one workload and one run without a price."""
    tmp = tmp_path_factory.mktemp("cost")
    priced_run(tmp, "a", "3.0")
    priced_run(tmp, "b", "5.0")
    priced_run(tmp, "plain", None)
    return tmp


def test_summary_cost_is_the_formula(store: Path) -> None:
    """summary.json's cost is price × replicas × the run's duration over its tokens, and
    `loadgen report` recomputes the same block from run.json."""
    summary = json.loads((store / "a" / "summary.json").read_text())
    cost, chat = summary["cost"], summary["classes"]["chat"]
    expected = 3.0 * 2 * summary["duration_s"] / 3600
    assert cost["run_cost"] == pytest.approx(expected, abs=1e-6)
    assert cost["output_tokens"] == chat["output_tokens"]["total"] == 60
    good = chat["goodput"]["output_tokens_per_s"] * summary["duration_s"]
    assert cost["good_output_tokens"] == pytest.approx(good, abs=0.01)
    assert cost["per_million_output_tokens"] == pytest.approx(expected / 60 * 1e6, rel=1e-5)
    assert "cost" not in json.loads((store / "plain" / "summary.json").read_text())
    result = CliRunner().invoke(cli, ["report", str(store / "a"), "--out", str(store / "rep")])
    assert result.exit_code == 0, result.output
    assert json.loads((store / "rep" / "summary.json").read_text())["cost"] == cost
    assert "per M good output tokens" in result.output
    assert "Cost at 3/h × 2 replicas = 6/h" in (store / "rep" / "report.md").read_text()


def test_misses_make_good_tokens_dearer(tmp_path: Path) -> None:
    """No request meets a 10 ms TTFT target behind a 30 ms server wait: no good tokens, so
    no cost per good token, while the cost per token stands."""
    run = priced_run(tmp_path, "miss", "4.0", ttft_ms=10)
    cost = json.loads((run / "summary.json").read_text())["cost"]
    assert cost["good_output_tokens"] == 0
    assert cost["per_million_good_output_tokens"] is None
    assert cost["per_million_output_tokens"] is not None


def test_compare_shows_both_sides_cost(store: Path) -> None:
    """compare's cost rows: each side's run cost over its tokens, per class and overall."""
    baseline, current, slos = load_sides(store / "b", baseline_dir=store / "a")
    comparison = compare_sides(baseline, current, slos=slos)
    rows = {c.class_name: c for c in comparison.cost}
    a = json.loads((store / "a" / "summary.json").read_text())["cost"]
    b = json.loads((store / "b" / "summary.json").read_text())["cost"]
    assert rows["all"].baseline_per_million == pytest.approx(a["per_million_output_tokens"])
    assert rows["chat"].current_per_million_good == pytest.approx(
        b["per_million_good_output_tokens"]
    )
    result = CliRunner().invoke(cli, ["compare", str(store / "a"), str(store / "b")])
    assert "per M good output tokens" in result.output
    unpriced, current, slos = load_sides(store / "b", baseline_dir=store / "plain")
    assert compare_sides(unpriced, current, slos=slos).cost == ()


def test_rolling_window_pools_cost(store: Path) -> None:
    """A window holding both priced runs: (cost a + cost b) / (good a + good b); a window
    with the unpriced run too has no cost figure."""
    a = json.loads((store / "a" / "summary.json").read_text())["cost"]
    b = json.loads((store / "b" / "summary.json").read_text())["cost"]
    pooled = (a["run_cost"] + b["run_cost"]) / (a["good_output_tokens"] + b["good_output_tokens"])
    priced = store / "priced"
    priced.mkdir()
    for name in ("a", "b"):
        (priced / name).symlink_to(store / name)
    frame = rolling_windows(priced, window=timedelta(days=1), step=timedelta(days=1))
    last = frame.row(-1, named=True)
    assert last["runs"] == 2
    assert last["cost_per_million_good_output_tokens"] == pytest.approx(pooled * 1e6, rel=1e-5)
    everything = rolling_windows(store, window=timedelta(days=1), step=timedelta(days=1))
    assert everything.row(-1, named=True)["cost_per_million_good_output_tokens"] is None


def test_a_window_counts_the_share_of_a_run_inside_it() -> None:
    """Half of run a's 10 requests fall in the window, all of run b's 4: a counts for half
    its cost (1.0) and tokens (200, 50 good), b wholly (cost 0.3, 90 tokens, 30 good):
    (0.5 + 0.3) / (25 + 30) per good token; (0.5 + 0.3) / (100 + 90) per token."""
    costs = {"a": {"chat": (10, 1.0, 200, 50)}, "b": {"chat": (4, 0.3, 90, 30)}}
    parts = [_Bin(run_requests={"a": 3, "b": 4}), _Bin(run_requests={"a": 2})]
    figures = _window_cost(parts, "chat", costs)
    assert figures["cost_per_million_good_output_tokens"] == pytest.approx(0.8 / 55 * 1e6)
    assert figures["cost_per_million_output_tokens"] == pytest.approx(0.8 / 190 * 1e6)
    unpriced = _window_cost(parts, "chat", {**costs, "b": None})
    assert unpriced["cost_per_million_good_output_tokens"] is None
