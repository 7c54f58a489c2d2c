"""The demo's target benchmark: the env source in ``envsrc/target.py`` rendered with the example
target's tool schemas, written as ``DIR/target/env.py``, and its task list.

The target is ours (trusted), but it still runs like every env: in a sandbox, through the same
``EnvFactory`` the trainer and ``evaluate`` use. It is binary (a task scores 1 or 0, like
tau2-bench), so the gate's partial-credit property does not apply to it: the demo audits it with
``static_only=True`` (a named choice, recorded in results.json), and trains on it only in the
GRPO-on-the-target baseline.
"""
from __future__ import annotations

import json
from pathlib import Path

from envforge.targets import load_target

SOURCE = Path(__file__).parent / "envsrc" / "target.py"
TOOL_NAMES = ("find_employee_by_email", "get_ticket_details", "close_ticket")
#: the task kinds (the env's SKILLS) whose deficits the demo plants, and the one it does not
PLANTED = ("precondition_verification", "confirmation_before_write")
UNPLANTED = "status_lookup"


def render_target() -> str:
    """The target env's source, its ``TOOLS`` the example target's schemas of ``TOOL_NAMES``."""
    tools = {t["function"]["name"]: t for t in load_target("example").tools}
    literal = repr([tools[n] for n in TOOL_NAMES])
    text = SOURCE.read_text(encoding="utf-8")
    marker = "TOOLS = []"
    assert marker in text
    return text.replace(marker, "TOOLS = " + literal, 1)


def write_target(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(render_target(), encoding="utf-8")
    (folder / "manifest.json").write_text(json.dumps(
        {"capability": "helpdesk target benchmark", "target": "example", "synthesizer": "demo",
         "note": "binary-reward target benchmark of envforge demo; not a training env"}, indent=2))
    return folder
