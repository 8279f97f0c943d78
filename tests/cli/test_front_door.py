"""The front door: every bad input is refused with exit 1 and a message, in bounded time and
memory; a client-side failure mid-run is named, exits 3 and keeps what was written.

Each bad input of issue #14 has a row in `BAD_INPUTS` (the file or flags, and a fragment of
the message); the bounds themselves are checked against numbers computed here: the YAML
node count of a document, the span of a schedule, the memory of a plan.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import loadgen.results.write as write_module
import loadgen.workload.inputs as inputs
from loadgen.cli import cli
from loadgen.errors import ConfigError
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.workload.plans import PLAN_BYTES, RECORD_BYTES, TOKEN_BYTES, estimate_memory, plan_work
from loadgen.workload.spec import MAX_SPAN_S, loads

BASE = chat_workload("front-door", target=None)
LAX = ("--lag-bound-ms", "1000")  # these tests are not about the generator's own lag


def _with(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new)


LOL = "".join(  # the billion laughs: 9 levels of 9 aliases each, 9**9 strings expanded
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
BOMB = _with(
    "name: front-door\n", 'name: front-door\ntarget:\n  extra_body:\n    l0: &l0 "lol"\n' + LOL
)

# (id, workload text or None for BASE, extra CLI args, fragment of the message)
BAD_INPUTS = [
    ("requests-1e11", _with("requests: 20", "requests: 1e11"), [],
     "classes.chat.requests: must be <= 100,000,000"),
    ("requests-int-1e11", _with("requests: 20", "requests: 100000000000"), [],
     "classes.chat.requests: must be <= 100,000,000"),
    ("rate-1e-12", _with("rate_per_s: 50", "rate_per_s: 1.0e-12"), [],
     "20 requests at 1e-12 req/s would span ~19,000,000,000,000 s"),
    ("rate-1e-12-quoted", _with("rate_per_s: 50", 'rate_per_s: "1e-12"'), [],
     "write it without quotes: rate_per_s: 1e-12"),
    ("rate-too-high", _with("rate_per_s: 50", "rate_per_s: 1e9"), [],
     "rate_per_s: must be <= 1,000,000"),
    ("duration-inf", _with("requests: 20", "duration_s: .inf"), [],
     "duration_s: must be a number, got float inf"),
    ("duration-40-days", _with("requests: 20", "duration_s: 3456000"), [],
     "duration_s: must be <= 2,678,400 (31 days"),
    ("tokens-huge", _with("value: 3", "value: 1e12"), [],
     "output_tokens.value: must be <= 10,000,000"),
    ("alias-bomb-extra-body", BOMB, [], "expands to more than 100,000 nodes through its aliases"),
    ("recursive-anchor", _with("name: front-door\n", "name: front-door\nx: &a [*a]\n"), [],
     "recursive anchor"),
    ("nested-100-deep", _with("name: front-door\n", "name: front-door\nx: " + "[" * 100 + "]" * 100
                              + "\n"), [], "nests deeper than 64 levels"),
    ("stall-over-total", _with("stall_s: 5, total_s: 10", "stall_s: 90, total_s: 10"), [],
     "deadlines.stall_s: 90 s is longer than total_s: 10: it can never fire"),
    ("first-token-over-default-total", _with(
        "deadlines: {first_token_s: 5, stall_s: 5, total_s: 10}", "deadlines: {first_token_s: 700}"
    ), [], "first_token_s: 700 s is longer than total_s (default 600)"),
    ("url-port-99999-in-file", _with("name: front-door\n",
                                     "name: front-door\ntarget: {url: 'http://127.0.0.1:99999'}\n"),
     [], "target.url: is not a valid URL (Port out of range 0-65535)"),
    ("extra-body-not-json", _with("name: front-door\n",
                                  "name: front-door\ntarget: {extra_body: {when: 2024-01-01}}\n"),
     [], "target.extra_body: is not JSON"),
    ("header-crlf-in-file", _with("name: front-door\n",
                                  'name: front-door\ntarget: {headers: {X-A: "a\\r\\nX-B: b"}}\n'),
     [], "must not contain CR, LF or NUL"),
    ("trace-drives-agent", _with("arrival: {process: constant, rate_per_s: 50}\n    requests: 20",
                                 "kind: agent\n    arrival: {process: trace, path: t.csv}"), [],
     "arrival.process: a trace cannot drive kind: agent: each trace row is one request"),
    ("trace-thinned-to-nothing", _with(
        "arrival: {process: constant, rate_per_s: 50}\n    requests: 20",
        "arrival: {process: trace, path: t.csv, rate_scale: 0.01}"), [],
     "no requests to replay: the window holds 3 rows and rate_scale 0.01 kept none"),
    ("target-path-with-space", _with("name: front-door\n", "name: front-door\ntarget: "
                                     "{path: /v1/chat completions}\n"), [],
     "target.path: must start with / and be ASCII without spaces"),
    ("requests-flag-10M", None, ["--requests", "10000000", "--max-memory-gb", "4"],
     "this plan needs ~"),
    ("requests-flag-too-many", None, ["--requests", "1000000000"],
     "is not in the range 1<=x<=100000000"),
    ("duration-flag-nan", None, ["--duration", "nan"], "must be a finite number"),
    ("rate-flag-makes-span", None, ["--rate", "0.000001"], "with --rate would span"),
    ("memory-flag-zero", None, ["--max-memory-gb", "0"], "must be a finite number > 0"),
]  # fmt: skip


def _check(tmp_path: Path, text: str | None, args: list[str]) -> tuple[int, str, object]:
    (tmp_path / "t.csv").write_text("t_s,prompt_tokens,output_tokens\n0,5,3\n1,5,3\n2,5,3\n")
    path = workload_file(tmp_path, BASE if text is None else text)
    result = CliRunner().invoke(cli, ["check", str(path), *args])
    return result.exit_code, result.output, result.exception


@pytest.mark.parametrize(
    ("case", "text", "args", "fragment"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_inputs_exit_1_with_their_message(
    tmp_path: Path, case: str, text: str | None, args: list[str], fragment: str
) -> None:
    """Each bad input of issue #14 ends `check` with exit 1 and its message, no traceback."""
    code, output, exception = _check(tmp_path, text, args)
    assert code == 1, output
    assert isinstance(exception, SystemExit), exception
    assert "Traceback" not in output
    assert fragment in output, output


