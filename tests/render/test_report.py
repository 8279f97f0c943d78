"""The run report re-audits a run folder: known answers from the raw records, SLO overrides,
escaping, self-containment and the files it writes."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from loadgen.analysis import audit
from loadgen.analysis.health import health_text
from loadgen.analysis.objectives import Objective
from loadgen.codec import to_json
from loadgen.errors import ConfigError, LoadgenError
from loadgen.render.report.document import _generator_table
from loadgen.render.report.folder import report_files
from loadgen.render.report.html import render_html
from loadgen.render.report.markdown import render_markdown
from loadgen.render.report.model import RunReport, build_run_report
from loadgen.render.terminal import render_summary
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import SCHEMA_VERSION, read_run_info
from loadgen.results.write import write_parquet_atomic, write_report
from loadgen.testing import builders, streamed_record
from loadgen.workload.spec import SloTargets

MS = 1_000_000
S = 1_000_000_000
EVIL = "<script>alert(1)</script>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ok_record(
    request_id: int,
    *,
    intended_ms: float,
    ttft_ms: float,
    gaps_ms: tuple[float, ...],
    class_name: str = "chat",
    prompt: tuple[int, int | None] = (100, 100),
) -> RequestRecord:
    """An ok streamed request, sent 1 ms late (the generator's lag): first chunk at intended
    + ttft, then one chunk per gap, answered with HTTP 200 and the prompt's target and count."""
    return streamed_record(request_id, intended_ms=intended_ms, ttft_ms=ttft_ms, gaps_ms=gaps_ms,
                           lag_ms=1.0, class_name=class_name, content=True,
                           prompt_tokens_target=prompt[0], prompt_tokens=prompt[1],
                           http_status=200)  # fmt: skip


def failed_record(
    request_id: int,
    *,
    intended_ms: float,
    outcome: Outcome = Outcome.REJECTED,
    error: str = "queue full",
    class_name: str = "chat",
    status: int | None = 429,
) -> RequestRecord:
    """A request that failed 5 ms after its intended time."""
    return builders.failed_record(request_id, intended_ms=intended_ms, outcome=outcome,
                                  end_after_ms=5.0, class_name=class_name, http_status=status,
                                  error=error, prompt_tokens_target=100)  # fmt: skip


def synthetic_records() -> list[RequestRecord]:
    """40 chat requests over 20 s (TTFT 50..440 ms, 3 of them failed) and 4 of a hostile class."""
    records: list[RequestRecord] = []
    for i in range(40):
        intended_ms = i * 500.0
        if i in (7, 23):
            records.append(failed_record(i, intended_ms=intended_ms))
        elif i == 31:
            records.append(
                failed_record(
                    i,
                    intended_ms=intended_ms,
                    outcome=Outcome.TIMEOUT_STALL,
                    error="stall",
                    status=200,
                )
            )
        else:
            ttft = 50.0 + (i * 37 % 40) * 10.0
            gaps = (20.0, 25.0 + i % 5, 30.0, 120.0 if i % 10 == 0 else 22.0)
            records.append(
                ok_record(
                    i,
                    intended_ms=intended_ms,
                    ttft_ms=ttft,
                    gaps_ms=gaps,
                    prompt=(100, 100 + i % 3),
                )
            )
    for j in range(4):
        rid = 100 + j
        if j == 3:
            records.append(failed_record(rid, intended_ms=1000.0 * j, class_name=EVIL, error=EVIL))
        else:
            records.append(
                ok_record(
                    rid, intended_ms=1000.0 * j, ttft_ms=80.0, gaps_ms=(10.0,), class_name=EVIL
                )
            )
    return records


def run_info(
    *,
    classes: list[str],
    planned: int,
    slo: dict[str, Any],
    interrupted: bool = False,
    lag_bound_ms: float = 5.0,
) -> dict[str, Any]:
    """A run.json shaped like `run._run_info` plus what `run._run` adds."""
    spec_classes = {name: {"name": name, "kind": "chat", "slo": slo} for name in classes}
    return {
        "run_id": "20261129T110412Z-synthetic-0000",
        "schema_version": 20,  # its options.lag_bound_ms a strict bound, as given
        "loadgen_version": "0.1.0",
        "seed": 0,
        "planned": planned,
        "workload": {
            "name": f"synthetic {EVIL}",
            "source": "workloads/synthetic.yaml",
            "spec": {"name": "synthetic", "classes": spec_classes},
        },
        "target": {
            "url": "http://127.0.0.1:8000/v1/chat/completions",
            "api": "openai-chat",
            "model": EVIL,
            "builtin_sim": False,
            "sim_args": None,
        },
        "options": {"max_in_flight": None, "lag_bound_ms": lag_bound_ms, "grace_s": 5.0},
        "host": {"hostname": "h", "platform": "p", "python": "3.11", "cpus": 2},
        "t0": {"perf_counter_ns": 1, "unix_ns": 1, "utc": "2026-11-29T11:04:12.000000+00:00"},
        "interrupted": interrupted,
        "finished": True,
    }


SLO = {"ttft_ms": 1000.0, "tpot_ms": 50.0, "itl_ms": None, "e2e_ms": None, "percentile": 90.0}


def make_run(tmp_path: Path, records: list[RequestRecord] | None = None, **info: Any) -> Path:
    """A run folder with records.parquet and run.json, as `loadgen run` leaves it."""
    records = synthetic_records() if records is None else records
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_parquet_atomic(to_frame(records), run_dir / "records.parquet")
    classes = sorted({r.class_name for r in records})
    info = {"classes": classes, "planned": len(records), "slo": SLO, **info}
    (run_dir / "run.json").write_text(json.dumps(run_info(**info)))
    return run_dir


def nearest_rank(values: list[float], p: float) -> float:
    """The textbook nearest-rank percentile of a plain list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    """The synthetic run's report with 5 s tumbling windows (built once: figures take time).

    Its run.json says 50 planned and a lag bound (0.5 ms) below the 1 ms lag.
    """
    run_dir = make_run(tmp_path_factory.mktemp("r"), planned=50, lag_bound_ms=0.5)
    return build_run_report(run_dir, window_s=5.0)


def test_summary_percentiles_match_a_direct_computation(built: RunReport) -> None:
    """TTFT/TPOT p50/p90/p99 (ok, and failures worst) equal nearest rank over the raw records."""
    chat = [r for r in synthetic_records() if r.class_name == "chat"]
    ok = [r for r in chat if r.outcome is Outcome.OK]
    ttft = [(r.first_token_ns - r.intended_ns) / MS for r in ok]  # type: ignore[operator]
    tpot = [(r.last_token_ns - r.first_token_ns) / MS / (r.output_tokens - 1) for r in ok]  # type: ignore[operator]
    gaps = [(b - a) / MS for r in ok for a, b in zip(r.chunk_ns, r.chunk_ns[1:], strict=False)]
    cls = built.summary.classes["chat"]
    for p in (50, 90, 99):
        assert getattr(cls.ttft_ms, f"p{p}") == pytest.approx(nearest_rank(ttft, p), abs=1e-3)
        assert getattr(cls.tpot_ms, f"p{p}") == pytest.approx(nearest_rank(tpot, p), abs=1e-3)
        assert getattr(cls.itl_ms, f"p{p}") == pytest.approx(nearest_rank(gaps, p), abs=1e-3)
    with_failures = ttft + [math.inf] * 3
    assert cls.ttft_ms_with_failures.p50 == pytest.approx(nearest_rank(with_failures, 50))
    assert nearest_rank(with_failures, 99) == math.inf
    assert cls.ttft_ms_with_failures.p99 is None  # falls on a failure
    assert cls.outcomes["rejected"] == 2
    assert cls.outcomes["timeout_stall"] == 1
    assert cls.slo.attainment == pytest.approx(37 / 40)


def test_windows_match_a_direct_computation(built: RunReport) -> None:
    """Per 5 s window: requests by intended time, in-flight at the end, TTFT p99 and failures."""
    chat = [r for r in synthetic_records() if r.class_name == "chat"]
    windows = built.windows.filter(built.windows["class"] == "chat")
    last_end_ns = max(r.end_ns for r in synthetic_records() if r.end_ns is not None)
    assert windows.height == last_end_ns // (5 * S) + 1  # every class gets every window
    for w in windows.iter_rows(named=True):
        lo, hi = int(w["window_start_s"] * S), int(w["window_end_s"] * S)
        inside = [r for r in chat if lo <= r.intended_ns < hi]
        assert w["requests"] == len(inside)
        assert w["failed"] == sum(r.outcome is not Outcome.OK for r in inside)
        assert w["arrival_rate_per_s"] == pytest.approx(len(inside) / 5.0)
        flying = [r for r in chat if r.sent_ns is not None and r.sent_ns <= hi < r.end_ns]  # type: ignore[operator]
        assert w["in_flight"] == len(flying)
        ttft = [(r.first_token_ns - r.intended_ns) / MS for r in inside if r.outcome is Outcome.OK]  # type: ignore[operator]
        expected = nearest_rank(ttft, 99) if ttft else None
        assert w["ttft_p99_ms"] == (pytest.approx(expected) if expected is not None else None)


def test_details_count_prompt_tokens_chunks_and_errors(built: RunReport) -> None:
    """Prompt token means, tokens per chunk and top errors are counted from the records."""
    ok = [r for r in synthetic_records() if r.class_name == "chat" and r.outcome is Outcome.OK]
    details = built.classes["chat"]
    reported = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    assert details.prompt_tokens.requests == len(ok)
    assert details.prompt_tokens.reported_mean == pytest.approx(sum(reported) / len(reported))
    assert details.prompt_tokens.target_mean == pytest.approx(100.0)
    rel = sum((p - 100) / 100 for p in reported) / len(reported)
    assert details.prompt_tokens.mean_relative_diff == pytest.approx(rel)
    assert dict(details.chunks_by_tokens) == {1: sum(len(r.chunk_ns) for r in ok)}
    top = [(e.count, e.outcome, e.error) for e in details.top_errors]
    assert top == [(2, "rejected", "queue full"), (1, "timeout_stall", "stall")]


def test_every_figure_is_a_png_and_named_per_class(built: RunReport) -> None:
    """Each class has its five figures, all valid PNGs, with file-name-safe names."""
    assert len(built.figures) == 10
    for name, png in built.figures.items():
        assert png.startswith(PNG_MAGIC)
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name), name
    assert built.classes[EVIL].slug == "script-alert-1-script"
    assert built.classes["chat"].figures == (
        "chat-ttft_cdf",
        "chat-tpot_cdf",
        "chat-itl_histogram",
        "chat-tokens_per_chunk",
        "chat-timeline",
    )


def test_html_escapes_injected_text_and_loads_nothing_from_the_network(
    built: RunReport,
) -> None:
    """A class name, error message or model `<script>` is escaped, and no src/href leaves the file."""
    page = render_html(built)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    for network_load in ("<link", "@import", "url("):
        assert network_load not in page
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(built.figures)
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for data in images)


def test_html_shows_the_header_verdicts_and_tables(built: RunReport) -> None:
    """The page names the run, date, target and verdicts, with percentile and window tables."""
    page = render_html(built)
    for text in (
        "20261129T110412Z-synthetic-0000",
        "2026-11-29 11:04:12 UTC",
        "http://127.0.0.1:8000/v1/chat/completions",
        "planned 50 · sent 44 · recorded 44",
        f"synthetic {EVIL}@",  # the workload key the results store pools it by
        "GENERATOR FELL BEHIND",
        "Class chat: MET",  # p90 of 40 requests allows 4 failures; 3 failed
        f"Class {EVIL}: MISSED",  # p90 of 4 requests falls on its one failure
        "TTFT, failures worst",
        "Time windows",
        "queue full",
        "≤ 1,000 ms at p90",
    ):
        assert html_text(text) in page, text


def test_the_wide_windows_table_fits_the_page_with_its_unit_in_the_headers(
    built: RunReport,
) -> None:
    """The windows table (up to 16 columns) carries ms in its headers and bare numbers in
    its cells, set smaller and tighter so it fits the page instead of running off it (its
    cells once carried `12.3 ms` and were kept on one line: 1,300 px wide with server
    columns); the two-column tables (run, generator health) are left to wrap as text does."""
    page = render_html(built)
    wide = re.findall(r'<div class="wide"><table><thead><tr>((?:<th>[^<]*</th>)+)', page)
    assert wide
    assert all(cells.count("<th>") >= 8 for cells in wide)
    assert any("<th>TTFT p99 (ms)</th>" in cells for cells in wide)  # the windows table
    rows = re.findall(r"<tr><td>\d[^<]*–[^<]* s</td>(.*?)</tr>", page)
    assert rows
    assert not any(" ms<" in row for row in rows)
    assert "<h3>Run</h3>\n<table>" in page  # not wrapped
    assert "white-space:nowrap}" in page
    assert ".wide td{white-space:nowrap}" not in page


def steady_run(tmp_path: Path) -> Path:
    """360 ok chat requests, one every 125 ms (8/s for 45 s), each done 71 ms after it arrives."""
    records = [
        ok_record(i, intended_ms=i * 125.0, ttft_ms=50.0, gaps_ms=(20.0,)) for i in range(360)
    ]
    return make_run(tmp_path, records)


def windows_summaries(page: str) -> list[tuple[str, str]]:
    return re.findall(r"<details( open)?><summary>([^<]*)</summary>", page)


def details_rows(page: str) -> int:
    """Table rows inside the page's one <details> block."""
    return page.split("<details", 1)[1].split("</details>", 1)[0].count("<tr><td>")


def test_the_html_page_shows_every_window_the_fitted_size_gives(tmp_path: Path) -> None:
    """45 s at 8/s: 1 s windows (the smallest with 5+ requests each), 45 rows, all shown."""
    report = build_run_report(steady_run(tmp_path))
    assert (report.window_s, report.windows.height) == (1.0, 45)
    page = render_html(report)
    assert windows_summaries(page) == [(" open", "chat: 45 windows")]
    assert details_rows(page) == 45


def test_more_windows_than_the_fitted_size_allows_are_folded_with_a_note(tmp_path: Path) -> None:
    """--window 0.5 over the same 45 s: 90 windows, past the 60 a fitted size gives: folded,
    its summary line says so, every row is still in the page, and the Markdown names the count."""
    report = build_run_report(steady_run(tmp_path), window_s=0.5)
    assert report.windows.height == 90
    page = render_html(report)
    assert windows_summaries(page) == [("", "chat: 90 windows (over 60): folded, click to show")]
    assert details_rows(page) == 90
    assert "**chat: 90 windows (over 60)**" in render_markdown(report)


def html_text(text: str) -> str:
    import html

    return html.escape(text)


def test_markdown_links_pngs_beside_it_and_summary_is_written(
    built: RunReport, tmp_path: Path
) -> None:
    """report_files + write_report: report.html, report.md + PNGs it links, summary.json."""
    written = write_report(tmp_path / "out", report_files(built), built.summary)
    names = {p.name for p in written}
    assert {"report.html", "report.md", "summary.json"} <= names
    md = (tmp_path / "out" / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(built.figures)
    for link in links:
        assert (tmp_path / "out" / link).read_bytes().startswith(PNG_MAGIC)
    assert "<script" not in md
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == to_json(built.summary)
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["loadgen_version"]
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_slo_override_changes_the_verdict(tmp_path: Path) -> None:
    """run.json's SLOs decide the verdict unless `--slo` (here: only TPOT) overrides them."""
    ok = [ok_record(i, intended_ms=i * 100.0, ttft_ms=100.0, gaps_ms=(30.0,)) for i in range(10)]
    run_dir = make_run(tmp_path, ok)
    as_run, _, _ = audit.audit_run(run_dir)
    assert as_run.classes["chat"].slo.met is True
    assert as_run.verdict.exit_code == 0
    fields = audit.parse_slo_override("tpot_ms=20")
    slos = audit.apply_slo_override(read_run_info(run_dir).slos(), fields)
    assert slos["chat"] == SloTargets(ttft_ms=1000.0, tpot_ms=20.0, percentile=90.0)
    tightened, _, used = audit.audit_run(run_dir, slos=slos)
    assert used == slos
    assert tightened.classes["chat"].slo.met is False
    assert tightened.verdict.exit_code == 2
    assert tightened.classes["chat"].slo.targets.tpot_ms == 20.0
    rows = [
        line
        for line in render_markdown(build_run_report(run_dir, slos=slos, window_s=5.0)).splitlines()
        if line.startswith(("| TTFT |", "| TPOT |"))
    ]
    assert [row.split(" | ")[7] for row in rows[:2]] == ["MET", "MISSED"]  # checks table first


def test_run_json_decides_planned_and_lag_bound(built: RunReport) -> None:
    """planned and the lag bound come from run.json, not from the records."""
    assert built.summary.generator.planned == 50
    assert built.summary.interrupted is False
    assert built.summary.generator.fell_behind is True  # lag 1 ms > bound 0.5 ms
    assert built.summary.verdict.exit_code == 3
    assert built.summary.verdict.status == "fell_behind"
    assert built.slos_overridden == ()


@pytest.mark.parametrize(
    ("info", "status", "code"),
    [
        ({"interrupted": True}, "interrupted", 130),
        ({"interrupted": True, "stopped": "watchdog", "watchdog": "nothing progressed"},
         "watchdog", 4),
        ({"interrupted": True, "recovered": True, "stopped": "incomplete"}, "incomplete", 5),
        ({"finished": False}, "incomplete", 5),  # killed, never recovered
    ],
)  # fmt: skip
def test_a_run_that_stopped_early_is_reported_partial_with_no_verdict(
    tmp_path: Path, info: dict[str, Any], status: str, code: int
) -> None:
    """Interrupted, watchdog, killed: the re-audit's verdict is the stop (no MET/MISSED
    anywhere on the page), every class's met is null, and the figures are labelled partial."""
    run_dir = make_run(tmp_path, planned=50)
    path = run_dir / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **info}))
    report = build_run_report(run_dir, window_s=5.0)
    verdict = report.summary.verdict
    assert (verdict.status, verdict.exit_code, verdict.slo_met) == (status, code, None)
    assert all(c.slo.met is None for c in report.summary.classes.values())
    page = re.sub(r"base64,[A-Za-z0-9+/=]+", "", render_html(report))  # the text, no PNGs
    assert "PARTIAL" in page
    assert html_text("Class chat: partial") in page
    assert "MET" not in page
    assert "MISSED" not in page
    checks = page[page.index("SLO checks on partial figures") :].split("</table>")[0]
    assert "not judged" in checks  # the banner says no SLO is judged: so do the check rows
    assert "FAIL" not in checks
    assert 'class="bad"' not in checks


