"""The template synthesizer: an env.py for any target whose tools it can classify, offline.

For a family (``families.py``) and a target, :func:`plan` picks the few target tools the family
needs (a write tool acting on an entity by an id parameter, a tool that shows that entity, and,
where the family uses them, an owner lookup, an owner reader or a transfer to a human), and
:func:`render` writes a self-contained env.py: the target's schemas of those tools copied exactly,
the plan (roles of the tools, value recipes, statuses, titles) as literals, the shared runtime
(``envsrc/common.py``: validation against the schemas, a seeded synthetic database, the
dispatcher, the scripted user) and the family's class (``envsrc/<family>.py``: scenario, user,
partial-credit reward, reference ``solve``). The file imports only ``json``, ``random`` and ``re``.

A target that cannot support a family raises :class:`~envforge.synth.classify.Unsupported` naming
what is missing.
"""
from __future__ import annotations

import json
import pprint
import re
import textwrap
from pathlib import Path

from envforge.synth.classify import (IDENTITY_WORDS, OWNER_STEMS, PHRASES, Candidate, Catalog,
                                     Unsupported, complexity, form, is_owner_like, recipe, stem,
                                     transformable)
from envforge.synth.families import BY_SLUG, Family
from envforge.targets import Target

SOURCES = Path(__file__).parent / "envsrc"
STATUS_WORDS = ("pending", "active", "open", "processed", "delivered", "suspended", "closed",
                "cancelled", "completed", "expired", "on_hold", "archived", "locked", "in_progress")
DESTRUCTIVE = ("cancel", "remove", "delete", "suspend", "close", "return", "refund", "revoke",
               "disable", "terminate", "exchange")
VERBS = ("add", "cancel", "change", "close", "create", "delete", "disable", "enable", "extend",
         "get", "grant", "modify", "remove", "reset", "resume", "send", "set", "suspend", "update")


# ============================================================================= choosing tools


def _noun(key: str, write: str) -> str:
    s = stem(key).replace("_", " ")
    last = write.split("_")[-1]
    if s in OWNER_STEMS and last not in VERBS and stem(key) not in write:
        return last
    return s


def _action(write: str) -> str:
    return write.replace("_", " ")


def _params(c: Candidate) -> dict[str, dict]:
    root = c.write.parameters
    return {p: recipe(p, s, root) for p, s in c.write.params.items()}


def _free(c: Candidate) -> list[str]:
    """Parameters of the write other than the entity's and the owner's id."""
    own = c.owner.param if c.owner else None
    return [p for p in c.write.params if p not in (c.key, own)]


def _amendable(c: Candidate, recipes: dict) -> list[str]:
    return [p for p in _free(c) if recipes[p]["t"] not in ("const",)
            and not (recipes[p]["t"] == "choice" and len(recipes[p]["values"]) < 2)]


def _rule_params(c: Candidate, recipes: dict) -> list[str]:
    out = []
    for p in _free(c):
        if p not in c.write.required:
            continue
        r = recipes[p]
        if r["t"] == "choice" and (r.get("enum") or r.get("quoted")) and len(r["values"]) >= 2:
            out.append(p)
        elif r["t"] in ("int", "num") and r["max"] - r["min"] >= 3:
            out.append(p)
    return out


def _gather_path(c: Candidate, catalog: Catalog) -> str | None:
    if c.owner is not None and (c.owner.lookup or c.owner.reader or c.owner.listing):
        return "owner"
    if c.reader.mode == "search" and catalog.search_fields(c.reader, c.key):
        return "search"
    if c.reader.mode == "listing":
        return "listing"
    return None


def _preference(family: str, c: Candidate, catalog: Catalog) -> float | None:
    """How well a candidate suits a family (higher is better; None: it cannot)."""
    recipes = _params(c)
    base = -complexity(c.write) + (0 if is_owner_like(c.key) else 3)
    name = c.write.name
    if family == "precondition_verification":
        return base + 3 * any(s in name for s in STATUS_WORDS) + any(d in name for d in DESTRUCTIVE)
    if family == "confirmation_before_write":
        return base + 2 * bool(_amendable(c, recipes)) + any(d in name for d in DESTRUCTIVE)
    if family == "argument_precision":
        n = transformable(c.write, c.key)
        return 3 * n + base + (2 if len(c.write.required) >= 2 else -4)
    if family == "policy_adherence":
        return base + 3 * bool(_rule_params(c, recipes))
    if family == "structured_data_reasoning":
        return base
    if family == "information_gathering":
        path = _gather_path(c, catalog)
        if path is None:
            return None
        return base + {"owner": 3, "search": 2, "listing": 1}[path] + 2 * bool(c.owner and c.owner.lookup)
    raise ValueError(family)


