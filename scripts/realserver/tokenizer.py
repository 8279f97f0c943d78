"""A byte-level BPE tokenizer trained locally, shared by the two tiny-model makers.

GPT-2 style pre-tokenizer (llama.cpp knows it as pre-tokenizer "gpt-2"), so llama-server and
transformers tokenize the same way; byte-level, so no text is ever unknown. It is trained on the
running Python's own standard library sources: local text that every machine has.
"""

from __future__ import annotations

import argparse
import glob
import os
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<|endoftext|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train(vocab_size: int) -> Tokenizer:
    """Train the tokenizer on the standard library's top-level .py files."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(stdlib, "*.py")) if os.path.isfile(f))
    if not files:
        raise SystemExit(f"no training text: no .py files in {stdlib}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    return tok


def model_arguments(description: str | None) -> argparse.Namespace:
    """The command line both model makers take: output path and the model's shape."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()
