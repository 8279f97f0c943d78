"""Host tuning for a measuring process: open files, the garbage collector, the event loop.

Every process that runs the engine (a run, each worker, calibrate, the test harness) sets
these up the same way, so what one measures the others can reproduce.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any


def raise_open_files_limit() -> int | None:
    """Raise the soft open-files limit to the hard one (each stream holds a socket).

    Returns the limit now in force (None where the platform has none). What is still too
    few shows up as `client_error` records and an invalid run (exit 3), never as server
    failures.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


def open_files_limit() -> int | None:
    """The soft open-files limit in force (None where the platform has none)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the garbage collector's full passes out of the measurement window.

    A full (generation 2) collection walks every live object; mid-run that is the records
    and chunk lists of thousands of requests, a pause of several ms during which no chunk
    is stamped. The plans and imports are frozen out of the collector, and full passes
    wait for the end of the run; young generations are still collected as usual (the
    engine breaks its own reference cycles, so little reaches the old generation).
    """
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def backend_options() -> dict[str, Any]:
    """anyio's asyncio backend, on uvloop when it is installed (lower per-event cost)."""
    try:
        import uvloop  # noqa: F401  # only probing that it is installed
    except ImportError:
        return {}
    return {"use_uvloop": True}
