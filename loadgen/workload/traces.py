"""Trace replay: a public request trace → the send time and token counts of every request.

Feeds the arrivals stage (a trace is one more arrival process) and the prompt builder
(token counts and shared prefixes). Pure and seeded: the same file, options and seed give
the same requests. Nothing here touches the network or the clock.

Formats (`TraceOptions.format`, or "auto" from the extension and the first line):

* `azure`: Azure LLM inference trace CSV, `TIMESTAMP,ContextTokens,GeneratedTokens`. The 2023
  form `2023-11-16 18:17:03.9799600` (7 fractional digits, no zone) and the 2024 form with a
  UTC offset and any precision (`2024-05-10 00:00:00.009930+00:00`, `... 00:00:00+00:00`).
* `mooncake`: Mooncake JSONL, `timestamp` (integer ms), `input_length`, `output_length`,
  `hash_ids` (one id per 512-token prompt block; equal leading ids = shared prefix).
* `burstgpt`: BurstGPT CSV, by header name (`Timestamp` relative integer seconds,
  `Request tokens`, `Response tokens`); rows with 0 response tokens failed at the source.
* `plain`: CSV or JSONL with `t_s`, `prompt_tokens`, `output_tokens` and optional
  `prefix_blocks` (a JSON list in JSONL, space-separated ids in CSV).

Processing order, each step in the trace's own seconds (from its earliest row):
parse → sort (stable) → spread → window [start_s, end_s) → failed/zero-output rows →
rate_scale → speed → shift so the first kept request is at 0 → limit.
"""

from __future__ import annotations

import csv
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from loadgen.errors import ConfigError
from loadgen.percentiles import nearest_rank
from loadgen.units import NS_PER_S
from loadgen.workload.inputs import json_problem

FORMATS = ("azure", "burstgpt", "mooncake", "plain")

IntArray = np.ndarray[Any, np.dtype[np.int64]]
FloatArray = np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    """One replayed request: seconds since the first kept request, and its token counts."""

    t_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """How to cut and reshape a trace; times are the trace's own seconds from its first row.

    `speed` divides every time (2 = twice the rate, same requests). `rate_scale` keeps the
    time axis and changes the count: below 1 each request is kept with that probability;
    above 1 the window is superposed with ⌊rate_scale⌋ − 1 whole copies and one copy thinned
    to the fractional part, each copy circularly shifted by a seeded uniform offset within
    the window (another population of users with the same shape; its prefix block ids are
    renumbered so copies share no prefix with each other). `spread_s` moves every request
    to a seeded uniform time in [t, t + spread_s): for traces whose timestamps are rounded
    down to buckets (Mooncake: 3 s), so ties do not arrive as one burst.
    """

    format: str = "auto"
    start_s: float = 0.0
    end_s: float | None = None
    speed: float = 1.0
    rate_scale: float = 1.0
    spread_s: float = 0.0
    include_failed: bool = False
    limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """The replayed requests and what reading the file did (counts over the window's rows)."""

    requests: tuple[TraceRequest, ...]
    format: str
    source_rows: int  # data rows in the file
    window_rows: int  # rows in [start_s, end_s), before rate_scale and limit
    clamped_output_rows: int  # 0 output tokens raised to 1 (Azure/Mooncake; kept BurstGPT failures)
    skipped_failed_rows: int  # BurstGPT failures left out (include_failed=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Columns:
    """A parsed file in row order: seconds from the earliest row, counts, prefix blocks."""

    t_s: FloatArray
    prompt: IntArray
    output: IntArray
    prefix: list[tuple[int, ...]] | None


def load_trace(path: Path, options: TraceOptions, *, seed: int = 0) -> list[TraceRequest]:
    """The requests of a trace file, sorted by time (see `read_trace` for the counts)."""
    return list(read_trace(path, options, seed=seed).requests)


