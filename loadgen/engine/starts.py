"""Tasks started a slice per loop iteration, so that no burst of starts stops the reads.

Starting a task is cheap; its first step is not: a request's follow-up arms its deadlines
and waits, a closed loop's worker makes its next request (~40 µs each). The loop runs
every step that is ready before it polls the sockets again, so 512 tasks started at once
(a closed loop's first wave, a burst of singles) held it ~20 ms without a read: chunks that
arrived meanwhile were read together, and a read carries the kernel stamp of its last
segment, so their stamps were late by up to a decode step. `Starts` hands the task group
`START_SLICE` starts per iteration; the sockets are read between slices. Sends are not
delayed by it: the requests are written before their tasks start.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

START_SLICE = 32

Start = tuple[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...]]  # a task and its args


class Starts:
    """Tasks to start in `tg`, `START_SLICE` per loop iteration, in order."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._queue: deque[Start] = deque()
        self._idle = anyio.Event()
        self._idle.set()

    def start(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start `func(*args)` in the task group, this iteration or a later one."""
        self._queue.append((func, args))
        if self._idle.is_set():
            self._idle = anyio.Event()
            asyncio.get_running_loop().call_soon(self._slice)

    def _slice(self) -> None:
        queue, start_soon = self._queue, self._tg.start_soon
        for _ in range(min(START_SLICE, len(queue))):
            func, args = queue.popleft()
            start_soon(func, *args)
        if queue:
            asyncio.get_running_loop().call_soon(self._slice)
        else:
            self._idle.set()

    async def wait(self) -> None:
        """Until every start asked for has been handed to the task group; shielded, so a
        host that is cancelled (a run told to stop sending) still starts every task it
        asked for: each follows a request already written, whose record it makes."""
        with anyio.CancelScope(shield=True):
            await self._idle.wait()
