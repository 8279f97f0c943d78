"""Prompts of a target token count, made locally (nothing is downloaded).

Part of building request plans. The text is drawn from common short English words, each of
which is a single token with its leading space in the common BPE tokenizers (GPT-2/4,
Llama, Mistral, Qwen), so a prompt of N words is close to N tokens. Every request gets its
own words (seeded by run seed and request id): a repeated prompt would hit the server's
prefix cache and make TTFT unrealistically small.
"""

from __future__ import annotations

import random

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


PREFIX_BLOCK_TOKENS = 512  # a trace's shared prefix block (Mooncake's hash_ids block size)


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
