"""Tool classification for the template synthesizer: which of a target's tools read and which
write, which id parameters they share, who owns what, and how to generate a plausible value for
every parameter. Everything here is derived from the tool schemas (and ``agent_tools.meta.json``
where the target has one), never from a list of known targets.

- **Kind** of a tool: read / write / escalation / other, from the metadata's ``tool_type`` or
  ``mutates_state``, else from the name (``get_``/``find_``/``search_`` read; ``cancel_``/
  ``update_``/``modify_``... write; see :func:`envforge.tools.tool_kind`), else from the first
  verb of the description.
- **Id parameters**: ``id`` or ``*_id`` of type string. The *entity* a write acts on is its id
  parameter whose stem is in the tool's name (``line_id`` of ``suspend_line``), else its first
  id parameter that does not name an owner (``user_id``, ``customer_id``, ...).
- **Readers** of an entity, best first: a read tool taking just its id (``get_order_details``),
  a read tool taking a generic ``id`` (``get_details_by_id``), a read tool taking its id and its
  owner's id, a search tool where its id is optional (``search_contacts``), the owner's reader
  when no other tool shows the entity (its records are embedded), a listing (``get_users``).
- **Owners**: an owner-like id parameter (user, customer, employee, account, ...) that a read tool
  takes alone (``get_user_details``) or that a listing exposes; **lookups** are read tools whose
  required parameters are all non-id strings and whose name mentions the owner
  (``find_user_id_by_email``, ``get_customer_by_phone``).
- **Recipes**: a JSON-ready description of how to draw a value for a parameter (an id pattern
  learnt from the description's example, an enum, an int range, a date, a name, an email...),
  rendered into env.py and interpreted there with ``random.Random(seed)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from envforge.targets import Target
from envforge.tools import tool_kind

OWNER_STEMS = ("user", "customer", "employee", "account", "member", "client", "patient", "guest",
               "owner", "person", "subscriber", "student", "profile")
IDENTITY_FIELDS = {  # lookup parameter name -> the field of a synthetic person it asks for
    "email": "email", "email_address": "email", "mail": "email",
    "first_name": "first_name", "firstname": "first_name", "given_name": "first_name",
    "last_name": "last_name", "lastname": "last_name", "surname": "last_name", "family_name": "last_name",
    "full_name": "full_name", "name": "full_name", "fullname": "full_name",
    "zip": "zip", "zip_code": "zip", "zipcode": "zip", "postal_code": "zip", "postcode": "zip",
    "phone": "phone_number", "phone_number": "phone_number", "phone_no": "phone_number", "mobile": "phone_number",
    "dob": "dob", "date_of_birth": "dob", "birth_date": "dob", "birthday": "dob",
}
IDENTITY_WORDS = {"email": "email address", "first_name": "first name", "last_name": "last name",
                  "full_name": "full name", "zip": "zip code", "phone_number": "phone number",
                  "dob": "date of birth"}


def is_id_param(name: str) -> bool:
    return name == "id" or name.endswith("_id")


def stem(param: str) -> str:
    """``order_id`` -> ``order``; ``id`` -> ``record``."""
    s = param[:-3] if param.endswith("_id") else param
    return s or "record"


def is_owner_like(param: str) -> bool:
    s = stem(param)
    return any(s == o or s.endswith("_" + o) for o in OWNER_STEMS)


# ============================================================================= tools


@dataclass
class Tool:
    name: str
    schema: dict                    # the target's full OpenAI tool dict, unchanged
    kind: str                       # read / write / escalation / other
    params: dict[str, dict]         # parameter name -> its (unresolved) schema
    required: list[str]
    description: str = ""

    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters") or {}

    @property
    def id_params(self) -> list[str]:
        return [p for p in self.params if is_id_param(p) and _kind(self.resolve(self.params[p])) == "string"]

    def resolve(self, schema: Any) -> dict:
        return resolve(schema, self.parameters)

    def title(self, param: str) -> str:
        s = self.resolve(self.params.get(param, {}))
        t = s.get("title") or self.params.get(param, {}).get("title")
        return t if isinstance(t, str) and t else param.replace("_", " ")


def resolve(schema: Any, root: dict, depth: int = 0) -> dict:
    """Follow ``$ref`` (into ``$defs``/``definitions``) until a schema without one."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 10:
        ref, node = schema["$ref"], root
        if not ref.startswith("#/"):
            return {}
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        schema, depth = node, depth + 1
    return schema if isinstance(schema, dict) else {}


