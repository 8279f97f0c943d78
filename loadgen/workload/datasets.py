"""Prompt datasets from local files: conversations read, counted, filtered and sampled.

Part of the plans stage (spec → plans): a class with `dataset:` takes its prompts from a
file instead of generated words. Nothing is downloaded; the formats are the ones peers read:

* `sharegpt`: a JSON list of `{"conversations": [{"from": "human"|"gpt"|"system",
  "value": text}, ...]}`, as vLLM's `bench serve --dataset-name sharegpt` and SGLang's
  `bench_serving --dataset-name sharegpt` read it (vLLM: the first human turn is the prompt
  and the first answer sets the output length).
* `jsonl` / `json` / `csv` / `parquet`: one row per request with a `prompt` text column
  (vLLM's custom JSONL dataset; AIPerf's `text_input` and `text` are found too) or an
  OpenAI `messages` column, an optional recorded answer (`completion`, `response`,
  `output`) and an optional output length (`output_tokens`, AIPerf's `output_length`).
  Column names are configurable.
* `openai-batch`: the OpenAI Batch API's request lines (`{"custom_id", "method", "url",
  "body": {"messages" | "prompt", "max_tokens" | "max_completion_tokens"}}`); the body's
  output cap is the recorded output length.

A malformed row is a `ConfigError` naming the file, the row and the field; a row that is
well formed but unusable (no human turn, outside the length filters, no recorded answer
for `output_tokens: from_dataset`) is dropped and counted by reason, which `loadgen check`
prints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from loadgen.errors import ConfigError
from loadgen.workload.inputs import TRACE_MAX_BYTES, json_problem, read_text
from loadgen.workload.model import DatasetSpec
from loadgen.workload.prompts import load_tokenizer

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing", "model"})
SYSTEM_ROLES = frozenset({"system"})
PROMPT_FIELDS = ("prompt", "text_input", "text")
ANSWER_FIELDS = ("completion", "response", "output")
OUTPUT_FIELDS = ("output_tokens", "output_length")


@dataclass(frozen=True, slots=True)
class Conversation:
    """One row: an optional system prompt and its human turns, each with its recorded
    answer (None when the file has none). Token counts are of the first request."""

    row: int  # 1-based: the JSON list index + 1, the line, the CSV data row
    system: str | None
    turns: tuple[tuple[str, str | None], ...]
    prompt_tokens: int  # system + first human turn
    output_tokens: int | None  # the recorded output length (field, or counted answer)


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset as read: rows read, the conversations kept, and why the rest were dropped."""

    source: str
    rows: int
    kept: tuple[Conversation, ...]
    dropped: Mapping[str, int] = field(default_factory=dict)


Counter = Callable[[str], int]


WORD_BLOCK = 1 << 20  # characters split at once: a 50 MB prompt's word list was ~600 MB


def word_count(text: str) -> int:
    """Tokens as words (`len(text.split())`): what loadgen counts without a tokenizer,
    block by block so that a huge prompt never becomes one list of its words."""
    if len(text) <= WORD_BLOCK:
        return len(text.split())
    count, after_space = 0, True
    for start in range(0, len(text), WORD_BLOCK):
        block = text[start : start + WORD_BLOCK]
        count += len(block.split())
        if not after_space and not block[0].isspace():
            count -= 1  # one word cut in two by the block boundary
        after_space = block[-1].isspace()
    return count


def counter_for(tokenizer_path: str | None) -> Counter:
    """Token counts from a local tokenizer.json, else words."""
    if tokenizer_path is None:
        return word_count
    tokenizer = load_tokenizer(tokenizer_path)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


