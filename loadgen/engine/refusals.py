"""What a server's refusal of the preflight's request means, and the fix: a hint for each
HTTP status (the API key, the path, the model, a refused field), the options that add the
fields a strict server refuses (the adapter's `optional_fields`), and what the refused
request carried (secrets hidden). Server text reaches these already quoted through the run's
`Redactor`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from loadgen.adapters.protocol import Adapter
from loadgen.engine.exchange import QUOTE_CHARS
from loadgen.engine.secrets import Redactor
from loadgen.workload.spec import is_secret_header

# What to change when a server refuses the body fields one of loadgen's options adds (the
# adapter's `optional_fields`), by option.
OPTION_HINTS = {
    "force_output_tokens": "run with --no-force-output-tokens or set "
    "target.force_output_tokens: false (output lengths then follow the model's own stops; "
    "target.extra_body can carry the server's own way to force them)",
    "include_usage": "set target.include_usage: false",
}


def status_message(
    shown: str, status: int, detail: str, adapter: Adapter, optional: Collection[str],
    page: str | None = None,
) -> str:  # fmt: skip
    """`shown answered HTTP status: detail (hint)`; `page` is what an intermediary's error
    page means (`intermediaries.explain`), which replaces the server's hints."""
    hints = {
        401: "check the API key: set the variable named in target.api_key_env",
        403: "the key is not allowed to use this model or endpoint",
        404: f"no {adapter.name} endpoint there: check --url, target.path and target.api",
        422: f"the server rejected a request field: {optional_hint(adapter)}",
        400: "the server rejected the request: check target.model (--model) and target.extra_body",
    }
    hint = page
    if status == 400 and hint is None:
        hint = pinned_model_hint(detail)
    if status == 404 and is_about_the_model(detail):  # the path is right: the model is not
        hint = "the server does not serve this model: check target.model (--model)"
    if status in (400, 422) and hint is None:
        hint = rejected_fields_hint(detail, optional, adapter.optional_fields)
    hint = hint or hints.get(status, "see the server's message")
    return f"{shown} answered HTTP {status}: {detail[:QUOTE_CHARS] or '(no body)'} ({hint})"


def optional_hint(adapter: Adapter) -> str:
    """What a 422 suggests: turning off the options that add fields to this API's body."""
    options = " or ".join(f"target.{option}: false" for option in adapter.optional_fields)
    return f"try {options}" if options else "check target.extra_body"


def is_about_the_model(detail: str) -> bool:
    """A 404 that says the model is missing, not the path: vLLM's and SGLang's `The model
    `x` does not exist.` (with `"param": "model"`), Ollama's `model "x" not found`,
    llama.cpp's and TGI's `model not found`."""
    return bool(
        re.search(r'"param"\s*:\s*"model"', detail)
        or re.search(r"\bmodel\b.{0,200}?\b(does not exist|not found|not exist|unknown|"
                     r"no such|not available|not loaded)", detail, re.IGNORECASE | re.DOTALL)
    )  # fmt: skip


def sent_note(headers: Mapping[str, str], fields: Mapping[str, object], redactor: Redactor) -> str:
    """`sent headers A: v, B: (secret); body fields x, y`: what a refused request carried."""
    shown = ", ".join(
        f"{k}: {'(secret)' if is_secret_header(k) else redactor.quote(v, 80)}"
        for k, v in headers.items()
    )
    return f"sent headers {shown}; body fields {', '.join(fields)}"


def rejected_fields_hint(
    detail: str, optional: Collection[str], by_option: Mapping[str, tuple[str, ...]]
) -> str | None:
    """What to change when the server names request fields it does not accept: the option
    that adds them (`by_option`, the adapter's `optional_fields`), else `extra_body`.

    Strict servers (Hugging Face `transformers serve`, pydantic `extra="forbid"` APIs)
    answer 422 naming them: `Unexpected fields in the request: {'ignore_eos'}` or a
    validation list with `"loc": ["body", "ignore_eos"]`. Only the optional fields loadgen
    sent count (a name is matched only when quoted, as both forms quote it).
    """
    named = [f for f in optional if re.search(rf"""['"`]{re.escape(f)}['"`]""", detail)]
    for option, added in by_option.items():
        if any(f in named for f in added):
            fix = OPTION_HINTS.get(option, f"set target.{option}: false")
            return f"the server rejects {'/'.join(added)}: {fix}"
    if named:
        return (
            f"the server rejects {', '.join(named)}: remove them from target.extra_body "
            "(or from what target.api sends)"
        )
    return None


def pinned_model_hint(detail: str) -> str | None:
    """Servers that serve one model and refuse any other name (transformers serve:
    `Server is pinned to <model>`): name the model to pass."""
    match = re.search(r"pinned to (?:the model )?['\"`]?([^'\"`\s,;()]+)", detail)
    if match is None:
        return None
    model = match.group(1).rstrip(".")
    return f"the server serves only {model!r}: pass --model {model} or set target.model: {model}"
