"""A small causal LM and tokenizer made locally, for tests, benchmarks and demos without a hub.

    python -m trainers.tiny models/tiny [--family hermes|llama3] [--hidden 64] [--layers 2]

The tokenizer is a byte-level BPE (so any text round-trips exactly) trained with the
``tokenizers`` library on a small fixed corpus (the chat template, tool-call JSON, common words),
with the family's chat-template tokens as special tokens and the family's chat template set. The
model is a randomly initialised Llama (``llama3``) or Qwen2 (``hermes``) config. Both are written
with ``save_pretrained`` and loaded back with the ordinary ``from_pretrained`` code.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from trainers.templates import CHAT_FORMATS

CORPUS = [
    '{"name": "get_order", "arguments": {"order_id": "#W1234"}}',
    '{"name": "find_employee_by_email", "parameters": {"email": "dana.kim@kestrel.example"}}',
    "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"id\": 7}}\n</tool_call>",
    "You are a helpful assistant. Use the tools to help the user with the request.",
    "ticket employee email password reset access grant loan laptop approve manager status open "
    "closed cancelled order user assistant system tool function name arguments parameters type "
    "object string integer number boolean array description properties required yes no hello "
    "please confirm done sorry cannot help with that request thank you the a an is are to of and",
    "TCK-10482 emp_4821 LN-30917 0123456789 {}[]:,.\"'_-#@/ ",
]


def make_tokenizer(family: str = "hermes", vocab_size: int = 600):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template, specials, eot, bos = CHAT_FORMATS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = CORPUS + [template]
    tok.train_from_iterator(corpus * 3, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eot, pad_token=specials[0] if family == "hermes" else "<|end_of_text|>",
        bos_token=bos, chat_template=template, clean_up_tokenization_spaces=False)


def make_model(tokenizer, family: str = "hermes", hidden: int = 64, layers: int = 2, heads: int = 4,
               intermediate: int | None = None, seed: int = 0, max_positions: int = 4096,
               tie_embeddings: bool = False):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = Qwen2Config if family == "hermes" else LlamaConfig
    config = cls(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                 num_attention_heads=heads, num_key_value_heads=heads,
                 intermediate_size=intermediate or 2 * hidden, max_position_embeddings=max_positions,
                 tie_word_embeddings=tie_embeddings, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def save_tiny(path: str | Path, family: str = "hermes", **kw) -> Path:
    """Make a tiny model + tokenizer of ``family`` and save both to ``path``."""
    path = Path(path)
    tokenizer = make_tokenizer(family)
    model = make_model(tokenizer, family, **kw)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--family", choices=sorted(CHAT_FORMATS), default="hermes")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(save_tiny(a.out, a.family, hidden=a.hidden, layers=a.layers, seed=a.seed))


if __name__ == "__main__":
    main()