@functools.lru_cache(maxsize=16)
def load_dataset(spec: DatasetSpec, tokenizer_path: str | None, need_output: bool) -> Dataset:
    """Read, count and filter the dataset (cached: check and run plan it more than once).

    `need_output`: the class takes output lengths from the dataset, so a row without a
    recorded length or answer is dropped.
    """
    count = counter_for(tokenizer_path)
    rows, kept, dropped = 0, [], dict[str, int]()
    for conversation in _conversations(spec):
        rows += 1
        if spec.limit is not None and rows > spec.limit:
            rows -= 1
            break
        reason = _drop_reason(spec, conversation, need_output)
        if reason is None and conversation is not None:
            measured = _measured(conversation, count)
            reason = _length_reason(spec, measured, need_output)
            if reason is None:
                kept.append(measured)
                continue
        dropped[reason or ""] = dropped.get(reason or "", 0) + 1
    if not kept:
        why = ", ".join(f"{n} {r}" for r, n in dropped.items()) or "the file has no rows"
        raise ConfigError(spec.path, "", f"no usable row in the dataset ({rows} read: {why})",
                          "check the format, the field names and the length filters")  # fmt: skip
    return Dataset(source=spec.path, rows=rows, kept=tuple(kept), dropped=dropped)


def _drop_reason(
    spec: DatasetSpec, conversation: Conversation | None, need_output: bool
) -> str | None:
    if conversation is None or not conversation.turns:
        return "without a human turn"
    if need_output and conversation.output_tokens is None and conversation.turns[0][1] is None:
        return "without a recorded answer"
    recorded = spec.history == "recorded" and spec.turns == "all"
    if recorded and any(answer is None for _, answer in conversation.turns[:-1]):
        return "without recorded answers between turns"
    return None


def _measured(conversation: Conversation, count: Counter) -> Conversation:
    system, (first, answer) = conversation.system, conversation.turns[0]
    prompt = count(first) + (count(system) if system else 0)
    output = conversation.output_tokens
    if output is None and answer is not None:
        output = max(1, count(answer))
    return Conversation(conversation.row, system, conversation.turns, prompt, output)


def _length_reason(spec: DatasetSpec, row: Conversation, need_output: bool) -> str | None:
    if not spec.min_prompt_tokens <= row.prompt_tokens <= spec.max_prompt_tokens:
        return "outside dataset.prompt_tokens"
    if (
        need_output
        and row.output_tokens is not None
        and not (spec.min_output_tokens <= row.output_tokens <= spec.max_output_tokens)
    ):
        return "outside dataset.output_tokens"
    return None


# ---------------------------------------------------------------- reading the formats


def _conversations(spec: DatasetSpec) -> Iterator[Conversation | None]:
    """Every row of the file as a conversation (None: a row with nothing to send)."""
    if spec.format == "sharegpt":
        yield from _sharegpt(spec)
    elif spec.format in ("jsonl", "openai-batch"):
        for row, obj in _json_lines(spec.path):
            yield (
                _batch_row(spec, row, obj)
                if spec.format == "openai-batch"
                else _row(spec, row, obj)
            )
    else:
        for row, obj in _table(spec):
            yield _row(spec, row, obj)


def _text(path: str) -> str:
    return read_text(Path(path), cap_bytes=TRACE_MAX_BYTES, what="dataset",
                     fix="cut the rows you replay into a smaller file")  # fmt: skip


