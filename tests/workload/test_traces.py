"""Trace replay: every format parses, options reshape as documented, bad files say where."""

from __future__ import annotations

import csv
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.errors import ConfigError
from loadgen.workload.traces import (
    TraceOptions,
    TraceRequest,
    detect_format,
    load_trace,
    read_trace,
    shared_prefix_groups,
    trace_stats,
)

SLICE = Path(__file__).resolve().parents[2] / "workloads/traces/azure-conv-2023-slice.csv"
DEFAULT = TraceOptions()

AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,0
2023-11-16 18:17:05.5000000,100,7
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,10,1
2024-05-10 00:00:01+00:00,20,2
2024-05-10 00:00:02.5+00:00,30,3
"""
AZURE_MIXED = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 01:00:03+01:00,30,3
2024-05-10 00:00:00.5,10,1
2024-05-10T00:00:01.25Z,20,2
"""
MOONCAKE = """{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 700, "output_length": 0, "hash_ids": [0, 3]}
{"timestamp": 3000, "input_length": 1500, "output_length": 9, "hash_ids": [0, 1, 2, 4]}
"""
BURSTGPT_1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""
BURSTGPT_3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0,s1,1.5,ChatGPT,100,10,110,Conversation log
2,s1,0.0,ChatGPT,200,0,200,Conversation log
7,s2,3.0,GPT-4,300,30,330,Conversation log
"""
PLAIN_CSV = """t_s,prompt_tokens,output_tokens,prefix_blocks
2.0,30,3,0 1
0.5,10,1,
1.0,20,2,0
"""
PLAIN_JSONL = """{"t_s": 2.0, "prompt_tokens": 30, "output_tokens": 3, "prefix_blocks": [0, 1]}
{"t_s": 0.5, "prompt_tokens": 10, "output_tokens": 1}
{"t_s": 1.0, "prompt_tokens": 20, "output_tokens": 2, "prefix_blocks": [0]}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rows(requests: list[TraceRequest]) -> list[tuple[float, int, int, tuple[int, ...]]]:
    return [(round(r.t_s, 9), r.prompt_tokens, r.output_tokens, r.prefix_blocks) for r in requests]


def test_azure_2023_seven_fraction_digits_and_zero_output_clamped(tmp_path: Path) -> None:
    """Azure 2023 times keep all 7 fractional digits; 0 output tokens become 1 and are counted."""
    trace = read_trace(write(tmp_path, "a.csv", AZURE_2023), DEFAULT)
    assert trace.format == "azure"
    assert rows(list(trace.requests)) == [
        (0.0, 4808, 10, ()),
        (0.052, 3180, 1, ()),
        (1.52004, 100, 7, ()),
    ]
    assert trace.clamped_output_rows == 1


def test_azure_2024_offset_and_mixed_precision(tmp_path: Path) -> None:
    """Azure 2024 times with a UTC offset parse with or without a fraction."""
    requests = load_trace(write(tmp_path, "a.csv", AZURE_2024), DEFAULT)
    assert [round(r.t_s, 9) for r in requests] == [0.0, 0.99007, 2.49007]


def test_azure_mixed_forms_offsets_and_sorting(tmp_path: Path) -> None:
    """A file mixing forms (zone, no zone, T and Z) is read in UTC and sorted by time."""
    requests = load_trace(write(tmp_path, "a.csv", AZURE_MIXED), DEFAULT)
    assert rows(requests) == [(0.0, 10, 1, ()), (0.75, 20, 2, ()), (2.5, 30, 3, ())]


