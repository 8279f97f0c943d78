"""Tests for rolling windows over the store: pooling, stepping, fallback, failures, rendering."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from loadgen.analysis.rolling import parse_duration, rolling_view, rolling_windows, to_json
from loadgen.analysis.slo import per_request
from loadgen.errors import ConfigError
from loadgen.render.rolling_view import render_rolling_table, rolling_figure, rolling_plot
from loadgen.render.terminal import fmt_ms
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import HISTOGRAMS_FILE
from loadgen.testing import builders
from loadgen.workload.spec import SloTargets

NS_PER_MS = 1_000_000
CHAT = SloTargets(ttft_ms=500, tpot_ms=50, percentile=99)
DAY = timedelta(days=1)


def day(n: int, hour: int = 2) -> datetime:
    """March n, 2026 at `hour`:00 UTC (a nightly run's t0)."""
    return datetime(2026, 3, n, hour, tzinfo=UTC)


# Nightly runs as the results store holds them: class chat at 4 req/s, with histograms.
write_run = partial(builders.write_run, slos={"chat": CHAT}, rate_per_s=4.0, histograms=True)
# Five tokens 20 ms apart; these records keep no send times and end at their last token.
stream = partial(builders.streamed_record, gaps_ms=(20.0,) * 4, end_after_ms=0.0, sent=False)
failure = partial(builders.failed_record, end_after_ms=0.0, sent=False)


def same_ttft(n: int, ttft_ms: float, *, start: int = 0) -> list[RequestRecord]:
    """n ok requests, one every 0.1 s, all with the same TTFT."""
    return [stream(start + i, intended_ms=i * 100.0, ttft_ms=ttft_ms) for i in range(n)]


def noisy(seed: int, n: int = 400) -> list[RequestRecord]:
    """Lognormal TTFT and gaps, 1-20 tokens, about 2 % failures, over ~3 minutes."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        intended_ms, ttft_ms = rng.uniform(0, 200) * 1000, rng.lognormvariate(5.5, 0.7)
        tokens, gap_ms = rng.randint(1, 20), rng.lognormvariate(3.0, 0.4)
        if rng.random() < 0.02:
            records.append(failure(i, intended_ms=intended_ms, outcome=Outcome.TIMEOUT_STALL))
        else:
            records.append(stream(i, intended_ms=intended_ms, ttft_ms=ttft_ms,
                                  gaps_ms=(gap_ms,) * (tokens - 1)))  # fmt: skip
    return records


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("1d", DAY),
        ("90m", timedelta(minutes=90)),
        ("1d12h", timedelta(hours=36)),
        ("2w", timedelta(days=14)),
        (" 45s ", timedelta(seconds=45)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    """Durations are whole numbers with s/m/h/d/w units, combinable."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "1.5d", "-1d", "0d", "30 days", "1y"])
def test_parse_duration_rejects_nonsense(text: str) -> None:
    """Anything else is a ConfigError on --window that says what would be read."""
    with pytest.raises(ConfigError, match="--window"):
        parse_duration(text)


def test_histogram_windows_agree_with_exact_records(tmp_path: Path) -> None:
    """Over three noisy runs, every windowed percentile is within 0.1 % of the exact one."""
    records = {n: noisy(n) for n in (1, 2, 3)}
    for n, recs in records.items():
        write_run(tmp_path, day(n), recs)
    frame = rolling_windows(tmp_path, window=2 * DAY, step=DAY, exact=True)
    assert frame.height == 3
    assert frame.get_column("max_rel_diff").max() < 1e-3  # type: ignore[operator]
    last = frame.row(-1, named=True)  # March 3-4: runs 2 and 3
    pooled = per_request(to_frame(records[2] + records[3]), slos={"chat": CHAT})
    assert last["requests"] == pooled.height
    assert last["failures"] == pooled.filter(pl.col("outcome") != "ok").height
    assert last["meets_slo"] == pooled.get_column("meets_slo").sum()
    assert last["runs"] == 2


def test_a_window_pools_requests_rather_than_averaging_runs(tmp_path: Path) -> None:
    """1,000 requests at 100 ms and 10 at 1 s pool to a p99 of 100 ms; the mean of the two
    runs' p99s would be 550 ms."""
    write_run(tmp_path, day(1), same_ttft(1000, 100.0))
    write_run(tmp_path, day(2), same_ttft(10, 1000.0))
    frame = rolling_windows(tmp_path, window=2 * DAY, step=DAY)
    per_run = [r["ttft_ms_p99"] for r in frame.head(2).iter_rows(named=True)]
    assert per_run[0] == pytest.approx(100.0, rel=1e-3)
    pooled = frame.row(1, named=True)
    assert pooled["requests"] == 1010
    assert pooled["ttft_ms_p99"] == pytest.approx(100.0, rel=1e-3)
    single = rolling_windows(tmp_path, window=DAY, step=DAY).row(1, named=True)
    assert single["ttft_ms_p99"] == pytest.approx(1000.0, rel=1e-3)
    assert pooled["ttft_ms_p99"] != pytest.approx((per_run[0] + single["ttft_ms_p99"]) / 2)


def test_runs_without_histograms_fall_back_to_records(tmp_path: Path) -> None:
    """Deleting one run's histograms.parquet changes no figure, and the window names that run."""
    for n in (1, 2):
        write_run(tmp_path, day(n), noisy(n))
    before = rolling_windows(tmp_path, window=2 * DAY, step=DAY)
    removed = next(tmp_path.glob(f"*/{HISTOGRAMS_FILE}"))
    removed.unlink()
    after = rolling_windows(tmp_path, window=2 * DAY, step=DAY)
    assert after.drop("fallback_runs").equals(before.drop("fallback_runs"))
    assert after.get_column("fallback_runs").to_list()[-1] == [removed.parent.name]
    assert before.get_column("fallback_runs").to_list() == [[], []]


def test_windows_step_over_the_dates(tmp_path: Path) -> None:
    """Runs on March 1, 2 and 4: daily windows end at every midnight, an empty day included."""
    for n in (1, 2, 4):
        write_run(tmp_path, day(n), same_ttft(10, 100.0 * n))
    one_day = rolling_windows(tmp_path, window=DAY, step=DAY)
    ends = one_day.get_column("window_end").to_list()
    assert ends == [datetime(2026, 3, n, tzinfo=UTC) for n in (2, 3, 4, 5)]
    assert one_day.get_column("window_start").to_list() == [e - DAY for e in ends]
    assert one_day.get_column("requests").to_list() == [10, 10, 0, 10]
    assert one_day.row(2, named=True)["ttft_ms_p50"] is None
    two_days = rolling_windows(tmp_path, window=2 * DAY, step=DAY)
    assert two_days.get_column("runs").to_list() == [1, 2, 1, 1]
    assert two_days.row(2, named=True)["ttft_ms_p99"] == pytest.approx(200.0, rel=1e-3)
    ending = rolling_windows(tmp_path, window=2 * DAY, step=DAY, end=datetime(2026, 3, 3, 12))
    assert ending.get_column("window_end").to_list()[-1] == datetime(2026, 3, 3, 12, tzinfo=UTC)
    assert ending.get_column("requests").to_list() == [10, 20, 10]


def test_failures_count_against_attainment_and_rank_worst(tmp_path: Path) -> None:
    """98 ok at 100 ms and 2 timeouts: attainment 98 %, p99 over ok 100 ms, p99 with failures
    +inf (null in JSON, "fail" in the table)."""
    records = [
        *same_ttft(98, 100.0),
        failure(98, intended_ms=1000.0, outcome=Outcome.TIMEOUT_FIRST_TOKEN),
        failure(99, intended_ms=2000.0, outcome=Outcome.REJECTED),
    ]
    write_run(tmp_path, day(1), records)
    row = rolling_windows(tmp_path, window=DAY, step=DAY).row(0, named=True)
    assert (row["requests"], row["failures"], row["attainment"]) == (100, 2, 0.98)
    assert row["outcomes"]["rejected"] == 1
    assert row["ttft_ms_p99"] == pytest.approx(100.0, rel=1e-3)
    assert math.isinf(row["ttft_ms_with_failures_p99"])
    assert row["ttft_ms_with_failures_p50"] == pytest.approx(100.0, rel=1e-3)
    frame = rolling_windows(tmp_path, window=DAY, step=DAY)
    assert to_json(frame)[0]["ttft_ms_with_failures_p99"] is None
    json.dumps(to_json(frame), allow_nan=False)
    console = Console(width=160, record=True)
    console.print(render_rolling_table(frame))
    assert "fail" in console.export_text()


def test_class_filter_and_unknown_class(tmp_path: Path) -> None:
    """`class_name` keeps one class; a class no run has is a ConfigError listing the classes."""
    write_run(tmp_path, day(1), [*same_ttft(5, 100.0), stream(5, ttft_ms=50.0, class_name="agent")])
    frame = rolling_windows(tmp_path, window=DAY, step=DAY, class_name="agent")
    assert frame.get_column("class").to_list() == ["agent"]
    with pytest.raises(ConfigError, match="agent, chat"):
        rolling_windows(tmp_path, window=DAY, step=DAY, class_name="batch")


def test_windows_must_be_whole_minutes(tmp_path: Path) -> None:
    """A step finer than the per-minute histograms is refused."""
    write_run(tmp_path, day(1), same_ttft(5, 100.0))
    with pytest.raises(ConfigError, match="--step"):
        rolling_windows(tmp_path, window=DAY, step=timedelta(seconds=30))


def test_three_workloads_with_a_class_named_chat_are_never_pooled(tmp_path: Path) -> None:
    """chat-smoke, the same at 3x the rate, and mixed, each with a class "chat": one row per
    workload and window, each holding exactly its own runs' requests and their p50 (100, 300,
    900 ms; pooled they would give one p50 of 300 ms); the JSON names each workload."""
    write_run(tmp_path, day(1, 1), same_ttft(100, 100.0), workload="chat-smoke")
    write_run(tmp_path, day(1, 2), same_ttft(50, 100.0), workload="chat-smoke")
    write_run(tmp_path, day(1, 3), same_ttft(80, 300.0), workload="chat-smoke", rate_per_s=12.0)
    write_run(tmp_path, day(1, 4), same_ttft(60, 900.0), workload="mixed")
    frame = rolling_windows(tmp_path, window=DAY, step=DAY)
    rows = {r["workload"].split("@")[0] + f" {r['requests']}": r for r in to_json(frame)}
    assert sorted(rows) == ["chat-smoke 150", "chat-smoke 80", "mixed 60"]
    assert {r["class"] for r in rows.values()} == {"chat"}
    assert [rows[k]["ttft_ms_p50"] for k in ("chat-smoke 150", "chat-smoke 80", "mixed 60")] == [
        pytest.approx(100.0, rel=1e-3), pytest.approx(300.0, rel=1e-3), pytest.approx(900.0, rel=1e-3)
    ]  # fmt: skip
    assert rows["chat-smoke 150"]["runs"] == 2
    assert len({r["workload"] for r in rows.values()}) == 3
    chosen = rolling_windows(tmp_path, window=DAY, step=DAY, workload="mixed")
    assert chosen.get_column("requests").to_list() == [60]
    key = rows["chat-smoke 80"]["workload"]
    assert rolling_windows(tmp_path, window=DAY, step=DAY, workload=key)["requests"].to_list() == [
        80
    ]
    by_name = rolling_windows(tmp_path, window=DAY, step=DAY, workload="chat-smoke")
    assert sorted(by_name.get_column("requests").to_list()) == [80, 150]  # two workloads, two rows
    with pytest.raises(ConfigError, match="workloads found: chat-smoke@"):
        rolling_windows(tmp_path, window=DAY, step=DAY, workload="agent")
    console = Console(width=200, record=True)
    console.print(render_rolling_table(frame))
    assert "mixed@" in console.export_text()


def test_runs_that_stopped_early_are_left_out_unless_asked(tmp_path: Path) -> None:
    """An interrupted and a recovered run (their p50 1 s) do not count in the window; with
    include_incomplete they do; a store of only stopped runs says how to include them."""
    write_run(tmp_path, day(1, 1), same_ttft(100, 100.0))
    write_run(tmp_path, day(1, 2), same_ttft(40, 1000.0), stopped="interrupted")
    write_run(tmp_path, day(1, 3), same_ttft(40, 1000.0), stopped="incomplete")
    row = rolling_windows(tmp_path, window=DAY, step=DAY).row(0, named=True)
    assert (row["requests"], row["runs"]) == (100, 1)
    assert row["ttft_ms_p50"] == pytest.approx(100.0, rel=1e-3)
    row = rolling_windows(tmp_path, window=DAY, step=DAY, include_incomplete=True).row(
        0, named=True
    )
    assert (row["requests"], row["runs"]) == (180, 3)
    only_stopped = tmp_path / "stopped"
    write_run(only_stopped, day(1, 2), same_ttft(40, 1000.0), stopped="watchdog")
    with pytest.raises(ConfigError, match="--include-incomplete"):
        rolling_windows(only_stopped, window=DAY, step=DAY)


def test_plot_is_a_png(tmp_path: Path) -> None:
    """The plot renders to PNG bytes, failures and empty windows included."""
    for n in (1, 3):
        write_run(
            tmp_path,
            day(n),
            [
                *same_ttft(50, 100.0 * n),
                failure(50, intended_ms=1000.0, outcome=Outcome.TIMEOUT_TOTAL),
            ],
        )
    frame = rolling_windows(tmp_path, window=DAY, step=DAY)
    assert rolling_plot(frame, slo_ms={"chat": CHAT}).startswith(b"\x89PNG")
    assert rolling_plot(frame, slo_ms={}, metric="itl").startswith(b"\x89PNG")


def args_of(store: Path) -> list[str]:
    """`loadgen report STORE` over one-day windows."""
    return ["report", str(store), "--window", "1d", "--step", "1d"]


def test_report_store_cli_selects_a_workload_and_names_what_it_left_out(tmp_path: Path) -> None:
    """`report STORE --workload NAME --format json` has only that workload's rows, each naming
    it; the table says which runs were left out, and why: one stopped early, one whose
    generator fell behind (its 900 ms would have lifted chat-smoke's p50 to 900)."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    write_run(tmp_path, day(1, 1), same_ttft(30, 100.0), workload="chat-smoke")
    write_run(tmp_path, day(1, 2), same_ttft(20, 900.0), workload="mixed")
    stopped = write_run(tmp_path, day(1, 3), same_ttft(5, 100.0), workload="chat-smoke",
                        stopped="interrupted")  # fmt: skip
    behind = write_run(tmp_path, day(1, 4), same_ttft(40, 900.0), workload="chat-smoke",
                       fell_behind="a test's reason")  # fmt: skip
    pooled = json.loads(CliRunner().invoke(
        cli, [*args_of(tmp_path), "--workload", "chat-smoke", "--format", "json"]).stdout)  # fmt: skip
    assert [(r["runs"], r["requests"]) for r in pooled] == [(1, 30)]
    args = args_of(tmp_path)
    result = CliRunner().invoke(cli, [*args, "--workload", "mixed", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["workload"].split("@")[0], r["requests"]) for r in rows] == [("mixed", 20)]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert (
        "left out, no measure of the server (--include-incomplete pools them): "
        f"{stopped.name} (stopped before its end (interrupted)); {behind.name} (the generator "
        "fell behind: a test's reason)" in said
    )
    result = CliRunner().invoke(cli, [*args, "--workload", "agent"])
    assert result.exit_code == 1
    assert "workloads found" in result.stderr


def test_a_windows_percentiles_carry_bounds_from_the_merged_histograms(tmp_path: Path) -> None:
    """Two noisy runs pooled in one window: each failures-worst percentile's bounds are the
    pooled records' exact order-statistic bounds at 95 % (ranks over every request of
    the window, failures worst), at bucket resolution (low within 0.1 % below, high within
    0.1 % above); a one-run window of 10 requests leaves a p99 bound open (null)."""
    import numpy as np

    from loadgen.analysis.confidence import judge_percentile

    records = noisy(1) + [replace_id(r, 1000) for r in noisy(2)]
    write_run(tmp_path, day(1), records)
    write_run(tmp_path, day(3), same_ttft(10, 100.0))
    frame = rolling_windows(tmp_path, window=DAY, step=DAY)
    row = frame.row(0, named=True)
    rows = per_request(to_frame(records), slos={"chat": CHAT})
    ok = rows.filter(pl.col("outcome") == "ok")
    ttft = np.sort(ok.get_column("ttft_ms").to_numpy())
    failures = rows.height - ok.height
    for p in (50, 90, 99):
        exact = judge_percentile(ttft, float(p), 1.0, 0.95, failures=failures)
        low, high = row[f"ttft_ms_with_failures_p{p}_low"], row[f"ttft_ms_with_failures_p{p}_high"]
        assert exact.low is not None
        assert exact.high is not None
        assert exact.low * 0.999 - 0.001 <= low <= exact.low, (p, low, exact.low)
        if math.isinf(exact.high):  # on a failure: +inf, as the percentile itself would be
            assert math.isinf(high)
            continue
        assert exact.high <= high <= exact.high * 1.001 + 0.001, (p, high, exact.high)
        assert low <= row[f"ttft_ms_with_failures_p{p}"] <= high
    assert math.isinf(row["ttft_ms_with_failures_p99_high"])  # ~2 % failed: p99's upper bound
    short = frame.filter(pl.col("requests") == 10).row(0, named=True)
    assert short["ttft_ms_with_failures_p99_high"] is None  # 10 requests bound no p99: open
    assert to_json(frame.head(1))[0]["ttft_ms_with_failures_p99_high"] is None  # inf in JSON
    assert short["ttft_ms_with_failures_p50_high"] == pytest.approx(100.0, rel=1e-3)


def replace_id(record: RequestRecord, offset: int) -> RequestRecord:
    """The record with its request id moved by `offset` (two runs' records in one run)."""
    from dataclasses import replace

    return replace(record, request_id=record.request_id + offset)


def test_each_run_is_a_point_with_its_own_figures(tmp_path: Path) -> None:
    """Three runs in one day (TTFT 100, 200 and 300 ms, the last with 1 failure in 10): one
    window pools them, and each run keeps a row of its own requests and percentiles, oldest
    first (the plot drew a single dot for the five runs of one window)."""
    write_run(tmp_path, day(1, 1), same_ttft(20, 100.0))
    write_run(tmp_path, day(1, 2), same_ttft(20, 200.0))
    write_run(tmp_path, day(1, 3), [*same_ttft(9, 300.0),
                                    failure(9, intended_ms=900.0, outcome=Outcome.REJECTED)])  # fmt: skip
    view = rolling_view(tmp_path, window=DAY, step=DAY)
    assert view.windows.get_column("requests").to_list() == [50]
    runs = view.runs
    assert runs.get_column("requests").to_list() == [20, 20, 10]
    assert runs.get_column("failures").to_list() == [0, 0, 1]
    assert runs.get_column("ttft_ms_p50").to_list() == [
        pytest.approx(100.0, rel=1e-3), pytest.approx(200.0, rel=1e-3), pytest.approx(300.0, rel=1e-3)
    ]  # fmt: skip
    assert math.isinf(runs.row(2, named=True)["ttft_ms_with_failures_p99"])
    assert runs.get_column("run_started").to_list() == [day(1, 1), day(1, 2), day(1, 3)]
    assert rolling_view(tmp_path, window=DAY, step=DAY, class_name=["chat"]).runs.height == 3


def test_the_table_and_the_plot_show_the_same_percentile_and_every_run(tmp_path: Path) -> None:
    """With a p90 SLO the table's p column says p90 and its TTFT cell is the window's p90
    (the table showed p50/p99 while the plot drew p90); the plot draws p90 too, the windows
    as a line and the five runs of one window as five points."""
    p90 = SloTargets(ttft_ms=500, tpot_ms=50, percentile=90)
    for hour in range(1, 6):
        write_run(tmp_path, day(1, hour), same_ttft(20, 100.0 * hour), slos={"chat": p90})
    view = rolling_view(tmp_path, window=DAY, step=DAY)
    window = view.windows.row(0, named=True)
    console = Console(width=200, record=True)
    console.print(render_rolling_table(view.windows, {"chat": p90}))
    row = next(line for line in console.export_text().splitlines() if " chat " in line)
    shown = f"{fmt_ms(window['ttft_ms_p90'])}/{fmt_ms(window['ttft_ms_with_failures_p90'])}"
    assert " p90 " in row
    assert shown in row
    figure = rolling_figure(view.windows, slo_ms={"chat": p90}, runs=view.runs)
    top = figure.axes[0]
    labels = [line.get_label() for line in top.get_lines()]
    assert "chat p90 (all), windows" in labels
    assert not any("p99" in label or "p50" in label for label in labels)
    each_run = next(line for line in top.get_lines() if line.get_label().endswith("each run"))
    assert len(each_run.get_xdata()) == 5
    assert list(each_run.get_ydata()) == [
        pytest.approx(v, rel=1e-3) for v in view.runs.get_column("ttft_ms_with_failures_p90")
    ]


def test_report_store_writes_its_page_beside_not_into_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report STORE` writes rolling-report/ in the current folder (it wrote it into the
    store), with an HTML page and its Markdown twin holding the windows and every run;
    `--class` may be given twice, as `compare --class`."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    store = tmp_path / "store"
    for n in (1, 2):
        write_run(store, day(n), [*same_ttft(10, 100.0 * n),
                                  stream(10, ttft_ms=50.0, class_name="agent")])  # fmt: skip
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = CliRunner().invoke(cli, ["report", str(store), "--class", "chat", "--class", "agent"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith("2026")) == []
    written = sorted(p.name for p in (here / "rolling-report").iterdir())
    assert written == ["rolling-tpot.png", "rolling-ttft.png", "rolling.html", "rolling.json",
                       "rolling.md"]  # fmt: skip
    page = (here / "rolling-report" / "rolling.html").read_text()
    assert "Runs (each a point on the plots)" in page
    windows, runs = page.split("Runs (each a point on the plots)")
    assert windows.count("<tr><td>2026-03-0") == 2 * 2  # two window ends, two classes
    assert runs.count("<tr><td>2026-03-0") == 2 * 2  # two runs, two classes
    assert windows.count("data:image/png;base64,") == 2  # the plots, inline
    markdown = (here / "rolling-report" / "rolling.md").read_text()
    assert "![TTFT over the windows" in markdown
    assert "(rolling-ttft.png)" in markdown


def test_a_log_latency_axis_reads_in_plain_numbers(tmp_path: Path) -> None:
    """Runs 100x apart put the latency axis on a log scale; its ticks are plain numbers
    (text is drawn as written, so matplotlib's own log ticks read `$\\mathdefault{10^{2}}$`)."""
    p90 = SloTargets(ttft_ms=5000, tpot_ms=50, percentile=90)
    for hour, ttft in ((1, 10.0), (2, 1000.0)):
        write_run(tmp_path, day(1, hour), same_ttft(20, ttft), slos={"chat": p90})
    view = rolling_view(tmp_path, window=DAY, step=DAY)
    figure = rolling_figure(view.windows, slo_ms={"chat": p90}, runs=view.runs)
    figure.canvas.draw()
    top = figure.axes[0]
    assert top.get_yscale() == "log"
    ticks = [t.get_text() for t in top.get_yticklabels() if t.get_text()]
    assert ticks
    assert all("$" not in t for t in ticks), ticks