def read_trace(path: Path, options: TraceOptions, *, seed: int = 0) -> Trace:
    """Read, cut and reshape a trace; raises `ConfigError` for any malformed input."""
    _check_options(options)
    if not path.is_file():
        raise ConfigError(str(path), "", "trace file not found", "check the path")
    fmt = detect_format(path) if options.format == "auto" else options.format
    cols = _READERS[fmt](path)
    order = np.argsort(cols.t_s, kind="stable")
    t_s = cols.t_s[order]
    if options.spread_s > 0:
        t_s = t_s + _rng(seed, "spread").uniform(0.0, options.spread_s, len(t_s))
        resort = np.argsort(t_s, kind="stable")
        order, t_s = order[resort], t_s[resort]
    end_s = math.inf if options.end_s is None else options.end_s
    in_window = (t_s >= options.start_s) & (t_s < end_s)
    if not in_window.any():
        problem = f"no requests in [{options.start_s}, {end_s}) s; the trace lasts {t_s[-1]:.1f} s"
        raise ConfigError(str(path), "start_s", problem, "choose a window inside the trace")
    order, t_s = order[in_window], t_s[in_window]
    output = cols.output[order]
    failed = output == 0
    skipped = 0
    if fmt == "burstgpt" and not options.include_failed:
        skipped = int(failed.sum())
        order, t_s, output = order[~failed], t_s[~failed], output[~failed]
        failed = failed[~failed]
    clamped = int(failed.sum())
    output = np.maximum(output, 1)
    wrap = _wrap_window(t_s, options)
    times, pick, copy = _rate_scaled(t_s, wrap, options.rate_scale, seed)
    if not len(times):
        kept = f"rate_scale {options.rate_scale:g} kept none" if len(t_s) else "all failed"
        raise ConfigError(
            str(path), "", f"no requests to replay: the window holds {len(order)} rows and {kept}",
            "widen window_s, raise rate_scale, or set include_failed",
        )  # fmt: skip
    times = (times - times[0]) / options.speed
    if options.limit is not None:
        times, pick, copy = times[: options.limit], pick[: options.limit], copy[: options.limit]
    requests = _requests(times, cols, order[pick], output[pick], copy)
    return Trace(
        requests=requests,
        format=fmt,
        source_rows=len(cols.t_s),
        window_rows=int(in_window.sum()),
        clamped_output_rows=clamped,
        skipped_failed_rows=skipped,
    )


def _check_options(options: TraceOptions) -> None:
    """Reject options that cannot describe a replay."""

    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError("trace options", key, problem)

    if options.format != "auto" and options.format not in FORMATS:
        raise bad("format", f"must be auto or one of {', '.join(FORMATS)} (got {options.format!r})")
    if not options.start_s >= 0:
        raise bad("start_s", f"must be >= 0 (got {options.start_s})")
    if options.end_s is not None and not options.end_s > options.start_s:
        raise bad("end_s", f"must be > start_s (got {options.end_s})")
    for key, value in (("speed", options.speed), ("rate_scale", options.rate_scale)):
        if not (value > 0 and math.isfinite(value)):
            raise bad(key, f"must be a finite number > 0 (got {value})")
    if not (options.spread_s >= 0 and math.isfinite(options.spread_s)):
        raise bad("spread_s", f"must be >= 0 (got {options.spread_s})")
    if options.limit is not None and options.limit < 1:
        raise bad("limit", f"must be >= 1 (got {options.limit})")


def _rng(seed: int, purpose: str) -> np.random.Generator:
    """One random stream per purpose, so spreading does not change which requests are thinned."""
    key = zlib.crc32(f"trace\x00{purpose}".encode())
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, key])


def _wrap_window(t_s: FloatArray, options: TraceOptions) -> tuple[float, float]:
    """Where the copies of `rate_scale` wrap around: (origin, length) in trace seconds.

    The window itself when `end_s` is given; else from the first request to the last plus
    one mean gap, so the seam where a shifted copy wraps looks like any other gap.
    """
    if options.end_s is not None:
        return options.start_s, options.end_s - options.start_s
    if len(t_s) < 2:
        return 0.0, 0.0
    span = float(t_s[-1] - t_s[0])
    return float(t_s[0]), span * len(t_s) / (len(t_s) - 1)


