"""Child processes die with their parent, whatever kills it.

`loadgen run` starts helpers (`child.Child`): the built-in simulator (a command), the
server-metrics scraper and, with `--workers N`, N engine processes (spawned). A parent that
exits normally stops them; one killed by SIGKILL, the OOM killer or an `os._exit` (a second
Ctrl-C) runs no clean-up, so each child arranges its own death. On Linux the kernel sends
it a signal the moment its parent dies (`prctl(PR_SET_PDEATHSIG)`). Elsewhere a watcher
notices the re-parenting (`os.getppid()` changes) within half a second: a daemon thread in
a spawned process; for a command, the small `python -m loadgen.run.processes.lifeline`
process that runs it.

PR_SET_PDEATHSIG fires when the *thread* that created the child exits: start children
from a thread that lives as long as the process (loadgen starts them from the main thread).
It survives `execve`, which is how a command is wrapped: `python -m
loadgen.run.processes.lifeline PARENT_PID SIGNAL auto -- COMMAND...` sets it, then becomes
COMMAND (same pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 0.5  # the watcher's period


def set_pdeathsig(sig: int) -> bool:
    """Ask the kernel for `sig` when the parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    return False


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL, *, kernel: bool = True) -> str:
    """This process receives `sig` when `parent_pid`, its parent, dies (at once if it
    already has). Returns how: "prctl", or "watcher" (a daemon thread polling getppid; the
    only way where the kernel cannot, or with `kernel=False`)."""
    how = "prctl" if kernel and set_pdeathsig(sig) else "watcher"
    if how == "watcher":
        threading.Thread(target=_watch, args=(parent_pid, sig), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the arrangement was in place
        os.kill(os.getpid(), sig)
    return how


def _watch(parent_pid: int, sig: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os.kill(os.getpid(), sig)


def wrap(command: list[str], sig: int) -> list[str]:
    """`command` as a command line that dies with this process, receiving `sig`."""
    return [sys.executable, "-m", "loadgen.run.processes.lifeline", str(os.getpid()),
            str(int(sig)), "auto", "--", *command]  # fmt: skip


def main(argv: list[str]) -> None:
    """`PARENT_PID SIGNAL MODE -- COMMAND...`: MODE `auto` execs COMMAND with the kernel's
    death signal set (Linux), else (or with MODE `watch`) runs it as a child and watches."""
    if len(argv) < 5 or argv[3] != "--" or argv[2] not in ("auto", "watch"):
        raise SystemExit(
            "usage: python -m loadgen.run.processes.lifeline PARENT_PID SIGNAL auto|watch -- "
            "COMMAND..."
        )
    parent, sig, mode, command = int(argv[0]), int(argv[1]), argv[2], argv[4:]
    if os.getppid() != parent:
        raise SystemExit(1)  # the parent is already gone: nothing to run for
    if mode == "auto" and set_pdeathsig(sig):
        if os.getppid() != parent:
            raise SystemExit(1)
        os.execv(command[0], command)
    _supervise(parent, sig, command)


def _supervise(parent_pid: int, sig: int, command: list[str]) -> None:
    """Run `command`, pass SIGINT/SIGTERM on to it, and send it `sig` if the parent dies."""
    child = subprocess.Popen(command)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    for forwarded in (signal.SIGINT, signal.SIGTERM):
        signal.signal(forwarded, forward)
    while child.poll() is None:
        if os.getppid() != parent_pid:
            child.send_signal(sig)
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(POLL_S)
    code = child.wait()
    sys.exit(128 - code if code < 0 else code)  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    main(sys.argv[1:])
