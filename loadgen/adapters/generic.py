"""A generic streaming API, described in the workload file (`target.generic`).

For servers no built-in adapter speaks: the framing (`sse` or `ndjson`), a body template
and dotted JSON paths (`choices[0].delta.content`) for the visible text delta, an
optional reasoning delta, the end of the stream, usage and errors. `generic_spec` checks
the section once, at load (a bad one is a `ConfigError`); parsing then only walks paths.

Body placeholders, as a whole string value (typed) or inside a string (as text):
`$model`, `$max_tokens` (an int), `$prompt` (the conversation as text; without system
messages when `$system` is used too), `$system` (system messages as text) and `$messages`
(a list of `{role, content}`, whole value only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadgen.adapters.protocol import (
    NO_FIELDS,
    BodyOptions,
    Delta,
    IdField,
    MalformedEvent,
    Message,
    bearer_headers,
    flatten,
    usage_count,
)
from loadgen.errors import ConfigError

Path = tuple[str | int, ...]
PLACEHOLDERS = ("$messages", "$prompt", "$system", "$model", "$max_tokens")
PLACEHOLDER = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*")
SEGMENT = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")
FRAMINGS = ("sse", "ndjson")
KEYS = ("framing", "body", "content", "reasoning", "done", "output_tokens", "prompt_tokens",
        "error", "finish_reason")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class GenericSpec:
    """The checked `target.generic` section (see the module docstring and docs/apis.md)."""

    framing: str = "sse"
    body: Mapping[str, Any] = field(default_factory=dict)
    content: Path = ()
    reasoning: Path | None = None
    done_data: str | None = None  # the stream ends at an event whose data is exactly this
    done_event: str | None = None  # ... at an SSE event of this name
    done_path: Path | None = None  # ... at an event where this path ...
    done_equals: Any = True  # ... has this value
    output_tokens: Path | None = None
    prompt_tokens: Path | None = None
    error: Path | None = None  # a non-empty value here fails the stream
    finish_reason: Path | None = None  # the stop reason; set: a stream without one is cut


class GenericAdapter:
    """The `generic` adapter, configured by a `GenericSpec`."""

    name = "generic"
    default_path = ""  # `target.path` is required (checked at load)
    forces_length = False  # the body template is the user's: loadgen adds no force fields
    # Its events are the user's: no framing is assumed, each token needs a byte of its event.
    smallest_output_event = b"x"
    event_framing = 0
    request_id_field: IdField | None = None  # the body is the user's template
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = NO_FIELDS  # the template is all

    def __init__(self, spec: GenericSpec) -> None:
        self.spec = spec
        self.framing = spec.framing
        self._done_data = spec.done_data.encode() if spec.done_data is not None else None
        self._done_event = spec.done_event.encode() if spec.done_event is not None else None
        self._uses_system = "$system" in orjson.dumps(spec.body).decode()
        # Only a configured finish path says how this API ends a complete stream.
        self.finish_signal = spec.finish_reason is not None

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer`."""
        return bearer_headers(api_key)

    def target(self, path: str, model: str) -> str:
        """`target.path` as given."""
        return path

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The template with its placeholders filled (and the workload's extra fields)."""
        system = [m for m in messages if m[0] == "system"]
        values: dict[str, Any] = {
            "$messages": [{"role": r, "content": t} for r, t in messages],
            "$prompt": flatten([m for m in messages if m[0] != "system"])
            if self._uses_system
            else flatten(messages),
            "$system": flatten(system),
            "$model": options.model,
            "$max_tokens": max_tokens,
        }
        body: dict[str, Any] = fill(self.spec.body, values)
        if options.extra_body:
            body.update(options.extra_body)
        return body

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One event: the configured paths, read where they exist."""
        spec, delta = self.spec, Delta()
        if (self._done_data is not None and data == self._done_data) or (
            self._done_event is not None and event == self._done_event
        ):
            delta.done = True
            return delta
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise MalformedEvent("not JSON", data) from None
        if spec.error is not None:
            error = walk(obj, spec.error)
            if error:
                message = error.get("message") if isinstance(error, dict) else None
                delta.error = str(message or error)
                return delta
        text = walk(obj, spec.content)
        if isinstance(text, str) and text:
            delta.content_chars = len(text)
            delta.text = text
        if spec.reasoning is not None:
            thinking = walk(obj, spec.reasoning)
            if isinstance(thinking, str) and thinking:
                delta.reasoning_chars = len(thinking)
        if spec.output_tokens is not None:
            delta.completion_tokens = usage_count(
                walk(obj, spec.output_tokens), "output_tokens", delta
            )
        if spec.prompt_tokens is not None:
            delta.prompt_tokens = usage_count(walk(obj, spec.prompt_tokens), "prompt_tokens", delta)
        if spec.finish_reason is not None:
            finish = walk(obj, spec.finish_reason)
            if finish:
                delta.finish_reason = str(finish)
        if spec.done_path is not None:
            value = walk(obj, spec.done_path, missing=_MISSING)
            delta.done = value is not _MISSING and value == spec.done_equals
        return delta


_MISSING = object()


def walk(obj: Any, path: Path, missing: Any = None) -> Any:
    """The value at `path` in decoded JSON, or `missing` where the path does not exist."""
    for step in path:
        if isinstance(step, int):
            if not isinstance(obj, list) or step >= len(obj):
                return missing
        elif not isinstance(obj, dict) or step not in obj:
            return missing
        obj = obj[step]
    return obj


def fill(template: Any, values: Mapping[str, Any]) -> Any:
    """`template` with every placeholder replaced (whole values typed, inside strings as text)."""
    if isinstance(template, str):
        if template in values:
            return values[template]
        return PLACEHOLDER.sub(lambda m: str(values.get(m.group(0), m.group(0))), template)
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


def parse_path(text: object, source: str, key: str) -> Path:
    """`choices[0].delta.content` as ("choices", 0, "delta", "content")."""
    fix = "a dotted path with [index] for lists, e.g. choices[0].delta.content"
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(source, key, f"must be a JSON path (got {text!r})", fix)
    path: list[str | int] = []
    for part in text.strip().split("."):
        match = SEGMENT.fullmatch(part)
        if match is None:
            raise ConfigError(source, key, f"{text!r} is not a valid path ({part!r})", fix)
        path.append(match.group(1))
        path.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return tuple(path)


def generic_spec(raw: object, source: str, prefix: str = "target.generic") -> GenericSpec:
    """Check a `target.generic` section; raise ConfigError naming the key and the fix."""
    if not isinstance(raw, Mapping):
        raise ConfigError(source, prefix, "the generic API needs this section (a mapping)",
                          "see docs/apis.md, Generic streaming APIs, for an example")  # fmt: skip
    for key in raw:
        if key not in KEYS:
            raise ConfigError(source, f"{prefix}.{key}", "unknown key", f"known: {', '.join(KEYS)}")
    framing = raw.get("framing", "sse")
    if framing not in FRAMINGS:
        raise ConfigError(source, f"{prefix}.framing", f"must be sse or ndjson (got {framing!r})")
    if "content" not in raw:
        raise ConfigError(source, f"{prefix}.content", "is required: the path of the text delta",
                          "e.g. content: choices[0].delta.content")  # fmt: skip

    def optional(key: str) -> Path | None:
        return parse_path(raw[key], source, f"{prefix}.{key}") if key in raw else None

    done_data, done_event, done_path, done_equals = _done(raw.get("done"), source, prefix)
    return GenericSpec(
        framing=str(framing),
        body=_body(raw.get("body"), source, f"{prefix}.body"),
        content=parse_path(raw["content"], source, f"{prefix}.content"),
        reasoning=optional("reasoning"),
        done_data=done_data,
        done_event=done_event,
        done_path=done_path,
        done_equals=done_equals,
        output_tokens=optional("output_tokens"),
        prompt_tokens=optional("prompt_tokens"),
        error=optional("error"),
        finish_reason=optional("finish_reason"),
    )


def _body(body: object, source: str, key: str) -> dict[str, Any]:
    example = "e.g. body: {model: $model, prompt: $prompt, max_tokens: $max_tokens, stream: true}"
    if not isinstance(body, Mapping) or not body:
        raise ConfigError(source, key, "must be a mapping: the JSON body template", example)
    try:
        text = orjson.dumps(body).decode()
    except TypeError as exc:
        raise ConfigError(source, key, f"must be plain JSON values ({exc})", example) from None
    for name in set(PLACEHOLDER.findall(text)) - set(PLACEHOLDERS):
        raise ConfigError(source, key, f"unknown placeholder {name}",
                          f"known: {', '.join(PLACEHOLDERS)}")  # fmt: skip
    if "$prompt" not in text and "$messages" not in text:
        raise ConfigError(source, key, "carries no prompt: use $prompt or $messages", example)
    if "$max_tokens" not in text:
        raise ConfigError(source, key, "does not carry the planned output length", example)
    if re.search(r'"[^"]+\$messages|\$messages[^"]+"', text):
        raise ConfigError(source, key, "$messages must be a whole value (a list), not in text",
                          "write e.g. messages: $messages")  # fmt: skip
    return dict(body)


def _done(
    done: object, source: str, prefix: str
) -> tuple[str | None, str | None, Path | None, Any]:
    """`done: "[DONE]"`, `{data: ...}`, `{event: name}` or `{path: p, equals: v}`."""
    key = f"{prefix}.done"
    fix = 'e.g. done: "[DONE]", done: {event: message_stop} or done: {path: done, equals: true}'
    if done is None:
        return None, None, None, True  # the end of the stream ends it
    if isinstance(done, str):
        return done, None, None, True
    if not isinstance(done, Mapping):
        raise ConfigError(source, key, f"must be a string or a mapping (got {done!r})", fix)
    kinds = [k for k in ("data", "event", "path") if k in done]
    unknown = set(done) - {"data", "event", "path", "equals"}
    if len(kinds) != 1 or unknown or ("equals" in done and kinds != ["path"]):
        raise ConfigError(source, key, "needs exactly one of data, event or path (+ equals)", fix)
    if kinds == ["path"]:
        return None, None, parse_path(done["path"], source, f"{key}.path"), done.get("equals", True)
    value = done[kinds[0]]
    if not isinstance(value, str) or not value:
        raise ConfigError(
            source, f"{key}.{kinds[0]}", f"must be a non-empty string (got {value!r})"
        )
    return (value, None, None, True) if kinds == ["data"] else (None, value, None, True)
