"""Preflight: one small streamed request before the run, to fail fast on a wrong target.

Uses httpx (not the engine's lean client): it is off the hot path, and its errors are
well classified. It checks that the URL answers, that the path exists, and that the answer
is a stream this adapter can decode into generated output. Its request is not a planned
request and is not recorded, but it has the real requests' shape: the same headers (the
user's, the API's, a request id in the run's format, a priority header) and the same body
fields (a short prompt, 4 tokens), so a server that refuses what the run would send refuses
it here, and the message lists what was sent (secrets redacted).

Bounded whatever the server does: one overall deadline (`preflight_deadline`: the
workload's longest first-token deadline, `--preflight-timeout`, never past the watchdog)
covers connecting, the headers and the first generated token, as a cancel scope (httpx's
own read timeout restarts on every byte, so a server dripping one byte a second or
sending heartbeats forever would hold it for ever). The failure says what it was still
waiting for. Memory is bounded as in the engine: headers by httpx (100 KiB), an error
body read to `MAX_ERROR_BODY`, a stream event to `max_event_bytes`. Server text in a
message (an error body, an error event, a bad payload) is quoted through the run's
`Redactor`: redacted first, then cut, then shown printable.

Its header lines are the engine's (`transport.request_headers`), byte for byte: httpx's own
defaults (`Accept-Encoding`, `Connection`) are dropped; its TLS context and proxy are the
run's (`engine.network`), nothing from httpx's own reading of the environment. Wrong turns
are named: a certificate that fails verification (which check, and the fix), a proxy that
refuses the tunnel, a TLS handshake that fails or hangs (a plain-HTTP port behind
`https://`), a proxy's error page, a stream cut after a silence, a redirect (not
followed), a compressed stream the request did not ask for, and an answer h11 cannot parse,
after which a bare request (no header, query or body of the run's) is sent on a new,
verified connection to see its first bytes (an HTTP/2-only server's SETTINGS frame).

Compression as the users' clients meet it: a run that asks for it (`--accept-encoding`)
reads its preflight inflated, to its end, and is told when the route compresses event
streams; a run that asks for none sends one more short request with the OpenAI SDK's
`Accept-Encoding: gzip, deflate`, and when the route compresses it, warns with the first
token such a client got beside the plain one (a proxy that compresses SSE may hold the
stream until its buffer fills: the SDK waits for the whole response).

What a refusal (an HTTP error status) means, and the fix, is `engine.refusals`'s.

`check_connection` is what `run --no-preflight` still does for https: one handshake,
nothing sent, so that a certificate the client does not trust is exit 1, not a run of
`connect_error`s.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from itertools import chain
from time import perf_counter_ns
from typing import Any

import anyio
import httpx
import orjson

from loadgen.adapters.protocol import (
    Adapter,
    BodyOptions,
    MalformedEvent,
    new_decoder,
    request_body,
)
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge
from loadgen.engine.encoding import PREFLIGHT_MESSAGES, PREFLIGHT_TOKENS, Shaped
from loadgen.engine.exchange import MAX_ERROR_BODY, NO_SECRETS, QUOTE_CHARS, QUOTE_EVENT_CHARS
from loadgen.engine.intermediaries import explain
from loadgen.engine.network import httpx_options
from loadgen.engine.proxy import ProxyRefused, refusal_hint
from loadgen.engine.refusals import sent_note, status_message
from loadgen.engine.secrets import Redactor
from loadgen.engine.tls import find_verify_error, handshake_refusal, verify_failure
from loadgen.engine.transport import (
    HTTP2_ANSWER,
    Endpoint,
    Pool,
    accepted_codings,
    compression_note,
    connect_failure,
    http2_frame,
    probe_first_bytes,
    request_headers,
)
from loadgen.errors import TargetError
from loadgen.workload.spec import CLIENT_CODINGS, WorkloadSpec

DEFAULT_DEADLINE_S = 30.0


def preflight_deadline(
    spec: WorkloadSpec, flag_s: float | None, watchdog_s: float
) -> tuple[float, str]:
    """The preflight's deadline in seconds, and where it came from (said on failure).

    The preflight waits for one generated token of an idle server, which is what a class's
    `first_token_s` bounds: it gets the longest of them (a target some class would accept
    is not refused), or `--preflight-timeout`; never more than the watchdog's patience.
    """
    if flag_s is not None:
        deadline_s, why = flag_s, "--preflight-timeout"
    else:
        name, cls = max(spec.classes.items(), key=lambda kv: kv[1].deadlines.first_token_s)
        deadline_s = cls.deadlines.first_token_s
        longest = ", the longest of the classes" if len(spec.classes) > 1 else ""
        why = f"deadlines.first_token_s of class {name}{longest}; --preflight-timeout sets it"
    if watchdog_s < deadline_s:
        deadline_s, why = watchdog_s, "--watchdog, which caps it"
    return deadline_s, why


@dataclass(slots=True)
class _Seen:
    """How a compressed preflight stream arrived: its coding, its first token (ms after the
    request was sent), and its output events and the reads that carried them (read to its
    end: a short stream, under the same deadline)."""

    encoding: str = ""
    first_token_ms: float = 0.0
    events: int = 0
    reads: int = 0


@dataclass(slots=True)
class _Progress:
    """How far the preflight got: what a deadline message says it was waiting for."""

    stage: str = "connect"  # connect → (proxy →) (tls →) headers → token
    last_read_ns: int = 0  # when body bytes last arrived (perf_counter_ns)
    status: int = 0
    content_type: str = ""
    body_bytes: int = 0
    events: int = 0
    heartbeats: int = 0


def preflight(
    endpoint: Endpoint,
    adapter: Adapter,
    options: BodyOptions,
    *,
    timeout_s: float = DEFAULT_DEADLINE_S,
    deadline_why: str = "the default",
    redactor: Redactor = NO_SECRETS,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    extra_headers: Mapping[str, str] | None = None,
    request: Shaped | None = None,
) -> list[str]:
    """Raise `TargetError` saying what is wrong and how to fix it; return, once the target
    streamed a generated token, what the run should warn about (`compression`). Ends
    within `timeout_s` (twice, with the compression probe), whatever the server sends.

    `request` is the preflight's request as the engine shapes the run's
    (`encoding.RequestEncoder.preflight_request`: its target, its id and priority headers,
    its body fields); None: the adapter's plain request to `options.model`.
    `extra_headers` are sent too.
    """
    if request is None:
        target = adapter.target(endpoint.target, options.model)
        body = request_body(adapter, PREFLIGHT_MESSAGES, PREFLIGHT_TOKENS, options)
        request = Shaped(target, {}, body)
    endpoint = replace(endpoint, target=request.target)
    sent = {**request.headers, **(extra_headers or {})}
    check = _checked(endpoint, adapter, options, timeout_s=timeout_s, deadline_why=deadline_why,
                     redactor=redactor, max_event_bytes=max_event_bytes,
                     extra_headers=sent, fields=request.body)  # fmt: skip
    if check.codings:  # asked for: the preflight read what the run will read
        return [compression_warning(check, None)] if check.compressed else []
    probe = _checked(endpoint, adapter, options, timeout_s=timeout_s, deadline_why=deadline_why,
                     redactor=redactor, max_event_bytes=max_event_bytes,
                     extra_headers={**sent, **CLIENT_ACCEPT}, fields=request.body)  # fmt: skip
    return [compression_warning(probe, check)] if probe.compressed else []


# What the users' clients send (the OpenAI SDK, through httpx): what the preflight probes a
# route with when the run itself asks for no compression.
CLIENT_ACCEPT = {"Accept-Encoding": ", ".join(CLIENT_CODINGS)}


def compression_warning(compressed: _Check, plain: _Check | None) -> str:
    """What clients that accept compression see on this route: its coding, when their first
    token came and how the stream arrived; beside the plain stream's first token when the
    run reads streams uncompressed (`plain`), with how to measure what they see."""
    seen = compressed.seen
    asked = compressed.extra_headers.get("Accept-Encoding") or next(
        (v for k, v in compressed.endpoint.headers.items() if k.lower() == "accept-encoding"), ""
    )
    line = (
        f"{compressed.shown} compresses event streams (Content-Encoding: {seen.encoding}) for "
        f"clients that send Accept-Encoding: {asked} (the OpenAI SDK does): the preflight's "
        f"first token reached such a client {seen.first_token_ms:,.0f} ms after it was sent, "
        f"its {seen.events:,} output events in {seen.reads:,} read{'s' * (seen.reads != 1)}"
    )
    if plain is None:
        return line + " (this run reads the streams as they do)"
    return (
        f"{line}; uncompressed, its first token came after {plain.seen.first_token_ms:,.0f} "
        "ms. This run reads streams uncompressed, as those clients do not: add "
        "--accept-encoding to measure what they see (or turn compression off for "
        "text/event-stream on the route)"
    )


def _checked(
    endpoint: Endpoint, adapter: Adapter, options: BodyOptions, *, timeout_s: float,
    deadline_why: str, redactor: Redactor, max_event_bytes: int,
    extra_headers: Mapping[str, str], fields: Mapping[str, object],
) -> _Check:  # fmt: skip
    """One preflight request, checked (TargetError when it is not a stream of this API)."""
    shown = endpoint.origin + endpoint.target.split("?", 1)[0]
    progress = _Progress()
    started_ns = perf_counter_ns()
    check = _Check(endpoint, adapter, options, redactor, max_event_bytes, progress)
    check.extra_headers, check.fields = extra_headers, fields
    try:
        anyio.run(check.run, timeout_s, backend="asyncio")
    except TimeoutError:
        elapsed_s = (perf_counter_ns() - started_ns) / 1e9
        raise TargetError(
            _deadline_message(endpoint, shown, progress, timeout_s, deadline_why, elapsed_s)
        ) from None
    except httpx.ProxyError as exc:  # the proxy refused the CONNECT tunnel
        raise TargetError(_proxy_refusal(endpoint, exc, redactor)) from None
    except httpx.ConnectError as exc:
        raise TargetError(_connect_failure(endpoint, exc, progress.stage, redactor)) from None
    except httpx.TimeoutException:  # httpx's own timeouts are the deadline too: a backstop
        elapsed_s = (perf_counter_ns() - started_ns) / 1e9
        raise TargetError(
            _deadline_message(endpoint, shown, progress, timeout_s, deadline_why, elapsed_s)
        ) from None
    except httpx.InvalidURL as exc:  # url_problem refuses these first: a backstop
        raise TargetError(
            f"{shown}: not a URL that can be connected to: {exc} (check --url)"
        ) from None
    except httpx.HTTPError as exc:
        reason = _reason(exc, redactor)
        if progress.stage == "headers" and "Receive buffer too long" in reason:  # h11's words
            reason = "response headers over the preflight's 100 KiB cap"
        elif (refused := handshake_refusal(reason, endpoint.tls)) is not None:
            reason = refused  # TLS 1.3: the server's refusal comes after the handshake
        elif isinstance(exc, httpx.RemoteProtocolError) and progress.stage == "headers":
            first = probe_first_bytes(endpoint, timeout_s=min(timeout_s, 5))
            if http2_frame(first):
                raise TargetError(f"{shown}: {HTTP2_ANSWER}") from None
            if first:
                said = redactor.quote(first, 60)
                reason += f"; to a bare request (none of the run's headers) it answered {said!r}"
        elif progress.stage == "token":
            elapsed_s = (perf_counter_ns() - started_ns) / 1e9
            reason = _cut_message(progress, elapsed_s, reason)
        raise TargetError(f"{shown}: {reason}") from None
    return check


def check_connection(endpoint: Endpoint, *, timeout_s: float = DEFAULT_DEADLINE_S) -> None:
    """Open one connection to an https endpoint (through its proxy) as the engine opens
    them, send nothing, and close it: TargetError when the certificate fails verification
    or the proxy refuses the tunnel for want of credentials or permission. What `run
    --no-preflight` still checks: a client configuration error is exit 1, not a run of
    `connect_error`s judged as the server's. Other failures are left to the run's records."""
    if endpoint.scheme != "https":
        return

    async def connect() -> None:
        pool = Pool(endpoint, kernel_stamps=False)
        try:
            (await pool.connect()).detach()
        finally:
            pool.close()

    try:
        anyio.run(_within, connect, timeout_s, backend="asyncio")
    except ssl.SSLCertVerificationError as exc:
        raise TargetError(connect_failure(exc, endpoint)) from None
    except ProxyRefused as exc:
        if exc.status in (403, 407):
            raise TargetError(str(exc)) from None
    except (OSError, TimeoutError):
        return  # unreachable, refused, ...: the run's records say so, as without the check


async def _within(call: Callable[[], Awaitable[None]], timeout_s: float) -> None:
    with anyio.fail_after(timeout_s):
        await call()


def _connect_failure(endpoint: Endpoint, exc: httpx.ConnectError, stage: str,
                     redactor: Redactor) -> str:  # fmt: skip
    """Why the connection (TCP, the proxy's tunnel, or TLS) could not be made, and the fix."""
    where = f"{endpoint.host}:{endpoint.port}"
    if (failed := find_verify_error(exc)) is not None:
        return verify_failure(failed, where, endpoint.tls, host=endpoint.host)
    reason = _reason(exc, redactor)
    if stage == "tls" or endpoint.tunnelled:
        if (refused := handshake_refusal(reason, endpoint.tls)) is not None:
            return f"the TLS handshake with {where} failed: {refused}"
        if stage == "tls":
            return f"the TLS handshake with {where} failed ({reason}): {_not_tls_hint(reason)}"
    if endpoint.proxy is not None and stage == "connect":
        return (f"cannot connect to the proxy {endpoint.proxy.shown}: {reason} (is it running "
                "there? check --proxy or the proxy variable, or list the target's host in "
                "NO_PROXY)")  # fmt: skip
    return (f"cannot connect to {endpoint.origin}: {reason} (is the server running and "
            "listening there? check --url)")  # fmt: skip


def _proxy_refusal(endpoint: Endpoint, exc: httpx.ProxyError, redactor: Redactor) -> str:
    """The proxy declined the CONNECT tunnel (httpcore says `407 Proxy Authentication ...`)."""
    proxy = endpoint.proxy
    reason = _reason(exc, redactor)
    status = int(reason[:3]) if reason[:3].isdigit() else 0
    shown = proxy.shown if proxy is not None else "the proxy"
    hint = refusal_hint(status, proxy) if proxy is not None else "see the proxy's log"
    return (f"the proxy {shown} refused the tunnel to {endpoint.host}:{endpoint.port}: "
            f"HTTP {reason} ({hint})")  # fmt: skip


def _cut_message(progress: _Progress, elapsed_s: float, reason: str) -> str:
    """A stream that broke before its first generated token, said as seen (httpx says
    `peer closed connection without sending complete message body`)."""
    silent_s = (perf_counter_ns() - progress.last_read_ns) / 1e9 if progress.last_read_ns else 0
    silence = f", the last {silent_s:.1f} s of them silent," if silent_s >= 1 else ""
    return (
        f"the stream broke before its first generated token: HTTP {progress.status}, "
        f"{progress.body_bytes:,} bytes and {progress.events:,} "
        f"event{'' if progress.events == 1 else 's'} in {elapsed_s:.1f} s"
        f"{silence} then the connection closed ({reason}); a proxy in front closes a stream "
        "that is silent past its read timeout (e.g. nginx's proxy_read_timeout, 60 s by "
        "default): raise it above the server's time to first token"
    )


def _deadline_message(
    endpoint: Endpoint, shown: str, progress: _Progress, deadline_s: float, why: str,
    elapsed_s: float,
) -> str:  # fmt: skip
    """What the preflight waited for when its deadline passed, and the deadline."""
    deadline = f"the preflight's {deadline_s:g} s deadline ({why})"
    if progress.stage == "connect":
        return f"{endpoint.origin} did not accept a connection within {deadline}"
    if progress.stage == "proxy":
        return (
            f"the proxy {endpoint.proxy.shown if endpoint.proxy else ''} accepted the "
            f"connection but did not open the tunnel to {endpoint.host}:{endpoint.port} "
            f"within {deadline}"
        )
    if progress.stage == "tls":
        return (
            f"{endpoint.origin} accepted the connection but the TLS handshake did not "
            f"complete within {deadline}: is it a TLS port? (a plain HTTP server waits "
            "for a request and never answers a handshake)"
        )
    if progress.stage == "headers":
        return (
            f"{shown} accepted the connection but sent no response headers within {deadline} "
            "(is the server overloaded or still loading its model?)"
        )
    seen = (
        f"{progress.body_bytes:,} bytes, {progress.events:,} events, "
        f"{progress.heartbeats:,} heartbeats in {elapsed_s:.1f} s"
    )
    kind = f" ({progress.content_type})" if progress.content_type else ""
    return (
        f"{shown} answered HTTP {progress.status}{kind} but streamed no generated token "
        f"within {deadline}: {seen} (is the server overloaded or still loading its model? "
        "does it stream with stream: true?)"
    )


class _Check:
    """The preflight's request, run under one cancel scope."""

    def __init__(
        self,
        endpoint: Endpoint,
        adapter: Adapter,
        options: BodyOptions,
        redactor: Redactor,
        max_event_bytes: int,
        progress: _Progress,
    ) -> None:
        self.endpoint, self.adapter, self.options = endpoint, adapter, options
        self.redactor, self.max_event_bytes, self.progress = redactor, max_event_bytes, progress
        self.shown = endpoint.origin + endpoint.target.split("?", 1)[0]
        self.extra_headers: Mapping[str, str] = {}
        self.fields: Mapping[str, object] = {}  # the body
        self.sent = ""  # what was sent, for a refusal's message
        self.codings = accepted_codings(endpoint.headers)  # what the run inflates
        self.compressed = False  # the answer came compressed (a coding it asked for)
        self.seen = _Seen()
        self.sent_ns = 0

    async def run(self, timeout_s: float) -> None:
        endpoint, adapter, options = self.endpoint, self.adapter, self.options
        fields = self.fields
        # What a strict server may reject and the user can turn off (not model, messages, ...).
        added = chain.from_iterable(adapter.optional_fields.values())
        optional = [f for f in (*added, *(options.extra_body or {})) if f in fields]
        body = orjson.dumps(fields)
        # The engine's request headers, byte for byte (transport.request_headers): the
        # user's names replace loadgen's, as the engine's `_headers` does.
        user = {k.lower() for k in endpoint.headers}
        extra = {k: v for k, v in self.extra_headers.items() if k.lower() not in user}
        headers = request_headers(endpoint, len(body), extra)
        shown = {k: v for k, v in headers if k not in ("Host", "Content-Length")}
        self.sent = sent_note(shown, fields, self.redactor)
        url = endpoint.origin + endpoint.target
        with anyio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=timeout_s, **_client_options(endpoint)) as client:
                client.headers.clear()  # no Accept-Encoding, Connection: what the engine sends
                request = client.build_request(
                    "POST", url, content=body, headers=headers,
                    extensions={"trace": self._trace},
                )  # fmt: skip
                self.sent_ns = perf_counter_ns()
                response = await client.send(request, stream=True)
                try:
                    await self._answer(response, optional)
                finally:
                    await response.aclose()

    async def _trace(self, name: str, info: object) -> None:
        """httpcore's progress events: once connected (to the proxy and through its tunnel,
        and through TLS, for https), the wait is for the headers."""
        endpoint = self.endpoint
        if name == "connection.connect_tcp.complete":
            https = "tls" if endpoint.scheme == "https" else "headers"
            self.progress.stage = "proxy" if endpoint.tunnelled else https
        elif name == "http_proxy.start_tls.started":
            self.progress.stage = "tls"
        elif name.endswith("start_tls.complete"):
            self.progress.stage = "headers"

    async def _answer(self, response: httpx.Response, optional: Collection[str]) -> None:
        progress = self.progress
        progress.stage, progress.status = "token", response.status_code
        progress.content_type = self.redactor.quote(response.headers.get("content-type", ""), 80)
        if response.status_code >= 400:
            detail = await self._error_body(response)
            headers = response.headers
            page = explain(response.status_code, headers.get("server"), headers.get("via"), detail)
            message = status_message(
                self.shown, response.status_code, detail, self.adapter, optional, page
            )
            if 400 <= response.status_code < 500 and page is None:
                message += f"; {self._id_hint(detail)}{self.sent}"
            raise TargetError(message)
        if 300 <= response.status_code < 400:
            location = self.redactor.quote(response.headers.get("location", ""), QUOTE_CHARS)
            raise TargetError(
                f"{self.shown} answered HTTP {response.status_code}, a redirect to "
                f"{location or '(no Location header)'}: loadgen does not follow redirects (each "
                "request's latency would include the hop); use the final URL in --url"
            )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        asked = accepted_codings({**self.endpoint.headers, **self.extra_headers})
        if encoding in asked:
            self.compressed, self.seen.encoding = True, encoding
        elif encoding not in ("", "identity"):
            raise TargetError(
                f"{self.shown} answered with a compressed stream (Content-Encoding: "
                f"{self.redactor.quote(encoding, 40)}) {compression_note(self.endpoint)}"
            )
        await self._check_stream(response)

    def _id_hint(self, detail: str) -> str:
        """With no reason given, the request-id header is a suspect worth naming."""
        if detail:
            return ""
        ids = [k for k in self.extra_headers if k.lower().endswith("request-id")]
        if not ids:
            return ""
        return (
            f"the server gave no reason: some refuse a {ids[0]} they cannot parse (set "
            "target.request_id: {format: uuid|counter} or off, or send your own with --header); "
        )

    async def _error_body(self, response: httpx.Response) -> str:
        """The error body's first MAX_ERROR_BODY bytes, redacted (the rest is not read)."""
        body = b""
        async for chunk in response.aiter_raw():
            body += chunk[: MAX_ERROR_BODY - len(body)]
            if len(body) >= MAX_ERROR_BODY:
                break
        return self.redactor.quote(body.strip(), MAX_ERROR_BODY).strip()

    async def _check_stream(self, response: httpx.Response) -> None:
        adapter, shown, progress = self.adapter, self.shown, self.progress
        quote = self.redactor.quote
        decoder = new_decoder(adapter, self.max_event_bytes)  # SSE or NDJSON, by the framing
        seen = self.seen
        # A compressed answer is inflated by httpx (gzip, deflate) as it arrives, and read to
        # its end: how its events arrive is what a client that accepts compression sees.
        chunks = response.aiter_bytes() if self.compressed else response.aiter_raw()
        try:
            async for chunk in chunks:
                progress.body_bytes += len(chunk)
                progress.last_read_ns = perf_counter_ns()
                events = decoder.feed(chunk)
                progress.heartbeats = decoder.comments
                carried = False
                for event, data in events:
                    progress.events += 1
                    try:
                        delta = adapter.parse(event, data)
                    except MalformedEvent as exc:
                        raise TargetError(
                            f"{shown} answered, but not with a {adapter.name} stream: {exc}: "
                            f"{quote(exc.data, QUOTE_EVENT_CHARS)} (check target.api in the "
                            "workload)"
                        ) from None
                    if delta.error:
                        shown_error = quote(delta.error, QUOTE_CHARS)
                        raise TargetError(f"{shown} sent an error event: {shown_error}")
                    if delta.has_output:
                        if not seen.events:
                            seen.first_token_ms = (perf_counter_ns() - self.sent_ns) / 1e6
                        seen.events += 1
                        carried = True
                        if not self.compressed:
                            return
                seen.reads += carried
            if seen.events:
                return
        except EventTooLarge as exc:
            raise TargetError(
                f"{shown} sent {exc} after {progress.body_bytes:,} bytes (raise the class's "
                "limits.max_event_bytes if its events really are that long)"
            ) from None
        raise TargetError(
            f"{shown} answered HTTP {response.status_code} but streamed no generated output "
            f"(content-type {progress.content_type or 'none'!r}; does it support "
            "stream: true? check target.api and target.path)"
        )


