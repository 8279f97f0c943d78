"""One writer per run folder: the live run holds its lock, and `report --recover` refuses it.

A run holds an exclusive `flock` on `run.lock` in its folder from the moment the folder is
made until its records and run.json are written (the kernel drops the lock when the process
dies, however it dies: SIGKILL, the OOM killer). `report --recover` takes the same lock
while it rewrites the folder, so a recovery never takes the parts of a run still writing
them, and two recoveries never race. A run on another host, where the lock may not reach
(some network file systems keep locks local to each host), is still seen by its heartbeats
(`records.parts/heartbeat*`, touched four times a second): when the lock cannot settle it,
a heartbeat touched within `STALE_S` is a live run. A free lock taken on this host settles
it: a run SIGKILLed a moment ago is recoverable at once.

`live_writer` says why a folder looks written by a live run (or None); `run_lock` holds the
lock for a `with` block and raises `RunBusy` (exit 6) when another process holds it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from loadgen.errors import RunBusy
from loadgen.results.runfolder import HEARTBEAT, LOCK_FILE, PARTS_DIR

STALE_S = 3.0  # heartbeats come every 0.25 s: 3 s of silence is not a live run

try:
    import fcntl
except ImportError:  # not on this platform: the heartbeats are the only sign of life
    fcntl = None  # type: ignore[assignment]


def _owner(path: Path) -> tuple[str, str]:
    """The pid and host the lock's holder wrote into it ("" where unknown)."""
    with contextlib.suppress(OSError):
        pid, _, host = path.read_text(errors="replace").strip().partition(" ")
        if pid.isdigit():
            return pid, host
    return "", ""


def _owner_text(path: Path) -> str:
    pid, host = _owner(path)
    return f"pid {pid} on {host or 'this host'}" if pid else "another process"


def _lock_state(run_dir: Path) -> tuple[str | None, bool]:
    """Who holds the run's lock (a probe with a shared lock, released at once), and whether
    a free lock settles it: it was taken on this host, where the kernel drops it when its
    holder dies (on another host a network file system may keep locks local to each)."""
    path = run_dir / LOCK_FILE
    if fcntl is None:
        return None, False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, False  # no lock file: a run of an older loadgen, or none at all
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"its lock ({LOCK_FILE}) is held by {_owner_text(path)}", True
    except OSError:
        return None, False  # locks not supported here: the heartbeats decide
    finally:
        os.close(fd)
    return None, _owner(path)[1] == socket.gethostname()


def heartbeat_age_s(run_dir: Path, now_s: float | None = None) -> float | None:
    """Seconds since the newest heartbeat of the run was touched, or None (no heartbeat)."""
    newest = None
    for path in (run_dir / PARTS_DIR).glob(f"{HEARTBEAT}*"):
        with contextlib.suppress(OSError):
            mtime = path.stat().st_mtime
            newest = mtime if newest is None else max(newest, mtime)
    if newest is None:
        return None
    return max(0.0, (time.time() if now_s is None else now_s) - newest)


def live_writer(run_dir: Path) -> str | None:
    """Why `run_dir` looks written by a live run right now, or None.

    Its lock held: live. Its lock free and taken on this host: not live (a run killed a
    moment ago is recoverable at once). Otherwise (no lock file, another host, no locks on
    this file system) a heartbeat touched within `STALE_S` means live."""
    holder, settled = _lock_state(run_dir)
    if holder is not None:
        return holder
    if settled:
        return None
    age = heartbeat_age_s(run_dir)
    if age is not None and age < STALE_S:
        return (
            f"its heartbeat was touched {age:.1f} s ago (a run on another host, or one "
            f"stopped less than {STALE_S:g} s ago)"
        )
    return None


@contextlib.contextmanager
def run_lock(run_dir: Path, *, doing: str) -> Iterator[None]:
    """Hold the run folder's lock for the block; `RunBusy` if another process holds it.

    `doing` says what the caller wanted to do, for the refusal's message. Released, the
    lock file is removed once the folder has no record parts left (a run that failed keeps
    it: a free lock of this host tells `report --recover` at once that no run holds it).
    """
    if fcntl is None:
        yield
        return
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        why = f"its lock ({LOCK_FILE}) is held by {_owner_text(path)}"
        raise RunBusy(busy_message(run_dir, why, doing)) from None
    except OSError:  # locks not supported on this file system: the heartbeats stand in
        os.close(fd)
        yield
        return
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        yield
    finally:
        if not (run_dir / PARTS_DIR).exists():  # else it stays, and settles that none runs
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)  # releases the lock


def busy_message(run_dir: Path, why: str, doing: str) -> str:
    """The refusal: what is running, and what to do instead."""
    return (
        f"{run_dir} is running: {why}. Cannot {doing} a run that is still writing its "
        "folder; wait for it to end (or add --wait: it waits, then goes on), or stop it first"
    )


def wait_until_idle(
    run_dir: Path, *, poll_s: float = 0.5, on_wait: Callable[[str], None] | None = None
) -> None:
    """Return once no live run writes `run_dir` (`on_wait(why)` is called once, if given)."""
    said = False
    while (why := live_writer(run_dir)) is not None:
        if not said and on_wait is not None:
            on_wait(why)
            said = True
        time.sleep(poll_s)
