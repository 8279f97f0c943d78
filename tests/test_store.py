"""Tests for the results store: run discovery and per-minute histograms next to the records."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from loadgen.analysis.histograms import LatencyHistogram
from loadgen.analysis.minutes import (
    HISTOGRAMS_FILE,
    build_histograms,
    load_histograms,
    write_histograms,
)
from loadgen.analysis.slo import per_request
from loadgen.errors import LoadgenError
from loadgen.percentiles import nearest_rank
from loadgen.results.records import OUTCOMES, Outcome, RequestRecord, to_frame
from loadgen.results.store import discover_runs, read_run_entry
from loadgen.workload.spec import SloTargets

NS_PER_MS = 1_000_000
CHAT = SloTargets(ttft_ms=500, tpot_ms=50, percentile=99)


def request(
    i: int,
    intended_s: float,
    ttft_ms: float,
    *,
    cls: str = "chat",
    tokens: int = 5,
    gap_ms: float = 20.0,
    outcome: Outcome = Outcome.OK,
) -> RequestRecord:
    """A streamed request: first token after `ttft_ms`, then `tokens - 1` gaps of `gap_ms`."""
    intended = int(intended_s * 1e9)
    if outcome is not Outcome.OK:
        return RequestRecord(
            request_id=i, class_name=cls, intended_ns=intended, outcome=outcome, end_ns=intended
        )
    chunks = [intended + round((ttft_ms + k * gap_ms) * NS_PER_MS) for k in range(tokens)]
    return RequestRecord(
        request_id=i,
        class_name=cls,
        intended_ns=intended,
        outcome=outcome,
        sent_ns=intended,
        first_token_ns=chunks[0],
        last_token_ns=chunks[-1],
        end_ns=chunks[-1] + 1000,
        chunk_ns=tuple(chunks),
        chunk_tokens=(1,) * tokens,
        output_tokens=tokens,
    )


def write_run(
    store: Path,
    run_id: str,
    t0: datetime,
    records: list[RequestRecord],
    slos: dict[str, SloTargets] | None = None,
) -> Path:
    """A run folder shaped like `loadgen run`'s: run.json (t0 at `t0`) and records.parquet."""
    run_dir = store / run_id
    run_dir.mkdir(parents=True)
    classes = {
        name: {"slo": {"ttft_ms": s.ttft_ms, "tpot_ms": s.tpot_ms, "itl_ms": s.itl_ms,
                       "e2e_ms": s.e2e_ms, "percentile": s.percentile}}
        for name, s in (slos if slos is not None else {"chat": CHAT}).items()
    }  # fmt: skip
    info = {
        "run_id": run_id,
        "schema_version": 1,
        "planned": len(records),
        "workload": {"name": "chat-smoke", "source": "w.yaml", "spec": {"classes": classes}},
        "t0": {"perf_counter_ns": 1, "unix_ns": int(t0.timestamp() * 1e9), "utc": t0.isoformat()},
        "interrupted": False,
        "finished": True,
    }
    (run_dir / "run.json").write_text(json.dumps(info), encoding="utf-8")
    to_frame(records).write_parquet(run_dir / "records.parquet")
    return run_dir


def random_records(seed: int, n: int = 600, span_s: float = 170.0) -> list[RequestRecord]:
    """Two classes, lognormal TTFT, 1-30 tokens, jittered gaps, about 3 % failures."""
    rng = random.Random(seed)
    failures = [Outcome.TIMEOUT_FIRST_TOKEN, Outcome.REJECTED, Outcome.STREAM_ERROR]
    records = []
    for i in range(n):
        outcome = rng.choice(failures) if rng.random() < 0.03 else Outcome.OK
        records.append(
            request(
                i,
                rng.uniform(0, span_s),
                rng.lognormvariate(5.3, 0.6),
                cls=rng.choice(["chat", "agent"]),
                tokens=rng.randint(1, 30),
                gap_ms=rng.lognormvariate(3.0, 0.3),
                outcome=outcome,
            )
        )
    return records


def exact(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[nearest_rank(p, len(ordered)) - 1]


def test_histograms_agree_with_the_records_minute_by_minute(tmp_path: Path) -> None:
    """Every (class, minute) row counts exactly what the records hold and its histograms'
    percentiles are within 0.1 % of the exact nearest-rank values."""
    t0 = datetime(2026, 3, 1, 2, 0, 30, tzinfo=UTC)
    records = random_records(1)
    run_dir = write_run(tmp_path, "r1", t0, records, {"chat": CHAT, "agent": CHAT})
    assert write_histograms(run_dir) == run_dir / HISTOGRAMS_FILE
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
    frame = to_frame([request(0, 10.0, 100.0), request(1, 40.0, 100.0)])
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
    frame = to_frame([request(i, 1.0, v, tokens=1) for i, v in enumerate(ttfts)])
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
    write_run(tmp_path, "a-late", datetime(2026, 3, 2, tzinfo=UTC), [request(0, 0.0, 1.0)])
    write_run(tmp_path, "b-early", datetime(2026, 3, 1, tzinfo=UTC), [request(0, 0.0, 1.0)])
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
    run_dir = write_run(tmp_path, "r", datetime(2026, 3, 1, tzinfo=UTC), [request(0, 0.0, 1.0)])
    assert load_histograms(run_dir) is None
    (run_dir / HISTOGRAMS_FILE).write_bytes(b"not parquet")
    assert load_histograms(run_dir) is None


def test_an_outcome_added_later_reads_as_zero(tmp_path: Path) -> None:
    """A histograms file written before an outcome existed still loads, with that count 0."""
    run_dir = write_run(tmp_path, "r", datetime(2026, 3, 1, tzinfo=UTC), [request(0, 0.0, 1.0)])
    path = write_histograms(run_dir)
    pl.read_parquet(path).drop("cancelled").write_parquet(path)
    minutes = load_histograms(run_dir)
    assert minutes is not None
    assert minutes.get_column("cancelled").to_list() == [0]
