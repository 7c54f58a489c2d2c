"""Error recovery: the first plausible call fails with an informative error (an id typed the way
the user typed it, which the error shows the format of; a record changed since it was read,
which the error says to read again), and the agent fixes the call and gets the change done."""
from __future__ import annotations

from envforge.synth import classify as C
from envforge.synth.families import Family
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, PLAN, REFUSE, TOOLS, _base_world, _call,
                                    _callers_record, _details, _expected, _frac, _gen, _hello,
                                    _norm, _read_args, _rng, _skill, _spoken)


def _preference(c, catalog):
    # an id with a format to get wrong, read by a tool that takes it
    keyed = c.reader.mode in ("key", "any_id", "key_owner")
    return C.base_preference(c) + 2 * keyed + C.destructive(c)


def _skills(p):
    return {"id_format": 0.5, "stale_read": 0.5}


def _policy(p):
    noun, write, reader = p["noun"], p["write"], p["reader"]["tool"]
    return [f"- Read the {noun} with {reader} before calling {write} on it.",
            "- When a tool returns an error, read what it says, fix the call (an id's format, a "
            "record to read again) and try again; do not give up while the error says how to "
            "fix it."]


FAMILY = Family(
    slug="error_recovery",
    name="error recovery",
    description="after a tool error, corrects the call and gets it to succeed",
    keywords=("error", "recover", "retry", "retri", "fail", "exception", "fix the call",
              "self-correct", "resilien"),
    why=(
        "The user asks for {write} on {a_noun}, and the first plausible call fails the way "
        "{target}'s tools fail: the {noun} id as the user typed it is not found (the error shows "
        "the format ids have), or the {noun} changed since it was read (the error says to read "
        "it again with {reader}). Credit comes only from the change done in the end, with every "
        "argument checked and a read of the record before it, so the policy learns to read an "
        "error, fix the call and retry rather than apologise or repeat the same call."),
    preference=_preference, skills=_skills, policy=_policy,
    rank=80)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)


class Env(BaseEnv):
    tools = TOOLS
    max_turns = 12

    def _world(self, rng):
        w = _base_world(rng, rng.randint(5, 7))
        skill = _skill(rng)
        key, rec = _callers_record(rng, w)
        args = _expected(rng, w, rec)
        said = _spoken(key, "id") if skill == "id_format" else key
        sample = _gen(PLAN["params"][KEY], rng, list(w["taken"]))
        request = "please {} for my {} {}. {}".format(PLAN["action"], NOUN, said, _details(args)).strip()
        w["scenario"] = {"skill": skill, "key": key, "said": said, "args": args, "sample": sample,
                         "request": request,
                         "opening": "Hi{}. P{}".format(_hello(w), request[1:])}
        return w

    def _start(self):
        self._s.update(stale=False, errors=0)

    def _run(self, call):
        text, outcome = BaseEnv._run(self, call)
        if text.endswith("not found.") and text.startswith(("Error: {} ".format(NOUN), "Error: id ")):
            self._s["errors"] += 1
            text += " {} ids are written like {} (this one is an example, not yours).".format(
                NOUN[0].upper() + NOUN[1:], self._sc["sample"])
        return text, outcome

    def _on_text(self, text):
        if REFUSE.search(_norm(text)):
            return "Oh. OK then, bye.", "gave_up"
        return None, None

    def _on_write(self, args, rec):
        sc, s = self._sc, self._s
        if rec[KEY] == sc["key"] and sc["skill"] == "stale_read" and not s["stale"] \
                and rec[KEY] in self._shown:  # it changed after the agent's first read of it
            s["stale"] = True
            s["errors"] += 1
            self._shown = [k for k in self._shown if k != rec[KEY]]
            return ("Error: {} {} was changed by another request since it was read; read it again "
                    "with {}, then retry.".format(NOUN, rec[KEY], PLAN["reader"]["tool"])), None
        if rec[KEY] == sc["key"] and s["stale"] and rec[KEY] not in self._shown:
            s["errors"] += 1
            return ("Error: {} {} has not been read since it changed; read it again with {} "
                    "first.".format(NOUN, rec[KEY], PLAN["reader"]["tool"])), None
        s.update(right=rec[KEY] == sc["key"], read=rec[KEY] in self._shown,
                 frac=_frac(sc["args"], args))
        rec["status"] = "changed"
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, rec[KEY]), "write"

    def _score(self, outcome):
        s = self._s
        if outcome != "write" or not s["right"]:
            return 0.0
        # the first error is the scenario's; each further failed call costs 0.1 (at most 0.3)
        waste = 0.1 * min(3, max(0, s["errors"] - 1))
        return max(0.0, 0.2 * s["read"] + 0.8 * s["frac"] - waste)

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = []
        if sc["skill"] == "id_format":  # the id as the user said it, then as the error shows
            out.append(_call(PLAN["write"], dict(sc["args"], **{KEY: sc["said"]}), 0))
        out.append(_read_args(w, sc["key"], len(out)))
        out.append(_call(PLAN["write"], sc["args"], len(out)))
        if sc["skill"] == "stale_read":  # the write fails: read again, then retry
            out.append(_read_args(w, sc["key"], len(out)))
            out.append(_call(PLAN["write"], sc["args"], len(out)))
        return out
