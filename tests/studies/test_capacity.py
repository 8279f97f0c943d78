"""Capacity search: stepping, bisection, invalid steps, the verdict, step length, and a knee."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.capacity import (
    FAIL,
    INVALID,
    NOT_JUDGED,
    PASS,
    RATE_TOLERANCE,
    Search,
    Step,
    audit_step,
    exit_code,
    fail_reasons,
    judge,
    min_requests,
)
from loadgen.percentiles import nearest_rank
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.capacity_view import conclusion
from loadgen.studies.capacity import geometric_loads, search
from loadgen.testing.builders import workload_file
from loadgen.testing.netpath import free_port


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


def saturating_server(mu: float, *, lucky: tuple[float, ...] = ()):  # type: ignore[no-untyped-def]
    """A step function for a server that serves at most `mu`: loads above it are
    over-saturated (serving `mu`), except `lucky` loads, which pass by chance."""
    asked: list[float] = []

    def run_step(load: float) -> Step:
        asked.append(load)
        if load <= mu or load in lucky:
            return Step(load=load, status=PASS, note="steady")
        return Step(load=load, status=FAIL, note="over-saturated", capacity_load=mu)

    return run_step, asked


def test_an_over_saturated_step_bounds_the_bisection() -> None:
    """After a step serves only μ, no load at or above μ × (1 − tolerance) is run: the
    bisection works below that ceiling and stops sooner than it would up to the fail."""
    run_step, asked = saturating_server(5.0)
    found = search(run_step, [1, 2, 4, 8], resolution=0.05)
    ceiling = 5.0 * (1 - RATE_TOLERANCE)
    assert found.capacity == 5.0
    assert found.ceiling == pytest.approx(ceiling)
    assert all(load < ceiling for load in asked if load != 8)
    assert found.highest_pass is not None
    assert found.upper == pytest.approx(ceiling)
    assert found.upper <= found.highest_pass * 1.05
    assert found.knee_found


def test_a_lucky_pass_above_the_measured_capacity_is_rejudged() -> None:
    """A step that passed by chance above what an over-saturated step later showed the
    server can serve is re-judged a failure, with the reason, and the knee stays below μ."""
    run_step, _ = saturating_server(3.0, lucky=(4.0,))
    seen: list[Step] = []
    found = search(run_step, [1, 2, 4, 8], resolution=0.05, on_step=seen.append)
    four = [s for s in found.steps if s.load == 4.0]
    assert four[0].status == FAIL
    assert "re-judged" in four[0].note
    assert any(s.load == 4.0 and s.status == FAIL for s in seen)  # the caller is told
    assert found.highest_pass is not None
    assert found.highest_pass < 3.0


def test_a_steady_pass_that_served_the_ceiling_stands_and_says_why() -> None:
    """The issue's search: a step at 15.3 held (its ok completions served 15.2), an
    over-saturated one served at most 15.1 (ceiling 14.65). The pass stands, measured; the
    ceiling bounds nothing, and the conclusion says so (it was re-judged FAIL, silently)."""
    over = Step(load=16.0, status=FAIL, note="over-saturated", capacity_load=15.1,
                reasons=("over-saturated",))  # fmt: skip
    held = Step(load=15.3, status=PASS, note="steady, every SLO met", served=15.2)
    steps = {8.0: Step(load=8.0, status=PASS, note="steady", served=8.0), 16.0: over, 15.3: held}
    found = search(lambda load: steps[load], [8.0, 15.3, 16.0], resolution=0.05)
    assert [s.status for s in found.steps] == [PASS, PASS, FAIL]
    assert not found.ceiling_holds
    assert (found.highest_pass, found.upper) == (15.3, 16.0)
    axis = LoadAxis(param="rate", scale=1.0, unit="req/s", title="offered load (req/s)")
    said = " ".join(str(line) for line in conclusion(found, None, axis, 0.10))
    assert "the pass at 15.3x (15.3 req/s) stands above 14.6x (14.6 req/s)" in said
    assert "its own ok completions served 15.2x (15.2 req/s)" in said
    assert "the first failing load 16x (16 req/s) (over-saturated)" in said


def test_a_pass_on_a_lull_above_the_ceiling_is_re_judged_and_said() -> None:
    """A pass at 4 whose ok completions served 2.5 against a server that serves 3
    overloaded passed on a lull: re-judged FAIL with the evidence, and the conclusion
    repeats it."""
    run_step, _ = saturating_server(3.0, lucky=(4.0,))

    def with_served(load: float) -> Step:
        step = run_step(load)
        return replace(step, served=2.5) if load == 4.0 else step

    found = search(with_served, [1, 2, 4, 8], resolution=0.05)
    four = next(s for s in found.steps if s.load == 4.0)
    assert (four.status, four.reasons) == (FAIL, ("re-judged",))
    assert "served only 2.5x, under 97% of that (2.91x), so it passed on a lull" in four.note
    axis = LoadAxis(param="rate", scale=1.0, unit="req/s", title="offered load (req/s)")
    said = " ".join(str(line) for line in conclusion(found, None, axis, 0.10))
    assert "step 4x (4 req/s) re-judged FAIL: re-judged by the over-saturated step" in said


def test_a_limit_an_invalid_step_kept_from_judging_is_not_judged() -> None:
    """Passes to 2, the step at 4 invalid: 3 (which needs a pass at 3.33) was never judged,
    so the limit is NOT JUDGED, exit 3, and nothing says "raise --max"; 1.5 passes (exit
    0) whatever lay above; with a fail at 3 below 3.33, 3 fails (exit 2)."""
    invalid = Step(load=4.0, status=INVALID, note="the generator fell behind: …")
    two = Step(load=2.0, status=PASS, note="steady")
    stopped = Search(steps=(two, invalid), highest_pass=2.0, first_fail=None, stopped_by=invalid)
    verdict = judge(stopped, 3.0)
    assert (verdict.status, exit_code(stopped, verdict)) == (NOT_JUDGED, 3)
    assert exit_code(stopped, judge(stopped, 1.5)) == 0
    axis = LoadAxis(param="rate", scale=2.0, unit="req/s", title="offered load (req/s)")
    said = " ".join(str(line) for line in conclusion(stopped, verdict, axis, 0.10))
    assert "raise --max" not in said
    assert "the knee above it is unknown (the search stopped at an invalid step)" in said
    assert "proposed limit 3x (6 req/s): NOT JUDGED" in said
    failed = Step(load=3.0, status=FAIL, note="missed: chat")
    bracketed = Search(steps=(two, failed, invalid), highest_pass=2.0, first_fail=3.0,
                       stopped_by=invalid)  # fmt: skip
    verdict = judge(bracketed, 3.0)
    assert (verdict.status, exit_code(bracketed, verdict)) == (FAIL, 2)


def test_a_failing_steps_reasons_in_a_few_words() -> None:
    """The reasons knee.png labels a first fail with, from the step's note."""
    note = ("over-saturated: completed 16.2 of 23.2 req/s offered (70%), short by 48 requests "
            "(allowed 16); in flight rising +47 (noise bound 18, floor 1); TTFT from intended "
            "rising +2.95e+03 ms (noise bound 1.1e+03, floor 62); missed: chat, bulk; short: "
            "2.4/10 lifetimes")  # fmt: skip
    assert fail_reasons(note) == ("over-saturated", "in flight rising", "TTFT rising",
                                  "missed: chat, bulk")  # fmt: skip


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
    assert n - nearest_rank(percentile, n) >= 10
    assert (n - 1) - nearest_rank(percentile, n - 1) < 10


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
    arrival: {process: %(process)s, rate_per_s: %(rate)g}
    requests: 50
    prompt_tokens: {dist: fixed, value: 16}
    output_tokens: {dist: fixed, value: %(tokens)d}
    slo: {ttft_ms: %(ttft_ms)g, percentile: 90}
    deadlines: {first_token_s: 60, stall_s: 30, total_s: 120}