def test_an_override_is_announced(built: RunReport) -> None:
    """A report whose SLOs are not the workload's says so at the top."""
    page = render_html(dataclasses.replace(built, slos_overridden=("chat",)))
    assert "SLO targets overridden (not the workload&#x27;s) for: chat" in page


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_ms=800,tpot_ms=40", {"ttft_ms": 800.0, "tpot_ms": 40.0}),
        (
            "ttft_ms=800, tpot_ms=40 ,percentile=95",
            {"ttft_ms": 800.0, "tpot_ms": 40.0, "percentile": 95.0},
        ),
        ("itl_ms=none", {"itl_ms": None}),
        ("e2e_ms=2.5e3", {"e2e_ms": 2500.0}),
    ],
)
def test_parse_slo_override_accepts(text: str, expected: dict[str, float | None]) -> None:
    """Comma-separated field=value pairs become SloTargets fields."""
    assert audit.parse_slo_override(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is not one of"),
        ("ttft=800", "is not one of"),
        ("ttft_ms", "is not one of"),
        ("ttft_ms=fast", "is not a number"),
        ("ttft_ms=-1", "> 0"),
        ("ttft_ms=inf", "> 0"),
        ("percentile=101", "percentile"),
        ("percentile=none", "is not a number"),
        ("ttft_ms=1,ttft_ms=2", "given twice"),
    ],
)
def test_parse_slo_override_rejects(text: str, problem: str) -> None:
    """Bad --slo text is a ConfigError naming --slo, the problem and an example."""
    with pytest.raises(ConfigError, match="--slo") as info:
        audit.parse_slo_override(text)
    assert problem in info.value.problem
    assert "ttft_ms=800" in info.value.fix


