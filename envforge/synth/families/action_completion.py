"""Action completion: a request needs the same change on two or three records (named by the user,
or "all my <noun>s that are <status>", found by reading); every one must be carried out, each
with its own arguments right, before the agent reports back."""
from __future__ import annotations

from envforge.synth import classify as C
from envforge.synth.families import Family, who
from envforge.synth.runtime import (BaseEnv, KEY, NOUN, OWNER, PLAN, TOOLS, _allow_write, _base_world,
                                    _call, _details, _expected, _frac, _hello, _identify_calls,
                                    _read_args, _rng, _skill, _text)


def _preference(c, catalog):
    # several records of one user: an owner whose records can be listed suits "all my ..."
    owner = c.owner is not None and bool(c.owner.reader or c.owner.listing)
    return C.base_preference(c) + 2 * owner + any(s in c.write.name for s in C.STATUS_WORDS)


def _skills(p):
    owner = p["owner"]
    if owner and (owner["reader"] or owner["listing"]):
        return {"listed": 0.5, "all_with_status": 0.5}
    return {"listed": 1.0}


def _policy(p):
    noun, write, reader = p["noun"], p["write"], p["reader"]["tool"]
    lines = [f"- Read each {noun} with {reader} before calling {write} on it.",
             f"- A request may need {write} on several {noun}s: carry out every change the user "
             "asked for, each with its own arguments, before you tell them you are done."]
    if p["owner"]:
        lines.append(f"- To find a user's {noun}s, {who(p)} and read their record.")
    return lines


FAMILY = Family(
    slug="action_completion",
    name="action completion",
    description=(
        "carries out every state change the task requires (two or three writes) instead of "
        "stopping after the first"),
    keywords=("complet", "finish", "stop early", "stopping early", "stops early", "every change",
              "all change", "every state", "all the step", "follow through", "multiple write",
              "several write", "multi-action"),
    why=(
        "Each episode asks for {write} on two or three {noun}s at once: named by id, or all of the "
        "user's {noun}s with a given status, which only reading the records tells. The score is "
        "the share of the requested changes carried out, each with its arguments checked and "
        "credit for reading it first, and the episode ends when the agent reports back, so "
        "stopping after the first change earns a third or a half, as it loses tasks on {target}, "
        "whose tools and formats these are."),
    preference=_preference, skills=_skills, policy=_policy,
    owner_tools=True,
    needs="it needs a write tool on records a user can have several of",
    rank=70)


# ---- ENV_PY: the family's env class (templates.render copies what follows into env.py)


class Env(BaseEnv):
    tools = TOOLS
    max_turns = 14

    def _world(self, rng):
        w = _base_world(rng, rng.randint(6, 8))
        skill = _skill(rng)
        caller = w["caller"]
        mine = [k for k, r in w["entities"].items() if not OWNER or r[OWNER["param"]] == caller]
        n = rng.randint(2, min(3, len(mine)))
        keys = rng.sample(mine, n)
        sc = {"skill": skill, "keys": keys}
        # the records to change have a status the write is allowed on (only the precondition
        # family asks for a write the status forbids)
        if skill == "all_with_status":
            status = rng.choice(PLAN["ok_statuses"])
            for k in mine:
                w["entities"][k]["status"] = status if k in keys else rng.choice(
                    [s for s in PLAN["statuses"] if s != status])
            sc["status"] = status
        else:
            for k in keys:
                _allow_write(rng, w["entities"][k])
        first = _expected(rng, w, w["entities"][keys[0]])
        shared = {p: v for p, v in first.items() if p != KEY and not (OWNER and p == OWNER["param"])}
        sc["args"] = {}
        for k in keys:
            args = dict(first, **{KEY: k})
            if OWNER and OWNER["param"] in args:
                args[OWNER["param"]] = w["entities"][k][OWNER["param"]]
            sc["args"][k] = args
        details = _details(shared)
        if skill == "all_with_status":
            sc["request"] = "please {} for all my {}s that are {}. {}".format(
                PLAN["action"], NOUN, status.replace("_", " "), details).strip()
        else:
            said = ", ".join(keys[:-1]) + " and " + keys[-1]
            sc["request"] = "please {} for each of my {}s {}. {}".format(
                PLAN["action"], NOUN, said, details).strip()
        sc["opening"] = "Hi{}. P{}".format(_hello(w, always=skill == "all_with_status"), sc["request"][1:])
        w["scenario"] = sc
        return w

    def _start(self):
        self._s.update(done={}, wrong=0, writes=0)

    def _on_text(self, text):
        if self._s["writes"] == 0:
            return None, None  # nothing done yet: the user repeats the request
        return "Thanks. Bye.", "reported"

    def _on_write(self, args, rec):
        s, sc = self._s, self._sc
        s["writes"] += 1
        key = rec[KEY]
        if key not in sc["args"]:
            s["wrong"] += 1
        elif key not in s["done"]:
            s["done"][key] = 0.2 * (key in self._shown) + 0.8 * _frac(sc["args"][key], args)
        rec["status"] = "changed"
        return "Done: {} for {} {}.".format(PLAN["action"], NOUN, key), None

    def _score(self, outcome):
        s = self._s
        if outcome not in ("reported", "none"):
            return 0.0
        return sum(s["done"].values()) / len(self._sc["args"]) * (0.5 if s["wrong"] else 1.0)

    def solve(self, seed):
        w = self._world(_rng(seed))
        sc = w["scenario"]
        out = []
        if sc["skill"] == "all_with_status":
            out += _identify_calls(w, 0)
            if OWNER["lookup"] and OWNER["reader"]:
                out.append(_call(OWNER["reader"], {OWNER["reader_param"]: w["caller"]}, len(out)))
            elif OWNER["lookup"] and OWNER["listing"]:
                out.append(_call(OWNER["listing"], {}, len(out)))
            if PLAN["reader"]["mode"] != "owner":
                mine = [k for k, r in w["entities"].items() if r[OWNER["param"]] == w["caller"]]
                out += [_read_args(w, k, len(out) + i) for i, k in enumerate(mine)]
        else:
            for k in sc["keys"]:
                read = _read_args(w, k, len(out))
                if all(r["tool_calls"][0]["function"] != read["tool_calls"][0]["function"]
                       for r in out):  # a reader of the owner's record shows all of them at once
                    out.append(read)
        for k in sc["keys"]:
            out.append(_call(PLAN["write"], sc["args"][k], len(out)))
        out.append(_text("Done: {} for {} {}.".format(PLAN["action"], NOUN, " and ".join(sc["keys"]))))
        return out