def _rate_scaled(
    t_s: FloatArray, wrap: tuple[float, float], rate_scale: float, seed: int
) -> tuple[FloatArray, IntArray, IntArray]:
    """Thin or superpose: (times, index into `t_s`, copy number), sorted by time.

    Copy 0 is the trace itself; copy k > 0 is shifted by U(0, span) and wrapped into
    [origin, origin + span). The last copy is thinned to rate_scale's fractional part.
    """
    whole = math.floor(rate_scale)
    fraction = rate_scale - whole
    shift_rng, thin_rng = _rng(seed, "shift"), _rng(seed, "thin")
    origin, span_s = wrap
    parts: list[tuple[FloatArray, IntArray, IntArray]] = []
    for copy in range(whole + (1 if fraction > 0 else 0)):
        index = np.arange(len(t_s), dtype=np.int64)
        if copy == whole:  # the thinned copy
            index = index[thin_rng.random(len(t_s)) < fraction]
        times = t_s[index]
        if copy > 0 and span_s > 0:
            offset = shift_rng.uniform(0.0, span_s)
            times = origin + np.mod(times - origin + offset, span_s)
        parts.append((times, index, np.full(len(index), copy, dtype=np.int64)))
    times = np.concatenate([p[0] for p in parts])
    order = np.argsort(times, kind="stable")
    index = np.concatenate([p[1] for p in parts])[order]
    copies = np.concatenate([p[2] for p in parts])[order]
    return times[order], index, copies


def _requests(
    times: FloatArray, cols: _Columns, rows: IntArray, output: IntArray, copy: IntArray
) -> tuple[TraceRequest, ...]:
    """Build the records; copy k's prefix ids are moved past every id of the copies before."""
    prompt = cols.prompt[rows].tolist()
    if cols.prefix is None:
        prefixes: list[tuple[int, ...]] = [()] * len(rows)
    else:
        source = cols.prefix
        stride = 1 + max((max(p) for p in source if p), default=0)
        prefixes = [
            source[r] if c == 0 else tuple(b + c * stride for b in source[r])
            for r, c in zip(rows.tolist(), copy.tolist(), strict=True)
        ]
    return tuple(
        TraceRequest(t_s=t, prompt_tokens=p, output_tokens=o, prefix_blocks=b)
        for t, p, o, b in zip(times.tolist(), prompt, output.tolist(), prefixes, strict=True)
    )


# ---------------------------------------------------------------- format detection


def detect_format(path: Path) -> str:
    """The format of a trace file, from its extension and its first non-empty line."""
    first = _first_line(path)
    if first.lstrip().startswith("{") or path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        try:
            record = orjson.loads(first)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(str(path), "line 1", json_problem(exc), _FORMAT_FIX) from None
        if not isinstance(record, dict):
            raise ConfigError(str(path), "line 1", "not a JSON object", _FORMAT_FIX)
        keys = set(record)
        if {"timestamp", "input_length"} <= keys:
            return "mooncake"
        if "t_s" in keys:
            return "plain"
    else:
        header = {name.strip() for name in next(csv.reader([first]))}
        if {"TIMESTAMP", "ContextTokens"} <= header:
            return "azure"
        if {"Timestamp", "Response tokens"} <= header:
            return "burstgpt"
        if "t_s" in header:
            return "plain"
    raise ConfigError(
        str(path), "line 1", f"unrecognised trace format: {first[:80]!r}", _FORMAT_FIX
    )


_FORMAT_FIX = (
    "expected an Azure, BurstGPT or plain CSV header, or Mooncake or plain JSON lines; "
    "set format to one of " + ", ".join(FORMATS)
)


