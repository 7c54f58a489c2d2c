"""The runtime every template env carries: argument validation against the target's schemas,
value drawing from recipes, the world's records, the tool dispatcher, the scripted user's text
analysis and the episode loop (``BaseEnv``). A family's env class (``families/<slug>.py``, below
its ENV_PY line) subclasses ``BaseEnv``.

``templates.render`` copies the text below the ENV_PY line into every env.py, after the target's
schemas and the plan written as the five constants that stand here as placeholders, so that this
module imports on its own (and the families' env classes with it) while each env.py stands
alone. Everything below that line may use only what env.py may: the allow-listed standard-library
modules, no envforge.
"""
import json
import random
import re

# The rendered env.py defines these from the target and the family's plan instead.
SKILLS: dict = {}
TOOLS: list = []
ROLES: dict = {}
PLAN: dict = {"key": None, "noun": None, "owner": None}
POLICY = ""

# ---- ENV_PY: the shared runtime of every env.py (templates.render copies what follows)

MAX_IDLE = 4
FIRST_NAMES = ["Dana", "Ravi", "Mei", "Tomas", "Aisha", "Jonas", "Lucia", "Kwame", "Ingrid",
               "Omar", "Priya", "Felix", "Hana", "Diego", "Noor", "Sven", "Amara", "Yusuf",
               "Elena", "Kenji", "Marta", "Idris", "Sofia", "Tariq"]
LAST_NAMES = ["Kim", "Patel", "Novak", "Okafor", "Lindqvist", "Haddad", "Moreau", "Tanaka",
              "Silva", "Brennan", "Adeyemi", "Kowalski", "Ferreira", "Nakamura", "Rahman",
              "Dubois", "Weber", "Costa", "Ibrahim", "Larsen"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
REFUSE = re.compile(
    r"\b(can ?not|can't|cannot|unable to|not able to|won't be able|not possible|not allowed|"
    r"not permitted|isn't allowed|is not allowed|not eligible|isn't eligible|ineligible|"
    r"i'm afraid|unfortunately|must decline|have to decline|refuse)\b")
CONFIRM = re.compile(
    r"shall i|should i|may i|can i go ahead|do you want me to|would you like me to|"
    r"please confirm|confirm|proceed|go ahead|is that (ok|okay|right|correct)")
QUESTION = re.compile(r"\?|\b(please (tell|give|share|provide)|could you|can you|what is|"
                      r"what's|which)\b")


# --------------------------------------------------------------------------- values


def _rng(seed):
    return random.Random(seed if isinstance(seed, int) else json.dumps(seed, default=str))


def _person(rng):
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {"first_name": first, "last_name": last, "full_name": first + " " + last,
            "email": "{}.{}{}@example.com".format(first, last, rng.randint(1, 99)).lower(),
            "zip": "{:05d}".format(rng.randint(10000, 99999)),
            "phone_number": "555-{:03d}-{:04d}".format(rng.randint(100, 999), rng.randint(0, 9999)),
            "dob": "{}-{:02d}-{:02d}".format(rng.randint(1950, 2003), rng.randint(1, 12),
                                             rng.randint(1, 28))}


def _new_id(rng, recipe, taken, person=None):
    """An id from ``recipe``'s patterns, not in ``taken``; name parts are ``person``'s when given
    (the id of a user named Hana Patel is hana_patel_123, never another person's name)."""
    for _ in range(60):
        out = []
        for part in rng.choice(recipe["patterns"]):
            if isinstance(part, str):
                out.append(part)
            elif part[0] == "d":
                out.append("".join(rng.choice("0123456789") for _ in range(part[1])))
            elif part[0] == "f":
                out.append((person["first_name"] if person else rng.choice(FIRST_NAMES)).lower())
            elif part[0] == "l":
                out.append((person["last_name"] if person else rng.choice(LAST_NAMES)).lower())
            else:
                out.append("".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(part[1])))
        value = "".join(out)
        if taken is None or value not in taken:
            break
    if taken is not None:
        taken.append(value)
    return value


