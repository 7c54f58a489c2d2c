"""A policy: a causal LM and its tokenizer, speaking the contract's chat messages.

    policy = load_policy("models/tiny")                  # a local folder; no hub access assumed
    text = policy.render(messages, tools, add_generation_prompt=True)
    message = policy.parse(generated_text)                # {"role": "assistant", "content", "tool_calls"}

Rendering goes through the tokenizer's own chat template (``apply_chat_template``); the contract's
tool-call ``arguments`` are JSON strings, templates want dicts, so they are decoded first.
Parsing turns generated text back into an assistant message with ``tool_calls`` whose
``arguments`` are JSON strings, for the two template families in use:

- ``hermes`` (Qwen2.5/Qwen3, Hermes, many fine-tunes): ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``
- ``llama3`` (Llama 3.1/3.2/3.3 JSON tool calling): ``{"name": .., "parameters": {..}}``, optionally
  after ``<|python_tag|>``; several calls separated by ``;``.

Text that is not a well-formed call stays content: an assistant message with content only, never
an exception (a bad generation is data; the env answers it).

In multi-turn rollouts the policy's own sampled tokens are kept verbatim (``Turn``): the context
of the next turn is those tokens plus the tokens of the rendered text that follows them (the
end-of-turn token's tail, tool results, the next generation prompt). So the loss is computed on
exactly the tokens that were sampled, never on a re-tokenization of them.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envforge.errors import InputError, UsageError
from trainers import decode as decoding
from trainers.templates import CHAT_FORMATS as TEMPLATES

CHAT_FORMATS = tuple(TEMPLATES)
_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_LLAMA_STRIP = ("<|python_tag|>",)
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>")


# --------------------------------------------------------------------------- families

def detect_chat_format(chat_template: str | None) -> str:
    """The tool-call family of a chat template: ``hermes`` or ``llama3``."""
    if not chat_template:
        raise InputError("the tokenizer has no chat_template: set one (tokenizer.chat_template = "
                         "...; see trainers/templates.py) or use an instruct checkpoint")
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|start_header_id|>" in chat_template or "<|python_tag|>" in chat_template:
        return "llama3"
    raise InputError("cannot tell the tool-call format of this chat template (neither "
                     "<tool_call> (Qwen/Hermes) nor <|start_header_id|> (Llama 3.1)); pass "
                     "family='hermes' or 'llama3' to load_policy")


def template_messages(messages: list[dict]) -> list[dict]:
    """The contract's messages as chat templates expect them: tool-call arguments decoded to
    dicts where they are JSON objects (templates ``tojson`` them), ``None`` content as ""."""
    out = []
    for m in messages:
        m = copy.deepcopy(m)
        if m.get("content") is None:
            m["content"] = ""
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    decoded = json.loads(args)
                except ValueError:
                    decoded = None
                if isinstance(decoded, dict):
                    fn["arguments"] = decoded
        out.append(m)
    return out


def _call(name: str, args: Any, i: int) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {},
                                                              ensure_ascii=False)
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _as_call(obj: Any, i: int) -> dict | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, (dict, str)):
        return None
    return _call(obj["name"], args, i)


def _strip_end(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for marker in _END_MARKERS:
            if text.endswith(marker):
                text, changed = text[: -len(marker)].rstrip(), True
    return text


def parse_hermes(text: str) -> dict:
    text = _strip_end(text)
    calls, kept, pos = [], [], 0
    for m in _CALL_BLOCK.finditer(text):
        try:
            call = _as_call(json.loads(m.group(1)), len(calls))
        except ValueError:
            call = None
        if call is None:
            continue  # not a call: the block stays in the content
        calls.append(call)
        kept.append(text[pos:m.start()])
        pos = m.end()
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return _message(content, calls)


def parse_llama3(text: str) -> dict:
    raw = _strip_end(text)
    body = raw
    for tag in _LLAMA_STRIP:
        if body.startswith(tag):
            body = body[len(tag):].strip()
    decoder, calls, pos = json.JSONDecoder(), [], 0
    try:
        while pos < len(body):
            obj, end = decoder.raw_decode(body, pos)
            objs = obj if isinstance(obj, list) else [obj]
            for o in objs:
                call = _as_call(o, len(calls))
                if call is None:
                    return _message(raw, [])
                calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
    except ValueError:
        return _message(raw, [])
    return _message("" if calls else raw, calls)


def _message(content: str, calls: list[dict]) -> dict:
    msg: dict = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def parse(text: str, family: str) -> dict:
    """Generated text -> one assistant message (content only when no well-formed call)."""
    if family == "hermes":
        return parse_hermes(text)
    if family == "llama3":
        return parse_llama3(text)
    raise UsageError(f"unknown template family {family!r}; known: {', '.join(CHAT_FORMATS)}")


# --------------------------------------------------------------------------- the policy

@dataclass
class Generation:
    tokens: list[int]     # the sampled tokens, up to and including the end-of-turn token
    text: str             # their text, special tokens kept
    finished: bool        # ended with an end-of-turn token (not cut at max_new_tokens)


class Policy:
    """A causal LM + tokenizer (with a chat template) that renders, generates and parses."""

    def __init__(self, model: Any, tokenizer: Any, family: str | None = None, name: str = ""):
        self.model, self.tokenizer = model, tokenizer
        self.family = family or detect_chat_format(getattr(tokenizer, "chat_template", None))
        if self.family not in CHAT_FORMATS:
            raise UsageError(f"unknown template family {self.family!r}; known: {', '.join(CHAT_FORMATS)}")
        self.name = name
        self.eot = TEMPLATES[self.family][2]
        self.stop_ids = sorted({i for i in (tokenizer.convert_tokens_to_ids(t) for t in
                                            (self.eot, "<|eom_id|>", tokenizer.eos_token) if t)
                                if isinstance(i, int) and i != tokenizer.unk_token_id})
        if not self.stop_ids:
            raise InputError(f"the tokenizer has no {self.eot} token: the chat template and the "
                             "vocabulary do not match")
        self.eot_id = tokenizer.convert_tokens_to_ids(self.eot)
        if self.eot_id is None or self.eot_id == tokenizer.unk_token_id:
            self.eot_id = self.stop_ids[0]
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ text
    def render(self, messages: list[dict], tools: list | None = None,
               add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(template_messages(messages), tools=tools or None,
                                                  tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def parse(self, text: str) -> dict:
        return parse(text, self.family)

    def continuation(self, messages: list[dict], action: dict, new: list[dict],
                     tools: list | None) -> str:
        """The text that follows the policy's end-of-turn token once ``action`` (its parsed
        reply to ``messages``) is answered by ``new`` messages: the rest of the rendered turn,
        the new messages, and the next generation prompt."""
        with_action = self.render(messages + [action], tools)
        after = self.render(messages + [action] + new, tools, add_generation_prompt=True)
        if not after.startswith(with_action):
            raise InputError("the chat template is not prefix-stable (rendering more messages "
                             "changes the text of earlier ones), so multi-turn rollouts cannot "
                             "keep the policy's own tokens; use a template that appends")
        cut = with_action.rfind(self.eot)
        tail = with_action[cut + len(self.eot):] if cut >= 0 else ""
        return tail + after[len(with_action):]

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, contexts: list[list[int]], max_new_tokens: int = 256,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[Generation]:
        """Sample one turn for each context (token lists), batched with left padding. Uses
        torch's global generator: seed it (torch.manual_seed) for reproducible samples. A small
        Llama-family model on a CPU samples in ``trainers.decode``'s loop, any other through
        transformers' ``generate``; either way with ``temperature`` and ``top_p`` alone (the
        checkpoint's own generation settings are not applied)."""
        if not contexts:
            return []
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c):] = torch.tensor(c, dtype=torch.long)
            mask[i, width - len(c):] = 1
        was_training = self.model.training
        self.model.eval()
        try:
            out = self._sample(ids, mask, width, max_new_tokens, temperature, top_p)
        finally:  # a failed call leaves the model as it found it (a trainer's train mode)
            if was_training:
                self.model.train()
        gens = []
        for row in out.tolist():
            tokens, finished = [], False
            for t in row:
                tokens.append(t)
                if t in self.stop_ids:
                    finished = True
                    break
            gens.append(Generation(tokens, self.decode(tokens), finished))
        return gens

    def _sample(self, ids, mask, width, max_new_tokens, temperature, top_p):
        """Each row's new tokens (the model already in eval mode)."""
        if decoding.supported(self.model):  # a small Llama-family model on a CPU: the faster loop
            return decoding.sample(self.model, ids, mask, max_new_tokens=max_new_tokens,
                                   stop_ids=self.stop_ids, pad_id=self.pad_id, temperature=temperature,
                                   top_p=top_p)
        # these settings alone, not the checkpoint's generation_config (a repetition penalty,
        # say): the model's own distribution, the one GRPO's loss scores, as in the loop
        from transformers import GenerationConfig
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) \
            if temperature > 0 else dict(do_sample=False)
        inner = decoding.unwrapped(self.model)
        saved, inner.generation_config = inner.generation_config, GenerationConfig()
        try:
            return self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                       max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids,
                                       pad_token_id=self.pad_id, **sampling)[:, width:]
        finally:
            inner.generation_config = saved


def set_threads(threads: int | None) -> None:
    """Torch's intra-op thread count (None: leave torch's default)."""
    if threads:
        torch.set_num_threads(int(threads))


def load_policy(path: str | Path, *, adapter: str | Path | None = None, device: str = "cpu",
                dtype: str | None = None, family: str | None = None) -> Policy:
    """A policy from a local model folder (``from_pretrained``; no hub access is attempted),
    with the LoRA adapter at ``adapter`` applied when given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr stay readable (JSON out, progress lines)
    p = Path(path)
    if not (p / "config.json").is_file():
        raise InputError(f"{p} is not a local model folder (no config.json): pass a folder saved "
                         "with save_pretrained, e.g. one made by `python -m trainers.tiny DIR`")
    torch_dtype = {None: None, "auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    kw = {"dtype": torch_dtype} if torch_dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, **kw).to(device)
    if adapter is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
    model.eval()
    return Policy(model, tokenizer, family=family, name=str(p))
