"""The LLM labeller, and the hybrid one.

``llm``: an OpenAI-compatible model proposes candidate capabilities from batches of failures
(discovery), candidates from all batches and runs are merged, then one call per trajectory
labels ALL candidates at once (TRACE makes one call per pair), as JSON checked against a schema.
``hybrid``: no discovery; the structural rules label first and the model confirms or corrects
each rule's label, shown the rule's evidence, one call per trajectory.

Both follow the rubric (docs/identify-rubric.md): the definitions below, and every PRESENT or
LACKING label must quote its evidence, a turn index (the ``[i]`` the trajectory is shown with)
and a short quote that is checked to occur in that turn. A reply whose quote is not there is
asked again; a label still without checked evidence after the re-asks counts NA (hybrid: the
rule's label stands). Calls run concurrently under a rate limit and are cached by content hash
(:mod:`envforge.llm`), so a re-run costs nothing and an interrupted run resumes.
"""
from __future__ import annotations

import json
import math
import random
import re
import threading
from typing import Any, Sequence

from envforge.errors import InputError
from envforge.identify.config import LABELS, LACKING, NA, PRESENT, Capability, IdentifyConfig
from envforge.identify.rules import Verdict
from envforge.llm import run_concurrently
from envforge.progress import Progress
from envforge.trajectories import Trajectory, render

#: What each structural capability's labels require (kept in step with docs/identify-rubric.md).
RUBRIC = {
    "precondition verification": (
        "LACKING: the agent changed an entity (a write) without first reading it, or although "
        "what it read forbade the change (a status the action needs is absent, the entity is "
        "cancelled/closed, it belongs to another user, a time window of the policy has passed, "
        "a class the policy excludes), or it booked flights or items never searched in this "
        "conversation, or the tool refused the write for the entity's state. PRESENT: every "
        "write was preceded by a read of that entity that allowed it, or the agent read the "
        "record and rightly declined the change it forbade. NA: no write attempted or about to "
        "be."),
    "tool-call argument precision": (
        "LACKING: a transcription slip: in a write the agent used an id, name, date or option "
        "that differs from the one the user or a tool result gave (a typo, a wrong digit, a "
        "value that appears nowhere), on the right tool and entity. Choosing another option "
        "that did appear (another flight, the wrong reservation) is a decision, not a slip: not "
        "LACKING here. Numbers the agent computes belong to structured data reasoning. PRESENT: "
        "the agent made writes and every value was copied exactly. NA: no write."),
    "structured data reasoning": (
        "LACKING: a number the agent computed from the data (a price, total, refund, balance, "
        "count, bag allowance, the cheapest option) is wrong, stated to the user or used in a "
        "call, or computed from the wrong data (old fares, a tier the user claimed but the "
        "agent never read). PRESENT: the agent computed such numbers and they were right. NA: "
        "nothing computed (copying one number from a tool result is not reasoning)."),
    "confirmation before write": (
        "LACKING: the agent changed state without first listing the action and receiving the "
        "user's explicit yes to it. PRESENT: every write followed an explicit yes to a question "
        "that described it. NA: no write."),
    "policy adherence / refusal": (
        "LACKING: the agent made a change the policy forbids or nobody asked for, or granted "
        "what the policy says to refuse. PRESENT: the agent followed the policy where it "
        "applied, including refusing. NA: the policy never constrained the agent's choices."),
    "action completion": (
        "LACKING: the user asked for a change the policy allows and the agent never made it "
        "(stopped early, only promised, or transferred instead). PRESENT: every allowed change "
        "the user asked for was made. NA: no change was called for."),
    "error recovery": (
        "LACKING: a tool call failed with an error the agent could have fixed, and it gave up, "
        "repeated the same call, told the user something false about it, or 'fixed' it by "
        "passing its own mistake on to the user. PRESENT: a failed call was corrected and then "
        "succeeded. NA: no call failed, or the failure was final and the agent told the user "
        "so truthfully."),
    "escalation judgement": (
        "LACKING: the agent transferred to a human when it could and should have handled the "
        "request, or did not transfer when the request was out of its scope. PRESENT: it "
        "transferred exactly when it had to. NA: no transfer was made or needed."),
}