def choose(family: Family, catalog: Catalog) -> Candidate:
    cands = catalog.candidates()
    if not cands:
        raise Unsupported(
            f"target {catalog.target.name} has no write tool that acts on a record by a required id "
            "parameter (such as order_id) together with a read tool that shows that record "
            f"(a get_*(id), a search, an owner's details or a listing); found {catalog.describe()}")
    scored = [(s, -i, c) for i, c in enumerate(cands)
              if (s := _preference(family.slug, c, catalog)) is not None]
    if not scored:
        raise Unsupported(
            f"target {catalog.target.name} cannot support {family.name!r}: it needs a way to find a "
            "record the user only describes (an owner lookup or details tool listing the user's "
            "records, a search tool, or a listing); found " + catalog.describe())
    return max(scored, key=lambda x: (x[0], x[1]))[2]


# ============================================================================= the plan


def _owner_dict(c: Candidate, with_lookup: bool) -> dict | None:
    o = c.owner
    if o is None:
        return None
    return {"param": o.param, "noun": o.noun, "list_field": o.list_field, "id": o.id_recipe,
            "identity": dict(o.lookup_fields) if with_lookup and o.lookup else {},
            "lookup": o.lookup if with_lookup else None, "lookup_returns": o.lookup_returns,
            "reader": o.reader, "reader_param": o.reader_param, "listing": o.listing}


def plan(family: Family | str, target: Target, catalog: Catalog | None = None) -> dict:
    """Everything the rendered env needs: tools, roles, recipes, skills, policy, docstring."""
    family = BY_SLUG[family] if isinstance(family, str) else family
    catalog = catalog or Catalog(target)
    c = choose(family, catalog)
    slug = family.slug
    recipes = _params(c)
    free = _free(c)
    required_free = [p for p in free if p in c.write.required]
    optional = [p for p in free if p not in c.write.required] if not required_free else []
    owner_tools = slug in ("precondition_verification", "information_gathering")
    owner = _owner_dict(c, with_lookup=owner_tools)

    # tools and their roles
    roles: dict[str, dict] = {c.write.name: {"kind": "write"}}
    mode = c.reader.mode
    if mode == "owner":
        roles[c.reader.tool] = {"kind": "owner", "param": c.owner.param, "embed": True}
    elif mode == "listing":
        roles[c.reader.tool] = {"kind": "listing"}
    else:
        roles[c.reader.tool] = {"kind": "entity", "mode": mode}
    if owner is not None:
        needs_reader = owner_tools or mode in ("owner", "key_owner")
        if owner_tools and owner["lookup"]:
            roles.setdefault(owner["lookup"], {"kind": "lookup", "returns": owner["lookup_returns"]})
        if needs_reader and owner["reader"] and owner["reader"] not in roles:
            roles[owner["reader"]] = {"kind": "owner", "param": owner["reader_param"], "embed": False}
        if needs_reader and not owner["reader"] and owner["listing"]:
            roles.setdefault(owner["listing"], {"kind": "listing"})
    if slug in ("precondition_verification", "policy_adherence") and catalog.escalation:
        roles.setdefault(catalog.escalation, {"kind": "escalation"})
    tools = [t for t in target.tools if t["function"]["name"] in roles]

    # descriptors: what the user calls a record by, when not by its id
    fields = catalog.search_fields(c.reader, c.key)
    field = next((f for f in ("name", "title", "content", "description", "label") if f in fields),
                 fields[0] if fields else "description")
    reader_tool = catalog.tools[c.reader.tool]
    desc_recipe = recipe(field, reader_tool.params.get(field, {}), reader_tool.parameters) if fields else {}
    descriptors = desc_recipe["values"] if desc_recipe.get("t") == "choice" else PHRASES["text"]

    name = c.write.name
    ok = [s for s in STATUS_WORDS if s in name][:1] or ["active"]
    blocked = [s for s in ("cancelled", "closed", "on_hold", "expired", "completed", "suspended",
                           "archived") if s not in ok][:4]
    titles = {p: c.write.title(p) for p in c.write.params}
    if c.owner is not None:
        titles.setdefault(c.owner.param, _title(c.owner.param))
    p = {
        "family": slug, "write": name, "key": c.key, "noun": _noun(c.key, name),
        "action": _action(name), "params": recipes, "required": list(c.write.required),
        "optional": optional, "titles": titles, "owner": owner,
        "identity_words": {k: IDENTITY_WORDS[v] for k, v in (owner or {}).get("identity", {}).items()},
        "reader": {"tool": c.reader.tool, "mode": mode, "param": c.reader.param},
        "descriptor_field": field, "descriptors": list(descriptors),
        "statuses": ok + blocked, "ok_statuses": ok, "blocked_statuses": blocked,
        "forms": {k: f for k in c.write.params if (f := form(recipes[k])) != "plain"},
        "amendable": _amendable(c, recipes), "rule_params": _rule_params(c, recipes),
    }
    skills = _skills(slug, p, c, catalog)
    return {"family": family, "candidate": c, "plan": p, "roles": roles, "tools": tools,
            "skills": skills, "policy": _policy(slug, p, roles)}


