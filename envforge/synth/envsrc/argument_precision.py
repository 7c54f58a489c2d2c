"""Tool-call argument precision: the user says ids and values the way people do (lower case, no
'#', spaces, number words, spelled-out dates, enum labels in plain words); the write must carry
them in the exact formats the tool's schema and the records use."""


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