def test_mooncake_ms_times_prefix_blocks_and_clamp(tmp_path: Path) -> None:
    """Mooncake rows give seconds, hash ids as prefix blocks, and 0 output clamped to 1."""
    trace = read_trace(write(tmp_path, "m.jsonl", MOONCAKE), DEFAULT)
    assert trace.format == "mooncake"
    assert rows(list(trace.requests)) == [
        (0.0, 1100, 5, (0, 1, 2)),
        (0.0, 700, 1, (0, 3)),
        (3.0, 1500, 9, (0, 1, 2, 4)),
    ]
    assert trace.clamped_output_rows == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BURSTGPT_1, [(0.0, 472, 18, ()), (113.0, 417, 276, ())]),
        (BURSTGPT_3, [(0.0, 100, 10, ()), (7.0, 300, 30, ())]),
    ],
    ids=["BurstGPT_1", "BurstGPT_3"],
)
def test_burstgpt_layouts_skip_failed_rows(
    tmp_path: Path, text: str, expected: list[tuple[float, int, int, tuple[int, ...]]]
) -> None:
    """Both BurstGPT layouts are read by header name; 0-response rows are skipped and counted."""
    trace = read_trace(write(tmp_path, "b.csv", text), DEFAULT)
    assert trace.format == "burstgpt"
    assert rows(list(trace.requests)) == expected
    assert (trace.skipped_failed_rows, trace.clamped_output_rows) == (1, 0)


def test_burstgpt_failed_rows_kept_on_request(tmp_path: Path) -> None:
    """include_failed keeps failed rows, with output clamped to 1 and counted."""
    trace = read_trace(write(tmp_path, "b.csv", BURSTGPT_1), TraceOptions(include_failed=True))
    assert [r.output_tokens for r in trace.requests] == [18, 1, 276]
    assert (trace.skipped_failed_rows, trace.clamped_output_rows) == (0, 1)


@pytest.mark.parametrize(("name", "text"), [("p.csv", PLAIN_CSV), ("p.jsonl", PLAIN_JSONL)])
def test_plain_csv_and_jsonl(tmp_path: Path, name: str, text: str) -> None:
    """Plain files give the same sorted requests, with optional prefix blocks."""
    requests = load_trace(write(tmp_path, name, text), DEFAULT)
    assert rows(requests) == [(0.0, 10, 1, ()), (0.5, 20, 2, (0,)), (1.5, 30, 3, (0, 1))]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("trace.csv", AZURE_2023, "azure"),
        ("trace.txt", AZURE_2024, "azure"),
        ("trace.jsonl", MOONCAKE, "mooncake"),
        ("trace", MOONCAKE, "mooncake"),
        ("BurstGPT_1.csv", BURSTGPT_1, "burstgpt"),
        ("BurstGPT_3.csv", BURSTGPT_3, "burstgpt"),
        ("plain.csv", PLAIN_CSV, "plain"),
        ("plain.jsonl", PLAIN_JSONL, "plain"),
        ("plain.csv", "\n\n" + PLAIN_CSV, "plain"),
    ],
)
def test_auto_detection(tmp_path: Path, name: str, text: str, expected: str) -> None:
    """The format is told from the extension and the first non-empty line."""
    assert detect_format(write(tmp_path, name, text)) == expected


