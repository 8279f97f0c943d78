"""Tests for the results store: run discovery and per-minute histograms next to the records."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import polars as pl
import pytest

from loadgen.analysis.histograms import LatencyHistogram
from loadgen.analysis.minutes import build_histograms, load_histograms, run_histograms
from loadgen.analysis.slo import per_request
from loadgen.errors import LoadgenError
from loadgen.percentiles import nearest_rank
from loadgen.results.records import OUTCOMES, Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import HISTOGRAMS_FILE
from loadgen.results.store import discover_runs, read_run_entry
from loadgen.results.write import write_histograms
from loadgen.testing import builders
from loadgen.workload.spec import SloTargets

NS_PER_MS = 1_000_000
CHAT = SloTargets(ttft_ms=500, tpot_ms=50, percentile=99)


# Five tokens 20 ms apart, sent on time, ending 1 µs after the last; failures never sent.
stream = partial(builders.streamed_record, gaps_ms=(20.0,) * 4, end_after_ms=0.001)
failure = partial(builders.failed_record, end_after_ms=0.0, sent=False)
# Finished runs of workload chat-smoke whose run.json holds every SLO key.
write_run = partial(builders.write_run, slos={"chat": CHAT}, workload="chat-smoke",
                    slo_keys=("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "percentile"),
                    schema_version=1)  # fmt: skip


def random_records(seed: int, n: int = 600, span_s: float = 170.0) -> list[RequestRecord]:
    """Two classes, lognormal TTFT, 1-30 tokens, jittered gaps, about 3 % failures."""
    rng = random.Random(seed)
    failures = [Outcome.TIMEOUT_FIRST_TOKEN, Outcome.REJECTED, Outcome.STREAM_ERROR]
    records = []
    for i in range(n):
        outcome = rng.choice(failures) if rng.random() < 0.03 else Outcome.OK
        intended_ms, ttft_ms = rng.uniform(0, span_s) * 1000, rng.lognormvariate(5.3, 0.6)
        cls, tokens = rng.choice(["chat", "agent"]), rng.randint(1, 30)
        gap_ms = rng.lognormvariate(3.0, 0.3)
        if outcome is Outcome.OK:
            records.append(stream(i, intended_ms=intended_ms, ttft_ms=ttft_ms, class_name=cls,
                                  gaps_ms=(gap_ms,) * (tokens - 1)))  # fmt: skip
        else:
            records.append(failure(i, intended_ms=intended_ms, outcome=outcome, class_name=cls))
    return records


def exact(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[nearest_rank(p, len(ordered)) - 1]


def test_histograms_agree_with_the_records_minute_by_minute(tmp_path: Path) -> None:
    """Every (class, minute) row counts exactly what the records hold and its histograms'
    percentiles are within 0.1 % of the exact nearest-rank values."""
    t0 = datetime(2026, 3, 1, 2, 0, 30, tzinfo=UTC)
    records = random_records(1)
    run_dir = write_run(tmp_path, t0, records, run_id="r1", slos={"chat": CHAT, "agent": CHAT})
    assert write_histograms(run_dir, run_histograms(run_dir)) == run_dir / HISTOGRAMS_FILE
    minutes = load_histograms(run_dir)
    assert minutes is not None
    rows = per_request(to_frame(records), slos={"chat": CHAT, "agent": CHAT})
    minute_of = {
        r.request_id: (int(t0.timestamp()) + r.intended_ns // 10**9) // 60 for r in records
    }
    assert minutes.get_column("requests").sum() == len(records)
    for row in minutes.iter_rows(named=True):
        ids = {i for i, m in minute_of.items() if m * 60 * 10**9 == row["minute_start_unix_ns"]}
        mine = rows.filter(pl.col("request_id").is_in(ids) & (pl.col("class") == row["class"]))
        assert row["requests"] == mine.height
        assert row["meets_slo"] == mine.get_column("meets_slo").sum()
        for outcome in OUTCOMES:
            assert row[outcome] == (mine.get_column("outcome") == outcome).sum()
        ok = mine.filter(pl.col("outcome") == "ok")
        for metric in ("ttft", "tpot", "e2e"):
            values = ok.get_column(f"{metric}_ms").drop_nulls().to_list()
            histogram = LatencyHistogram.decode(row[metric]) if row[metric] else LatencyHistogram()
            assert histogram.count == len(values)
            for p in (50.0, 90.0, 99.0, 100.0):
                if values:
                    assert histogram.percentile_ms(p) == pytest.approx(exact(values, p), rel=1e-3)


def test_minutes_follow_the_wall_clock_of_the_intended_time(tmp_path: Path) -> None:
    """t0 at 02:00:30: a request intended at +10 s is in minute 0 (02:00), at +40 s in minute 1."""
    t0 = datetime(2026, 3, 1, 2, 0, 30, tzinfo=UTC)
    frame = to_frame([stream(0, intended_ms=10_000.0), stream(1, intended_ms=40_000.0)])
    minutes = build_histograms(frame, t0_unix_ns=int(t0.timestamp() * 1e9), slos=None)
    starts = [datetime.fromtimestamp(ns / 1e9, UTC) for ns in minutes["minute_start_unix_ns"]]
    assert minutes.get_column("minute").to_list() == [0, 1]
    assert starts == [
        datetime(2026, 3, 1, 2, 0, tzinfo=UTC),
        datetime(2026, 3, 1, 2, 1, tzinfo=UTC),
    ]


def test_bucketed_recording_encodes_like_recording_each_value() -> None:
    """Filling per bucket gives the very histogram `record_ms` per value gives (same encoding)."""
    rng = random.Random(7)
    ttfts = [rng.lognormvariate(5.0, 1.5) for _ in range(2000)] + [0.0004, 5_000_000.0]
    frame = to_frame(
        [stream(i, intended_ms=1000.0, ttft_ms=v, gaps_ms=()) for i, v in enumerate(ttfts)]
    )
    minutes = build_histograms(frame, t0_unix_ns=0, slos=None)
    one_by_one = LatencyHistogram()
    for value in per_request(frame).get_column("ttft_ms"):
        one_by_one.record_ms(value)
    assert minutes.get_column("ttft").item() == one_by_one.encode()
    assert LatencyHistogram.decode(minutes.get_column("ttft").item()).overflow == 1


def test_percentiles_with_failures_rank_them_worst() -> None:
    """`percentiles_ms(failures=f)` equals `percentile_ms` after recording f values of +inf."""
    rng = random.Random(3)
    bucketed, reference = LatencyHistogram(), LatencyHistogram()
    for value in (rng.lognormvariate(4.0, 1.0) for _ in range(500)):
        bucketed.record_ms(value)
        reference.record_ms(value)
    bucketed.record_overflow(3)
    for _ in range(3 + 7):
        reference.record_ms(math.inf)
    ps = (0.0, 50.0, 97.0, 98.1, 98.2, 99.0, 100.0)
    assert bucketed.percentiles_ms(ps, failures=7) == [reference.percentile_ms(p) for p in ps]
    assert math.isnan(LatencyHistogram().percentiles_ms((50.0,))[0])


def test_discover_runs_sorts_by_t0_and_reads_slos(tmp_path: Path) -> None:
    """Runs come back oldest t0 first (not by folder name), with their classes' SLOs."""
    write_run(tmp_path, datetime(2026, 3, 2, tzinfo=UTC), [stream(0, ttft_ms=1.0)], run_id="a-late")
    write_run(
        tmp_path, datetime(2026, 3, 1, tzinfo=UTC), [stream(0, ttft_ms=1.0)], run_id="b-early"
    )
    (tmp_path / "not-a-run").mkdir()
    runs = discover_runs(tmp_path)
    assert [r.run_id for r in runs] == ["b-early", "a-late"]
    assert runs[0].slos == {"chat": CHAT}
    assert runs[0].workload == "chat-smoke"
    assert runs[0].started == datetime(2026, 3, 1, tzinfo=UTC)


