"""dashboards/loadgen-live.json: importable Grafana JSON over metric names loadgen exports."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from prometheus_client.exposition import generate_latest

from loadgen.analysis.live import LIVE, LiveTally
from loadgen.analysis.server import LIVE_FIGURES
from loadgen.results.records import TIME_COLUMNS, Outcome, RequestRecord
from loadgen.run.live import LiveExporter, LiveRun
from loadgen.testing.builders import failed_record, streamed_record

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "loadgen-live.json"
METRIC = re.compile(r"\b(loadgen_[a-z0-9_]+)\b")


def exported_names() -> set[str]:
    """Every sample name a live exporter serves (histogram series, counters' _total, info)."""
    tally = LiveTally({"chat": {"ttft_ms": 100.0}})
    tally.observe(every_time_set(streamed_record(0)))
    tally.observe(failed_record(1, outcome=Outcome.TIMEOUT_TOTAL))
    live = LiveExporter(price_per_hour=2.0)
    server = dict.fromkeys(LIVE_FIGURES, 1.0)  # every server figure a scrape can give
    live.begin(LiveRun(labels={"run_id": "r"}, tally=tally.snapshot, in_flight=dict,
                       planned={"chat": 2}, server=lambda: server))  # fmt: skip
    text = generate_latest(live.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def every_time_set(record: RequestRecord) -> RequestRecord:
    """`record` with each of its unset times on the run clock set (at its first token), so
    that every measure, whichever columns it spans, has a value to export."""
    unset = {c.attribute: record.first_token_ns for c in TIME_COLUMNS
             if not c.is_list and getattr(record, c.attribute) is None}  # fmt: skip
    return replace(record, **unset)


def panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def test_the_dashboard_is_grafana_json() -> None:
    """The keys Grafana's import needs, unique panel ids, panels inside the 24-column grid,
    and a datasource variable every query uses (so it imports as is, on any Prometheus)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert {"title", "uid", "panels", "schemaVersion", "templating", "time"} <= set(dashboard)
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_query_names_an_exported_metric() -> None:
    """Each loadgen_* name in a query or a variable is one an exporter really serves, and
    each exported family shows on some panel."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    served = exported_names()
    expressions = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {name for expr in expressions for name in METRIC.findall(expr)}
    assert used, "no loadgen metric in any query"
    assert used <= served, f"not exported: {sorted(used - served)}"
    families = {re.sub(r"_(bucket|sum|count|total|info)$", "", n) for n in served}
    shown = {re.sub(r"_(bucket|sum|count|total|info)$", "", n) for n in used}
    assert families - shown <= {"loadgen_run_elapsed_seconds"}, sorted(families - shown)


def test_every_live_measure_has_its_panel() -> None:
    """Each measure the live tally follows (`analysis.live.LIVE`, from the measure table) has
    a panel titled by its label whose every query reads its histogram: a measure added to the
    table without a panel fails here (the dashboard is tested against the table, not
    generated: its layout is laid out by hand)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for m in LIVE:
        found = [p for p in panels(dashboard) if p["title"].startswith(f"{m.label} ")]
        assert found, f"no panel titled {m.label} ..."
        expressions = [t["expr"] for p in found for t in p["targets"]]
        assert all(f"loadgen_{m.name}_seconds_bucket" in e for e in expressions), expressions
