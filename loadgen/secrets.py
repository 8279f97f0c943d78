"""Secrets: the values that must never reach an output, and one function that hides them.

Collected once per run from what carries credentials: the API key (`target.api_key_env`),
header values read from the environment (`${VAR}`) or named like credentials, URL
user-info and query values. `Redactor.redact` replaces each of them, and its base64 form,
in any text loadgen writes: error messages echoed from the server, preflight errors.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

REDACTED = "<redacted>"
CREDENTIAL_HEADERS = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.IGNORECASE)
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words


class Redactor:
    """Replaces known secret values (and their base64 forms) with `<redacted>`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            for part in _parts(secret):
                if len(part) >= MIN_SECRET_CHARS:
                    forms.add(part)
                    forms.add(base64.b64encode(part.encode()).decode().rstrip("="))
        ordered = sorted(forms, key=len, reverse=True)  # longest first: no partial leftovers
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def redact(self, text: str) -> str:
        """`text` with every known secret replaced."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)


def _parts(secret: str) -> list[str]:
    """The secret, and for `Bearer x` / `Basic x` headers the credential alone."""
    parts = [secret]
    scheme, _, credential = secret.partition(" ")
    if credential and scheme.lower() in ("bearer", "basic", "token"):
        parts.append(credential)
    return parts


def run_secrets(
    headers: Mapping[str, str], env_values: Iterable[str], url: str | None
) -> list[str]:
    """Everything secret in a run's headers, environment-expanded values and URL."""
    found = [value for name, value in headers.items() if CREDENTIAL_HEADERS.search(name)]
    found.extend(env_values)
    if url:
        parts = urlsplit(url)
        found.extend(p for p in (parts.username, parts.password) if p)
        if parts.username:
            found.append(f"{parts.username}:{parts.password or ''}")
        found.extend(value for _, value in parse_qsl(parts.query))
    return found