def _load_json(path: str, text: str, where: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(path, where, json_problem(exc)) from None


def _sharegpt(spec: DatasetSpec) -> Iterator[Conversation | None]:
    data = _load_json(spec.path, _text(spec.path), "")
    fix = 'a ShareGPT file is [{"conversations": [{"from": "human", "value": "..."}, ...]}]'
    if not isinstance(data, list):
        raise ConfigError(spec.path, "", f"must be a JSON list, got {type(data).__name__}", fix)
    key = spec.messages_field or "conversations"
    for index, entry in enumerate(data):
        row = index + 1
        if not isinstance(entry, dict) or not isinstance(entry.get(key), list):
            raise ConfigError(spec.path, f"row {row}", f"needs a '{key}' list", fix)
        turns = []
        for position, turn in enumerate(entry[key]):
            where = f"row {row}, {key}[{position}]"
            if not isinstance(turn, dict):
                raise ConfigError(spec.path, where, "must be {from, value}", fix)
            turns.append((_role(spec.path, where, turn.get("from")),
                          _string(spec.path, f"{where}.value", turn.get("value"))))  # fmt: skip
        yield _from_messages(row, turns)


def _role(path: str, where: str, role: object) -> str:
    if role in USER_ROLES:
        return "user"
    if role in ASSISTANT_ROLES:
        return "assistant"
    if role in SYSTEM_ROLES:
        return "system"
    known = ", ".join(sorted(USER_ROLES | ASSISTANT_ROLES | SYSTEM_ROLES))
    raise ConfigError(path, where, f"unknown role {role!r:.40}", f"one of {known}")


def _string(path: str, where: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, where, f"must be a string, got {type(value).__name__}")
    return value


def _from_messages(row: int, messages: list[tuple[str, str]]) -> Conversation | None:
    """System messages (joined), then human turns each with the answer that follows it.

    Assistant messages before the first human turn are dropped (some ShareGPT rows open
    with the model); consecutive human messages are one turn.
    """
    system = "\n\n".join(text for role, text in messages if role == "system") or None
    turns: list[list[str | None]] = []
    for role, text in messages:
        if role == "user":
            if turns and turns[-1][1] is None:
                turns[-1][0] = f"{turns[-1][0]}\n\n{text}"
            else:
                turns.append([text, None])
        elif role == "assistant" and turns and turns[-1][1] is None:
            turns[-1][1] = text
    kept = tuple((str(user), answer) for user, answer in turns if str(user).strip())
    return Conversation(row, system, kept, 0, None) if kept else None


def _json_lines(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        obj = _load_json(path, line, f"line {number}")
        if not isinstance(obj, dict):
            raise ConfigError(path, f"line {number}", "must be a JSON object")
        yield number, obj


def _table(spec: DatasetSpec) -> Iterator[tuple[int, dict[str, Any]]]:
    path = spec.path
    if spec.format == "json":
        data = _load_json(path, _text(path), "")
        if not isinstance(data, list):
            raise ConfigError(path, "", "must be a JSON list of objects")
        for index, obj in enumerate(data):
            if not isinstance(obj, dict):
                raise ConfigError(path, f"row {index + 1}", "must be a JSON object")
            yield index + 1, obj
        return
    try:
        # glob=False: a file name with [ ] * ? is that one file, not a pattern
        frame = (pl.read_csv(path, infer_schema=False, glob=False) if spec.format == "csv"
                 else pl.read_parquet(path, glob=False))  # fmt: skip
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ConfigError(path, "", f"cannot read it as {spec.format}: {exc}") from None
    yield from enumerate(frame.iter_rows(named=True), start=1)


def _pick(
    path: str, where: str, obj: Mapping[str, Any], given: str | None, candidates: tuple[str, ...]
) -> tuple[str | None, Any]:
    """The field `given` (required when named), else the first candidate present."""
    if given is not None:
        if given not in obj:
            raise ConfigError(path, where, f"has no field '{given}'",
                              f"its fields: {', '.join(map(str, obj))[:200]}")  # fmt: skip
        return given, obj[given]
    for name in candidates:
        if obj.get(name) is not None:
            return name, obj[name]
    return None, None


def _row(spec: DatasetSpec, row: int, obj: Mapping[str, Any]) -> Conversation | None:
    path, where = spec.path, f"row {row}"
    messages_name, messages = _pick(path, where, obj, spec.messages_field, ("messages",))
    output = _output_tokens(spec, where, obj)
    if messages is not None and spec.prompt_field is None:
        conversation = _from_messages(row, _openai_messages(path, f"{where}, {messages_name}",
                                                            messages))  # fmt: skip
    else:
        prompt_name, prompt = _pick(path, where, obj, spec.prompt_field, PROMPT_FIELDS)
        if prompt_name is None:
            fields = ", ".join(map(str, obj))[:200]
            raise ConfigError(path, where, "has no prompt ('prompt', 'text_input', 'text' or "
                              "'messages')", f"name it with dataset.prompt_field (fields: "
                              f"{fields})")  # fmt: skip
        prompt = _string(path, f"{where}, {prompt_name}", prompt)
        _, answer = _pick(path, where, obj, spec.answer_field, ANSWER_FIELDS)
        if answer is not None:
            answer = _string(path, f"{where}, answer", answer)
        conversation = _from_messages(row, [("user", prompt)] + (
            [("assistant", answer)] if answer is not None else []))  # fmt: skip
    if conversation is None or output is None:
        return conversation
    return Conversation(row, conversation.system, conversation.turns, 0, output)


def _output_tokens(spec: DatasetSpec, where: str, obj: Mapping[str, Any]) -> int | None:
    name, value = _pick(spec.path, where, obj, spec.output_tokens_field, OUTPUT_FIELDS)
    if name is None or value is None:
        return None
    return _positive_int(spec.path, f"{where}, {name}", value)


def _positive_int(path: str, where: str, value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(path, where, f"must be a whole number >= 1, got {value!r:.40}")
    return value


def _openai_messages(path: str, where: str, messages: object) -> list[tuple[str, str]]:
    if not isinstance(messages, list):
        raise ConfigError(path, where, "must be a list of {role, content}")
    result = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if not isinstance(message, dict):
            raise ConfigError(path, at, "must be {role, content}")
        role = message.get("role")
        if role == "tool":
            continue  # a tool result has no turn of its own here: the row is its text turns
        result.append(
            (
                _role(path, f"{at}.role", role),
                _content(path, f"{at}.content", message.get("content")),
            )
        )
    return result


def _content(path: str, where: str, content: object) -> str:
    """A message content: a string, or a list of parts whose `text` parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise ConfigError(path, where, f"must be text or a list of parts, got {type(content).__name__}")


def _batch_row(spec: DatasetSpec, row: int, obj: Mapping[str, Any]) -> Conversation | None:
    path, where = spec.path, f"line {row}"
    body = obj.get("body")
    if not isinstance(body, dict):
        raise ConfigError(path, f"{where}, body", "must be the request body object",
                          "an OpenAI Batch line is {custom_id, method, url, body}")  # fmt: skip
    if "messages" in body:
        messages = _openai_messages(path, f"{where}, body.messages", body["messages"])
    elif "prompt" in body:
        messages = [("user", _string(path, f"{where}, body.prompt", body["prompt"]))]
    else:
        raise ConfigError(path, f"{where}, body", "has neither 'messages' nor 'prompt'")
    conversation = _from_messages(row, messages)
    cap_name = next((k for k in ("max_completion_tokens", "max_tokens") if k in body), None)
    if conversation is None or cap_name is None:
        return conversation
    output = _positive_int(path, f"{where}, body.{cap_name}", body[cap_name])
    return Conversation(row, conversation.system, conversation.turns, 0, output)


# ---------------------------------------------------------------- sampling


def sample_rows(dataset: Dataset, spec: DatasetSpec, count: int, rng: np.random.Generator
                ) -> list[Conversation]:  # fmt: skip
    """`count` conversations: in file order (`sequential`, cycling), or seeded at random,
    without replacement (a fresh permutation each pass through the file) or with it."""
    rows, n = dataset.kept, len(dataset.kept)
    if spec.sample == "sequential":
        return [rows[i % n] for i in range(count)]
    if spec.replacement:
        return [rows[int(i)] for i in rng.integers(0, n, count)]
    order: list[int] = []
    while len(order) < count:
        order.extend(int(i) for i in rng.permutation(n))
    return [rows[i] for i in order[:count]]