def test_the_base_workload_passes(tmp_path: Path) -> None:
    """The workload the bad inputs are made from is itself valid (each row breaks one thing)."""
    code, output, _ = _check(tmp_path, None, [])
    assert code == 0, output
    assert "client memory: ~" in output


# ---------------------------------------------------------------- bounded reading


def test_workload_file_over_the_cap_names_size_and_cap(tmp_path: Path) -> None:
    """A workload file one byte over 1 MiB is refused with its size and the cap, unread."""
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (inputs.WORKLOAD_MAX_BYTES + 1))
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert "the workload file is 1 MiB: over the 1 MiB cap" in result.output
    assert "trace file" in result.output  # the fix


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_is_read_only_to_the_cap() -> None:
    """/dev/zero (no size, no end) costs one cap of reading, then a clear refusal."""
    result = CliRunner().invoke(cli, ["check", "/dev/zero"])
    assert result.exit_code == 1
    assert "holds more than that: over the 1 MiB cap" in result.output


def test_trace_file_over_the_cap_is_refused_at_check(tmp_path: Path, monkeypatch) -> None:
    """A trace over the cap is refused by name, size and cap before it is read."""
    import loadgen.workload.sections as sections

    monkeypatch.setattr(sections, "TRACE_MAX_BYTES", 64)
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,prompt_tokens,output_tokens\n" + "0,1,1\n" * 20)
    text = _with("arrival: {process: constant, rate_per_s: 50}\n    requests: 20",
                 "arrival: {process: trace, path: t.csv}")  # fmt: skip
    with pytest.raises(ConfigError, match=r"trace file .*t.csv is 152 B: over the 64 B cap"):
        loads(text, str(tmp_path / "w.yaml"))


@pytest.mark.parametrize(
    ("data", "where", "byte"),
    [
        (b"name: t\xff\n", "byte 7 (line 1, column 8)", "0xff"),
        (b"name: t\nx: \xc3(\n", "byte 11 (line 2, column 4)", "0xc3"),
        (b"\xef\xbb\xbfname: \x80\n", "byte 9 (line 1, column 10)", "0x80"),  # after a BOM
    ],
)
def test_non_utf8_file_is_named_with_the_byte_offset(
    tmp_path: Path, data: bytes, where: str, byte: str
) -> None:
    """The first byte that is not UTF-8 is named by offset, line and column."""
    path = tmp_path / "w.yaml"
    path.write_bytes(data)
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert f"{path}: {where}: not UTF-8 text (byte {byte})" in result.output


