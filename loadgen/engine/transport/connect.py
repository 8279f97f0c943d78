"""How a pool's connections are opened: to the endpoint, or to the forward proxy on the way
(`engine.proxy`: a CONNECT tunnel with TLS inside it for https, the proxy's own socket and
absolute-form requests for http); https with the run's one TLS context (`engine.tls`);
plain HTTP on Linux on a socket of our own, read with the kernel's receive time
(`StampedSocket`). Why a connection could not be opened is said here in words
(`connect_failure`): which certificate check failed, what the proxy answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import TYPE_CHECKING, Any

from loadgen.engine.proxy import ProxyRefused, open_tunnel
from loadgen.engine.tls import handshake_refusal, verify_failure
from loadgen.engine.transport.http11 import Connection
from loadgen.engine.transport.stamped import SO_TIMESTAMPNS, StampedSocket

if TYPE_CHECKING:
    from loadgen.engine.transport.endpoint import Endpoint
    from loadgen.engine.transport.pool import Pool


class Dialer:
    """Opens the connections of one pool: where its sockets connect (the endpoint, or its
    proxy), with which TLS context, kernel-stamped or not; the name resolved once."""

    def __init__(
        self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None, *, kernel_stamps: bool
    ) -> None:
        self.endpoint = endpoint
        self.ssl = ssl_context
        self.kernel_stamps = kernel_stamps
        # Where sockets connect: the proxy, when there is one (engine.proxy).
        proxy = endpoint.proxy
        self.host, self.port = (proxy.host, proxy.port) if proxy else (endpoint.host, endpoint.port)
        self._addresses: list[tuple[int, Any]] = []  # (family, sockaddr), once resolved

    async def open(self, pool: Pool) -> Connection:
        """A new connection of `pool` (through the proxy's tunnel for https behind one).
        OSError when it cannot be opened (`proxy.ProxyRefused` when the proxy declines the
        tunnel, `ssl.SSLCertVerificationError` when the certificate fails verification)."""
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        if self.kernel_stamps:
            conn = Connection(pool)
            StampedSocket.attach(loop, await self.socket(loop), conn)
            return conn
        if endpoint.tunnelled:
            assert endpoint.proxy is not None
            sock = await self.socket(loop, stamps=False)
            try:
                await open_tunnel(loop, sock, endpoint.proxy, endpoint.host, endpoint.port)
                _, protocol = await loop.create_connection(
                    lambda: Connection(pool), sock=sock, ssl=self.ssl,
                    server_hostname=endpoint.host,
                )  # fmt: skip
            except BaseException:
                sock.close()
                raise
        else:
            _, protocol = await loop.create_connection(
                lambda: Connection(pool), self.host, self.port, ssl=self.ssl,
                server_hostname=endpoint.host if self.ssl else None,
            )  # fmt: skip
        return protocol

    async def socket(
        self, loop: asyncio.AbstractEventLoop, *, stamps: bool = True
    ) -> socket.socket:
        """A connected non-blocking socket to the endpoint (or its proxy), with kernel
        receive timestamps switched on unless `stamps` is False.

        The name is resolved once per pool (a lookup per connection would cost a thread-pool
        round trip each, at thousands of connections; an IP literal needs none). Addresses
        are tried in order, as `create_connection` does; the one that connects is kept first.
        """
        host, port = self.host, self.port
        if not self._addresses:
            literal = _literal_address(host, port)
            if literal is not None:
                self._addresses = [literal]
            else:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                self._addresses = [(info[0], info[4]) for info in infos]
            if not self._addresses:
                raise OSError(f"cannot resolve {host}")
        error: OSError | None = None
        for index, (family, address) in enumerate(self._addresses):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if stamps:
                    with contextlib.suppress(OSError):  # refused: reads stamped in user space
                        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if index:
                self._addresses.insert(0, self._addresses.pop(index))
            return sock
        assert error is not None
        raise error


def connect_failure(exc: OSError, endpoint: Endpoint) -> str:
    """Why a connection to `endpoint` could not be opened, in words: a certificate that
    failed verification (which one, and the fix), a proxy's refusal, a refused client
    certificate, or the system's error text. No secret is in any of them."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        where = f"{endpoint.host}:{endpoint.port}"
        return verify_failure(exc, where, endpoint.tls, host=endpoint.host)
    text = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, ssl.SSLError):
        return handshake_refusal(text, endpoint.tls) or text
    if endpoint.proxy is not None and not isinstance(exc, ProxyRefused):
        return f"{text} (through the proxy {endpoint.proxy.shown})"
    return text


def _literal_address(host: str, port: int) -> tuple[int, Any] | None:
    """(family, sockaddr) of an IP-literal host, without a lookup (None for a name)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, ((host, port) if family == socket.AF_INET else (host, port, 0, 0))
    return None