sim: {speed: %(speed)g, max_batch: %(batch)d, decode_table: %(step_ms)g, prefill_tokens_per_s: 1000000000}
"""


def knee_workload(tmp_path: Path, **physics: float | str) -> tuple[Path, float]:
    """The workload file and its μ = B / (N·d) × speed in req/s (negligible prefill)."""
    values: dict[str, float | str] = {"process": "constant", "tokens": 20, "ttft_ms": 5000,
                                      "speed": 1, "batch": 8, "step_ms": 25, "rate": 16,
                                      **physics}  # fmt: skip
    path = workload_file(tmp_path, KNEE_WORKLOAD % values, "knee.yaml")
    tokens, step_ms = float(values["tokens"]), float(values["step_ms"])
    mu = float(values["batch"]) / (tokens * step_ms / 1000) * float(values["speed"])
    return path, mu


def run_capacity(workload: Path, out: Path, *args: str) -> Any:
    """`loadgen capacity` on the built-in simulator, with no lag bound (the generator-health
    rule decides); capacity.json (the exit code must be 0)."""
    from loadgen.cli.capacity import capacity

    result = CliRunner().invoke(capacity, [str(workload), "--out", str(out), "-q", *args])
    assert result.exit_code == 0, result.output
    assert (out / "knee.png").read_bytes()[:4] == b"\x89PNG"
    return json.loads((out / "capacity.json").read_text())


# The knee runs go at speed 0.5 (μ = 8 req/s): the client has half the requests to send of
# a speed-1 run, on a loaded 2-core machine that also runs the simulator.
KNEE_SPEED = 0.5


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_knee_against_the_simulator_lies_just_below_mu(tmp_path: Path) -> None:
    """Constant arrivals, B = 8 slots, d = 25 ms, N = 20 tokens, negligible prefill, speed
    0.5: μ = 8 / (20 × 0.025 s) × 0.5 = 8 req/s. The 1.2x step is over-saturated and serves
    μ; the knee lies in [0.85 μ, μ]."""
    workload, mu = knee_workload(tmp_path, speed=KNEE_SPEED, rate=16 * KNEE_SPEED)
    data = run_capacity(workload, tmp_path / "out", "--steps", "0.6x,1.2x", "--resolution",
                        "0.1", "--proposed-limit", f"{0.75 * mu:g}")  # fmt: skip
    assert 0.85 * mu <= data["highest_pass_req_s"] <= mu, data["highest_pass_req_s"]
    assert data["capacity"] * 16 * KNEE_SPEED == pytest.approx(mu, rel=0.05)
    over = [s for s in data["steps"] if s["over_saturated"]]
    assert [s["load"] for s in over] == [1.2]
    assert over[0]["steady"]["trends"]["in_flight"]["rising"]
    assert data["verdict"]["passed"]
    passing = [s for s in data["steps"] if s["status"] == PASS]
    assert all(s["steady"]["lifetimes"] >= s["min_lifetimes"] for s in passing)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_poisson_knee_against_the_simulator_never_exceeds_mu(tmp_path: Path) -> None:
    """Poisson arrivals on the same physics: the knee is found, and it is below μ."""
    workload, mu = knee_workload(
        tmp_path, process="poisson", speed=KNEE_SPEED, rate=16 * KNEE_SPEED
    )
    data = run_capacity(workload, tmp_path / "out", "--steps", "0.6x,1.2x", "--resolution",
                        "0.1", "--seed", "3")  # fmt: skip
    assert data["knee_found"]
    assert 0.5 * mu <= data["highest_pass_req_s"] <= mu, data["highest_pass_req_s"]


@pytest.mark.slow
def test_max_in_flight_knee_against_the_simulator_is_the_batch_size(tmp_path: Path) -> None:
    """B = 4 slots, T_hold = 40 × 20 ms / speed 4 = 200 ms: a cap <= B is served at once
    (TTFT ≈ one step), a cap of B + 1 keeps a request waiting for a slot (>= T_hold / B =
    50 ms); with a 25 ms TTFT SLO the knee is B, the first failing cap B + 1."""
    workload, _ = knee_workload(tmp_path, batch=4, step_ms=20, tokens=40, speed=4, ttft_ms=25)
    data = run_capacity(workload, tmp_path / "out", "--param", "max_in_flight", "--steps",
                        "2,4,8", "--min-tail", "5")  # fmt: skip
    assert (data["highest_pass"], data["first_fail"]) == (4, 5)
    assert data["highest_pass_req_s"] == pytest.approx(4 / 0.2, rel=0.1)  # B / T_hold


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_each_step_joins_its_spans_and_splits_ttft_by_them(tmp_path: Path) -> None:
    """`capacity --otlp-receiver PORT` on the simulator (which sends its spans there, and
    nothing in its stream): each step's receiver joins every ok request to its span, and
    each step's TTFT split comes from the spans, with the engine's physics as the known
    answer. B = 4 slots, T_hold = 40 × 20 ms / speed 4 = 200 ms, prefill negligible: a cap
    of 2 waits for no slot (queue under one 5 ms step, far below T_hold / 10); a cap of 8
    keeps 4 requests waiting a whole hold for a slot (queue T_hold ± 25 %), so the failing
    step's TTFT went to the queue."""
    workload, _ = knee_workload(tmp_path, batch=4, step_ms=20, tokens=40, speed=4, ttft_ms=25)
    out = tmp_path / "out"
    data = run_capacity(workload, out, "--param", "max_in_flight", "--steps", "2,8",
                        "--min-tail", "5", "--otlp-receiver", str(free_port()),
                        "--otlp-receiver-grace", "10")  # fmt: skip
    hold_ms = 200.0
    splits = {}
    for step in data["steps"]:
        run_dir = Path(step["run_dir"])
        account = json.loads((run_dir / "summary.json").read_text())["server_spans"]
        assert account["source"] == "receiver"
        assert account["ok"] > 0, account
        assert account["ok_joined"] == account["ok"], account
        splits[step["load"]] = step["classes"]["chat"]["ttft_split"]
    assert splits[2]["queue_ms"] < hold_ms / 10, splits
    assert 0.75 * hold_ms <= splits[8]["queue_ms"] <= 1.25 * hold_ms, splits
    assert splits[8]["cause"] == "queue_ms", splits


