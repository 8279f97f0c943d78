"""The one interrupt policy of every run: of one engine process (`drive.watch_signals`) and of
a group of processes (`processes.group.ProcessGroup.supervise`) alike."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from loadgen.errors import EXIT_INTERRUPTED
from loadgen.run.record import RunState
from loadgen.run.terminal import Terminal


def interrupt(
    state: RunState, grace_s: float, terminal: Terminal, *, stop: Callable[[], None],
    exit_now: Callable[[], None], folder: Path | None = None,
) -> None:  # fmt: skip
    """First Ctrl-C/SIGTERM: stop sending (`stop`), in-flight requests get `grace_s`, then
    the caller cancels them. Second: write what is pending and mark the run interrupted
    (`exit_now`), say where the run folder is, what it holds and how to finish it, and exit
    at once, 130 (the parts written so far stay readable)."""
    if state.interrupted:
        exit_now()
        terminal.warn(f"\n{second_interrupt_text(folder)}")
        os._exit(EXIT_INTERRUPTED)
    state.interrupted = True
    terminal.warn(
        f"\ninterrupted: no new requests; waiting up to {grace_s:g} s for "
        "in-flight ones (interrupt again to exit now)"
    )
    stop()


def second_interrupt_text(folder: Path | None) -> str:
    """What a second Ctrl-C leaves, and how to finish it."""
    where = "the run folder" if folder is None else str(folder)
    return (
        f"second interrupt: exited at once (exit 130). {where} keeps the records of the "
        "requests that had ended, in its record parts; those in flight or not yet sent have "
        f"none, and there is no summary yet: `loadgen report --recover {where}` gives every "
        "planned request a record (cancelled or not_sent) and writes its summary; the run "
        "stays interrupted (no verdict, exit 130)"
    )
