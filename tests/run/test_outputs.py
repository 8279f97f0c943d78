"""A run's outputs share one lifecycle (`run.outputs`): begun at t0, given each record as it
lands (the records first), ended with the judged run; the engine calls a lone taker directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.engine.runner import LiveStats
from loadgen.results.records import RequestRecord, empty_frame
from loadgen.results.runfolder import T0
from loadgen.results.write import RecordWriter
from loadgen.run.outputs import Ended, Outputs
from loadgen.run.outputs.progress import Progress
from loadgen.run.outputs.records import Records
from loadgen.run.terminal import Terminal
from loadgen.testing.builders import streamed_record


class Kept:
    """An output that notes every call it gets."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls
        self.record = self.take

    def take(self, record: RequestRecord) -> None:
        self.calls.append(f"{self.name} record {record.request_id}")

    def begin(self, t0: T0) -> None:
        self.calls.append(f"{self.name} begin {t0.unix_ns}")

    def end(self, ended: Ended) -> None:
        self.calls.append(f"{self.name} end {ended.frame.height}")


class Quiet:
    """An output that takes no records."""

    record = None

    def begin(self, t0: T0) -> None:
        pass

    def end(self, ended: Ended) -> None:
        pass


def test_the_engine_calls_the_one_taker_of_records_directly(tmp_path: Path) -> None:
    """With one output taking records (the writer) and one not (the progress line), the
    engine's callback is the writer's own `add`: no call in between on the record path."""
    writer = RecordWriter(tmp_path)
    stats = LiveStats()
    outputs = Outputs(Records(writer), None, Progress(Terminal(quiet=True), lambda: stats))
    assert outputs.on_record() == writer.add


@pytest.mark.parametrize("takers", [2, 3])
def test_every_output_is_begun_fed_and_ended_in_its_order(takers: int) -> None:
    """Begin at t0, each record to each taker in order (a tally never before the records),
    end with the judged run; an output that takes no records is still begun and ended."""
    calls: list[str] = []
    names = ["records", "tally", "more"][:takers]
    outputs = Outputs(Kept(names[0], calls), Quiet(), *(Kept(name, calls) for name in names[1:]))
    outputs.begin(T0(unix_ns=7))
    take = outputs.on_record()
    for request_id in (0, 1):
        take(streamed_record(request_id, ttft_ms=10, gaps_ms=(5,)))
    outputs.end(Ended(frame=empty_frame(), summary=None, info=None))
    assert calls == [
        *(f"{name} begin 7" for name in names),
        *(f"{name} record 0" for name in names),
        *(f"{name} record 1" for name in names),
        *(f"{name} end 0" for name in names),
    ]