def test_given_format_overrides_detection(tmp_path: Path) -> None:
    """A given format is used as is (a plain file read as Azure fails on its header)."""
    path = write(tmp_path, "p.csv", PLAIN_CSV)
    with pytest.raises(ConfigError, match="TIMESTAMP"):
        load_trace(path, TraceOptions(format="azure"))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "text", "key", "problem"),
    [
        ("a.csv", AZURE_2023.replace("18:17:04.0319600", "yesterday"), "line 3", "TIMESTAMP"),
        ("a.csv", AZURE_2023.replace("3180", "-3"), "line 3", "ContextTokens must be >= 0"),
        ("a.csv", AZURE_2023.replace(",100,", ",1.5,"), "line 4", "not an integer"),
        ("a.csv", AZURE_2023.replace(",100,7", ",100,"), "line 4", "GeneratedTokens is missing"),
        ("a.csv", AZURE_2023.replace(",100,7", ",100,7,9"), "line 4", "4 fields"),
        (
            "a.csv",
            AZURE_2023.replace(",GeneratedTokens", ",Out"),
            "GeneratedTokens",
            "missing column",
        ),
        ("b.csv", BURSTGPT_3.replace(",300,", ",x,"), "line 4", "Request tokens"),
        ("b.csv", BURSTGPT_1.replace("45,", "soon,"), "line 3", "Timestamp"),
        (
            "m.jsonl",
            MOONCAKE.replace('"output_length": 0', '"output_length": -1'),
            "line 2",
            "output_length",
        ),
        (
            "m.jsonl",
            MOONCAKE.replace(', "output_length": 9', ""),
            "line 3",
            "output_length is missing",
        ),
        ("m.jsonl", MOONCAKE.replace("[0, 3]", '["a"]'), "line 2", "hash_ids"),
        (
            "m.jsonl",
            MOONCAKE.replace('"timestamp": 3000', '"timestamp": 3.5'),
            "line 3",
            "timestamp",
        ),
        ("m.jsonl", MOONCAKE.replace("}\n{", "}\n\n{,", 1), "line 3", "not valid JSON"),
        ("p.jsonl", PLAIN_JSONL.replace('"t_s": 0.5', '"t_s": "soon"'), "line 2", "t_s"),
        ("p.csv", PLAIN_CSV.replace("0 1", "0 x"), "line 2", "prefix_blocks"),
    ],
)
def test_bad_files_name_file_and_line_or_column(
    tmp_path: Path, name: str, text: str, key: str, problem: str
) -> None:
    """A malformed row or column raises ConfigError naming the file and the line or column."""
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as caught:
        load_trace(path, DEFAULT)
    assert (caught.value.source, caught.value.key) == (str(path), key)
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("e.csv", "", "empty"),
        ("e.csv", "\n\n", "empty"),
        ("h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no rows"),
        ("x.csv", "when,what\n1,2\n", "unrecognised trace format"),
        ("x.jsonl", '{"when": 1}\n', "unrecognised trace format"),
        ("x.jsonl", "[1, 2]\n", "not a JSON object"),
    ],
)
def test_unusable_files(tmp_path: Path, name: str, text: str, problem: str) -> None:
    """Empty, header-only and unknown files raise ConfigError, not a traceback."""
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=problem) as caught:
        load_trace(path, DEFAULT)
    assert caught.value.source == str(path)


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="not found"):
        load_trace(tmp_path / "nope.csv", DEFAULT)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        (TraceOptions(format="parquet"), "format"),
        (TraceOptions(start_s=-1), "start_s"),
        (TraceOptions(start_s=5, end_s=5), "end_s"),
        (TraceOptions(speed=0), "speed"),
        (TraceOptions(rate_scale=math.inf), "rate_scale"),
        (TraceOptions(spread_s=-1), "spread_s"),
        (TraceOptions(limit=0), "limit"),
    ],
)
def test_bad_options(tmp_path: Path, options: TraceOptions, key: str) -> None:
    """Options that cannot describe a replay raise ConfigError naming the option."""
    with pytest.raises(ConfigError) as caught:
        load_trace(write(tmp_path, "a.csv", AZURE_2023), options)
    assert caught.value.key == key


# ---------------------------------------------------------------- the shipped slice


def direct_slice_times_s() -> list[float]:
    """Seconds from the first row, computed without polars or loadgen."""
    with SLICE.open(newline="") as file:
        stamps = [row["TIMESTAMP"] for row in csv.DictReader(file)]
    seconds = []
    for stamp in stamps:
        whole, fraction = stamp.split(".")
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
        seconds.append(base + int(fraction) / 10 ** len(fraction))
    return [s - seconds[0] for s in seconds]


