"""Which of a target's tools read, which write, and which hand the user over to a human.

Shared by identify (the structural rules) and synth (the template classifier): from the
target's metadata where it lists the tool, else from the tool's name, else from the first verb
of its description. Never from a list of known targets.
"""
from __future__ import annotations

import re

READ_VERBS = ("get", "gets", "find", "finds", "search", "searches", "list", "lists", "retrieve",
              "retrieves", "look", "looks", "return", "returns", "show", "shows", "fetch", "check",
              "read", "reads", "query", "view")
WRITE_VERBS = ("cancel", "cancels", "update", "updates", "modify", "modifies", "create", "creates",
               "delete", "deletes", "remove", "removes", "add", "adds", "set", "sets", "send",
               "sends", "book", "books", "change", "changes", "enable", "enables", "disable",
               "disables", "suspend", "suspends", "resume", "resumes", "close", "closes", "grant",
               "grants", "reset", "resets", "extend", "extends", "exchange", "exchanges", "refund",
               "refunds", "transfer", "transfers", "apply", "applies", "submit", "submits")
READ_PREFIXES = ("get_", "find_", "list_", "search_", "calculate", "check_", "lookup_", "query_",
                 "fetch_", "read_", "view_", "show_", "count_", "verify_", "validate_")
WRITE_PREFIXES = ("cancel_", "update_", "modify_", "book_", "exchange_", "return_", "send_",
                  "transfer_", "create_", "delete_", "remove_", "add_", "set_", "toggle_", "enable_",
                  "disable_", "reset_", "refund_", "pay_", "place_", "change_", "edit_", "submit_",
                  "apply_", "issue_", "grant_", "revoke_", "assign_", "close_", "open_", "extend_",
                  "suspend_", "resume_", "refuel_", "register_", "make_", "upgrade_", "downgrade_")


def tool_kind(name: str, meta: dict[str, dict] | None = None, description: str = "") -> str:
    """``read``, ``write``, ``escalation`` (a transfer to a human) or ``other``.

    From the target's metadata (``tool_type`` read/write, or ``mutates_state``) when it lists
    the tool, else from the name: get_/find_/list_/search_/calculate... read; cancel_/update_/
    modify_/book_/exchange_/return_/send_/transfer_... write, else from the first verb of the
    ``description`` (when given). ``transfer_to_human*`` is always an escalation, not a write.
    """
    low = name.lower()
    if low.startswith("transfer_to_human") or "human_agent" in low or low.startswith("escalate"):
        return "escalation"
    m = (meta or {}).get(name)
    if m:
        if m.get("tool_type") in ("read", "write"):
            return m["tool_type"]
        if m.get("mutates_state") is True:
            return "write"
        if m.get("tool_type"):
            return "other"
    if low.startswith(READ_PREFIXES):
        return "read"
    if low.startswith(WRITE_PREFIXES):
        return "write"
    words = re.findall(r"[a-z]+", (description or "").lower())[:2]
    if words and words[0] in WRITE_VERBS:
        return "write"
    if words and words[0] in READ_VERBS:
        return "read"
    return "other"