def _first_line(path: Path) -> str:
    """The first non-empty line of a text file (a clear error for an empty or binary file)."""
    try:
        with path.open(encoding="utf-8-sig") as file:
            for line in file:
                if line.strip():
                    return line.strip()
    except UnicodeDecodeError:
        raise ConfigError(str(path), "", "not a UTF-8 text file", _FORMAT_FIX) from None
    raise ConfigError(str(path), "", "trace file is empty", "give a file with a header and rows")


# ---------------------------------------------------------------- CSV formats


def _read_csv(path: Path, required: Sequence[str]) -> pl.DataFrame:
    """All columns as strings, a `line` column, blank lines dropped; columns checked by name."""
    try:
        frame = pl.read_csv(path, infer_schema=False, encoding="utf8-lossy", glob=False)
    except pl.exceptions.NoDataError:
        raise ConfigError(str(path), "", "trace file is empty", "give a header and rows") from None
    except pl.exceptions.PolarsError as exc:
        raise _csv_problem(path, exc) from None
    frame = frame.rename({name: name.strip().lstrip("\ufeff") for name in frame.columns})
    for name in required:
        if name not in frame.columns:
            found = ", ".join(frame.columns)
            raise ConfigError(str(path), name, f"missing column (found: {found})", _FORMAT_FIX)
    frame = frame.with_row_index("line", offset=2)  # the header is line 1
    blank = pl.all_horizontal(pl.exclude("line").is_null())
    frame = frame.filter(~blank)
    if frame.height == 0:
        raise ConfigError(str(path), "", "trace has a header but no rows", "give some rows")
    return frame


def _csv_problem(path: Path, exc: Exception) -> ConfigError:
    """Find the line polars could not read (a row with more fields than the header)."""
    with path.open(encoding="utf-8", errors="replace", newline="") as file:
        rows = csv.reader(file)
        width = len(next(rows, []))
        for row in rows:
            if len(row) > width:
                where = f"line {rows.line_num}"
                return ConfigError(
                    str(path), where, f"{len(row)} fields, the header has {width}", "fix the row"
                )
    return ConfigError(str(path), "", f"unreadable CSV: {exc}", "check the file")


def _first_bad(frame: pl.DataFrame, bad: pl.Series) -> tuple[int, int]:
    """The file line number and the row index of the first flagged row."""
    row = int(bad.arg_max() or 0)
    return int(frame["line"][row]), row


def _integers(path: Path, frame: pl.DataFrame, name: str) -> IntArray:
    """A token-count column as int64; a missing, non-integer or negative value is an error."""
    raw = frame[name].str.strip_chars()
    values = raw.cast(pl.Int64, strict=False)
    bad = values.is_null()
    if bad.any():
        line, row = _first_bad(frame, bad)
        got = raw[row]
        problem = (
            f"{name} is missing" if got in (None, "") else f"{name} is not an integer: {got!r}"
        )
        raise ConfigError(str(path), f"line {line}", problem, "token counts are whole numbers")
    negative = values < 0
    if negative.any():
        line, row = _first_bad(frame, negative)
        problem = f"{name} must be >= 0 (got {values[row]})"
        raise ConfigError(str(path), f"line {line}", problem, "token counts are >= 0")
    return values.to_numpy().astype(np.int64)


def _seconds(path: Path, frame: pl.DataFrame, name: str) -> FloatArray:
    """A numeric time column in seconds; a missing or non-finite value is an error."""
    raw = frame[name].str.strip_chars()
    values = raw.cast(pl.Float64, strict=False)
    bad = values.is_null() | ~values.is_finite().fill_null(False)
    if bad.any():
        line, row = _first_bad(frame, bad)
        problem = f"{name} is not a number of seconds: {raw[row]!r}"
        raise ConfigError(str(path), f"line {line}", problem, "times are plain numbers")
    return _from_first(values.to_numpy().astype(np.float64))


def _from_first(t_s: FloatArray) -> FloatArray:
    """Seconds from the earliest row."""
    origin: float = t_s.min()
    return t_s - origin


