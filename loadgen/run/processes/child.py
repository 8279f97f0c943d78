"""One way to run a child process: started, ready, told its start, stopped, never left behind.

Every process loadgen itself starts is a `Child`: the engine workers of `run --workers N`
and `calibrate --processes N` (a `group.ProcessGroup` of them), the server-metrics scraper
(`scraper`), the built-in simulator (`simulator`), and a Ray shard's process, which the
shard's actor starts on its node (`run.scale.raycluster.actor`; Ray's own actors are
Ray's). Each goes through the same steps:

- start: `Child.spawn` runs a Python function in a spawned interpreter (not forked: a
  forked event loop is not safe) with a pipe of pickled messages to this process;
  `Child.command` runs a command line whose stdout this process reads for lines and whose
  stdin it may write (a command's name on its command line is what `ps` and the crash
  tests look for).
- ready: the child says ready once it has imported and set up (a `ready` message, or its
  ready line on stdout); `wait_ready` waits at most `READY_TIMEOUT_S` (a child that has
  not set up by then is broken) and raises `NotReady` when it exits first or stays silent,
  with its exit code, for the caller to word.
- start-at: `start_at` tells a ready child the one start (`ready_then_wait` is a spawned
  child's side of it; `told.ToldStart` a command's, over stdin).
- stop: `stop` nudges it step by step (a signal, or a message, each with how long to wait
  for the exit), then kills whatever still runs.
- lifeline: it dies with its parent, whatever kills that one (`lifeline`): a spawned child
  arranges it before its function runs, and leaves SIGINT and SIGTERM to its parent (Ctrl-C
  reaches the whole terminal's process group; the parent tells each child what to do); a
  command is wrapped by `lifeline.wrap` unless it arranges its own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from loadgen.run.processes.lifeline import die_with_parent, wrap
from loadgen.run.processes.told import start_line

READY = "ready"  # child → parent: ("ready", pid)
START = "start"  # parent → child: ("start", t0)
DONE = "done"  # child → parent, its last message: ("done", pid, what it has to say)
READY_TIMEOUT_S = 120.0  # a child that has not imported and set up by then is broken
KILL_WAIT_S = 5.0  # how long a killed child is waited for
SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a spawned child's parent's to handle

Pipe = multiprocessing.connection.Connection
Nudge = int | tuple[Any, ...] | None  # a signal, a message, or nothing (only wait)


class NotReady(Exception):
    """A child that did not say ready: it exited first (`exit_code`), or it was still
    setting up when the time ran out (`exit_code` None; it is left running)."""

    def __init__(self, exit_code: int | None, waited_s: float) -> None:
        super().__init__(f"exit {exit_code}" if exit_code is not None else f"{waited_s:g} s")
        self.exit_code = exit_code
        self.waited_s = waited_s


@dataclass(slots=True, eq=False)
class Child:
    """The parent's side of one child process (see the module docstring). A spawned child
    has `conn`, its pipe; a command has `process.stdout` (and `process.stdin`, if asked)."""

    index: int
    process: Any  # multiprocessing's SpawnProcess, or subprocess.Popen for a command
    conn: Pipe | None
    pid: int | None = None
    ready: bool = False
    closed: bool = False  # its pipe closed (it exited, or died)
    done: bool = False  # it sent its `done`
    ready_line: Callable[[str], Any] | None = None  # a command's: its ready line, parsed

    @property
    def running(self) -> bool:
        """Neither done nor gone."""
        return not self.done and not self.closed

    # -- start ---------------------------------------------------------------------------

    @classmethod
    def spawn(
        cls, target: Callable[..., None], args: tuple[Any, ...], *, name: str, index: int = 0,
        daemon: bool = False,
    ) -> Child:  # fmt: skip
        """`target(*args, pipe)` in a spawned process named `name`, which dies with this one
        (SIGKILL: it has nothing to flush that its parent does not) and ignores SIGINT and
        SIGTERM."""
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_bootstrap, args=(target, os.getpid(), args, child_end),
                                  name=name, daemon=daemon)  # fmt: skip
        process.start()
        child_end.close()  # the child has its own copy: a child that dies is then an EOFError
        return cls(index=index, process=process, conn=parent_end)

    @classmethod
    def command(
        cls, argv: Sequence[str], *, ready_line: Callable[[str], Any], stderr: IO[Any],
        lifeline: int | None, stdin: bool = False, cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Child:  # fmt: skip
        """`argv` as a subprocess, its stdout read for `ready_line` (which returns what the
        line says, or None for another line), its stderr to `stderr`. `lifeline`: the
        signal it gets when this process dies (`lifeline.wrap`); None: it arranges that
        itself. `stdin`: a pipe to tell it its start (`start_at`)."""
        argv = list(argv) if lifeline is None else wrap(list(argv), lifeline)
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, cwd=cwd, env=env,
        )  # fmt: skip
        return cls(index=0, process=process, conn=None, pid=process.pid, ready_line=ready_line)

    @property
    def is_command(self) -> bool:
        return self.conn is None and isinstance(self.process, subprocess.Popen)

    # -- ready ---------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> Any:
        """Block until the child says ready; what it said (a spawned child's message, what
        a command's ready line says). NotReady when it exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            said = self._ready_said(min(remaining, 0.2))
            if said is not None:
                self.ready = True
                return said
            if self.exit_code is not None or self.closed:
                self.wait(KILL_WAIT_S)  # exiting on its own: its code, once it has one
                raise NotReady(self.exit_code, timeout_s)
        raise NotReady(None, timeout_s)

    def _ready_said(self, timeout_s: float) -> Any:
        """What the child said within `timeout_s` if it was its ready, else None."""
        if not self.is_command:
            assert self.conn is not None
            if not self.conn.poll(timeout_s):
                return None
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.closed = True
                return None
            if message[0] == READY:
                self.pid = int(message[1])
                return message
            return None
        stdout = self.process.stdout
        readable, _, _ = select.select([stdout], [], [], timeout_s)
        if not readable:
            return None
        line = stdout.readline().decode("utf-8", "replace")
        if not line:  # its stdout closed: it is exiting
            self.wait(KILL_WAIT_S)
            return None
        assert self.ready_line is not None
        return self.ready_line(line)

    # -- start-at, messages and signals --------------------------------------------------

    def start_at(self, *t0: int) -> None:
        """Tell a ready child the start: a spawned child's `(start, t0)`; a command's start
        line on its stdin (`told.start_line`: the agreed start and its clock offset)."""
        if self.is_command:
            self.tell_line(start_line(*t0))
        else:
            self.tell((START, *t0))

    def tell(self, message: tuple[Any, ...]) -> None:
        """Send a spawned child a message; one whose pipe has closed is marked closed."""
        if self.closed or self.conn is None:
            return
        try:
            self.conn.send(message)
        except OSError:
            self.closed = True

    def tell_line(self, line: str, *, last: bool = False) -> None:
        """Write a line to a command's stdin (`last`: then close it); a command that has
        ended already is left to say how (its exit code)."""
        stdin = self.process.stdin
        assert stdin is not None  # started with stdin=True
        with contextlib.suppress(OSError):
            stdin.write(line.encode())
            stdin.flush()
            if last:
                stdin.close()

    def signal(self, sig: int) -> None:
        """Send the child `sig` (nothing if it has gone)."""
        with contextlib.suppress(ProcessLookupError):
            if self.is_command:
                self.process.send_signal(sig)
            elif self.process.pid is not None:
                os.kill(self.process.pid, sig)

    # -- stop ----------------------------------------------------------------------------

    @property
    def exit_code(self) -> int | None:
        """Its exit code once it has exited (negative: the signal that ended it), else None."""
        if self.is_command:
            return self.process.poll()  # type: ignore[no-any-return]
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout_s: float | None) -> bool:
        """Wait at most `timeout_s` (None: for ever) for it to exit; whether it has."""
        if self.is_command:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        self.process.join(timeout=timeout_s)
        return not self.process.is_alive()

    def kill(self) -> None:
        """SIGKILL; its pipe is then closed to this process."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.closed = True

    def stop(self, *steps: tuple[Nudge, float]) -> bool:
        """End the child: each step nudges it (a signal, or a message; None: nothing) and
        waits at most its seconds for the exit; one still running after the last is killed.
        True when it ended before the kill."""
        for nudge, wait_s in steps:
            if self.exit_code is not None:
                return True
            if isinstance(nudge, int):
                self.signal(nudge)
            elif nudge is not None:
                self.tell(nudge)
            if self.wait(wait_s):
                return True
        if self.exit_code is not None:
            return True
        self.kill()
        self.wait(KILL_WAIT_S)
        return False

    def close(self) -> None:
        """Close this process's ends of the child's pipes."""
        if self.conn is not None:
            self.conn.close()
        elif self.is_command:
            for stream in (self.process.stdout, self.process.stdin):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


# -- the spawned child's side -----------------------------------------------------------


def _bootstrap(
    target: Callable[..., None], parent_pid: int, args: tuple[Any, ...], conn: Pipe
) -> None:
    """A spawned child's first steps: die with the parent, leave it the signals, then run."""
    die_with_parent(parent_pid, signal.SIGKILL)  # never outlive the run (no orphans)
    ignore_signals()
    target(*args, conn)


def ignore_signals() -> None:
    """In a child: SIGINT and SIGTERM are the parent's (Ctrl-C reaches the whole terminal's
    process group; the parent tells each child what to do)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def ready_then_wait(conn: Pipe) -> Any | None:
    """In a spawned child: say ready, then block until the parent's start. Its t0, or None
    when the parent gave up (the pipe closed, or anything but a start came)."""
    conn.send((READY, os.getpid()))
    try:
        message = conn.recv()
    except EOFError:
        return None
    return message[1] if message[0] == START else None
