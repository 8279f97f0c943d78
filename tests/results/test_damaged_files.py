"""Damaged and oddly named run folders: a truncated, garbage or foreign records file, a t0 no
clock can hold, a part of the wrong type, a store under a name with glob characters. Each
gives a clear error naming the file (exit 1, no traceback) or is left out of a pooled read
saying why; `report --recover` keeps every readable part; `merge` refuses a shard whose
records do not cover its plan; `compare` refuses a run still running (exit 6)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from loadgen.cli import cli
from loadgen.results.liveness import run_lock
from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import (
    DAMAGED_DIR,
    HISTOGRAMS_FILE,
    PARTS_DIR,
    RECORDS_FILE,
    RUN_FILE,
)
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import (
    chat_workload,
    streamed_record,
    workload_file,
    write_run,
)
from loadgen.workload.spec import SloTargets

SLO = SloTargets(ttft_ms=500, tpot_ms=50, percentile=50)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def records(count: int = 6, first: int = 0) -> list[RequestRecord]:
    """`count` ok requests, 100 ms apart, ids from `first`."""
    return [streamed_record(first + i, intended_ms=100.0 * i) for i in range(count)]


def nights(store: Path, count: int = 4) -> list[Path]:
    """`count` nightly runs of one workload, a day apart, with their histograms."""
    return [write_run(store, T0 + timedelta(days=i), records(), slos=SLO, rate_per_s=10,
                      run_id=f"n{i}", histograms=True) for i in range(count)]  # fmt: skip


def truncated(run_dir: Path) -> None:
    path = run_dir / RECORDS_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(run_dir: Path) -> None:
    (run_dir / RECORDS_FILE).write_bytes(b"PAR1 not parquet at all " * 8)


def foreign(run_dir: Path) -> None:
    pl.DataFrame({"request_id": ["a", "b"], "x": [1.5, 2.5]}).write_parquet(run_dir / RECORDS_FILE)


def wrong_dtype(run_dir: Path) -> None:
    frame = pl.read_parquet(run_dir / RECORDS_FILE, glob=False)
    frame.with_columns(pl.col("intended_ns").cast(pl.String) + "x").write_parquet(
        run_dir / RECORDS_FILE
    )


def t0_as(raw: str) -> Callable[[Path], None]:
    """run.json's t0.unix_ns written as the JSON text `raw` (2**70, 1e300, Infinity)."""

    def damage(run_dir: Path) -> None:
        path = run_dir / RUN_FILE
        info = json.loads(path.read_text())
        info["t0"]["unix_ns"] = "RAW"
        path.write_text(json.dumps(info).replace('"RAW"', raw))

    return damage


