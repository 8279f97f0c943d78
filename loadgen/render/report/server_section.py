"""The run report's server section: what the server's /metrics said over the run (the
summary's `server` block) and the timeline of its queue, batch and KV cache beside the
client's TTFT p99 and arrival rate."""

from __future__ import annotations

from loadgen.printable import printable
from loadgen.render.report.blocks import Block, Figure, Heading, Para, Table, num, pct
from loadgen.render.report.model import RunReport
from loadgen.render.terminal import with_unit
from loadgen.results.summary import ServerAudit

GAUGE_NAMES = {
    "queue_depth": "queue depth (waiting)",
    "running": "running requests",
    "kv_usage": "KV-cache usage",
    "prefix_cache_hit_rate": "prefix-cache hit rate",
}
RATIOS = ("kv_usage", "prefix_cache_hit_rate")


def server_blocks(report: RunReport) -> list[Block]:
    """The section, or nothing when the run scraped no server."""
    server = report.summary.server
    if server is None:
        return []
    named = f"{server.server} metric names" if server.scrapes else "no scrape answered"
    heading = Heading(2, f"Server: {named} ({server.url})")
    blocks: list[Block] = [heading, _scrapes(server)]
    if server.gauges or server.counters:
        blocks.append(_figures_table(server))
    if server.histograms_ms:
        blocks.append(_histograms_table(server))
    if "server-timeline" in report.figures:
        blocks.append(Figure("server-timeline", report.captions["server-timeline"]))
    return blocks


def _scrapes(server: ServerAudit) -> Para:
    failed = "unknown" if server.failures is None else str(server.failures)
    text = (f"{server.scrapes} scrapes every {server.interval_s:g} s, {failed} failed"
            + (f", {server.malformed_lines} malformed lines skipped"
               if server.malformed_lines else ""))  # fmt: skip
    if server.access is not None and server.access.problem:
        text += f". {server.access.problem}"  # classified, with how to fix it
    elif server.last_error:
        text += f"; last error: {printable(server.last_error)}"
    if server.access is not None and server.access.headers:
        sent = ", ".join(f"{n} (from {src})" for n, src in server.access.headers.items())
        text += f". Sent {sent}"
    if server.scrapes == 0:
        text += ". No scrape answered: no server figures"
    elif server.server == "unknown":
        text += ". Unknown server: every series is kept raw in server_metrics.parquet"
    tone = "warn" if server.failures or server.scrapes == 0 else ""
    return Para(text + ".", tone)


def _figures_table(server: ServerAudit) -> Table:
    rows = []
    for name, stats in server.gauges.items():
        show = pct if name in RATIOS else num
        rows.append((GAUGE_NAMES.get(name, name), show(stats.mean), show(stats.p99),
                     show(stats.max), str(stats.samples)))  # fmt: skip
    for name, delta in server.counters.items():
        rows.append((name.replace("_", " ") + " (change)", num(delta), "", "", ""))
    if server.prefix_cache_hit_share is not None:
        rows.append(("prefix-cache hit share (hits / queries)",
                     pct(server.prefix_cache_hit_share), "", "", ""))  # fmt: skip
    return Table("Server figures over the run", ("figure", "mean", "p99", "max", "scrapes"), rows)


def _histograms_table(server: ServerAudit) -> Table:
    rows = [
        (f"server {name.upper()}", str(h.count), with_unit(h.mean), with_unit(h.p50),
         with_unit(h.p99))
        for name, h in server.histograms_ms.items()
    ]  # fmt: skip
    return Table("The server's own latency histograms over the run (interpolated in buckets)",
                 ("histogram", "observations", "mean", "p50", "p99"), rows)  # fmt: skip