def test_yaml_1_2_floats_are_numbers_and_whole_floats_are_integers() -> None:
    """`1e-3` is a number (YAML 1.1 would read a string) and `requests: 1e3` is 1000."""
    spec = loads(
        _with("rate_per_s: 50", "rate_per_s: 5e1").replace("requests: 20", "requests: 2e1")
    )
    chat = spec.classes["chat"]
    assert chat.arrival.rate_per_s == 50.0
    assert chat.requests == 20
    assert isinstance(chat.requests, int)
    with pytest.raises(ConfigError, match=r"requests: must be an integer, got float 2\.5"):
        loads(_with("requests: 20", "requests: 2.5"))


def _expanded_nodes(budget: int, monkeypatch) -> None:
    monkeypatch.setattr(inputs, "YAML_NODE_BUDGET", budget)
    inputs.load_yaml("a: &x [1, 2]\nb: *x\n", "t.yaml")


def test_node_budget_counts_every_alias_expansion(monkeypatch) -> None:
    """`a: &x [1, 2]` then `b: *x` is 9 nodes once expanded: the root, 2 keys, the list
    (3 nodes) and its copy through the alias (3 more): a budget of 9 passes, 8 refuses."""
    _expanded_nodes(9, monkeypatch)
    with pytest.raises(ConfigError, match="more than 8 nodes through its aliases"):
        _expanded_nodes(8, monkeypatch)


def test_the_issues_billion_laughs_fails_at_check_in_a_fraction_of_its_size(tmp_path) -> None:
    """The 9**9 bomb inside extra_body is refused after composing: memory stays near the
    ~40 nodes it is written with (tracemalloc peak far below what expansion would take)."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="through its aliases"):
            loads(BOMB, "bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak  # expansion: 9**9 = 387,420,489 list slots (> 3 GB)


# ---------------------------------------------------------------- ranges


def test_the_span_of_a_schedule_is_checked_before_planning() -> None:
    """At 1 req/s, 2,678,401 requests span 2,678,400 s (the limit, accepted); one more is
    refused, with the arithmetic in the message."""
    at_limit = _with("rate_per_s: 50", "rate_per_s: 1").replace("requests: 20", "requests: 2678401")
    spec = loads(at_limit)
    assert spec.classes["chat"].requests == MAX_SPAN_S + 1
    over = at_limit.replace("requests: 2678401", "requests: 2678402")
    with pytest.raises(ConfigError, match="2,678,402 requests at 1 req/s would span ~2,678,401 s"):
        loads(over)


def test_think_times_past_the_span_are_caught_by_the_plans() -> None:
    """The planned times are checked too: one 2-turn session starting 5 s before the limit
    fits with a 4 s think time, and is refused by `plan_work` with a 10 s one (the spec's
    expected-span check cannot see think times)."""
    session = "requests: 1\n    turns: {dist: fixed, value: 2}\n    think_time_s: {dist: fixed, value: %d}"
    text = _with("rate_per_s: 50", "rate_per_s: 50, start_s: 2678395")
    fits = plan_work(loads(text.replace("requests: 20", session % 4))).plans
    assert [p.intended_ns for p in fits] == [2_678_395 * 10**9, 2_678_399 * 10**9]
    with pytest.raises(ConfigError, match="reaches 2,678,405 s after t0: more than 2,678,400 s"):
        plan_work(loads(text.replace("requests: 20", session % 10)))


@pytest.mark.parametrize(
    ("deadlines", "expected"),
    [
        ("{total_s: 20}", (20.0, 20.0, 20.0)),  # unset deadlines shrink to total_s
        ("{first_token_s: 5, total_s: 20}", (5.0, 20.0, 20.0)),
        ("{first_token_s: 20, stall_s: 20, total_s: 20}", (20.0, 20.0, 20.0)),  # equal can fire
        ("{}", (60.0, 30.0, 600.0)),
    ],
)
def test_deadlines_that_can_fire_are_accepted(deadlines: str, expected: tuple) -> None:
    """Deadlines no longer than total_s are kept; unset ones default, capped at total_s."""
    spec = loads(_with("{first_token_s: 5, stall_s: 5, total_s: 10}", deadlines))
    got = spec.classes["chat"].deadlines
    assert (got.first_token_s, got.stall_s, got.total_s) == expected


# ---------------------------------------------------------------- the plan's memory


def test_memory_estimate_is_the_documented_formula() -> None:
    """20 requests of 3 output tokens: 20 × (PLAN + RECORD + 3 × TOKEN) bytes."""
    estimate = estimate_memory(loads(BASE))
    assert (estimate.requests, estimate.output_tokens) == (20, 3.0)
    assert estimate.bytes == 20 * (PLAN_BYTES + RECORD_BYTES + 3 * TOKEN_BYTES)


def test_memory_estimate_counts_sessions_by_their_mean_turns() -> None:
    """A class of 100 sessions of uniform 1-5 turns expects 300 requests."""
    text = BASE.replace("requests: 20", "requests: 100\n    turns: {dist: uniform, min: 1, max: 5}")
    assert estimate_memory(loads(text)).requests == 300


def test_plan_bytes_match_what_planning_allocates() -> None:
    """tracemalloc's peak while planning 20,000 requests is within ±40 % of PLAN_BYTES each
    (a Python-allocation count: deterministic, unlike RSS on a shared machine)."""
    spec = loads(_with("requests: 20", "requests: 20000"))
    tracemalloc.start()
    try:
        plans = plan_work(spec).plans
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(plans) == 20_000
    assert 0.6 * PLAN_BYTES <= peak / 20_000 <= 1.4 * PLAN_BYTES, peak / 20_000


AUDIT_PEAK = """
import re, sys
from pathlib import Path
import polars as pl
from loadgen.results.records import SCHEMA
from loadgen.results.runfolder import read_parts
from loadgen.results.write import write_parquet_atomic
from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.workload.spec import SloTargets
from loadgen.analysis.minutes import build_histograms