def test_a_broken_run_json_is_an_error(tmp_path: Path) -> None:
    """A run.json without t0 raises LoadgenError naming the file."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text('{"run_id": "r"}', encoding="utf-8")
    with pytest.raises(LoadgenError, match=r"run\.json"):
        read_run_entry(tmp_path / "r")


def test_missing_or_unreadable_histograms_load_as_none(tmp_path: Path) -> None:
    """No file, or a file that is not the histograms' Parquet, gives None (read the records)."""
    run_dir = write_run(
        tmp_path, datetime(2026, 3, 1, tzinfo=UTC), [stream(0, ttft_ms=1.0)], run_id="r"
    )
    assert load_histograms(run_dir) is None
    (run_dir / HISTOGRAMS_FILE).write_bytes(b"not parquet")
    assert load_histograms(run_dir) is None


def test_an_outcome_added_later_reads_as_zero(tmp_path: Path) -> None:
    """A histograms file written before an outcome existed still loads, with that count 0."""
    run_dir = write_run(
        tmp_path, datetime(2026, 3, 1, tzinfo=UTC), [stream(0, ttft_ms=1.0)], run_id="r"
    )
    path = write_histograms(run_dir, run_histograms(run_dir))
    pl.read_parquet(path).drop("cancelled").write_parquet(path)
    minutes = load_histograms(run_dir)
    assert minutes is not None
    assert minutes.get_column("cancelled").to_list() == [0]
