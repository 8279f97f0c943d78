"""Every process a run starts is a `Child` (`run.processes.child`): started, ready, told its
start, stopped step by step, and a spawned one leaves the terminal's signals to its parent."""

from __future__ import annotations

import signal
import sys
import tempfile
from typing import Any

import pytest

from loadgen.run.processes.child import Child, NotReady, ready_then_wait
from loadgen.run.processes.told import READY_LINE

# A command that says ready, then exits 0 if its stdin's line is a start it can parse.
TOLD = f"""
import sys
from loadgen.run.processes.told import parse_answer
print({READY_LINE!r}, flush=True)
start, offset = parse_answer(sys.stdin.readline())
sys.exit(0 if (start, offset) == (1_700_000_000_000_000_000, -4_000) else 9)
"""
# A command that says ready and then ignores SIGTERM for ever.
STUBBORN = f"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print({READY_LINE!r}, flush=True)
time.sleep(600)
"""


def ready(line: str) -> str | None:
    return line.strip() if line.strip() == READY_LINE else None


def command(code: str, *, stdin: bool = False) -> Child:
    """`python -c code` as a child command, its stderr in a temp file."""
    with tempfile.TemporaryFile() as stderr:
        return Child.command([sys.executable, "-c", code], ready_line=ready, stderr=stderr,
                             lifeline=None, stdin=stdin)  # fmt: skip


def test_a_command_says_ready_and_is_told_its_start_on_stdin() -> None:
    """The ready line on stdout is what `wait_ready` returns; `start_at` writes the start
    line `told.parse_answer` reads (the agreed start and the clock offset)."""
    child = command(TOLD, stdin=True)
    try:
        assert child.wait_ready(60) == READY_LINE
        child.start_at(1_700_000_000_000_000_000, -4_000)
        assert child.wait(60)
        assert child.exit_code == 0
    finally:
        child.stop()
        child.close()


def test_a_command_that_exits_before_it_is_ready_is_not_ready_with_its_code() -> None:
    """NotReady carries the exit code of a child that ended before saying ready."""
    child = command("import sys; sys.exit(3)")
    with pytest.raises(NotReady) as raised:
        child.wait_ready(60)
    assert raised.value.exit_code == 3
    child.close()


def test_a_silent_child_is_not_ready_when_its_time_runs_out_and_is_left_running() -> None:
    """NotReady without an exit code: the child still runs until the caller stops it."""
    child = command("import time; time.sleep(600)")
    try:
        with pytest.raises(NotReady) as raised:
            child.wait_ready(0.3)
        assert raised.value.exit_code is None
        assert child.exit_code is None
    finally:
        assert child.stop() is False  # no nudge: killed
        child.close()
    assert child.exit_code == -signal.SIGKILL


def test_stop_nudges_step_by_step_and_kills_what_still_runs() -> None:
    """A child that ignores SIGTERM outlasts that step's wait and is killed (False); one
    that honours it ends at the nudge (True)."""
    stubborn = command(STUBBORN)
    polite = command(f"import time; print({READY_LINE!r}, flush=True); time.sleep(600)")
    try:
        stubborn.wait_ready(60)
        polite.wait_ready(60)
        assert stubborn.stop((signal.SIGTERM, 0.5)) is False
        assert stubborn.exit_code == -signal.SIGKILL
        assert polite.stop((signal.SIGTERM, 60)) is True
        assert polite.exit_code == -signal.SIGTERM
    finally:
        for child in (stubborn, polite):
            child.stop()
            child.close()


def answer_after_ctrl_c(conn: Any) -> None:
    """A spawned child: ready, then, once started, answer one message."""
    ready_then_wait(conn)
    conn.recv()
    conn.send(("alive",))


def test_a_spawned_child_leaves_ctrl_c_to_its_parent() -> None:
    """SIGINT sent to a spawned child (as Ctrl-C reaches the terminal's process group) does
    not end it: it still takes its start and answers."""
    child = Child.spawn(answer_after_ctrl_c, (), name="loadgen-test")
    try:
        child.wait_ready(60)
        child.signal(signal.SIGINT)
        child.start_at(0)
        child.tell(("ping",))
        assert child.conn is not None
        assert child.conn.poll(60)
        assert child.conn.recv() == ("alive",)
    finally:
        child.stop((None, 30))
        child.close()
