"""Secret redaction: every known secret, its base64 forms and any 8 characters of them are
hidden, before any cut; ordinary text is not. URLs are shown redacted (`redact_url`), and
Markdown cells show server text literally (`md_cell`)."""

from __future__ import annotations

import base64

import pytest

from loadgen.engine.secrets import REDACTED, Redactor, run_secrets
from loadgen.render.compare_view import md_cell
from loadgen.workload.spec import redact_url


def test_secrets_and_their_base64_forms_are_redacted() -> None:
    """A bearer key, the key alone and its base64 form all become <redacted>."""
    redactor = Redactor(["Bearer sk-live-123456"])
    encoded = base64.b64encode(b"sk-live-123456").decode()
    text = f"echo: Bearer sk-live-123456; key sk-live-123456; b64 {encoded}"
    assert (
        redactor.redact(text) == f"echo: {REDACTED}; key {REDACTED}; b64 {REDACTED}="
    )  # padding kept


def test_run_secrets_are_every_header_value_but_a_harmless_ones_env_values_and_urls() -> None:
    """Every header value but a harmless header's (`X-Team: serving` and
    `Ocp-Apim-Subscription-Key` are secrets, their names say nothing; `Content-Type`,
    `User-Agent`, `anthropic-version` are not), env-expanded values, URL user-info, and the
    query values of the URL and of the request path but `api-version`'s are secret."""
    found = run_secrets(
        {"Authorization": "Bearer k1-secret", "X-Team": "serving", "X-Api-Key": "k2-secret",
         "Ocp-Apim-Subscription-Key": "k6-apim", "Content-Type": "application/json",
         "user-agent": "curl/8.5", "anthropic-version": "2023-06-01"},
        ["k3-from-env"],
        "http://ops:p4-secret@host:8000/v1?key=q5-secret&api-version=2024-02-01",
        "/v1/chat?code=q7-path",
    )  # fmt: skip
    assert set(found) == {
        "Bearer k1-secret", "serving", "k2-secret", "k6-apim", "k3-from-env", "p4-secret",
        "ops", "q5-secret", "ops:p4-secret", "q7-path",
    }  # fmt: skip


def test_short_values_are_not_treated_as_secrets() -> None:
    """Values under four characters would redact ordinary words; they are left alone."""
    assert Redactor(["ab"]).redact("a lab about abs") == "a lab about abs"


KEY = "sk-SuperSecret-7f3a9b2c1"


@pytest.mark.parametrize("offset", range(len(KEY) + 1))
def test_quote_redacts_before_it_cuts_so_no_piece_of_the_key_survives(offset: int) -> None:
    """A key placed so the cut falls `offset` characters into it leaves none of it: the
    shown text is the padding and <redacted> (what of it fits), then what followed."""
    shown = Redactor([f"Bearer {KEY}"]).quote("e" * (50 - offset) + KEY + " tail", 50)
    assert shown == ("e" * (50 - offset) + REDACTED + " tail")[:50]


def test_runs_of_eight_or_more_characters_of_a_secret_are_redacted_anywhere() -> None:
    """What a server's own cut left (a prefix, a suffix, a middle) is redacted from 8
    characters on; 7 are not (they would match ordinary text)."""
    redactor = Redactor([KEY])
    assert redactor.redact(f"got {KEY[:8]}!") == f"got {REDACTED}!"
    assert redactor.redact(f"got {KEY[-9:]} and {KEY[5:15]}") == f"got {REDACTED} and {REDACTED}"
    assert redactor.redact(f"got {KEY[:7]}") == f"got {KEY[:7]}"


def test_the_scheme_of_a_bearer_value_is_not_a_secret() -> None:
    """`Bearer x`: x and its pieces are redacted, the word Bearer in other text is not."""
    redactor = Redactor([f"Bearer {KEY}"])
    assert redactor.redact("Bearer token required") == "Bearer token required"
    assert redactor.redact(f"Bearer {KEY[:12]}") == f"Bearer {REDACTED}"


@pytest.mark.parametrize("prefix", [b"", b"u", b"us", b"usr:"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_the_key_inside_longer_base64_is_redacted_at_any_alignment(prefix: bytes, encode) -> None:
    """Basic auth (`user:key`) or any base64 text holding the key: whatever bytes come
    before it, no 8 characters fixed by the key's bytes survive."""
    redactor = Redactor([KEY])
    encoded = encode(prefix + KEY.encode() + b";tail").decode()
    shown = redactor.redact(encoded)
    assert REDACTED in shown
    core = encode(b"\0" * (len(prefix) % 3) + KEY.encode()).decode()[4:-4]
    assert not any(core[i : i + 8] in shown for i in range(len(core) - 7))


def test_quote_reads_bytes_as_utf8_and_shows_bad_bytes() -> None:
    """Bytes are decoded for the message; invalid UTF-8 shows as \\xNN escapes."""
    assert Redactor([KEY]).quote(b"bad \xff " + KEY.encode(), 100) == f"bad \\xff {REDACTED}"


def test_quote_of_a_huge_text_looks_only_at_what_it_can_show() -> None:
    """A 10 MB text is quoted from its first `limit` + (longest secret) characters: a key
    just past the cut is still redacted, the rest is never decoded."""
    huge = b"e" * 290 + KEY.encode() + b"\xff" * 10_000_000
    assert Redactor([KEY]).quote(huge, 300) == "e" * 290 + REDACTED


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("https://user:pw@gw.example:443/v1?api-key=k1&x=2", "https://<redacted>@gw.example:443/v1?api-key=<redacted>&x=<redacted>"),
        ("https://gw.example/openai/x?api-version=2024-02-01&code=k2",
         "https://gw.example/openai/x?api-version=2024-02-01&code=<redacted>"),
        ("http://k3@[::1]:8000/", "http://<redacted>@[::1]:8000/"),
        ("http://h:99999/?sk-bare-key", "http://h:99999/?<redacted>"),
        ("/v1/chat/completions?code=k4#frag", "/v1/chat/completions?code=<redacted>"),
        ("user:k5@host:8000", "<redacted>@host:8000"),
        ("http://[::1/?key=k6", "http://<redacted>"),
    ],
)  # fmt: skip
def test_a_url_is_shown_without_user_info_or_query_values(url: str, shown: str) -> None:
    """`redact_url`, the one way a URL is shown: user-info as `<redacted>@`, every query
    value but `api-version`'s hidden (names kept), no fragment; a path's query alike; a URL
    no parser reads shows nothing past its scheme."""
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("![x](http://evil.example/p.png)", "!\\[x\\](http://evil.example/p.png)"),
        ("[click](javascript:alert(1))", "\\[click\\](javascript:alert(1))"),
        ("<img src=x> & <b>", "&lt;img src=x> &amp; &lt;b>"),
        ("`code` *em* _em_ ~~s~~ a|b \\", "\\`code\\` \\*em\\* \\_em\\_ \\~\\~s\\~\\~ a\\|b \\\\"),
        ("ttft_ms p99 ≥ 2.5 ms\nnext", "ttft_ms p99 ≥ 2.5 ms next"),
    ],
)  # fmt: skip
def test_markdown_cells_show_server_text_literally(text: str, shown: str) -> None:
    """`md_cell`: a server's image, link, HTML, code, emphasis, strikethrough, pipe and
    backslash are escaped (Markdown shows them as written), `snake_case` is left as it is,
    and a line break is a space."""
    assert md_cell(text) == shown
