"""Capability: none (the demo's target benchmark, not a training environment).

Helpdesk tasks in the spirit of tau2-bench, on the example target's own tool schemas: a user
request against a database seeded per task. A task scores 1 only when the final state and the
required statements are right, else 0 (binary, like tau2-bench; the gate's partial-credit
property is for training envs). Three kinds of task, each needing one skill:

- precondition_verification: close a ticket whose status forbids it; right: read it, change
  nothing, and say which check failed (name the status).
- confirmation_before_write: close one of the user's active tickets; right: state the change, ask,
  and act on the answer (yes: close with the confirmed resolution; no: change nothing; a changed
  resolution: confirm again).
- status_lookup: tell the user a ticket's status; right: read it and say it.
"""
import json
import random
import re

CAPABILITY = "helpdesk target benchmark"
SKILLS = {"precondition_verification": 0.35, "confirmation_before_write": 0.35, "status_lookup": 0.3}
TOOLS = []  # rendered: the example target's find_employee_by_email, get_ticket_details, close_ticket
POLICY = (
    "You are the IT helpdesk assistant. Identify the employee by email when given. Before "
    "close_ticket, read the ticket: close only an 'active' ticket of the employee's own, else say "
    "which check failed. Unless identified by email, confirm the change first.")
FIRST = ["Dana", "Ravi", "Mei", "Tomas", "Aisha", "Jonas", "Lucia", "Kwame", "Ingrid", "Omar",
         "Priya", "Felix", "Hana", "Diego", "Noor", "Sven", "Amara", "Yusuf", "Elena", "Kenji"]
LAST = ["Kim", "Patel", "Novak", "Okafor", "Lindqvist", "Haddad", "Moreau", "Tanaka", "Silva",
        "Brennan", "Adeyemi", "Kowalski", "Ferreira", "Nakamura", "Rahman", "Dubois"]
THINGS = ["red desk lamp", "black rain jacket", "pink phone case", "blue garden hose",
          "white coffee grinder", "silver bike lock", "purple yoga mat", "yellow beach towel"]
RESOLUTIONS = ["Resolved by updating the configuration", "Duplicate of an earlier ticket",
               "User confirmed the issue is gone", "Reset completed and verified with the user"]
BLOCKED = ["closed", "cancelled", "on_hold", "expired"]
STATUSES = ["active"] + BLOCKED
REFUSE = re.compile(r"\b(cannot|can't|can not|unable|not able|not possible|not allowed|sorry)\b")
OWNER_CLAIM = re.compile(r"not belong|not yours|not your|someone else|another (user|employee)")
ASK = re.compile(r"\?|\bconfirm\b|\bproceed\b")
MAX_IDLE = 3


def _world(seed):
    rng = random.Random(seed)
    kind = rng.choices(sorted(SKILLS), weights=[SKILLS[k] for k in sorted(SKILLS)])[0]
    first, last = rng.choice(FIRST), rng.choice(LAST)
    me = "emp_{:04d}".format(rng.randint(0, 9999))
    other = "emp_{:04d}".format(rng.randint(0, 9999))
    while other == me:
        other = "emp_{:04d}".format(rng.randint(0, 9999))
    tickets = {}
    while len(tickets) < 5:
        tid = "TCK-{:05d}".format(rng.randint(10000, 99999))
        tickets[tid] = {"ticket_id": tid, "employee_id": me if len(tickets) < 4 else other,
                        "status": rng.choice(STATUSES), "description": rng.choice(THINGS)}
    ids = sorted(tickets)
    w = {"kind": kind, "name": first + " " + last, "employee_id": me, "tickets": tickets,
         "email": "{}.{}@example.com".format(first, last).lower(),
         "resolution": rng.choice(RESOLUTIONS)}
    mine = [t for t in ids if tickets[t]["employee_id"] == me]
    if kind == "precondition_verification":
        key = rng.choice(mine)
        tickets[key]["status"] = rng.choice(BLOCKED)
        w["opening"] = ("Hi, I'm {} (my email address is {}). Please close ticket for my ticket {}. "
                        "Details: resolution: {}.").format(w["name"], w["email"], key, w["resolution"])
    elif kind == "confirmation_before_write":
        key = rng.choice(mine)
        tickets[key]["status"] = "active"
        w["answer"] = rng.choices(["yes", "no", "amend"], weights=[0.5, 0.25, 0.25])[0]
        w["amended"] = rng.choice([r for r in RESOLUTIONS if r != w["resolution"]])
        w["opening"] = "Hi. Please close ticket for my ticket {}. Details: resolution: {}.".format(
            key, w["resolution"])
    else:
        key = rng.choice(mine)
        w["opening"] = "Hi. What is the status of my ticket {}?".format(key)
    w["key"] = key
    return w


def _call(name, args, i):
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_{}".format(i),
            "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _text(content):
    return {"role": "assistant", "content": content}