def _kind(schema: dict) -> str | None:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None and "enum" in schema and schema["enum"]:
        v = schema["enum"][0]
        return "string" if isinstance(v, str) else None
    return t


def tools_of(target: Target) -> dict[str, Tool]:
    out = {}
    for t in target.tools:
        fn = t["function"]
        params = (fn.get("parameters") or {}).get("properties") or {}
        required = [r for r in (fn.get("parameters") or {}).get("required") or [] if r in params]
        out[fn["name"]] = Tool(fn["name"], t, tool_kind(fn["name"], target.meta, fn.get("description", "")),
                               {k: v if isinstance(v, dict) else {} for k, v in params.items()},
                               required, fn.get("description") or "")
    return out


# ============================================================================= value recipes

FIRST = ["Dana", "Ravi", "Mei", "Tomas", "Aisha", "Jonas", "Lucia", "Kwame", "Ingrid", "Omar",
         "Priya", "Felix", "Hana", "Diego", "Noor", "Sven", "Amara", "Yusuf", "Elena", "Kenji"]
LAST = ["Kim", "Patel", "Novak", "Okafor", "Lindqvist", "Haddad", "Moreau", "Tanaka", "Silva",
        "Brennan", "Adeyemi", "Kowalski", "Ferreira", "Nakamura", "Rahman", "Dubois", "Weber"]
PHRASES = {
    "reason": ["travelling abroad for two months", "no longer needed", "ordered by mistake",
               "found a better option", "moving to a new city", "device was lost",
               "budget cut this quarter", "duplicate request"],
    "title": ["Quarterly budget review", "Renew car insurance", "Book dentist appointment",
              "Draft project proposal", "Call the landlord", "Plan team offsite",
              "Submit expense report", "Fix the garden fence"],
    "content": ["Pick up the dry cleaning", "Buy groceries for the weekend", "Call mom back",
                "Water the plants", "Send the signed contract", "Pay the electricity bill",
                "Return the library books", "Schedule the car service"],
    "summary": ["Customer needs help the tools cannot provide", "Billing dispute over a past charge",
                "Account access problem after a phone change", "Request outside the policy"],
    "resolution": ["Reset completed and verified with the user", "Duplicate of an earlier ticket",
                   "Resolved by updating the configuration", "User confirmed the issue is gone"],
    "address1": ["12 Maple Street", "481 Oak Avenue", "77 Harbor Road", "905 Pine Lane",
                 "3 Elm Court", "260 River Drive"],
    "address2": ["Apt 4B", "Suite 210", "Unit 7", "Floor 3", "Apt 12"],
    "city": ["Springfield", "Riverton", "Lakeside", "Fairview", "Georgetown", "Ashland"],
    "state": ["CA", "NY", "TX", "WA", "IL", "OR", "MA", "CO"],
    "country": ["USA"],
    "relationship": ["friend", "sister", "brother", "colleague", "mother", "father", "neighbor"],
    "currency": ["USD", "EUR", "GBP", "JPY", "CAD", "CHF", "AUD"],
    "unit": ["km", "mile", "kg", "pound", "meter", "foot"],
    "location": ["Central Park", "the train station", "the city library", "the airport",
                 "the farmers market"],
    "query": ["Apple", "Microsoft", "Nvidia", "Tesla", "Amazon"],
    "text": ["blue garden hose", "red desk lamp", "green travel mug", "black rain jacket",
             "white coffee grinder", "silver bike lock", "yellow beach towel", "grey wool scarf",
             "orange tennis balls", "purple yoga mat", "brown leather wallet", "pink phone case"],
}
_PHRASE_KEYS = [("reason", "reason"), ("resolution", "resolution"), ("summary", "summary"),
                ("title", "title"), ("content", "content"), ("message", "content"),
                ("note", "content"), ("comment", "content"), ("description", "text"),
                ("address1", "address1"), ("address2", "address2"), ("city", "city"),
                ("state", "state"), ("country", "country"), ("relationship", "relationship"),
                ("currency", "currency"), ("unit", "unit"), ("location", "location"),
                ("query", "query"), ("label", "text"), ("tag", "text")]


