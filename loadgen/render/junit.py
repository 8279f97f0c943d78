"""JUnit XML for CI systems that show test results: one builder (`junit_xml`) for
`loadgen compare --junit` (a testsuite per class, a testcase per check) and `loadgen run
--junit` (`render.slo_junit`: a testcase per class per SLO check and objective)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loadgen.analysis.compare import CheckResult, Comparison, Verdict
from loadgen.printable import printable
from loadgen.render.compare_view import (
    HEADERS,
    format_change,
    format_tolerance,
    format_value,
    row_cells,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One testcase: passed, failed (`failure`: message, type and detail text) or
    skipped (`skipped`: why); `output` goes to its system-out."""

    name: str
    failure: tuple[str, str, str] | None = None  # (message, type, detail)
    skipped: str | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Suite:
    """One testsuite; its figures are properties (testcase-level properties are outside the
    common JUnit schema)."""

    name: str
    cases: Sequence[Case]
    properties: Mapping[str, str] = field(default_factory=dict)


def junit_xml(title: str, suites: Sequence[Suite]) -> str:
    """The JUnit document: a testsuites root named `title` with the totals of its suites."""
    root = ET.Element("testsuites", name=title)
    for suite in suites:
        root.append(_suite_element(suite))
    elements = root.findall("testsuite")
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in elements)))
    root.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def _suite_element(suite: Suite) -> ET.Element:
    element = ET.Element(
        "testsuite",
        name=suite.name,
        tests=str(len(suite.cases)),
        failures=str(sum(c.failure is not None for c in suite.cases)),
        errors="0",
        skipped=str(sum(c.skipped is not None for c in suite.cases)),
        time="0",
    )
    if suite.properties:
        properties = ET.SubElement(element, "properties")
        for key, value in suite.properties.items():
            ET.SubElement(properties, "property", name=key, value=printable(value))
    for case in suite.cases:
        item = ET.SubElement(element, "testcase", name=case.name, classname=suite.name, time="0")
        if case.failure is not None:
            message, kind, detail = case.failure
            failure = ET.SubElement(item, "failure", message=printable(message), type=kind)
            failure.text = _lines(detail)
        elif case.skipped is not None:
            ET.SubElement(item, "skipped", message=printable(case.skipped))
        if case.output is not None:
            ET.SubElement(item, "system-out").text = _lines(case.output)
    return element


def _lines(text: str) -> str:
    """Text of loadgen's own lines, each shown printable (`loadgen.printable`): XML 1.0
    cannot hold most control characters, and a server's cannot break a line."""
    return "\n".join(printable(line) for line in text.split("\n"))


def render_junit(comparison: Comparison) -> str:
    """JUnit XML: a testsuite per class, a testcase per check; a REGRESSED check is a
    failure, "not enough data" is skipped, and every number is a property of the suite."""
    classes = dict.fromkeys(r.class_name for r in comparison.results)
    suites = [
        _suite(name, [r for r in comparison.results if r.class_name == name], comparison)
        for name in classes
    ]
    for name, side in [
        *((n, "baseline") for n in comparison.only_in_baseline),
        *((n, "current") for n in comparison.only_in_current),
    ]:
        case = Case(name="compared", skipped=f"only in the {side}: not compared")
        suites.append(Suite(name=f"compare.{name}", cases=[case]))
    return junit_xml("loadgen compare", suites)


def _suite(name: str, results: Sequence[CheckResult], comparison: Comparison) -> Suite:
    properties = {
        "baseline": comparison.baseline,
        "current": comparison.current,
        "baseline_workload": comparison.baseline_workload,
        "current_workload": comparison.current_workload,
        "forced": str(comparison.forced).lower(),
        "confidence": f"{comparison.confidence:g}",
    }
    if comparison.forced and comparison.workload_differences:  # what made them differ
        properties["workload_differences"] = "; ".join(comparison.workload_differences)
    for r in results:
        for key, value in _numbers(r).items():
            properties[f"{r.check.name}.{key}"] = value
    cases = []
    for r in results:
        detail = "  ".join(f"{h}: {c}" for h, c in zip(HEADERS[1:], row_cells(r)[1:], strict=True))
        failure, skipped = None, None
        if r.verdict is Verdict.REGRESSED:
            message = (
                f"{r.check.label} regressed: {format_value(r.check, r.baseline.value)} → "
                f"{format_value(r.check, r.current.value)} ({format_change(r)}), beyond "
                f"{format_tolerance(r.check, r.tolerance)} and the intervals"
            )
            failure = (message, "regression", detail)
        elif r.verdict is Verdict.NO_DATA:
            skipped = f"not enough data: {r.reason}"
        cases.append(
            Case(
                name=r.check.name, failure=failure, skipped=skipped, output=f"{detail}\n{r.reason}"
            )
        )
    return Suite(name=f"compare.{name}", cases=cases, properties=properties)


def _numbers(r: CheckResult) -> dict[str, str]:
    """The figures of one check as property values (empty where a value is missing)."""

    def text(value: float | None) -> str:
        return "" if value is None else ("inf" if math.isinf(value) else f"{value:.6g}")

    return {
        "baseline": text(r.baseline.value),
        "baseline_low": text(r.baseline.low),
        "baseline_high": text(r.baseline.high),
        "baseline_n": str(r.baseline.n),
        "current": text(r.current.value),
        "current_low": text(r.current.low),
        "current_high": text(r.current.high),
        "current_n": str(r.current.n),
        "change": text(r.change),
        "verdict": str(r.verdict),
    }


def render_not_compared_junit(current: str, why: str, *, first_night: bool) -> str:
    """`compare --junit` when nothing was compared: the first night of a series (the case
    skipped, "no baseline yet": nothing to fail) or a side refused (the case fails as
    `invalid`, saying why)."""
    if first_night:
        case = Case(name="baseline", skipped=why)
    else:
        case = Case(name="compared", failure=(why, "invalid", why))
    suite = Suite(name="compare", cases=[case], properties={"current": current})
    return junit_xml("loadgen compare", [suite])