def _gen(recipe, rng, taken=None, person=None):
    """A value drawn from ``recipe`` (see envforge.synth.classify.recipe); the person fields and
    the name parts of ids are ``person``'s when given."""
    t = recipe.get("t")
    if t == "choice":
        return rng.choice(recipe["values"])
    if t == "bool":
        return rng.random() < 0.5
    if t == "int":
        return rng.randint(recipe["min"], recipe["max"])
    if t == "num":
        return round(rng.uniform(recipe["min"], recipe["max"]), recipe["digits"])
    if t == "timestamp":
        return 1767225600 + rng.randint(1, 24 * 120) * 1800
    if t == "date":
        return "{}-{:02d}-{:02d}".format(rng.choice([2024, 2025]), rng.randint(1, 12), rng.randint(1, 28))
    if t == "person":
        return (person or _person(rng))[recipe["field"]]
    if t == "id":
        return _new_id(rng, recipe, taken, person)
    if t == "array":
        return [_gen(recipe["items"], rng, taken) for _ in range(rng.randint(recipe["min"], recipe["max"]))]
    if t == "object":
        return {k: _gen(v, rng, taken) for k, v in recipe["props"].items()}
    return recipe.get("value")


def _other(recipe, value, rng):
    """Another value from ``recipe`` than ``value`` (None when the recipe has only one)."""
    for _ in range(20):
        new = _gen(recipe, rng)
        if not _same(new, value):
            return new
    return None


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) < 1e-9
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _frac(expected, given):
    """The share of arguments right: keys of either side, each right when both agree."""
    keys = sorted(set(expected) | set(given))
    if not keys:
        return 1.0
    return sum(1 for k in keys if k in expected and k in given and _same(expected[k], given[k])) / len(keys)