def _examples(description: str) -> list[str]:
    """Quoted examples in a description: ``such as 'ZFA04Y'`` -> ['ZFA04Y']."""
    return re.findall(r"'([^'\n]{1,60})'", description or "")


def id_pattern(example: str, person: bool = False) -> list:
    """A pattern (literal runs and ``["d", n]`` / ``["A", n]`` classes) that draws ids like
    ``example``: with 3+ digits the letters stay (``#W0000000`` -> ``#W`` + 7 digits), else
    upper-case letters and digits are both drawn (``ZFA04Y``). A person's id shaped like a name
    (``sara_doe_496``) draws first and last names (``["f", 1]``, ``["l", 1]``)."""
    m = re.fullmatch(r"([a-z]+)_([a-z]+)_(\d+)", example) if person else None
    if m:
        return [["f", 1], "_", ["l", 1], "_", ["d", len(m[3])]]
    keep_letters = sum(c.isdigit() for c in example) >= 3
    out: list = []
    for c in example:
        cls = "d" if c.isdigit() else ("A" if c.isupper() and not keep_letters else None)
        if cls and out and isinstance(out[-1], list) and out[-1][0] == cls:
            out[-1][1] += 1
        elif cls:
            out.append([cls, 1])
        elif out and isinstance(out[-1], str):
            out[-1] += c
        else:
            out.append(c)
    return out


def _looks_like_id(example: str) -> bool:
    return bool(re.fullmatch(r"[#A-Za-z0-9_\-]{3,40}", example)) and any(c.isdigit() for c in example)


def id_recipe(param: str, description: str) -> dict:
    examples = [e for e in _examples(description) if _looks_like_id(e)]
    if examples:
        return {"t": "id", "patterns": [id_pattern(e, is_owner_like(param)) for e in dict.fromkeys(examples)]}
    s = stem(param)
    prefix = "".join(w[0] for w in s.split("_")).upper() if "_" in s else s[:3].upper()
    return {"t": "id", "patterns": [[prefix + "-", ["d", 5]]]}


