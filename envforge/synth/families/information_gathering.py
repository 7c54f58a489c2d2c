"""Multi-step information gathering: the user does not know the record's id; identify them, list
their records, find the one they describe, ask for what they have not said, then act."""
from __future__ import annotations

import json

from envforge.synth import classify as C
from envforge.synth.families import Family
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, OWNER, PLAN, QUESTION, REFUSE, TOOLS,
                                    _base_world, _call, _callers_record, _details, _expected,
                                    _frac, _identify_calls, _identity, _norm, _read_args, _rng,
                                    _skill, _text)


def _preference(c, catalog):
    path = C.gather_path(c, catalog)
    if path is None:
        return None
    return (C.base_preference(c) + {"owner": 3, "search": 2, "listing": 1}[path]
            + 2 * bool(c.owner and c.owner.lookup))


def _skills(p):
    has_details = bool(p["optional"] or [q for q in p["required"] if q != p["key"]
                                         and not (p["owner"] and q == p["owner"]["param"])])
    if p["owner"] or has_details:
        return {"find_by_description": 0.5, "ask_user": 0.5}
    return {"find_by_description": 1.0}


def _policy(p):
    noun, owner = p["noun"], p["owner"]
    if owner:
        how = (f"identify them with {owner['lookup']}" if owner["lookup"] else
               f"ask for their {p['titles'].get(owner['param'], owner['param'])}")
        first = (f"- When a user does not know a {noun}'s id, {how}, list their {noun}s, and read "
                 "them until you find the one they describe.")
    else:
        first = f"- When a user does not know a {noun}'s id, find it with {p['reader']['tool']}."
    return [first, "- Ask the user for any detail you need that they have not given."]


FAMILY = Family(
    slug="information_gathering",
    name="multi-step information gathering",
    description=(
        "identifies the user, finds the record they describe through several lookups, asks for "
        "missing details, then acts"),
    keywords=("inform", "gather", "multi-step", "multi step", "lookup", "look up", "identif",
              "search", "collect", "authent", "find", "clarif", "ask"),
    why=(
        "The user wants {write} on {a_noun} but knows only how to describe it. The agent has to "
        "chain {target}'s own lookups ({gather}), ask for what the user has not said, and only "
        "then act; milestones (identified, found) give partial credit, so rollouts that stop "
        "early or act on the wrong record score lower."),
    preference=_preference, skills=_skills, policy=_policy,
    owner_tools=True,
    needs=("it needs a way to find a record the user only describes (an owner lookup or details "
           "tool listing the user's records, a search tool, or a listing)"),
    rank=60)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)

class Env(BaseEnv):
    tools = TOOLS
    max_turns = 14

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        key, rec = _callers_record(rng, w)
        field = PLAN["descriptor_field"]
        args = _expected(rng, w, rec)
        details = _details(args, skip=[OWNER["param"]] if OWNER else [])
        ask = skill == "ask_user"
        withheld = []
        who = ""
        if OWNER:
            caller = w["owners"][w["caller"]]
            if ask:
                withheld.append("Sure: I'm {}, {}.".format(caller["name"], _identity(w, w["caller"])))
            else:
                who = ", I'm {} ({})".format(caller["name"], _identity(w, w["caller"]))
        if ask and details:
            withheld.append("Here are the details: " + details.removeprefix("Details: "))
        which = "my {} whose {} is {}".format(NOUN, field.replace("_", " "), json.dumps(rec[field]))
        request = "please {} for {}. I don't have its id.".format(PLAN["action"], which)
        w["scenario"] = {
            "skill": skill, "key": key, "args": args, "withheld": withheld,
            "request": request + ("" if ask else " " + details),
            "opening": "Hi{}. {}".format(who, (request[0].upper() + request[1:] + ("" if ask else " " + details)).strip()),
        }
        return w

    def _start(self):
        self._s["revealed"] = 0

    def _on_text(self, text):
        t = _norm(text)
        if REFUSE.search(t):
            return "Oh. OK then, bye.", "refused"
        withheld = self._sc["withheld"]
        if self._s["revealed"] < len(withheld) and QUESTION.search(t):
            self._s["revealed"] += 1
            return withheld[self._s["revealed"] - 1], None
        return None, None

    def _on_write(self, args, rec):
        sc = self._sc
        self._s.update(right=rec[KEY] == sc["key"], found=sc["key"] in self._shown,
                       identified=self._identified, frac=_frac(sc["args"], args))
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        s = self._s
        if outcome != "write" or not s["right"]:
            return 0.0
        if OWNER:
            return 0.2 * s["identified"] + 0.2 * s["found"] + 0.6 * s["frac"]
        return 0.4 * s["found"] + 0.6 * s["frac"]

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = []
        ask = sc["skill"] == "ask_user"
        mode = PLAN["reader"]["mode"]
        if OWNER:
            if ask:
                out.append(_text("I can help with that. First, could you tell me your {}?".format(
                    " and ".join(PLAN["identity_words"][p] for p in OWNER["identity"])
                    if OWNER["identity"] else PLAN["titles"].get(OWNER["param"], OWNER["param"]))))
            out += _identify_calls(w, len(out))
            listed = mode in ("owner", "listing") or not OWNER["lookup"] or OWNER["lookup_returns"] == "record"
            if not listed:
                out.append(_call(OWNER["reader"], {OWNER["reader_param"]: w["caller"]}, len(out))
                           if OWNER["reader"] else _call(OWNER["listing"], {}, len(out)))
            if mode == "owner" and OWNER["lookup"]:
                out.append(_read_args(w, sc["key"], len(out)))
            elif mode not in ("owner", "listing"):
                for k in w["owners"][w["caller"]][OWNER["list_field"]]:
                    out.append(_read_args(w, k, len(out)))
                    if k == sc["key"]:
                        break
        elif mode == "search":
            field = PLAN["descriptor_field"]
            out.append(_call(PLAN["reader"]["tool"], {field: w["entities"][sc["key"]][field]}, len(out)))
        else:
            out.append(_call(PLAN["reader"]["tool"], {}, len(out)))
        if ask and len(sc["withheld"]) > (1 if OWNER else 0):
            out.append(_text("Thanks, I found it. What exactly should I change: could you give me the details?"))
        out.append(_call(PLAN["write"], sc["args"], len(out)))
        return out
