"""Capacity search: stepping, bisection, invalid steps, the verdict, step length, and a knee."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen import metrics
from loadgen.capacity import (
    FAIL,
    INVALID,
    PASS,
    Search,
    Step,
    exit_code,
    geometric_loads,
    judge,
    min_requests,
    search,
)


def fake_server(knee: float, *, invalid: tuple[float, float] | None = None):  # type: ignore[no-untyped-def]
    """A step function whose SLO holds at loads <= `knee`, invalid in the `invalid` range
    [low, high); it records the loads it was asked."""
    asked: list[float] = []

    def run_step(load: float) -> Step:
        asked.append(load)
        if invalid is not None and invalid[0] <= load < invalid[1]:
            return Step(load=load, status=INVALID, note="fell behind")
        return Step(load=load, status=PASS if load <= knee else FAIL)

    return run_step, asked


@pytest.mark.parametrize("knee", [0.7, 1.0, 3.3, 5.9, 12.0])
@pytest.mark.parametrize("resolution", [0.05, 0.01])
def test_search_finds_the_knee_within_the_resolution(knee: float, resolution: float) -> None:
    """Stepping then bisecting brackets the true knee: pass <= knee < fail <= pass × (1 + r)."""
    run_step, asked = fake_server(knee)
    found = search(run_step, geometric_loads(0.5, 16), resolution=resolution)
    assert found.knee_found
    assert found.highest_pass is not None
    assert found.first_fail is not None
    assert found.highest_pass <= knee < found.first_fail
    assert found.first_fail <= found.highest_pass * (1 + resolution)
    assert asked[: asked.index(found.steps[-1].load) + 1] == [s.load for s in found.steps]


def test_stepping_stops_at_the_first_failing_step() -> None:
    """No load above the first failing step is ever run."""
    run_step, asked = fake_server(3.0)
    found = search(run_step, [1, 2, 4, 8, 16], resolution=0.05)
    assert max(asked) == 4
    assert found.first_fail is not None
    assert found.first_fail <= 4


def test_integer_loads_bisect_to_adjacent_caps() -> None:
    """With integer loads (max_in_flight) the bracket ends at two adjacent caps."""
    run_step, _ = fake_server(37)
    found = search(run_step, geometric_loads(1, 256, integer=True), integer=True)
    assert (found.highest_pass, found.first_fail) == (37, 38)


def test_an_invalid_step_stops_raising_load() -> None:
    """A step whose generator fell behind ends the search; it is not counted as a failure."""
    run_step, asked = fake_server(10.0, invalid=(4.0, 100.0))
    found = search(run_step, [1, 2, 4, 8, 16])
    assert asked == [1, 2, 4]
    assert found.highest_pass == 2
    assert found.first_fail is None
    assert found.stopped_by is not None
    assert found.stopped_by.status == INVALID
    assert exit_code(found, None) == 3


def test_an_invalid_step_during_bisection_ends_it_with_the_bracket_so_far() -> None:
    """An invalid midpoint stops the bisection; the bracket found before it is kept."""
    run_step, asked = fake_server(5.0, invalid=(5.5, 6.5))
    found = search(run_step, [1, 2, 4, 8])
    assert (found.highest_pass, found.first_fail) == (4, 8)
    assert asked == [1, 2, 4, 8, 6]
    assert exit_code(found, None) == 0  # a knee is bracketed, only more coarsely


@pytest.mark.parametrize(
    ("highest_pass", "proposed", "margin", "passed"),
    [
        (10.0, 9.0, 0.10, True),  # exactly at the allowance
        (10.0, 9.01, 0.10, False),
        (10.0, 9.5, 0.0, True),
        (10.0, 8.0, 0.25, False),
        (None, 0.1, 0.10, False),  # nothing passed
    ],
)
def test_verdict_passes_only_below_the_highest_pass_less_the_margin(
    highest_pass: float | None, proposed: float, margin: float, passed: bool
) -> None:
    """A proposed limit passes only if it is <= highest passing load × (1 − safety margin)."""
    found = Search(steps=(), highest_pass=highest_pass, first_fail=20.0)
    verdict = judge(found, proposed, safety_margin=margin)
    assert verdict.passed is passed
    assert exit_code(found, verdict) == (0 if passed else 2)


def test_exit_codes_without_a_proposed_limit() -> None:
    """0 with a knee; 2 when nothing passed or every step up to --max passed."""
    assert exit_code(Search(steps=(), highest_pass=2, first_fail=4), None) == 0
    assert exit_code(Search(steps=(), highest_pass=None, first_fail=1), None) == 2
    assert exit_code(Search(steps=(), highest_pass=16, first_fail=None), None) == 2


@pytest.mark.parametrize(
    ("percentile", "expected"), [(99, 1000), (95, 200), (90, 100), (99.9, 10_000), (50, 20)]
)
def test_min_requests_leave_the_tail_beyond_the_percentile(
    percentile: float, expected: int
) -> None:
    """n = ⌈10/(1 − p/100)⌉ is the least n with 10 requests beyond the nearest-rank percentile."""
    n = min_requests(percentile, 10)
    assert n == expected
    assert n - metrics.nearest_rank(percentile, n) >= 10
    assert (n - 1) - metrics.nearest_rank(percentile, n - 1) < 10


def test_min_requests_refuses_the_maximum() -> None:
    """A p100 is the single worst request at any n, so no step length is asked for."""
    with pytest.raises(ValueError, match="worst request"):
        min_requests(100)


def test_geometric_loads_end_at_the_maximum() -> None:
    """Loads double from start and the last one is the maximum itself."""
    assert geometric_loads(0.5, 6) == [0.5, 1, 2, 4, 6]
    assert geometric_loads(1, 64, integer=True) == [1, 2, 4, 8, 16, 32, 64]


KNEE_WORKLOAD = """\
name: knee
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 10}
    requests: 50
    prompt_tokens: {dist: fixed, value: 40}
    output_tokens: {dist: fixed, value: 50}
    slo: {ttft_ms: 100, percentile: 90}