LABEL_REQUIREMENTS = (
    "Label each capability PRESENT (the conversation shows the agent using it), LACKING (it "
    "shows the agent missing it) or NA (the conversation gave no occasion to use it; not 'the "
    "evidence is thin': then pick the likelier label). Judge the agent's own turns only, from "
    "what the conversation and the policy show; the reward and the reference solution, when "
    "given, may show where things went wrong but are not themselves evidence. Turns the task "
    "began with (pre-filled history) are context, not the agent's conduct; tools the user runs "
    "on their own device are the user's actions, not the agent's writes. One root cause, one "
    "label: a write the record's state forbids (status, age, cabin, flown segment) is "
    "precondition verification, not policy adherence; a write without the user's yes is "
    "confirmation before write; a wrong record or option chosen on purpose is a decision "
    "(policy adherence or action completion), not argument precision; what any change may do "
    "(keep origin and destination, a payment method the user chose) is policy adherence; "
    "refusing an allowed change, or saying a change was made when no call made it, is action "
    "completion. Etiquette (one tool call at a time, the exact transfer sentence) counts "
    "nowhere. Every PRESENT or LACKING label needs evidence: the index of the turn (the number "
    "in brackets) and a short quote copied exactly from that turn (at most 100 characters).")

DISCOVERY_SYSTEM = (
    "You analyse failed runs of a tool-using agent to find the capabilities it lacks. Read the "
    "failed trajectories and propose between 5 and 8 distinct capabilities whose absence explains "
    "these failures. A capability is a specific, trainable skill of the agent (for example: "
    "verifying preconditions before a write, computing payment amounts from tool results), not a "
    "task, a domain or a tool. Reply with only a JSON object, no prose: "
    '{"capabilities": [{"name": "short lowercase name", "description": "one sentence"}]}')

LABELLING_SYSTEM = (
    "You label one agent trajectory. " + LABEL_REQUIREMENTS + " Reply with only a JSON object, "
    'no prose: {"labels": {"<capability name>": {"label": "PRESENT" | "LACKING" | "NA", '
    '"turn": <int or null>, "quote": "<exact words from that turn>"}, ...}} with one entry per '
    "capability, named exactly as listed.")

HYBRID_SYSTEM = (
    "You check the labels a rule-based labeller gave one agent trajectory. For each capability "
    "you see the rule's label and its evidence; read the conversation and confirm the label or "
    "correct it. " + LABEL_REQUIREMENTS + " Reply with only a JSON object, no prose: "
    '{"labels": {"<capability name>": {"label": "PRESENT" | "LACKING" | "NA", "turn": <int or '
    'null>, "quote": "<exact words from that turn>"}, ...}} with one entry per capability, named '
    "exactly as listed.")

DISCOVERY_SCHEMA = {
    "type": "object", "required": ["capabilities"],
    "properties": {"capabilities": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "description"],
        "properties": {"name": {"type": "string", "minLength": 1},
                       "description": {"type": "string"}}}}}}


def labelling_schema(names: Sequence[str]) -> dict:
    """The schema a labelling reply must satisfy: a label and its evidence for every candidate
    (turn and quote required unless the label is NA)."""
    entry = {"type": "object", "required": ["label"],
             "properties": {"label": {"enum": list(LABELS)},
                            "turn": {"type": ["integer", "null"]},
                            "quote": {"type": ["string", "null"], "maxLength": 300}},
             "if": {"properties": {"label": {"enum": [PRESENT, LACKING]}}},
             "then": {"required": ["label", "turn", "quote"],
                      "properties": {"turn": {"type": "integer"}, "quote": {"type": "string",
                                                                            "minLength": 1}}}}
    return {"type": "object", "required": ["labels"], "properties": {"labels": {
        "type": "object", "required": list(names), "properties": {n: entry for n in names}}}}


def _squash(s: str) -> str:
    return " ".join(re.sub(r"[\"'`*]", "", s).lower().split())


def turn_text(t: Trajectory, turn: int) -> str:
    """What message ``turn`` says: its content and, for the agent, its tool calls."""
    m = t.messages[turn]
    calls = [f"{(tc.get('function') or {}).get('name')}({(tc.get('function') or {}).get('arguments')})"
             for tc in m.get("tool_calls") or []]
    return "\n".join([m.get("content") or ""] + calls)


def check_evidence(t: Trajectory, turn: Any, quote: Any) -> str | None:
    """What is wrong with a (turn, quote) pair as evidence in ``t``, or None when the quote
    occurs in that turn (ignoring case, spacing, quotes and markdown emphasis)."""
    if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn < len(t.messages):
        return f"turn {turn!r} is not a message index between 0 and {len(t.messages) - 1}"
    if not isinstance(quote, str) or not _squash(quote):
        return f"turn {turn} needs a quote"
    if _squash(quote.replace("...", " ").strip()) not in _squash(turn_text(t, turn)):
        return f"the quote {quote[:60]!r} is not in turn {turn}"
    return None


