"""The transport's seams: what an exchange hears from its connection (`ExchangeSink`), a
connection as the engine holds it (`Link`) and what the engine sends through (`Connector`:
the real `Pool`, or a scripted one in virtual time)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from loadgen.engine.clock import Clock
    from loadgen.engine.transport.endpoint import Endpoint


class ExchangeSink(Protocol):
    """What the connection reports to the request using it. `t_ns` is on the pool's clock."""

    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None: ...
    def on_body(self, data: bytes, t_ns: int) -> None: ...
    def on_end(self, t_ns: int) -> None: ...
    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None: ...


class Link(Protocol):
    """One connection as the engine sees it: it carries one exchange at a time."""

    reused: bool  # it came from the idle list (kept alive, or warmed before t0)
    warm: bool  # opened before t0 by `Connector.warm`, outside every latency
    exchanges: int  # exchanges written on it so far (the current one included)

    def send(self, sink: ExchangeSink, request: bytes) -> None: ...
    def detach(self) -> None: ...


class Connector(Protocol):
    """What the engine sends through: connections to one endpoint, stamped on one clock.

    `Pool` is the real one; tests pass one that plays scripted responses in virtual time
    (`loadgen.testing.virtual`).
    """

    endpoint: Endpoint
    clock: Clock  # every stamp a connection reports is on this clock
    last_read_ns: int  # when bytes last arrived on any connection (the watchdog reads it)

    def take_idle(self) -> Link | None: ...
    async def connect(self) -> Link: ...
    async def warm(self, count: int) -> WarmReport: ...
    def after_reads(self, callback: Callable[[], None]) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmReport:
    """What `warm` did before t0: connections asked for, opened and verified, failed."""

    requested: int
    opened: int  # connected and still open after the grace: idle, ready for the first sends
    failed: int  # the connect failed, or the server closed it straight away
    error: str | None = None  # the first failure, for the message
    seconds: float = 0.0  # how long warming took (before t0: in no latency)
