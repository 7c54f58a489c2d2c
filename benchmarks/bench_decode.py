"""Sampling speed on a CPU: transformers' ``generate`` against ``trainers.decode``'s loop (what
``Policy.generate`` uses for a small Llama-family model on a CPU), on the same batches from the
same seeds, and whether the two sampled the same tokens.

    .venv/bin/python benchmarks/bench_decode.py [--model DIR] [--lora] [--rounds 5] [--batch 8]
                                                [--out benchmarks/results/decode.json]

Without ``--model``: a model of the demo's small shape (Llama, ``DemoConfig``'s width and layers,
a 1,435-token vocabulary; 128 wide and 3 layers when benchmarks.md's table was measured) with
random weights, its output head scaled so that its distributions are as peaked as a trained
model's (a random model's are flat, and its nucleus would be most of the vocabulary).
``--model``: a local model folder (a demo run's ``base_model``, say). ``--lora``: a
random LoRA adapter on it (rank 8 on every linear layer, as the demo's adapters). 64 contexts of
120-200 tokens, batches of ``--batch``, 64 new tokens at most, temperature 1, top-p 0.9, one
torch thread. Rounds alternate the two ways, so load hits both alike; the table shows the best
and the median round. Prints a Markdown table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

from trainers import decode  # noqa: E402
from trainers.policy import load_policy  # noqa: E402

CONTEXTS, NEW = 64, 64


def demo_shaped(folder: Path) -> Path:
    """A random model of the demo's small shape, saved (with a tiny tokenizer) in ``folder``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from envforge.demo.config import DemoConfig
    from trainers.tiny import make_tokenizer
    tok = make_tokenizer("llama3")
    torch.manual_seed(0)
    c = DemoConfig()
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=1435, hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
        num_key_value_heads=c.heads, intermediate_size=c.hidden * 8 // 3, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def batches(policy, batch: int):
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    lengths = torch.randint(120, 201, (CONTEXTS,), generator=g).tolist()
    for start in range(0, CONTEXTS, batch):
        rows = lengths[start:start + batch]
        width = max(rows)
        ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, n in enumerate(rows):
            ids[i, width - n:] = torch.randint(3, vocab, (n,), generator=g)
            mask[i, width - n:] = 1
        yield ids, mask


def with_generate(policy, ids, mask):
    with torch.no_grad():
        out = policy.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=True,
                                    temperature=1.0, top_p=0.9, top_k=0, eos_token_id=policy.stop_ids,
                                    pad_token_id=policy.pad_id)
    return out[:, ids.shape[1]:]


def with_loop(policy, ids, mask):
    return decode.sample(policy.model, ids, mask, max_new_tokens=NEW, stop_ids=policy.stop_ids,
                         pad_id=policy.pad_id, temperature=1.0, top_p=0.9)


def tokens(out, stops) -> int:
    n = 0
    for row in out.tolist():
        for t in row:
            n += 1
            if t in stops:
                break
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a local model folder (default: a random one of the demo's shape)")
    ap.add_argument("--lora", action="store_true", help="a random rank-8 LoRA adapter on every linear layer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "decode.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        policy = load_policy(a.model or demo_shaped(Path(tmp)))
    if a.lora:
        from peft import LoraConfig, get_peft_model
        torch.manual_seed(0)
        policy.model = get_peft_model(policy.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                               init_lora_weights=False)).eval()
    if not decode.supported(policy.model):
        sys.exit(f"error: {a.model} is not a model trainers.decode runs (see decode.supported)")
    work = list(batches(policy, a.batch))
    seconds: dict[str, list[float]] = {"generate": [], "loop": []}
    same, count, steps = [], 0, 0
    for r in range(a.rounds):
        outs = {}
        for name, fn in (("generate", with_generate), ("loop", with_loop)):
            torch.manual_seed(r)
            t = time.perf_counter()
            outs[name] = [fn(policy, ids, mask) for ids, mask in work]
            seconds[name].append(time.perf_counter() - t)
        same += [torch.equal(x, y) for x, y in zip(outs["generate"], outs["loop"])]
        count = sum(tokens(o, policy.stop_ids) for o in outs["loop"])
        steps = sum(o.shape[1] for o in outs["loop"])
    rows = {name: {"best_s": min(v), "median_s": statistics.median(v),
                   "ms_per_step": 1000 * min(v) / steps, "tokens_per_s": count / min(v)}
            for name, v in seconds.items()}
    result = {"model": a.model or "random, the demo's small shape", "lora": a.lora, "batch": a.batch,
              "rounds": a.rounds,
              "contexts": CONTEXTS, "max_new_tokens": NEW, "threads": 1, "steps": steps, "tokens": count,
              "identical_batches": sum(same), "batches": len(same),
              "speedup": rows["generate"]["best_s"] / rows["loop"]["best_s"], "rows": rows,
              "machine": platform.platform(), "cpu_count": os.cpu_count(),
              "torch": torch.__version__, "transformers": transformers.__version__}
    print(f"| sampling ({CONTEXTS} contexts, batches of {a.batch}, 1 thread) | best s | median s | ms a step "
          "| tokens/s |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['best_s']:.2f} | {r['median_s']:.2f} | {r['ms_per_step']:.1f} | "
              f"{r['tokens_per_s']:,.0f} |")
    print(f"\nspeed-up {result['speedup']:.2f}x; the same tokens in {sum(same)} of {len(same)} batches")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