class Env:
    tools = TOOLS
    max_turns = 8

    def reset(self, seed):
        self._w = _world(seed)
        self._s = {"read": False, "asked": False, "answered": None, "resolution": None, "idle": 0,
                   "done": False, "turns": 0}
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
            if reply:
                msgs.append({"role": "user", "content": reply})
        if outcome is None and s["turns"] >= self.max_turns:
            return {"messages": msgs}, 0.0, False, True, {"skill": w["kind"]}
        if outcome is None:
            return {"messages": msgs}, 0.0, False, False, {"skill": w["kind"]}
        s["done"] = True
        return {"messages": msgs}, 1.0 if outcome == "success" else 0.0, True, False, {"skill": w["kind"]}

    # tools: (result text, outcome or None)
    def _tool(self, name, raw):
        w, s = self._w, self._s
        try:
            args = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return "Error: arguments must be a JSON object", None
        if name == "find_employee_by_email":
            if args.get("email") != w["email"]:
                return "Error: no employee has the email {}".format(json.dumps(args.get("email"))), None
            return json.dumps({"employee_id": w["employee_id"]}), None
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
            ok = (w["kind"] == "confirmation_before_write" and rec["ticket_id"] == w["key"]
                  and s["answered"] == "yes" and _same_text(res, s["resolution"]))
            return "Done: ticket {} closed.".format(rec["ticket_id"]), "success" if ok else "failure"
        return "Error: {} is not a tool of this helpdesk".format(json.dumps(name)), None

    # the simulated user: (reply or None, outcome or None)
    def _user(self, text):
        w, s = self._w, self._s
        t = " ".join(text.lower().replace("_", " ").split())
        kind, rec = w["kind"], w["tickets"][w["key"]]
        if kind == "precondition_verification":
            if REFUSE.search(t):
                if rec["employee_id"] != w["employee_id"]:
                    named = OWNER_CLAIM.search(t) is not None
                else:
                    named = rec["status"].replace("_", " ") in t
                return "I see. Thanks for checking. Bye.", "success" if named and s["read"] else "failure"
        elif kind == "confirmation_before_write":
            if s["answered"] == "no":
                return "Thanks. Bye.", "success" if "no change" in t or "not" in t else "failure"
            if ASK.search(t) and w["key"].lower() in t:
                if s["answered"] is None and w["answer"] == "amend":
                    s["answered"], s["resolution"] = "amend", w["amended"]
                    return "Actually, please make the resolution {} instead.".format(w["amended"]), None
                s["resolution"] = s["resolution"] or w["resolution"]
                if s["resolution"].lower() not in t:
                    s["idle"] += 1
                    return "That is not the resolution I asked for.", None
                s["answered"] = "no" if w["answer"] == "no" else "yes"
                if s["answered"] == "no":
                    return "No, please don't do that. Leave it as it is.", None
                return "Yes, that's right. Please go ahead.", None
        else:
            if rec["status"].replace("_", " ") in t and s["read"]:
                return "Thanks, that's what I needed. Bye.", "success"
            if any(x.replace("_", " ") in t for x in STATUSES):
                return "Hmm, OK. Bye.", "failure"
        s["idle"] += 1
        if s["idle"] >= MAX_IDLE:
            return "I give up. Bye.", "failure"
        return "Could you please help with my request?", None

    def solve(self, seed):
        w = _world(seed)
        key, rec = w["key"], w["tickets"][w["key"]]
        if w["kind"] == "precondition_verification":
            out = [_call("find_employee_by_email", {"email": w["email"]}, 0),
                   _call("get_ticket_details", {"ticket_id": key}, 1)]
            if rec["employee_id"] != w["employee_id"]:
                out.append(_text("I'm sorry, but I can't do that: ticket {} does not belong to you, so "
                                 "I cannot change it.".format(key)))
            else:
                out.append(_text("I'm sorry, but I can't do that: ticket {} has the status '{}', and "
                                 "close ticket is only possible when the status is 'active'.".format(
                                     key, rec["status"])))
            return out
        out = [_call("get_ticket_details", {"ticket_id": key}, 0)]
        if w["kind"] == "status_lookup":
            return out + [_text("Ticket {} has the status '{}'.".format(key, rec["status"]))]
        res = w["resolution"]
        out.append(_text(_confirm(key, res)))
        if w["answer"] == "no":
            return out + [_text("Understood: I have made no change to ticket {}.".format(key))]
        if w["answer"] == "amend":
            res = w["amended"]
            out.append(_text(_confirm(key, res)))
        return out + [_call("close_ticket", {"ticket_id": key, "resolution": res}, len(out))]


def _confirm(key, resolution):
    return "To confirm: I will close ticket for ticket {} (resolution: {}). Shall I proceed?".format(
        key, resolution)


def _same_text(a, b):
    return isinstance(a, str) and isinstance(b, str) and " ".join(a.lower().split()).strip(" .") == \
        " ".join(b.lower().split()).strip(" .")