def peak() -> int:
    return int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text())[1]) * 1024

n, tokens, parts = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
slos = {"chat": SloTargets(ttft_ms=1000, tpot_ms=50, percentile=99)}
objectives = {"chat": Objective(name="chat", slo=slos["chat"])}
for start in range(0, n, 1000):  # the parts a run spills, 1,000 records each
    ids = pl.int_range(start, start + 1000, eager=True)
    first = ids * 2_000_000 + 50_000_000
    chunks = pl.int_ranges(first, first + tokens * 1_000_000, 1_000_000, eager=True)
    part = pl.DataFrame({
        "request_id": ids, "class": pl.repeat("chat", 1000, eager=True),
        "intended_ns": ids * 2_000_000, "sent_ns": ids * 2_000_000, "first_token_ns": first,
        "first_content_ns": first, "last_token_ns": first + (tokens - 1) * 1_000_000,
        "end_ns": first + tokens * 1_000_000, "chunk_ns": chunks,
        "chunk_tokens": chunks.list.eval(pl.lit(1, pl.Int32)),
        "output_tokens": pl.repeat(tokens, 1000, eager=True),
        "outcome": pl.repeat("ok", 1000, eager=True), "token_source": pl.repeat("usage", 1000, eager=True),
    })
    part = part.with_columns(pl.lit(None, d).alias(c) for c, d in SCHEMA.items() if c not in part.columns)
    write_parquet_atomic(part.select(list(SCHEMA)).cast(SCHEMA), parts / f"part-{start:06d}.parquet")
    del part, chunks