def _prepare(obj: Any, names: Sequence[str], t: Trajectory, last: dict) -> Any:
    """Map label spellings and name case onto the canonical ones, then check every PRESENT or
    LACKING label's quote against the trajectory (ValueError: asked again). ``last`` keeps the
    mapped reply, so that its labels with checked evidence survive a reply that stays faulty."""
    if not isinstance(obj, dict):
        return obj
    raw = obj.get("labels")
    if raw is None and any(n in obj for n in names):
        raw = obj  # a flat {name: ...} object
    if not isinstance(raw, dict):
        return obj
    by_lower = {n.lower(): n for n in names}
    labels, problems = {}, []
    for k, val in raw.items():
        name = by_lower.get(str(k).strip().lower(), k)
        entry = dict(val) if isinstance(val, dict) else {"label": val}
        if isinstance(entry.get("label"), str):
            entry["label"] = entry["label"].strip().upper().replace("N/A", "NA").replace(
                "NOT APPLICABLE", "NA")
        if entry.get("label") in (PRESENT, LACKING) and name in names:
            problem = check_evidence(t, entry.get("turn"), entry.get("quote"))
            if problem:
                problems.append(f"{name}: {problem}")
        labels[name] = entry
    last["labels"] = labels
    if problems:
        raise ValueError("evidence not found: " + "; ".join(problems) + " (quote words exactly as "
                         "they appear in the numbered turn)")
    return {"labels": labels}


POLICY_CHARS = 8000  # of the policy shown to the labeller


def policy_text(t: Trajectory, given: str = "") -> str:
    """The policy the agent followed: the one given (the target's), else the one the file
    records (tau2), else the system prompt (tau-bench v1); cut to :data:`POLICY_CHARS`."""
    own = t.metadata.get("policy") if isinstance(t.metadata.get("policy"), str) else ""
    system = next((m.get("content") or "" for m in t.messages if m.get("role") == "system"), "")
    text = (given or own or system).strip()
    return text if len(text) <= POLICY_CHARS else text[:POLICY_CHARS] + " [...]"


def _capability_key(name: str) -> frozenset:
    """Words of a name, cut to 5 letters (verifying/verification -> verif), minus filler."""
    filler = {"a", "an", "the", "of", "to", "and", "for", "in", "on", "with", "or"}
    return frozenset(w[:5] for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in filler)


def merge_candidates(proposals: Sequence[Sequence[Capability]], limit: int) -> list[Capability]:
    """Pool the candidates of all discovery batches: names whose word sets overlap by half or
    more (Jaccard) are one capability (the first wording is kept); the ``limit`` proposed by the
    most batches are returned, ties in order of first appearance."""
    groups: list[list] = []  # [key, capability, support]
    for batch in proposals:
        for cap in batch:
            key = _capability_key(cap.name)
            for g in groups:
                if key and len(key & g[0]) / len(key | g[0]) >= 0.5:
                    g[2] += 1
                    break
            else:
                groups.append([key, cap, 1])
    order = sorted(range(len(groups)), key=lambda i: (-groups[i][2], i))
    return [groups[i][1] for i in order[:limit]]


def _listing(caps: Sequence[Capability]) -> str:
    lines = []
    for c in caps:
        lines.append(f"- {c.name}: {c.description}")
        if c.name in RUBRIC:
            lines.append(f"  rubric: {RUBRIC[c.name]}")
    return "\n".join(lines)