def test_a_capacity_receiver_needs_a_fixed_port(tmp_path: Path) -> None:
    """Every step listens again on the receiver's port, where the server was given one
    endpoint: port 0 (a new port each step) is a usage error that says what to give."""
    from loadgen.cli.capacity import capacity

    workload, _ = knee_workload(tmp_path)
    result = CliRunner().invoke(capacity, [str(workload), "--out", str(tmp_path / "out"),
                                           "--otlp-receiver", "0"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "port 0 picks a new port for every step" in result.output
    assert "give a fixed port" in result.output
    assert not (tmp_path / "out").exists()


def test_help_has_an_example_and_the_exit_codes() -> None:
    """`capacity --help` shows an Example: block and the exit codes."""
    from loadgen.cli.capacity import capacity

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
    from loadgen.cli.capacity import capacity

    workload, _ = knee_workload(tmp_path)
    result = CliRunner().invoke(capacity, [str(workload), *args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def steady_frame(rate: float, seconds: float, lifetime_s: float, lag_ms: float = 0.0):  # type: ignore[no-untyped-def]
    """Constant arrivals at `rate` for `seconds`, each sent `lag_ms` late and served in
    `lifetime_s`, no queue."""
    from loadgen.results.records import to_frame
    from loadgen.testing import streamed_record

    n = int(rate * seconds)
    gaps = (lifetime_s * 1000 / 20,) * 20  # 21 tokens over the lifetime, TTFT 0
    return to_frame(
        streamed_record(i, intended_ms=i * 1000 / rate, ttft_ms=0.0, gaps_ms=gaps, lag_ms=lag_ms)
        for i in range(n)
    )


@pytest.mark.parametrize(("lag_bound_ms", "status"), [(None, PASS), (50.0, PASS), (5.0, INVALID)])
def test_the_step_re_audit_judges_the_generator_by_the_runs_lag_bound(
    tmp_path: Path, lag_bound_ms: float | None, status: str
) -> None:
    """Every send 20 ms late, well within the SLOs: without a bound (the generator-health
    rule) or within --lag-bound-ms 50 the step is judged on its SLOs; only a strict 5 ms
    bound makes it invalid. (The re-audit once used the default 5 ms whatever the flag
    said: steps went invalid at random on a loaded machine, and capacity exited 3.)"""
    from loadgen.studies.capacity import step_runner
    from loadgen.workload.spec import load

    workload, _ = knee_workload(tmp_path, rate=16)

    def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
        seconds = spec_at.classes["chat"].duration_s
        return steady_frame(16.0, seconds, 0.1, lag_ms=20.0), False, False, tmp_path / run_id

    step = step_runner(load(workload), run_one, param="rate", lag_bound_ms=lag_bound_ms)(1.0)
    assert step.status == status, step.note


def test_a_short_passing_step_is_run_again_longer_on_its_own_lifetime(tmp_path: Path) -> None:
    """A first step planned by counts alone that lasted fewer lifetimes than the rule is
    run once more, planned on the lifetime it measured, and passes on the second run."""
    from loadgen.studies.capacity import step_runner
    from loadgen.workload.spec import load

    workload, _ = knee_workload(tmp_path, rate=16)
    spec = load(workload)
    asked: list[float] = []

    def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
        seconds = spec_at.classes["chat"].duration_s
        asked.append(seconds)
        return steady_frame(16.0, seconds, 1.0), False, False, tmp_path / run_id

    step = step_runner(spec, run_one, param="rate")(1.0)
    assert len(asked) == 2
    assert asked[1] >= 20 * 1.0 * 1.25  # min_lifetimes × the measured lifetime × cushion
    assert step.status == PASS, step.note
    assert step.attempts == 2
    assert "first run shorter than the rule" in step.note


def test_a_short_trace_replay_fails_without_a_pointless_rerun(tmp_path: Path) -> None:
    """A trace replay lasts as long as its trace: too short is a failure that says so."""
    from loadgen.studies.capacity import step_runner
    from loadgen.workload.spec import load

    spec = load(Path(__file__).resolve().parents[2] / "workloads" / "trace-azure-conv.yaml")
    calls: list[str] = []

    def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
        calls.append(run_id)
        frame = steady_frame(2.0, 10.0, 1.0).with_columns(pl.lit("conversation").alias("class"))
        return frame, False, False, tmp_path / run_id

    step = step_runner(spec, run_one, param="rate")(1.0)
    assert calls == ["step-01"]
    assert step.status == FAIL
    assert "a trace replay lasts as long as its trace" in step.note


def test_a_first_step_whose_generator_fell_behind_exits_3_without_a_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every send 20 ms late against a 5 ms lag bound: the first step is invalid, so no load
    was judged. That is exit 3 (the client's numbers, not the server's), not 2 with "lower
    --start"; no matplotlib warning, no empty knee.png; capacity.json says exit 3."""
    import warnings

    from loadgen.cli.capacity import capacity

    def fake_run_one_against(url, *, options, out, live, ray):  # type: ignore[no-untyped-def]
        def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
            seconds = spec_at.classes["chat"].duration_s
            return steady_frame(16.0, seconds, 0.1, lag_ms=20.0), False, False, tmp_path / run_id

        return run_one

    monkeypatch.setattr("loadgen.cli.capacity.run_one_against", fake_run_one_against)
    workload, _ = knee_workload(tmp_path, rate=16)
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(capacity, [str(workload), "--out", str(out), "--url",
                                               "http://127.0.0.1:9", "--lag-bound-ms", "5",
                                               "--steps", "1x,2x"])  # fmt: skip
    assert result.exit_code == 3, result.output
    assert not [w for w in caught if issubclass(w.category, UserWarning)], caught
    assert "lower --start" not in result.output
    assert "no step was judged" in result.output
    assert "the generator fell behind" in result.output
    assert not (out / "knee.png").exists()
    data = json.loads((out / "capacity.json").read_text())
    assert data["exit_code"] == 3
    assert [s["status"] for s in data["steps"]] == [INVALID]


def test_exit_code_3_when_the_generator_fell_behind_before_any_load_was_judged() -> None:
    """Stopped by an invalid first step, with or without a proposed limit: 3, not 2."""
    invalid = Step(load=1.0, status=INVALID, note="fell behind")
    found = Search(steps=(invalid,), highest_pass=None, first_fail=None, stopped_by=invalid)
    assert exit_code(found, None) == 3
    assert exit_code(found, judge(found, 1.0)) == 3


# -- an inconclusive step: extended, then decided (or bounding the knee from above) ---------


def test_an_inconclusive_step_is_extended_until_its_slo_is_decided(tmp_path: Path) -> None:
    """`--min-tail 1`: a p90 step planned by counts judges 17 requests, fewer than the 29
    that bound a p90 at 95 %: inconclusive, so it is run again twice as long (the planned
    seconds double), judges 38, and passes, saying it was extended and why."""
    from loadgen.studies.capacity import step_runner
    from loadgen.workload.spec import load

    workload, _ = knee_workload(tmp_path, rate=16)
    asked: list[float] = []

    def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
        seconds = spec_at.classes["chat"].duration_s
        asked.append(seconds)
        return steady_frame(16.0, seconds, 0.1), False, False, tmp_path / run_id

    step = step_runner(load(workload), run_one, param="rate", min_tail=1, min_lifetimes=2)(1.0)
    assert len(asked) == 2
    assert asked[1] == pytest.approx(2 * asked[0])
    assert (step.status, step.attempts, step.extended) == (PASS, 2, 2.0)
    assert step.classes["chat"].verdict == "met"
    assert "extended to ×2" in step.note
    assert "17 of the 29 needed" in step.note


def test_a_step_inconclusive_at_the_bound_is_not_a_pass(tmp_path: Path) -> None:
    """`--max-extend 2`: a step whose requests are always too few stays inconclusive after
    one extension: it does not pass, and says it hit the bound; with --max-extend 1 it is
    never run again."""
    from loadgen.analysis.capacity import UNDECIDED
    from loadgen.studies.capacity import step_runner
    from loadgen.workload.spec import load

    workload, _ = knee_workload(tmp_path, rate=16)
    for max_extend, runs in ((2.0, 2), (1.0, 1)):
        asked: list[float] = []

        def run_one(spec_at, cap, run_id, asked=asked):  # type: ignore[no-untyped-def]
            asked.append(spec_at.classes["chat"].duration_s)
            return steady_frame(16.0, 1.3, 0.1), False, False, tmp_path / run_id  # 20, always

        step = step_runner(load(workload), run_one, param="rate", min_tail=1, min_lifetimes=2,
                           max_extend=max_extend)(1.0)  # fmt: skip
        assert (step.status, len(asked)) == (UNDECIDED, runs)
        assert f"--max-extend {max_extend:g}" in step.note


def test_an_inconclusive_load_bounds_the_knee_from_above() -> None:
    """Loads up to 2 pass, above stay inconclusive however long they run: the search stops
    stepping at 3 and bisects below it as below a failure; the knee is reported in [highest
    pass, lowest inconclusive), within the resolution of 2, `high_is` inconclusive."""
    from loadgen.analysis.capacity import UNDECIDED, knee_json

    def run_step(load: float) -> Step:
        if load <= 2.0:
            return Step(load=load, status=PASS)
        return Step(load=load, status=UNDECIDED if load < 4.0 else FAIL)

    found = search(run_step, [1.0, 3.0, 4.0], resolution=0.05)
    assert 4.0 not in [s.load for s in found.steps]  # stepping stopped at the undecided 3
    assert found.first_undecided is not None
    assert found.first_undecided <= 3.0
    assert found.highest_pass is not None
    assert 2.0 / 1.05 <= found.highest_pass <= 2.0
    assert found.upper == found.first_undecided
    assert found.upper <= found.highest_pass * 1.05
    assert found.knee_found
    assert found.first_fail is None
    knee = knee_json(found, 8.0)
    assert (knee["low"], knee["high"], knee["high_is"]) == (found.highest_pass, found.upper,
                                                             "inconclusive")  # fmt: skip
    assert knee["high_req_s"] == pytest.approx(found.upper * 8.0)
    assert exit_code(found, None) == 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_steps_go_inconclusive_then_extended_then_decided_and_the_knee_is_the_batch_size(
    tmp_path: Path,
) -> None:
    """The max_in_flight physics of the test above (B = 4 slots, T_hold = 200 ms, a 25 ms
    TTFT SLO at p90), with steps planned short (--min-tail 1, --min-lifetimes 2): each step
    first judges ~20 requests, too few to bound a p90 at 95 % (29), so it is inconclusive and
    run again twice as long; then a cap <= B is MET (every TTFT one step) and B + 1 MISSED
    (a fifth of the requests wait >= T_hold / B = 50 ms for a slot). The knee is known to
    [B, B + 1), as the physics says."""
    workload, _ = knee_workload(tmp_path, batch=4, step_ms=20, tokens=40, speed=4, ttft_ms=25)
    data = run_capacity(workload, tmp_path / "out", "--param", "max_in_flight", "--steps",
                        "2,4,8", "--min-tail", "1", "--min-lifetimes", "2")  # fmt: skip
    assert (data["highest_pass"], data["first_fail"]) == (4, 5)
    assert (data["knee"]["low"], data["knee"]["high"], data["knee"]["high_is"]) == (4, 5, "fail")
    decided = {s["load"]: s for s in data["steps"]}
    for cap in (2, 4, 5):
        step = decided[cap]
        assert step["attempts"] >= 2, step
        assert step["extended"] >= 2, step
        assert "inconclusive before" in step["note"], step["note"]
        assert step["status"] == (PASS if cap <= 4 else FAIL), step
    assert decided[4]["classes"]["chat"]["verdict"] == "met"
    assert decided[5]["classes"]["chat"]["verdict"] == "missed"
    assert data["settings"]["max_extend"] == 4.0


def test_a_batch_that_ends_in_the_warm_up_is_judged_whole() -> None:
    """mixed.yaml's summarize batch (24 documents, 8 at a time) done 7 s into a 150 s step,
    inside its warm-up: the batch is judged whole, met, and the step passes on chat's
    figures (it was cut to no document and "missed: summarize", failing a step where
    nothing missed; seen at the simulator's speed 2)."""
    from loadgen.results.records import to_frame
    from loadgen.testing import streamed_record
    from loadgen.workload.spec import load

    spec = load(Path(__file__).resolve().parents[2] / "workloads" / "mixed.yaml")
    chat = [streamed_record(i, intended_ms=500.0 * i, ttft_ms=50.0, gaps_ms=(20.0,) * 10)
            for i in range(300)]  # fmt: skip
    docs = [streamed_record(1000 + i, intended_ms=5000.0 + 200.0 * i, ttft_ms=300.0,
                            gaps_ms=(20.0,) * 20, class_name="summarize", session_id=1000,
                            turn=i) for i in range(24)]  # fmt: skip
    step = audit_step(to_frame(chat + docs), spec, 1.0, min_tail=10, warmup_s=None,
                      from_send=False, client_failed=False)  # fmt: skip
    assert step.warmup_s is not None
    assert step.warmup_s > 10  # the batch (5 s to ~10 s) lies inside it
    assert step.classes["summarize"].verdict == "met"
    assert step.status == PASS, step.note


def test_capacity_writes_its_answer_as_junit_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1x passes, 2x the generator cannot run (every send 20 ms late against a strict 5 ms
    bound): --proposed-limit 1.5x needed a pass at 1.67x, never judged, so it is NOT
    JUDGED, exit 3. The JUnit has the one case, failing as `invalid`, the steps as
    properties; the Markdown heads with the verdict and has a row per step."""
    import xml.etree.ElementTree as ET

    from loadgen.cli.capacity import capacity

    def fake_run_one_against(url, *, options, out, live, ray):  # type: ignore[no-untyped-def]
        def run_one(spec_at, cap, run_id):  # type: ignore[no-untyped-def]
            seconds = spec_at.classes["chat"].duration_s
            rate = spec_at.classes["chat"].arrival.rate_per_s
            lag = 20.0 if rate > 16 else 0.0
            return steady_frame(rate, seconds, 0.1, lag_ms=lag), False, False, tmp_path / run_id

        return run_one

    monkeypatch.setattr("loadgen.cli.capacity.run_one_against", fake_run_one_against)
    workload, _ = knee_workload(tmp_path, rate=16)
    junit, markdown = tmp_path / "capacity.xml", tmp_path / "capacity.md"
    result = CliRunner().invoke(capacity, [
        str(workload), "--out", str(tmp_path / "out"), "--url", "http://127.0.0.1:9",
        "--lag-bound-ms", "5", "--steps", "1x,2x", "--proposed-limit", "1.5x", "-q",
        "--junit", str(junit), "--markdown", str(markdown)])  # fmt: skip
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert "proposed limit 1.5x (24 req/s): NOT JUDGED" in said
    assert "raise --max" not in said
    root = ET.parse(junit).getroot()
    (case,) = root.iter("testcase")
    assert case.get("name") == "proposed limit 1.5x (24 req/s)"
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("type") == "invalid"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert (props["step.01.status"], props["step.02.status"]) == (PASS, INVALID)
    assert props["exit_code"] == "3"
    text = markdown.read_text()
    assert text.startswith("### loadgen capacity: NOT JUDGED (exit 3)\n")
    assert "| 2x (32 req/s) |" in text
    assert "simulator" not in text


def test_an_over_saturated_step_whose_requests_failed_sets_no_ceiling(tmp_path: Path) -> None:
    """A step whose queue grows (each request waits 40 ms longer than the last) is
    over-saturated either way; with every request ok what it served is the server's
    throughput and sets the ceiling, but with half of them timing out it served fewer ok
    than it could (goodput collapse: the README's mixed.yaml at 16 req/s served 13 ok with
    89 % failed, and its ceiling cut the search at 12.6), so it sets none."""
    from loadgen.results.records import Outcome, to_frame
    from loadgen.testing import streamed_record
    from loadgen.workload.spec import load

    workload, _ = knee_workload(tmp_path, rate=10)
    spec = load(workload)

    def growing(failing: bool) -> Step:
        records = [streamed_record(i, intended_ms=100.0 * i, ttft_ms=50.0 + 40.0 * i,
                                   gaps_ms=(20.0,) * 19,
                                   outcome=Outcome.TIMEOUT_TOTAL if failing and i % 2 else
                                   Outcome.OK) for i in range(600)]  # fmt: skip
        return audit_step(to_frame(records), spec, 1.0, min_tail=10, warmup_s=None,
                          from_send=False, client_failed=False)  # fmt: skip

    ok, failed = growing(False), growing(True)
    assert ok.over_saturated
    assert failed.over_saturated
    assert ok.capacity_load is not None
    assert failed.capacity_load is None
    assert "of them failed, so what it served ok sets no ceiling" in failed.note
    assert "over-saturated" in failed.reasons