def _num(v):
    if isinstance(v, float) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _say(v):
    """A value as a person would type it."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return _num(v)
    if isinstance(v, list):
        return " and ".join(_say(x) for x in v) if v else "none"
    if isinstance(v, dict):
        return "(" + ", ".join("{} {}".format(k.replace("_", " "), _say(x)) for k, x in v.items()) + ")"
    if v is None:
        return "none"
    return str(v)


def _sloppy(value):
    """An id as people mistype it: no leading symbol, lower case, spaces for underscores."""
    if "_" in value:
        return value.replace("_", " ")
    if value and not value[0].isalnum():
        return value[1:]
    if any(c.isupper() for c in value):
        return value.lower()
    if len(value) > 4:
        return value[: len(value) // 2] + " " + value[len(value) // 2:]
    return "number " + value


def _spoken(value, form):
    """How a user says a value in the family of forms ``form`` (id, enum, int, date, ids)."""
    if form == "id" and isinstance(value, str):
        return _sloppy(value)
    if form == "ids" and isinstance(value, list):
        return " and ".join(_sloppy(x) if isinstance(x, str) else _say(x) for x in value)
    if form == "enum" and isinstance(value, str):
        return value.replace("_", " ").capitalize()
    if form == "int" and isinstance(value, int) and 0 <= value < len(NUMBER_WORDS):
        return NUMBER_WORDS[value]
    if form == "date" and isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        y, m, d = value.split("-")
        if 1 <= int(m) <= 12:
            return "{} {}, {}".format(MONTHS[int(m) - 1], int(d), y)
    return _say(value)


def _norm(text):
    text = text.lower().replace("\u2019", "'").replace("_", " ")
    return " ".join(text.split())


def _mentions(text, value):
    return _norm(_say(value)) in _norm(text)


# --------------------------------------------------------------------------- validation


def _resolve(schema, root):
    for _ in range(10):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            break
        ref, node = schema["$ref"], root
        if not ref.startswith("#/"):
            return {}
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        schema = node
    return schema if isinstance(schema, dict) else {}


def _type_ok(kind, v):
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "null":
        return v is None
    if kind == "array":
        return isinstance(v, list)
    if kind == "object":
        return isinstance(v, dict)
    return True


def _tname(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _problems(schema, v, root, where, depth=0):
    """What is wrong with ``v`` under ``schema`` (a JSON-schema subset), as short sentences."""
    schema = _resolve(schema, root)
    if depth > 12 or not schema:
        return []
    out = []
    if "const" in schema and not _same(v, schema["const"]):
        out.append("{} must be {}".format(where, json.dumps(schema["const"])))
    if isinstance(schema.get("enum"), list) and not any(_same(v, e) for e in schema["enum"]):
        return out + ["{} must be one of {}".format(where, ", ".join(json.dumps(e) for e in schema["enum"]))]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            if all(_problems(o, v, root, where, depth + 1) for o in options):
                out.append("{} does not match any allowed form".format(where))
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else ([kind] if isinstance(kind, str) else [])
    if kinds and not any(_type_ok(k, v) for k in kinds):
        return out + ["{} must be of type {}, got {}".format(where, " or ".join(kinds), _tname(v))]
    if isinstance(v, str):
        if isinstance(schema.get("minLength"), int) and len(v) < schema["minLength"]:
            out.append("{} must have at least {} characters".format(where, schema["minLength"]))
        if isinstance(schema.get("maxLength"), int) and len(v) > schema["maxLength"]:
            out.append("{} must have at most {} characters".format(where, schema["maxLength"]))
    if _type_ok("number", v):
        if isinstance(schema.get("minimum"), (int, float)) and v < schema["minimum"]:
            out.append("{} must be at least {}".format(where, schema["minimum"]))
        if isinstance(schema.get("maximum"), (int, float)) and v > schema["maximum"]:
            out.append("{} must be at most {}".format(where, schema["maximum"]))
    if isinstance(v, list):
        if isinstance(schema.get("minItems"), int) and len(v) < schema["minItems"]:
            out.append("{} must have at least {} items".format(where, schema["minItems"]))
        if isinstance(schema.get("maxItems"), int) and len(v) > schema["maxItems"]:
            out.append("{} must have at most {} items".format(where, schema["maxItems"]))
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(v[:50]):
                out += _problems(schema["items"], item, root, "{}[{}]".format(where, i), depth + 1)
    if isinstance(v, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for k in schema.get("required") or []:
            if isinstance(k, str) and k not in v:
                out.append("{} is missing the field '{}'".format(where, k))
        extra = schema.get("additionalProperties", True)
        for k in sorted(v, key=str):
            if k in props:
                out += _problems(props[k], v[k], root, "{}.{}".format(where, k), depth + 1)
            elif extra is False:
                out.append("{} has the unexpected field {}".format(where, json.dumps(k)))
            elif isinstance(extra, dict):
                out += _problems(extra, v[k], root, "{}.{}".format(where, k), depth + 1)
    return out


def _check_args(tool, args):
    """Problems of a call's arguments: the schema's, and unknown parameters (as a Python
    function would reject them)."""
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") or {}
    out = ["missing required argument '{}'".format(k) for k in params.get("required") or [] if k not in args]
    for k in sorted(args, key=str):
        if k not in props:
            out.append("unexpected argument {}".format(json.dumps(k)))
        else:
            out += _problems(props[k], args[k], params, "'{}'".format(k))
    return out


def _call(name, args, n):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_{}".format(n), "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}]}


def _text(content):
    return {"role": "assistant", "content": content}


# --------------------------------------------------------------------------- the world

TOOL_BY_NAME = {t["function"]["name"]: t for t in TOOLS}
KEY = PLAN["key"]
NOUN = PLAN["noun"]
OWNER = PLAN["owner"]


def _skill(rng):
    """This episode's sub-skill, drawn with the SKILLS weights."""
    return rng.choices(list(SKILLS), weights=list(SKILLS.values()))[0]


def _allow_write(rng, rec):
    """Give ``rec`` a status the write is allowed on, unless it has one. A family that tests another
    skill must not ask for a write the target's policy forbids (that would teach the agent to skip
    the precondition check)."""
    if rec["status"] not in PLAN["ok_statuses"]:
        rec["status"] = rng.choice(PLAN["ok_statuses"])


def _callers_record(rng, w):
    """One of the caller's records (any record when the target has no owners), with a status the
    write is allowed on (``_allow_write``): (key, record)."""
    mine = [k for k, r in w["entities"].items() if not OWNER or r[OWNER["param"]] == w["caller"]]
    key = rng.choice(mine)
    _allow_write(rng, w["entities"][key])
    return key, w["entities"][key]