_AZURE_TIME = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*"
    r"(?:(Z)|([+-])(\d{2}):?(\d{2}))?$"
).pattern


def _azure_ns(path: Path, frame: pl.DataFrame) -> IntArray:
    """TIMESTAMP as int ns since the epoch, vectorised; either form, any fraction length.

    A time without a zone is taken as UTC: only differences matter for a replay. polars
    parses a file of one form about twice as fast as the regex, which handles the rest.
    """
    text = frame["TIMESTAMP"].str.strip_chars()
    for form in ("%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%d %H:%M:%S%.f"):
        parsed = text.str.to_datetime(form, strict=False, time_unit="ns")
        if parsed.null_count() == 0:
            return parsed.dt.epoch("ns").to_numpy().astype(np.int64)
    parts = text.str.extract_groups(_AZURE_TIME).struct
    date_time = parts.field("1") + " " + parts.field("2")
    base = date_time.str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S", strict=False)
    bad = base.is_null()
    if bad.any():
        line, row = _first_bad(frame, bad)
        got = frame["TIMESTAMP"][row]
        fix = "expected e.g. 2023-11-16 18:17:03.9799600 or 2024-05-10 00:00:00.009930+00:00"
        raise ConfigError(str(path), f"line {line}", f"TIMESTAMP not understood: {got!r}", fix)
    fraction_ns = parts.field("3").str.pad_end(9, "0").cast(pl.Int64).fill_null(0)
    sign = (parts.field("5") == "-").cast(pl.Int64).fill_null(0) * -2 + 1
    offset_s = parts.field("6").cast(pl.Int64).fill_null(0) * 3600
    offset_s = offset_s + parts.field("7").cast(pl.Int64).fill_null(0) * 60
    ns = base.cast(pl.Int64) + fraction_ns - sign * offset_s * NS_PER_S
    return ns.to_numpy().astype(np.int64)


def _read_azure(path: Path) -> _Columns:
    """Azure LLM inference trace (2023 or 2024 timestamps)."""
    frame = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    ns = _azure_ns(path, frame)
    return _Columns(
        t_s=((ns - ns.min()) / NS_PER_S).astype(np.float64),
        prompt=_integers(path, frame, "ContextTokens"),
        output=_integers(path, frame, "GeneratedTokens"),
        prefix=None,
    )


def _read_burstgpt(path: Path) -> _Columns:
    """BurstGPT (both layouts: columns are found by name)."""
    frame = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"))
    return _Columns(
        t_s=_seconds(path, frame, "Timestamp"),
        prompt=_integers(path, frame, "Request tokens"),
        output=_integers(path, frame, "Response tokens"),
        prefix=None,
    )


def _read_plain_csv(path: Path) -> _Columns:
    """Plain CSV; `prefix_blocks`, when present, holds space-separated block ids."""
    frame = _read_csv(path, ("t_s", "prompt_tokens", "output_tokens"))
    prefix = None
    if "prefix_blocks" in frame.columns:
        prefix = [_block_ids(path, line, text) for line, text in _column_lines(frame)]
    return _Columns(
        t_s=_seconds(path, frame, "t_s"),
        prompt=_integers(path, frame, "prompt_tokens"),
        output=_integers(path, frame, "output_tokens"),
        prefix=prefix,
    )


def _column_lines(frame: pl.DataFrame) -> Iterator[tuple[int, str]]:
    """(line, prefix_blocks text) for each row of a plain CSV."""
    lines = frame["line"].to_list()
    texts = frame["prefix_blocks"].fill_null("").to_list()
    return zip(lines, texts, strict=True)


def _block_ids(path: Path, line: int, text: str) -> tuple[int, ...]:
    """Space-separated non-negative integers."""
    try:
        ids = tuple(int(word) for word in text.split())
    except ValueError:
        ids = (-1,)
    if any(i < 0 for i in ids):
        problem = f"prefix_blocks must be space-separated ids >= 0 (got {text!r})"
        raise ConfigError(str(path), f"line {line}", problem, "e.g. 0 1 2")
    return ids


