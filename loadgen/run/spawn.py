"""Engine processes on one host, run as one group: spawned, each ready before any starts,
all started at one t0, stopped by the one interrupt policy, never left behind.

`loadgen run --workers N` (`run.workers`) and `loadgen calibrate --processes N`
(`studies.calibrate`) run their engine processes through one `ProcessGroup`. They are
spawned, not forked (a forked event loop is not safe), each with a pipe to the parent. A
child sets up (imports, its loop and engine), says `ready` and blocks (`ready_then_wait`);
once every child is ready the parent sends each the same `start` message with t0, so no
process is still importing when the schedule begins. The parent owns SIGINT and SIGTERM
(a child ignores them) and applies `drive.interrupt` to the group: the first signal tells
every child to `stop` (a child follows its parent with `obey_parent`), the second to
`exit`. Each child ends with one `done` message; the group joins every child, and kills
what has not exited by then.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

import anyio

from loadgen.engine.runner import Engine
from loadgen.errors import EXIT_INTERRUPTED, LoadgenError
from loadgen.run.drive import interrupt
from loadgen.run.record import RunState

READY = "ready"  # child → parent: ("ready", pid)
START = "start"  # parent → child: ("start", t0)
DONE = "done"  # child → parent, its last message: ("done", pid, what it has to say)
STOP, CANCEL, EXIT = "stop", "cancel", "exit"  # parent → child: (command,), see obey_parent
READY_TIMEOUT_S = 120.0  # a child that has not imported and set up by then is broken
JOIN_TIMEOUT_S = 10.0  # a child not exited this long after the group ended is killed
SIGNALS = (signal.SIGINT, signal.SIGTERM)

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
    done: bool = False  # it sent its `done`

    @property
    def running(self) -> bool:
        """Neither done nor gone."""
        return not self.done and not self.closed


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


# -- the child's side ------------------------------------------------------------------


def ready_then_wait(conn: Pipe) -> Any | None:
    """In a child: say ready, then block until the parent's start. Its t0, or None when the
    parent gave up (the pipe closed, or anything but a start came)."""
    conn.send((READY, os.getpid()))
    try:
        message = conn.recv()
    except EOFError:
        return None
    return message[1] if message[0] == START else None


def ignore_signals() -> None:
    """In a child: SIGINT and SIGTERM are the parent's (Ctrl-C reaches the whole terminal's
    process group; the parent tells each child what to do)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


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
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in self.children:
            child.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for child in self.children:
            if child.process.is_alive():
                child.process.kill()
                child.process.join(timeout=5)

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
            send(child, message)

    def supervise(
        self, on_message: OnMessage, *, grace_s: float, log: TextIO,
        tick: Callable[[RunState], None] = lambda state: None, every_s: float = 0.25,
        folder: Path | None = None, before_exit: Callable[[], None] = lambda: None,
    ) -> RunState:  # fmt: skip
        """Take every child's messages until each is done or gone, each signal through the
        one interrupt policy (`drive.interrupt`: first, every child stops and gives its
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
                    self._exit_all()
                    before_exit()

                interrupt(state, grace_s, log, stop=lambda: self.tell((STOP,)),
                          exit_now=exit_all, folder=folder)  # fmt: skip
            for child in self.children:
                if child.running and not child.process.is_alive():
                    child.closed = True
            tick(state)
        return state

    def _exit_all(self) -> None:
        """The second signal: every child writes what it has and exits (or is killed)."""
        self.tell((EXIT,))
        deadline = time.monotonic() + 5
        for child in self.children:
            child.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                child.process.kill()
