"""The template synthesizer's capability families (the TRACE paper's recurring deficits), one
module each, and the mapping from a capability's free text to the nearest family.

A family module (``families/<slug>.py``) holds everything about its family: above its ENV_PY
line, ``FAMILY = Family(...)`` (its name, matching words, which of the target's tools it needs,
how it ranks the target's write tools, its sub-skills, its policy lines and its "why it
transfers" paragraph); below that line, the family's ``class Env(BaseEnv)`` (scenario, scripted
user, partial-credit reward, reference ``solve``), which ``templates.render`` copies into every
env.py after the shared runtime (``envforge.synth.runtime``). The module imports on its own: the
runtime's names it uses are imported above the line, where env.py has them from the runtime's
text instead.

Every module of this package that defines ``FAMILY`` is registered, in the order of
``Family.rank``: adding a family is adding one file (see docs/synth-families.md).
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from envforge.errors import UsageError

#: The line of a family module (and of the runtime) below which the text goes into env.py.
ENV_PY = "# ---- ENV_PY"


@dataclass(frozen=True)
class Family:
    slug: str                        # the module's name: families/<slug>.py
    name: str                        # as a capability is named ("precondition verification")
    description: str                 # what an agent with the capability does
    keywords: tuple[str, ...]        # stems that point at this family in a capability's name
    why: str                         # "Why it transfers", formatted with the plan (templates.docstring)
    preference: Callable             # (Candidate, Catalog) -> float | None: how well a write suits it
    skills: Callable                 # (plan) -> {sub-skill: weight}
    policy: Callable                 # (plan) -> the family's lines of the system message
    owner_tools: bool = False        # carries the owner's lookup and reader (identifying the user)
    escalation: str = "no"           # the target's transfer to a human: no / optional / required
    rank: int = 100                  # the order of the family list (ties broken by slug)
    needs: str = "none of its write tools suits the family"   # why a target has no candidate
    source: str = field(default="", compare=False, repr=False)   # the env.py part, set on registering


def env_part(text: str, where: str) -> str:
    """The text of a module below its ENV_PY line."""
    head, sep, tail = text.partition("\n" + ENV_PY)
    if not sep:
        raise ValueError(f"{where} has no {ENV_PY!r} line: the family's env class must follow one")
    return tail.split("\n", 1)[1].strip("\n") + "\n"


def discover(paths=None, package: str = __name__) -> tuple[Family, ...]:
    """The families of the modules in ``paths`` (this package's folder by default)."""
    found = []
    for info in sorted(pkgutil.iter_modules(paths or __path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            continue
        if family.slug != info.name:
            raise ValueError(f"{module.__file__}: FAMILY.slug is {family.slug!r}; it must be the "
                             f"module's name, {info.name!r}")
        text = Path(module.__file__).read_text(encoding="utf-8")
        found.append(replace(family, source=env_part(text, module.__file__)))
    return tuple(sorted(found, key=lambda f: (f.rank, f.slug)))


def _score(text: str, family: Family) -> int:
    low = text.lower()
    return sum(1 for k in family.keywords if re.search(r"(?<![a-z])" + re.escape(k), low))


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def match_family(name: str, description: str = "", families: tuple[Family, ...] | None = None,
                 listing: bool = True) -> Family:
    """The family nearest to a capability: by its name (a family's slug or name matches
    exactly; else keyword stems in the name, then in the description). Raises UsageError
    when nothing matches, listing the families when ``listing`` (a batch's rows do not repeat
    the list)."""
    families = FAMILIES if families is None else families
    key = _key(name)
    for f in families:
        if key in (f.slug, _key(f.name)):
            return f
    scored = sorted(((_score(name, f) * 3 + _score(description, f), -i, f)
                     for i, f in enumerate(families)), key=lambda x: (x[0], x[1]), reverse=True)
    best, second = scored[0], scored[1]
    name_hits = _score(name, best[2])
    if best[0] > 0 and (name_hits > 0 or best[0] >= 2) and best[0] > second[0]:
        return best[2]
    if not listing:
        raise UsageError(f"capability {name!r} matches none of the template synthesizer's "
                         f"{len(families)} families (envforge synth -c {name!r} lists them); use "
                         "--llm openai, which takes any capability")
    raise UsageError(f"capability {name!r} matches none of the template synthesizer's families; "
                     f"name one of: {family_list(families)} (or use --llm openai, which takes any "
                     "capability)")


def family_list(families: tuple[Family, ...] | None = None) -> str:
    return "; ".join(f"{f.name!r} ({f.slug})" for f in (FAMILIES if families is None else families))


def who(p: dict) -> str:
    """How a policy line tells the agent to identify the user (for families' ``policy``)."""
    owner = p["owner"]
    return (f"identify the user with {owner['lookup']}" if owner["lookup"]
            else f"note the user's {p['titles'].get(owner['param'], owner['param'])}")


FAMILIES: tuple[Family, ...] = discover()
BY_SLUG = {f.slug: f for f in FAMILIES}