def recipe(name: str, schema: dict, root: dict, description: str = "", depth: int = 0) -> dict:
    """How to draw a value for parameter ``name`` with ``schema`` (JSON-ready)."""
    schema = resolve(schema, root)
    desc = schema.get("description") or description or ""
    if depth > 5:
        return {"t": "const", "value": None}
    if "const" in schema:
        return {"t": "const", "value": schema["const"]}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return {"t": "choice", "values": list(schema["enum"]), "enum": True}
    for key in ("anyOf", "oneOf"):
        options = [resolve(o, root) for o in schema.get(key) or []]
        options = [o for o in options if o.get("type") != "null"]
        if options:  # the most specific option: one with properties, else the first
            best = next((o for o in options if o.get("properties")), options[0])
            return recipe(name, {**best, "description": best.get("description") or desc}, root,
                          desc, depth + 1)
    kind = _kind(schema)
    low = name.lower()
    if kind == "array":
        items = resolve(schema.get("items") or {}, root)
        lo = max(1, int(schema.get("minItems") or 1))
        hi = max(lo, min(int(schema.get("maxItems") or 2), 2))
        item_name = low[:-1] if low.endswith("s") else low
        return {"t": "array", "min": lo, "max": hi, "items": recipe(item_name, items, root, desc, depth + 1)}
    if kind == "object" or (kind is None and schema.get("properties")):
        props = schema.get("properties") or {}
        required = [p for p in schema.get("required") or [] if p in props] or list(props)[:2]
        return {"t": "object", "props": {p: recipe(p, props[p], root, "", depth + 1) for p in required}}
    if kind == "boolean":
        return {"t": "bool"}
    if kind == "integer":
        lo = schema.get("minimum", 1 if "amount" not in low else 50)
        hi = schema.get("maximum", lo + (8 if "amount" not in low else 450))
        return {"t": "int", "min": int(lo), "max": int(max(lo, hi))}
    if kind == "number":
        if "lat" in low:
            return {"t": "num", "min": 25.0, "max": 48.0, "digits": 4}
        if "lon" in low or "lng" in low:
            return {"t": "num", "min": -122.0, "max": -71.0, "digits": 4}
        if "timestamp" in low or low.endswith("_time"):
            return {"t": "timestamp"}
        lo = float(schema.get("minimum", 1.0))
        hi = float(schema.get("maximum", lo + 9.0))
        return {"t": "num", "min": lo, "max": hi, "digits": 1}
    # strings (and untyped)
    if low in IDENTITY_FIELDS:
        return {"t": "person", "field": IDENTITY_FIELDS[low]}
    if "date" in low or "dob" in low or "YYYY-MM-DD" in desc:
        return {"t": "date"}
    if is_id_param(low) or low.endswith("_ids") or low.endswith("_number") and "phone" not in low:
        return id_recipe(low.removesuffix("s") if low.endswith("_ids") else low, desc)
    if "phone" in low:
        return {"t": "person", "field": "phone_number"}
    if "email" in low:
        return {"t": "person", "field": "email"}
    if low.endswith("name"):
        return {"t": "person", "field": "full_name"}
    quoted = [e for e in dict.fromkeys(_examples(desc)) if not _looks_like_id(e)]
    if len(quoted) >= 2:
        return {"t": "choice", "values": quoted, "quoted": True}
    for key, pool in _PHRASE_KEYS:
        if key in low:
            return {"t": "choice", "values": PHRASES[pool]}
    return {"t": "choice", "values": PHRASES["text"]}


def form(rec: dict) -> str:
    """How the user may say a value in another form (tool-call argument precision)."""
    t = rec.get("t")
    if t == "id":
        return "id"
    if t == "choice" and rec.get("enum") and all(isinstance(v, str) for v in rec["values"]):
        return "enum"
    if t == "int":
        return "int"
    if t == "date":
        return "date"
    if t == "array" and rec["items"].get("t") == "id":
        return "ids"
    return "plain"


# ============================================================================= the plan


class Unsupported(Exception):
    """The target's tools cannot support a family; the message says what is missing."""


@dataclass
class Reader:
    tool: str
    mode: str      # key / any_id / key_owner / search / owner / listing
    param: str | None = None


@dataclass
class Owner:
    param: str                       # user_id
    noun: str                        # user
    list_field: str                  # the owner record's field listing entity ids ("orders")
    id_recipe: dict
    reader: str | None = None        # get_user_details
    reader_param: str | None = None  # the parameter the reader takes (user_id, or id)
    lookup: str | None = None        # find_user_id_by_email
    lookup_fields: dict = field(default_factory=dict)  # lookup param -> person field
    lookup_returns: str = "id"       # id (a bare id string) or record
    listing: str | None = None       # get_users


@dataclass
class Candidate:
    write: Tool
    key: str
    reader: Reader
    owner: Owner | None


