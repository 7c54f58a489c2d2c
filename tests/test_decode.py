"""trainers.decode, the CPU sampling loop: the model's own logits (adapters included), the nucleus
transformers keeps, the tokens transformers' ``generate`` gives from the same seed; which models
take it, and that ``Policy.generate`` falls back to ``generate`` for the others."""
from __future__ import annotations

import pytest
import torch

from tests.trainers_fixtures import hermes_dir, llama_dir, model_root  # noqa: F401

from trainers import decode  # noqa: E402
from trainers.policy import Policy, load_policy  # noqa: E402


def left_padded(pad: int, lengths: list[int], vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids, mask


def lora(model, seed: int = 0):
    """The model with a LoRA adapter whose weight change is not zero (peft's random init)."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    m = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                         init_lora_weights=False))
    return m.eval()


def gqa_llama(vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, pad_token_id=0)).eval()


def peaked(model, scale: float = 30.0):
    """The model with its output head scaled: peaked distributions, as a trained model's (a random
    one's are flat, its nucleus past ``decode.TOP_K``: the sort's path only)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(params=["llama", "qwen2", "llama+lora", "qwen2+lora", "gqa", "peaked", "peaked+lora"])
def model(request, hermes_dir, llama_dir):  # noqa: F811
    kind = request.param
    policy = load_policy(hermes_dir if kind.startswith("qwen2") else llama_dir)
    m = gqa_llama(len(policy.tokenizer)) if kind == "gqa" else policy.model
    if kind.startswith("peaked"):
        m = peaked(m)
    if kind.endswith("+lora"):
        m = lora(m)
    assert decode.supported(m)
    return m, policy


def forward_last(model, ids, mask):
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()