DAMAGE = {
    "truncated records": (truncated, "not a readable Parquet file"),
    "garbage records": (garbage, "not a readable Parquet file"),
    "foreign records": (foreign, "is not a records file: it has no class, intended_ns, outcome"),
    "a column of the wrong type": (wrong_dtype, "its column intended_ns holds String, not Int64"),
    "t0 of 2**70": (t0_as(str(2**70)), "t0.unix_ns is not a 64-bit integer"),
    "t0 of 1e300": (t0_as("1e300"), "t0.unix_ns is not a 64-bit integer"),
    "t0 of Infinity": (t0_as("Infinity"), "t0.unix_ns is not a 64-bit integer"),
}


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return result


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_run_is_a_clear_error_alone_and_left_out_when_pooled(
    kind: str, tmp_path: Path
) -> None:
    """`compare n0 n3`, `report n3` with n3 damaged: exit 1 naming the file and what is wrong
    (were polars tracebacks, or a traceback deep in the rolling report for the t0s); a
    `--baseline-window` and the store's rolling report with n1 damaged leave n1 out, saying
    why, and judge the rest."""
    damage, says = DAMAGE[kind]
    runs = nights(tmp_path / "store")
    damage(runs[3])
    for args in (["compare", str(runs[0]), str(runs[3])], ["report", str(runs[3])]):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        assert says in result.output
        assert str(runs[3]) in result.output
    other = nights(tmp_path / "pooled")
    damage(other[1])
    (other[1] / HISTOGRAMS_FILE).unlink()  # the rolling report reads its records instead
    window = invoke("compare", "--baseline-window", "30d", str(other[3]))
    assert window.exit_code == 0, window.output
    said = " ".join(window.output.split())
    assert (
        "left out of the baseline window (another workload, stopped early, or damaged): n1 ("
        in said
    )
    assert says in said
    rolling = invoke("report", str(tmp_path / "pooled"), "--out", str(tmp_path / "rolled"))
    assert rolling.exit_code == 0, rolling.output
    said = " ".join(rolling.output.split())
    assert "skipped n1 (" in said
    assert says in said


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run `loadgen run` wrote: 6 requests against a scripted server (its run.json holds
    the resolved spec a recovery rebuilds the plan from)."""
    folder = tmp_path_factory.mktemp("real")
    workload = workload_file(folder, chat_workload("damaged", requests=6, rate_per_s=20))
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(workload), "--url", server.url, "--out", str(folder), "--run-id", "r",
            "-q", "--lag-bound-ms", "1000", "--verdict", "point"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder / "r"


def killed_copy(real_run: Path, where: Path, parts: list[Callable[[Path], None]]) -> Path:
    """`real_run` as a run killed after writing one part per entry of `parts` (each writes
    its part file), its records.parquet, summary and histograms gone."""
    run_dir = where / "killed"
    (run_dir / PARTS_DIR).mkdir(parents=True)
    info = json.loads((real_run / RUN_FILE).read_text())
    (run_dir / RUN_FILE).write_text(json.dumps({**info, "finished": False}))
    for write in parts:
        write(run_dir / PARTS_DIR)
    return run_dir


def test_recover_keeps_every_readable_part_and_sets_the_damaged_aside(
    real_run: Path, tmp_path: Path
) -> None:
    """Parts of 2 good records, a truncated part, a part of two columns and a good part of 2:
    `report --recover` exits 5 (was a polars traceback, nothing recovered) with the 4 good
    records kept, the 2 plans of the damaged parts recorded like any unrecorded plan (6 in
    all), each damaged part named with why, and moved to records.damaged/."""
    frame = pl.read_parquet(real_run / RECORDS_FILE, glob=False).sort("request_id")
    parts = [
        lambda d: frame.slice(0, 2).write_parquet(d / "part-000001.parquet"),
        lambda d: (d / "part-000002.parquet").write_bytes(b"PAR1\0\0"),
        lambda d: frame.slice(2, 2).select("request_id", "class").write_parquet(
            d / "part-000003.parquet"),
        lambda d: frame.slice(4, 2).write_parquet(d / "part-000004.parquet"),
    ]  # fmt: skip
    run_dir = killed_copy(real_run, tmp_path, parts)
    result = invoke("report", "--recover", str(run_dir))
    assert result.exit_code == 5, result.output
    recovered = pl.read_parquet(run_dir / RECORDS_FILE, glob=False).sort("request_id")
    assert recovered["request_id"].to_list() == list(range(6))
    assert recovered["outcome"].to_list()[:2] == ["ok", "ok"]
    assert recovered["outcome"].to_list()[4:] == ["ok", "ok"]
    assert set(recovered["outcome"].to_list()[2:4]) <= {"cancelled", "not_sent"}
    said = " ".join(result.output.split())
    assert "skipped part-000002.parquet (kept in records.damaged/)" in said
    assert "skipped part-000003.parquet (kept in records.damaged/)" in said
    assert "it has no intended_ns, outcome column" in said
    assert sorted(p.name for p in (run_dir / DAMAGED_DIR).iterdir()) == [
        "part-000002.parquet", "part-000003.parquet"]  # fmt: skip
    assert not (run_dir / PARTS_DIR).exists()


def shards_of(real_run: Path, where: Path) -> list[Path]:
    """`real_run` split into shards 0/2 (even ids) and 1/2 (odd ids) of one agreed start."""
    info = json.loads((real_run / RUN_FILE).read_text())
    frame = pl.read_parquet(real_run / RECORDS_FILE, glob=False)
    start = info["t0"]["unix_ns"]
    folders = []
    for index in range(2):
        run_dir = where / f"s{index}"
        run_dir.mkdir(parents=True)
        share = frame.filter(pl.col("request_id") % 2 == index)
        share.write_parquet(run_dir / RECORDS_FILE)
        shard = {"index": index, "count": 2, "start_at_unix_ns": start}
        (run_dir / RUN_FILE).write_text(json.dumps({**info, "run_id": f"s{index}", "shard": shard,
                                                    "planned": share.height}))  # fmt: skip
        folders.append(run_dir)
    return folders


def test_merge_refuses_a_shard_whose_records_do_not_cover_its_plan(
    real_run: Path, tmp_path: Path
) -> None:
    """Two shards merge (exit 0, 6 records); with 2 of shard 1's 3 rows gone (was merged, 4
    records for 6 planned, exit 0), or its records damaged (was a polars traceback), merge
    exits 1 naming the shard and what is wrong, and writes nothing."""
    s0, s1 = shards_of(real_run, tmp_path / "whole")
    merged = invoke("merge", str(s0), str(s1), "--out", str(tmp_path / "m"), "--run-id", "ok")
    assert merged.exit_code == 0, merged.output
    assert pl.read_parquet(tmp_path / "m" / "ok" / RECORDS_FILE, glob=False).height == 6
    s0, s1 = shards_of(real_run, tmp_path / "short")
    frame = pl.read_parquet(s1 / RECORDS_FILE, glob=False)
    frame.head(1).write_parquet(s1 / RECORDS_FILE)
    short = invoke("merge", str(s0), str(s1), "--out", str(tmp_path / "m"), "--run-id", "short")
    assert short.exit_code == 1, short.output
    said = " ".join(short.output.split())
    assert (
        f"{s1}: its records.parquet holds 1 distinct request ids in 1 rows for the 3 "
        "requests its run.json planned, so it does not cover its plan"
    ) in said
    assert not (tmp_path / "m" / "short").exists()
    garbage(s1)
    broken = invoke("merge", str(s0), str(s1), "--out", str(tmp_path / "m"), "--run-id", "b")
    assert broken.exit_code == 1, broken.output
    assert f"cannot read {s1 / RECORDS_FILE}: not a readable Parquet file" in " ".join(
        broken.output.split())  # fmt: skip


# -- paths with glob characters are the paths they name ----------------------------------


def test_a_run_folder_with_glob_characters_is_that_folder(real_run: Path, tmp_path: Path) -> None:
    """`--out 'runs[prod]'` (was a polars ComputeError at the join: the records lost) and
    `--out 'runs*'` beside `runsA/` holding a run of the same id (was 12 records for 6
    planned, exit 0): each folder's own records, said with its name as it is."""
    workload = workload_file(tmp_path, chat_workload("globs", requests=3))
    outs = [tmp_path / "runs[prod]", tmp_path / "runsA", tmp_path / "runs*"]
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        results = [CliRunner().invoke(cli, [
            "run", str(workload), "--url", server.url, "--out", str(out), "--run-id", "r",
            "--lag-bound-ms", "1000", "--verdict", "point"]) for out in outs]  # fmt: skip
    for out, result in zip(outs, results, strict=True):
        assert result.exit_code == 0, result.output
        assert pl.read_parquet(out / "r" / RECORDS_FILE, glob=False).height == 3
        assert f"records and summary: {out / 'r'}" in result.output
        summary = json.loads((out / "r" / "summary.json").read_text())
        assert summary["generator"]["recorded"] == 3