def _title(param: str) -> str:
    return param.replace("_", " ").title()


def _skills(slug: str, p: dict, c: Candidate, catalog: Catalog) -> dict[str, float]:
    if slug == "precondition_verification":
        return {"status_check": 0.6, "ownership_check": 0.4} if p["owner"] else {"status_check": 1.0}
    if slug == "confirmation_before_write":
        skills = {"confirm": 0.5, "decline": 0.25}
        if p["amendable"]:
            skills["amend"] = 0.25
        return skills
    if slug == "argument_precision":
        values = any(f not in ("id", "ids") for f in p["forms"].values())
        return {"id_format": 0.5, "value_format": 0.5} if values else {"id_format": 1.0}
    if slug == "policy_adherence":
        if p["rule_params"]:
            return {"allowed": 0.35, "param_rule": 0.35, "third_party": 0.3}
        return {"allowed": 0.5, "third_party": 0.5}
    if slug == "structured_data_reasoning":
        return {"total": 0.5, "select": 0.5}
    has_details = bool(p["optional"] or [q for q in p["required"] if q != p["key"]
                                         and not (p["owner"] and q == p["owner"]["param"])])
    if p["owner"] or has_details:
        return {"find_by_description": 0.5, "ask_user": 0.5}
    return {"find_by_description": 1.0}


def _policy(slug: str, p: dict, roles: dict) -> str:
    noun, write, reader = p["noun"], p["write"], p["reader"]["tool"]
    lines = [f"You are a service agent. You help users with their {noun}s, using only the tools "
             "you are given and the records they return.",
             "- Never invent ids or values: take them from the user or from tool results, in the "
             "exact formats the tool descriptions give.",
             "- One tool call at a time; answer the user in plain text between tool calls."]
    owner = p["owner"]
    if slug == "precondition_verification":
        ok = " or ".join(f"'{s}'" for s in p["ok_statuses"])
        lines.append(f"- Before calling {write}, read the {noun} with {reader} and check its "
                     f"status: {write} may only be used when the status is {ok}.")
        if owner:
            who = (f"identify the user with {owner['lookup']}" if owner["lookup"]
                   else f"note the user's {p['titles'].get(owner['param'], owner['param'])}")
            lines.append(f"- First {who}. Act only on the user's own {noun}s: the {noun}'s "
                         f"{owner['param']} must be the user's.")
        lines.append("- When a check fails, make no change: tell the user which check failed (for a "
                     "status, name the status you found).")
    elif slug == "confirmation_before_write":
        lines.append(f"- Before calling {write}, tell the user exactly what you will do (the {noun} "
                     "id and every value you will send) and ask them to confirm. Call it only "
                     "after an explicit yes, with the values they confirmed.")
        lines.append("- If the user says no, make no change. If they change a detail, confirm again.")
    elif slug == "argument_precision":
        lines.append(f"- Users may type ids and values loosely. Read the {noun} with {reader}, then "
                     f"call {write} with every argument in its exact format: ids exactly as the "
                     "records and tool descriptions write them, enum values exactly as listed, "
                     "numbers as numbers, dates as YYYY-MM-DD.")
    elif slug == "policy_adherence":
        lines.append("- Follow every rule below. Refuse requests that break one, say which rule, and "
                     "keep refusing if the user insists; carry out requests that break none.")
    elif slug == "structured_data_reasoning":
        lines.append(f"- A {noun}'s total is the sum over its line_items of unit_price times "
                     "quantity, to two decimals. Compute it from the records; never guess.")
        lines.append(f"- Read every {noun} a question is about with {reader} before answering or acting.")
    elif slug == "information_gathering":
        if owner:
            how = (f"identify them with {owner['lookup']}" if owner["lookup"] else
                   f"ask for their {p['titles'].get(owner['param'], owner['param'])}")
            lines.append(f"- When a user does not know a {noun}'s id, {how}, list their {noun}s, "
                         f"and read them until you find the one they describe.")
        else:
            lines.append(f"- When a user does not know a {noun}'s id, find it with {reader}.")
        lines.append("- Ask the user for any detail you need that they have not given.")
    if any(r["kind"] == "escalation" for r in roles.values()):
        esc = next(n for n, r in roles.items() if r["kind"] == "escalation")
        lines.append(f"- Transfer to a human agent ({esc}) only when a request cannot be handled "
                     "under this policy with the tools.")
    return "\n".join(lines)


# ============================================================================= rendering

