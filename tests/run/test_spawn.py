"""Engine processes are started one way (`run.processes.group`): spawned, each ready before any
starts, all started with the same t0; one that dies before it is ready is named; a group
hears every child until it is done, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest

import loadgen.run.processes.group as spawn_module
from loadgen.errors import LoadgenError
from loadgen.run.processes.group import (
    DONE,
    ProcessGroup,
    ready_then_wait,
    spawn,
    start_all,
    wait_ready,
)
from loadgen.run.terminal import Terminal


def echo_t0(label: str, conn: Any) -> None:
    """A child that reports ready, waits for the start and sends back its label and t0."""
    t0 = ready_then_wait(conn)
    conn.send((label, t0, os.getpid()))


def die_at_once(code: int, conn: Any) -> None:
    """A child that exits before it is ready."""
    sys.exit(code)


def test_every_child_is_ready_before_one_t0_goes_to_all() -> None:
    """Three children: each says ready (with its pid), then all get the one t0 sent."""
    children = spawn(echo_t0, [("a",), ("b",), ("c",)], "loadgen-test")
    try:
        wait_ready(children, "test")
        assert all(child.ready for child in children)
        start_all(children, 123_456_789)
        answers = [child.conn.recv() for child in children]
    finally:
        for child in children:
            child.process.join(timeout=10)
    assert [(label, t0) for label, t0, _ in answers] == [("a", 123_456_789), ("b", 123_456_789),
                                                         ("c", 123_456_789)]  # fmt: skip
    assert [pid for _, _, pid in answers] == [child.pid for child in children]


def test_a_child_that_dies_before_it_is_ready_is_named_with_its_exit_code() -> None:
    """wait_ready ends with a LoadgenError naming which process exited, and how."""
    children = spawn(die_at_once, [(3,)], "loadgen-test")
    with pytest.raises(LoadgenError, match="could not start the test processes: test 0 exited "
                                           "with code 3"):  # fmt: skip
        wait_ready(children, "test")
    children[0].process.join(timeout=10)


def ready_then_hang(conn: Any) -> None:
    """A child that takes its start and then never ends (a stuck engine)."""
    ready_then_wait(conn)
    while True:
        time.sleep(60)


def test_a_group_kills_a_child_that_has_not_exited_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever ends the group (here: the caller leaves it after the start), a child still
    running once the join timeout has passed is killed: no process outlives its group."""
    monkeypatch.setattr(spawn_module, "JOIN_TIMEOUT_S", 0.5)
    with ProcessGroup(ready_then_hang, [()], "loadgen-test", "test") as group:
        group.wait_ready()
        group.start(0)
    process = group.children[0].process
    assert not process.is_alive()
    assert process.exitcode == -signal.SIGKILL


def test_a_group_supervises_until_every_child_is_done() -> None:
    """`supervise` hands on every child's messages and returns once each sent its `done`."""
    heard: list[tuple[int, Any]] = []
    with ProcessGroup(echo_done, [("a",), ("b",)], "loadgen-test", "test") as group:
        group.wait_ready()
        group.start(7)
        state = group.supervise(lambda child, message: heard.append((child.index, message)),
                                grace_s=0.0, terminal=Terminal(sys.stderr))  # fmt: skip
    assert sorted((i, m[2]) for i, m in heard if m[0] == DONE) == [(0, ("a", 7)), (1, ("b", 7))]
    assert all(child.done for child in group.children)
    assert not state.interrupted


def echo_done(label: str, conn: Any) -> None:
    """A child that ends with its `done`: its label and t0."""
    t0 = ready_then_wait(conn)
    conn.send((DONE, os.getpid(), (label, t0)))
