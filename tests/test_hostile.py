"""Hostile servers: every misbehaviour ends as a classified outcome, one record per planned
request, with bounded memory and time, in the run and in the preflight."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter

import polars as pl
import pytest
from click.testing import CliRunner, Result

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.cli import cli
from loadgen.engine.preflight import preflight
from loadgen.engine.transport import make_endpoint
from loadgen.errors import TargetError
from loadgen.results.records import Outcome
from loadgen.testing import ScriptedServer, chat_chunk, simple_chat, stream_steps
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.testing.hostile import CASES, DEADLINES, HostileCase

REQUESTS = 3
DEADLINE_FLOW = (f"{{first_token_s: {DEADLINES.first_token_s:g}, stall_s: {DEADLINES.stall_s:g}, "
                 f"total_s: {DEADLINES.total_s:g}}}")  # fmt: skip
WORKLOAD = chat_workload("hostile", rate_per_s=20, requests=REQUESTS, deadlines=DEADLINE_FLOW)
# A run of 3 requests 50 ms apart, each ended by its 2 s total deadline at the latest, plus
# the run's own work (writing records and summary): far under this on any machine, and
# far over it for a client that waits on the server (one byte a second is minutes; the
# heartbeats never end).
RUN_BOUND_S = DEADLINES.total_s + 20.0
PREFLIGHT_S = 1.0
PREFLIGHT_BOUND_S = PREFLIGHT_S + 10.0
# Peak RSS over a warm healthy run: the caps hold a few MiB per stream (1 MiB event, one
# 256 KiB read). Buffering the 100 MiB line (or 20 MiB of headers) would pass this 4 times
# over, however the machine is loaded.
RSS_BOUND_MIB = 48


def peak_rss_growth_mib(action: Callable[[], object]) -> float | None:
    """MiB the process's peak RSS rose above its RSS before `action` (None off Linux)."""
    status = Path("/proc/self/status")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak to now
    except OSError:
        return None

    def kib(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+) kB", status.read_text()).group(1))  # type: ignore[union-attr]

    before = kib("VmRSS")
    action()
    return (kib("VmHWM") - before) / 1024


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's workload, after one healthy run has warmed the process up (imports,
    allocator pools), so RSS growth measures the case, not the first run."""
    path = workload_file(tmp_path_factory.mktemp("hostile"), WORKLOAD, "hostile.yaml")
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        out = path.parent / "warm"
        result = invoke(path, server.url, out)
    assert result.exit_code == 0, result.output
    return path


def invoke(path: Path, url: str, out: Path, *extra: str) -> Result:
    return CliRunner().invoke(
        cli, ["run", str(path), "--url", url, "--out", str(out), "--run-id", "r", "-q",
              "--lag-bound-ms", "1000", "--no-preflight", *extra],
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_hostile_server_gives_classified_records_in_bounded_memory_and_time(
    case: HostileCase, workload: Path, tmp_path: Path
) -> None:
    """Each request against the case ends with its outcome and reason, planned == recorded,
    and the run ends within its deadlines with peak RSS near a healthy run's."""
    got = {}

    def run() -> None:
        with ScriptedServer(case.script) as server:
            started = perf_counter()
            got["result"] = invoke(workload, server.url, tmp_path)
            got["wall_s"] = perf_counter() - started

    growth = peak_rss_growth_mib(run)
    result = got["result"]
    assert result.exit_code == (0 if case.outcome is Outcome.OK else 2), result.output
    assert "Traceback" not in result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    assert records.height == REQUESTS  # planned == recorded
    assert set(records["outcome"]) == {case.outcome.value}, records["error"].to_list()
    if case.error:
        assert all(case.error in e for e in records["error"]), records["error"].to_list()
    assert got["wall_s"] < RUN_BOUND_S
    if sys.platform == "linux":
        assert growth is not None, "peak RSS is measurable on Linux (/proc/self/clear_refs)"
    if growth is not None:
        assert growth < RSS_BOUND_MIB, f"peak RSS grew {growth:.0f} MiB"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_preflight_ends_by_its_deadline_with_what_went_wrong(case: HostileCase) -> None:
    """Against each case the preflight passes or says what was wrong, within its deadline."""
    adapter = adapter_for("openai-chat")
    got = {"message": ""}

    def check() -> None:
        with ScriptedServer(case.script) as server:
            endpoint = make_endpoint(server.url, adapter.default_path, {})
            started = perf_counter()
            try:
                preflight(endpoint, adapter, BodyOptions(model="m"), timeout_s=PREFLIGHT_S)
            except TargetError as exc:
                got["message"] = str(exc)
            got["elapsed_s"] = perf_counter() - started

    growth = peak_rss_growth_mib(check)
    assert got["elapsed_s"] < PREFLIGHT_BOUND_S
    if case.preflight:
        assert case.preflight in got["message"]
    else:
        assert got["message"] == ""
    if growth is not None:
        assert growth < RSS_BOUND_MIB, f"peak RSS grew {growth:.0f} MiB"


def test_each_class_has_its_own_event_cap(tmp_path: Path) -> None:
    """10 KiB tokens pass the default 1 MiB cap and fail a class capped at 4 KiB, whose
    records name its cap and key."""
    path = tmp_path / "w.yaml"
    small = WORKLOAD.split("classes:\n", 1)[1].replace("chat:", "small:")
    small = small.replace("    deadlines:", "    limits: {max_event_bytes: 4096}\n    deadlines:")
    path.write_text(WORKLOAD + small)
    big_token = chat_chunk("x" * 10_240)
    with ScriptedServer(
        lambda r: stream_steps(
            [chat_chunk(role="assistant"), big_token, chat_chunk(finish="length")]
        )
    ) as server:
        result = invoke(path, server.url, tmp_path)
    assert result.exit_code == 2, result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    by_class = {name: set(group["outcome"]) for (name,), group in records.group_by("class")}
    assert by_class == {"chat": {"ok"}, "small": {"stream_error"}}
    errors = set(records.filter(pl.col("class") == "small")["error"])
    assert errors == {
        "a stream event over the 4 KiB cap (limits.max_event_bytes of class small): "
        "connection closed"
    }


@pytest.mark.parametrize("name", ["usage-1e18", "usage-negative"])
def test_usage_no_server_can_mean_is_classified_summarized_and_never_met(
    name: str, workload: Path, tmp_path: Path
) -> None:
    """`completion_tokens: 1e18` (once a polars overflow and a traceback) and `-8 / -200`
    (once N -8, goodput negative and SLO MET on a TPOT check with 0 values): each request a
    stream_error with the value kept as text, N counted from the 3 chunks that arrived, a
    summary written, the verdict missed (exit 2), its usage problems counted."""
    case = next(c for c in CASES if c.name == name)
    with ScriptedServer(case.script) as server:
        result = invoke(workload, server.url, tmp_path)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    assert records.height == REQUESTS
    assert records["usage_problem"].str.contains(case.error.split(";")[0], literal=True).all()
    assert records["output_tokens"].to_list() == [3] * REQUESTS  # the chunks, not the usage
    assert records["usage_output_tokens"].null_count() == REQUESTS
    assert records["prompt_tokens"].null_count() == (REQUESTS if name == "usage-negative" else 0)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["verdict"]["status"] == "missed"
    assert summary["classes"]["chat"]["stream_ends"]["usage_problems"] == REQUESTS
    assert summary["classes"]["chat"]["goodput"]["output_tokens_per_s"] == 0
