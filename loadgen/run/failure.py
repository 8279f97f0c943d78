"""A run the client could not finish: a failed write or a failed worker, named, exit 3.

Used by a single-process run (`run.local`) and by the parent of worker processes
(`run.scale.workers`): the same one-line error, the same run.json, whichever failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from loadgen.engine.runner import LiveStats
from loadgen.errors import ClientFailure, describe_os_error
from loadgen.results.runfolder import RunInfo
from loadgen.results.write import RecordWriter, write_run_info


@contextlib.contextmanager
def client_failures(
    run_dir: Path, writer: RecordWriter, stats: LiveStats, info: Callable[[], RunInfo]
) -> Iterator[None]:
    """Turn a failed write (no space left, permission denied, out of file descriptors,
    file too large) into a `ClientFailure` (exit 3); see `client_failure`.

    The engine was already stopped (see `drive`); what is still pending is written if the
    resource is back, and counted as lost if not. `info`: the run record as it stands.
    """
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError):  # still failing: counted as lost below
            writer.flush()
        raise client_failure(
            describe_os_error(exc, exc.filename or run_dir), run_dir, info(),
            written=writer.written, planned=stats.planned, lost=writer.pending, sent=stats.sent,
        ) from None  # fmt: skip


def client_failure(
    what: str, run_dir: Path, info: RunInfo, *, written: int, planned: int,
    lost: int = 0, sent: int | None = None,
) -> ClientFailure:  # fmt: skip
    """The one-line error of a run the client could not finish: what failed (the path or
    the limit), how many records are on disk, and how to finish them (`loadgen report
    --recover`). run.json says what happened, if it still can be written."""
    with contextlib.suppress(OSError):
        ended = replace(info, interrupted=True, finished=False, client_failure=what)
        write_run_info(run_dir, ended)
    kept = f"{written:,} of {planned:,} planned records are on disk"
    if lost:
        kept += f" ({lost:,} more could not be written)"
    stopped = f"the run stopped ({sent:,} sent)" if sent is not None else "the run stopped"
    return ClientFailure(
        f"{what}; {stopped}: the client failed, so this is not a measurement of the server "
        f"(exit 3). {kept}; once the cause is fixed, `loadgen report --recover {run_dir}` "
        "finishes them"
    )
