"""Sampling for small Llama-family decoders on a CPU, without transformers' ``generate``.

On a CPU a small model's decoding is bound by per-step overheads, not arithmetic: on the demo's
0.8M-parameter model of 2026-11-27 (batches of 8, 120-200-token contexts, one thread),
``generate`` spent 6.4 ms a step, much of it in its cache's concatenations, the fused attention
kernel's mask handling and top-p's sort of the whole vocabulary; this loop 4.4 ms (benchmarks/bench_decode.py,
docs/benchmarks.md). It runs the model's own modules (embeddings, norms, rotary embedding,
activations, head) and weights: a projection, plain or with peft's LoRA adapters, is applied as
the ``F.linear`` sums its forward makes, without its module calls (a LoRA'd policy's adapters add
three to each); a disabled, merged or other kind of adapter goes through the module. What it
replaces is the cache (a buffer per layer, filled in place), the attention of a decoding step
(masked matmul and softmax instead of the fused kernel) and the nucleus (its top tokens, from a
``topk``; a full sort only when those do not hold ``top_p`` of the mass).

The logits are the model's forward's to float rounding (the prompt's mostly bit for bit; a
decoding step's attention is summed in another order than the fused kernel's). The nucleus is
the set transformers' top-p keeps and the draw is the same ``multinomial`` over the same
probabilities, so from the same seed a float32 model has drawn ``generate``'s tokens: in the
tests (tests/test_decode.py) and on the demo's model (every batch measured). A last-bit
difference that tips a draw (more likely in bfloat16: 6 of 8 batches the same in one check)
makes another sample of the same distribution. ``supported`` says which models take this path;
``Policy.generate`` uses ``generate`` for the rest (and on a GPU), with the same sampling
settings alone.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: model types whose decoder layers are (norm, attention with q/k/v/o projections, norm, MLP)
#: with rotary positions and full attention
TYPES = ("llama", "mistral", "qwen2")
TOP_K = 64  # the nucleus is looked for among this many tokens first
MLP = ("gate_proj", "up_proj", "down_proj")  # these types' MLPs: down(act(gate(x)) * up(x))


def unwrapped(model: Any) -> Any:
    """The transformers model under a peft wrapper (its modules keep the adapters)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supported(model: Any) -> bool:
    """Whether ``sample`` runs this model: a CPU one of a type in ``TYPES``, full attention, no
    per-head q/k norms, no logit soft-capping, no peft adapter but LoRA ones (a prompt-learning
    adapter's virtual tokens go in front of the input, which the loop would not see)."""
    adapters = getattr(model, "peft_config", None) or {}
    if any(getattr(c.peft_type, "value", c.peft_type) != "LORA" for c in adapters.values()):
        return False
    m = unwrapped(model)
    cfg = getattr(m, "config", None)
    body = getattr(m, "model", None)
    if cfg is None or body is None or getattr(cfg, "model_type", None) not in TYPES:
        return False
    if next(m.parameters()).device.type != "cpu":
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", cfg.model_type == "mistral"):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return False
    need = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(body, n) for n in need) or not hasattr(m, "lm_head"):
        return False
    return all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") and not hasattr(layer.self_attn, "q_norm")
               and all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
               for layer in body.layers)


def _plan(linear: Any) -> tuple | None:
    """How to apply a projection without its module calls: ``(weight, bias, ((A, B, scaling),
    ...))`` for a plain ``nn.Linear`` or a peft LoRA one (its active adapters, vanilla LoRA
    without dropout or bias: exactly the sums its forward makes), None to call the module itself
    (any other case: disabled or merged adapters, DoRA and other variants, ``lora_bias``, peft's
    other layer kinds such as ``ParamWrapper``, quantized layers, a cast)."""
    if type(linear) is torch.nn.Linear:
        return linear.weight, linear.bias, ()
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # no peft: no adapters
        return None
    base = getattr(linear, "base_layer", None)
    if type(linear) is not LoraLinear or type(base) is not torch.nn.Linear:  # not subclasses (ParamWrapper)
        return None
    if linear.disable_adapters or linear.merged or linear.lora_variant:
        return None
    extra = []
    for name in linear.active_adapters:
        if name not in linear.lora_A.keys():
            continue
        a, b = linear.lora_A[name], linear.lora_B[name]
        if not isinstance(linear.lora_dropout[name], torch.nn.Identity) or a.weight.dtype != base.weight.dtype \
                or a.bias is not None or b.bias is not None:  # lora_bias: B's bias, scaled, is in the sum
            return None
        extra.append((a.weight, b.weight, linear.scaling[name]))
    return base.weight, base.bias, tuple(extra)