class LLMLabeller:
    """Discovery and labelling against an :class:`envforge.llm.LLMClient`."""

    def __init__(self, client: Any, config: IdentifyConfig, policy: str | None = None,
                 progress: Progress | None = None):
        self.client, self.config, self.policy = client, config, policy or ""
        self.progress = progress
        self.invalid_replies = 0     # replies still failing the schema or the evidence check
        self.discovery_calls = 0     # discovery requests made (cached or not)
        self._lock = threading.Lock()

    def discover(self, failures: Sequence[Trajectory]) -> list[Capability]:
        cfg = self.config
        if not failures:
            raise InputError("no failed trajectories: the LLM labeller discovers capabilities from "
                             "failures (check --success-threshold)")
        jobs = []
        n_batches = min(cfg.discovery_batches, math.ceil(len(failures) / cfg.batch_size))
        for r in range(cfg.runs):
            order = list(range(len(failures)))
            random.Random(cfg.seed + r).shuffle(order)
            for b in range(n_batches):
                batch = [failures[i] for i in order[b * cfg.batch_size:(b + 1) * cfg.batch_size]]
                if batch:
                    jobs.append((cfg.seed + r, batch))
        results = run_concurrently(lambda job: self._discover_batch(*job), jobs, cfg.concurrency,
                                   self.progress, "discovery batches")
        merged = merge_candidates(results, cfg.max_candidates)
        if not merged:
            raise InputError("the LLM proposed no usable capability in any discovery batch; "
                             "check --model (it must follow JSON instructions)")
        return merged

    def _discover_batch(self, seed: int, batch: Sequence[Trajectory]) -> list[Capability]:
        body = "\n\n".join(f"### Failed trajectory {i + 1} (task {t.task_id})\n"
                           f"{render(t, max_chars=2500, per_message=300)}"
                           for i, t in enumerate(batch))
        messages = [{"role": "system", "content": DISCOVERY_SYSTEM},
                    {"role": "user", "content": f"Failed trajectories:\n\n{body}"}]
        with self._lock:
            self.discovery_calls += 1
        obj, problem = self.client.chat_json(messages, DISCOVERY_SCHEMA, repairs=self.config.max_repairs,
                                             temperature=0.7, seed=seed)
        if problem is not None:
            with self._lock:
                self.invalid_replies += 1
            return []
        return [Capability(c["name"].strip(), c["description"].strip())
                for c in obj["capabilities"] if c["name"].strip()]

    def label(self, trajectories: Sequence[Trajectory], caps: Sequence[Capability],
              proposals: Sequence[dict[str, Verdict]] | None = None) -> list[dict[str, Verdict]]:
        """Per trajectory, name -> verdict. With ``proposals`` (the rules' verdicts, hybrid) the
        model confirms or corrects them, and a label it gives no checked evidence for keeps the
        rule's verdict."""
        jobs = list(zip(trajectories, proposals or [None] * len(trajectories)))
        return run_concurrently(lambda job: self._label_one(job[0], caps, job[1]), jobs,
                                self.config.concurrency, self.progress, "trajectories labelled")

    def _label_one(self, t: Trajectory, caps: Sequence[Capability],
                   proposal: dict[str, Verdict] | None) -> dict[str, Verdict]:
        names = [c.name for c in caps]
        text = f"Trajectory (task {t.task_id}):\n{render(t, numbered=True)}"
        policy = policy_text(t, self.policy)
        if policy:
            text = f"The agent's policy:\n{policy}\n\n{text}"
        if proposal is None:
            system, user = LABELLING_SYSTEM, f"Capabilities:\n{_listing(caps)}\n\n{text}"
        else:
            rules = "\n".join(f"- {n}: {proposal[n].label}" + (f" (turn {proposal[n].turn})"
                              if proposal[n].turn is not None else "") + f": {proposal[n].why}"
                              for n in names)
            system = HYBRID_SYSTEM
            user = (f"Capabilities:\n{_listing(caps)}\n\n{text}\n\nThe rule-based labels to check:\n"
                    f"{rules}")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        last: dict = {}
        obj, problem = self.client.chat_json(messages, labelling_schema(names),
                                             repairs=self.config.max_repairs,
                                             prepare=lambda o: _prepare(o, names, t, last),
                                             temperature=0.0)
        if problem is not None:
            with self._lock:
                self.invalid_replies += 1
        raw = obj.get("labels") if isinstance(obj, dict) else last.get("labels")
        raw = raw if isinstance(raw, dict) else {}
        out = {}
        for n in names:
            entry = raw.get(n) if isinstance(raw.get(n), dict) else {}
            lab = entry.get("label")
            checked = lab == NA or (lab in (PRESENT, LACKING)
                                    and check_evidence(t, entry.get("turn"), entry.get("quote")) is None)
            if checked:
                turn = entry.get("turn") if lab != NA and isinstance(entry.get("turn"), int) else None
                quote = entry.get("quote") if lab != NA and isinstance(entry.get("quote"), str) else ""
                who = "confirmed" if proposal and proposal[n].label == lab else "llm"
                out[n] = Verdict(lab, turn, f"{who}: {json.dumps(quote, ensure_ascii=False)}" if quote
                                 else f"{who}: not exercised")
            elif proposal is not None:
                out[n] = proposal[n]
            else:
                out[n] = Verdict(NA, None, "llm: no label with checked evidence")
        return out
