"""Helpers die with their parent: the kernel's death signal, or the watcher where it has none."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.testing.crashtest import descendants, wait_until_gone

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

# A parent that starts one sleeping child the given way, prints the child's pid, and waits.
WRAPPED = """
import subprocess, sys, time
from loadgen.run.processes import lifeline
command = lifeline.wrap([sys.executable, "-c", "import time; time.sleep(600)"], 15)
command[command.index("auto")] = sys.argv[1]
child = subprocess.Popen(command)
print(child.pid, flush=True)
time.sleep(600)
"""
IN_PROCESS = """
import os, subprocess, sys, time
code = ("import sys, time; from loadgen.run.processes.lifeline import die_with_parent; "
        "print(die_with_parent(int(sys.argv[1]), 9, kernel=" + sys.argv[1] + "), flush=True); "
        "time.sleep(600)")
child = subprocess.Popen([sys.executable, "-c", code, str(os.getpid())], stdout=subprocess.PIPE)
child.stdout.readline()  # armed
print(child.pid, flush=True)
time.sleep(600)
"""
PLAIN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def kill_parent_and_count_survivors(script: str, mode: str, timeout_s: float = 20.0) -> list[str]:
    """Start the parent, SIGKILL it once its child runs, and return what still runs of the
    helpers it had (killing any so that a failing test leaves nothing behind)."""
    parent = subprocess.Popen([sys.executable, "-c", script, mode], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    helpers: list[int] = []
    try:
        child = int(parent.stdout.readline())
        helpers = descendants(parent.pid)
        assert child in helpers
        parent.kill()
        parent.wait(timeout=30)
        return wait_until_gone(helpers, timeout_s)
    finally:
        parent.kill()
        parent.stdout.close()
        parent.wait()
        for pid in helpers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["auto", "watch"])
def test_a_wrapped_command_dies_when_its_parent_is_killed(mode: str) -> None:
    """`lifeline.wrap` (how the simulator is started): the kernel's death signal (auto), or
    the supervising wrapper (watch); either way nothing survives a SIGKILL of the parent."""
    assert kill_parent_and_count_survivors(WRAPPED, mode) == []


@pytest.mark.parametrize("kernel", ["True", "False"])
def test_a_process_that_asked_to_die_with_its_parent_does(kernel: str) -> None:
    """`die_with_parent` (how workers arrange it): prctl, or the watcher thread."""
    assert kill_parent_and_count_survivors(IN_PROCESS, kernel) == []


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_without_the_arrangement_the_child_is_orphaned() -> None:
    """The control: a plain child outlives its killed parent (so the tests above can fail)."""
    assert len(kill_parent_and_count_survivors(PLAIN, "none", timeout_s=2.0)) == 1