class Catalog:
    """A target's tools, classified, with the entities, owners and readers they imply."""

    def __init__(self, target: Target):
        self.target = target
        self.tools = tools_of(target)
        self.reads = [t for t in self.tools.values() if t.kind == "read"]
        self.writes = [t for t in self.tools.values() if t.kind == "write"]
        self.escalation = next((t.name for t in self.tools.values() if t.kind == "escalation"), None)

    # ------------------------------------------------------------------ entities

    def entity_key(self, w: Tool) -> str | None:
        ids = [p for p in w.id_params if p in w.required]
        if not ids:
            return None
        named = [p for p in ids if stem(p) in w.name]
        if named:
            return named[0]
        plain = [p for p in ids if not is_owner_like(p)]
        return (plain or ids)[0]

    def owner_for(self, key: str, w: Tool | None = None) -> Owner | None:
        """The owner model for entities keyed by ``key``: an owner-like id parameter with a
        reader (or a listing) that exposes its records."""
        names = []
        if w is not None:
            names += [p for p in w.id_params if p != key and is_owner_like(p)]
        for t in self.tools.values():
            names += [p for p in t.id_params if p != key and is_owner_like(p)]
        for o in dict.fromkeys(names):
            reader = next((t for t in self.reads if t.required == [o] and list(t.params) == [o]), None)
            listing = next((t for t in self.reads if not t.params and stem(o) in t.name
                            and t.name.rstrip("s") != t.name), None)
            if reader is None and listing is None:
                continue
            generic = self.any_id_reader()
            own = Owner(param=o, noun=stem(o).replace("_", " "), list_field=_plural(stem(key)),
                        id_recipe=id_recipe(o, self._param_description(o)),
                        reader=reader.name if reader else (generic.name if generic else None),
                        reader_param=o if reader else ("id" if generic else None),
                        listing=listing.name if listing else None)
            lookup = self.lookup_for(o)
            if lookup is not None:
                own.lookup = lookup.name
                own.lookup_fields = {p: IDENTITY_FIELDS[p.lower()] for p in lookup.required}
                own.lookup_returns = "id" if "_id" in lookup.name else "record"
            return own
        return None

    def lookup_for(self, owner_param: str) -> Tool | None:
        s = stem(owner_param)
        found = [t for t in self.reads if t.required and s in t.name
                 and all(not is_id_param(p) and p.lower() in IDENTITY_FIELDS for p in t.required)
                 and set(t.params) == set(t.required)]
        # prefer one field, and an email above the rest
        found.sort(key=lambda t: (len(t.required), "email" not in " ".join(t.required)))
        return found[0] if found else None

    def any_id_reader(self) -> Tool | None:
        return next((t for t in self.reads if t.required == ["id"] and list(t.params) == ["id"]), None)

    def _param_description(self, param: str) -> str:
        for t in self.tools.values():
            if param in t.params:
                d = t.resolve(t.params[param]).get("description")
                if d:
                    return d
        return ""

    def reader_for(self, key: str, owner: Owner | None) -> Reader | None:
        by_key = [t for t in self.reads if t.required == [key] and list(t.params) == [key]]
        if by_key:
            return Reader(by_key[0].name, "key", key)
        generic = self.any_id_reader()
        if generic:
            return Reader(generic.name, "any_id", "id")
        if owner is not None:
            both = [t for t in self.reads if set(t.required) == {key, owner.param}]
            if both:
                return Reader(both[0].name, "key_owner", key)
        search = [t for t in self.reads if key in t.params and key not in t.required and not t.required]
        if search:
            return Reader(search[0].name, "search", key)
        if owner is not None and owner.reader and owner.reader_param == owner.param:
            return Reader(owner.reader, "owner", owner.param)
        if owner is not None:
            return Reader(owner.listing, "listing", None) if owner.listing else None
        listing = [t for t in self.reads if not t.params]
        if listing and stem(key) in listing[0].name:
            return Reader(listing[0].name, "listing", None)
        return None

    def candidates(self) -> list[Candidate]:
        out = []
        for w in self.writes:
            key = self.entity_key(w)
            if key is None:
                continue
            owner = self.owner_for(key, w)
            reader = self.reader_for(key, owner)
            if reader is None:
                continue
            out.append(Candidate(w, key, reader, owner))
        return out

    def search_fields(self, reader: Reader, key: str) -> list[str]:
        """String parameters of a search reader that can describe an entity (``name``)."""
        if reader.mode != "search":
            return []
        t = self.tools[reader.tool]
        return [p for p, s in t.params.items() if p != key and not is_id_param(p)
                and _kind(t.resolve(s)) == "string" and "enum" not in t.resolve(s)]

    def describe(self) -> str:
        """What was found, for error messages."""
        reads = ", ".join(t.name for t in self.reads) or "none"
        writes = ", ".join(f"{t.name}({', '.join(t.id_params) or 'no id parameter'})"
                           for t in self.writes) or "none"
        return f"read tools: {reads}; write tools: {writes}"


