"""Content codings: which ones a request's Accept-Encoding asks loadgen to inflate as they
arrive (gzip and deflate), the zlib window bits of each, and what to say of any other."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.engine.transport.endpoint import Endpoint

# The content codings loadgen inflates as they arrive, each with its zlib window bits (a
# `deflate` body is zlib-wrapped, as RFC 9110 says, or raw, as some servers send it: told
# apart by its first two bytes).
INFLATED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
INFLATE_SLICE = 256 * 1024  # inflated bytes handed on at a time (a small body may inflate to GBs)


def accepted_codings(headers: Mapping[str, str]) -> frozenset[str]:
    """The codings of INFLATED an Accept-Encoding header among `headers` asks for (`q=0`
    refuses one)."""
    value = next((v for k, v in headers.items() if k.lower() == "accept-encoding"), "")
    asked = set()
    for item in value.lower().split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        weights = [p.partition("=")[2].strip() for p in params if p.startswith("q")]
        if coding and not (weights and _is_zero(weights[0])):
            asked.add(coding)
    if "gzip" in asked:
        asked.add("x-gzip")
    return frozenset(asked & INFLATED.keys())


def _is_zero(weight: str) -> bool:
    """A `q` weight of 0 (`0`, `0.0`, `0.000`): the coding is refused."""
    try:
        return float(weight) == 0.0
    except ValueError:
        return False


def compression_note(endpoint: Endpoint) -> str:
    """Why a compressed stream is refused, and what to change: loadgen inflates gzip and
    deflate when asked for them (`--accept-encoding`), and reads every other stream as sent."""
    asked = any(k.lower() == "accept-encoding" for k in endpoint.headers)
    if asked:
        return ("that loadgen cannot read as it arrives (it inflates gzip and deflate): ask "
                "for those only (--accept-encoding gzip,deflate), or remove the Accept-Encoding "
                "header")  # fmt: skip
    return ("although the request asked for none (no Accept-Encoding): turn compression off "
            "for this route (e.g. a proxy's gzip for text/event-stream), or read it as clients "
            "that accept gzip do: --accept-encoding")  # fmt: skip


def window_bits(encoding: str, first: bytes) -> int:
    """zlib's window bits for a body of `encoding` that starts with `first`: a deflate
    body without the zlib header (CMF/FLG: method 8, a multiple of 31) is raw deflate."""
    if encoding != "deflate":
        return INFLATED[encoding]
    zlib_header = (first[0] & 0x0F) == 8 and (first[0] << 8 | first[1]) % 31 == 0
    return INFLATED[encoding] if zlib_header else -zlib.MAX_WBITS
