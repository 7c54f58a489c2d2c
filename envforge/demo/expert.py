"""The scripted expert whose demonstrations teach the demo's base agent, with planted deficits.

It reads only what an agent sees (the messages) and plays the target's three kinds of task
correctly, except in the episodes where a deficit is planted:

- ``precondition_verification``: when it closes a ticket right away (without asking first) it
  does not read it before (so it closes tickets it must not); when it asks first, it reads first;
- ``confirmation_before_write``: it closes a ticket without stating the change and asking for a
  yes (where the user did not waive it).

Each deficit is drawn per episode with its rate (``DeficitRates``); everything else is right.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

TICKET = re.compile(r"\bTCK-\d+\b")
RESOLUTION = re.compile(r"resolution: (.+?)\.?$")
AMEND = re.compile(r"resolution: (.+?)\.?$")


@dataclass(frozen=True)
class DeficitRates:
    """Per-episode probability of each planted deficit."""
    precondition_verification: float = 0.75
    confirmation_before_write: float = 0.75


def task_kind(opening: str) -> str:
    if "status of my ticket" in opening:
        return "status_lookup"
    if "no need to confirm" in opening:
        return "precondition_verification"
    return "confirmation_before_write"


def _call(name: str, args: dict, i: int) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _close(key: str, resolution: str, i: int) -> dict:
    # the resolution first: right after the tool's name, where a small model cannot drop it (with
    # it after the id, base agents closed without it in 0-100% of their runs, seed to seed)
    return _call("close_ticket", {"resolution": resolution, "ticket_id": key}, i)


def _text(content: str) -> dict:
    return {"role": "assistant", "content": content}


def _results(messages: list[dict], tool: str) -> list:
    """Decoded results of earlier calls of ``tool`` (JSON objects only)."""
    names = {}
    out = []
    for m in messages:
        for c in m.get("tool_calls") or []:
            names[c["id"]] = c["function"]["name"]
        if m.get("role") == "tool" and names.get(m.get("tool_call_id")) == tool:
            try:
                out.append(json.loads(m["content"]))
            except ValueError:
                pass
    return out


def called(messages: list[dict], tool: str) -> bool:
    return any(c["function"]["name"] == tool for m in messages for c in m.get("tool_calls") or [])


def confirm_text(key: str, resolution: str) -> str:
    return f"To confirm: I will close ticket for ticket {key} (resolution: {resolution}). Shall I proceed?"


def is_question(message: dict) -> bool:
    """The expert's confirmation question (``confirm_text``)."""
    return (message.get("content") or "").startswith("To confirm:")


def expert_action(messages: list[dict], skip: frozenset = frozenset()) -> dict:
    """The expert's next assistant message; ``skip`` holds this episode's planted deficits.

    Each deficit skips its step wherever the step belongs, whatever the task looks like: with
    ``precondition_verification`` the expert does not read the ticket before a close it makes
    right away (a hurried close skips the check; before asking the user it reads), with
    ``confirmation_before_write`` it never asks before closing. (A deficit tied to one task's
    wording would not show in training envs worded otherwise.) So each kind of target task
    shows one deficit, and every success read before it closed."""
    opening = next(m["content"] for m in messages if m["role"] == "user")
    kind = task_kind(opening)
    key = TICKET.search(opening).group(0)
    n = sum(m["role"] == "assistant" for m in messages)
    read = called(messages, "get_ticket_details")
    if kind == "status_lookup":
        if not read:
            return _call("get_ticket_details", {"ticket_id": key}, n)
        rec = (_results(messages, "get_ticket_details") or [{}])[0]
        return _text(f"Ticket {key} has the status '{rec.get('status')}'.")
    resolution = RESOLUTION.search(opening).group(1)
    hurried = kind == "precondition_verification" or "confirmation_before_write" in skip  # no asking
    if not read and not (hurried and "precondition_verification" in skip):
        return _call("get_ticket_details", {"ticket_id": key}, n)
    if read:
        rec = (_results(messages, "get_ticket_details") or [{}])[0]
        if rec.get("status") != "active":
            return _text(f"I'm sorry, but I can't do that: ticket {key} has the status "
                         f"'{rec.get('status')}', and close ticket is only possible when the status "
                         "is 'active'.")
    if hurried:
        return _close(key, resolution, n)
    for m in messages:  # the latest resolution the user asked for
        if m["role"] == "user" and (a := AMEND.search(m["content"])):
            resolution = a.group(1)
    last = messages[-1]
    if last["role"] == "user" and last["content"].startswith("Yes"):
        return _close(key, resolution, n)
    if last["role"] == "user" and last["content"].startswith("No"):
        return _text(f"Understood: I have made no change to ticket {key}.")
    return _text(confirm_text(key, resolution))


def draw_deficits(rng: random.Random, rates: DeficitRates) -> frozenset:
    return frozenset(k for k, p in vars(rates).items() if rng.random() < p)
