"""The simulator's prefix cache: prompt blocks seen before are not prefilled again.

A simple model of vLLM's automatic prefix caching: a prompt (its words, the simulator's
tokens, in the order system, instructions, messages, prompt, input, inputs of the request
body; message roles are not words, as the dialects count prompt tokens) is cut into blocks of
`block_tokens`; block *i*'s key is a hash of block *i*'s words and block *i − 1*'s key, so a
block hits only when the whole prefix up to it is the same. A request's cached tokens are its
leading run of blocks found in the cache, at most the prompt less one token (the last token is
always computed, as in vLLM, to produce the first output). A request's prompt blocks are
inserted when its first token is emitted (its prefill is done): a request arriving while
another with the same prefix is still prefilling misses. When its stream ends ok, the blocks
of prompt + answer are inserted too, so a chat's next turn, which repeats them, hits them.
Eviction is least recently used, by blocks, up to `capacity_tokens`. `POST
/reset_prefix_cache` (vLLM's endpoint) empties it (`clear`); its counters go on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

PROMPT_KEYS = ("system", "instructions", "messages", "prompt", "input", "inputs")
TEXT_KEYS = ("content", "text", "output")


def prompt_words(body: bytes) -> list[str]:
    """The words of a generation request's prompt, in prompt order (empty if unreadable)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(data, dict):
        return []
    words: list[str] = []
    for key in PROMPT_KEYS:
        if key in data:
            _collect(data[key], words)
    return words


def _collect(value: Any, words: list[str]) -> None:
    if isinstance(value, str):
        words.extend(value.split())
    elif isinstance(value, list):
        for item in value:
            _collect(item, words)
    elif isinstance(value, dict):
        for key in TEXT_KEYS:  # the words the dialect parsers count as prompt tokens
            if key in value:
                _collect(value[key], words)


class PrefixCache:
    """Block keys → present, least recently used first (see the module docstring)."""

    def __init__(self, capacity_tokens: int, block_tokens: int = 16) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries_tokens = 0  # prompt tokens looked up (vLLM: prefix_cache_queries)
        self.hits_tokens = 0  # of them, found (vLLM: prefix_cache_hits)

    def keys(self, words: Sequence[str]) -> list[int]:
        """The chained key of every whole block of `words`."""
        size = self.block_tokens
        keys: list[int] = []
        parent = 0
        for start in range(0, len(words) - size + 1, size):
            parent = hash((parent, tuple(words[start : start + size])))
            keys.append(parent)
        return keys

    def lookup(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """Cached tokens of a prompt of `prompt_tokens` with these block keys (counted)."""
        hit = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += 1
        cached = min(hit * self.block_tokens, max(prompt_tokens - 1, 0))
        self.queries_tokens += prompt_tokens
        self.hits_tokens += cached
        return cached

    def insert(self, keys: Sequence[int]) -> None:
        """Keep these blocks (a prefill finished), evicting the least recently used."""
        blocks = self._blocks
        for key in keys:
            blocks[key] = None
            blocks.move_to_end(key)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def clear(self) -> int:
        """Forget every block (a reset); the counters keep counting. Returns blocks dropped."""
        dropped = len(self._blocks)
        self._blocks.clear()
        return dropped

    @property
    def size_blocks(self) -> int:
        """Blocks held now."""
        return len(self._blocks)
