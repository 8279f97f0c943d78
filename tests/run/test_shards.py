"""`run --shard i/N --start-at T` and `loadgen merge`: N shards are one run, aligned on T."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.confidence import order_statistic_ranks
from loadgen.analysis.minutes import build_histograms, load_histograms
from loadgen.cli import cli
from loadgen.errors import ConfigError
from loadgen.results.runfolder import SERVER_METRICS_SCHEMA, read_records
from loadgen.results.write import write_server_metrics
from loadgen.run.processes.simulator import running_sim
from loadgen.testing.builders import workload_file
from loadgen.workload.plans import plan_work
from loadgen.workload.shards import Share, check_start_at, parse_share, parse_start_at, share_ids
from loadgen.workload.spec import load

WORKLOAD = """
name: shards
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 40}
    requests: 100
    prompt_tokens: {dist: uniform, min: 20, max: 200}
    output_tokens: {dist: fixed, value: 10}
    slo: {ttft_ms: 2000, tpot_ms: 200, percentile: 80}
"""  # p80: each shard's 25 requests judge it at 95 % (14 would; a p90 needs 29)
SHARDS = 4
PLAN_COLUMNS = ["request_id", "class", "prompt_tokens_target", "max_tokens"]


@pytest.mark.parametrize(
    ("text", "share"), [("0/1", Share(0, 1)), ("3/4", Share(3, 4)), (" 1/2", Share(1, 2))]
)
def test_shard_text_is_index_from_zero_over_count(text: str, share: Share) -> None:
    """`i/N` counts i from 0, as JOB_COMPLETION_INDEX does."""
    assert parse_share(text) == share


@pytest.mark.parametrize("text", ["4/4", "1", "-1/2", "a/b", "1/0"])
def test_a_bad_shard_is_a_config_error(text: str) -> None:
    """Anything but 0 <= i < N is refused with the fix."""
    with pytest.raises(ConfigError, match="i/N"):
        parse_share(text)


def test_start_at_accepts_unix_seconds_and_iso_8601() -> None:
    """Unix seconds, ISO with Z, and ISO without an offset (UTC) name the same instant."""
    expected = int(datetime(2026, 11, 29, 12, tzinfo=UTC).timestamp()) * 1_000_000_000
    assert parse_start_at(str(expected // 1_000_000_000)) == expected
    assert parse_start_at("2026-11-29T12:00:00Z") == expected
    assert parse_start_at("2026-11-29T12:00:00") == expected
    assert parse_start_at("2026-11-29T13:00:00+01:00") == expected
    with pytest.raises(ConfigError, match="ISO 8601"):
        parse_start_at("tomorrow")


def test_a_start_in_the_past_is_refused_and_a_future_one_is_waited_for() -> None:
    """More than a second ago: a clear error; ahead: the seconds to wait."""
    now = 1_000_000_000_000_000_000
    assert check_start_at(now + 2_500_000_000, now) == 2.5
    assert check_start_at(now - 500_000_000, now) == -0.5  # a little late is accepted
    with pytest.raises(ConfigError, match=r"was 5\.0 s ago"):
        check_start_at(now - 5_000_000_000, now)


def loadgen_run(workload: Path, url: str, out: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "loadgen", "run", str(workload), "--url", url, "--out",
            str(out), "--run-id", run_id, "-q", "--no-preflight", "--lag-bound-ms", "1000",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """One simulator; an unsharded run, then 4 shards launched together with one start,
    merged. Returns (unsharded run, merged run, shard runs)."""
    tmp = tmp_path_factory.mktemp("shards")
    workload = workload_file(tmp, WORKLOAD)
    with running_sim() as sim:
        subprocess.run(loadgen_run(workload, sim.url, tmp, "whole"), check=True, timeout=120)
        start = f"{time.time() + 10:.3f}"  # time for four interpreters to start on a busy host
        shards = [
            subprocess.Popen(
                loadgen_run(
                    workload,
                    sim.url,
                    tmp / "shards",
                    f"s{i}",
                    "--shard",
                    f"{i}/{SHARDS}",
                    "--start-at",
                    start,
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for i in range(SHARDS)
        ]
        for process in shards:
            _, stderr = process.communicate(timeout=110)
            assert process.returncode == 0, stderr.decode()[-2000:]
    dirs = [tmp / "shards" / f"s{i}" for i in range(SHARDS)]
    result = CliRunner().invoke(cli, ["merge", *map(str, dirs), "--out", str(tmp), "--run-id", "m"])
    assert result.exit_code == 0, result.output
    return tmp / "whole", tmp / "m", dirs


@pytest.mark.slow  # four shards and an unsharded run: ~20 s on 2 cores
def test_merge_writes_the_merged_runs_checks_as_junit_and_markdown(
    sharded: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """`merge --junit --markdown` (as `run` has them): the merged run's checks, one testsuite
    per class and the generator's, and the Markdown table with its verdict."""
    _, _, dirs = sharded
    junit, markdown = tmp_path / "slo.xml", tmp_path / "slo.md"
    result = CliRunner().invoke(cli, ["merge", *map(str, dirs), "--out", str(tmp_path), "--run-id",
                                      "again", "--junit", str(junit), "--markdown", str(markdown)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"wrote {junit}" in " ".join(result.output.split())
    root = ET.fromstring(junit.read_text())
    assert root.get("name") == "loadgen run again"
    assert "run.generator" in [s.get("name") for s in root.iter("testsuite")]
    assert markdown.read_text().startswith("### loadgen run: SLO MET (exit 0)")


@pytest.mark.slow  # four shards and an unsharded run: ~20 s on 2 cores
def test_merged_shards_hold_the_unsharded_plan(sharded: tuple[Path, Path, list[Path]]) -> None:
    """ids, classes and token counts equal the unsharded run's; intended times equal it after
    removing each shard's measured t0 offset."""
    whole_dir, merged_dir, _ = sharded
    whole, merged = pl.read_parquet(whole_dir / "records.parquet"), read_records(merged_dir)
    assert merged.select(PLAN_COLUMNS).equals(whole.select(PLAN_COLUMNS))
    info = json.loads((merged_dir / "run.json").read_text())
    table = info["shards"]
    assert [row["index"] for row in table["shards"]] == list(range(SHARDS))
    work = plan_work(load(whole_dir.parent / "w.yaml"))
    offset_ns = {}
    for row in table["shards"]:
        for request_id in share_ids(work, Share(row["index"], SHARDS)):
            offset_ns[request_id] = row["t0_unix_ns"] - table["start_at_unix_ns"]
    offsets = pl.Series([offset_ns[i] for i in merged["request_id"]])
    assert (merged["intended_ns"] - offsets).equals(whole["intended_ns"])
    assert table["max_abs_skew_ms"] < 1000  # one host: anchors are µs-ms apart
    summary = json.loads((merged_dir / "summary.json").read_text())
    assert summary["generator"]["planned"] == summary["generator"]["recorded"] == whole.height


@pytest.mark.slow  # four shards and an unsharded run: ~20 s on 2 cores
def test_merged_percentiles_agree_with_the_unsharded_run(
    sharded: tuple[Path, Path, list[Path]],
) -> None:
    """TTFT and TPOT p50/p90 of the merged shards lie within each other's 99 % order-statistic
    intervals of the unsharded run's (same schedule, same server), give or take the client
    delay each run measured: four shard processes on a busy 2-core host start their sends
    (and read their tokens) later than one process does, which is the host's, not the
    merge's. That slack is the larger p99 send lag (sent - intended) of the two runs; a
    token read late by at most it moves a TPOT by at most it / (tokens - 1)."""
    whole_dir, merged_dir, _ = sharded
    frames = [read_records(d).filter(pl.col("outcome") == "ok") for d in (whole_dir, merged_dir)]
    lags = [np.percentile((f["sent_ns"] - f["intended_ns"]).to_numpy(), 99) for f in frames]
    slack_ns = {
        "ttft": max(lags),
        "tpot": max(lags) / (min(f["output_tokens"].min() for f in frames) - 1),
    }
    for metric in ("ttft", "tpot"):
        samples = []
        for frame in frames:
            ttft = frame["first_token_ns"] - frame["intended_ns"]
            tpot = (frame["last_token_ns"] - frame["first_token_ns"]) / (frame["output_tokens"] - 1)
            samples.append(np.sort((ttft if metric == "ttft" else tpot).to_numpy()))
        for q in (0.5, 0.9):
            intervals = []
            for values in samples:
                low, high = order_statistic_ranks(values.size, q, 0.99)
                intervals.append((values[max(low, 1) - 1], values[min(high, values.size) - 1]))
            (a_low, a_high), (b_low, b_high) = intervals
            said = (
                metric,
                q,
                intervals,
                f"slack {slack_ns[metric] / 1e6:.2f} ms from p99 send lags "
                f"{lags[0] / 1e6:.2f} (unsharded), {lags[1] / 1e6:.2f} ms (merged)",
            )
            assert a_low - slack_ns[metric] <= b_high, said
            assert b_low - slack_ns[metric] <= a_high, said


@pytest.mark.slow  # four shards and an unsharded run: ~20 s on 2 cores
def test_merged_histograms_equal_those_of_the_merged_records(
    sharded: tuple[Path, Path, list[Path]],
) -> None:
    """The merged folder's histograms.parquet is what its records give on its t0."""
    _, merged_dir, _ = sharded
    info = json.loads((merged_dir / "run.json").read_text())
    stored = load_histograms(merged_dir)
    assert stored is not None
    again = build_histograms(read_records(merged_dir), t0_unix_ns=info["t0"]["unix_ns"], slos=None)
    columns = ["class", "minute_start_unix_ns", "requests", "ok", "ttft", "tpot", "itl", "e2e"]
    assert stored.select(columns).equals(again.select(columns))
    report = CliRunner().invoke(cli, ["report", str(merged_dir), "--format", "json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["generator"]["recorded"] == read_records(merged_dir).height


@pytest.mark.slow  # four shards and an unsharded run: ~20 s on 2 cores
def test_merge_refuses_folders_that_are_not_the_n_shards_of_one_run(
    sharded: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """A missing shard, a repeated one, another seed and a run that is no shard: exit 1,
    and every problem is listed."""
    whole_dir, _, dirs = sharded
    copies = []
    for source in dirs:
        target = tmp_path / source.name
        shutil.copytree(source, target)
        copies.append(target)
    info_path = copies[1] / "run.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "seed": 99}))
    args = ["merge", str(copies[0]), str(copies[0]), str(copies[1]), str(whole_dir),
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    said = result.output
    for problem in ("different seeds", "shard 0/4 given 2 times", "missing shard(s) 2, 3 of 4",
                    "not a shard"):  # fmt: skip
        assert problem in said, said
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~17 s on 2 cores: left to .ci/run's second part
def test_a_merge_with_a_recovered_shard_is_incomplete_and_judges_nothing(
    sharded: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """One shard recovered after a kill makes the merged run incomplete: exit 5, verdict
    "incomplete", no slo_met; an interrupted one makes it interrupted (130)."""
    _, _, dirs = sharded
    for stop, code in (({"recovered": True, "stopped": "incomplete"}, 5),
                       ({"interrupted": True, "stopped": "interrupted"}, 130)):  # fmt: skip
        copies = []
        for source in dirs:
            target = tmp_path / str(code) / source.name
            shutil.copytree(source, target)
            copies.append(target)
        info_path = copies[2] / "run.json"
        info_path.write_text(json.dumps({**json.loads(info_path.read_text()), **stop}))
        args = ["merge", *map(str, copies), "--out", str(tmp_path / str(code)), "--run-id", "m"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == code, result.output
        summary = json.loads((tmp_path / str(code) / "m" / "summary.json").read_text())
        assert summary["verdict"]["status"] == stop["stopped"]
        assert summary["verdict"]["slo_met"] is None


@pytest.mark.slow  # reuses the four shards of the module's fixture
def test_a_merge_keeps_one_shards_scrape_whole_rows_and_tally_together(
    sharded: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """Shard 0's scrapes were all refused (401: no rows), shard 1's kept rows: the merged
    run keeps shard 1's rows and shard 1's run.json tally (not shard 0's tally beside
    shard 1's rows); with no shard's rows, shard 0's refusal and its note are kept."""
    _, _, dirs = sharded
    copies = []
    for source in dirs:
        shutil.copytree(source, tmp_path / source.name)
        copies.append(tmp_path / source.name)
    refused = {"url": "http://gpu/metrics", "interval_s": 1.0, "scrapes": 0, "failures": 7,
               "malformed_lines": 0, "last_error": "ScrapeError: HTTP 401 Unauthorized",
               "access": {"failed_by": {"unauthorized": 7}, "problem": "7 of 7 failed: 401",
                          "problem_kind": "unauthorized", "problem_status": 401}}  # fmt: skip
    kept = {**refused, "scrapes": 3, "failures": 0, "last_error": None, "access": {}}
    for copy, block in ((copies[0], refused), (copies[1], kept)):
        path = copy / "run.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "server_metrics": block}))
    rows = pl.DataFrame({"t_ns": [5_000_000, 10_000_000, 15_000_000],  # inside the run
                         "name": ["vllm:num_requests_waiting"] * 3,
                         "labels": [[]] * 3, "value": [1.0, 4.0, 2.0]})  # fmt: skip
    write_server_metrics(copies[1], rows.cast(SERVER_METRICS_SCHEMA))  # type: ignore[arg-type]
    result = CliRunner().invoke(cli, ["merge", *map(str, copies), "--out", str(tmp_path / "out"),
                                      "--run-id", "m"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = json.loads((tmp_path / "out" / "m" / "summary.json").read_text())["server"]
    assert (server["scrapes"], server["failures"]) == (3, 0)
    assert server["gauges"]["queue_depth"]["max"] == 4
    (copies[1] / "server_metrics.parquet").unlink()
    result = CliRunner().invoke(cli, ["merge", *map(str, copies), "--out", str(tmp_path / "none"),
                                      "--run-id", "m"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = json.loads((tmp_path / "none" / "m" / "summary.json").read_text())["server"]
    assert (server["scrapes"], server["failures"]) == (0, 7)
    assert server["access"]["problem_kind"] == "unauthorized"


@pytest.mark.slow  # reuses the four shards of the module's fixture
def test_a_merge_keeps_the_scrape_that_spans_the_longest_stretch_of_the_run(
    sharded: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """Shards end at different times. Shard 1 scraped from 5 to 15 ms, shard 2 from 5 to
    60 ms (its streams ran longer): the merged run keeps shard 2's rows and tally, not the
    first shard's shorter window; with equal spans, the first."""
    _, _, dirs = sharded
    copies = []
    for source in dirs:
        shutil.copytree(source, tmp_path / source.name)
        copies.append(tmp_path / source.name)
    block = {"url": "http://gpu/metrics", "interval_s": 1.0, "failures": 0,
             "malformed_lines": 0, "last_error": None, "access": {}}  # fmt: skip
    for copy, times, values in ((copies[1], [5, 10, 15], [1.0, 4.0, 2.0]),
                                (copies[2], [5, 10, 15, 60], [1.0, 4.0, 2.0, 9.0])):  # fmt: skip
        path = copy / "run.json"
        info = {**json.loads(path.read_text()), "server_metrics": {**block, "scrapes": len(times)}}
        path.write_text(json.dumps(info))
        rows = pl.DataFrame({"t_ns": [t * 1_000_000 for t in times],
                             "name": ["vllm:num_requests_waiting"] * len(times),
                             "labels": [[]] * len(times), "value": values})  # fmt: skip
        write_server_metrics(copy, rows.cast(SERVER_METRICS_SCHEMA))  # type: ignore[arg-type]
    result = CliRunner().invoke(cli, ["merge", *map(str, copies), "--out", str(tmp_path / "out"),
                                      "--run-id", "m"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = json.loads((tmp_path / "out" / "m" / "summary.json").read_text())["server"]
    assert server["scrapes"] == 4
    assert server["gauges"]["queue_depth"]["max"] == 9
    shutil.copy(copies[1] / "server_metrics.parquet", copies[2] / "server_metrics.parquet")
    result = CliRunner().invoke(cli, ["merge", *map(str, copies), "--out", str(tmp_path / "eq"),
                                      "--run-id", "m"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = json.loads((tmp_path / "eq" / "m" / "summary.json").read_text())["server"]
    assert server["scrapes"] == 3  # shard 1's block: the first of equal spans
