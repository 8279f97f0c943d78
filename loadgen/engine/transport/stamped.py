"""The kernel-stamped socket: the transport of a plain-HTTP connection on Linux, whose reads
carry the kernel's receive time (SO_TIMESTAMPNS), not the time the loop got round to them."""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from loadgen.engine.transport.http11 import Connection

SO_TIMESTAMPNS = 35  # Linux: SCM_TIMESTAMPNS ancillary data (struct timespec, CLOCK_REALTIME)
# LOADGEN_KERNEL_STAMPS=0 turns them off (user-space stamps on the uvloop transport: ~4 µs
# less client CPU per chunk, measured, and timestamps late by however busy the client is).
KERNEL_STAMPS_AVAILABLE = sys.platform == "linux" and os.environ.get("LOADGEN_KERNEL_STAMPS") != "0"
READ_SIZE = 256 * 1024


_timestamping_keeper: list[socket.socket] = []  # at most one, open for the process's life


def keep_kernel_timestamping_on() -> None:
    """Hold one socket with SO_TIMESTAMPNS open for the rest of the process.

    Linux stamps received packets only while some socket asks for it, and turns that on
    asynchronously (a deferred work item) when the first one does: segments received just
    after are not stamped and their reads fall back to the time of the read. One socket
    that keeps it on from the pool's creation (a run's t0 is 200 ms later) means every
    request of the run gets kernel stamps, even when its connections come and go.
    """
    if _timestamping_keeper:
        return
    try:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return  # reads are stamped when they are read, as without kernel stamps
    try:
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        keeper.close()
        return
    _timestamping_keeper.append(keeper)
    atexit.register(keeper.close)


class StampedSocket:
    """The transport of a plain-HTTP connection that reads with the kernel's receive time.

    A read stamped in user space is late by however long the process was busy or not
    scheduled when the bytes arrived: on a loaded machine, several ms. With SO_TIMESTAMPNS
    the kernel stamps each segment as it is received, and `recvmsg` hands back the time of
    the last segment it read; a read that finds several chunks queued stamps them all with
    the last one's time (still no later than a user-space stamp). The kernel clock is
    CLOCK_REALTIME; `ReadClock` moves it onto the monotonic clock, never after the read itself.

    Only the four calls `Connection` makes of a transport: write, abort, and the
    `connection_lost` it reports back.
    """

    __slots__ = ("_buffer", "_clock", "_closed", "_conn", "_fd", "_loop", "_pending", "_sock")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: Connection
    ) -> None:
        self._loop = loop
        self._buffer = conn.pool.read_buffer
        self._clock = conn.pool.read_clock
        self._sock = sock
        self._fd = sock.fileno()
        self._conn = conn
        self._pending = b""
        self._closed = False

    @classmethod
    def attach(
        cls, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: Connection
    ) -> StampedSocket:
        """Make `sock` the transport of `conn` and start reading."""
        transport = cls(loop, sock, conn)
        conn.connection_made(cast(asyncio.BaseTransport, transport))
        loop.add_reader(transport._fd, transport._readable)
        return transport

    def _readable(self) -> None:
        try:
            # Into the pool's one buffer: recvmsg(READ_SIZE) would allocate (and, at this
            # size, mmap and unmap) a fresh READ_SIZE bytes object per read.
            size, ancillary, _, _ = self._sock.recvmsg_into(self._buffer, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(exc)
            return
        if not size:
            self._close(None)
            return
        self._conn.received(self._buffer[0][:size].tobytes(), self._clock.stamp(ancillary))

    def write(self, data: bytes) -> None:
        """Send `data`; what the socket does not take now is sent when it is writable."""
        if self._closed:
            return
        if self._pending:
            self._pending += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close(exc)
            return
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(exc)
            return
        self._pending = self._pending[sent:]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        """Close at once; the connection hears of it on the next loop iteration."""
        if not self._closed:
            self._shut()
            self._loop.call_soon(self._conn.connection_lost, None)

    def is_alive(self) -> bool:
        """Open, with nothing to read: a peek that would block (EOF or bytes: not usable)."""
        if self._closed:
            return False
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # b"": the server closed it; bytes: it spoke before being asked

    def _close(self, exc: Exception | None) -> None:
        if not self._closed:
            self._shut()
            self._conn.connection_lost(exc)

    def _shut(self) -> None:
        self._closed = True
        self._loop.remove_reader(self._fd)
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending = b""
        self._sock.close()
