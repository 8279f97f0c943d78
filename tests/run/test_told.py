"""A shard told its start by a driver (`run.processes.told`), and merge taking out a measured clock offset."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from loadgen.results.runfolder import T0, RunInfo, ShardInfo
from loadgen.run.merge import ShardRun
from loadgen.run.processes.told import ToldStart, parse_answer, start_line


def test_a_start_line_round_trips_and_moves_the_start_onto_this_hosts_clock() -> None:
    """`start T OFFSET` gives T and the offset; the local start is T + offset."""
    told = ToldStart()
    told.start_at_unix_ns, told.clock_offset_ns = parse_answer(start_line(10**18, -2_500_000))
    assert (told.start_at_unix_ns, told.clock_offset_ns) == (10**18, -2_500_000)
    assert told.local_start_unix_ns == 10**18 - 2_500_000


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("refuse shard 2 not ready by T\n", "shard 2 not ready by T"),
        ("", "closed stdin"),
        ("start soon\n", "not a start line"),
    ],
)
def test_a_refusal_or_a_closed_stdin_ends_the_shard_before_it_sends(
    line: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Anything but a start line exits 1 with the reason on stderr."""
    with pytest.raises(SystemExit) as ended:
        parse_answer(line)
    assert ended.value.code == 1
    assert said in capsys.readouterr().err


def test_merge_aligns_a_shard_by_its_anchor_less_its_measured_clock_offset() -> None:
    """A host 40 ms ahead whose t0 read 40 ms past T started exactly at T on the driver's clock."""
    start = 10**18
    info = RunInfo(
        run_id="s1",
        shard=ShardInfo(index=1, count=2, start_at_unix_ns=start, clock_offset_ns=40_000_000),
        t0=T0(unix_ns=start + 40_000_000, measured_unix_ns=start + 40_000_000),
    )
    shard = ShardRun(run_dir=Path("s1"), info=info, frame=pl.DataFrame(), fell_behind=False)
    assert shard.anchor_unix_ns == start + 40_000_000
    assert shard.aligned_anchor_ns == start
