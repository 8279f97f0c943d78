"""`loadgen run --junit FILE` / `--markdown FILE`: a run's own SLO checks for CI.

One row (and one JUnit testcase) per class per SLO check (a percentile target, failures
ranked worst) and per objective (a summarization batch's deadline, an agent class's
trajectory share), plus the generator's health: a run whose client's own time could have
changed its verdict (`analysis.health`) judges nothing of the server, so its case fails as
`invalid`. A failure carries the measured value, its confidence bounds, the target and the
request count; a missed TTFT check, where TTFT went when the server said (`split_view`).
An inconclusive check (the target within its bounds, or too few requests to bound it) is
a failure of type `inconclusive` saying how many requests would judge it: CI
must not read it as a pass. A run that stopped before its end (Ctrl-C, the watchdog, a
recovered kill) judges nothing: every case is skipped, saying how it stopped.
The JUnit document comes from the one builder `loadgen compare --junit` uses
(`render.junit`), the Markdown from the same table cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from loadgen.analysis.health import health_text, rate_text
from loadgen.measures import BY_COLUMN, GAP, TTFT, label_of
from loadgen.render.compare_view import md_cell
from loadgen.render.junit import Case, Suite, junit_xml
from loadgen.render.split_view import missed_point, split_sentence
from loadgen.render.terminal import SIM_NOTE, bounds_text
from loadgen.results.runfolder import TargetInfo
from loadgen.results.summary import VERDICTS, Check, ClassAudit, Summary, TrajectoryAudit

HEADERS = ("class", "check", "measured", "bounds", "target", "requests", "result")
# A check's result in the verdict's words, as the terminal says them (MET, MISSED,
# INCONCLUSIVE); the generator's health is ok or INVALID; a stopped run's rows skipped.
STATUS = {verdict: verdict.upper() for verdict in VERDICTS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One check of one class as the table and the testcase show it."""

    class_name: str
    check: str  # the testcase name, e.g. `ttft_ms p99`
    label: str  # e.g. `TTFT p99 (failures worst)`
    measured: str
    target: str
    requests: int
    status: str  # MET, MISSED, INCONCLUSIVE; ok, INVALID (the generator); skipped
    why: str = ""  # a failure's or a skip's sentence
    bounds: str = ""  # the confidence bounds, e.g. `95% bounds 61.2–84.9 ms`


def rows(summary: Summary) -> list[Row]:
    """Every check of every class, then the generator's health."""
    stopped = summary.verdict.status if summary.verdict.slo_met is None else None
    out: list[Row] = []
    for name, block in summary.classes.items():
        out.extend(_class_rows(name, block))
    out.append(_generator_row(summary))
    if stopped is not None:
        why = f"not judged: the run stopped before its end ({stopped}): no verdict"
        out = [_skip(row, why) for row in out]
    return out


def _skip(row: Row, why: str) -> Row:
    return replace(row, status="skipped", why=why)


def _ms(value: float | None) -> str:
    return "failure (ranked worst)" if value is None else f"{value:,.1f} ms"


def _class_rows(name: str, block: ClassAudit) -> list[Row]:
    out = []
    for check in block.slo.checks:
        if check.metric == "requests" or check.percentile is None:
            out.append(Row(class_name=name, check="requests", label="requests recorded",
                           measured="0", target="> 0", requests=block.requests,
                           status="MISSED", why=check.note or "no recorded requests"))  # fmt: skip
            continue
        out.append(_check_row(name, block, check))
    if block.delivery.coalesced:
        out.append(_delivery_row(name, block))
    if block.batch is not None:
        out.append(_batch_row(name, block))
    if block.trajectory is not None:
        out.append(_trajectory_row(name, block))
    return out