def _client_options(endpoint: Endpoint) -> dict[str, Any]:
    """httpx's settings: the run's TLS context and proxy (`engine.network`)."""
    return httpx_options(endpoint.scheme, endpoint.tls, endpoint.proxy)


def _not_tls_hint(reason: str) -> str:
    """What a handshake that failed for a reason other than the certificate means. A
    `wrong version number` is the server answering in something other than TLS; the fix
    is never to drop TLS (the credentials would then go in cleartext)."""
    said = reason.lower().replace("_", " ")
    if any(s in said for s in ("wrong version number", "record layer", "packet length too long")):
        return ("the server there did not answer in TLS (plain HTTP on that port?): check "
                "the port in --url")  # fmt: skip
    return "check the port in --url and the server's TLS settings (versions, ciphers)"


def _reason(exc: Exception, redactor: Redactor) -> str:
    """httpx's message without its errno prefix (it may quote what the server sent)."""
    text = str(exc) or type(exc).__name__
    return redactor.quote(text.split("] ", 1)[-1], QUOTE_CHARS)


REACH_TIMEOUT_S = 10.0  # `run --dry-run`'s connection attempt


def check_reachable(endpoint: Endpoint, *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """`run --dry-run`'s look at the target: a TCP connection to its host and port (to the
    forward proxy's, when it is reached through one), closed at once (no request sent, no
    TLS handshake: the run's preflight does those). Raise `TargetError`, in the preflight's
    words, when none opens within `timeout_s`: a dry run must not call an unreachable URL
    valid."""
    proxy = endpoint.proxy
    host, port = (proxy.host, proxy.port) if proxy else (endpoint.host, endpoint.port)
    where = f"the proxy {proxy.shown}" if proxy else endpoint.origin
    fix = "check --proxy or the proxy variable" if proxy else "check --url"
    who = "the proxy" if proxy else "the server"
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.gaierror as exc:
        raise TargetError(
            f"cannot connect to {where}: its host does not resolve ({exc.strerror}) ({fix})"
        ) from None
    except TimeoutError:
        raise TargetError(
            f"cannot connect to {where}: no answer in {timeout_s:g} s (is {who} running and "
            f"reachable from here? {fix} and the firewall)"
        ) from None
    except OSError as exc:
        raise TargetError(
            f"cannot connect to {where}: {exc.strerror or exc} "
            f"(is {who} running and listening there? {fix})"
        ) from None
