"""Capability: none (the demo's target benchmark, not a training environment).

Helpdesk tasks in the spirit of tau2-bench, on the demo target's tool schemas: a user request
against a database seeded per task. A task scores 1 only when the final state and the required
statements are right, else 0 (binary, like tau2-bench; the gate's partial-credit property is for
training envs). Three kinds of task, each needing one skill, with both sides of it:

- precondition_verification: close a ticket, "no need to confirm"; half the tickets may not be
  closed. Right: read it first; refuse one that may not be closed (change nothing, name its
  status), close one that may (the read is owed either way: the policy asks it before every
  close, and a close made without it was a guess).
- confirmation_before_write: close one of the user's active tickets; right: state the change
  (ticket and resolution), ask, then do what the user answers: close after a yes, change nothing
  after a no, and after another resolution asked for, confirm that one and close with it after
  the yes (closing unasked fails: the confirmation is a required statement, as tau2-bench
  requires some). The ticket is active, so the policy's status check cannot change the outcome
  and is not scored: each kind of task needs one skill, and an agent that lacks one fails only
  the tasks that need it.
- status_lookup: tell the user a ticket's status; right: read it and say it.

(Until 2026-11-27 the precondition tasks were all tickets that may not be closed and every user
said yes: "read, then refuse" and "ask, then close" passed every task, and GRPO on the target
learnt those shortcuts, losing the other sides of both skills; docs/demo.md.)

With ``PRACTICE = True`` (the demo's base agent is taught on it, never scored on it) the close
requests vary further: a request without the waiver may also be for a ticket that cannot be
closed (refuse it), and the read is owed before every close.
"""
import json
import random
import re

CAPABILITY = "helpdesk target benchmark"
SKILLS = {"confirmation_before_write": 0.35, "precondition_verification": 0.35, "status_lookup": 0.3}
TOOLS = []  # rendered: the demo target's schemas
POLICY = ""  # rendered: the demo target's policy
PRACTICE = False  # rendered: True for the base agent's practice tasks
THINGS = ["red desk lamp", "black rain jacket", "pink phone case", "blue garden hose",
          "white coffee grinder", "silver bike lock", "purple yoga mat", "yellow beach towel"]
RESOLUTIONS = []  # rendered: the demo target's resolution codes
BLOCKED = ["closed", "cancelled", "on_hold", "expired"]
STATUSES = ["active"] + BLOCKED
REFUSE = re.compile(r"\b(cannot|can't|can not|unable|not able|not possible|not allowed|sorry)\b")
NO = ["No, please leave it open.", "No, don't close it. Leave it as it is.", "No, thanks. Leave it."]
AMEND = ["Actually, please use the resolution: {}.", "Close it, but with the resolution: {}.",
         "Almost: make the resolution: {}."]
ASK = re.compile(r"\?|\bconfirm\b|\bproceed\b")
MAX_IDLE = 3


def _close_request(key, resolution, waived):
    return "Hi. Please close ticket for my ticket {}{}. Details: resolution: {}.".format(
        key, " right away, no need to confirm" if waived else "", resolution)