def _check_row(name: str, block: ClassAudit, check: Check) -> Row:
    """A percentile check: its value, bounds, target and verdict (and why, when not met)."""
    label = f"{label_of(check.metric)} p{check.percentile:g} (failures worst)"
    measured, target = _ms(check.value_ms), f"≤ {_ms(check.target_ms)}"
    level = "" if check.confidence is None else f"{check.confidence:.0%} "
    bounds = f"{level}bounds {bounds_text(check)}" if check.confidence is not None else ""
    failed = block.requests - block.outcomes.get("ok", 0)
    judged = check.judged
    why = ""
    if judged != "met":
        shown = f"{measured}, {bounds}" if bounds else measured
        unit = "gaps" if BY_COLUMN[check.metric].per == GAP else "requests"
        why = (f"{label} of class {name}: {shown}, target {target}, over "
               f"{check.population:,} {unit} ({failed:,} failed)")  # fmt: skip
        if judged == "inconclusive":
            why = f"inconclusive: {why}; {check.note}" if check.note else f"inconclusive: {why}"
        point = missed_point(block.ttft_split)
        if judged == "missed" and check.metric == TTFT.column and point is not None:
            why = f"{why}; {split_sentence(block.ttft_split, point)}"
    return Row(class_name=name, check=f"{check.metric} p{check.percentile:g}", label=label,
               measured=measured, target=target, requests=check.population,
               status=STATUS[judged], why=why, bounds=bounds)  # fmt: skip


def _delivery_row(name: str, block: ClassAudit) -> Row:
    """Streams that arrived coalesced, named: INCONCLUSIVE when that left the class's TPOT
    or ITL check inconclusive (their pace is not the server's), else a pass that says what
    arrived (no TPOT/ITL target, the rest judged it, or the workload says its path buffers)."""
    d = block.delivery
    measured = (
        f"{d.coalesced:,} of {d.streams:,} streams coalesced ({d.events_per_read:,.1f} events/read)"
    )
    share = f"{d.coalesced_share or 0:.0%} of streams, {d.coalesced_token_share or 0:.0%} of tokens"
    paced = [c for c in block.slo.checks if c.metric in BY_COLUMN and BY_COLUMN[c.metric].paced]
    status, why = "pass", ""
    if not d.path_buffers and any(c.judged == "inconclusive" for c in paced):
        status = "INCONCLUSIVE"
        why = (f"inconclusive: delivery of class {name}: {measured}, {share}, arrived in reads "
               f"of {d.coalesced_at_events}+ events (held back between the server and the "
               "client, or written in bursts by the server): their TPOT and ITL are not the "
               "server's pace (target.path_buffers: true judges them as observed)")  # fmt: skip
    return Row(class_name=name, check="delivery", label="delivery (events per read)",
               measured=measured, target="paced (not coalesced)"
               if not d.path_buffers else "path buffers (declared)",
               requests=d.streams, status=status, why=why, bounds=share)  # fmt: skip


def _batch_row(name: str, block: ClassAudit) -> Row:
    batch = block.batch
    assert batch is not None
    took = (
        "not finished" if batch.completion_time_s is None else f"{batch.completion_time_s:,.1f} s"
    )
    deadline = "none" if batch.deadline_s is None else f"{batch.deadline_s:,.1f} s"
    why = "" if batch.met_deadline else (
        f"batch of class {name}: {batch.ok:,} of {batch.documents:,} documents ok, done in "
        f"{took} against the deadline {deadline}"
    )  # fmt: skip
    return Row(class_name=name, check="batch deadline", label="batch deadline", measured=took,
               target=deadline, requests=batch.documents,
               status="MET" if batch.met_deadline else "MISSED", why=why)  # fmt: skip


def _trajectory_row(name: str, block: ClassAudit) -> Row:
    t = block.trajectory
    assert t is not None
    share = "none" if t.attainment is None else f"{t.attainment:.1%}"
    target = "none" if t.target_attainment is None else f"≥ {t.target_attainment:.1%}"
    judged = t.verdict or ("met" if t.met else "missed")
    bounds = share_bounds_text(t, block.slo.targets.confidence)
    why = "" if judged == "met" else (
        f"trajectories of class {name}: {share} within budget ({bounds}), target {target}, "
        f"over {t.trajectories:,} trajectories ({t.failed_hops:,} failed hops)"
        + (f"; {t.needed:,} trajectories, all ok, would judge it" if t.needed else "")
    )  # fmt: skip
    return Row(class_name=name, check="trajectory share", label="trajectories within budget",
               measured=share, target=target, requests=t.trajectories,
               status=STATUS[judged], why=why, bounds=bounds)  # fmt: skip


