"""Secrets: the values that must never reach an output, and one function that hides them.

Collected once per run from what carries credentials: the API key (`target.api_key_env`),
every header value read from the environment (`${VAR}`) or given literally under any name
but a harmless one (`workload.checks.is_secret_header`: `Ocp-Apim-Subscription-Key: <key>`
is a secret although nothing in its name says so), URL user-info and query values (of
`--url` and of `target.path`). `Redactor.quote` is the one way server-supplied text (error
bodies, error events, malformed payloads, status lines, headers echoed back) enters a
message: it replaces every secret in the whole text first, cuts only the redacted text,
and then replaces any run of 8 or more characters of a secret that is still there (left
by a cut the server or a read cap made before loadgen saw the text). `Redactor.redact`
does the same without the cut, for text loadgen writes (log lines, errors).

The forms of a secret: the value, the credential of a `Bearer x` / `Basic x` value, and
the base64 of each (standard and URL-safe alphabets, at each of the three byte
alignments a secret can have inside a longer encoded text, e.g. `user:key` in Basic auth).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

from loadgen.printable import printable
from loadgen.workload.checks import HARMLESS_QUERY, REDACTED, is_secret_header

MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words
RUN_CHARS = 8  # a run this long of a secret's characters is redacted wherever it appears


class Redactor:
    """Replaces known secret values (and their base64 forms) with `<redacted>`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        schemed: set[str] = set()  # `Bearer x` values: their runs are those of x alone
        for secret in secrets:
            parts = _parts(secret)
            if len(parts) > 1:
                schemed.add(secret)
            for part in parts:
                if len(part) >= MIN_SECRET_CHARS:
                    forms.add(part)
                    forms.update(f for f in _base64_forms(part) if len(f) >= MIN_SECRET_CHARS)
        ordered = sorted(forms, key=len, reverse=True)  # longest first: no partial leftovers
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._longest = len(ordered[0]) if ordered else 0
        # Every RUN_CHARS-long window of every form: a text run made only of such windows
        # is a piece of a secret (or of several), however it was cut.
        self._windows = frozenset(
            form[i : i + RUN_CHARS]
            for form in forms - schemed
            for i in range(len(form) - RUN_CHARS + 1)
        )

    def redact(self, text: str) -> str:
        """`text` with every known secret, and every run of 8+ characters of one, replaced."""
        if self._pattern is None or not text:
            return text
        return self._runs(self._pattern.sub(REDACTED, text))

    def quote(self, text: str | bytes, limit: int) -> str:
        """Server-supplied `text` as a message may show it: at most `limit` characters,
        redacted before it is cut (bytes are decoded as UTF-8, bad bytes as `\\xNN`), and
        then every control character shown escaped (`loadgen.printable`: CR/LF, ESC and
        the like can start no line and draw nothing).

        Only the first `limit` + (longest secret) characters can hold a secret that
        reaches the shown part, so the rest is never decoded or scanned: the cost does not
        grow with the text (a 1 MiB malformed event costs what a short one does).
        """
        window = limit + self._longest
        if isinstance(text, bytes):
            text = text[: 4 * window].decode("utf-8", "backslashreplace")
        text = text[:window]
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return printable(self._runs(text[:limit]))

    def _runs(self, text: str) -> str:
        """Replace every run of RUN_CHARS+ characters whose every window is a secret's."""
        windows = self._windows
        if not windows or len(text) < RUN_CHARS:
            return text
        pieces: list[str] = []
        start = i = 0
        last = len(text) - RUN_CHARS
        while i <= last:
            if text[i : i + RUN_CHARS] not in windows:
                i += 1
                continue
            end = i + RUN_CHARS
            while end < len(text) and text[end - RUN_CHARS + 1 : end + 1] in windows:
                end += 1
            pieces += (text[start:i], REDACTED)
            start = i = end
        pieces.append(text[start:])
        return "".join(pieces)


def _parts(secret: str) -> list[str]:
    """The secret, and for `Bearer x` / `Basic x` headers the credential alone."""
    parts = [secret]
    scheme, _, credential = secret.partition(" ")
    if credential and scheme.lower() in ("bearer", "basic", "token"):
        parts.append(credential)
    return parts


def _base64_forms(secret: str) -> set[str]:
    """What `secret` looks like inside base64 text: whole, and at byte offsets 1 and 2 of
    an encoded stream (only the characters that depend on the secret's bytes alone)."""
    raw = secret.encode()
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms.add(encode(raw).decode().rstrip("="))  # the secret alone, encoded
        for shift in (0, 1, 2):
            # After `shift` bytes of something else, the first 4 characters mix those in;
            # past the last whole group of 3 bytes, what follows the secret does.
            whole = (len(raw) + shift) // 3 * 4
            encoded = encode(b"\0" * shift + raw).decode()[4 if shift else 0 : whole]
            if encoded:
                forms.add(encoded)
    return forms


def run_secrets(
    headers: Mapping[str, str], env_values: Iterable[str], url: str | None, path: str | None = None
) -> list[str]:
    """Everything secret in a run's headers (every value but a harmless header's),
    environment-expanded values, URL (user-info, query values) and request path (its query
    values)."""
    found = [value for name, value in headers.items() if is_secret_header(name)]
    found.extend(env_values)
    if url:
        parts = urlsplit(url)
        found.extend(p for p in (parts.username, parts.password) if p)
        if parts.username:
            found.append(f"{parts.username}:{parts.password or ''}")
        found.extend(_query_values(parts.query))
    if path:
        found.extend(_query_values(urlsplit(path).query))
    return found


def _query_values(query: str) -> list[str]:
    """A query's values, but those a URL shows (`HARMLESS_QUERY`: `api-version`)."""
    return [value for name, value in parse_qsl(query) if name.lower() not in HARMLESS_QUERY]
