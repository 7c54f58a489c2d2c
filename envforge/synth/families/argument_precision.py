"""Tool-call argument precision: the user says ids and values the way people do (lower case, no
'#', spaces, number words, spelled-out dates, enum labels in plain words); the write must carry
them in the exact formats the tool's schema and the records use."""
from __future__ import annotations

from envforge.synth import classify as C
from envforge.synth.families import Family
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, PLAN, REFUSE, TOOLS, _base_world, _call,
                                    _callers_record, _details, _expected, _frac, _hello, _norm,
                                    _please, _read_args, _rng, _skill, _spoken)


def _preference(c, catalog):
    n = C.transformable(c.write, c.key)
    return 3 * n + C.base_preference(c) + (2 if len(c.write.required) >= 2 else -4)


def _skills(p):
    values = any(f not in ("id", "ids") for f in p["forms"].values())
    return {"id_format": 0.5, "value_format": 0.5} if values else {"id_format": 1.0}


def _policy(p):
    return [f"- Users may type ids and values loosely. Read the {p['noun']} with "
            f"{p['reader']['tool']}, then call {p['write']} with every argument in its exact "
            "format: ids exactly as the records and tool descriptions write them, enum values "
            "exactly as listed, numbers as numbers, dates as YYYY-MM-DD."]


FAMILY = Family(
    slug="argument_precision",
    name="tool-call argument precision",
    description=(
        "passes ids, enum values, numbers and dates in exactly the formats the tool schemas "
        "require, however the user phrased them"),
    keywords=("argument", "paramet", "precis", "exact", "format", "tool-call", "tool call",
              "slot", "accura"),
    why=(
        "The user types the {noun} id and the values of {write} loosely (lower case, no symbol "
        "prefix, spaces, number words, spelled-out dates, enum labels in plain words); each "
        "argument is scored separately, so a call with one wrong format earns partial credit. The"
        " schemas are {target}'s, so the normalisation learnt here is the one its tools require."),
    preference=_preference, skills=_skills, policy=_policy,
    rank=30)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)

class Env(BaseEnv):
    tools = TOOLS
    max_turns = 12

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        key, rec = _callers_record(rng, w)
        args = _expected(rng, w, rec, optional=PLAN["optional"][:2])
        forms = {}
        for p, f in PLAN["forms"].items():
            if (skill == "id_format") == (f in ("id", "ids")):
                forms[p] = f
        said_key = _spoken(key, "id") if skill == "id_format" else key
        request = _please(said_key, _details(args, forms))
        w["scenario"] = {"skill": skill, "key": key, "args": args, "request": request,
                         "opening": "Hi{}. P{}".format(_hello(w), request[1:])}
        return w

    def _on_text(self, text):
        if REFUSE.search(_norm(text)):
            return "Oh. OK then, bye.", "refused"
        return None, None

    def _on_write(self, args, rec):
        self._s.update(read=rec[KEY] in self._shown, frac=_frac(self._sc["args"], args))
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        if outcome != "write":
            return 0.0
        return 0.2 * self._s["read"] + 0.8 * self._s["frac"]

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        return [_read_args(w, sc["key"], 0), _call(PLAN["write"], sc["args"], 1)]
