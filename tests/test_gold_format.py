"""The hand-labelled gold set for `envforge identify` (tests/gold/identify_gold.jsonl) has the
shape its readers expect: every line a complete record, labels and capability names from the
fixed sets, one line per (trajectory, capability), and ids that point at a real trajectory in
../shared when it is there (the trajectories themselves are not stored: licences)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SHARED, needs_shared

GOLD = Path(__file__).resolve().parent / "gold" / "identify_gold.jsonl"
FIELDS = {"source", "index", "task_id", "trial", "capability", "label", "turn", "why"}
LABELS = {"PRESENT", "LACKING", "NA"}
CAPABILITIES = {"precondition verification", "tool-call argument precision",
                "structured data reasoning", "confirmation before write",
                "policy adherence / refusal", "action completion", "error recovery",
                "escalation judgement"}


def _records() -> list[dict]:
    out = []
    for n, line in enumerate(GOLD.read_text(encoding="utf-8").splitlines(), 1):
        assert line.strip(), f"line {n} is blank"
        out.append(json.loads(line))
    return out


def test_every_line_is_a_complete_record():
    records = _records()
    assert len(records) >= 150
    for n, r in enumerate(records, 1):
        assert set(r) == FIELDS, f"line {n}: fields {sorted(r)}"
        assert r["label"] in LABELS, f"line {n}: label {r['label']!r}"
        assert r["capability"] in CAPABILITIES, f"line {n}: capability {r['capability']!r}"
        assert isinstance(r["source"], str) and "/" not in r["source"], f"line {n}: source is a file name"
        assert isinstance(r["index"], int) and r["index"] >= 0, f"line {n}: index"
        assert isinstance(r["task_id"], str) and r["task_id"], f"line {n}: task_id"
        assert r["turn"] is None or (isinstance(r["turn"], int) and r["turn"] >= 0), f"line {n}: turn"
        assert isinstance(r["why"], str) and r["why"].strip() and "\n" not in r["why"], f"line {n}: why"
        if r["label"] == "LACKING":
            assert r["turn"] is not None or "never" in r["why"] or "unsure" in r["why"], (
                f"line {n}: a LACKING label names the deciding turn, or says what was never done")


def test_one_line_per_trajectory_and_capability_and_all_eight_per_trajectory():
    pairs: dict[tuple, set] = {}
    for r in _records():
        caps = pairs.setdefault((r["source"], r["index"]), set())
        assert r["capability"] not in caps, f"duplicate: {r['source']}#{r['index']} {r['capability']}"
        caps.add(r["capability"])
    for key, caps in pairs.items():
        assert caps == CAPABILITIES, f"{key}: missing {sorted(CAPABILITIES - caps)}"


def test_reasons_are_short():
    for r in _records():
        assert len(r["why"]) <= 300, f"{r['source']}#{r['index']}: 'why' is one line, not a quote"


@needs_shared
def test_no_conversation_text_is_stored():
    # only ids, labels and one-line reasons, never message bodies (licences): no reason shares
    # a run of 60 characters with any message of its trajectory
    from envforge.trajectories import load_trajectories

    window = 60
    by_source: dict[str, list] = {}
    for r in _records():
        ts = by_source.setdefault(r["source"], load_trajectories(SHARED / "trajectories" / r["source"]))
        text = "\n".join((m.get("content") or "") for m in ts[r["index"]].messages)
        why = r["why"]
        for i in range(max(0, len(why) - window + 1)):
            assert why[i:i + window] not in text, (
                f"{r['source']}#{r['index']} {r['capability']}: 'why' quotes the conversation: "
                f"{why[i:i + window]!r}")


@needs_shared
def test_ids_resolve_to_trajectories_in_shared():
    from envforge.trajectories import load_trajectories

    by_source: dict[str, list] = {}
    for r in _records():
        path = SHARED / "trajectories" / r["source"]
        if not path.is_file():
            pytest.fail(f"{r['source']} is not in {path.parent}")
        ts = by_source.setdefault(r["source"], load_trajectories(path))
        assert r["index"] < len(ts), f"{r['source']}: index {r['index']} of {len(ts)}"
        t = ts[r["index"]]
        assert (t.task_id, t.metadata.get("trial")) == (r["task_id"], r["trial"]), (
            f"{r['source']}#{r['index']}: gold says task {r['task_id']} trial {r['trial']}, "
            f"the file has task {t.task_id} trial {t.metadata.get('trial')}")
        if r["turn"] is not None:
            assert r["turn"] < len(t.messages), f"{r['source']}#{r['index']}: turn {r['turn']} past the end"
            assert t.messages[r["turn"]]["role"] != "system", f"{r['source']}#{r['index']}: turn is the system prompt"