def test_logits_are_the_models_forward_prompt_and_steps(model):
    m, policy = model
    vocab = m.config.vocab_size
    layer = decode.unwrapped(m).model.layers[0]
    assert decode._plan(layer.self_attn.q_proj) is not None  # applied as sums, not module calls
    assert len(decode._plan(layer.self_attn.q_proj)[2]) == (1 if hasattr(m, "peft_config") else 0)
    ids, mask = left_padded(policy.pad_id, [9, 4, 13], vocab)
    dec = decode._Decoder(m, 3, ids.shape[1] + 4)
    with torch.no_grad():
        got = dec(ids, (mask.cumsum(-1) - 1).clamp(min=0), mask.bool())
    assert torch.allclose(got, forward_last(m, ids, mask), atol=1e-5)
    nxt = mask.sum(-1, keepdim=True)
    for step in range(4):  # each step against a forward over the whole extended sequence
        token = torch.randint(3, vocab, (3, 1), generator=torch.Generator().manual_seed(step))
        ids, mask = torch.cat([ids, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
        with torch.no_grad():
            got = dec(token, nxt, torch.ones(3, 1, dtype=torch.bool))
        nxt = nxt + 1
        assert torch.allclose(got, forward_last(m, ids, mask), atol=1e-5), step


def test_a_disabled_adapter_gives_the_base_logits(hermes_dir):  # noqa: F811
    policy = load_policy(hermes_dir)
    ids, mask = left_padded(policy.pad_id, [7, 11], len(policy.tokenizer))
    base = forward_last(policy.model, ids, mask)
    m = lora(policy.model)
    with torch.no_grad():
        with_adapter = decode._Decoder(m, 2, 12)(ids, (mask.cumsum(-1) - 1).clamp(min=0), mask.bool())
        with m.disable_adapter():
            without = decode._Decoder(m, 2, 12)(ids, (mask.cumsum(-1) - 1).clamp(min=0), mask.bool())
    assert torch.allclose(without, base, atol=1e-5)
    assert not torch.allclose(with_adapter, base, atol=1e-3)  # the adapter did change them


@pytest.mark.parametrize("variant", ["second of two active", "merged", "dora", "dropout", "lora bias"])
def test_adapters_the_loop_applies_itself_or_leaves_to_the_module(llama_dir, variant):  # noqa: F811
    """A projection with vanilla LoRA adapters is applied as its forward's sums (the active
    adapter's only); merged, DoRA or dropout adapters go through the module: the logits are the
    forward's either way."""
    from peft import LoraConfig, get_peft_model
    policy = load_policy(llama_dir)
    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                        use_dora=variant == "dora", lora_dropout=0.1 if variant == "dropout" else 0.0,
                        lora_bias=variant == "lora bias")
    m = get_peft_model(policy.model, config)
    if variant == "second of two active":
        m.add_adapter("second", LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", init_lora_weights=False))
        m.set_adapter("second")
    m.eval()
    if variant == "merged":
        m.merge_adapter()
    if variant == "lora bias":  # peft starts B's bias at zero: give it a value
        with torch.no_grad():
            for mod in m.modules():
                if getattr(mod, "bias", None) is not None and type(mod) is torch.nn.Linear:
                    mod.bias.normal_()
    q = m.get_base_model().model.layers[0].self_attn.q_proj
    plan = decode._plan(q)
    if variant == "second of two active":
        assert plan is not None and len(plan[2]) == 1 and plan[2][0][0] is q.lora_A["second"].weight
    else:
        assert plan is None
    ids, mask = left_padded(policy.pad_id, [6, 10], m.config.vocab_size, seed=5)
    with torch.no_grad():
        got = decode._Decoder(m, 2, 12)(ids, (mask.cumsum(-1) - 1).clamp(min=0), mask.bool())
    assert torch.allclose(got, forward_last(m, ids, mask), atol=1e-5)


def test_peft_parameter_adapters_go_through_their_module(llama_dir):  # noqa: F811
    """An adapter on a weight (``target_parameters``: peft adds B·A to the weight, another sum)
    is not applied as the LoRA sums."""
    from peft import LoraConfig, get_peft_model
    policy = load_policy(llama_dir)
    torch.manual_seed(2)
    m = get_peft_model(policy.model, LoraConfig(r=4, target_modules=[], init_lora_weights=False,
                                                target_parameters=["self_attn.q_proj.weight"])).eval()
    q = m.get_base_model().model.layers[0].self_attn.q_proj
    assert type(q).__name__ != "Linear" and decode._plan(q) is None


def generate(m, policy, ids, mask, n, stop_ids=None, **kw):
    kw = dict(do_sample=True, top_k=0, **kw) if kw.get("temperature", 0) > 0 else dict(do_sample=False)
    with torch.no_grad():
        out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                         eos_token_id=stop_ids or policy.stop_ids, pad_token_id=policy.pad_id, **kw)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("temperature,top_p", [(0, 1.0), (1.0, 0.9), (0.7, 1.0), (1.0, 0.5)])
def test_the_tokens_are_generates_from_the_same_seed(model, temperature, top_p):
    m, policy = model
    ids, mask = left_padded(policy.pad_id, [5, 12, 8, 3], m.config.vocab_size, seed=1)
    kw = dict(temperature=temperature, top_p=top_p) if temperature else {}
    torch.manual_seed(7)
    want = generate(m, policy, ids, mask, 24, **kw)
    torch.manual_seed(7)
    got = decode.sample(m, ids, mask, max_new_tokens=24, stop_ids=policy.stop_ids, pad_id=policy.pad_id,
                        temperature=temperature, top_p=top_p)
    assert torch.equal(got, want)


def test_peaked_models_take_the_topk_path(llama_dir, monkeypatch):  # noqa: F811
    policy = load_policy(llama_dir)
    m = peaked(policy.model)
    sorts = []
    real = decode._sorted_nucleus
    monkeypatch.setattr(decode, "_sorted_nucleus", lambda *a: sorts.append(1) or real(*a))
    ids, mask = left_padded(policy.pad_id, [5, 12, 8], m.config.vocab_size, seed=4)
    out = decode.sample(m, ids, mask, max_new_tokens=12, stop_ids=[], pad_id=policy.pad_id, top_p=0.9)
    assert out.shape[1] == 12 and len(sorts) < 12  # most steps found their nucleus in the top k


@pytest.mark.parametrize("n,stops", [(1, 1), (16, 1), (16, 3)])
def test_sampled_rows_stop_as_generates_do(llama_dir, n, stops):  # noqa: F811
    """Stop ids the model draws often (rows end at different steps, some at the first, all before
    the cap, or the cap at one token): the same tokens as ``generate`` from each seed."""
    policy = load_policy(llama_dir)
    m = peaked(policy.model, 8.0)
    ids, mask = left_padded(policy.pad_id, [5, 8, 3, 10], m.config.vocab_size, seed=3)
    torch.manual_seed(0)
    free = decode.sample(m, ids, mask, max_new_tokens=16, stop_ids=[], pad_id=policy.pad_id, top_p=0.9)
    values, counts = free.unique(return_counts=True)
    stop_ids = values[counts.argsort(descending=True)[:stops]].tolist()
    ended = 0
    for seed in range(6):
        torch.manual_seed(seed)
        want = generate(m, policy, ids, mask, n, stop_ids=stop_ids, temperature=1.0, top_p=0.9)
        torch.manual_seed(seed)
        got = decode.sample(m, ids, mask, max_new_tokens=n, stop_ids=stop_ids, pad_id=policy.pad_id,
                            temperature=1.0, top_p=0.9)
        assert torch.equal(got, want), seed
        ended += int(torch.isin(got, torch.tensor(stop_ids)).any(-1).sum())
    assert ended > 0 or n == 1  # rows did stop (at one token, the cap ends them)


def test_no_new_tokens_is_refused(llama_dir):  # noqa: F811
    policy = load_policy(llama_dir)
    ids, mask = left_padded(policy.pad_id, [4], policy.model.config.vocab_size)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode.sample(policy.model, ids, mask, max_new_tokens=0, stop_ids=policy.stop_ids, pad_id=policy.pad_id)
    policy.model.train()  # a trainer's model: a failed call leaves it in train mode
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.generate([[4, 5]], max_new_tokens=0)
    assert policy.model.training


def test_rows_stop_at_their_stop_token_padded_after(llama_dir):  # noqa: F811
    policy = load_policy(llama_dir)
    m = policy.model
    ids, mask = left_padded(policy.pad_id, [6, 9], m.config.vocab_size, seed=2)
    free = decode.sample(m, ids, mask, max_new_tokens=6, stop_ids=[], pad_id=policy.pad_id, temperature=0)
    stop = int(free[0, 2])  # row 0's third greedy token ends its turn
    got = decode.sample(m, ids, mask, max_new_tokens=6, stop_ids=[stop], pad_id=policy.pad_id, temperature=0)
    assert torch.equal(got, generate(m, policy, ids, mask, 6, stop_ids=[stop]))


@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])  # flat (nucleus past TOP_K: the sort), peaked
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_the_nucleus_is_the_set_transformers_keeps(scale, top_p):
    from transformers.generation.logits_process import TopPLogitsWarper
    scores = torch.randn(6, 500, generator=torch.Generator().manual_seed(int(scale * 10))) * scale
    want = TopPLogitsWarper(top_p)(None, scores.clone())
    got = decode.nucleus(scores.clone(), top_p)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert torch.equal(got[torch.isfinite(got)], scores[torch.isfinite(got)])


