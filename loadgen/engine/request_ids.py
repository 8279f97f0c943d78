"""Request ids: the header every request carries, so one request can be found in server logs.

UUID-shaped by default, because servers validate the header: llama-cpp-python's server
(starlette-context's `RequestIdPlugin`) answers HTTP 400 with an empty body to any
`X-Request-Id` that is not a UUID (abetlen/llama-cpp-python#1337), and vLLM, SGLang and
most proxies pass a UUID through unchanged. The id is a version-4 UUID whose first 74
random bits are one per run and whose last 12 hex digits are the request's id in the plan
(`…-00000000002a` is request 42), so ids never repeat across runs and still say which
planned request they were. `counter` gives the older `loadgen-<n>`; `off` sends none.

A header the user set (`--header`, `target.headers`) under the same name, in any case,
replaces loadgen's: the request carries exactly one, the user's, and the record keeps it.

Gateways do not all forward the header (LiteLLM's proxy drops it), so the id can also go in
a body field the API defines for the caller's own identifiers (each adapter's
`request_id_field`, placed by `adapters.protocol.request_body` as `target.request_id.body`
says): Responses `metadata.request_id` and Anthropic `metadata.user_id` by default (`auto`);
OpenAI chat and completions only have `user`, which `transformers serve` refuses with 422
and LiteLLM books as an end user, so it goes there only with `body: on`. A field the
workload's `extra_body` already sets is left alone.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

DEFAULT_HEADER = "X-Request-Id"
PREFLIGHT_ID = 2**48 - 1  # the preflight's request: `…-ffffffffffff`


def new_nonce() -> int:
    """The run's random UUID prefix (74 bits)."""
    return secrets.randbits(74)


def uuid_for(nonce: int, request_id: int) -> str:
    """A version-4, RFC 4122 variant UUID: the nonce's 74 bits, then `request_id` (48 bits).

    Layout (hex digits): 8-4-4-4-12; version `4` leads the third group and the variant
    (`8`-`b`) the fourth, and the last group is `request_id` mod 2**48.
    """
    a = (nonce >> 42) & 0xFFFFFFFF  # 32 bits
    b = (nonce >> 26) & 0xFFFF  # 16
    c = 0x4000 | ((nonce >> 14) & 0x0FFF)  # version 4, 12 bits
    d = 0x8000 | (nonce & 0x3FFF)  # variant 10, 14 bits
    return f"{a:08x}-{b:04x}-{c:04x}-{d:04x}-{request_id & 0xFFFFFFFFFFFF:012x}"


class RequestIds:
    """Each request's id header: (headers to add, the id the request carries).

    `given` are the headers the user set for every request: when one of them has `header`'s
    name (case-insensitive), it is the id (the same for every request), and nothing is added.
    """

    def __init__(self, header: str | None, fmt: str, nonce: int, given: Mapping[str, str]) -> None:
        self.header = header
        self.fmt = fmt
        self.nonce = nonce
        wanted = header.lower() if header else None
        self.user_value = next((v for k, v in given.items() if k.lower() == wanted), None)

    def id_of(self, request_id: int) -> str | None:
        """The id request `request_id` carries (None when ids are off)."""
        if self.header is None:
            return None
        if self.user_value is not None:
            return self.user_value
        if self.fmt == "counter":
            return f"loadgen-{request_id}"
        return uuid_for(self.nonce, request_id)

    def headers(self, request_id: int) -> tuple[dict[str, str], str | None]:
        """Headers to add to request `request_id`'s, and its id."""
        value = self.id_of(request_id)
        if value is None or self.user_value is not None or self.header is None:
            return {}, value
        return {self.header: value}, value


def merged(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """`base` with `extra` laid over it, names compared without case (one header per name)."""
    out = dict(base)
    lower = {k.lower(): k for k in out}
    for name, value in extra.items():
        old = lower.get(name.lower())
        if old is not None and old != name:
            del out[old]
        out[name] = value
        lower[name.lower()] = name
    return out


def plan_number(value: str | None) -> int | None:
    """The planned request an id names (`…-00000000002a` → 42, `loadgen-42` → 42); None for
    the preflight's id (`…-ffffffffffff`), any other value, or none."""
    if not value:
        return None
    head, sep, tail = value.rpartition("-")
    if not sep:
        return None
    if head == "loadgen" and tail.isdigit():
        return int(tail)
    if len(value) == 36 and len(tail) == 12:
        try:
            number = int(tail, 16)
        except ValueError:
            return None
        return None if number == PREFLIGHT_ID else number
    return None
