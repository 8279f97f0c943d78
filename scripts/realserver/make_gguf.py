"""Write a tiny random-weight Llama GGUF for llama-server, without torch.

Needs gguf, tokenizers and numpy. Usage: make_gguf.py OUT.gguf [--hidden 256] [--layers 4] ...
"""

from __future__ import annotations

import json
import os
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer


def main() -> None:
    args = tokenizer.model_arguments(__doc__)

    tok_json = json.loads(tokenizer.train(args.vocab).to_str())
    vocab: dict[str, int] = tok_json["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    types = [
        gguf.TokenType.CONTROL if t in tokenizer.SPECIAL_TOKENS else gguf.TokenType.NORMAL
        for t in tokens
    ]

    hidden, layers, heads, kv_heads = args.hidden, args.layers, args.heads, args.kv_heads
    head_dim, ffn = hidden // heads, 3 * hidden
    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("loadgen-tiny-random")
    w.add_context_length(args.ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp rejects "gpt2" here: the hyphen matters
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[tokenizer.BOS])
    w.add_eos_token_id(vocab[tokenizer.EOS])
    w.add_pad_token_id(vocab[tokenizer.BOS])
    w.add_add_bos_token(False)
    w.add_chat_template(tokenizer.CHAT_TEMPLATE)

    rng = np.random.default_rng(args.seed)

    def mat(rows: int, cols: int) -> np.ndarray:  # (out, in) as in PyTorch; gguf reverses dims
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(len(tokens), hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(hidden))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(hidden, ffn))
    w.add_tensor("output_norm.weight", ones(hidden))
    w.add_tensor("output.weight", mat(len(tokens), hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size_mb = os.path.getsize(args.out) / 1e6
    print(
        f"wrote {args.out}: vocab {len(tokens)}, hidden {hidden}, {size_mb:.0f} MB", file=sys.stderr
    )


if __name__ == "__main__":
    main()