def test_a_store_under_glob_characters_reports_and_compares(tmp_path: Path) -> None:
    """A store under `nightly[gpu]/` (was a polars error): its rolling report, a run's
    report (from its records: no histograms) and a comparison work."""
    store = tmp_path / "nightly[gpu]"
    runs = nights(store)
    (runs[3] / HISTOGRAMS_FILE).unlink()
    assert invoke("report", str(store), "--out", str(tmp_path / "rolled")).exit_code == 0
    assert invoke("report", str(runs[3]), "--out", str(tmp_path / "one")).exit_code == 0
    assert invoke("compare", str(runs[0]), str(runs[3])).exit_code == 0
    assert invoke("compare", "--baseline-window", "30d", str(runs[3])).exit_code == 0


def test_a_dataset_or_trace_named_with_glob_characters_is_read(tmp_path: Path) -> None:
    """A CSV or Parquet dataset and a CSV or JSON-lines trace whose names hold `[1]` (polars
    read them as patterns matching nothing): `check` reads each."""
    folder = tmp_path / "in[1]"
    folder.mkdir()
    pl.DataFrame({"prompt": ["hello there", "tell me more"]}).write_csv(folder / "d[1].csv")
    pl.DataFrame({"prompt": ["hello there", "tell me more"]}).write_parquet(folder / "d[1].parquet")
    (folder / "t[1].csv").write_text("t_s,prompt_tokens,output_tokens\n0,10,5\n0.5,12,6\n")
    (folder / "t[1].jsonl").write_text(
        '{"t_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
        '{"t_s": 0.5, "prompt_tokens": 12, "output_tokens": 6}\n'
    )
    base = chat_workload("named", requests=2)
    texts = [
        base.replace("    prompt_tokens: {dist: fixed, value: 5}\n",
                     f"    dataset: {{path: '{folder / name}', format: {fmt}}}\n")
        for name, fmt in (("d[1].csv", "csv"), ("d[1].parquet", "parquet"))
    ] + [
        base.replace("{process: constant, rate_per_s: 50}",
                     f"{{process: trace, path: '{folder / name}'}}").replace("    requests: 2\n", "")
        for name in ("t[1].csv", "t[1].jsonl")
    ]  # fmt: skip
    for index, text in enumerate(texts):
        result = invoke("check", str(workload_file(tmp_path, text, f"w{index}.yaml")))
        assert result.exit_code == 0, result.output


def test_compare_refuses_a_run_still_running_with_exit_6(tmp_path: Path) -> None:
    """CURRENT (or BASELINE) a live run is writing (its run.lock held): exit 6 saying it is
    running (was "stopped before its end (incomplete)", exit 1), as `report` refuses it; once
    the lock is free the comparison runs."""
    runs = nights(tmp_path / "store", count=2)
    for live in runs:
        with run_lock(live, doing="write into"):
            result = invoke("compare", str(runs[0]), str(runs[1]))
        assert result.exit_code == 6, result.output
        assert f"{live} is running: its lock (run.lock) is held by pid {os.getpid()}" in " ".join(
            result.output.split())  # fmt: skip
    assert invoke("compare", str(runs[0]), str(runs[1])).exit_code == 0