# ---------------------------------------------------------------- JSON-lines formats

_MOONCAKE = {
    "timestamp": pl.Int64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "hash_ids": pl.List(pl.Int64),
}
_PLAIN_JSON = {
    "t_s": pl.Float64,
    "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "prefix_blocks": pl.List(pl.Int64),
}


def _read_jsonl(path: Path, schema: dict[str, Any], required: Sequence[str]) -> pl.DataFrame:
    """The fast path assumes a good file; any problem is explained by `_jsonl_problem`."""
    try:
        with path.open("rb") as handle:  # a file, not a path: polars would glob `[ ] * ?`
            frame = pl.read_ndjson(handle, schema=schema)
    except pl.exceptions.PolarsError:
        raise _jsonl_problem(path, schema, required) from None
    values = frame.select(required)
    has_null = values.null_count().sum_horizontal().item() > 0
    negative = any((frame[name] < 0).any() for name in required[1:])
    list_name = next(name for name in schema if name not in required)
    bad_list = frame[list_name].list.min().fill_null(0).lt(0).any()
    if frame.height == 0 or has_null or negative or bad_list:
        raise _jsonl_problem(path, schema, required)
    return frame


def _jsonl_problem(path: Path, schema: dict[str, Any], required: Sequence[str]) -> ConfigError:
    """Scan line by line for the first row that is not a valid record."""
    with path.open("rb") as file:
        count = 0
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            count += 1
            problem = _record_problem(line, schema, required)
            if problem:
                return ConfigError(str(path), f"line {number}", problem, _row_fix(required))
    if count == 0:
        return ConfigError(str(path), "", "trace file is empty", "give one JSON object a line")
    return ConfigError(str(path), "", "unreadable JSON lines", "check the file")


def _row_fix(required: Sequence[str]) -> str:
    return "each line is a JSON object with " + ", ".join(required)


def _record_problem(line: bytes, schema: dict[str, Any], required: Sequence[str]) -> str:
    """What is wrong with one JSON line, or "" if nothing."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return json_problem(exc)
    if not isinstance(record, dict):
        return "not a JSON object"
    for name, dtype in schema.items():
        value = record.get(name)
        if value is None:
            if name in required:
                return f"{name} is missing"
        elif dtype == pl.Float64:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{name} must be a number (got {value!r})"
        elif isinstance(dtype, pl.List):
            if not isinstance(value, list) or not all(_is_count(v) for v in value):
                return f"{name} must be a list of integers >= 0"
        elif name == "timestamp":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{name} must be an integer number of ms (got {value!r})"
        elif not _is_count(value):
            return f"{name} must be an integer >= 0 (got {value!r})"
    return ""


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_mooncake(path: Path) -> _Columns:
    """Mooncake FAST'25 traces: integer ms times, 512-token prefix blocks."""
    required = ("timestamp", "input_length", "output_length")
    frame = _read_jsonl(path, _MOONCAKE, required)
    return _Columns(
        t_s=_from_first(frame["timestamp"].to_numpy().astype(np.float64) / 1000.0),
        prompt=frame["input_length"].to_numpy().astype(np.int64),
        output=frame["output_length"].to_numpy().astype(np.int64),
        prefix=[tuple(ids) if ids else () for ids in frame["hash_ids"].to_list()],
    )


def _read_plain_jsonl(path: Path) -> _Columns:
    """Plain JSON lines; `prefix_blocks` optional."""
    frame = _read_jsonl(path, _PLAIN_JSON, ("t_s", "prompt_tokens", "output_tokens"))
    if not frame["t_s"].is_finite().all():
        raise ConfigError(str(path), "t_s", "must be finite numbers", "check the times")
    blocks = frame["prefix_blocks"]
    return _Columns(
        t_s=_from_first(frame["t_s"].to_numpy().astype(np.float64)),
        prompt=frame["prompt_tokens"].to_numpy().astype(np.int64),
        output=frame["output_tokens"].to_numpy().astype(np.int64),
        prefix=None if blocks.null_count() == len(blocks) else _tuples(blocks),
    )