def test_a_folder_without_run_json_is_a_clear_error(tmp_path: Path) -> None:
    """Pointing the report at a folder that is not a run says so."""
    with pytest.raises(LoadgenError, match=r"no run\.json"):
        build_run_report(tmp_path)


def test_generator_health_is_said_in_words_one_unit_per_row(built: RunReport) -> None:
    """The health row says why the run fell behind (its lag p99, 1 ms, above the strict
    --lag-bound-ms 0.5 its run.json records); the rate asked and the request rates
    scheduled and achieved are rows of their own."""
    rows = dict(_generator_table(built.summary.generator).rows)
    assert rows["generator health"] == (
        "FELL BEHIND — the send lag p99 1 ms is above --lag-bound-ms 0.5"
    )
    assert rows["request rate scheduled"].endswith(" req/s (over the sampled send times)")
    assert " req/s (the scheduled rate less" in rows["request rate achieved"]
    assert "/" not in rows["rate asked"].replace("req/s", "")  # no mixed units in one cell
    assert "health" not in rows  # the old cryptic row is gone


def test_generator_health_of_a_run_that_stands_says_its_lag_is_charged() -> None:
    """Sends 30 ms late to a server well within its SLO: OK, the one sentence the terminal
    and the JUnit print (the lag charged, and taken as the stamp error)."""
    records = [streamed_record(i, intended_ms=400.0 * i, lag_ms=30.0, from_send=True)
               for i in range(6)]  # fmt: skip
    frame = to_frame(records)
    objectives = {"chat": Objective(name="chat", slo=SloTargets(ttft_ms=1000.0, percentile=50))}
    summary = audit.audit(frame, run_id="r", objectives=objectives, planned=6)
    assert summary.verdict.exit_code == 0
    text = health_text(summary.generator)
    assert text.startswith("the client's own time could not change the verdict: send lag p99 "
                           "30 ms, charged to TTFT and E2E")  # fmt: skip
    row = dict(_generator_table(summary.generator).rows)["generator health"]
    assert row == f"OK — {text}"