def _project(module: Any, plan: tuple | None, x: torch.Tensor) -> torch.Tensor:
    if plan is None:
        return module(x)
    weight, bias, adapters = plan
    out = F.linear(x, weight, bias)
    for a, b, scaling in adapters:
        out = out + F.linear(F.linear(x, a), b) * scaling
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Decoder:
    """One batch's forward passes: the prompt, then a token per row at a time."""

    def __init__(self, model: Any, batch: int, length: int):
        m = unwrapped(model)
        self.body, self.head, cfg = m.model, m.lm_head, m.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        attn = self.body.layers[0].self_attn
        self.scale = getattr(attn, "scaling", self.dim ** -0.5)
        dtype = self.body.embed_tokens.weight.dtype
        shape = (batch, self.kv_heads, length, self.dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in self.body.layers]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in self.body.layers]
        self.keys = torch.zeros(batch, length, dtype=torch.bool)  # which cache positions are tokens
        self.filled = 0
        # each layer's projections, applied without their module calls where that is exact (a
        # LoRA'd policy's adapters add three calls to each); an MLP of another form is called whole
        self.plans = []
        for layer in self.body.layers:
            parts = {n: getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
            if all(hasattr(layer.mlp, n) for n in MLP):
                parts |= {n: getattr(layer.mlp, n) for n in MLP}
            self.plans.append({n: (module, _plan(module)) for n, module in parts.items()})

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Logits (float32) after the last of ``ids`` (batch x n new tokens at ``positions``;
        ``real``: which of them are tokens, not padding)."""
        b, n = ids.shape
        start, end = self.filled, self.filled + n
        self.keys[:, start:end] = real
        x = self.body.embed_tokens(ids)
        cos, sin = self.body.rotary_emb(x, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if n == 1:
            mask = self.keys[:, None, None, :end]
        else:  # causal over the new tokens; a padding row attends to itself (no empty softmax)
            causal = torch.ones(n, end, dtype=torch.bool).tril(start)
            own = torch.zeros(n, end, dtype=torch.bool)
            own[torch.arange(n), torch.arange(start, end)] = True
            mask = (self.keys[:, None, None, :end] & causal) | own
        for i, layer in enumerate(self.body.layers):
            p = self.plans[i]

            def proj(name: str, v: torch.Tensor) -> torch.Tensor:
                return _project(*p[name], v)
            h = layer.input_layernorm(x)
            q = proj("q_proj", h).view(b, n, self.heads, self.dim).transpose(1, 2)
            k = proj("k_proj", h).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
            self.k[i][:, :, start:end] = _rotate(k, cos, sin)
            self.v[i][:, :, start:end] = proj("v_proj", h).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
            q, keys, values = _rotate(q, cos, sin), self.k[i][:, :, :end], self.v[i][:, :, :end]
            if n == 1:  # a decoding step: (b, kv heads, group, 1, dim) against the cache
                q = q.reshape(b, self.kv_heads, self.heads // self.kv_heads, self.dim)
                w = (q @ keys.transpose(-1, -2)) * self.scale
                out = w.masked_fill(~mask, float("-inf")).softmax(-1) @ values
            else:
                g = self.heads // self.kv_heads
                if g > 1:
                    keys, values = keys.repeat_interleave(g, 1), values.repeat_interleave(g, 1)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            x = x + proj("o_proj", out.reshape(b, self.heads, n, self.dim).transpose(1, 2).reshape(b, n, -1))
            h = layer.post_attention_layernorm(x)
            if MLP[0] in p:
                x = x + proj("down_proj", layer.mlp.act_fn(proj("gate_proj", h)) * proj("up_proj", h))
            else:
                x = x + layer.mlp(h)
        self.filled = end
        return self.head(self.body.norm(x[:, -1:]))[:, 0].float()


def nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scores`` with every token outside each row's nucleus at -inf: the fewest top tokens whose
    probability reaches ``top_p`` (a token is kept while the mass ranked above it is below
    ``top_p``; the top one always), the set transformers' ``TopPLogitsWarper`` keeps (of tied
    logits at its edge, perhaps others)."""
    k = min(TOP_K, scores.shape[-1])
    top, idx = torch.topk(scores, k)
    p = (top - scores.logsumexp(-1, keepdim=True)).exp()
    above = p.cumsum(-1) - p
    if bool((above[:, -1] + p[:, -1] >= top_p).all()):  # every nucleus is inside the top k
        keep = above < top_p
        keep[:, 0] = True
        return torch.full_like(scores, float("-inf")).scatter(1, idx, top.masked_fill(~keep, float("-inf")))
    return _sorted_nucleus(scores, top_p)


def _sorted_nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``nucleus`` over the whole vocabulary, sorted (a flat distribution's)."""
    ordered, order = torch.sort(scores, descending=True)
    p = ordered.softmax(-1)
    keep = p.cumsum(-1) - p < top_p
    keep[:, 0] = True
    return scores.masked_fill(~keep.scatter(1, order, keep), float("-inf"))


@torch.no_grad()
def sample(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, max_new_tokens: int, stop_ids: list[int],
           pad_id: int, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Up to ``max_new_tokens`` tokens after each left-padded row of ``ids`` (``mask``: 1 at
    tokens): (batch x steps), a row's tokens after its stop token set to ``pad_id``, as
    ``generate`` returns them. ``temperature`` 0 is greedy. Uses torch's global generator."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
    b, width = ids.shape
    decode = _Decoder(model, b, width + max_new_tokens)
    real = mask.bool()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = decode(ids, positions, real)
    nxt = positions[:, -1:] + 1
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long)
    going = torch.ones(b, dtype=torch.bool)
    out = []
    for step in range(max_new_tokens):
        if temperature <= 0:
            token = logits.argmax(-1)
        else:
            scores = logits / temperature
            if top_p < 1.0:
                scores = nucleus(scores, top_p)
            token = torch.multinomial(scores.softmax(-1), 1)[:, 0]
        token = torch.where(going, token, torch.full_like(token, pad_id))
        out.append(token)
        going &= ~torch.isin(token, stops)
        if not bool(going.any()) or step == max_new_tokens - 1:
            break
        logits = decode(token[:, None], nxt, torch.ones(b, 1, dtype=torch.bool))
        nxt = nxt + 1
    return torch.stack(out, 1)
