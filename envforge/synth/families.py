"""The capability families of the template synthesizer (the TRACE paper's recurring deficits),
and the mapping from a capability's free text to the nearest family."""
from __future__ import annotations

import re
from dataclasses import dataclass

from envforge.errors import UsageError


@dataclass(frozen=True)
class Family:
    slug: str
    name: str
    description: str
    keywords: tuple[str, ...]   # stems that point at this family in a capability's name


FAMILIES: tuple[Family, ...] = (
    Family("precondition_verification", "precondition verification",
           "reads the record a write changes (its status, its owner) and checks the policy's "
           "preconditions before changing it; declines, naming the failed check, otherwise",
           ("precondition", "prerequisit", "verif", "eligib", "status", "before act", "validat",
            "state check")),
    Family("structured_data_reasoning", "structured data reasoning",
           "computes totals and picks records by computed criteria from the structured data that "
           "tools return",
           ("structur", "data", "reason", "comput", "calculat", "arithmet", "aggregat", "total",
            "sum", "numer", "math", "tool output", "compar")),
    Family("argument_precision", "tool-call argument precision",
           "passes ids, enum values, numbers and dates in exactly the formats the tool schemas "
           "require, however the user phrased them",
           ("argument", "paramet", "precis", "exact", "format", "tool-call", "tool call", "slot",
            "accura")),
    Family("confirmation_before_write", "confirmation before write",
           "states the exact change and waits for the user's explicit yes before any write; "
           "makes no change after a no",
           ("confirm", "consent", "explicit", "approv", "yes", "permission", "ask before")),
    Family("policy_adherence", "policy adherence / refusal",
           "follows the written policy: refuses requests it forbids (and keeps refusing under "
           "pressure), carries out the ones it allows",
           ("policy", "polici", "refus", "rule", "complian", "forbid", "declin", "adheren",
            "guideline", "constraint")),
    Family("information_gathering", "multi-step information gathering",
           "identifies the user, finds the record they describe through several lookups, asks for "
           "missing details, then acts",
           ("inform", "gather", "multi-step", "multi step", "lookup", "look up", "identif",
            "search", "collect", "authent", "find", "clarif", "ask")),
)
BY_SLUG = {f.slug: f for f in FAMILIES}


def _score(text: str, family: Family) -> int:
    low = text.lower()
    return sum(1 for k in family.keywords if re.search(r"(?<![a-z])" + re.escape(k), low))


def match_family(name: str, description: str = "") -> Family:
    """The family nearest to a capability: by its name (a family's slug or name matches
    exactly; else keyword stems in the name, then in the description). Raises UsageError
    listing the families when nothing matches."""
    key = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    for f in FAMILIES:
        if key in (f.slug, re.sub(r"[^a-z0-9]+", "_", f.name).strip("_")):
            return f
    scored = sorted(((_score(name, f) * 3 + _score(description, f), -i, f)
                     for i, f in enumerate(FAMILIES)), key=lambda x: (x[0], x[1]), reverse=True)
    best, second = scored[0], scored[1]
    name_hits = _score(name, best[2])
    if best[0] > 0 and (name_hits > 0 or best[0] >= 2) and best[0] > second[0]:
        return best[2]
    raise UsageError(f"capability {name!r} matches none of the template synthesizer's families; "
                     f"name one of: {family_list()} (or use --llm openai, which takes any capability)")


def family_list() -> str:
    return "; ".join(f"{f.name!r} ({f.slug})" for f in FAMILIES)
