"""Prompts of a target token count, made locally (nothing is downloaded).

Part of building request plans. The text is drawn from common short English words, each of
which is a single token with its leading space in the common BPE tokenizers (GPT-2/4,
Llama, Mistral, Qwen), so a prompt of N words is close to N tokens. Every request gets its
own words (seeded by run seed and request id): a repeated prompt would hit the server's
prefix cache and make TTFT unrealistically small.

Across runs the same file and seed give the same words, so a second run would find the
first one's prompts in the server's cache. A `cold` run (the default, docs/cache-warmth.md)
therefore starts the first message of every request with its run nonce: four
words drawn from `WORDS` by a hash of the nonce. Only the first message gets it, once per
request, so whatever a run shares within itself (a class's system prompt, a shared-prefix
group, a session's history, a trajectory's context, a dataset row) still starts with the
same bytes within the run, and with other bytes in the next run. A generated prompt's
nonce takes the place of its first words (its token count is unchanged); a dataset's
text, which cannot be cut, gets it in front (4 more tokens, counted in the plan's target).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen.errors import ConfigError

# Common words that are one token each (with a leading space) in the usual tokenizers.
WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [
            "the",
            "of",
            "and",
            "to",
            "in",
            "is",
            "that",
            "for",
            "it",
            "as",
            "was",
            "with",
            "be",
            "by",
            "on",
            "not",
            "he",
            "this",
            "are",
            "or",
            "his",
            "from",
            "at",
            "which",
            "but",
            "have",
            "an",
            "they",
            "you",
            "were",
            "her",
            "she",
            "there",
            "been",
            "one",
            "all",
            "we",
            "their",
            "has",
            "would",
            "when",
            "if",
            "so",
            "no",
            "will",
            "more",
            "out",
            "up",
            "into",
            "do",
            "any",
            "your",
            "what",
            "some",
            "can",
            "other",
            "than",
            "then",
            "them",
            "these",
            "its",
            "may",
            "only",
            "two",
            "time",
            "new",
            "also",
            "after",
            "first",
            "way",
            "well",
            "year",
            "many",
            "most",
            "over",
            "such",
            "even",
            "back",
            "where",
            "just",
            "because",
            "good",
            "each",
            "those",
            "people",
            "make",
            "work",
            "day",
            "part",
            "being",
            "long",
            "little",
            "very",
            "great",
            "know",
            "place",
            "world",
            "still",
            "down",
            "should",
            "own",
            "life",
            "same",
            "take",
            "while",
            "last",
            "might",
            "us",
            "old",
            "three",
            "end",
            "right",
            "high",
            "every",
            "small",
            "home",
            "under",
            "state",
            "found",
            "never",
            "house",
            "think",
            "again",
            "let",
            "thing",
            "show",
            "water",
            "number",
            "side",
            "much",
            "hand",
            "next",
            "school",
            "name",
            "less",
            "made",
            "point",
            "light",
            "city",
            "book",
            "line",
            "word",
            "night",
            "under",
            "open",
            "head",
            "today",
            "play",
            "power",
            "money",
            "story",
            "order",
            "group",
            "sea",
            "road",
            "tree",
            "plan",
            "table",
            "paper",
            "music",
            "river",
            "field",
            "green",
            "black",
            "white",
            "game",
            "land",
        ]
    )
)


def prompt_text(seed: int, request_id: int, tokens: int) -> str:
    """`tokens` words, the same for the same seed and request id, different across requests."""
    rng = random.Random(seed * 1_000_003 + request_id)
    return " ".join(rng.choices(WORDS, k=max(1, tokens)))


SHARED_PREFIX_KEY = -2_000_000_000  # seeds the `prompt:` sets' prefixes apart from requests
PREFIX_BLOCK_TOKENS = 512  # a trace's shared prefix block: Mooncake's, one hash id per 512 tokens


def prompt_with_prefix(seed: int, request_id: int, tokens: int, groups: tuple[int, ...]) -> str:
    """`tokens` words whose first 512·len(groups) are shared with every request that has the
    same leading prefix groups (trace replay), and the rest this request's own."""
    if not groups:
        return prompt_text(seed, request_id, tokens)
    shared = [prompt_text(seed, -1_000_000 - group, PREFIX_BLOCK_TOKENS) for group in groups]
    text = " ".join(shared).split(" ")[:tokens]
    rest = tokens - len(text)
    if rest > 0:
        text.append(prompt_text(seed, request_id, rest))
    return " ".join(text)


NONCE_WORDS = 4  # words (one token each in the usual tokenizers) a run nonce puts in front


def nonce_words(nonce: str) -> tuple[str, ...]:
    """The run nonce as `NONCE_WORDS` words of `WORDS`: a function of the nonce alone
    (170⁴ ≈ 8·10⁸ choices: two runs share their first words by chance about once in 10⁸)."""
    number = int.from_bytes(hashlib.sha256(nonce.encode()).digest()[:8], "big")
    words = []
    for _ in range(NONCE_WORDS):
        number, index = divmod(number, len(WORDS))
        words.append(WORDS[index])
    return tuple(words)


