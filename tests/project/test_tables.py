"""The column and measure tables hold: the docs' lists are theirs (generated from them and
checked here), every measure spans record columns, and the summary, the workload's SLO keys
and the live export's docs have a place for every measure."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from loadgen.measures import FAILURES_WORST, GAP, MEASURES, SLO_MEASURES
from loadgen.results.records import COLUMNS, Column
from loadgen.results.summary import ClassAudit, ModelAudit
from loadgen.workload.spec import SloTargets

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from docs_tables import BLOCKS, block_of, column_rows  # noqa: E402  # the script writes the docs

METRICS_DOC = ROOT / "docs" / "metrics.md"
LIVE_DOC = ROOT / "docs" / "live-export.md"
WORKLOADS_DOC = ROOT / "docs" / "workloads.md"


def generated_block(page: Path, name: str) -> list[str]:
    """The lines of `page`'s block `name` (`scripts/docs_tables.py` writes them)."""
    found = block_of(page.read_text(encoding="utf-8"), name)
    assert found is not None, f"{page.name} has no block <!-- begin: {name} ... -->"
    return found


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_docs_list_every_record_column_and_measure_as_the_tables_declare_them(
    name: str,
) -> None:
    """docs/metrics.md's table of the record's columns, and of the measures, is the table in
    the code rendered: a column or measure added, renamed or redocumented shows there (or this
    fails: `python scripts/docs_tables.py` writes the blocks)."""
    assert generated_block(METRICS_DOC, name) == BLOCKS[name](), (
        f"docs/metrics.md's {name} differ from the code: run python scripts/docs_tables.py"
    )


def test_the_docs_check_fails_on_a_column_the_docs_miss() -> None:
    """The check above can fail: with a column more than the docs hold, the block differs."""
    extra = Column(name="first_body_ns", attribute="first_body_ns", dtype=pl.Int64(),
                   doc="its first body byte", time=True)  # fmt: skip
    assert generated_block(METRICS_DOC, "the record's columns") != column_rows((*COLUMNS, extra))
    assert "| `first_body_ns` | int64 ns since t0 | its first body byte |" in column_rows(
        (*COLUMNS, extra)
    )


def test_every_measure_is_defined_in_the_docs_prose() -> None:
    """Each measure has its row in docs/metrics.md's "What is measured" table, by its label."""
    text = METRICS_DOC.read_text(encoding="utf-8")
    section = text.split("## What is measured", 1)[1].split("\n### ", 1)[0]
    firsts = [line.split("|")[1].replace("**", "").strip() for line in section.splitlines()
              if line.startswith("| ")]  # fmt: skip
    for m in MEASURES:
        assert any(first.startswith(m.label) for first in firsts), m.label


def test_every_measure_spans_time_columns_of_the_record() -> None:
    """A measure runs between times on the run clock the record holds: scalar times for one
    value per request, a list of them for a gap measure."""
    times = {c.name: c for c in COLUMNS if c.time}
    for m in MEASURES:
        ends = [m.start, m.end, *([m.end_if_none] if m.end_if_none else [])]
        for name in ends:
            assert name in times, f"{m.name}: {name} is no time column of the record"
            assert times[name].is_list == (m.per == GAP), f"{m.name}: {name}"


def test_the_summary_has_a_place_for_every_measure() -> None:
    """ClassAudit (summary.json) has each measure's stats and, where it ranks failures worst,
    those too; ModelAudit each SLO measure's: the audit fills them from the table."""
    fields = set(ClassAudit.__dataclass_fields__)
    assert {m.column for m in MEASURES} <= fields
    assert {m.with_failures for m in FAILURES_WORST} <= fields
    ranked = {f for f in fields if f.endswith("_with_failures")}
    assert ranked == {m.with_failures for m in FAILURES_WORST}
    assert {m.column for m in SLO_MEASURES} <= set(ModelAudit.__dataclass_fields__)


def test_the_workload_takes_a_target_for_every_measure_that_can_carry_one() -> None:
    """SloTargets' thresholds are exactly the SLO measures' keys (the file's `slo.*` keys),
    and docs/workloads.md names each."""
    thresholds = set(SloTargets.__dataclass_fields__) - {"percentile", "confidence"}
    assert thresholds == {m.column for m in SLO_MEASURES}
    targets = SloTargets(**dict.fromkeys(thresholds, 5.0))
    assert targets.thresholds_ms() == dict.fromkeys((m.column for m in SLO_MEASURES), 5.0)
    text = WORKLOADS_DOC.read_text(encoding="utf-8")
    assert all(m.column in text for m in SLO_MEASURES)


def test_the_live_export_docs_list_every_live_histogram() -> None:
    """docs/live-export.md has a row for each measure's `loadgen_<name>_seconds`."""
    text = LIVE_DOC.read_text(encoding="utf-8")
    for m in SLO_MEASURES:
        assert f"| `loadgen_{m.name}_seconds` | histogram |" in text, m.name
