"""`loadgen capacity --junit FILE` / `--markdown FILE`: the search's answer for CI.

The gate is the proposed limit (PASS, FAIL, or NOT JUDGED when the generator could not run
a load that decided it); without one, whether a knee was found. That is the one testcase
that can fail: the steps above the knee fail by design, so they are the case's output and
the suite's properties (`step.NN.load`, `.status`, `.note`), never failures of their own.
The Markdown says the same: the verdict, the conclusion's sentences, one row per step. A
search against the built-in simulator says so in both, as a run's checks do.
"""

from __future__ import annotations

from loadgen.analysis.capacity import INTERRUPTED, NOT_JUDGED, PASS, Search, Verdict, exit_code
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.capacity_view import conclusion
from loadgen.render.compare_view import md_cell
from loadgen.render.junit import Case, Suite, junit_xml
from loadgen.render.terminal import SIM_NOTE

WORDS = {PASS: "PASS", NOT_JUDGED: "NOT JUDGED"}


def verdict_word(found: Search, verdict: Verdict | None) -> str:
    """PASS, FAIL or NOT JUDGED for a proposed limit; else `knee found` or `no knee`; an
    interrupted search is `interrupted`."""
    stopped = found.stopped_by
    if stopped is not None and stopped.status == INTERRUPTED:
        return "interrupted"
    if verdict is not None:
        return WORDS.get(verdict.status, "FAIL")
    code = exit_code(found, None)
    return "knee found" if code == 0 else "not judged" if code == 3 else "no knee in range"


def _lines(found: Search, verdict: Verdict | None, axis: LoadAxis, margin: float) -> list[str]:
    """The conclusion's sentences, as the terminal prints them."""
    return [line.plain for line in conclusion(found, verdict, axis, margin)]


def render_capacity_junit(
    found: Search, verdict: Verdict | None, axis: LoadAxis, *, safety_margin: float,
    builtin_sim: bool = False,
) -> str:  # fmt: skip
    """One testcase, the search's answer, failing when its exit code is not 0 (type `fail`,
    or `invalid` for the generator's exit 3, `interrupted` for 130); every step as
    properties and in the case's output."""
    code = exit_code(found, verdict)
    name = (f"proposed limit {axis.text(verdict.proposed)}" if verdict is not None
            else "knee found")  # fmt: skip
    said = _lines(found, verdict, axis, safety_margin)
    steps = [f"step {axis.text(s.load)}: {s.status.upper()} ({s.note})" for s in found.steps]
    output = "\n".join([*said, *steps])
    kind = {0: None, 3: "invalid", 130: "interrupted"}.get(code, "fail")
    message = f"{verdict_word(found, verdict)} (exit {code}): {said[-1] if said else ''}"
    case = Case(name=name, output=output,
                failure=None if kind is None else (message, kind, output))  # fmt: skip
    properties = {"exit_code": str(code), "unit": axis.unit or axis.param}
    for key, load in (("highest_pass", found.highest_pass), ("first_fail", found.first_fail),
                      ("ceiling", found.ceiling), ("knee_high", found.upper)):  # fmt: skip
        if load is not None:
            properties[key] = axis.text(load)
    if verdict is not None and verdict.allowed is not None:
        properties["allowed"] = axis.text(verdict.allowed)
    for index, step in enumerate(found.steps, start=1):
        properties |= {f"step.{index:02d}.load": axis.text(step.load),
                       f"step.{index:02d}.status": step.status,
                       f"step.{index:02d}.note": step.note}  # fmt: skip
    suites = [Suite(name="capacity", cases=[case], properties=properties)]
    title = "loadgen capacity"
    if builtin_sim:
        title += " against the built-in simulator (no --url)"
        target = Case(name="built-in simulator (no --url)", output=f"target: {SIM_NOTE}")
        suites.append(
            Suite(name="capacity.target", cases=[target], properties={"target": SIM_NOTE})
        )
    return junit_xml(title, suites)


def render_capacity_markdown(
    found: Search, verdict: Verdict | None, axis: LoadAxis, *, safety_margin: float,
    builtin_sim: bool = False,
) -> str:  # fmt: skip
    """The verdict as a heading, the conclusion's sentences, one row per step."""
    code = exit_code(found, verdict)
    lines = [f"### loadgen capacity: {verdict_word(found, verdict)} (exit {code})", ""]
    if builtin_sim:
        lines += [f"**target: {SIM_NOTE}**", ""]
    lines += [f"- {md_cell(line)}" for line in _lines(found, verdict, axis, safety_margin)]
    lines += ["", "| load | offered req/s | completed req/s | verdict | why |",
              "|---|---:|---:|---|---|"]  # fmt: skip
    for step in sorted(found.steps, key=lambda s: s.load):
        steady = step.steady
        offered = "—" if steady is None else f"{steady.offered_per_s:.3g}"
        done = "—" if steady is None else f"{steady.completed_per_s:.3g}"
        cells = [axis.text(step.load), offered, done, step.status.upper(), step.note]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
