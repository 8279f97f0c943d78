"""Secret redaction: every known secret and its base64 form are hidden, ordinary text is not."""

from __future__ import annotations

import base64

from loadgen.secrets import REDACTED, Redactor, run_secrets


def test_secrets_and_their_base64_forms_are_redacted() -> None:
    """A bearer key, the key alone and its base64 form all become <redacted>."""
    redactor = Redactor(["Bearer sk-live-123456"])
    encoded = base64.b64encode(b"sk-live-123456").decode()
    text = f"echo: Bearer sk-live-123456; key sk-live-123456; b64 {encoded}"
    assert (
        redactor.redact(text) == f"echo: {REDACTED}; key {REDACTED}; b64 {REDACTED}="
    )  # padding kept


def test_run_secrets_come_from_credential_headers_env_values_and_the_url() -> None:
    """Credential-named headers, env-expanded values, URL user-info and query values are secret."""
    found = run_secrets(
        {"Authorization": "Bearer k1-secret", "X-Team": "serving", "X-Api-Key": "k2-secret"},
        ["k3-from-env"],
        "http://ops:p4-secret@host:8000/v1?key=q5-secret",
    )
    assert {
        "Bearer k1-secret",
        "k2-secret",
        "k3-from-env",
        "p4-secret",
        "q5-secret",
        "ops:p4-secret",
    } <= set(found)
    assert "serving" not in found


def test_short_values_are_not_treated_as_secrets() -> None:
    """Values under four characters would redact ordinary words; they are left alone."""
    assert Redactor(["ab"]).redact("a lab about abs") == "a lab about abs"
