"""The template synthesizer: an env.py for any target whose tools it can classify, offline.

For a family (a module of ``families/``) and a target, :func:`plan` picks the few target tools
the family needs (a write tool acting on an entity by an id parameter, a tool that shows that
entity, and, where the family uses them, an owner lookup, an owner reader or a transfer to a
human), and :func:`render` writes a self-contained env.py: the target's schemas of those tools
copied exactly, the plan (roles of the tools, value recipes, statuses, titles) as literals, the
shared runtime (``runtime.py``: validation against the schemas, a seeded synthetic database, the
dispatcher, the scripted user) and the family's env class (``families/<slug>.py``: scenario,
user, partial-credit reward, reference ``solve``). The file imports only ``json``, ``random`` and
``re``.

A target that cannot support a family raises :class:`~envforge.synth.classify.Unsupported` naming
what is missing.
"""
from __future__ import annotations

import json
import pprint
import textwrap
from pathlib import Path

from envforge.synth import classify as C
from envforge.synth.classify import (IDENTITY_WORDS, OWNER_STEMS, PHRASES, Candidate, Catalog,
                                     Unsupported, form, recipe, stem)
from envforge.synth.families import Family
from envforge.targets import Target

VERBS = ("add", "cancel", "change", "close", "create", "delete", "disable", "enable", "extend",
         "get", "grant", "modify", "remove", "reset", "resume", "send", "set", "suspend", "update")


# ============================================================================= choosing tools


def _noun(key: str, write: str) -> str:
    s = stem(key).replace("_", " ")
    last = write.split("_")[-1]
    if s in OWNER_STEMS and last not in VERBS and stem(key) not in write:
        return last
    return s


def choose(family: Family, catalog: Catalog) -> Candidate:
    cands = catalog.candidates()
    if not cands:
        raise Unsupported(
            f"target {catalog.target.name} has no write tool that acts on a record by a required id "
            "parameter (such as order_id) together with a read tool that shows that record "
            f"(a get_*(id), a search, an owner's details or a listing); found {catalog.describe()}")
    if family.escalation == "required" and not catalog.escalation:
        raise Unsupported(
            f"target {catalog.target.name} cannot support {family.name!r}: it needs a tool that "
            "transfers the user to a human agent (such as transfer_to_human_agents); found "
            + catalog.describe())
    scored = [(s, -i, c) for i, c in enumerate(cands)
              if (s := family.preference(c, catalog)) is not None]
    if not scored:
        raise Unsupported(f"target {catalog.target.name} cannot support {family.name!r}: "
                          f"{family.needs}; found {catalog.describe()}")
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


def family_of(family: Family | str) -> Family:
    if isinstance(family, Family):
        return family
    from envforge.synth.families import BY_SLUG
    return BY_SLUG[family]