def _plural(noun: str) -> str:
    if noun.endswith("s"):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def complexity(w: Tool) -> int:
    """How hard a write's arguments are to state: arrays and objects count most."""
    score = 0
    for p in w.required:
        s = w.resolve(w.params[p])
        k = _kind(s) or ("object" if s.get("anyOf") else None)
        score += {"array": 3, "object": 4}.get(k, 1)
    return score


def transformable(w: Tool, key: str) -> int:
    """How many of a write's arguments a user can say in another form (precision)."""
    n = 0
    root = w.parameters
    for p in w.required:
        f = form(recipe(p, w.params[p], root))
        n += {"id": 2, "enum": 2, "int": 2, "date": 2, "ids": 1}.get(f, 0)
        if f == "plain" and _kind(w.resolve(w.params[p])) in ("array", "object"):
            n -= 2
    return n


# ============================================================================= for the families
# What a family's ``preference`` and the plan ask of a candidate write.

STATUS_WORDS = ("pending", "active", "open", "processed", "delivered", "suspended", "closed",
                "cancelled", "completed", "expired", "on_hold", "archived", "locked", "in_progress")
DESTRUCTIVE = ("cancel", "remove", "delete", "suspend", "close", "return", "refund", "revoke",
               "disable", "terminate", "exchange")


def recipes(c: Candidate) -> dict[str, dict]:
    """The value recipe of each parameter of the candidate's write."""
    root = c.write.parameters
    return {p: recipe(p, s, root) for p, s in c.write.params.items()}


def free_params(c: Candidate) -> list[str]:
    """Parameters of the write other than the entity's and the owner's id."""
    own = c.owner.param if c.owner else None
    return [p for p in c.write.params if p not in (c.key, own)]


def amendable(c: Candidate, recipes: dict) -> list[str]:
    """Free parameters a user can ask another value of (more than one value to draw)."""
    return [p for p in free_params(c) if recipes[p]["t"] not in ("const",)
            and not (recipes[p]["t"] == "choice" and len(recipes[p]["values"]) < 2)]


def rule_params(c: Candidate, recipes: dict) -> list[str]:
    """Required free parameters a policy rule can forbid a value of, or limit."""
    out = []
    for p in free_params(c):
        if p not in c.write.required:
            continue
        r = recipes[p]
        if r["t"] == "choice" and (r.get("enum") or r.get("quoted")) and len(r["values"]) >= 2:
            out.append(p)
        elif r["t"] in ("int", "num") and r["max"] - r["min"] >= 3:
            out.append(p)
    return out


def gather_path(c: Candidate, catalog: Catalog) -> str | None:
    """How a record the user only describes is found: owner, search, listing (None: no way)."""
    if c.owner is not None and (c.owner.lookup or c.owner.reader or c.owner.listing):
        return "owner"
    if c.reader.mode == "search" and catalog.search_fields(c.reader, c.key):
        return "search"
    if c.reader.mode == "listing":
        return "listing"
    return None


def base_preference(c: Candidate) -> float:
    """What every family prefers: simple arguments, and an entity that is not itself a person."""
    return -complexity(c.write) + (0 if is_owner_like(c.key) else 3)


def destructive(c: Candidate) -> bool:
    return any(d in c.write.name for d in DESTRUCTIVE)
