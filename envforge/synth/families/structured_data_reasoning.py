"""Structured data reasoning over tool outputs: totals computed from the line items a tool
returns (unit price times quantity, summed), and the one record of several that a computed
criterion selects."""
from __future__ import annotations

import re

from envforge.synth import classify as C
from envforge.synth.families import Family
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, OWNER, PLAN, REFUSE, TOOLS, _base_world,
                                    _call, _details, _expected, _frac, _hello, _norm, _read_args,
                                    _rng, _skill, _text)


def _preference(c, catalog):
    return C.base_preference(c)


def _skills(p):
    return {"total": 0.5, "select": 0.5}


def _policy(p):
    noun = p["noun"]
    return [f"- A {noun}'s total is the sum over its line_items of unit_price times quantity, to "
            "two decimals. Compute it from the records; never guess.",
            f"- Read every {noun} a question is about with {p['reader']['tool']} before answering "
            "or acting."]


FAMILY = Family(
    slug="structured_data_reasoning",
    name="structured data reasoning",
    description=(
        "computes totals and picks records by computed criteria from the structured data that "
        "tools return"),
    keywords=("structur", "data", "reason", "comput", "calculat", "arithmet", "aggregat", "total",
              "sum", "numer", "math", "tool output", "compar"),
    why=(
        "{reader} returns {noun} records with line items; the user asks for a total (unit price "
        "times quantity, summed) or asks for {write} on whichever of three {noun}s has the "
        "highest or lowest total. The number or the chosen record decides most of the score, and "
        "reading the records the rest, so the policy learns to compute from {target}'s tool "
        "outputs rather than guess."),
    preference=_preference, skills=_skills, policy=_policy,
    rank=20)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)

ITEMS = ["standard fee", "service charge", "premium add-on", "late fee", "setup fee",
         "monthly plan", "insurance", "extra storage", "priority support", "delivery",
         "equipment rental", "usage overage"]
NUMBER = re.compile(r"(?<![\w.])\$?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w])")


def _items(rng):
    out = []
    for label in rng.sample(ITEMS, rng.randint(2, 4)):
        out.append({"description": label, "unit_price": rng.randint(150, 9999) / 100,
                    "quantity": rng.randint(1, 4)})
    return out


def _total(rec):
    return sum(round(i["unit_price"] * 100) * i["quantity"] for i in rec["line_items"]) / 100


class Env(BaseEnv):
    tools = TOOLS
    max_turns = 12

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        for rec in w["entities"].values():
            rec["line_items"] = _items(rng)
        mine = [k for k, r in w["entities"].items() if not OWNER or r[OWNER["param"]] == w["caller"]]
        sc = {"skill": skill}
        if skill == "total":
            key = rng.choice(mine)
            sc.update(key=key, candidates=[key], answer=_total(w["entities"][key]))
            sc["request"] = "how much is {} {} in total?".format(NOUN, key)
            sc["opening"] = ("Hi{}. Could you tell me the total amount of my {} {}? I need the exact "
                             "figure.").format(_hello(w), NOUN, key)
        else:
            candidates = rng.sample(mine, 3)
            totals = [_total(w["entities"][k]) for k in candidates]
            for i in (1, 2):  # a unique answer: nudge a record whose total repeats another's
                if totals[i] in totals[:i]:
                    item = w["entities"][candidates[i]]["line_items"][0]
                    item["unit_price"] = round(item["unit_price"] + 0.07 * i, 2)
                    totals[i] = _total(w["entities"][candidates[i]])
            highest = rng.random() < 0.5
            pick = totals.index(max(totals) if highest else min(totals))
            key = candidates[pick]
            args = _expected(rng, w, w["entities"][key])
            which = "highest" if highest else "lowest"
            names = "{}, {} or {}".format(*candidates)
            sc.update(key=key, candidates=candidates, args=args)
            sc["request"] = "please {} for whichever of {} {} has the {} total. {}".format(
                PLAN["action"], NOUN + "s", names, which, _details(args)).strip()
            sc["opening"] = "Hi{}. I have a request about my {}s {}: {}".format(_hello(w), NOUN, names, sc["request"])
        w["scenario"] = sc
        return w

    def _reads(self):
        c = self._sc["candidates"]
        return sum(1 for k in c if k in self._shown) / len(c)

    def _on_text(self, text):
        sc = self._sc
        if REFUSE.search(_norm(text)):
            return "Oh. OK then, bye.", "refused"
        if sc["skill"] != "total":
            return None, None
        cleaned = text
        for k in sorted(self._w["entities"], key=len, reverse=True):
            cleaned = cleaned.replace(k, " ")
        numbers = [(float(m.group(1).replace(",", "") + (m.group(2) or "")), bool(m.group(2)))
                   for m in NUMBER.finditer(cleaned)]
        if any(abs(v - sc["answer"]) < 0.006 for v, _ in numbers):
            self._s.update(read=self._reads(), right=True)
            return "Thanks, that's what I needed. Bye.", "answered"
        if any(decimal for _, decimal in numbers):
            self._s.update(read=self._reads(), right=False)
            return "Hmm, OK. Bye.", "answered"
        return None, None

    def _on_write(self, args, rec):
        self._s.update(read=self._reads(), right=rec[KEY] == self._sc["key"],
                       frac=_frac(self._sc.get("args", {}), args))
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        sc, s = self._sc, self._s
        if sc["skill"] == "total":
            if outcome == "answered":
                return 0.3 * s["read"] + (0.7 if s["right"] else 0.0)
            return 0.0
        if outcome == "write" and s["right"]:
            return 0.3 * s["read"] + 0.7 * s["frac"]
        if outcome == "write":
            return 0.1 * s["read"]
        return 0.0

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = [_read_args(w, k, i) for i, k in enumerate(sc["candidates"])]
        if PLAN["reader"]["mode"] in ("owner", "listing"):
            out = out[:1]  # one read shows them all
        if sc["skill"] == "total":
            out.append(_text("The total of {} {} is {:.2f}.".format(NOUN, sc["key"], sc["answer"])))
        else:
            out.append(_call(PLAN["write"], sc["args"], len(out)))
        return out