WHY = {
    "precondition_verification":
        "Each episode is one request to {write} on {a_noun}; in about half of them a precondition "
        "fails (the {noun}'s status{owner_clause}). Credit goes to changes made after reading the "
        "record with {reader} and to refusals that name the failed check, so the policy learns "
        "'look up, check, then act or decline' with {target}'s own tools and argument formats, "
        "instead of acting on every request or refusing every one.",
    "confirmation_before_write":
        "Each episode asks for {write} on {a_noun}. Full credit needs a message that states the "
        "change and asks for a yes before the call, and the call must carry what the user "
        "confirmed: some users say no (then no change is right) and some amend a value (then "
        "confirming again is right). The tool and its arguments are {target}'s own, so the habit "
        "transfers to its write tools.",
    "argument_precision":
        "The user types the {noun} id and the values of {write} loosely (lower case, no symbol "
        "prefix, spaces, number words, spelled-out dates, enum labels in plain words); each "
        "argument is scored separately, so a call with one wrong format earns partial credit. The "
        "schemas are {target}'s, so the normalisation learnt here is the one its tools require.",
    "policy_adherence":
        "Each episode's rules sit in the system message and change with the seed (a forbidden "
        "value or a limit on {write}'s arguments, no acting for third parties). About a third of "
        "the requests are allowed and must be carried out, the rest refused, also when the user "
        "pushes back. Scoring a refusal higher when it names the rule and a compliant request "
        "only when it is done teaches reading {target}'s policy rather than reflexive refusal.",
    "structured_data_reasoning":
        "{reader} returns {noun} records with line items; the user asks for a total (unit price "
        "times quantity, summed) or asks for {write} on whichever of three {noun}s has the "
        "highest or lowest total. The number or the chosen record decides most of the score, and "
        "reading the records the rest, so the policy learns to compute from {target}'s tool "
        "outputs rather than guess.",
    "information_gathering":
        "The user wants {write} on {a_noun} but knows only how to describe it. The agent has to "
        "chain {target}'s own lookups ({gather}), ask for what the user has not said, and only "
        "then act; milestones (identified, found) give partial credit, so rollouts that stop "
        "early or act on the wrong record score lower.",
}


def _literal(value) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def _body(name: str) -> str:
    """A source piece without its module docstring (text only, no ast)."""
    text = (SOURCES / f"{name}.py").read_text(encoding="utf-8")
    return re.sub(r'\A"""(?:.|\n)*?"""\n', "", text).strip("\n") + "\n"


def docstring(capability: str, bundle: dict, target: Target) -> str:
    p, slug = bundle["plan"], bundle["family"].slug
    owner = p["owner"]
    gather = ", ".join(n for n, r in bundle["roles"].items() if r["kind"] != "write"
                       and r["kind"] != "escalation")
    noun = p["noun"]
    why = WHY[slug].format(
        write=p["write"], noun=noun, a_noun=("an " if noun[:1] in "aeiou" else "a ") + noun,
        reader=p["reader"]["tool"], target=target.name,
        owner_clause=" or whether it belongs to the user" if owner else "", gather=gather)
    tools = ", ".join(t["function"]["name"] for t in bundle["tools"])
    return "\n\n".join([
        f"Capability: {capability}.",
        textwrap.fill(f"Why it transfers: {why}", 96),
        textwrap.fill(f"Family: {bundle['family'].name} (template synthesizer). Target: {target.name}. "
                      f"Tools, their schemas copied unchanged from the target: {tools}.", 96)]) + "\n"


def render(capability: str, bundle: dict, target: Target) -> str:
    """The env.py source for a planned family on a target."""
    doc = docstring(capability, bundle, target).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    parts = [
        f'"""{doc}"""',
        "import json\nimport random\nimport re\n",
        f"CAPABILITY = {json.dumps(capability, ensure_ascii=False)}",
        f"SKILLS = {_literal(bundle['skills'])}",
        f"TOOLS = {_literal(bundle['tools'])}",
        f"ROLES = {_literal(bundle['roles'])}",
        f"PLAN = {_literal(bundle['plan'])}",
        f"POLICY = {_literal(bundle['policy'])}",
        "",
        _body("common"),
        _body(bundle["family"].slug),
    ]
    return "\n".join(parts)


def synthesize_template(capability: str, family: Family | str, target: Target) -> tuple[str, dict]:
    """(env.py source, a summary of the choices) for ``family`` on ``target``."""
    bundle = plan(family, target)
    source = render(capability, bundle, target)
    c = bundle["candidate"]
    summary = {"family": bundle["family"].slug, "write": c.write.name, "key": c.key,
               "reader": f"{c.reader.tool} ({c.reader.mode})", "tools": [t["function"]["name"] for t in bundle["tools"]],
               "owner": c.owner.param if c.owner else None, "skills": bundle["skills"]}
    return source, summary