audit(pl.DataFrame(schema=SCHEMA), run_id="x", objectives=objectives, planned=0, lag_bound_ms=5)
base = peak()
frame = read_parts(parts)  # what the end of a run does: join, audit, per-minute histograms
audit(frame, run_id="x", objectives=objectives, planned=n, lag_bound_ms=5)
build_histograms(frame, t0_unix_ns=1_764_417_600 * 10**9, slos=slos)
print(peak() - base)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_record_bytes_bound_the_end_of_run_audit(tmp_path: Path) -> None:
    """The end of a run (join 20,000 records of 64 chunks from their parts, audit them,
    build the per-minute histograms) peaks below n × (RECORD + 64 × TOKEN) bytes of RSS and
    above half of it: the estimate is a cap that does not refuse twice what a host holds.
    Measured in a fresh process (peak RSS follows allocations, not the machine's load)."""
    result = subprocess.run(
        [sys.executable, "-c", AUDIT_PEAK, "20000", "64", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    estimated = 20_000 * (RECORD_BYTES + 64 * TOKEN_BYTES)
    measured = int(result.stdout)
    assert 0.5 * estimated <= measured <= estimated, (measured, estimated)


def test_a_plan_over_the_memory_cap_is_refused_with_the_figure_and_the_flag(tmp_path) -> None:
    """10,000,000 requests: refused in `check` and `run` at once with the estimate and the
    cap; `--max-memory-gb` above the estimate lets `check` go on (to its plan)."""
    path = workload_file(tmp_path, _with("rate_per_s: 50", "rate_per_s: 1000"))
    spec = loads(path.read_text())
    from loadgen.workload.spec import override

    need = estimate_memory(override(spec, requests=10_000_000)).bytes
    for command in ("check", "run"):
        result = CliRunner().invoke(
            cli, [command, str(path), "--requests", "10000000", "--max-memory-gb", "1"]
        )
        assert result.exit_code == 1, result.output
        assert f"this plan needs ~{inputs.size_text(need)} for 10,000,000 requests" in result.output
        assert "over the 1 GiB memory cap (--max-memory-gb 1)" in result.output
    ok = CliRunner().invoke(cli, ["check", str(path), "--requests", "2000", "--max-memory-gb", "1"])
    assert ok.exit_code == 0, ok.output


# ---------------------------------------------------------------- run's own flags


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--url", "http://127.0.0.1:99999"], "Port out of range 0-65535"),
        (["--url", "http://127.0.0.1:0"], "port must be 1-65535"),
        (["--url", "http://127.0.0.1:abc"], "is not a valid URL"),
        (["--url", "http://[::1"], "is not a valid URL"),
        (["--url", "ftp://127.0.0.1"], "must look like http://host:port"),
        (["--url", "http://"], "has no host"),
        (["--run-id", "../../escape"], "is not a safe folder name"),
        (["--run-id", "a/b"], "is not a safe folder name"),
        (["--run-id", ".."], "is not a safe folder name"),
        (["--run-id", ".hidden"], "is not a safe folder name"),
        (["--run-id", "x" * 129], "is not a safe folder name"),
        (["--header", "X-A:1\r\nX-B: 2"], "must not contain CR, LF or NUL"),
        (["--header", "X A:1"], "is not a header name"),
        (["--header", "X-A:€"], "a header value must be ASCII (or Latin-1) text"),
        (["--url", "http://bücher.example:8000"], "must be ASCII without spaces"),
        (["--lag-bound-ms", "nan"], "must be a finite number"),
        (["--watchdog", "inf"], "must be a finite number"),
        (["--grace", "-1"], "must be a finite number"),
        (["--seed", "-1"], "is not in the range"),
    ],
)
def test_run_flags_are_validated_before_anything_starts(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    """A bad --url, --run-id, --header or number exits 1 with the reason; nothing is written."""
    path = workload_file(tmp_path, BASE)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", str(path), "--out", str(out), *args])
    assert result.exit_code == 1, result.output
    assert fragment in result.output, result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.parametrize("run_id", ["nightly-2026-11-29", "a", "A.b_c-1", "x" * 128])
def test_safe_run_ids_are_accepted_by_dry_run(tmp_path: Path, run_id: str) -> None:
    """Letters, digits and -_. pass; the dry run validates, prints the plan, writes nothing."""
    path = workload_file(tmp_path, BASE)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["run", str(path), "--out", str(out), "--run-id", run_id, "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "dry run: valid; would send 20 requests to the built-in simulator" in result.output
    assert not out.exists()


def test_dry_run_checks_what_run_would_check(tmp_path: Path, monkeypatch) -> None:
    """A header's missing ${VAR}, a ${VAR} holding CR/LF (header injection) and an existing
    run folder fail the dry run as they would fail the run."""
    monkeypatch.delenv("FRONT_DOOR_TOKEN", raising=False)
    path = workload_file(tmp_path, BASE)
    missing = CliRunner().invoke(
        cli, ["run", str(path), "--dry-run", "--header", "X-Token:${FRONT_DOOR_TOKEN}"]
    )
    assert missing.exit_code == 1
    assert "--header 'X-Token: ${FRONT_DOOR_TOKEN}': FRONT_DOOR_TOKEN is not set" in missing.output
    monkeypatch.setenv("FRONT_DOOR_TOKEN", "abc\r\nX-Injected: 1")
    injected = CliRunner().invoke(
        cli, ["run", str(path), "--dry-run", "--header", "X-Token:${FRONT_DOOR_TOKEN}"]
    )
    assert injected.exit_code == 1
    flag = "--header 'X-Token: ${FRONT_DOOR_TOKEN}'"
    assert f"{flag}: its value must not contain CR, LF or NUL" in injected.output
    assert "Injected" not in injected.output  # the value (maybe a secret) is never echoed
    (tmp_path / "out" / "taken").mkdir(parents=True)
    taken = CliRunner().invoke(
        cli, ["run", str(path), "--dry-run", "--out", str(tmp_path / "out"), "--run-id", "taken"]
    )
    assert taken.exit_code == 1
    assert "already exists" in taken.output
    too_long = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--out", "x" * 300])
    assert too_long.exit_code == 1, too_long.output  # found by the slow fuzz: was an OSError
    assert "--out: cannot use 'xxx" in too_long.output
    assert "File name too long (give --out a shorter, plain folder path)" in too_long.output


def test_dry_run_refuses_a_url_nothing_listens_on_and_sends_nothing_to_one_that_does(
    tmp_path: Path,
) -> None:
    """A closed port is exit 1 with the preflight's words (the dry run called it valid); a
    listening server is connected to, sent no request, and the dry run says it is valid."""
    path = workload_file(tmp_path, BASE)
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--url",
                                      f"http://127.0.0.1:{port}"])  # fmt: skip
    assert closed.exit_code == 1, closed.output
    assert f"cannot connect to http://127.0.0.1:{port}: Connection refused" in closed.output
    with socket.create_server(("127.0.0.1", 0)) as server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        listening = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--url", url])
        assert listening.exit_code == 0, listening.output
        assert f"to {url} (it accepts connections); nothing was sent" in listening.output
        connection, _ = server.accept()  # the dry run's, queued by the kernel
        with connection:
            connection.settimeout(10)
            assert connection.recv(1024) == b""  # closed without a byte sent


