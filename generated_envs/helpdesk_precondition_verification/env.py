"""Capability: precondition verification.

Why it transfers: a common failure on the helpdesk target is making a change the moment an
employee asks for it, without first reading the ticket or loan that is supposed to justify it.
Each episode here is one such request (a password reset, an access grant or a laptop loan
extension) made through the target's own tools and argument formats, and in about half of them a
precondition fails: the ticket is closed, belongs to someone else, lacks the manager approval that
admin access needs, or the loan is overdue or not the employee's. Credit flows only to changes made
after the records were read and to refusals that cite the check that actually failed, so the policy
learns "identify, look up, then act or decline" rather than either always acting or always refusing.
"""
import json
import random
import re

CAPABILITY = "precondition verification"
SKILLS = {"ticket_state": 0.45, "manager_approval": 0.3, "loan_eligibility": 0.25}

TOOLS = [
    {"type": "function", "function": {
        "name": "find_employee_by_email",
        "description": "Look up an employee by their work email address and return their employee "
                       "id. Returns an error when no employee has that email.",
        "parameters": {
            "type": "object",
            "properties": {"email": {
                "type": "string",
                "description": "The employee's work email, such as 'dana.kim@kestrel.example'."}},
            "required": ["email"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_employee_details",
        "description": "Get an employee's profile: name, email, department, manager, the ids of "
                       "their helpdesk tickets and their laptop loans with status and due date.",
        "parameters": {
            "type": "object",
            "properties": {"employee_id": {
                "type": "string", "description": "The employee id, such as 'emp_4821'."}},
            "required": ["employee_id"]}}},
    {"type": "function", "function": {
        "name": "get_ticket_details",
        "description": "Get a helpdesk ticket: its owner, status (open, in_progress, closed or "
                       "cancelled), the request it records and, for access requests, whether the "
                       "owner's manager approved it.",
        "parameters": {
            "type": "object",
            "properties": {"ticket_id": {
                "type": "string", "description": "The ticket id, such as 'TCK-10482'."}},
            "required": ["ticket_id"]}}},
    {"type": "function", "function": {
        "name": "reset_password",
        "description": "Reset an employee's directory password and send them a one-time temporary "
                       "password. The old password stops working immediately.",
        "parameters": {
            "type": "object",
            "properties": {
                "employee_id": {
                    "type": "string", "description": "The employee id, such as 'emp_4821'."},
                "delivery": {
                    "type": "string", "enum": ["sms", "email"],
                    "description": "How to send the temporary password: 'sms' to the phone on "
                                   "file or 'email' to the personal recovery address on file."}},
            "required": ["employee_id", "delivery"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "grant_access",
        "description": "Grant an employee access to an internal system at the given level. Takes "
                       "effect immediately.",
        "parameters": {
            "type": "object",
            "properties": {
                "employee_id": {
                    "type": "string", "description": "The employee id, such as 'emp_4821'."},
                "system": {
                    "type": "string",
                    "enum": ["vpn", "crm", "payroll", "wiki", "build_server", "hr_portal"],
                    "description": "The internal system."},
                "level": {
                    "type": "string", "enum": ["read", "write", "admin"],
                    "description": "The access level to grant."}},
            "required": ["employee_id", "system", "level"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "close_ticket",
        "description": "Close an open or in-progress helpdesk ticket with a short resolution note. "
                       "A closed ticket cannot be reopened.",
        "parameters": {
            "type": "object",
            "properties": {
                "ticket_id": {
                    "type": "string", "description": "The ticket id, such as 'TCK-10482'."},
                "resolution": {
                    "type": "string", "minLength": 1,
                    "description": "What was done to resolve the ticket, in one or two "
                                   "sentences."},
                "tags": {
                    "type": "array", "items": {"type": "string"}, "maxItems": 5,
                    "description": "Optional labels for reporting, such as ['password', "
                                   "'self-service']."}},
            "required": ["ticket_id", "resolution"]}}},
    {"type": "function", "function": {
        "name": "extend_laptop_loan",
        "description": "Move the due date of a laptop loan later by a number of days.",
        "parameters": {
            "type": "object",
            "properties": {
                "loan_id": {"type": "string", "description": "The loan id, such as 'LN-30917'."},
                "days": {
                    "type": "integer", "minimum": 1, "maximum": 30,
                    "description": "How many days to add to the due date, from 1 to 30."}},
            "required": ["loan_id", "days"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "transfer_to_human_agents",
        "description": "Hand the conversation to a human helpdesk technician, with a summary of "
                       "the employee's issue. Use only when the request cannot be handled with "
                       "the other tools under the policy.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {
                "type": "string",
                "description": "A short summary of the employee's issue and what was already "
                               "checked."}},
            "required": ["summary"]}}},
]

POLICY = """You are the IT helpdesk assistant for employees of Kestrel Systems.
- First ask for the employee's work email and identify them with find_employee_by_email. Act only
  for that employee, on their own tickets and loans.
- Every change must be backed by a ticket: read it with get_ticket_details and check that it
  belongs to the identified employee and that its status is open or in_progress.
- admin access needs a ticket approved by the employee's manager; read and write access do not.
- Before extending a laptop loan, check with get_employee_details that the loan is listed under the
  employee and is active. Overdue loans cannot be extended: the laptop must be returned first.
- When a check fails, make no change: tell the employee which check failed and what to do next.
- Before any change, state exactly what you will do and wait for the employee to confirm.
- One tool call at a time; never call a tool in the same message as a reply to the employee.
- Transfer to a human only when the policy cannot resolve the request."""

FIRST = ["Dana", "Ravi", "Mei", "Tomas", "Aisha", "Jonas", "Lucia", "Kwame", "Ingrid", "Omar",
         "Priya", "Felix", "Hana", "Diego", "Noor", "Sven", "Amara", "Yusuf", "Elena", "Kenji"]
LAST = ["Kim", "Patel", "Novak", "Okafor", "Lindqvist", "Haddad", "Moreau", "Tanaka", "Silva",
        "Brennan", "Adeyemi", "Kowalski", "Ferreira", "Nakamura", "Rahman", "Dubois", "Weber"]
DEPARTMENTS = ["Finance", "Engineering", "Sales", "People", "Support", "Legal", "Marketing"]
ASSETS = ["ThinkPad X1 Carbon", "MacBook Air 13", "Latitude 7440", "EliteBook 840",
          "Framework 13", "MacBook Pro 14"]
OFFICES = ["HQ", "remote", "Lisbon", "Osaka", "Nairobi", "Toronto"]
SYSTEMS = ["vpn", "crm", "payroll", "wiki", "build_server", "hr_portal"]
MAX_IDLE = 4

# What a refusal claims, by the precondition it names (checked on lower-cased assistant text).
CLAIMS = [
    ("status", r"\b(is|was|been|status:?|marked( as)?) (already |now )?(closed|cancell?ed)\b|"
               r"(closed|cancell?ed) ticket|no longer open|\bnot open\b"),
    ("owner", r"n[o']t belong|belongs? to (another|someone|a different|a colleague)|not yours|"
              r"not your (ticket|loan)|someone else|another employee|different employee|"
              r"not (the|its) owner|not owned by you|not (registered|listed) (to|under) you"),
    ("approval", r"not (yet )?(been )?approved|n't been approved|no (manager )?approval|"
                 r"without (manager |your manager's )?approval|unapproved|pending approval|"
                 r"missing (manager )?approval|lacks? (manager |the )?approval"),
    ("overdue", r"overdue|past (its |the )?due"),
]
CONFIRM = r"shall i|should i|may i|can i go ahead|do you want me|would you like me|confirm|" \
          r"proceed|go ahead|is that (ok|okay|right|correct)"


# --------------------------------------------------------------------------- the world

def _unique(rng, fmt, low, high, taken):
    while True:
        value = fmt.format(rng.randint(low, high))
        if value not in taken:
            taken.append(value)
            return value


def _build(rng):
    """A fresh synthetic helpdesk database and one employee's request, all drawn from ``rng``."""
    skill = rng.choices(list(SKILLS), weights=list(SKILLS.values()))[0]
    taken = []
    people = rng.sample([(f, l) for f in FIRST for l in LAST], rng.randint(5, 8))
    employees = {}
    for first, last in people:
        eid = _unique(rng, "emp_{}", 1000, 9999, taken)
        employees[eid] = {"employee_id": eid, "name": first + " " + last,
                          "email": (first + "." + last).lower() + "@kestrel.example",
                          "department": rng.choice(DEPARTMENTS), "manager_id": None,
                          "office": rng.choice(OFFICES),
                          "ticket_ids": [], "laptop_loans": []}
    ids = list(employees)
    for eid in ids:
        employees[eid]["manager_id"] = rng.choice([m for m in ids if m != eid])
    loans, tickets = {}, {}

    def add_loan(owner, status):
        lid = _unique(rng, "LN-{}", 10000, 99999, taken)
        due = "2025-{:02d}-{:02d}".format(rng.randint(1, 12), rng.randint(1, 28))
        loans[lid] = {"loan_id": lid, "employee_id": owner, "asset": rng.choice(ASSETS),
                      "status": status, "due_date": due}
        employees[owner]["laptop_loans"].append(lid)
        return lid

    def add_ticket(owner, status, request):
        tid = _unique(rng, "TCK-{}", 10000, 99999, taken)
        tickets[tid] = {"ticket_id": tid, "employee_id": owner, "status": status,
                        "request": request}
        employees[owner]["ticket_ids"].append(tid)
        return tid

    def random_request():
        kind = rng.choice(["password_reset", "access", "other"])
        if kind == "password_reset":
            return {"type": kind, "delivery": rng.choice(["sms", "email"])}
        if kind == "access":
            return {"type": kind, "system": rng.choice(SYSTEMS),
                    "level": rng.choice(["read", "write", "admin"]),
                    "manager_approved": rng.random() < 0.5}
        return {"type": "other", "summary": rng.choice(["monitor flickers", "printer jam",
                                                        "new headset", "VPN is slow"])}

    for eid in ids:  # background records, so the right ones must be looked up
        for _ in range(rng.randint(0, 2)):
            add_loan(eid, rng.choice(["active", "returned", "overdue"]))
        for _ in range(rng.randint(0, 2)):
            add_ticket(eid, rng.choice(["open", "in_progress", "closed", "cancelled"]),
                       random_request())

    requester, other = ids[0], ids[1]
    live = rng.choice(["open", "in_progress"])
    sc = {"skill": skill, "requester": requester, "blocker": None}
    if skill == "ticket_state":
        sc["blocker"] = rng.choices([None, "status", "owner"], weights=[0.4, 0.3, 0.3])[0]
        if rng.random() < 0.5:
            sc["kind"], sc["delivery"] = "password", rng.choice(["sms", "email"])
            request = {"type": "password_reset", "delivery": sc["delivery"]}
        else:
            sc["kind"], sc["system"] = "access", rng.choice(SYSTEMS)
            sc["level"] = rng.choice(["read", "write"])
            request = {"type": "access", "system": sc["system"], "level": sc["level"],
                       "manager_approved": rng.random() < 0.5}
        status = rng.choice(["closed", "cancelled"]) if sc["blocker"] == "status" else live
        owner = other if sc["blocker"] == "owner" else requester
        sc["ticket_id"] = add_ticket(owner, status, request)
    elif skill == "manager_approval":
        sc["blocker"] = rng.choices([None, "approval"], weights=[0.45, 0.55])[0]
        sc["kind"], sc["system"], sc["level"] = "access", rng.choice(SYSTEMS), "admin"
        request = {"type": "access", "system": sc["system"], "level": "admin",
                   "manager_approved": sc["blocker"] is None}
        sc["ticket_id"] = add_ticket(requester, live, request)
    else:
        sc["blocker"] = rng.choices([None, "overdue", "owner"], weights=[0.45, 0.3, 0.25])[0]
        sc["kind"], sc["days"] = "loan", rng.randint(3, 21)
        owner = other if sc["blocker"] == "owner" else requester
        sc["loan_id"] = add_loan(owner, "overdue" if sc["blocker"] == "overdue" else "active")
        request = {"type": "loan_extension", "loan_id": sc["loan_id"], "days": sc["days"]}
        sc["ticket_id"] = add_ticket(requester, live, request)
    return {"employees": employees, "tickets": tickets, "loans": loans, "scenario": sc}


def _ask(world):
    sc = world["scenario"]
    if sc["kind"] == "password":
        way = "by text message (SMS)" if sc["delivery"] == "sms" else "by email"
        return "I'm locked out: please reset my password and send the temporary one " + way + "."
    if sc["kind"] == "access":
        return "I need {} access to {}.".format(sc["level"], sc["system"])
    return "Could you extend my laptop loan {} by {} days?".format(sc["loan_id"], sc["days"])


# --------------------------------------------------------------------------- validation

def _type_ok(kind, value):
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _check(spec, value, where):
    """Problems of ``value`` against a small subset of JSON schema (types, enum, bounds, items)."""
    kind = spec.get("type")
    if kind and not _type_ok(kind, value):
        return ["{} must be of type {}, got {}".format(where, kind, json.dumps(value, default=str))]
    problems = []
    if "enum" in spec and value not in spec["enum"]:
        problems.append("{} must be one of {}, got {}".format(
            where, ", ".join(spec["enum"]),
            json.dumps(value, default=str)))
    if "minimum" in spec and value < spec["minimum"]:
        problems.append("{} must be at least {}, got {}".format(where, spec["minimum"], value))
    if "maximum" in spec and value > spec["maximum"]:
        problems.append("{} must be at most {}, got {}".format(where, spec["maximum"], value))
    if "minLength" in spec and len(value) < spec["minLength"]:
        problems.append("{} must not be empty".format(where))
    if "maxItems" in spec and len(value) > spec["maxItems"]:
        problems.append("{} holds at most {} items".format(where, spec["maxItems"]))
    if kind == "array" and "items" in spec:
        for i, item in enumerate(value):
            problems += _check(spec["items"], item, "{}[{}]".format(where, i))
    return problems


def _validate(params, args):
    props = params.get("properties", {})
    problems = ["missing required argument '{}'".format(k)
                for k in params.get("required", []) if k not in args]
    for key in sorted(args):
        if key in props:
            problems += _check(props[key], args[key], "'" + key + "'")
        elif params.get("additionalProperties") is False:
            problems.append("unexpected argument '{}'".format(key))
    return problems


# --------------------------------------------------------------------------- the env

class Env:
    tools = TOOLS
    max_turns = 12
    _world = None

    def reset(self, seed):
        rng = random.Random(seed if isinstance(seed, int) else json.dumps(seed, default=str))
        self._world = _build(rng)
        self._sc = self._world["scenario"]
        self._turn, self._idle, self._done = 0, 0, False
        self._authed, self._ticket_read, self._employee_read, self._confirmed = (
            False, False, False, False)
        requester = self._world["employees"][self._sc["requester"]]
        self._opening = "Hi, this is {} ({}). {} My ticket is {}.".format(
            requester["name"], requester["email"], _ask(self._world), self._sc["ticket_id"])
        obs = {"messages": [{"role": "system", "content": POLICY},
                            {"role": "user", "content": self._opening}]}
        return obs, {"skill": self._sc["skill"]}

    def step(self, action):
        if self._world is None or self._done:
            return ({"messages": [{"role": "tool", "tool_call_id": "",
                                   "content": "Error: no episode is running; call reset first."}]},
                    0.0, True, False, {"skill": None if self._world is None else self._sc["skill"]})
        self._turn += 1
        messages, outcome = [], None
        if not isinstance(action, dict):
            messages.append(self._tool_msg("", "Error: the action must be an assistant message "
                                               "(a JSON object with 'role' and 'content')."))
        else:
            calls = action.get("tool_calls")
            if calls is None or calls == []:
                text, outcome = self._user_reply(action.get("content"))
                messages.append({"role": "user", "content": text})
            elif not isinstance(calls, list):
                messages.append(self._tool_msg("", "Error: 'tool_calls' must be a list."))
            else:
                for i, call in enumerate(calls):
                    call_id = call.get("id") if isinstance(call, dict) else None
                    call_id = call_id if isinstance(call_id, str) else ""
                    if i > 0 or outcome is not None:
                        text = "Error: skipped; make one tool call at a time."
                    else:
                        text, outcome = self._run(call)
                    messages.append(self._tool_msg(call_id, text))
        terminated = outcome is not None
        truncated = not terminated and self._turn >= self.max_turns
        info = {"skill": self._sc["skill"], "turn": self._turn}
        reward = 0.0
        if terminated or truncated:
            self._done = True
            reward = self._score(outcome or "none")
            info.update({"outcome": outcome or "none", "score": reward,
                         "authenticated": self._authed, "checked": self._checked()})
        return {"messages": messages}, reward, terminated, truncated, info

    # ------------------------------------------------------------------ tools

    def _tool_msg(self, call_id, text):
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def _run(self, call):
        """Run one tool call: (tool message text, outcome or None when the episode goes on)."""
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            return "Error: a tool call needs a 'function' object with 'name' and 'arguments'.", None
        name = fn.get("name")
        schema = next((t["function"] for t in TOOLS if t["function"]["name"] == name), None)
        if schema is None:
            known = ", ".join(t["function"]["name"] for t in TOOLS)
            return "Error: unknown tool {}. Available tools: {}.".format(
                json.dumps(name, default=str), known), None
        raw = fn.get("arguments")
        try:  # a JSON string, as the API sends it; a plain object is accepted if it is JSON
            args = json.loads(raw if isinstance(raw, str) else json.dumps(raw)) if raw else {}
        except (TypeError, ValueError, RecursionError):
            return "Error: the arguments of {} are not valid JSON.".format(name), None
        if not isinstance(args, dict):
            return "Error: the arguments of {} must be a JSON object.".format(name), None
        problems = _validate(schema["parameters"], args)
        if problems:
            return "Error: invalid arguments for {}: {}.".format(name, "; ".join(problems)), None
        return self._dispatch(name, args)

    def _dispatch(self, name, args):
        w, sc = self._world, self._sc
        if name == "find_employee_by_email":
            email = args["email"].strip().lower()
            found = [e["employee_id"] for e in w["employees"].values() if e["email"] == email]
            if not found:
                return "Error: no employee has the email {}.".format(
                    json.dumps(args["email"])), None
            self._authed = self._authed or found[0] == sc["requester"]
            return found[0], None
        if name == "get_ticket_details":
            ticket = w["tickets"].get(args["ticket_id"])
            if ticket is None:
                return "Error: ticket {} not found.".format(json.dumps(args["ticket_id"])), None
            self._ticket_read = self._ticket_read or ticket["ticket_id"] == sc["ticket_id"]
            return json.dumps(ticket), None
        if name == "transfer_to_human_agents":
            return "Transfer successful. A technician will pick up the conversation.", "transfer"
        if name == "close_ticket":
            ticket = w["tickets"].get(args["ticket_id"])
            if ticket is None:
                return "Error: ticket {} not found.".format(json.dumps(args["ticket_id"])), None
            if ticket["status"] in ("closed", "cancelled"):
                return "Error: ticket {} is already {}.".format(ticket["ticket_id"],
                                                               ticket["status"]), None
            ticket["status"] = "closed"
            return "Ticket {} closed.".format(ticket["ticket_id"]), self._write_outcome(name, args)
        if name == "extend_laptop_loan":
            loan = w["loans"].get(args["loan_id"])
            if loan is None:
                return "Error: loan {} not found.".format(json.dumps(args["loan_id"])), None
            if loan["status"] == "returned":
                return "Error: loan {} was returned; there is nothing to extend.".format(
                    loan["loan_id"]), None
            loan["extended_by_days"] = args["days"]
            return "Loan {} extended by {} days.".format(loan["loan_id"], args["days"]), \
                self._write_outcome(name, args)
        employee = w["employees"].get(args["employee_id"])
        if employee is None:
            return "Error: employee {} not found.".format(json.dumps(args["employee_id"])), None
        if name == "get_employee_details":
            self._employee_read = self._employee_read or employee["employee_id"] == sc["requester"]
            view = dict(employee)
            view["laptop_loans"] = [w["loans"][lid] for lid in employee["laptop_loans"]]
            return json.dumps(view), None
        if name == "reset_password":
            return "Password of {} reset; a temporary password was sent by {}.".format(
                employee["employee_id"], args["delivery"]), self._write_outcome(name, args)
        employee.setdefault("access", []).append(args["system"] + ":" + args["level"])
        return "Granted {} access to {} for {}.".format(
            args["level"], args["system"], employee["employee_id"]), self._write_outcome(name, args)

    def _write_outcome(self, name, args):
        """Every executed write ends the episode; only the one the valid request asks is right."""
        sc = self._sc
        wanted = {"password": ("reset_password", {"employee_id": sc["requester"],
                                                  "delivery": sc.get("delivery")}),
                  "access": ("grant_access", {"employee_id": sc["requester"],
                                              "system": sc.get("system"),
                                              "level": sc.get("level")}),
                  "loan": ("extend_laptop_loan", {"loan_id": sc.get("loan_id"),
                                                  "days": sc.get("days")})}[sc["kind"]]
        if sc["blocker"] is None and (name, args) == wanted:
            return "right" if self._confirmed else "right_unconfirmed"
        return "wrong"

    # ------------------------------------------------------------------ the user

    def _details_ok(self, text):
        sc = self._sc
        if sc["kind"] == "password":
            return ("sms" in text or "text message" in text) if sc["delivery"] == "sms" else (
                "email" in text and "sms" not in text)
        if sc["kind"] == "access":
            system_named = sc["system"] in text or sc["system"].replace("_", " ") in text
            return system_named and re.search(r"\b{}\b".format(sc["level"]), text) is not None
        return sc["loan_id"].lower() in text and re.search(
            r"\b{}\b".format(sc["days"]), text) is not None

    def _user_reply(self, content):
        """The employee's reply to assistant text: (reply, outcome or None). A record pasted as
        it came ({...}) is not said: a loan's "overdue" status pasted back is no refusal."""
        text = content.lower() if isinstance(content, str) else ""
        text = re.sub(r"\{.*\}", " ", text, flags=re.S)
        claims = [name for name, pattern in CLAIMS if re.search(pattern, text)]
        if claims:
            if claims == [self._sc["blocker"]]:
                return "I see, thanks for checking. I'll sort that out first. Bye!", "refused"
            # a wrong reason ends it: a guess retried turn after turn must not earn a right refusal
            return "That doesn't match what I was told. I'll ask someone else. Bye.", "wrong"
        elif re.search(CONFIRM, text) and self._details_ok(text):
            if not self._confirmed:
                self._confirmed = True
                return "Yes, that's right. Please go ahead.", None
            reply = "Yes, as I said: please go ahead."
        elif re.search(CONFIRM, text):
            reply = "No, that's not what I asked for. " + _ask(self._world)
        else:
            reply = "As I said: " + self._opening[len("Hi, "):]
        self._idle += 1
        if self._idle >= MAX_IDLE:
            return "I don't have time for this; I'll try again later. Bye.", "user_left"
        return reply, None

    # ------------------------------------------------------------------ scoring

    def _checked(self):
        return self._ticket_read and (self._sc["kind"] != "loan" or self._employee_read)

    def _score(self, outcome):
        process = (0.2 if self._authed else 0.0) + (0.3 if self._checked() else 0.0)
        if outcome in ("wrong", "transfer"):
            return round(min(0.2, process), 4)
        if outcome in ("none", "user_left"):  # checked but never decided: half the process credit
            return round(process / 2, 4)
        result = {"right": 0.5, "right_unconfirmed": 0.25,
                  "refused": 0.5 if self._checked() else 0.0}[outcome]
        return round(process + result, 4)

    def solve(self, seed):
        world = _build(random.Random(seed if isinstance(seed, int)
                                     else json.dumps(seed, default=str)))
        sc = world["scenario"]
        email = world["employees"][sc["requester"]]["email"]
        steps = [("find_employee_by_email", {"email": email})]
        if sc["kind"] == "loan":
            steps.append(("get_employee_details", {"employee_id": sc["requester"]}))
        steps.append(("get_ticket_details", {"ticket_id": sc["ticket_id"]}))
        out = [{"role": "assistant", "content": None,
                "tool_calls": [{"id": "call_{}".format(i), "type": "function",
                                "function": {"name": n, "arguments": json.dumps(a)}}]}
               for i, (n, a) in enumerate(steps)]
        tid = sc["ticket_id"]
        say = {
            "status": "Ticket {} is no longer open, so I can't act on it. Please open a new "
                      "ticket for this request.".format(tid),
            "owner": "Ticket {} and the records it points to do not belong to you, so I can't act "
                     "on them. Please open a ticket of your own.".format(tid),
            "approval": "Your admin access request on ticket {} has not been approved by your "
                        "manager yet. Please ask them to approve it.".format(tid),
            "overdue": "Loan {} is overdue, so it cannot be extended. Please return the laptop "
                       "first.".format(sc.get("loan_id")),
        }
        if sc["blocker"]:
            out.append({"role": "assistant", "content": say[sc["blocker"]]})
            return out
        if sc["kind"] == "password":
            plan = "reset your password and send the temporary one by {}".format(
                "SMS" if sc["delivery"] == "sms" else "email")
            call = ("reset_password", {"employee_id": sc["requester"], "delivery": sc["delivery"]})
        elif sc["kind"] == "access":
            plan = "grant you {} access to {}".format(sc["level"], sc["system"])
            call = ("grant_access", {"employee_id": sc["requester"], "system": sc["system"],
                                     "level": sc["level"]})
        else:
            plan = "extend laptop loan {} by {} days".format(sc["loan_id"], sc["days"])
            call = ("extend_laptop_loan", {"loan_id": sc["loan_id"], "days": sc["days"]})
        out.append({"role": "assistant", "content": "I will {}. Shall I proceed?".format(plan)})
        out.append({"role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_write", "type": "function",
                                    "function": {"name": call[0],
                                                 "arguments": json.dumps(call[1])}}]})
        return out