def test_throughput_table_matches_the_records(built: RunReport) -> None:
    """Requests, output tokens and input tokens per second of the run, for ok requests and
    for those meeting every SLO, equal sums over the raw records; goodput agrees with the
    summary's."""
    chat = [r for r in synthetic_records() if r.class_name == "chat" and r.outcome is Outcome.OK]
    duration = built.summary.duration_s
    t = built.classes["chat"].throughput
    assert t is not None
    assert t.completed.requests == 37
    assert t.completed.requests_per_s == pytest.approx(37 / duration)
    assert t.completed.output_tokens_per_s == pytest.approx(
        sum(r.output_tokens or 0 for r in chat) / duration
    )
    assert t.completed.input_tokens_per_s == pytest.approx(
        sum(r.prompt_tokens or 0 for r in chat) / duration
    )
    goodput = built.summary.classes["chat"].goodput
    assert t.good.requests_per_s == pytest.approx(goodput.requests_per_s, abs=1e-3)
    assert t.good.output_tokens_per_s == pytest.approx(goodput.output_tokens_per_s, abs=1e-3)
    page = render_markdown(built)
    assert "| completed (ok) | 37 | " in page
    assert "input tokens/s" in page


def test_counts_have_one_format_in_the_report_and_the_terminal(tmp_path: Path) -> None:
    """1,005 requests read `1,005` in every table and line, never `1005`."""
    records = [
        ok_record(i, intended_ms=i * 5.0, ttft_ms=50.0, gaps_ms=(20.0,)) for i in range(1005)
    ]
    run_dir = make_run(tmp_path, records)
    report = build_run_report(run_dir, window_s=600.0)
    page = render_markdown(report)
    assert "1,005" in page
    assert re.search(r"(?<![\d,.])1005(?![\d,])", page) is None
    text = render_summary_text(report.summary)
    assert "1,005" in text
    assert re.search(r"(?<![\d,.])1005(?![\d,])", text) is None


def render_summary_text(summary: Any) -> str:
    """The terminal summary as plain text, wide enough for one line per row."""
    console = Console(width=200, record=True, color_system=None)
    console.print(render_summary(summary))
    return console.export_text()