def test_shipped_slice_stats_match_a_direct_computation() -> None:
    """The shipped slice loads whole and its count, rate and gap CV match a direct computation."""
    assert SLICE.stat().st_size < 250_000
    stats = trace_stats(load_trace(SLICE, DEFAULT))
    times = np.array(direct_slice_times_s())
    gaps = np.diff(times)
    assert stats["count"] == len(times) == 2867
    assert stats["rate_per_s"] == pytest.approx(len(times) / times[-1], rel=1e-9)
    assert stats["gap_cv"] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-6)
    assert times[-1] < 600.0


def test_trace_stats_known_answer() -> None:
    """trace_stats gives count/duration, the gap CV and token percentiles."""
    requests = [
        TraceRequest(t_s=t, prompt_tokens=p, output_tokens=1)
        for t, p in [(0, 1), (1, 2), (2, 3), (4, 4)]
    ]
    stats = trace_stats(requests)
    assert (stats["count"], stats["duration_s"], stats["rate_per_s"]) == (4, 4.0, 1.0)
    assert stats["gap_cv"] == pytest.approx(np.std([1, 1, 2]) / (4 / 3))
    assert (stats["prompt_tokens_mean"], stats["prompt_tokens_p50"]) == (2.5, 2.0)  # rank 2 of 4
    assert stats["prompt_tokens_p99"] == 4.0  # nearest rank: an observed count, never 3.97


# ---------------------------------------------------------------- options


@settings(max_examples=25, deadline=None)
@given(speed=st.floats(min_value=0.1, max_value=20))
def test_speed_divides_every_time(speed: float) -> None:
    """speed s divides every time by s and keeps every request."""
    base = load_trace(SLICE, DEFAULT)
    fast = load_trace(SLICE, TraceOptions(speed=speed))
    assert [r.prompt_tokens for r in fast] == [r.prompt_tokens for r in base]
    assert np.allclose([r.t_s for r in fast], [r.t_s / speed for r in base], rtol=1e-12)


def test_speed_two_halves_every_time() -> None:
    """speed 2 halves every time exactly."""
    base, fast = load_trace(SLICE, DEFAULT), load_trace(SLICE, TraceOptions(speed=2))
    assert [r.t_s for r in fast] == [r.t_s / 2 for r in base]


def test_window_keeps_rows_in_range_and_starts_at_zero() -> None:
    """start_s/end_s keep [start, end) of the trace's own seconds; the first kept is at 0."""
    times = np.array(direct_slice_times_s())
    trace = read_trace(SLICE, TraceOptions(start_s=60, end_s=120))
    expected = times[(times >= 60) & (times < 120)]
    assert len(trace.requests) == trace.window_rows == len(expected)
    assert np.allclose([r.t_s for r in trace.requests], expected - expected[0], atol=1e-6)


def test_empty_window_is_an_error() -> None:
    """A window past the trace's end raises ConfigError rather than replaying nothing."""
    with pytest.raises(ConfigError, match="no requests"):
        load_trace(SLICE, TraceOptions(start_s=1000))


def test_limit_keeps_the_first_requests() -> None:
    """limit keeps the first n requests in time order."""
    assert load_trace(SLICE, TraceOptions(limit=10)) == load_trace(SLICE, DEFAULT)[:10]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rate_scale_half_keeps_about_half(seed: int) -> None:
    """rate_scale 0.5 keeps each request with probability 1/2 (within 6 binomial sigma)."""
    n = len(load_trace(SLICE, DEFAULT))
    kept = load_trace(SLICE, TraceOptions(rate_scale=0.5), seed=seed)
    assert abs(len(kept) - n / 2) <= 6 * math.sqrt(n * 0.25)


def test_rate_scale_is_seeded() -> None:
    """The same seed thins the same requests; another seed thins others."""
    options = TraceOptions(rate_scale=0.5)
    assert load_trace(SLICE, options, seed=3) == load_trace(SLICE, options, seed=3)
    assert load_trace(SLICE, options, seed=3) != load_trace(SLICE, options, seed=4)


