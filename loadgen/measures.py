"""The measures: the latencies loadgen reports of every request, each declared once.

On the ground floor (it imports nothing of loadgen), so that every stage reads one table:
the workload's SLO keys (`SloTargets`), the per-request values (`analysis.metrics.derive`),
each class's stats and checks (`analysis.slo`), the per-minute histograms, rolling windows,
compare, the live tally and its Prometheus export, the report's rows and figures, the docs'
list of measures (docs/metrics.md) and the Grafana dashboard (both tested against it) iterate
over `MEASURES`. Adding one is a row here; docs/development.md says what else it needs
(a summary field, an SLO key).

A measure runs from one record column to another (`start` → `end`, times on the run clock;
`records.COLUMNS`), in ms:

- per request: end − start (an ok request without `end` ends at `end_if_none`);
- per token: (end − start) / (N − 1), only for N = output tokens > 1 (TPOT);
- per gap: every gap between successive times of the list `end` (ITL); percentiles are over
  the gaps, and its per-request value, which a per-request threshold judges, is the
  request's largest gap (`per_request`: `max_itl_ms`).

Names: `name` is the short one the file formats use for it (histograms.parquet's column,
`loadgen_<name>_seconds`, compare's figures and families, rolling's prefixes), `column` the
per-request value's (`derive`'s column, summary.json's key, the workload's SLO key).
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST = "request"  # end − start, one value per request
TOKEN = "token"  # (end − start) / (N − 1), per request with N > 1
GAP = "gap"  # every gap between successive times of a list column
KINDS = (REQUEST, TOKEN, GAP)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measure:
    """One measure: its names, the record columns it spans, how the audit treats it."""

    name: str  # the short name: `ttft`
    label: str  # as people read it: `TTFT`
    about: str  # one line: what it is (the live export's help text, the docs)
    start: str  # the record column it runs from
    end: str  # the record column it runs to
    per: str = REQUEST  # REQUEST, TOKEN or GAP
    end_if_none: str | None = None  # where an ok request without `end` ends instead
    # Also ranked with every failed request as worst (+inf): summary.json's
    # `<column>_with_failures`, the report's "failures worst" row, rolling's and compare's.
    failures_worst: bool = False
    # Can carry an SLO: a workload `slo.<column>` key (a per-request threshold and a
    # percentile target), and so kept where targets are judged over time: the per-minute
    # histograms and rolling windows, compare, the live histograms and the dashboard.
    slo: bool = False
    unit: str = "ms"

    def __post_init__(self) -> None:
        if self.per not in KINDS:
            raise ValueError(f"measure {self.name}: per must be one of {KINDS} (got {self.per})")

    @property
    def column(self) -> str:
        """Its per-request values' column and summary.json's key: `ttft_ms`."""
        return f"{self.name}_{self.unit}"

    @property
    def with_failures(self) -> str:
        """summary.json's key of its stats with failures ranked worst."""
        return f"{self.column}_with_failures"

    @property
    def per_request(self) -> str:
        """The column of its one value per request, which a per-request threshold judges:
        the measure's own, or a gap measure's largest gap (`max_itl_ms`)."""
        return f"max_{self.column}" if self.per == GAP else self.column

    @property
    def paced(self) -> bool:
        """Its value is the stream's pace (per token or per gap), which a stream that arrived
        coalesced does not show (`analysis.delivery`)."""
        return self.per in (TOKEN, GAP)


TTFT = Measure(
    name="ttft",
    label="TTFT",
    about="Time to first generated token from the intended send time",
    start="intended_ns",
    end="first_token_ns",
    failures_worst=True,
    slo=True,
)
TTFT_FROM_SEND = Measure(
    name="ttft_from_send",
    label="TTFT from send",
    about="Time to first generated token from the actual send (a diagnostic of the server)",
    start="sent_ns",
    end="first_token_ns",
)
TTFVT = Measure(
    name="ttfvt",
    label="TTFVT",
    about="Time to first visible token (content, not reasoning) from the intended send time",
    start="intended_ns",
    end="first_content_ns",
)
TPOT = Measure(
    name="tpot",
    label="TPOT",
    about="Time per output token after the first, (last - first) / (N - 1)",
    start="first_token_ns",
    end="last_token_ns",
    per=TOKEN,
    failures_worst=True,
    slo=True,
)
ITL = Measure(
    name="itl",
    label="ITL",
    about="Every gap between successive output-bearing chunks",
    start="chunk_ns",
    end="chunk_ns",
    per=GAP,
    slo=True,
)
E2E = Measure(
    name="e2e",
    label="E2E",
    about="Intended send time to the last token",
    start="intended_ns",
    end="last_token_ns",
    end_if_none="end_ns",  # an ok response with no output token at all
    failures_worst=True,
    slo=True,
)

MEASURES: tuple[Measure, ...] = (TTFT, TTFT_FROM_SEND, TTFVT, TPOT, ITL, E2E)
SLO_MEASURES: tuple[Measure, ...] = tuple(m for m in MEASURES if m.slo)
FAILURES_WORST: tuple[Measure, ...] = tuple(m for m in MEASURES if m.failures_worst)
BY_NAME: dict[str, Measure] = {m.name: m for m in MEASURES}
BY_COLUMN: dict[str, Measure] = {m.column: m for m in MEASURES}


def label_of(column: str) -> str:
    """A measure's label by its column (`ttft_ms` → `TTFT`); another name as it is."""
    found = BY_COLUMN.get(column)
    return found.label if found is not None else column
