"""trainers.policy: rendering the contract's messages through real chat templates and parsing
generated text back, per template family; loading a local model with from_pretrained."""
from __future__ import annotations

import json

import pytest

from tests.trainers_fixtures import hermes_dir, llama_dir, model_root  # noqa: F401

from envforge.errors import InputError  # noqa: E402
from trainers.policy import load_policy, parse, parse_hermes, parse_llama3  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_ticket_details", "description": "Get a ticket.",
          "parameters": {"type": "object", "properties": {"ticket_id": {"type": "string"}},
                         "required": ["ticket_id"]}}}]
CONTEXT = [{"role": "system", "content": "You are a helpdesk agent."},
           {"role": "user", "content": "Reset my password, ticket TCK-1."}]


def call(name, args, i=0):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


REPLIES = {
    "content only": {"role": "assistant", "content": "Which ticket do you mean?"},
    "one call": {"role": "assistant", "content": None,
                 "tool_calls": [call("get_ticket_details", {"ticket_id": "TCK-1"})]},
    "two calls, unicode": {"role": "assistant", "content": None,
                           "tool_calls": [call("get_ticket_details", {"ticket_id": "TCK-é 1"}),
                                          call("get_ticket_details", {"ticket_id": "TCK-2"}, 1)]},
}


def normal(msg):
    """A message with arguments compared as JSON values."""
    out = {"role": msg["role"], "content": msg.get("content")}
    out["calls"] = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in msg.get("tool_calls") or []]
    return out


def assistant_text(policy, reply):
    before = policy.render(CONTEXT, TOOLS, add_generation_prompt=True)
    after = policy.render(CONTEXT + [reply], TOOLS)
    assert after.startswith(before)
    return after[len(before):]


@pytest.mark.parametrize("family", ["hermes", "llama3"])
@pytest.mark.parametrize("case", sorted(REPLIES))
def test_render_parse_round_trip(family, case, hermes_dir, llama_dir):
    policy = load_policy(hermes_dir if family == "hermes" else llama_dir)
    assert policy.family == family
    reply = REPLIES[case]
    if family == "hermes" and case == "one call":
        reply = dict(reply, content="Let me look.")  # Qwen renders content before the calls
    text = assistant_text(policy, reply)
    assert normal(policy.parse(text)) == normal(reply)
    # the tokens round-trip too: what the model would generate decodes to the same message
    assert normal(policy.parse(policy.decode(policy.encode(text)))) == normal(reply)
    msg = policy.parse(text)
    assert all(isinstance(c["function"]["arguments"], str) for c in msg.get("tool_calls", []))


def test_hermes_parses_qwen_output():
    text = ('I will check.\n<tool_call>\n{"name": "get_ticket_details", "arguments": '
            '{"ticket_id": "TCK-9"}}\n</tool_call><|im_end|>')
    msg = parse_hermes(text)
    assert msg["content"] == "I will check."
    assert msg["tool_calls"] == [call("get_ticket_details", {"ticket_id": "TCK-9"})]
    # an unclosed block at the end of a cut generation still counts
    assert parse_hermes('<tool_call>{"name": "f", "arguments": {}}')["tool_calls"][0]["function"] == \
        {"name": "f", "arguments": "{}"}


def test_llama3_parses_python_tag_and_several_calls():
    msg = parse_llama3('<|python_tag|>{"name": "f", "parameters": {"a": 1}}<|eom_id|>')
    assert msg == {"role": "assistant", "content": None, "tool_calls": [call("f", {"a": 1})]}
    msg = parse_llama3('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}<|eot_id|>')
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["f", "g"]


@pytest.mark.parametrize("family,text", [
    ("hermes", "<tool_call>{not json</tool_call>"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),
    ("hermes", "\x00\ufffd garbage <tool_call>"),
    ("llama3", '{"foo": 1}'),
    ("llama3", '{"name": "f", "parameters": {"a": 1}} and then some words'),
    ("llama3", "[1, 2"),
    ("hermes", ""),
])
def test_unparsable_output_is_content_only(family, text):
    msg = parse(text, family)
    assert msg["role"] == "assistant" and "tool_calls" not in msg
    assert isinstance(msg["content"], str)


def test_load_policy_needs_a_local_model_folder(tmp_path):
    with pytest.raises(InputError, match="not a local model folder"):
        load_policy(tmp_path)


def test_generation_stops_at_end_of_turn_and_continuation_appends(hermes_dir):
    import torch
    policy = load_policy(hermes_dir)
    ids = policy.encode(policy.render(CONTEXT, TOOLS, add_generation_prompt=True))
    torch.manual_seed(0)
    gens = policy.generate([ids, ids[:20]], max_new_tokens=12)
    for g in gens:
        assert 1 <= len(g.tokens) <= 12
        assert g.finished == (g.tokens[-1] in policy.stop_ids)
    torch.manual_seed(0)
    assert [g.tokens for g in policy.generate([ids, ids[:20]], max_new_tokens=12)] == \
        [g.tokens for g in gens]  # seeded sampling is reproducible
    reply = REPLIES["one call"]
    glue = policy.continuation(CONTEXT, reply, [{"role": "tool", "tool_call_id": "call_0",
                                                  "content": "open"}], TOOLS)
    assert glue == "\n<|im_start|>user\n<tool_response>\nopen\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