def test_prompt_learning_adapters_are_not_taken(llama_dir):  # noqa: F811
    """The loop runs the wrapped model's modules: virtual tokens a prompt-learning adapter adds
    before the input would be lost, so such a model keeps ``generate``."""
    from peft import PromptTuningConfig, get_peft_model
    policy = load_policy(llama_dir)
    m = get_peft_model(policy.model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)).eval()
    assert not decode.supported(m)
    assert decode.supported(lora(load_policy(llama_dir).model))


def test_the_checkpoints_sampling_settings_are_not_applied(llama_dir, monkeypatch):  # noqa: F811
    """``Policy.generate`` samples the model's own distribution (temperature and top-p only), as
    GRPO's loss assumes: a checkpoint's repetition penalty or suppressed tokens are not applied,
    on either path."""
    policy = load_policy(llama_dir)
    ids = [policy.encode("hello please confirm the ticket")]
    plain = [g.tokens for g in policy.generate(ids, max_new_tokens=32, temperature=0)]
    policy.model.generation_config.repetition_penalty = 3.0
    policy.model.generation_config.suppress_tokens = [plain[0][0]]  # its first token, banned
    assert [g.tokens for g in policy.generate(ids, max_new_tokens=32, temperature=0)] == plain
    monkeypatch.setattr(decode, "supported", lambda model: False)  # transformers' generate
    assert [g.tokens for g in policy.generate(ids, max_new_tokens=32, temperature=0)] == plain
    with torch.no_grad():  # what the checkpoint's settings do there: another answer
        penalized = policy.model.generate(input_ids=torch.tensor(ids), max_new_tokens=32, do_sample=False,
                                          pad_token_id=policy.pad_id)
    assert penalized[0, len(ids[0]):].tolist() != plain[0]


def test_other_models_are_not_taken_and_policy_falls_back(hermes_dir, monkeypatch):  # noqa: F811
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config
    policy = load_policy(hermes_dir)
    vocab = len(policy.tokenizer)
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2)).eval()
    windowed = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, use_sliding_window=True, sliding_window=8, max_window_layers=0)).eval()
    assert not decode.supported(gpt2) and not decode.supported(windowed)
    calls = []
    real = decode.sample
    monkeypatch.setattr(decode, "sample", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    context = [policy.encode("hello please confirm")]
    gens = Policy(gpt2, policy.tokenizer, family="hermes").generate(context, max_new_tokens=4)
    assert len(gens) == 1 and 1 <= len(gens[0].tokens) <= 4 and calls == []
    policy.generate(context, max_new_tokens=4)
    assert calls == [1]  # the supported one took the loop