def _tuples(blocks: pl.Series) -> list[tuple[int, ...]]:
    return [tuple(ids) if ids else () for ids in blocks.to_list()]


def _read_plain(path: Path) -> _Columns:
    """Plain CSV or JSON lines, told apart by the first character."""
    if _first_line(path).startswith("{"):
        return _read_plain_jsonl(path)
    return _read_plain_csv(path)


_READERS = {
    "azure": _read_azure,
    "burstgpt": _read_burstgpt,
    "mooncake": _read_mooncake,
    "plain": _read_plain,
}


# ---------------------------------------------------------------- statistics and prefixes


def trace_stats(requests: Sequence[TraceRequest]) -> dict[str, float]:
    """Count, duration, rate and shape of a request list, to compare a replay with its trace.

    rate_per_s = count / duration_s (first to last request); gap_cv = std/mean of the
    inter-arrival gaps (population std; Poisson = 1); percentiles are nearest rank
    (`loadgen.percentiles`), as everywhere in loadgen: observed token counts.
    """
    times = np.array([r.t_s for r in requests], dtype=np.float64)
    prompt = np.array([r.prompt_tokens for r in requests], dtype=np.float64)
    output = np.array([r.output_tokens for r in requests], dtype=np.float64)
    stats: dict[str, float] = {"count": len(requests)}
    duration = float(times[-1] - times[0]) if len(times) else 0.0
    gaps = np.diff(times)
    stats["duration_s"] = duration
    stats["rate_per_s"] = len(times) / duration if duration > 0 else math.nan
    stats["gap_cv"] = _cv(gaps)
    for name, values in (("prompt_tokens", prompt), ("output_tokens", output)):
        empty = len(values) == 0
        stats[f"{name}_mean"] = math.nan if empty else float(values.mean())
        stats[f"{name}_p50"] = math.nan if empty else _percentile(values, 50)
        stats[f"{name}_p99"] = math.nan if empty else _percentile(values, 99)
        stats[f"{name}_cv"] = _cv(values)
    return stats


def _percentile(values: FloatArray, percentile: float) -> float:
    """The nearest-rank percentile of a non-empty array."""
    return float(np.sort(values)[nearest_rank(percentile, len(values)) - 1])


def _cv(values: FloatArray) -> float:
    """Coefficient of variation (population std / mean), NaN when undefined."""
    if len(values) == 0 or values.mean() <= 0:
        return math.nan
    return float(values.std() / values.mean())


def shared_prefix_groups(requests: Sequence[TraceRequest]) -> list[tuple[int, ...]]:
    """For each request, one group id per leading prefix block it shares with another request.

    Contract for the prompt builder: each block is `prompts.PREFIX_BLOCK_TOKENS` (512) tokens; a
    group id names one whole prefix path (the blocks from the start up to and including
    this one), so two requests whose first m group ids are equal share their first m
    blocks. The builder makes the text of a block a pure function of its group id and
    gives each request min(512 · len(groups), prompt_tokens) tokens of that shared text,
    then text of its own. Blocks no other request shares get no id (their text may be
    anything unique). Ids are dense, 0, 1, ... in order of first appearance.
    """
    paths: dict[tuple[int, int], int] = {}  # (parent path, block id) → path number
    counts: list[int] = []
    request_paths: list[list[int]] = []
    for request in requests:
        parent, mine = -1, []
        for block in request.prefix_blocks:
            node = paths.setdefault((parent, block), len(paths))
            if node == len(counts):
                counts.append(0)
            counts[node] += 1
            mine.append(node)
            parent = node
        request_paths.append(mine)
    dense: dict[int, int] = {}
    groups = []
    for mine in request_paths:
        shared = [node for node in mine if counts[node] > 1]  # counts fall along a path
        groups.append(tuple(dense.setdefault(node, len(dense)) for node in shared))
    return groups