def test_a_run_folder_that_cannot_be_made_fails_dry_run_and_run_alike(tmp_path: Path) -> None:
    """--out under a file (or a folder this user may not write) is exit 1 from the dry run,
    which called it valid, and from the run, before anything starts."""
    path = workload_file(tmp_path, BASE)
    (tmp_path / "a-file").write_text("")
    for extra in (["--dry-run"], [*LAX, "-q"]):
        result = CliRunner().invoke(
            cli, ["run", str(path), "--out", str(tmp_path / "a-file" / "store"), *extra]
        )
        assert result.exit_code == 1, result.output
        assert f"cannot create the run folder under {tmp_path / 'a-file' / 'store'}: " in (
            result.output
        )
        assert f"{tmp_path / 'a-file'} is not a folder" in result.output
        assert "started the built-in simulator" not in result.output


# ---------------------------------------------------------------- client failures mid-run


def _run(tmp_path: Path, requests: int, handler, *extra: str) -> tuple[int, str, Path]:
    path = workload_file(tmp_path, _with("requests: 20", f"requests: {requests}"))
    with ScriptedServer(handler) as server:
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", server.url, "--out", str(tmp_path / "out"),
                  "--run-id", "r1", "-q", *LAX, *extra],
        )  # fmt: skip
    return result.exit_code, result.output, tmp_path / "out" / "r1"


def _failing_part_writes(monkeypatch, code: int, *, after: int, times: int = 10**9) -> list[str]:
    """Make part writes raise OSError(code) after `after` good ones, `times` times over."""
    real = write_module.write_file_atomic
    failed: list[str] = []

    def write(path: Path, data: bytes | memoryview) -> None:
        parts = list(path.parent.glob("part-*.parquet"))
        if path.name.startswith("part-") and len(parts) >= after and len(failed) < times:
            failed.append(path.name)
            raise OSError(code, os.strerror(code), str(path))
        real(path, data)

    monkeypatch.setattr(write_module, "write_file_atomic", write)
    return failed