sim: {speed: 20, max_batch: 4, queue_cap: 0, decode_step_ms: 40}
"""


@pytest.mark.slow
def test_knee_against_the_simulator_matches_the_physics(tmp_path: Path) -> None:
    """The found knee is near μ = max_batch / T_hold, the simulator's throughput capacity.

    In simulated time a request waits ~half a step to join (20 ms), is prefilled in a
    45 ms step (40 ms decode + 40 tokens at 8,000 tok/s) and decodes 49 more tokens at
    ~40.2 ms: T_hold ≈ 2.04 s, so μ = 4 / 2.04 × speed 20 ≈ 39 req/s. Arrivals are
    constant and service deterministic, so nobody queues below μ (TTFT ≈ 3 ms) and the
    backlog grows without bound above it (p90 TTFT past 100 ms within 50 requests).
    The lag bound is loose: with ~60 requests a step's p99 lag is its single worst send.
    """
    from loadgen.cli_capacity import capacity

    workload = tmp_path / "knee.yaml"
    workload.write_text(KNEE_WORKLOAD, encoding="utf-8")
    out = tmp_path / "out"
    args = [str(workload), "--steps", "2x,4x,8x", "--min-tail", "5", "--resolution", "0.15",
            "--out", str(out), "--proposed-limit", "20", "--lag-bound-ms", "50", "-q"]  # fmt: skip
    result = CliRunner().invoke(capacity, args)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "capacity.json").read_text())
    mu = 4 / (0.020 + 0.045 + 49 * 0.0402) * 20
    knee = data["highest_pass"] * data["settings"]["base_rate_per_s"]
    assert 0.6 * mu <= knee <= 1.2 * mu, (knee, mu)
    assert data["verdict"]["passed"]
    assert (out / "knee.png").read_bytes()[:4] == b"\x89PNG"
    assert "highest passing load" in result.output
    failing = [s for s in data["steps"] if s["status"] == FAIL]
    assert failing
    assert all(s["throughput_tok_per_s"] > s["goodput_tok_per_s"] for s in failing)


def test_help_has_an_example_and_the_exit_codes() -> None:
    """`capacity --help` shows an Example: block and the exit codes."""
    from loadgen.cli_capacity import capacity

    result = CliRunner().invoke(capacity, ["--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert "Exit codes" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--proposed-limit", "-3"], "--proposed-limit"),
        (["--steps", "4x,2x"], "loads must increase"),
        (["--param", "max_in_flight", "--start", "zero"], "--start"),
    ],
)
def test_bad_flags_exit_1_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    """A bad flag is a usage error: exit 1, the reason on stderr, no traceback, nothing run."""
    from loadgen.cli_capacity import capacity

    workload = tmp_path / "knee.yaml"
    workload.write_text(KNEE_WORKLOAD, encoding="utf-8")
    result = CliRunner().invoke(capacity, [str(workload), *args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
