"""Engine processes on one host, run as one group: spawned, each ready before any starts,
all started at one t0, stopped by the one interrupt policy, never left behind.

`loadgen run --workers N` (`run.scale.workers`) and `loadgen calibrate --processes N`
(`studies.calibrate`) run their engine processes through one `ProcessGroup` of spawned
`child.Child`ren. A child sets up (imports, its loop and engine), says `ready` and blocks
(`child.ready_then_wait`); once every child is ready the parent sends each the same start
with t0, so no process is still importing when the schedule begins. The parent owns
SIGINT and SIGTERM and applies `run.interrupt` to the group: the first signal tells every
child to `stop` (a child follows its parent with `obey_parent`), the second to `exit`.
Each child ends with one `done` message; the group joins every child, and kills what has
not exited by then.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import anyio

from loadgen.engine.runner import Engine
from loadgen.errors import EXIT_INTERRUPTED, LoadgenError
from loadgen.run.interrupt import interrupt
from loadgen.run.processes.child import (
    DONE,
    READY,
    READY_TIMEOUT_S,
    SIGNALS,
    Child,
    Pipe,
    ready_then_wait,
)
from loadgen.run.record import RunState
from loadgen.run.terminal import Terminal

__all__ = [
    "CANCEL", "DONE", "EXIT", "STOP", "Child", "ProcessGroup", "obey_parent", "ready_then_wait",
    "receive", "spawn", "start_all", "wait_ready",
]  # fmt: skip

STOP, CANCEL, EXIT = "stop", "cancel", "exit"  # parent → child: (command,), see obey_parent
JOIN_TIMEOUT_S = 10.0  # a child not exited this long after the group ended is killed
EXIT_WAIT_S = 5.0  # after a second signal: how long the children get to write and exit


def spawn(target: Callable[..., None], args: Sequence[tuple[Any, ...]], name: str) -> list[Child]:
    """One spawned process per tuple of `args`, running `target(*args, pipe)`."""
    return [Child.spawn(target, arguments, name=f"{name}-{index}", index=index)
            for index, arguments in enumerate(args)]  # fmt: skip


# -- the child's side ------------------------------------------------------------------


STATS_EVERY_S = 0.5  # a child's heartbeat, when it reports


async def obey_parent(
    conn: Pipe, engine: Engine, state: RunState, grace_s: float, *,
    exit_now: Callable[[], None] = lambda: None,
    report: Callable[[], tuple[Any, ...]] | None = None,
) -> None:  # fmt: skip
    """A child's control task beside its engine: follow the parent's commands, and send it
    `report()` twice a second (its heartbeat) when given.

    `stop`: no new requests, in-flight ones get `grace_s`, then are cancelled. `cancel`: stop
    and cancel now. `exit`: `exit_now()` (write what is pending) and exit at once, 130. A
    closed pipe (the parent died) is `cancel`: every record is still written.
    """
    grace_end: float | None = None
    last_report = 0.0
    while True:
        await anyio.sleep(0.1)
        commands = []
        try:
            while conn.poll():
                commands.append(str(conn.recv()[0]))
        except (EOFError, OSError):
            commands.append(CANCEL)
        for command in commands:
            if command in (STOP, CANCEL):
                state.interrupted = True
                engine.stop()
                grace_end = time.monotonic() + (grace_s if command == STOP else 0.0)
            elif command == EXIT:
                exit_now()
                os._exit(EXIT_INTERRUPTED)
        if grace_end is not None and time.monotonic() >= grace_end:
            engine.requests.cancel()
            grace_end = None
        if report is not None and time.monotonic() - last_report >= STATS_EVERY_S:
            last_report = time.monotonic()
            try:
                conn.send(report())
            except OSError:
                grace_end = time.monotonic()


# -- the parent's side -----------------------------------------------------------------


def receive(
    children: Sequence[Child], timeout_s: float, on_message: Callable[[Child, Any], None]
) -> None:
    """Take every message that arrives within `timeout_s`: a `ready` marks its child ready,
    and every message goes to `on_message`; a pipe that closed marks its child closed."""
    open_conns = {child.conn: child for child in children if child.conn and not child.closed}
    if not open_conns:
        time.sleep(timeout_s)
        return
    for conn in multiprocessing.connection.wait(list(open_conns), timeout=timeout_s):
        child = open_conns[conn]  # type: ignore[index]  # wait returns what it was given
        assert child.conn is not None  # a spawned child
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            child.closed = True
            continue
        if message[0] == READY:
            child.ready, child.pid = True, int(message[1])
        elif message[0] == DONE:
            child.done = True
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
        dead = [c for c in children if not c.ready and (c.closed or c.exit_code is not None)]
        stop = interrupted()
        if dead or stop or time.monotonic() > deadline:
            if dead:  # exiting on its own (its pipe closes first): its code, not our SIGTERM
                dead[0].wait(5)
            for child in children:
                child.signal(signal.SIGTERM)
            if stop:
                raise KeyboardInterrupt
            why = (
                f"{what} {dead[0].index} exited with code {dead[0].exit_code}"
                if dead
                else f"not every {what} was ready after {timeout_s:g} s"
            )
            raise LoadgenError(f"could not start the {what} processes: {why}")


def start_all(children: Sequence[Child], t0: Any) -> None:
    """Send every child that is still listening the one start, with `t0`."""
    for child in children:
        child.start_at(t0)


OnMessage = Callable[[Child, Any], None]


@dataclass(slots=True)
class ProcessGroup:
    """`target(*args[i], pipe)` run in one spawned process per `args[i]`, as one group.

    Use it as a context manager: on entry it takes SIGINT and SIGTERM (collected, so no
    KeyboardInterrupt lands mid-message) and spawns the children; then `wait_ready`, `start`
    with the one t0, and `supervise` until every child is done. On exit it gives the
    signals back, joins every child and kills any still running after `JOIN_TIMEOUT_S`.
    """

    target: Callable[..., None]
    args: Sequence[tuple[Any, ...]]
    name: str  # the processes' name prefix
    what: str  # what a child is called in messages ("worker")
    children: list[Child] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)  # the signals received, in order
    _previous: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> ProcessGroup:
        def collect(signum: int, frame: FrameType | None) -> None:
            self.signals.append(signum)

        self._previous = {sig: signal.signal(sig, collect) for sig in SIGNALS}
        try:
            self.children = spawn(self.target, self.args, self.name)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._end(JOIN_TIMEOUT_S)

    def _end(self, within_s: float) -> None:
        """Join every child within `within_s` in all; kill what still runs then."""
        deadline = time.monotonic() + within_s
        for child in self.children:
            child.stop((None, max(0.0, deadline - time.monotonic())))

    def wait_ready(self, on_message: OnMessage = lambda child, message: None) -> None:
        """`wait_ready` for every child; a signal meanwhile ends it as KeyboardInterrupt."""
        wait_ready(self.children, self.what, on_message=on_message,
                   interrupted=lambda: bool(self.signals))  # fmt: skip

    def start(self, t0: Any) -> None:
        """The one start, with `t0`, to every child."""
        start_all(self.children, t0)

    def tell(self, message: tuple[Any, ...]) -> None:
        """Send every child still listening `message` (`(STOP,)`, `(CANCEL,)`, `(EXIT,)`)."""
        for child in self.children:
            child.tell(message)

    def supervise(
        self, on_message: OnMessage, *, grace_s: float, terminal: Terminal,
        tick: Callable[[RunState], None] = lambda state: None, every_s: float = 0.25,
        folder: Path | None = None, before_exit: Callable[[], None] = lambda: None,
    ) -> RunState:  # fmt: skip
        """Take every child's messages until each is done or gone, each signal through the
        one interrupt policy (`run.interrupt`: first, every child stops and gives its
        in-flight requests `grace_s`; second, every child and this process exit now, 130,
        after `before_exit()`: the run's record marked interrupted; `folder` is named).
        `tick(state)` runs at least every `every_s` (the caller's own supervision)."""
        state = RunState()
        handled = 0
        while any(child.running for child in self.children):
            receive(self.children, every_s, on_message)
            while handled < len(self.signals):
                handled += 1

                def exit_all() -> None:
                    self.tell((EXIT,))  # every child writes what it has and exits
                    self._end(EXIT_WAIT_S)
                    before_exit()

                interrupt(state, grace_s, terminal, stop=lambda: self.tell((STOP,)),
                          exit_now=exit_all, folder=folder)  # fmt: skip
            for child in self.children:
                if child.running and child.exit_code is not None:
                    child.closed = True
            tick(state)
        return state