@pytest.mark.parametrize(
    ("code", "fragment"),
    [
        (errno.ENOSPC, "no space left on the device holding"),
        (errno.EACCES, "permission denied writing"),
        (errno.EDQUOT, "disk quota exceeded writing"),
        (errno.EROFS, "read-only file system: cannot write"),
    ],
)
@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_a_failed_write_mid_run_is_named_exits_3_and_keeps_what_was_written(
    tmp_path: Path, monkeypatch, code: int, fragment: str
) -> None:
    """After one good part, every write fails: the run stops at once (long before its 8 s
    schedule ends) with one line naming the cause and the part's path, exit 3; the part on
    disk is kept and `report --recover` (once writes work again) joins it."""
    _failing_part_writes(monkeypatch, code, after=1)
    exit_code, output, run_dir = _run(tmp_path, 400, lambda r: simple_chat(3, gap_s=0.005))
    assert exit_code == 3, output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    sent = int(re.search(r"the run stopped \(([\d,]+) sent\)", lines[0])[1].replace(",", ""))
    assert sent < 400  # stopped at the failure (~2 s in), not at the end of the 8 s schedule
    assert f"{fragment} {run_dir / 'records.parts'}/part-" in lines[0]
    assert "not a measurement of the server (exit 3)" in lines[0]
    assert f"loadgen report --recover {run_dir}" in lines[0]
    assert "Traceback" not in output
    on_disk = pl.concat([pl.read_parquet(p) for p in (run_dir / "records.parts").glob("part-*")])
    assert f"{on_disk.height:,} of 400 planned records are on disk" in lines[0]
    assert not list((run_dir / "records.parts").glob(".*.tmp"))  # no half-written part left
    info = json.loads((run_dir / "run.json").read_text())
    assert info["finished"] is False
    assert fragment in info["client_failure"]
    monkeypatch.undo()
    recovered = CliRunner().invoke(cli, ["report", "--recover", str(run_dir)])
    assert "Traceback" not in recovered.output
    joined = pl.read_parquet(run_dir / "records.parquet")
    assert set(on_disk["request_id"]) <= set(joined["request_id"])


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_running_out_of_file_descriptors_for_a_moment_loses_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    """EMFILE is transient (sockets close as requests end): the batch is retried with the
    next one, and the run ends normally with one record per planned request."""
    failed = _failing_part_writes(monkeypatch, errno.EMFILE, after=0, times=2)
    exit_code, output, run_dir = _run(tmp_path, 60, lambda r: simple_chat(3))
    assert failed, "the fault was never injected"
    assert exit_code == 0, output
    assert pl.read_parquet(run_dir / "records.parquet").height == 60


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow  # ~8 s on 2 cores: left to .ci/run's second part
def test_a_real_file_size_limit_at_the_join_exits_3_and_recover_finishes(tmp_path: Path) -> None:
    """A real kernel error: under `ulimit -f` of 32 KiB each ~1 s part fits but the joined
    records.parquet (~60 KiB for 300 records of 32 chunks) does not: EFBIG names the file
    and the limit, exit 3, every part stays on disk, and `report --recover` joins them all."""
    path = workload_file(
        tmp_path, _with("rate_per_s: 50", "rate_per_s: 50").replace("requests: 20", "requests: 300")
    )
    out = tmp_path / "out"
    with ScriptedServer(lambda r: simple_chat(32, gap_s=0.002)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "run", str(path), "--url", server.url,
             "--out", str(out), "--run-id", "r1", "-q", *LAX],
            capture_output=True, text=True, timeout=120,
            preexec_fn=lambda: _limit_file_size(32 * 1024),
        )  # fmt: skip
    run_dir = out / "r1"
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (f"error: file size limit exceeded writing {run_dir / 'records.parquet'} "
            "(limit 32,768 bytes: raise it with ulimit -f)") in proc.stderr  # fmt: skip
    assert "300 of 300 planned records are on disk" in proc.stderr
    recovered = CliRunner().invoke(cli, ["report", "--recover", str(run_dir)])
    assert "Traceback" not in recovered.output
    assert pl.read_parquet(run_dir / "records.parquet").height == 300
