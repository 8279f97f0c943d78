"""Engine processes on one host: spawn them, wait until each is ready, start all at one t0.

`loadgen run --workers N` (`run.workers`) and `loadgen calibrate --processes N`
(`studies.calibrate`) start their engine processes the same way. They are spawned, not
forked (a forked event loop is not safe), each with a pipe to the parent. A child sets up
(imports, its loop and engine), says `ready` and blocks; once every child is ready the
parent sends each the same `start` message with t0, so no process is still importing
when the schedule begins.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.errors import LoadgenError

READY = "ready"  # child → parent: ("ready", pid)
START = "start"  # parent → child: ("start", t0)
READY_TIMEOUT_S = 120.0  # a child that has not imported and set up by then is broken

Pipe = multiprocessing.connection.Connection


@dataclass(slots=True)
class Child:
    """The parent's view of one spawned process."""

    index: int
    process: Any  # multiprocessing SpawnProcess
    conn: Pipe
    pid: int | None = None
    ready: bool = False
    closed: bool = False  # its pipe closed (it exited, or died)


def spawn(target: Callable[..., None], args: Sequence[tuple[Any, ...]], name: str) -> list[Child]:
    """One spawned process per tuple of `args`, running `target(*args, pipe)`."""
    context = multiprocessing.get_context("spawn")
    children = []
    for index, arguments in enumerate(args):
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=target, args=(*arguments, child_end), name=f"{name}-{index}"
        )
        process.start()
        child_end.close()  # the child has its own copy: a child that dies is then an EOFError
        children.append(Child(index=index, process=process, conn=parent_end))
    return children


def ready_then_wait(conn: Pipe) -> Any | None:
    """In a child: say ready, then block until the parent's start. Its t0, or None when the
    parent gave up (the pipe closed, or anything but a start came)."""
    conn.send((READY, os.getpid()))
    try:
        message = conn.recv()
    except EOFError:
        return None
    return message[1] if message[0] == START else None


def receive(
    children: Sequence[Child], timeout_s: float, on_message: Callable[[Child, Any], None]
) -> None:
    """Take every message that arrives within `timeout_s`: a `ready` marks its child ready,
    and every message goes to `on_message`; a pipe that closed marks its child closed."""
    open_conns = {child.conn: child for child in children if not child.closed}
    if not open_conns:
        time.sleep(timeout_s)
        return
    for conn in multiprocessing.connection.wait(list(open_conns), timeout=timeout_s):
        child = open_conns[conn]  # type: ignore[index]  # wait returns what it was given
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            child.closed = True
            continue
        if message[0] == READY:
            child.ready, child.pid = True, int(message[1])
        on_message(child, message)


def wait_ready(
    children: Sequence[Child],
    what: str,
    *,
    on_message: Callable[[Child, Any], None] = lambda child, message: None,
    interrupted: Callable[[], bool] = lambda: False,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Block until every child is ready. If one dies, `timeout_s` passes or `interrupted()`
    (Ctrl-C before anything was sent: KeyboardInterrupt), every child is terminated and
    LoadgenError says which of the `what` processes failed."""
    deadline = time.monotonic() + timeout_s
    while not all(child.ready for child in children):
        receive(children, 0.1, on_message)
        dead = [c for c in children if not c.ready and (c.closed or not c.process.is_alive())]
        stop = interrupted()
        if dead or stop or time.monotonic() > deadline:
            if dead:  # exiting on its own (its pipe closes first): its code, not our SIGTERM
                dead[0].process.join(timeout=5)
            for child in children:
                child.process.terminate()
            if stop:
                raise KeyboardInterrupt
            why = (
                f"{what} {dead[0].index} exited with code {dead[0].process.exitcode}"
                if dead
                else f"not every {what} was ready after {timeout_s:g} s"
            )
            raise LoadgenError(f"could not start the {what} processes: {why}")


def start_all(children: Sequence[Child], t0: Any) -> None:
    """Send every child that is still listening the one start, with `t0`."""
    for child in children:
        send(child, (START, t0))


def send(child: Child, message: tuple[Any, ...]) -> None:
    """Send a message to a child; one whose pipe has closed is marked closed."""
    if child.closed:
        return
    try:
        child.conn.send(message)
    except OSError:
        child.closed = True