def _others_record(rng, w):
    """A record of an owner other than the caller (there is one: see _base_world)."""
    theirs = [k for k, r in w["entities"].items() if r[OWNER["param"]] != w["caller"]]
    key = rng.choice(theirs)
    return key, w["entities"][key]


def _base_world(rng, n_entities, n_owners=None):
    """Owners (when the target has them) and entities with a status and a descriptor; the caller
    is owner 0 and owns at least three entities."""
    taken = []
    w = {"entities": {}, "owners": {}, "caller": None, "taken": taken}
    owner_ids, names = [], []
    if OWNER:
        for _ in range(n_owners or rng.randint(3, 4)):
            person = _person(rng)
            while person["full_name"] in names:
                person = _person(rng)
            names.append(person["full_name"])
            oid = _gen(OWNER["id"], rng, taken, person)
            rec = {OWNER["param"]: oid, "name": person["full_name"]}
            for param, field in OWNER["identity"].items():
                rec[param] = person[field]
            rec[OWNER["list_field"]] = []
            w["owners"][oid] = rec
            owner_ids.append(oid)
        w["caller"] = owner_ids[0]
    descriptors = list(PLAN["descriptors"])
    rng.shuffle(descriptors)
    for i in range(n_entities):
        key = _gen(PLAN["params"][KEY], rng, taken)
        rec = {KEY: key}
        if OWNER:
            oid = owner_ids[0] if i < 3 else (owner_ids[1] if i == 3 else rng.choice(owner_ids))
            rec[OWNER["param"]] = oid
            w["owners"][oid][OWNER["list_field"]].append(key)
        rec["status"] = rng.choice(PLAN["statuses"])
        field = PLAN["descriptor_field"]
        rec[field] = descriptors[i % len(descriptors)] if field != "name" else _person(rng)["full_name"]
        w["entities"][key] = rec
    return w


def _expected(rng, w, rec, optional=None):
    """The arguments of the write for entity ``rec``: its key, its owner, drawn values."""
    args = {}
    names = list(PLAN["required"])
    if optional is None:
        optional = [p for p in PLAN["optional"] if rng.random() < 0.5] or PLAN["optional"][:1]
    for p in names + [p for p in optional if p not in names]:
        if p == KEY:
            args[p] = rec[KEY]
        elif OWNER and p == OWNER["param"]:
            args[p] = rec[OWNER["param"]]
        else:
            args[p] = _gen(PLAN["params"][p], rng, w["taken"])
    return args


def _details(args, forms=None, skip=()):
    """The arguments other than the key, as a user states them."""
    parts = []
    for p, v in args.items():
        if p == KEY or p in skip:
            continue
        said = _spoken(v, forms.get(p, "plain")) if forms else _say(v)
        parts.append("{}: {}".format(PLAN["titles"].get(p, p), said))
    return ("Details: " + "; ".join(parts) + ".") if parts else ""


def _please(key_text, details=""):
    """"please <action> for my <noun> <id>. Details: ..." """
    return "please {} for my {} {}. {}".format(PLAN["action"], NOUN, key_text, details).strip()


def _hello(w, always=False):
    """", I'm Name (my email address is ...)" when the caller must identify themselves: always
    for the families that check who asks, and whenever reading a record needs the owner's id."""
    if OWNER and (always or PLAN["reader"]["mode"] in ("owner", "key_owner")):
        return ", I'm {} ({})".format(w["owners"][w["caller"]]["name"], _identity(w, w["caller"]))
    return ""


def _identity(w, oid):
    """How the caller identifies themselves: the lookup's fields, else their owner id."""
    owner = w["owners"][oid]
    if OWNER and OWNER["identity"]:
        return ", ".join("my {} is {}".format(PLAN["identity_words"][p], owner[p]) for p in OWNER["identity"])
    if OWNER:
        return "my {} is {}".format(PLAN["titles"].get(OWNER["param"], OWNER["param"]), oid)
    return ""


