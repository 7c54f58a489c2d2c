"""Escalation judgement: transfer to a human agent when, and only when, the request is out of
scope: half the episodes ask for the change the tools make (do it, do not transfer), half ask for
something no tool here does or concern a record only a human may change (transfer, with a summary
naming the record)."""
from __future__ import annotations

from envforge.synth import classify as C
from envforge.synth.families import Family
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, PLAN, REFUSE, TOOLS, _base_world, _call,
                                    _callers_record, _details, _expected, _frac, _hello, _mentions,
                                    _norm, _please, _read_args, _rng, _say, _skill)


def _preference(c, catalog):
    return C.base_preference(c) + any(s in c.write.name for s in C.STATUS_WORDS)


def _skills(p):
    return {"in_scope": 0.5, "out_of_scope_request": 0.25, "out_of_scope_record": 0.25}


def _policy(p):
    noun, write, reader, esc = p["noun"], p["write"], p["reader"]["tool"], p["escalation"]
    return [f"- Read the {noun} a request is about with {reader} first.",
            f"- You can {p['action']} for a user's {noun}s with {write}: do that yourself.",
            f"- Transfer the user to a human agent with {esc} when, and only when, the request is "
            "out of scope: the user wants something no tool here does (compensation, a complaint, "
            f"a dispute, a legal matter, a change other than {p['action']}), or a rule below says "
            f"only a human may handle that {noun}. Say in the transfer which {noun} it is about "
            "and what the user wants. Never transfer a request you can handle."]


FAMILY = Family(
    slug="escalation_judgement",
    name="escalation judgement",
    description="transfers to a human agent when, and only when, the request is out of scope",
    keywords=("escalat", "transfer", "human", "hand off", "handoff", "hand over", "out of scope",
              "out-of-scope", "scope"),
    why=(
        "Half the episodes ask for {write} on {a_noun}, which the agent must do itself; the other "
        "half ask for something no tool does, or concern {a_noun} whose status the episode's "
        "rule reserves for a human, which only reading it with {reader} shows, and must be "
        "transferred with {escalation}, the summary naming the {noun}. Transfers of requests in "
        "scope and changes made to ones out of scope earn nothing, so the policy learns "
        "{target}'s line between acting and handing over, not a habit of either."),
    preference=_preference, skills=_skills, policy=_policy,
    escalation="required",
    rank=90)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)

OUT_OF_SCOPE = [
    "I want compensation for all the trouble I had with my {noun} {key}.",
    "I'd like to file a formal complaint about how my {noun} {key} was handled.",
    "I need to dispute a charge connected to my {noun} {key}.",
    "I have a legal question about my {noun} {key} that I need answered.",
    "I want someone to explain in detail why my {noun} {key} was handled the way it was, and "
    "put it in writing.",
    "Please waive every fee on my {noun} {key}; it was your mistake.",
]


class Env(BaseEnv):
    tools = TOOLS
    max_turns = 10

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        key, rec = _callers_record(rng, w)
        human = rng.choice(PLAN["blocked_statuses"])
        for r in w["entities"].values():
            if r["status"] == human:
                r["status"] = PLAN["ok_statuses"][0]
        rec["status"] = human if skill == "out_of_scope_record" else PLAN["ok_statuses"][0]
        args = _expected(rng, w, rec)
        if skill == "out_of_scope_request":
            request = rng.choice(OUT_OF_SCOPE).format(noun=NOUN, key=key)
        else:
            request = _please(key, _details(args))
            request = request[0].upper() + request[1:]
        w["scenario"] = {
            "skill": skill, "key": key, "args": args, "request": request,
            "in_scope": skill == "in_scope",
            "rules": ["A {} whose status is '{}' may only be changed by a human agent: transfer "
                      "requests about it.".format(NOUN, human)],
            "opening": "Hi{}. {}".format(_hello(w), request),
        }
        return w

    def _start(self):
        self._s.update(read=False, summary=False, right=False, frac=0.0)

    def _on_text(self, text):
        if REFUSE.search(_norm(text)):
            return "That's not helpful. Bye.", "refused"
        return None, None

    def _on_transfer(self, args):
        sc = self._sc
        said = " ".join(_say(v) for v in args.values() if isinstance(v, str))
        self._s.update(read=sc["key"] in self._shown,
                       summary=_mentions(said, sc["key"]) if PLAN["escalation_params"] else True)
        return "Transfer successful. A human agent will take over the conversation.", "transfer"

    def _on_write(self, args, rec):
        sc = self._sc
        self._s.update(read=rec[KEY] in self._shown, right=rec[KEY] == sc["key"],
                       frac=_frac(sc["args"], args))
        rec["status"] = "changed"
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        s, sc = self._s, self._sc
        if outcome == "transfer" and not sc["in_scope"]:  # the decision counts once the record is read
            return (0.7 if s["read"] else 0.0) + 0.3 * s["summary"]
        if outcome == "write" and sc["in_scope"] and s["right"]:
            return 0.3 * s["read"] + 0.7 * s["frac"]
        return 0.0

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = [_read_args(w, sc["key"], 0)]
        if sc["in_scope"]:
            out.append(_call(PLAN["write"], sc["args"], 1))
            return out
        summary = "The user asks about {} {}: {}".format(NOUN, sc["key"], sc["request"])
        out.append(_call(PLAN["escalation"], {p: summary for p in PLAN["escalation_params"]}, 1))
        return out