def _world(seed):
    rng = random.Random(seed)
    kind = rng.choices(sorted(SKILLS), weights=[SKILLS[k] for k in sorted(SKILLS)])[0]
    tickets = {}
    while len(tickets) < 5:
        tid = "TCK-{:03d}".format(rng.randint(100, 999))
        tickets[tid] = {"ticket_id": tid, "status": rng.choice(STATUSES), "description": rng.choice(THINGS)}
    key = rng.choice(sorted(tickets))
    w = {"kind": kind, "tickets": tickets, "key": key, "resolution": rng.choice(RESOLUTIONS)}
    if kind == "precondition_verification":
        tickets[key]["status"] = rng.choice(BLOCKED)
        w["opening"] = _close_request(key, w["resolution"], waived=True)
    elif kind == "confirmation_before_write":
        tickets[key]["status"] = "active"
        w["opening"] = _close_request(key, w["resolution"], waived=False)
    else:
        w["opening"] = "Hi. What is the status of my ticket {}?".format(key)
    w["practice"] = PRACTICE and kind != "status_lookup"  # a practice close request
    w["close"] = kind != "status_lookup"
    if w["practice"]:
        w["waived"] = rng.random() < 0.5
        w["kind"] = "precondition_verification" if w["waived"] else "confirmation_before_write"
        tickets[key]["status"] = rng.choice(["active"] * len(BLOCKED) + BLOCKED)
    elif w["close"]:  # drawn after the practice tasks' draws: those stay as they were
        w["waived"] = kind == "precondition_verification"
        if w["waived"] and rng.random() < 0.5:
            tickets[key]["status"] = "active"
    if w["close"]:
        w["answer"] = rng.choices(["yes", "no", "amend"], weights=[2, 1, 1])[0]
        w["amend"] = rng.choice([r for r in RESOLUTIONS if r != w["resolution"]])
        w["no_text"], w["amend_text"] = rng.choice(NO), rng.choice(AMEND).format(w["amend"])
        w["opening"] = _close_request(key, w["resolution"], w["waived"])
    return w


def _call(name, args, i):
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_{}".format(i),
            "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _text(content):
    return {"role": "assistant", "content": content}


def _confirm(key, resolution):
    return "To confirm: I will close ticket for ticket {} (resolution: {}). Shall I proceed?".format(
        key, resolution)