def _read_args(w, key, n):
    """The reference's call that shows entity ``key``'s record."""
    reader = PLAN["reader"]
    mode = reader["mode"]
    if mode in ("key", "search"):
        args = {KEY: key}
    elif mode == "any_id":
        args = {"id": key}
    elif mode == "key_owner":
        args = {KEY: key, OWNER["param"]: w["caller"]}
    elif mode == "owner":
        args = {OWNER["param"]: w["caller"]}
    else:
        args = {}
    return _call(reader["tool"], args, n)


def _identify_calls(w, n):
    """The reference's calls that identify the caller (a lookup, else the owner's record)."""
    caller = w["owners"][w["caller"]]
    if OWNER["lookup"]:
        return [_call(OWNER["lookup"], {p: caller[p] for p in OWNER["identity"]}, n)]
    if OWNER["reader"]:
        return [_call(OWNER["reader"], {OWNER["reader_param"]: w["caller"]}, n)]
    return [_call(OWNER["listing"], {}, n)]


# --------------------------------------------------------------------------- the env


class BaseEnv:
    tools = TOOLS
    max_turns = 12
    _w = None

    # ------------------------------------------------------------------ contract

    def reset(self, seed):
        self._w = self._world(_rng(seed))
        self._sc = self._w["scenario"]
        self._turn, self._idle, self._done = 0, 0, False
        self._shown, self._owners_shown, self._identified = [], [], False
        self._s = {}
        self._start()
        system = POLICY + "".join("\n- " + rule for rule in self._sc.get("rules", []))
        obs = {"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": self._sc["opening"]}]}
        return obs, {"skill": self._sc["skill"]}

    def step(self, action):
        if self._w is None or self._done:
            return ({"messages": []}, 0.0, True, False,
                    {"skill": None if self._w is None else self._sc["skill"], "error": "no episode is running"})
        self._turn += 1
        messages, outcome = [], None
        if not isinstance(action, dict):
            messages.append(self._tool_msg("", "Error: an action must be an assistant message "
                                               "(an object with 'role', 'content', 'tool_calls')."))
        else:
            calls = action.get("tool_calls")
            if calls is None or calls == []:
                content = action.get("content")
                reply, outcome = self._on_text(content if isinstance(content, str) else "")
                if outcome is None and reply is None:
                    reply, outcome = self._idle_reply()
                messages.append({"role": "user", "content": reply})
            elif not isinstance(calls, list):
                messages.append(self._tool_msg("", "Error: 'tool_calls' must be a list of tool calls."))
            else:
                for call in calls:
                    call_id = call.get("id") if isinstance(call, dict) else None
                    call_id = call_id if isinstance(call_id, str) else ""
                    if outcome is not None:
                        text = "Error: not run; the conversation has ended."
                    else:
                        text, outcome = self._run(call)
                    messages.append(self._tool_msg(call_id, text))
        terminated = outcome is not None
        truncated = not terminated and self._turn >= self.max_turns
        info = {"skill": self._sc["skill"], "turn": self._turn}
        reward = 0.0
        if terminated or truncated:
            self._done = True
            reward = round(min(1.0, max(0.0, self._score(outcome or "none"))), 4)
            info["outcome"] = outcome or "none"
            info["score"] = reward
        return {"messages": messages}, reward, terminated, truncated, info

    # ------------------------------------------------------------------ tools

    def _tool_msg(self, call_id, text):
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def _run(self, call):
        """Run one tool call: (the tool message's text, an outcome or None to go on)."""
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            return "Error: a tool call needs a 'function' object with 'name' and 'arguments'.", None
        name = fn.get("name")
        tool = TOOL_BY_NAME.get(name) if isinstance(name, str) else None
        if tool is None:
            return "Error: unknown tool {}. Available tools: {}.".format(
                json.dumps(name, default=str)[:80], ", ".join(TOOL_BY_NAME)), None
        raw = fn.get("arguments")
        if isinstance(raw, dict):
            args = raw
        else:
            try:
                args = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
            except (ValueError, RecursionError):
                return "Error: the arguments of {} are not valid JSON.".format(name), None
        if not isinstance(args, dict):
            return "Error: the arguments of {} must be a JSON object.".format(name), None
        problems = _check_args(tool, args)
        if problems:
            return "Error: invalid arguments for {}: {}.".format(name, "; ".join(problems[:5])), None
        role = ROLES[name]
        kind = role["kind"]
        if kind == "write":
            rec = self._w["entities"].get(args.get(KEY))
            if rec is None:
                return "Error: {} {} not found.".format(NOUN, json.dumps(args.get(KEY))), None
            return self._on_write(args, rec)
        if kind == "escalation":
            return self._on_transfer(args)
        if kind == "lookup":
            return self._lookup(args, role), None
        if kind == "listing":
            return self._listing(), None
        if kind == "owner":
            return self._owner_read(args.get(role["param"]), role), None
        return self._entity_read(args, role), None

    def _show(self, rec):
        if rec[KEY] not in self._shown:
            self._shown.append(rec[KEY])
        return rec

    def _show_owner(self, oid, embed):
        owner = dict(self._w["owners"][oid])
        if oid not in self._owners_shown:
            self._owners_shown.append(oid)
        if oid == self._w["caller"]:
            self._identified = True
        if embed:
            owner[OWNER["list_field"]] = [self._show(self._w["entities"][k]) for k in owner[OWNER["list_field"]]]
        return owner

    def _entity_read(self, args, role):
        w = self._w
        mode = role["mode"]
        if mode == "search":
            found = []
            for rec in w["entities"].values():
                ok = True
                for k, v in sorted(args.items()):
                    if k not in rec:
                        continue
                    if isinstance(v, str) and isinstance(rec[k], str) and k != KEY:
                        ok = ok and _norm(v) in _norm(rec[k])
                    else:
                        ok = ok and _same(v, rec[k])
                if ok:
                    found.append(self._show(rec))
            return json.dumps(found)
        key = args.get("id") if mode == "any_id" else args.get(KEY)
        if mode == "any_id" and OWNER and key in w["owners"]:
            return json.dumps(self._show_owner(key, False))
        rec = w["entities"].get(key)
        if rec is None:
            return "Error: {} {} not found.".format(NOUN if mode != "any_id" else "id", json.dumps(key))
        if mode == "key_owner" and rec[OWNER["param"]] != args.get(OWNER["param"]):
            self._show(rec)  # what the check needed to learn: it is not theirs
            return "Error: {} {} does not belong to {} {}.".format(
                NOUN, key, OWNER["noun"], json.dumps(args.get(OWNER["param"])))
        return json.dumps(self._show(rec))

    def _owner_read(self, oid, role):
        if not OWNER or oid not in self._w["owners"]:
            return "Error: {} {} not found.".format(OWNER["noun"] if OWNER else "record", json.dumps(oid))
        return json.dumps(self._show_owner(oid, role.get("embed", False)))

    def _listing(self):
        if OWNER:
            return json.dumps([self._show_owner(oid, True) for oid in self._w["owners"]])
        return json.dumps([self._show(rec) for rec in self._w["entities"].values()])

    def _lookup(self, args, role):
        for oid, owner in self._w["owners"].items():
            if all(isinstance(v, str) and _norm(v) == _norm(str(owner.get(k, ""))) for k, v in args.items()):
                if oid == self._w["caller"]:
                    self._identified = True
                if role.get("returns") == "record":
                    return json.dumps(self._show_owner(oid, False))
                return oid
        return "Error: no {} matches {}.".format(OWNER["noun"], ", ".join(
            "{} {}".format(k, json.dumps(v)) for k, v in sorted(args.items())))

    # ------------------------------------------------------------------ the user

    def _request(self):
        return self._sc["request"]

    def _idle_reply(self):
        self._idle += 1
        if self._idle >= MAX_IDLE:
            return "I don't have time for this. I'll try again later. Bye.", "user_left"
        return "As I said: " + self._request(), None

    # ------------------------------------------------------------------ family hooks

    def _start(self):
        pass

    def _on_text(self, text):
        return None, None

    def _on_write(self, args, rec):
        return "Done.", "write"

    def _on_transfer(self, args):
        return "Transfer successful. A human agent will take over the conversation.", "transfer"

    def _score(self, outcome):
        return 0.0
