"""The demo's target: a small helpdesk target folder (``DIR/helpdesk/``: two of the example
target's tools, with short ticket ids and resolution codes, and a policy) and the target benchmark
env on it (``envsrc/target.py`` rendered with those schemas, written as ``DIR/target/env.py``).

Why not the example target as it is: its ids (``TCK-10482``) are five digits and its resolutions
free sentences, and a model this small, taught in a few minutes, does not learn to copy digit
sequences or phrases (measured: the base agent named one of four resolution sentences at random);
a three-digit id and a resolution code are one token each of the demo's tokenizer (``agent.py``),
so copying them is a single lookup. The template synthesizer reads the id format and the enum from
the schemas, so the envs it writes for this target use the same ids and codes.

The target benchmark is ours (trusted), but it runs like every env: in a sandbox, through the
same ``EnvFactory`` the trainer and ``evaluate`` use. It is binary (a task scores 1 or 0, like
tau2-bench), so the gate's partial-credit property does not apply to it: the demo audits it with
``static_only=True`` (a named choice, recorded in results.json), and trains on it only in the
GRPO-on-the-target baseline.
"""
from __future__ import annotations

import copy
import json
import pprint
import re
from pathlib import Path

from envforge.targets import load_target

SOURCE = Path(__file__).parent / "envsrc" / "target.py"
TOOL_NAMES = ("get_ticket_details", "close_ticket")
#: the task kinds (the env's SKILLS) whose deficits the demo plants, and the one it does not
PLANTED = ("precondition_verification", "confirmation_before_write")
UNPLANTED = "status_lookup"
#: the tickets' statuses (the env's ``STATUSES``; the base agent's word classes and copy task use them)
STATUSES = ("active", "closed", "cancelled", "on_hold", "expired")
#: the resolution codes ``close_ticket`` takes (an enum in the demo target's schema; the env's
#: ``RESOLUTIONS``): a code the user names is one token to carry into the call, where a sentence
#: would be a phrase to copy word by word, which a model this small does not learn in minutes
RESOLUTIONS = ("fixed", "duplicate", "workaround", "obsolete")
POLICY = ("You are the IT helpdesk assistant. Before close_ticket, read the ticket with "
          "get_ticket_details: close only an 'active' ticket, else say which check failed. Before "
          "close_ticket, confirm the change with the user, unless they said there is no need to "
          "confirm.")


def target_tools() -> list[dict]:
    """The example target's ``TOOL_NAMES`` schemas, ticket ids shown as ``TCK-104`` and the
    resolution a code (``RESOLUTIONS``)."""
    tools = {t["function"]["name"]: t for t in load_target("example").tools}
    out = []
    for name in TOOL_NAMES:
        t = copy.deepcopy(tools[name])
        for p in t["function"]["parameters"]["properties"].values():
            if "description" in p:
                p["description"] = re.sub(r"TCK-\d+", "TCK-104", p["description"])
        if "resolution" in t["function"]["parameters"]["properties"]:
            t["function"]["parameters"]["properties"]["resolution"] = {
                "type": "string", "enum": list(RESOLUTIONS), "description": "The resolution code: {} or {}."
                .format(", ".join(RESOLUTIONS[:-1]), RESOLUTIONS[-1])}
        out.append(t)
    return out


def write_target_folder(folder: Path) -> Path:
    """The demo's target folder (tools, read/write metadata, policy), for synth and identify."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "agent_tools.openai.json").write_text(json.dumps(target_tools(), indent=1))
    meta = [{"name": "get_ticket_details", "tool_type": "read", "mutates_state": False},
            {"name": "close_ticket", "tool_type": "write", "mutates_state": True}]
    (folder / "agent_tools.meta.json").write_text(json.dumps(meta, indent=1))
    (folder / "policy.md").write_text(POLICY + "\n")
    return folder


def render_target(practice: bool = False) -> str:
    """The target env's source, its ``TOOLS`` and ``POLICY`` those of the demo's target;
    ``practice``: the base agent's practice tasks (see the env's docstring)."""
    text = SOURCE.read_text(encoding="utf-8")
    for marker, value in (("TOOLS = []", target_tools()), ('POLICY = ""', POLICY),
                          ("PRACTICE = False", practice), ("RESOLUTIONS = []", list(RESOLUTIONS))):
        assert marker in text, marker
        text = text.replace(marker, marker.split(" = ")[0] + " = " + pprint.pformat(
            value, width=100, sort_dicts=False), 1)
    return text


def write_target(folder: Path, practice: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(render_target(practice), encoding="utf-8")
    note = ("the base agent's practice tasks (demonstrations only)" if practice else
            "binary-reward target benchmark of envforge demo; not a training env")
    (folder / "manifest.json").write_text(json.dumps(
        {"capability": "helpdesk target benchmark", "target": "helpdesk", "synthesizer": "demo",
         "note": note}, indent=2))
    return folder
