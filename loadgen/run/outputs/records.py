"""The records of one engine process as they land: kept by its writer and spilled as parts
about once a second, in a thread, so the event loop keeps stamping chunks.

The writer is `results.write.RecordWriter` (a single-process run, joined into
`records.parquet` when the engine is done) or a worker's `ShareWriter` (its parts, joined
by the parent). A write that fails for want of file descriptors is retried with the next
batch (they come back as requests end); any other failed write (no space, permission, file
size limit) stops the run through `client_failed`.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from polars.exceptions import PanicException

from loadgen.errors import TRANSIENT_ERRNOS
from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import T0
from loadgen.results.write import RecordWriter
from loadgen.run.outputs import Ended


class Records:
    """The output that keeps every record (`record` is the writer's own `add`)."""

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.record = writer.add

    def begin(self, t0: T0) -> None:
        pass

    def end(self, ended: Ended) -> None:
        pass  # closed before the run is judged: the verdict is judged on them

    async def spill_due(self, client_failed: Callable[[OSError], None]) -> None:
        """Write the due batch, if any, as a part (see `spill`)."""
        batch = self.writer.take_due()
        if batch:
            await spill(self.writer, batch, client_failed)


async def spill(
    writer: RecordWriter, batch: list[RequestRecord], client_failed: Callable[[OSError], None]
) -> None:
    """Write one batch as a part in a thread. A batch whose write fails goes back to the
    writer (out of file descriptors: retried later; any other OSError, such as no space
    left, also stops the run through `client_failed`); so does one whose task is cancelled
    (the run is ending) before the thread took it, for the final flush: never lost, never
    written twice."""
    written = False

    def write() -> None:
        nonlocal written
        writer.write_part(batch)
        written = True

    try:
        await anyio.to_thread.run_sync(write)
    except PanicException:  # polars short of file descriptors: retry later
        writer.requeue(batch)
    except OSError as exc:
        writer.requeue(batch)
        if exc.errno not in TRANSIENT_ERRNOS:
            client_failed(exc)
    except BaseException:
        if not written:  # cancelled at the checkpoint before the (shielded) write began
            writer.requeue(batch)
        raise