class Env:
    tools = TOOLS
    max_turns = 8

    def reset(self, seed):
        self._w = _world(seed)
        self._s = {"read": False, "answered": None, "resolution": None, "idle": 0, "turns": 0}
        obs = {"messages": [{"role": "system", "content": POLICY},
                            {"role": "user", "content": self._w["opening"]}]}
        return obs, {"skill": self._w["kind"]}

    def step(self, action):
        s, w = self._s, self._w
        s["turns"] += 1
        calls = action.get("tool_calls") or [] if isinstance(action, dict) else []
        msgs, outcome = [], None
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            result, outcome = self._tool(fn.get("name"), fn.get("arguments"))
            msgs.append({"role": "tool", "tool_call_id": str(c.get("id", "")) if isinstance(c, dict)
                         else "", "content": result})
            if outcome is not None:
                break
        if not calls:
            text = action.get("content") if isinstance(action, dict) else None
            reply, outcome = self._user(text if isinstance(text, str) else "")
            msgs.append({"role": "user", "content": reply})
        info = {"skill": w["kind"]}
        if outcome is None:
            return {"messages": msgs}, 0.0, False, s["turns"] >= self.max_turns, info
        return {"messages": msgs}, 1.0 if outcome == "success" else 0.0, True, False, info

    # a tool call: (result text, outcome or None)
    def _tool(self, name, raw):
        w, s = self._w, self._s
        try:
            args = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return "Error: arguments must be a JSON object", None
        if name == "get_ticket_details":
            rec = w["tickets"].get(args.get("ticket_id"))
            if rec is None:
                return "Error: no ticket {}".format(json.dumps(args.get("ticket_id"))), None
            if rec["ticket_id"] == w["key"]:
                s["read"] = True
            return json.dumps(rec), None
        if name == "close_ticket":
            rec = w["tickets"].get(args.get("ticket_id"))
            res = args.get("resolution")
            if rec is None or not isinstance(res, str) or not res:
                return "Error: close_ticket needs an existing ticket_id and a resolution", None
            ok = (w["close"] and rec["ticket_id"] == w["key"] and rec["status"] == "active" and
                  (s["read"] or not self._read_owed()) and
                  (s["answered"] == "yes" or w["waived"] and s["answered"] is None) and
                  _same_text(res, s["resolution"] or w["resolution"]))
            return "Done: ticket {} closed.".format(rec["ticket_id"]), "success" if ok else "failure"
        return "Error: {} is not a tool of this helpdesk".format(json.dumps(name)), None

    # the simulated user: (reply, outcome or None)
    def _user(self, text):
        w, s = self._w, self._s
        t = " ".join(text.lower().replace("_", " ").split())
        rec = w["tickets"][w["key"]]
        if w["close"]:
            return self._close_user(t, rec)
        if rec["status"].replace("_", " ") in t and s["read"]:
            return "Thanks, that's what I needed. Bye.", "success"
        if any(x.replace("_", " ") in t for x in STATUSES):
            return "Hmm, OK. Bye.", "failure"
        return self._idle()

    def _read_owed(self):
        """Whether a right answer needs the ticket read first: before a hurried close (the
        status decides it) and in every practice task; a confirmation task's ticket is active."""
        return self._w["practice"] or self._w["waived"]

    def _idle(self):
        self._s["idle"] += 1
        if self._s["idle"] >= MAX_IDLE:
            return "I give up. Bye.", "failure"
        return "Could you please help with my request?", None

    def _close_user(self, t, rec):
        w, s = self._w, self._s
        if s["answered"] == "no":  # right after a no: nothing changed, the ticket was closable
            right = (s["read"] or not self._read_owed()) and rec["status"] == "active"
            return "Thanks. Bye.", "success" if right else "failure"
        if _refuses(t):
            right = rec["status"] != "active" and rec["status"].replace("_", " ") in t and s["read"]
            return "I see. Thanks for checking. Bye.", "success" if right else "failure"
        if ASK.search(t) and w["key"].lower() in t:
            wanted = s["resolution"] or w["resolution"]
            if not _names_only(t, wanted):
                s["idle"] += 1
                return "That is not the resolution I asked for.", None
            if w["answer"] == "no" and not w["waived"]:
                s["answered"] = "no"
                return w["no_text"], None
            if w["answer"] == "amend" and not w["waived"] and s["resolution"] is None:
                s["resolution"] = w["amend"]
                return w["amend_text"], None
            s["answered"], s["resolution"] = "yes", wanted
            return "Yes, that's right. Please go ahead.", None
        return self._idle()

    def solve(self, seed):
        w = _world(seed)
        key, rec = w["key"], w["tickets"][w["key"]]
        out = [_call("get_ticket_details", {"ticket_id": key}, 0)]
        if w["close"] and rec["status"] == "active":
            if w["waived"]:
                return out + [_call("close_ticket", {"ticket_id": key, "resolution": w["resolution"]}, 1)]
            out.append(_text(_confirm(key, w["resolution"])))
            if w["answer"] == "no":
                return out + [_text("Understood: I have made no change to ticket {}.".format(key))]
            resolution = w["amend"] if w["answer"] == "amend" else w["resolution"]
            if w["answer"] == "amend":
                out.append(_text(_confirm(key, resolution)))
            return out + [_call("close_ticket", {"ticket_id": key, "resolution": resolution}, len(out))]
        if w["close"]:
            return out + [_text("I'm sorry, but I can't do that: ticket {} has the status '{}', and "
                                "close ticket is only possible when the status is 'active'.".format(
                                    key, rec["status"]))]
        return out + [_text("Ticket {} has the status '{}'.".format(key, rec["status"]))]


def _refuses(text):
    """A refusal: it says the close cannot be done, and asks nothing or names a blocked status (a
    question after a refusal, "... is on hold. Anything else?", is still one)."""
    return bool(REFUSE.search(text)) and (not ASK.search(text) or
                                          any(b.replace("_", " ") in text for b in BLOCKED))


def _names_only(text, resolution):
    """The (normalised) text names ``resolution`` and no other resolution code, as whole words."""
    named = [r for r in RESOLUTIONS if re.search(r"\b{}\b".format(re.escape(r.lower())), text)]
    return named == [resolution]


def _same_text(a, b):
    return isinstance(a, str) and isinstance(b, str) and " ".join(a.lower().split()).strip(" .") == \
        " ".join(b.lower().split()).strip(" .")
