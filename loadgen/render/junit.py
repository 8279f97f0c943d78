"""`loadgen compare --junit`: the comparison as JUnit XML, a testsuite per class and a
testcase per check, for CI systems that show test results."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from loadgen.analysis.compare import CheckResult, Comparison, Verdict
from loadgen.render.compare_view import (
    HEADERS,
    format_change,
    format_tolerance,
    format_value,
    row_cells,
)


def render_junit(comparison: Comparison) -> str:
    """JUnit XML: a testsuite per class, a testcase per check; a REGRESSED check is a
    failure, "not enough data" is skipped, and every number is a property of the suite
    (testcase-level properties are outside the common JUnit schema)."""
    root = ET.Element("testsuites", name="loadgen compare")
    classes = dict.fromkeys(r.class_name for r in comparison.results)
    for name in classes:
        results = [r for r in comparison.results if r.class_name == name]
        root.append(_suite(name, results, comparison))
    for name, side in [
        *((n, "baseline") for n in comparison.only_in_baseline),
        *((n, "current") for n in comparison.only_in_current),
    ]:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"compare.{name}",
            tests="1",
            failures="0",
            errors="0",
            skipped="1",
            time="0",
        )
        case = ET.SubElement(
            suite, "testcase", name="compared", classname=f"compare.{name}", time="0"
        )
        ET.SubElement(case, "skipped", message=f"only in the {side}: not compared")
    suites = root.findall("testsuite")
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    root.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def _suite(name: str, results: Sequence[CheckResult], comparison: Comparison) -> ET.Element:
    failures = sum(r.verdict is Verdict.REGRESSED for r in results)
    skipped = sum(r.verdict is Verdict.NO_DATA for r in results)
    suite = ET.Element(
        "testsuite",
        name=f"compare.{name}",
        tests=str(len(results)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    properties = ET.SubElement(suite, "properties")
    shared = {
        "baseline": comparison.baseline,
        "current": comparison.current,
        "baseline_workload": comparison.baseline_workload,
        "current_workload": comparison.current_workload,
        "forced": str(comparison.forced).lower(),
        "confidence": f"{comparison.confidence:g}",
    }
    for key, value in shared.items():
        ET.SubElement(properties, "property", name=key, value=value)
    for r in results:
        for key, value in _numbers(r).items():
            ET.SubElement(properties, "property", name=f"{r.check.name}.{key}", value=value)
    for r in results:
        case = ET.SubElement(
            suite, "testcase", name=r.check.name, classname=f"compare.{name}", time="0"
        )
        detail = "  ".join(f"{h}: {c}" for h, c in zip(HEADERS[1:], row_cells(r)[1:], strict=True))
        if r.verdict is Verdict.REGRESSED:
            message = (
                f"{r.check.label} regressed: {format_value(r.check, r.baseline.value)} → "
                f"{format_value(r.check, r.current.value)} ({format_change(r)}), beyond "
                f"{format_tolerance(r.check, r.tolerance)} and the intervals"
            )
            ET.SubElement(case, "failure", message=message, type="regression").text = detail
        elif r.verdict is Verdict.NO_DATA:
            ET.SubElement(case, "skipped", message=f"not enough data: {r.reason}")
        ET.SubElement(case, "system-out").text = f"{detail}\n{r.reason}"
    return suite


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
