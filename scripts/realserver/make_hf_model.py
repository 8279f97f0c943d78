"""Write a tiny random-weight Llama model dir for `transformers serve`, without the model hub.

Run with HF_HUB_OFFLINE=1 in a venv with transformers and torch.
Usage: make_hf_model.py OUT_DIR [--hidden 256] [--layers 4] ...
"""

from __future__ import annotations

import os
import sys

import torch
from tokenizers import processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer


def main() -> None:
    args = tokenizer.model_arguments(__doc__)

    tok = tokenizer.train(args.vocab)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=tokenizer.BOS,
        eos_token=tokenizer.EOS,
        pad_token=tokenizer.BOS,
        unk_token=None,
    )
    hf_tok.chat_template = tokenizer.CHAT_TEMPLATE
    os.makedirs(args.out, exist_ok=True)
    hf_tok.save_pretrained(args.out)

    torch.manual_seed(args.seed)
    bos, eos = (
        hf_tok.convert_tokens_to_ids(tokenizer.BOS),
        hf_tok.convert_tokens_to_ids(tokenizer.EOS),
    )
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.ctx,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=bos,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=bos,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=1024,
    )
    model.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"wrote {args.out}: {params:.1f}M params, vocab {cfg.vocab_size}", file=sys.stderr)


if __name__ == "__main__":
    main()