def plan(family: Family | str, target: Target, catalog: Catalog | None = None) -> dict:
    """Everything the rendered env needs: tools, roles, recipes, skills, policy, docstring."""
    family = family_of(family)
    catalog = catalog or Catalog(target)
    c = choose(family, catalog)
    recipes = C.recipes(c)
    free = C.free_params(c)
    required_free = [p for p in free if p in c.write.required]
    optional = [p for p in free if p not in c.write.required] if not required_free else []
    owner = _owner_dict(c, with_lookup=family.owner_tools)

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
        needs_reader = family.owner_tools or mode in ("owner", "key_owner")
        if family.owner_tools and owner["lookup"]:
            roles.setdefault(owner["lookup"], {"kind": "lookup", "returns": owner["lookup_returns"]})
        if needs_reader and owner["reader"] and owner["reader"] not in roles:
            roles[owner["reader"]] = {"kind": "owner", "param": owner["reader_param"], "embed": False}
        if needs_reader and not owner["reader"] and owner["listing"]:
            roles.setdefault(owner["listing"], {"kind": "listing"})
    if family.escalation != "no" and catalog.escalation:
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
    ok = [s for s in C.STATUS_WORDS if s in name][:1] or ["active"]
    blocked = [s for s in ("cancelled", "closed", "on_hold", "expired", "completed", "suspended",
                           "archived") if s not in ok][:4]
    titles = {p: c.write.title(p) for p in c.write.params}
    if c.owner is not None:
        titles.setdefault(c.owner.param, _title(c.owner.param))
    escalation = next((n for n, r in roles.items() if r["kind"] == "escalation"), None)
    p = {
        "family": family.slug, "write": name, "key": c.key, "noun": _noun(c.key, name),
        "action": name.replace("_", " "), "params": recipes, "required": list(c.write.required),
        "optional": optional, "titles": titles, "owner": owner,
        "identity_words": {k: IDENTITY_WORDS[v] for k, v in (owner or {}).get("identity", {}).items()},
        "reader": {"tool": c.reader.tool, "mode": mode, "param": c.reader.param},
        "descriptor_field": field, "descriptors": list(descriptors),
        "statuses": ok + blocked, "ok_statuses": ok, "blocked_statuses": blocked,
        "forms": {k: f for k in c.write.params if (f := form(recipes[k])) != "plain"},
        "amendable": C.amendable(c, recipes), "rule_params": C.rule_params(c, recipes),
        "escalation": escalation,
        "escalation_params": _escalation_params(catalog, escalation),
    }
    return {"family": family, "candidate": c, "plan": p, "roles": roles, "tools": tools,
            "skills": family.skills(p), "policy": _policy(family, p)}


def _escalation_params(catalog: Catalog, name: str | None) -> dict:
    """The transfer tool's string parameters (a summary of the request goes in each)."""
    if name is None:
        return {}
    t = catalog.tools[name]
    return {q: t.title(q) for q, s in t.params.items() if t.resolve(s).get("type") == "string"}


def _title(param: str) -> str:
    return param.replace("_", " ").title()


def _policy(family: Family, p: dict) -> str:
    lines = [f"You are a service agent. You help users with their {p['noun']}s, using only the tools "
             "you are given and the records they return.",
             "- Never invent ids or values: take them from the user or from tool results, in the "
             "exact formats the tool descriptions give.",
             "- One tool call at a time; answer the user in plain text between tool calls."]
    lines += family.policy(p)
    if p["escalation"] and family.escalation == "optional":
        lines.append(f"- Transfer to a human agent ({p['escalation']}) only when a request cannot be "
                     "handled under this policy with the tools.")
    return "\n".join(lines)


# ============================================================================= rendering


def _literal(value) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


RUNTIME = Path(__file__).with_name("runtime.py")


def docstring(capability: str, bundle: dict, target: Target) -> str:
    p, family = bundle["plan"], bundle["family"]
    gather = ", ".join(n for n, r in bundle["roles"].items() if r["kind"] not in ("write", "escalation"))
    noun = p["noun"]
    why = family.why.format(
        write=p["write"], noun=noun, a_noun=("an " if noun[:1] in "aeiou" else "a ") + noun,
        reader=p["reader"]["tool"], target=target.name, escalation=p["escalation"],
        owner_clause=" or whether it belongs to the user" if p["owner"] else "", gather=gather)
    tools = ", ".join(t["function"]["name"] for t in bundle["tools"])
    return "\n\n".join([
        f"Capability: {capability}.",
        textwrap.fill(f"Why it transfers: {why}", 96),
        textwrap.fill(f"Family: {family.name} (template synthesizer). Target: {target.name}. "
                      f"Tools, their schemas copied unchanged from the target: {tools}.", 96)]) + "\n"


def render(capability: str, bundle: dict, target: Target) -> str:
    """The env.py source for a planned family on a target: the constants, the runtime's text and
    the family's env class (each module's text below its ENV_PY line)."""
    from envforge.synth.families import env_part
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
        env_part(RUNTIME.read_text(encoding="utf-8"), str(RUNTIME)),
        bundle["family"].source,
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
