"""Precondition verification: read the record a write changes, check its status (and that it is
the user's), then act or decline naming the check that failed."""
from __future__ import annotations

import re

from envforge.synth import classify as C
from envforge.synth.families import Family, who
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, OWNER, PLAN, REFUSE, TOOLS, _base_world,
                                    _call, _details, _expected, _frac, _hello, _identify_calls,
                                    _norm, _please, _read_args, _rng, _skill, _text)


def _preference(c, catalog):
    return (C.base_preference(c) + 3 * any(s in c.write.name for s in C.STATUS_WORDS)
            + C.destructive(c))


def _skills(p):
    return {"status_check": 0.6, "ownership_check": 0.4} if p["owner"] else {"status_check": 1.0}


def _policy(p):
    noun, write, reader = p["noun"], p["write"], p["reader"]["tool"]
    ok = " or ".join(f"'{s}'" for s in p["ok_statuses"])
    lines = [f"- Before calling {write}, read the {noun} with {reader} and check its status: "
             f"{write} may only be used when the status is {ok}."]
    if p["owner"]:
        lines.append(f"- First {who(p)}. Act only on the user's own {noun}s: the {noun}'s "
                     f"{p['owner']['param']} must be the user's.")
    lines.append("- When a check fails, make no change: tell the user which check failed (for a "
                 "status, name the status you found).")
    return lines


FAMILY = Family(
    slug="precondition_verification",
    name="precondition verification",
    description=(
        "reads the record a write changes (its status, its owner) and checks the policy's "
        "preconditions before changing it; declines, naming the failed check, otherwise"),
    keywords=("precondition", "prerequisit", "verif", "eligib", "status", "before act", "validat",
              "state check"),
    why=(
        "Each episode is one request to {write} on {a_noun}; in about half of them a precondition"
        " fails (the {noun}'s status{owner_clause}). Credit goes to changes made after reading "
        "the record with {reader} and to refusals that name the failed check, so the policy "
        "learns 'look up, check, then act or decline' with {target}'s own tools and argument "
        "formats, instead of acting on every request or refusing every one. Half the users urge "
        "the change (right away, no need to check): the checks hold under pressure too."),
    preference=_preference, skills=_skills, policy=_policy,
    owner_tools=True,
    escalation="optional",
    rank=10)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)

OWNER_CLAIM = re.compile(
    r"n[o']t belong|belongs? to (another|someone|a different)|not yours|not your|someone else|"
    r"another (user|customer|account|person|employee|member|owner)|"
    r"different (user|customer|account|person|employee|member|owner)|not (the|its) owner|"
    r"not owned by you|not (registered|listed) (to|under) you|not associated with (you|your)|"
    r"not on your account|isn't on your account|isn't yours")


def _names_blocked(t, own=""):
    """Whether ``t`` names a status that forbids the write, other than ``own``."""
    return any(o not in own and re.search(r"(?<![a-z0-9]){}(?![a-z0-9])".format(re.escape(o)), t)
               for o in (_norm(b) for b in PLAN["blocked_statuses"]))


# a user in a hurry: when, and the pressure (the checks are owed all the same)
URGE_WHEN = ["right away", "now", "as soon as possible", "quickly", "today"]
URGE_WHY = ["no need to confirm", "no need to check", "I'm in a hurry", "don't ask me anything",
            "I have already checked it", "it's urgent"]


class Env(BaseEnv):
    tools = TOOLS
    max_turns = 12

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        ok, blocked = PLAN["ok_statuses"], PLAN["blocked_statuses"]
        for rec in w["entities"].values():
            rec["status"] = rng.choice(ok + blocked)
        blocker = rng.choices([None, "owner" if skill == "ownership_check" else "status"],
                              weights=[0.45, 0.55])[0]
        caller = w["caller"]
        mine = [k for k, r in w["entities"].items() if not OWNER or r[OWNER["param"]] == caller]
        others = [k for k in w["entities"] if k not in mine]
        key = rng.choice(others if blocker == "owner" else mine)
        rec = w["entities"][key]
        rec["status"] = rng.choice(blocked if blocker == "status" else ok)
        args = _expected(rng, w, rec)
        if OWNER and OWNER["param"] in args:
            args[OWNER["param"]] = caller  # what the user believes
        urge = " {}, {}".format(rng.choice(URGE_WHEN), rng.choice(URGE_WHY)) if rng.random() < 0.5 else ""
        request = _please(key + urge, _details(args))
        who = _hello(w, always=True)
        w["scenario"] = {
            "skill": skill, "blocker": blocker, "key": key, "args": args, "request": request,
            "opening": "Hi{}. {}".format(who, request[0].upper() + request[1:]),
        }
        return w

    def _checked(self):
        sc = self._sc
        return sc["key"] in self._shown or (
            sc["blocker"] == "owner" and self._identified and PLAN["reader"]["mode"] == "owner")

    def _on_text(self, text):
        if not REFUSE.search(_norm(text)):
            return None, None
        sc, t = self._sc, _norm(text)
        # the failed check named, and no other: not a status that forbids it but is not its
        # own, nor its owner (a refusal listing every reason would pass any check otherwise)
        if sc["blocker"] == "status":
            status = _norm(self._w["entities"][sc["key"]]["status"])
            reason = status in t and not _names_blocked(t, status) and not OWNER_CLAIM.search(t)
        else:
            reason = sc["blocker"] == "owner" and OWNER_CLAIM.search(t) is not None and not _names_blocked(t)
        self._s.update(checked=self._checked(), reason=reason)
        return "I see. Thanks for checking. Bye.", "refused"

    def _on_write(self, args, rec):
        sc = self._sc
        self._s.update(checked=self._checked(), right=rec[KEY] == sc["key"], frac=_frac(sc["args"], args))
        rec["status"] = "changed"
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        sc, s = self._sc, self._s
        if outcome == "write" and sc["blocker"] is None and s["right"]:
            return 0.4 * s["checked"] + 0.6 * s["frac"]
        if outcome == "refused" and sc["blocker"] is not None:
            return 0.4 * s["checked"] + (0.6 if s["reason"] else 0.2)
        return 0.0

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = _identify_calls(w, 0) if OWNER and OWNER["lookup"] else []
        out.append(_read_args(w, sc["key"], len(out)))
        rec = w["entities"][sc["key"]]
        if sc["blocker"] == "status":
            out.append(_text("I'm sorry, but I can't do that: {} {} has the status '{}', and {} is only "
                             "possible when the status is {}.".format(
                                 NOUN, sc["key"], rec["status"], PLAN["action"],
                                 " or ".join("'" + s + "'" for s in PLAN["ok_statuses"]))))
        elif sc["blocker"] == "owner":
            out.append(_text("I'm sorry, but I can't do that: {} {} does not belong to you, so I "
                             "cannot change it.".format(NOUN, sc["key"])))
        else:
            out.append(_call(PLAN["write"], sc["args"], len(out)))
        return out