class PromptMaker:
    """Prompt text for a request: words (≈ one token each), or exact with a tokenizer file.

    `nonce` (a `cold` run's): every text asked for with `first=True` (the first message of
    a request) starts with its words; None sends the same bytes every run (`warm`, `reset`).
    """

    def __init__(
        self, seed: int, tokenizer_path: str | None = None, nonce: str | None = None
    ) -> None:
        self.seed = seed
        self.tokenizer: Any = load_tokenizer(tokenizer_path) if tokenizer_path else None
        self.nonce = nonce
        self.lead: tuple[str, ...] = nonce_words(nonce) if nonce else ()

    def text(
        self, request_id: int, tokens: int, groups: tuple[int, ...] = (), *, first: bool = False
    ) -> str:
        """`tokens` tokens of text for this request (shared prefix blocks first, if any);
        `first`: the request's first message, which starts with the run nonce."""
        lead = self._lead(tokens) if first else ()
        text = prompt_with_prefix(self.seed, request_id, tokens - len(lead), groups)
        if lead:
            text = f"{' '.join(lead)} {text}"
        return text if self.tokenizer is None else self._fit(text, tokens, request_id)

    def shared(self, request_id: int, group: int, prefix_tokens: int, tokens: int) -> str:
        """`tokens` tokens: group `group`'s shared prefix of `prefix_tokens` (the run nonce
        first), the same for every request of the group, then this request's own suffix
        (`prompt:` sets)."""
        lead = self._lead(prefix_tokens)
        prefix = prompt_text(self.seed, SHARED_PREFIX_KEY - group, prefix_tokens - len(lead))
        if lead:
            prefix = f"{' '.join(lead)} {prefix}"
        suffix = prompt_text(self.seed, request_id, max(1, tokens - prefix_tokens))
        if self.tokenizer is not None:
            prefix = self._fit(prefix, prefix_tokens, SHARED_PREFIX_KEY - group)
            suffix = self._fit(suffix, max(1, tokens - prefix_tokens), request_id)
        return f"{prefix} {suffix}"

    def lead_messages(self, messages: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        """A dataset's messages with the run nonce in front of the first one's text (which
        cannot be cut: the request grows by `lead_tokens`)."""
        if not self.lead or not messages:
            return tuple(messages)
        (role, text), *rest = messages
        return ((role, f"{' '.join(self.lead)} {text}"), *rest)

    @property
    def lead_tokens(self) -> int:
        """Tokens the nonce adds in front of a dataset's text (0 without a nonce)."""
        return self.count(" ".join(self.lead)) if self.lead else 0

    def _lead(self, tokens: int) -> tuple[str, ...]:
        """The nonce words a generated text of `tokens` starts with: at most `tokens` − 1,
        so it keeps a word of its own (a 1-token prompt caches nothing: its one token is
        always computed)."""
        return self.lead[: max(0, tokens - 1)]

    def count(self, text: str) -> int:
        """Tokens in `text`: by the tokenizer when there is one, else words."""
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _fit(self, text: str, tokens: int, request_id: int) -> str:
        """The longest run of whole words within `tokens`, then one-token fillers to the count.

        Cutting the token ids and decoding is not enough: the decoded text can re-merge
        into fewer tokens. Counting whole prefixes of words (a binary search) and topping up
        with words that add exactly one token each is exact for any tokenizer that has them.
        """
        words = text.split(" ")
        extra = 1
        while self.count(" ".join(words)) < tokens:  # too short: more words
            words += prompt_text(self.seed, request_id + 7_919 * extra, tokens).split(" ")
            extra += 1
        lo, hi = 0, len(words)  # the longest word prefix whose count is <= tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(" ".join(words[:mid])) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        fitted = " ".join(words[:lo])
        count = self.count(fitted)
        while count < tokens:
            for filler in FILLERS:
                candidate = f"{fitted} {filler}" if fitted else filler
                if self.count(candidate) == count + 1:
                    fitted, count = candidate, count + 1
                    break
            else:
                break  # no one-token filler fits here: as close as this tokenizer allows
        return fitted


FILLERS = ("the", "a", "of", "and", "to", "in", ".", ",", "x")


def load_tokenizer(path: str) -> Any:
    """A `tokenizers.Tokenizer` from a local tokenizer.json; ConfigError when it cannot be."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            path, "target.tokenizer", "needs the optional 'tokenizers' package",
            "pip install tokenizers (or pip install 'loadgen[tokenizer]')",
        ) from None  # fmt: skip
    if not Path(path).is_file():
        raise ConfigError(
            path, "target.tokenizer", "tokenizer file not found", "give a local tokenizer.json"
        )
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the tokenizers library raises its own untyped errors
        raise ConfigError(path, "target.tokenizer", f"not a tokenizer.json: {exc}") from None
