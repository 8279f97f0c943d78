"""`loadgen run --junit FILE` / `--markdown FILE`: a run's own SLO checks for CI.

One row (and one JUnit testcase) per class per SLO check (a percentile target, failures
ranked worst) and per objective (a summarization batch's deadline, an agent class's
trajectory share), plus the generator's health: a run whose generator fell behind judges
nothing of the server, so its case fails as `invalid`. A failure carries the measured
value, the target and the request count. A run that stopped before its end (Ctrl-C, the
watchdog, a recovered kill) judges nothing: every case is skipped, saying how it stopped.
The JUnit document comes from the one builder `loadgen compare --junit` uses
(`render.junit`), the Markdown from the same table cells.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.render.compare_view import md_cell
from loadgen.render.junit import Case, Suite, junit_xml
from loadgen.results.summary import ClassAudit, Summary

HEADERS = ("class", "check", "measured", "target", "requests", "result")
LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One check of one class as the table and the testcase show it."""

    class_name: str
    check: str  # the testcase name, e.g. `ttft_ms p99`
    label: str  # e.g. `TTFT p99 (failures worst)`
    measured: str
    target: str
    requests: int
    status: str  # pass, FAIL, invalid, skipped
    why: str = ""  # a failure's or a skip's sentence


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
    return Row(class_name=row.class_name, check=row.check, label=row.label,
               measured=row.measured, target=row.target, requests=row.requests,
               status="skipped", why=why)  # fmt: skip


def _ms(value: float | None) -> str:
    return "failure (ranked worst)" if value is None else f"{value:,.1f} ms"


def _class_rows(name: str, block: ClassAudit) -> list[Row]:
    out = []
    for check in block.slo.checks:
        if check.metric == "requests" or check.percentile is None:
            out.append(Row(class_name=name, check="requests", label="requests recorded",
                           measured="0", target="> 0", requests=block.requests,
                           status="FAIL", why=check.note or "no recorded requests"))  # fmt: skip
            continue
        label = f"{LABELS.get(check.metric, check.metric)} p{check.percentile:g} (failures worst)"
        measured, target = _ms(check.value_ms), f"≤ {_ms(check.target_ms)}"
        failed = block.requests - block.outcomes.get("ok", 0)
        why = "" if check.passed else (
            f"{label} of class {name}: {measured}, target {target}, over "
            f"{check.population:,} requests ({failed:,} failed)"
        )  # fmt: skip
        out.append(Row(class_name=name, check=f"{check.metric} p{check.percentile:g}",
                       label=label, measured=measured, target=target,
                       requests=check.population, status="pass" if check.passed else "FAIL",
                       why=why))  # fmt: skip
    if block.batch is not None:
        out.append(_batch_row(name, block))
    if block.trajectory is not None:
        out.append(_trajectory_row(name, block))
    return out


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
               status="pass" if batch.met_deadline else "FAIL", why=why)  # fmt: skip


def _trajectory_row(name: str, block: ClassAudit) -> Row:
    t = block.trajectory
    assert t is not None
    share = "none" if t.attainment is None else f"{t.attainment:.1%}"
    target = "none" if t.target_attainment is None else f"≥ {t.target_attainment:.1%}"
    passed = bool(t.met) if t.met is not None else False
    why = "" if passed else (
        f"trajectories of class {name}: {share} within budget, target {target}, over "
        f"{t.trajectories:,} trajectories ({t.failed_hops:,} failed hops)"
    )  # fmt: skip
    return Row(class_name=name, check="trajectory share", label="trajectories within budget",
               measured=share, target=target, requests=t.trajectories,
               status="pass" if passed else "FAIL", why=why)  # fmt: skip


def _generator_row(summary: Summary) -> Row:
    g = summary.generator
    lag = g.lag_ms.p99
    measured = "none" if lag is None else f"{lag:,.2f} ms"
    why = "" if not g.fell_behind else (
        f"the generator fell behind: send lag p99 {measured} above the {g.lag_bound_ms:g} ms "
        f"bound, over {g.sent:,} sends: the figures are the client's, not the server's"
    )  # fmt: skip
    return Row(class_name="generator", check="send lag p99", label="send lag p99",
               measured=measured, target=f"≤ {g.lag_bound_ms:g} ms", requests=g.sent,
               status="invalid" if g.fell_behind else "pass", why=why)  # fmt: skip


def render_run_junit(summary: Summary) -> str:
    """A testsuite per class (and one for the generator), a testcase per check."""
    found = rows(summary)
    suites = []
    for name in dict.fromkeys(r.class_name for r in found):
        mine = [r for r in found if r.class_name == name]
        cases = [_case(r) for r in mine]
        properties = {f"{r.check}.{k}": v for r in mine
                      for k, v in (("measured", r.measured), ("target", r.target),
                                   ("requests", str(r.requests)))}  # fmt: skip
        properties["run_id"] = summary.run_id
        suites.append(Suite(name=f"run.{name}", cases=cases, properties=properties))
    return junit_xml(f"loadgen run {summary.run_id}", suites)


def _case(row: Row) -> Case:
    detail = f"measured: {row.measured}  target: {row.target}  requests: {row.requests:,}"
    if row.status == "FAIL":
        return Case(name=row.check, failure=(row.why, "slo", detail), output=detail)
    if row.status == "invalid":
        return Case(name=row.check, failure=(row.why, "invalid", detail), output=detail)
    if row.status == "skipped":
        return Case(name=row.check, skipped=row.why, output=detail)
    return Case(name=row.check, output=detail)


def render_run_markdown(summary: Summary) -> str:
    """The same checks as a Markdown table, for a CI job summary."""
    verdict = summary.verdict
    title = {
        "met": "SLO MET",
        "missed": "SLO MISSED",
        "fell_behind": "INVALID (the generator fell behind)",
    }
    lines = [
        f"### loadgen run: {title.get(verdict.status, verdict.status.upper())} "
        f"(exit {verdict.exit_code})",
        "",
        f"run `{md_cell(summary.run_id)}` · {summary.duration_s:,.1f} s",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in rows(summary):
        status = {"pass": "pass", "skipped": "not judged"}.get(row.status, f"**{row.status}**")
        cells = [row.class_name, row.label, row.measured, row.target, f"{row.requests:,}", status]
        lines.append("| " + " | ".join(md_cell(c) if i < 5 else c
                                        for i, c in enumerate(cells)) + " |")  # fmt: skip
    found = rows(summary)
    failed = [r for r in found if r.status in ("FAIL", "invalid")]
    if failed:
        lines += ["", *(f"- {md_cell(r.why)}" for r in failed)]
    elif found and found[0].status == "skipped":
        lines += ["", md_cell(found[0].why)]
    return "\n".join(lines) + "\n"