def share_bounds_text(t: TrajectoryAudit, confidence: float) -> str:
    """`95% bounds 74.1%–100.0%`: a trajectory share's exact one-sided bounds."""
    if t.attainment_low is None or t.attainment_high is None:
        return ""
    return f"{confidence:.0%} bounds {t.attainment_low:.1%}–{t.attainment_high:.1%}"


def _generator_row(summary: Summary) -> Row:
    """The generator-health rule (`analysis.health`) as one check: its figure (the send-lag
    p99, and the rate the sends kept) and whether the client's time could have changed the
    verdict, in the sentence the terminal prints."""
    g = summary.generator
    lag = g.lag_ms.p99
    measured = f"send lag p99 {'none' if lag is None else f'{lag:,.3g} ms'}"
    if g.rate_shortfall is not None:
        measured += f"; scheduled rate: {rate_text(g.rate_shortfall)}"
    target = "the verdict unchanged without the client's time"
    if g.lag_bound_ms is not None:
        target += f"; lag p99 ≤ {g.lag_bound_ms:g} ms (--lag-bound-ms)"
    why = f"the generator fell behind: {health_text(g)}" if g.fell_behind else ""
    return Row(class_name="generator", check="client time", label="client's time vs the verdict",
               measured=measured, target=target, requests=g.sent,
               status="INVALID" if g.fell_behind else "ok", why=why)  # fmt: skip


def render_run_junit(summary: Summary, target: TargetInfo | None = None) -> str:
    """A testsuite per class (and one for the generator), a testcase per check; a run
    against the built-in simulator says so in the document's name, every suite's
    `target` property and a `target` suite of its own (a case named for it)."""
    suites = _suites(summary, "run", target)
    return junit_xml(f"loadgen run {summary.run_id}{_against(target)}",
                     suites + _target_suites("run", target))  # fmt: skip


def render_repeats_junit(summaries: Sequence[Summary], target: TargetInfo | None = None) -> str:
    """`run --repeats K`: each run's suites (`RUN-ID.class`, a testcase per check), so a CI
    system shows every repeat's checks and fails on any run's miss."""
    title = f"loadgen run --repeats {len(summaries)}{_against(target)}"
    suites = [s for summary in summaries for s in _suites(summary, summary.run_id, target)]
    return junit_xml(title, suites + _target_suites("run", target))


def _against(target: TargetInfo | None) -> str:
    """` against the built-in simulator (no --url)` for a run against it, else nothing."""
    return " against the built-in simulator (no --url)" if _simulated(target) else ""


def _simulated(target: TargetInfo | None) -> bool:
    return target is not None and target.builtin_sim


def _target_suites(prefix: str, target: TargetInfo | None) -> list[Suite]:
    """A run against the built-in simulator: a suite with a case named for it."""
    if not _simulated(target):
        return []
    case = Case(name="built-in simulator (no --url)", output=f"target: {SIM_NOTE}")
    return [Suite(name=f"{prefix}.target", cases=[case], properties={"target": SIM_NOTE})]


def _suites(summary: Summary, prefix: str, target: TargetInfo | None = None) -> list[Suite]:
    """A run's suites named `prefix.class`, each check's figures as properties (and where
    the requests went, `target`)."""
    found = rows(summary)
    suites = []
    for name in dict.fromkeys(r.class_name for r in found):
        mine = [r for r in found if r.class_name == name]
        cases = [_case(r) for r in mine]
        properties = {f"{r.check}.{k}": v for r in mine
                      for k, v in (("measured", r.measured), ("bounds", r.bounds),
                                   ("target", r.target), ("requests", str(r.requests)))
                      if v}  # fmt: skip
        properties["run_id"] = summary.run_id
        if target is not None:
            properties["target"] = SIM_NOTE if target.builtin_sim else str(target.url)
        suites.append(Suite(name=f"{prefix}.{name}", cases=cases, properties=properties))
    return suites