@pytest.mark.parametrize("scale", [2.0, 3.0, 2.5])
def test_rate_scale_above_one_superposes_copies(scale: float) -> None:
    """rate_scale > 1 adds shifted copies: whole copies exactly, the fraction binomially."""
    base = load_trace(SLICE, DEFAULT)
    n, span = len(base), base[-1].t_s
    scaled = load_trace(SLICE, TraceOptions(rate_scale=scale), seed=7)
    fraction = scale % 1
    sigma = math.sqrt(n * fraction * (1 - fraction))
    assert abs(len(scaled) - n * scale) <= 6 * sigma
    times = [r.t_s for r in scaled]
    assert times == sorted(times)
    assert times[0] == 0
    assert times[-1] <= span * n / (n - 1)
    assert trace_stats(scaled)["rate_per_s"] == pytest.approx(scale * n / span, rel=0.05)


def test_copies_get_their_own_prefix_blocks(tmp_path: Path) -> None:
    """Each copy's prefix ids are renumbered past the original's, so copies share no prefix."""
    requests = load_trace(write(tmp_path, "m.jsonl", MOONCAKE), TraceOptions(rate_scale=2))
    blocks = sorted(r.prefix_blocks for r in requests)
    assert blocks == [(0, 1, 2), (0, 1, 2, 4), (0, 3), (5, 6, 7), (5, 6, 7, 9), (5, 8)]


def coarse_trace(tmp_path: Path) -> Path:
    """Mooncake-like rows on 3 s buckets, each with a unique prompt length."""
    lines = [
        f'{{"timestamp": {3000 * (i // 4)}, "input_length": {i}, "output_length": 1}}'
        for i in range(40)
    ]
    return write(tmp_path, "coarse.jsonl", "\n".join(lines) + "\n")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_spread_keeps_count_and_each_request_in_its_bucket(tmp_path: Path, seed: int) -> None:
    """spread_s keeps every request and moves each within [t, t + spread) of its coarse time."""
    path = coarse_trace(tmp_path)
    spread = load_trace(path, TraceOptions(spread_s=3.0), seed=seed)
    assert sorted(r.prompt_tokens for r in spread) == list(range(40))
    assert len({r.t_s for r in spread}) == 40
    # times restart at the first spread request, so offsets are known up to one common shift
    offsets = [r.t_s - 3.0 * (r.prompt_tokens // 4) for r in spread]
    assert max(offsets) - min(offsets) < 3.0
    assert min(offsets) <= 0.0 < 3.0 + min(offsets)


def test_spread_undoes_bucket_ties_in_stats(tmp_path: Path) -> None:
    """Spreading ties makes the gaps less bursty than the rounded trace's."""
    path = coarse_trace(tmp_path)
    rounded = trace_stats(load_trace(path, DEFAULT))["gap_cv"]
    assert trace_stats(load_trace(path, TraceOptions(spread_s=3.0)))["gap_cv"] < rounded


# ---------------------------------------------------------------- shared prefixes


def test_shared_prefix_groups() -> None:
    """Group ids follow shared leading blocks only, densely numbered by first appearance."""
    blocks = [(0, 1, 2), (0, 1, 3), (0, 4), (5,), (0, 1, 2), (7, 1), (8, 1), ()]
    requests = [
        TraceRequest(t_s=0, prompt_tokens=1, output_tokens=1, prefix_blocks=b) for b in blocks
    ]
    assert shared_prefix_groups(requests) == [(0, 1, 2), (0, 1), (0,), (), (0, 1, 2), (), (), ()]


def test_shared_prefix_groups_on_mooncake(tmp_path: Path) -> None:
    """Mooncake requests with equal leading hash ids get equal leading group ids."""
    requests = load_trace(write(tmp_path, "m.jsonl", MOONCAKE), DEFAULT)
    assert shared_prefix_groups(requests) == [(0, 1, 2), (0,), (0, 1, 2)]
