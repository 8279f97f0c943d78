"""Engine processes are started one way (`run.spawn`): spawned, each ready before any
starts, all started with the same t0; one that dies before it is ready is named."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from loadgen.errors import LoadgenError
from loadgen.run.spawn import ready_then_wait, spawn, start_all, wait_ready


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