def _case(row: Row) -> Case:
    bounds = f"  {row.bounds}" if row.bounds else ""
    detail = f"measured: {row.measured}{bounds}  target: {row.target}  requests: {row.requests:,}"
    if row.status == "MISSED":
        return Case(name=row.check, failure=(row.why, "slo", detail), output=detail)
    if row.status == "INCONCLUSIVE":
        return Case(name=row.check, failure=(row.why, "inconclusive", detail), output=detail)
    if row.status == "INVALID":
        return Case(name=row.check, failure=(row.why, "invalid", detail), output=detail)
    if row.status == "skipped":
        return Case(name=row.check, skipped=row.why, output=detail)
    return Case(name=row.check, output=detail)


TITLES = {
    "met": "SLO MET",
    "missed": "SLO MISSED",
    "inconclusive": "SLO INCONCLUSIVE (nothing missed; not everything could be judged)",
    "fell_behind": "INVALID (the generator fell behind)",
}


def render_run_markdown(summary: Summary, target: TargetInfo | None = None) -> str:
    """The same checks as a Markdown table, for a CI job summary; a run against the
    built-in simulator says so under its title."""
    verdict = summary.verdict
    lines = [
        f"### loadgen run: {TITLES.get(verdict.status, verdict.status.upper())} "
        f"(exit {verdict.exit_code})",
        "",
        f"run `{md_cell(summary.run_id)}` · {summary.duration_s:,.1f} s",
        "",
        *([f"**target: {SIM_NOTE}**", ""] if _simulated(target) else []),
        *_table(HEADERS, [("", r) for r in rows(summary)]),
        *_why_lines([("", r) for r in rows(summary)]),
    ]
    return "\n".join(lines) + "\n"


def render_repeats_markdown(
    summaries: Sequence[Summary], exit_code: int, spread: Sequence[str] = (),
    target: TargetInfo | None = None,
) -> str:  # fmt: skip
    """`run --repeats K` for a CI job summary: the worst verdict, every run's checks in one
    table (a `run` column first), the between-run spread (`spread`: its Markdown lines,
    `repeats_view.spread_markdown`), and why each check that was not met was not."""
    worst = next((s for s in summaries if s.verdict.exit_code == exit_code), summaries[-1])
    status = worst.verdict.status
    found = [(s.run_id, r) for s in summaries for r in rows(s)]
    runs = ", ".join(
        f"`{md_cell(s.run_id)}` {s.verdict.status} (exit {s.verdict.exit_code})" for s in summaries
    )
    lines = [
        f"### loadgen run --repeats {len(summaries)}: {TITLES.get(status, status.upper())} "
        f"(exit {exit_code}, the worst run's)",
        "",
        f"runs: {runs}",
        "",
        *([f"**target: {SIM_NOTE}**", ""] if _simulated(target) else []),
        *_table(("run", *HEADERS), found),
        *(["", *spread] if spread else []),
        *_why_lines(found),
    ]
    return "\n".join(lines) + "\n"


def _table(headers: Sequence[str], found: Sequence[tuple[str, Row]]) -> list[str]:
    """The checks' rows (after a run id when the headers start with `run`)."""
    with_run = headers[0] == "run"
    lines = ["| " + " | ".join(headers) + " |",
             "|" + ("---|" if with_run else "") + "---|---|---:|---|---:|---:|---|"]  # fmt: skip
    for run_id, row in found:
        status = {"MET": "MET", "ok": "ok", "skipped": "not judged"}.get(
            row.status, f"**{row.status}**"
        )
        cells = [row.class_name, row.label, row.measured, row.bounds, row.target,
                 f"{row.requests:,}"]  # fmt: skip
        shown = [*([f"`{md_cell(run_id)}`"] if with_run else []), *map(md_cell, cells), status]
        lines.append("| " + " | ".join(shown) + " |")
    return lines


def _why_lines(found: Sequence[tuple[str, Row]]) -> list[str]:
    """Why each check that was not met was not (after its run id, when there are several);
    or why nothing was judged."""
    failed = [(run_id, r) for run_id, r in found if r.status in ("MISSED", "INCONCLUSIVE",
                                                                  "INVALID")]  # fmt: skip
    if failed:
        return ["", *(f"- {f'{run_id}: ' if run_id else ''}{md_cell(r.why)}"
                      for run_id, r in failed)]  # fmt: skip
    if found and found[0][1].status == "skipped":
        return ["", md_cell(found[0][1].why)]
    return []
