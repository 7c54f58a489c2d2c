"""The holes a red team found in the gate (tests/redteam_unseen, issue 15), closed in general:
each test writes its own variant of the clean env (nothing keyed on the red team's envs)."""
from __future__ import annotations

import pytest

from envforge.gate.static import audit_static
from tests.test_static import rejects, variant, with_code


@pytest.mark.parametrize("code", [
    "rng = random.Random(**{})",                 # the seed is behind **: unseen, so unseeded
    "rng = random.Random(seed or None)",         # seed 0 is falsy: the OS seeds it
    "rng = random.Random(seed if seed else None)",
])
def test_seeds_that_can_be_none_or_are_unseen_are_unseeded(code):
    rejects(with_code(code), "static.entropy", "no seed")


def test_a_seed_attribute_does_not_disarm_the_reseed_rule():
    src = with_code("self.seed = seed\n        self._rng.seed()")
    rejects(src, "static.entropy", "re-seeds a generator from the OS")


def test_reseeding_with_a_value_is_fine():
    assert audit_static(with_code("self.seed = seed\n        self._rng.seed(seed + 1)")).ok


@pytest.mark.parametrize("code", [
    "fmt = functools.partial(str.format, '{0}')",
    "fill = '{}'.format\n        fill(1)",
    "out = list(map('{}'.format_map, [{}]))",
])
def test_format_used_as_a_value_is_a_dunder_finding(code):
    src = variant("import random\n", "import functools\nimport random\n")
    rejects(with_code(code, src), "static.dunder", "as a value")


def test_format_called_on_a_literal_is_fine():
    assert audit_static(with_code("s = '{} {}'.format(1, seed)")).ok


def test_process_wide_decimal_context_is_not_reachable():
    src = variant("import random\n", "import decimal\nimport random\n")
    rejects(with_code("decimal.getcontext().prec = 3", src), "static.import", "getcontext")
    assert audit_static(with_code("d = decimal.Decimal('1.5')", src)).ok


@pytest.mark.parametrize("pattern", [r"(-+)+$", r"(a*)*b", r"^([a-z]+)*$", r"(?:\w+)+"])
def test_nested_quantifiers_in_a_regex_literal_are_a_bounded_finding(pattern):
    src = variant("import random\n", "import random\nimport re\n")
    rejects(with_code(f"m = re.match({pattern!r}, 'x')", src), "bounded", "backtracks exponentially")


@pytest.mark.parametrize("pattern", [r"(\d+,)*\d+", r"^(\w+)\s", r"(?:ab)+", r"\(a+\)+", r"[a-z]+-\d+",
                                     r"\$?(\d{1,3}(?:,\d{3})+|\d+)", r"(x{2,9})+"])
def test_plain_regexes_are_fine(pattern):
    src = variant("import random\n", "import random\nimport re\n")
    assert audit_static(with_code(f"m = re.match({pattern!r}, 'x')", src)).ok


# --------------------------------------------------------------------------- dynamic probes

import json  # noqa: E402
import random  # noqa: E402
import textwrap  # noqa: E402

from envforge.gate import audit  # noqa: E402
from envforge.gate.config import GateSettings  # noqa: E402
from envforge.gate.dynamic import _unobserved_value  # noqa: E402
from envforge.gate.probes import literals, markdown_text  # noqa: E402
from tests.envfactory import override, write_env  # noqa: E402
from tests.test_redteam import SETTINGS  # noqa: E402

PAY = """
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                text = action.get("content") if isinstance(action, dict) else None
                if {condition}:
                    return obs, 1.0, True, False, info
                return obs, reward, terminated, truncated, info
"""
CALLS = '(action.get("tool_calls") or [] if isinstance(action, dict) else [])'

ATTACKS = {
    # a phrase of the env's own (not the reference's, not a word list's) pays the full score
    "own_phrase_pays": (override(PAY.format(
        condition='isinstance(text, str) and "ticket squared away" in text.lower()')), "free_reward", "own words"),
    # markdown (a blank line) pays: drawn texts were single-line words
    "blank_line_pays": (override(PAY.format(condition='isinstance(text, str) and "\\n\\n" in text')),
                        "free_reward", "policy"),  # do-nothing or random: which one the draw decides
    # a bonus for each message with several calls: totals above 1
    "several_calls_bonus": (override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                if len(""" + CALLS + """) > 1:
                    reward = min(1.0, reward + 0.3)
                return obs, reward, terminated, truncated, info
        """), "contract.runtime", "exceeds 1"),
    # a surrounding space on any argument hangs
    "hang_on_padded_argument": (override("""
            def step(self, action):
                for c in """ + CALLS + """:
                    args = c.get("function", {}).get("arguments") if isinstance(c, dict) else None
                    if isinstance(args, str) and '" ' in args and ' "' in args:
                        while True:
                            pass
                return _Base.step(self, action)
        """), "bounded", ""),
    # a recursive argument walk: deep nesting raises RecursionError
    "recursive_argument_walk": (override("""
            def step(self, action):
                def depth(x):
                    return 1 + max([depth(y) for y in x] or [0]) if isinstance(x, list) else 0
                for c in """ + CALLS + """:
                    args = c.get("function", {}).get("arguments") if isinstance(c, dict) else None
                    if isinstance(args, str) and args.startswith("{"):
                        try:
                            value = json.loads(args)
                        except ValueError:
                            value = {}
                        if isinstance(value, dict):
                            [depth(v) for v in value.values()]
                return _Base.step(self, action)
        """), "robustness", "RecursionError"),
    # step rewards drift after some thousands of resets (reset results do not)
    "step_drift_after_resets": (override("""
            used = [0]
            def reset(self, seed):
                Env.used[0] += 1
                return _Base.reset(self, seed)
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, (0.0 if Env.used[0] > 1900 else reward), terminated, truncated, info
        """), "determinism", "resets"),
    # instances from the 10th on share one world (the gate used to make five)
    "shared_from_tenth_instance": (override("""
            made = [0]
            shared = {}
            def __init__(self):
                Env.made[0] += 1
                self.mine = {} if Env.made[0] < 10 else Env.shared
            def reset(self, seed):
                self.mine["seed"] = seed
                return _Base.reset(self, seed)
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, reward * (self.mine.get("seed", 0) % 7 + 1) / 7, terminated, truncated, info
        """), ("isolation", "determinism"), ""),
    # about 1 KiB kept per reset: under any total threshold, not under a per-reset one
    # a clock no local holds: the count sits on a generator's stack (``yield from``), which the
    # state digest did not walk (round 5 of the red team: after 300,000 steps any refusal paid)
    "clock_in_a_delegating_generator": (override("""
            def reset(self, seed):
                next(_TICKS)
                return _Base.reset(self, seed)
        """).replace("\nclass _Base:", "\ndef _ticks():\n    yield from range(10 ** 9)\n\n\n"
                     "_TICKS = _ticks()\n\n\nclass _Base:", 1), "isolation", "_TICKS"),
    "slow_leak_per_reset": (override("""
            kept = []
            def reset(self, seed):
                Env.kept.append("x" * 1000 + str(seed))
                return _Base.reset(self, seed)
        """), "bounded", "a reset"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_on_an_old_hole_is_rejected(tmp_path, name):
    source, checks, message = ATTACKS[name]
    checks = {checks} if isinstance(checks, str) else set(checks)
    assert audit_static(source).ok, "the attack must pass the static audit"
    report = audit(write_env(tmp_path / name, source), settings=GateSettings(**SETTINGS), write_report=False)
    found = [f.to_dict() for f in report.findings if f.severity == "error"]
    assert report.verdict == "reject"
    assert any(f["check"] in checks and message in f["message"] for f in found), json.dumps(found, indent=1)


def test_markdown_texts_have_newlines_blank_lines_and_long_runs():
    rng = random.Random(7)
    texts = [markdown_text(rng, ["word", "other"], 3000) for _ in range(5)]
    assert all("\n" in t for t in texts) and any("\n\n" in t for t in texts)
    assert any(run * 20 in t for t in texts for run in "-=*_#~.")


@pytest.mark.parametrize("probe_seed", [4802840532486765974, 1, 2, 3])
def test_every_audit_says_a_text_of_tens_of_kb(probe_seed):
    """Besides the drawn texts (whose longest is drawn from long_text_chars up: with the first
    seed, the audit of the red team's r_long_buffer drew it at long_text_chars, under the env's
    8 KiB buffer, and accepted it), one episode says a text of six to eleven times that; its
    draws leave the others as they were."""
    from envforge.gate.dynamic import Draws
    from envforge.gate.probes import extend_texts, long_text

    settings = GateSettings(probe_seed=probe_seed)
    draws = Draws(probe_seed, settings)
    before = draws.rng.getstate()
    seed, text = long_text(draws, settings.long_text_chars)
    assert draws.rng.getstate() == before and seed in draws.seeds
    assert 6 * settings.long_text_chars <= len(text) <= 11 * settings.long_text_chars
    extend_texts(draws, 'X = "some words"\n', settings.long_text_chars)
    assert long_text(draws, settings.long_text_chars)[0] == seed


def test_literals_are_the_envs_own_short_words():
    words = literals('X = "all good"\ndef f():\n    return {"k": "v1"}, "a\\nb", "' + "y" * 80 + '"\n')
    assert "all good" in words and "v1" in words and "k" in words
    assert not any("\n" in w or len(w) > 60 for w in words)


@pytest.mark.parametrize("value, schema, messages, hidden", [
    (7, {}, ["Please extend it by 7 days."], False),
    (7, {}, ["Please extend it by seven days."], False),
    (7, {}, ["Please extend it by a few days (loan 2027-07-17)."], True),
    (7, {}, ["Loan L-17, 70 items"], True),
    ("sms", {"enum": ["sms", "email"]}, ['{"email": "a@b.c"}', "reset my password"], True),
    ("sms", {"enum": ["sms", "email"]}, ["send it by SMS please"], False),
    ("email", {"enum": ["sms", "email"]}, ["use my email"], False),
    ("hr_portal", {"enum": ["hr_portal", "wiki"]}, ['{"system": "hr_portal"}'], False),
    ("x", {}, ["nothing"], False),  # free strings are the string rule's, not this one's
])
def test_hidden_numbers_and_enum_choices(value, schema, messages, hidden):
    assert (_unobserved_value(value, schema, messages) is not None) == hidden


# --------------------------------------------------------------------------- reads that decide
# Attacks on the capability itself (issue 15's "capability not tested"), written for these
# probes: the reads are made and may even be credited, but what they return decides nothing.

def opening_as(when: str, content: str) -> str:
    """The clean env whose opening user message becomes ``content`` (an expression of ``text``,
    the message as written, and ``seed``) wherever ``when`` holds."""
    return override(f"""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                if {when}:
                    user = obs["messages"][1]
                    text = user["content"]
                    user["content"] = {content}
                return obs, info
        """)


REFUSED = 'self._sc["blocker"]'
AFTER_HI = 'text[len("Hi, "):]'

READS = {
    # whether the request will be refused shows in the greeting: the reads decide nothing
    "refusal_shown_by_greeting": (opening_as(REFUSED, '"Hello again! " + ' + AFTER_HI),
                                  "free_reward", "opening message"),
    # the other side: only requests that will be granted say everything is in order
    "grant_shown_by_remark": (opening_as("not " + REFUSED, 'text + " Everything is in order on my side."'),
                              "free_reward", "opening message"),
    # the refusals greet in five ways, each on a fifth of them: no one word tells, yet the five
    # do (by chance, such words would be found on both sides)
    "refusal_shown_by_five_greetings": (opening_as(REFUSED, '["Morning!", "Greetings!", "Howdy!", "Salutations!", '
                                                   '"Cheers!"][seed % 5] + " " + ' + AFTER_HI),
                                        "free_reward", "opening message"),
    # the refusals greet otherwise, and so does one granted request in eight: the word is no
    # longer one side's alone, yet it still tells the decision
    "refusal_shown_by_greeting_now_and_then": (opening_as(REFUSED + " or seed % 8 == 0", '"Hello again! " + ' + AFTER_HI),
                                               "free_reward", "opening message"),
    # the refusals' openings end in an exclamation mark: no word tells, a mark does
    "refusal_shown_by_a_mark": (opening_as(REFUSED, 'text.rstrip(".") + "!"'), "free_reward", "opening message"),
    # the refusals' openings greet in capitals: only the letters' case tells
    "refusal_shown_by_case": (opening_as(REFUSED, '"HI, " + ' + AFTER_HI), "free_reward", "opening message"),
    # the refusals' openings put two spaces after the greeting: only whitespace tells
    "refusal_shown_by_spaces": (opening_as(REFUSED, '"Hi,  " + ' + AFTER_HI), "free_reward", "opening message"),
    # the opening is clean, but asked anything the user says what the reads would show
    "refusal_told_when_asked": (override("""
            def _user_reply(self, content):
                reply, outcome = _Base._user_reply(self, content)
                if outcome is None and self._sc["blocker"]:
                    reply += " Someone may have changed it already, I think."
                return reply, outcome
        """), "free_reward", "answer to a greeting"),
    # the answer to anything the agent says carries a system note on the refusals
    "refusal_told_in_a_system_note": (override("""
            def step(self, action):
                obs, reward, done, cut, info = _Base.step(self, action)
                if self._sc["blocker"] and not done and isinstance(action, dict) and not action.get("tool_calls"):
                    obs["messages"].append({"role": "system", "content": "Note: this request has a problem on record."})
                return obs, reward, done, cut, info
        """), "free_reward", "answer to a greeting"),
    # identifying the employee counts as having checked their records
    "checks_credited_by_identification": (override("""
            def _checked(self):
                return self._authed
        """), "free_reward", "without its checks"),
    # any employee's profile counts as the requester's (another real record: the manager's)
    "profile_of_anyone_counts": (override("""
            def _dispatch(self, name, args):
                out = _Base._dispatch(self, name, args)
                if name == "get_employee_details" and args.get("employee_id") in self._world["employees"]:
                    self._employee_read = True
                return out
        """), "partial_credit", "get_employee_details sent for another record"),
}


def audited(tmp_path, name: str, source: str, probe_seed: int = 15):
    """(verdict, error findings) of the full gate on ``source``, at 30 seeds (profiles are read on
    the loan requests, a quarter of the seeds)."""
    settings = GateSettings(**{**SETTINGS, "seeds": 30}, probe_seed=probe_seed)
    report = audit(write_env(tmp_path / name, source), settings=settings, write_report=False)
    return report.verdict, [f.to_dict() for f in report.findings if f.severity == "error"]


def assert_rejected(tmp_path, name: str, source: str, check: str, message: str) -> None:
    """The attack passes the static audit, and the full gate rejects it with ``check`` and a
    message holding ``message``."""
    assert audit_static(source).ok, "the attack must pass the static audit"
    verdict, found = audited(tmp_path, name, source)
    assert verdict == "reject"
    assert any(f["check"] == check and message in f["message"] for f in found), json.dumps(found, indent=1)


@pytest.mark.parametrize("name", sorted(READS))
def test_reads_that_decide_nothing_are_rejected(tmp_path, name):
    assert_rejected(tmp_path, name, *READS[name])


def test_the_gate_goes_by_the_capability_the_env_was_made_for(tmp_path):
    """env.py's CAPABILITY is worded by the code's author, and a capability about reading is what
    switches the reading probes on: renamed, "the decision in the opening" would not run. Where
    manifest.json (synth's) says what the env was made for, the gate goes by that, and a
    CAPABILITY that says otherwise is itself an error."""
    flawed = READS["refusal_shown_by_greeting"][0]
    renamed = flawed.replace('CAPABILITY = "precondition verification"', 'CAPABILITY = "handling requests safely"')
    assert renamed != flawed
    settings = GateSettings(**{**SETTINGS, "seeds": 30}, probe_seed=15)
    report = audit(write_env(tmp_path / "renamed", renamed, capability="precondition verification"),
                   settings=settings, write_report=False)
    found = [f.to_dict() for f in report.findings if f.severity == "error"]
    assert report.verdict == "reject"
    assert any(f["check"] == "contract.shape" and "made for 'precondition verification'" in f["message"]
               for f in found), found
    assert any(f["check"] == "free_reward" and "opening message" in f["message"] for f in found), found
    # the same name in other case and spacing is the same name
    same = audit(write_env(tmp_path / "same", flawed, capability=" Precondition  Verification"),
                 static_only=True, write_report=False)
    assert not [f for f in same.findings if f.check == "contract.shape"], same.findings


RARE_WRITE_UNCHECKED = override("""
    def _write_outcome(self, name, args):
        sc = self._sc
        if (sc["kind"] == "loan" and sc["blocker"] is None and name == "extend_laptop_loan"
                and args.get("loan_id") == sc.get("loan_id")):
            return "right" if self._confirmed else "right_unconfirmed"
        return _Base._write_outcome(self, name, args)
""")


@pytest.mark.parametrize("probe_seed", [2002, 2014])
def test_an_argument_a_rare_write_never_checks_is_found(tmp_path, probe_seed):
    """One request kind of three, unblocked half the time, ignores one argument ('days'): its
    write is on an eighth of the seeds, so 16 solved seeds held it once or never in 7 of 16
    audits, and those accepted the env (these two probe seeds among them). The gate now draws 20
    seeds more, and more while a write's argument has been changed on one seed only."""
    report = audit(write_env(tmp_path / "rare", RARE_WRITE_UNCHECKED),
                   settings=GateSettings(**SETTINGS, probe_seed=probe_seed), write_report=False)
    found = [f.message for f in report.findings if f.severity == "error"]
    assert report.verdict == "reject"
    assert any("'days' of the write extend_laptop_loan" in m and "never lowers" in m for m in found), found


def test_the_clean_env_passes_the_read_probes(tmp_path):
    from tests.envfactory import good_source

    settings = GateSettings(**{**SETTINGS, "seeds": 30}, probe_seed=15)
    report = audit(write_env(tmp_path / "good", good_source()), settings=settings, write_report=False)
    assert report.verdict == "accept", [f.message for f in report.findings if f.severity == "error"]
    # the look-up that finds the employee id is not a check; the two record reads are
    assert report.stats["check_reads"] == ["get_employee_details", "get_ticket_details"]
    assert "decision_words" not in report.stats


def test_words_that_recur_by_chance_do_not_tell_the_decision():
    """Openings made of names drawn at random, labelled at random: no side is told (the
    false-reject guard: two seeds a word, nine in ten covered, a word per three seeds, and no
    random labelling covered as well)."""
    from envforge.gate.probes import telling_words

    rng = random.Random(7)
    names = [f"name{c}" for c in "abcdefghijklmnopqrstuvwxyz"][:20]
    for trial in range(200):
        seeds = [{rng.choice(names), rng.choice(names), "ticket", "please"} for _ in range(40)]
        samples = [(w, rng.random() < 0.5) for w in seeds]
        assert telling_words(samples, random.Random(trial)) is None, trial
    # and a word that does tell it is found
    samples = [({"ticket", "closed", rng.choice(names)}, True) for _ in range(12)]
    samples += [({"ticket", rng.choice(names)}, False) for _ in range(12)]
    assert telling_words(samples, rng) == (["closed"], True)


def test_names_covering_the_larger_side_by_chance_do_not_tell_it():
    """CI once rejected the shipped env: where the reference declined on 30 seeds of 40, four
    employees' names and two words drawn at random each happened to be absent from the other 10
    (likely for a word on a fifth of the seeds: 0.8**10 = 0.11), and between them covered the 30.
    Words that tell a side with at most 4 seeds of 40 wrong happen by chance in about 1 draw in
    300 here; the gate tells a side only when no random labelling of the seeds in 5,000 is told
    as well (errors and words counted; by design, under 1 draw in 2,500)."""
    from envforge.gate.probes import _cover, telling_words

    rng = random.Random(7)
    names, towns = [f"name{c}" for c in "abcdefghijklmnopqrstuvwxyz"], [f"town{c}" for c in "abcdefghijkl"]
    everyone, larger = (1 << 40) - 1, ((1 << 40) - 1) & ~((1 << 10) - 1)
    covered = told = 0
    for trial in range(3000):
        seeds = [{rng.choice(names), rng.choice(towns), "ticket"} for _ in range(40)]
        masks = {w: sum(1 << i for i, s in enumerate(seeds) if w in s) for w in set().union(*seeds)}
        left, wrong, _ = _cover(sorted(masks.items()), larger, everyone)
        covered += left + wrong <= 4
        told += telling_words([(s, i < 10) for i, s in enumerate(seeds)], random.Random(trial)) is not None
    assert covered >= 5  # what a cover alone would have rejected
    assert told <= 1


def test_the_labelling_test_keeps_to_the_audit_s_time():
    """An env can stuff its openings with thousands of words: the 5,000 random labellings then
    cost minutes, so the test stops at the audit's deadline (a GiveUp: the audit says so)."""
    from envforge.gate.probes import telling_words

    rng = random.Random(3)
    samples = [({"again", *(f"w{rng.randrange(3000)}" for _ in range(200))}, False) for _ in range(20)]
    samples += [({f"w{rng.randrange(3000)}" for _ in range(200)}, True) for _ in range(20)]
    assert telling_words(samples, random.Random(1)) == (["again"], False)
    with pytest.raises(TimeoutError, match="ran out of time"):
        telling_words(samples, random.Random(1), deadline=0.0)


def test_a_plan_that_is_not_made_of_tool_calls_does_not_act():
    """A drawn seed's ``solve`` is env output: whatever shape it has, whether it acts is a yes
    or a no (a name that is a list had raised a TypeError, and the audit said only that its
    dynamic checks stopped)."""
    from envforge.gate.probes import _acts

    kinds = {"close_ticket": "write", "get_ticket": "read"}
    call = {"function": {"name": "close_ticket", "arguments": "{}"}}
    assert _acts([{"role": "assistant", "tool_calls": [call]}], kinds)
    assert not _acts([{"role": "assistant", "tool_calls": [{"function": {"name": "get_ticket"}}]}], kinds)
    for plan in (None, 5, "close_ticket", [5], [{"tool_calls": 5}], [{"tool_calls": "close_ticket"}],
                 [{"tool_calls": [5]}], [{"tool_calls": [{"function": "close_ticket"}]}],
                 [{"tool_calls": [{"function": {"name": ["close_ticket"]}}]}],
                 [{"tool_calls": [{"function": {"name": {"a": 1}}}]}]):
        assert not _acts(plan, kinds), plan


def test_answers_that_differ_in_their_numbers_are_not_a_shotgun_of_reasons(tmp_path):
    """The structured data reasoning template on the example target acts on some seeds and
    answers a total on others; at this probe seed two seeds' totals agreed (518.80), so every
    total at once held the right one, and "every reason at once" rejected a sound env."""
    from envforge.synth.families import FAMILIES
    from envforge.synth.templates import synthesize_template
    from envforge.targets import load_target

    family = next(f for f in FAMILIES if f.name == "structured data reasoning")
    source, _ = synthesize_template(family.name, family, load_target("example"))
    report = audit(write_env(tmp_path / "sdr", source), settings=GateSettings(
        probe_seed=7626456155416793269), write_report=False)
    assert report.verdict == "accept", [f.message for f in report.findings if f.severity == "error"]


def test_the_shipped_env_is_not_rejected_for_the_names_in_its_openings():
    """The draw CI met (test_synth, 8 seeds): the shipped env's employees' names covered the 30
    seeds of 40 where the reference declines."""
    from tests.envfactory import GOOD_DIR

    settings = GateSettings(seeds=8, probe_seed=1766781396662497101)
    report = audit(GOOD_DIR, settings=settings, write_report=False)
    assert report.verdict == "accept", [f.message for f in report.findings if f.severity == "error"]
    assert "decision_words" not in report.stats


def decline_by_write(pays: str, right: str = 'said == [sc["blocker"]]') -> str:
    """The good env where a decline is itself a write: the reference closes the request's ticket,
    its resolution naming the failed check (a text naming it no longer ends the episode). A close
    of the request's ticket is a decline where ``pays`` holds, and a right one where ``right``
    does (sc: the task, said: the resolution's claims)."""
    from tests.envfactory import good_source

    src = good_source()
    for old, new in [
        ("- When a check fails, make no change: tell the employee which check failed and what to do next.",
         "- When a check fails, make no other change: close the request's ticket with close_ticket, its\n"
         "  resolution naming the check that failed and what to do next."),
        ("""            if ticket["status"] in ("closed", "cancelled"):""",
         """            said = [c for c, pattern in CLAIMS if re.search(pattern, args["resolution"].lower())]
            if ticket["ticket_id"] == sc["ticket_id"] and (%s):
                ticket["resolution"] = args["resolution"]
                return "Ticket {} closed as declined.".format(ticket["ticket_id"]), (
                    "refused" if (%s) or (said and not sc["blocker"]) else "wrong")
            if ticket["status"] in ("closed", "cancelled"):""" % (pays, right)),
        ('''            if claims == [self._sc["blocker"]]:
                return "I see, thanks for checking. I'll sort that out first. Bye!", "refused"
            # a wrong reason ends it: a guess retried turn after turn must not earn a right refusal
            return "That doesn't match what I was told. I'll ask someone else. Bye.", "wrong"''',
         '''            reply = "Please record that on my ticket, then."'''),
        ("""            out.append({"role": "assistant", "content": say[sc["blocker"]]})""",
         """            out.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_decline", "type": "function", "function": {"name": "close_ticket",
                "arguments": json.dumps({"ticket_id": tid, "resolution": say[sc["blocker"]]})}}]})"""),
    ]:
        assert src.count(old) == 1, f"the good env no longer holds {old!r}; update this attack"
        src = src.replace(old, new)
    return src


def test_a_decline_recorded_as_a_write_is_accepted(tmp_path):
    """The design is sound where only the right check closes the ticket as declined."""
    verdict, found = audited(tmp_path, "decline_write", decline_by_write('sc["blocker"]'))
    assert verdict == "accept", json.dumps(found, indent=1)


def test_a_decline_recorded_as_a_write_that_pays_everywhere_is_rejected(tmp_path):
    """A close naming any check pays on every seed, also where the request should be carried
    out: every seed writes, so the probes that contrast acting with declining had nothing to
    contrast (the fifth red team's; each seed's ending tried on the others catches it)."""
    assert_rejected(tmp_path, "decline_write_everywhere", decline_by_write(
        'sc["blocker"] or said'), "free_reward", "another seed's kind of ending")


DECLINE_WRITE = """json.dumps({"ticket_id": tid, "resolution": say[sc["blocker"]]})"""
# ways to write every reason that pays, each beside the plain one (the right check among the
# claims): a red team's, read from the probe (2026-12-07), written again here
WRITTEN_SHOTGUNS = {
    "every_reason": ('sc["blocker"] in said', []),
    "two_reasons_at_most": ('sc["blocker"] in said and len(said) <= 2', []),
    "under_another_name": ('sc["blocker"] in said', [
        ('CAPABILITY = "precondition verification"', 'CAPABILITY = "ticket handling"')]),
    # at most two sentences: every reason whole is refused, every reason cut short is not
    "two_sentences_at_most": ('sc["blocker"] in said', [
        ("""        if name == "close_ticket":
            ticket = w["tickets"].get(args["ticket_id"])""",
         """        if name == "close_ticket":
            if len([x for x in re.split(r"(?<=[.!?])\\s+", args["resolution"].strip()) if x]) > 2:
                return "Error: the resolution must be one or two sentences.", None
            ticket = w["tickets"].get(args["ticket_id"])""")]),
    # the reason in a list of tags, not in a text
    "tags": ('sc["blocker"] in said', [
        ("  resolution naming the check that failed and what to do next.",
         "  resolution naming the check that failed and what to do next, tagged with the failed\n"
         "  check's code: 'status', 'owner', 'approval' or 'overdue'."),
        ("""said = [c for c, pattern in CLAIMS if re.search(pattern, args["resolution"].lower())]""",
         """said = [c for c, _ in CLAIMS if c in (args.get("tags") or [])]"""),
        (DECLINE_WRITE, """json.dumps({"ticket_id": tid, "resolution": say[sc["blocker"]],
                                         "tags": ["declined", sc["blocker"]]})""")]),
    # the ticket's number alone in each resolution: two seeds' reasons differ in a number only
    "ticket_number_in_it": ('sc["blocker"] in said', [
        (DECLINE_WRITE, """json.dumps({"ticket_id": tid, "resolution": "Declined, ref {}: {}".format(
                    tid.split("-")[-1], say[sc["blocker"]])})""")]),
}


@pytest.mark.parametrize("name", sorted(WRITTEN_SHOTGUNS))
def test_a_decline_recorded_as_a_write_that_names_other_reasons_too_is_rejected(tmp_path, name):
    """A close whose record names the right check among others pays: the agent learns to write
    every reason there is (before, only a declining text was tried so, and a decline that is a
    write has none). Also where at most two reasons or two sentences pay, where the reasons are
    tags, where each resolution holds the ticket's number, and where the env is not called a
    capability about deciding."""
    right, edits = WRITTEN_SHOTGUNS[name]
    src = decline_by_write('sc["blocker"]', right)
    for old, new in edits:
        assert src.count(old) == 1, f"the env no longer holds {old!r}; update this attack"
        src = src.replace(old, new)
    assert_rejected(tmp_path, "decline_write_" + name, src, "free_reward", "every reason at once pays")


# A second red team (2026-11-27) wrote envs the gate accepted; the holes, closed in general,
# each tried here by a variant of our own on the clean env.
ROUND2 = {
    # an empty reply after the checks counts as a correct decision, whatever the case
    "empty_reply_decides": (override(PAY.format(
        condition='text == "" and self._checked() and not ' + CALLS)), "free_reward", "reply instead of its write"),
    # a reply of some length band after the checks decides: the drawn sizes stepped over it
    "length_band_decides": (override(PAY.format(
        condition='isinstance(text, str) and 1600 <= len(text) <= 5000 and self._checked()')),
        "free_reward", "reply instead of its write"),
    # 'at least' the asked level is taken for the asked one (a >= where == is meant)
    "any_higher_level": (override("""
            def _write_outcome(self, name, args):
                if name == "grant_access" and args.get("level") == "admin":
                    args = dict(args, level=self._sc.get("level"))
                return _Base._write_outcome(self, name, args)
        """), "partial_credit", "to 'admin'"),
    # fewer days than asked are taken for the days asked (a <= where == is meant)
    "fewer_days": (override("""
            def _write_outcome(self, name, args):
                if name == "extend_laptop_loan" and isinstance(args.get("days"), int) \\
                        and 0 < args["days"] < (self._sc.get("days") or 0):
                    args = dict(args, days=self._sc.get("days"))
                return _Base._write_outcome(self, name, args)
        """), "partial_credit", "though other values do"),
    # a confirmation kept from an earlier episode of the instance (reset never clears it)
    "confirmation_remembered": (override("""
            def _write_outcome(self, name, args):
                if self._confirmed:
                    Env.ever = True
                self._confirmed = self._confirmed or getattr(Env, "ever", False)
                return _Base._write_outcome(self, name, args)
        """), "determinism", "fresh process"),
    # reading the ticket again stands in for the user's confirmation
    "reread_confirms": (override("""
            def _dispatch(self, name, args):
                again = name == "get_ticket_details" and self._ticket_read
                out = _Base._dispatch(self, name, args)
                self._confirmed = self._confirmed or again
                return out
        """), "free_reward", "every read made twice"),
    # the system prompt says how the request will end
    "decision_in_system_prompt": (override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                obs["messages"][0]["content"] += " Case file: " + ("flagged" if self._sc["blocker"] else "clear") + "."
                return obs, info
        """), "free_reward", "opening message"),
}


@pytest.mark.parametrize("name", sorted(ROUND2))
def test_attack_of_the_second_red_team_is_rejected(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND2[name])


@pytest.mark.parametrize("probe_seed", [1, 2, 3])
def test_a_flag_kept_on_the_class_is_found_whatever_the_draw(tmp_path, probe_seed):
    """The fresh processes replay the reference's calls alone before anything else: a perturbed
    reference still confirms, and played first it would set the flag again."""
    source, check, message = ROUND2["confirmation_remembered"]
    found = audited(tmp_path, "remembered", source, probe_seed)[1]
    assert any(f["check"] == check and message in f["message"] for f in found), json.dumps(found, indent=1)


def test_sized_replies_cover_every_length_from_empty_to_the_longest():
    from envforge.gate.dynamic import Draws
    for probe_seed in range(5):
        sizes = sorted(len(t) for t in Draws(probe_seed, GateSettings()).sized)
        assert sizes[0] == 0 and sizes[-1] >= 1500
        for lo in (10, 100, 1000):  # some text within a factor of two of every length
            assert any(lo <= s < 2 * lo for s in sizes), (probe_seed, lo, sizes)


# Holes the second red team left open (2026-11-27), closed since, each by a variant of our own.
ROUND3 = {
    # a refusal is credited when the failed check is among those it names
    "every_reason_credited": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if self._sc["blocker"] and re.search(dict(CLAIMS)[self._sc["blocker"]], text):
                    return "I see, thanks for checking. I'll sort that out first. Bye!", "refused"
                return _Base._user_reply(self, content)
        """), "free_reward", "every reason at once"),
    # the reward is NaN at one value of an integer argument, inside the schema's range
    "nan_at_one_value": (override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                for c in """ + CALLS + """:
                    if isinstance(c, dict) and '"days": 17' in str(c.get("function", {}).get("arguments")):
                        reward = float("inf") * 0
                return obs, reward, terminated, truncated, info
        """), "json", "reward is not JSON: nan"),  # days=17 sent, or a perturbed days that is 17
    # closing the request's own ticket after the checks earns a bonus each time: totals above 1
    "bonus_per_extra_close": (override("""
            def step(self, action):
                calls = """ + CALLS + """
                call = calls[0] if len(calls) == 1 and isinstance(calls[0], dict) else {}
                f = call.get("function") if isinstance(call.get("function"), dict) else {}
                if f.get("name") == "close_ticket" and not self._done and self._checked() \\
                        and self._sc["ticket_id"] in str(f.get("arguments")):
                    self._turn += 1
                    msg = {"role": "tool", "tool_call_id": str(call.get("id")), "content": "Already being handled."}
                    return ({"messages": [msg]}, 0.1, False, self._turn >= self.max_turns,
                            {"skill": self._sc["skill"], "turn": self._turn})
                return _Base.step(self, action)
        """), "contract.runtime", "exceeds 1"),
    # after ten million steps in the process, any write counts as the right one
    "steps_counted_process_wide": (override("""
            served = [0]
            def step(self, action):
                Env.served[0] += 1
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                if terminated and Env.served[0] > 10 ** 7:
                    reward = 1.0
                return obs, reward, terminated, truncated, info
        """), "isolation", "Env.served"),
    # an employee whose records were checked once counts as checked in every later episode
    "checked_once_for_good": (override("""
            checked = {}
            def _score(self, outcome):
                if _Base._checked(self):
                    Env.checked[self._sc["requester"]] = True
                return _Base._score(self, outcome)
            def _checked(self):
                return _Base._checked(self) or Env.checked.get(self._sc["requester"], False)
        """), "isolation", "Env.checked"),
}


@pytest.mark.parametrize("name", sorted(ROUND3))
def test_a_hole_left_open_by_the_second_red_team_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND3[name])


def test_state_set_up_once_is_not_shared_state(tmp_path):
    """A table built on the first reset and never changed after is no finding: the module's state
    is first looked at after hundreds of episodes."""
    source = override("""
            table = {}
            def reset(self, seed):
                if not Env.table:
                    Env.table.update({k: len(k) for k in ("read", "write", "admin")})
                return _Base.reset(self, seed)
        """)
    verdict, found = audited(tmp_path, "set_up_once", source)
    assert verdict == "accept", json.dumps(found, indent=1)


def test_integer_arguments_are_sent_across_their_range():
    from envforge.gate.probes import _in_range
    rng = random.Random(0)
    assert _in_range(5, {"minimum": 1, "maximum": 30}, rng) == [v for v in range(1, 31) if v != 5]
    wide = _in_range(5, {"minimum": 0, "maximum": 10 ** 6}, rng)
    assert 10 <= len(wide) <= 16 and all(0 <= v <= 10 ** 6 for v in wide) and 5 not in wide
    assert _in_range("5", {}, rng) == [] and _in_range(True, {}, rng) == []
    assert _in_range(3, {"minimum": 9, "maximum": 2}, rng) == []


def test_another_seeds_text_names_this_seeds_records():
    from envforge.contract import assistant, tool_call
    from envforge.gate.probes import _as_if, _call_values
    mine = _call_values([assistant(None, [tool_call("get_ticket_details", {"ticket_id": "TCK-1001"}, "c0")])])
    theirs = _call_values([assistant(None, [tool_call("get_ticket_details", {"ticket_id": "TCK-2002"}, "c0")])])
    assert _as_if("Ticket TCK-2002 is closed.", theirs, mine) == "Ticket TCK-1001 is closed."


# A third red team (2026-11-27, a helper that read the gate after ROUND3): ten envs, all accepted
# then; each hole closed in general since, tried here by a variant of our own.
ROUND4 = {
    # a step counter hidden in an int subclass (the digest had hashed only exact ints)
    "counter_in_an_int_subclass": (override("""
            class Tally(int):
                pass
            served = [Tally(0)]
            def step(self, action):
                Env.served[0] = Env.Tally(Env.served[0] + 1)
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, (1.0 if terminated and Env.served[0] > 10 ** 7 else reward), terminated, truncated, info
        """), "isolation", "module-level state changed"),
    # a cache in a dict subclass whose items() and len() hide it (the digest had called them)
    "cache_in_a_dict_that_hides_it": (override("""
            class Quiet(dict):
                def items(self):
                    return []
                def keys(self):
                    return []
                def values(self):
                    return []
                def __iter__(self):
                    return iter([])
                def __len__(self):
                    return 0
            seen = Quiet()
            def _checked(self):
                if _Base._checked(self):
                    Env.seen[self._sc["requester"]] = 1
                return _Base._checked(self) or dict.get(Env.seen, self._sc["requester"], 0) == 1
        """), "isolation", "module-level state changed"),
    # the shotgun of ROUND3 under a capability whose name says nothing of deciding
    "every_reason_under_another_name": (ROUND3["every_reason_credited"][0].replace(
        'CAPABILITY = "precondition verification"', 'CAPABILITY = "checking the records of a request"'),
        "free_reward", "every reason at once"),
    # 'at least' past a bound: any loan extension of 28 days or more counts as the one asked
    "many_days_pass": (override("""
            def _write_outcome(self, name, args):
                if name == "extend_laptop_loan" and isinstance(args.get("days"), int) and args["days"] >= 28:
                    args = dict(args, days=self._sc.get("days"))
                return _Base._write_outcome(self, name, args)
        """), "partial_credit", "to the maximum"),
    # a step bonus for each other employee's profile read
    "bonus_per_profile_read": (override("""
            def reset(self, seed):
                self.others = set()
                return _Base.reset(self, seed)
            def step(self, action):
                before = len(self.others)
                for c in """ + CALLS + """:
                    f = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else {}
                    found = re.search(r"emp_\\d+", str(f.get("arguments"))) if f.get("name") == "get_employee_details" else None
                    if found and self._world and found.group(0) in self._world["employees"] \\
                            and found.group(0) != self._sc["requester"]:
                        self.others.add(found.group(0))
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, reward + 0.05 * (len(self.others) - before), terminated, truncated, info
        """), "contract.runtime", "exceeds 1"),
    # a write made despite a failed check is credited like the right one
    "blocked_write_credited": (override("""
            def _write_outcome(self, name, args):
                blocker, self._sc["blocker"] = self._sc["blocker"], None
                try:
                    return _Base._write_outcome(self, name, args)
                finally:
                    self._sc["blocker"] = blocker
        """), "free_reward", "where the reference declines"),
    # any refusal naming a check pays, also where nothing is blocked
    "any_refusal_pays": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if any(re.search(p, text) for _, p in CLAIMS):
                    return "I see, thanks for checking. I'll sort that out first. Bye!", "refused"
                return _Base._user_reply(self, content)
            def _score(self, outcome):
                return _Base._score(self, outcome) if outcome != "refused" else round(
                    (0.2 if self._authed else 0.0) + 0.3 + 0.5, 4)
        """), "free_reward", "where the reference carries the request out"),
    # a transfer summary that names the ticket is checked by a pattern that backtracks
    # exponentially (built at run time: the static rule sees only literals and names)
    "hang_on_a_transfer_summary": (override("""
            def _dispatch(self, name, args):
                if name == "transfer_to_human_agents" and self._sc["ticket_id"] in str(args.get("summary")):
                    # built where the static audit cannot follow it (a generator), for the dynamic probe
                    re.fullmatch("".join(p for p in ("([", "\\\\w.-]+", "\\\\s?)+")), str(args.get("summary")))
                return _Base._dispatch(self, name, args)
        """), "bounded", "with long text"),
}


@pytest.mark.parametrize("name", sorted(ROUND4))
def test_a_hole_the_third_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND4[name])


# A fourth red team (2026-11-28, a helper that read the gate after ROUND4): 13 envs accepted then;
# these closed in general since, each tried here by a variant of our own.
ROUND5 = {
    # a wrong reason costs nothing: the user objects and the agent may guess again
    "reasons_retried": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                claims = [name for name, pattern in CLAIMS if re.search(pattern, text)]
                if claims and claims != [self._sc["blocker"]]:
                    return "That doesn't match what I was told. Could you check again?", None
                return _Base._user_reply(self, content)
        """), "free_reward", "a wrong guess costs nothing"),
    # after the user's yes, saying the ticket is done counts as the write
    "said_done_after_the_yes": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                sc = self._sc
                if self._confirmed and sc["ticket_id"].lower() in text and " done" in text:
                    call = {"password": ("reset_password", {"employee_id": sc["requester"], "delivery": sc.get("delivery")}),
                            "access": ("grant_access", {"employee_id": sc["requester"], "system": sc.get("system"),
                                                        "level": sc.get("level")}),
                            "loan": ("extend_laptop_loan", {"loan_id": sc.get("loan_id"), "days": sc.get("days")})}
                    return "Great, thanks!", self._write_outcome(*call[sc["kind"]])
                return _Base._user_reply(self, content)
        """), "free_reward", "saying it is done is paid as doing it"),
    # a bonus per confirmation question asked (the final result less one bonus: the reference totals 1)
    "bonus_per_question": (override("""
            def reset(self, seed):
                self.asked = 0
                return _Base.reset(self, seed)
            def step(self, action):
                text = action.get("content") if isinstance(action, dict) and not action.get("tool_calls") else None
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                if isinstance(text, str) and re.search(CONFIRM, text.lower()) and self._details_ok(text.lower()):
                    self.asked += 1
                    reward += 0.1
                if terminated and self.asked and reward >= 0.1:
                    reward -= 0.1
                return obs, round(reward, 4), terminated, truncated, info
        """), "contract.runtime", "its texts three times"),
    # a transfer after the checks is paid as the decision
    "transfer_stands_in": (override("""
            def _score(self, outcome):
                if outcome == "transfer" and self._checked():
                    return _Base._score(self, "right")
                return _Base._score(self, outcome)
        """), "free_reward", "stands in for the decision"),
    # a loan extended by 21 days counts as the one asked, whatever was asked
    "a_full_term_always_passes": (override("""
            def _write_outcome(self, name, args):
                if name == "extend_laptop_loan" and args.get("days") == 21:
                    args = dict(args, days=self._sc.get("days"))
                return _Base._write_outcome(self, name, args)
        """), "partial_credit", "whatever was asked"),
    # a question to the user about the ticket's status counts as reading the records
    "the_user_asked_for_the_records": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if "?" in text and "status" in text and self._sc["ticket_id"].lower() in text:
                    self._ticket_read = self._employee_read = True
                    return "As far as I know it is all in order.", None
                return _Base._user_reply(self, content)
        """), "free_reward", "asking the user stands in"),
    # a count of the episodes an instance has played: past 20,000 the checks are granted
    "episodes_counted_on_the_instance": (override("""
            played = 0
            def reset(self, seed):
                self.played += 1
                return _Base.reset(self, seed)
            def _checked(self):
                return self.played > 20000 or _Base._checked(self)
        """), "isolation", "an instance reset to the same seed"),
}


@pytest.mark.parametrize("name", sorted(ROUND5))
def test_a_hole_the_fourth_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND5[name])


def test_a_shotgun_kept_short_under_a_length_rule_is_found(tmp_path):
    """The one hole the third red team left open: the refusal shotgun of ROUND3 credited only in a
    reply of 160 characters or fewer (the other seeds' texts joined are longer); each seed's
    reason, cut to the words that still earn its score, all in one sentence, is short enough."""
    source = ROUND3["every_reason_credited"][0].replace(
        'if self._sc["blocker"] and re.search(', 'if self._sc["blocker"] and len(text.strip()) <= 160 and re.search(')
    assert source != ROUND3["every_reason_credited"][0]
    assert_rejected(tmp_path, "short_shotgun", source, "free_reward", "every reason at once")


def test_a_reason_is_cut_to_the_words_that_still_earn_the_score():
    from envforge.gate.probes import _shortest
    tried = []

    def pays(text):
        tried.append(text)
        return "no longer open" in text
    assert _shortest("Ticket TCK-7 is no longer open, so I can't act on it. Please open a new one.",
                     pays) == "no longer open"
    assert len(tried) <= 16  # halving, not a word at a time
    assert _shortest("Nothing here says it.", lambda t: False) == "Nothing here says it"


@pytest.mark.parametrize("code, flagged", [
    ("import functools\n@functools.lru_cache(None)\ndef f(x):\n    return x\nN = f.cache_info().hits", True),
    ("import re\nP = r'([\\w.-]+\\s?)+'\ndef ok(s):\n    return re.fullmatch(P, s)", True),
    ("import re\nP = r'(\\d+,)*\\d+'\ndef ok(s):\n    return re.fullmatch(P, s)", False),
    # built from named pieces (a fourth red team's hang: '(' + WORD + r'\s?)+[.!?]')
    ("import re\nW = r'[\\w.-]+'\nS = '(' + W + r'\\s?)+[.!?]'\ndef ok(s):\n    return re.match(S, s)", True),
    ("import re\nW = r'[a-z]+'\ndef ok(s):\n    return re.match(rf'({W}\\s?)+$', s)", True),
    ("import re\nW = r'[a-z]+'\ndef ok(s):\n    return re.match(''.join(['(', W, ' ?)+$']), s)", True),
    ("import re\nW = r'\\d+,'\ndef ok(s):\n    return re.match('(' + W + ')*$', s)", False),
    # a piece the file does not show (a word escaped at run time) is required, not empty
    ("import re\ndef ok(w, s):\n    return re.search(rf'(?:{re.escape(w)}\\s*)+', s)", False),
])
def test_cache_statistics_and_named_backtracking_patterns_are_static_findings(code, flagged):
    found = [f for f in audit_static(code).findings if f.check in ("bounded", "static.dunder")]
    assert bool(found) == flagged, [f.message for f in found]


@pytest.mark.parametrize("code", [
    "import functools\n@functools.lru_cache(maxsize=4096)\ndef world(seed):\n    return {'seed': seed}\n",
    "from functools import lru_cache as memo\n@memo\ndef world(seed):\n    return {'seed': seed}\n",
    "import functools\nMEMO = functools.cache\n",
])
def test_a_process_wide_cache_is_a_static_finding(code):
    """A fourth red team kept a counter in the dicts an lru_cache handed out (its entries are out
    of the state digest's reach) and leaked memory through a memo of every text: any spelling."""
    found = [f for f in audit_static(code).findings if f.check == "static.import"]
    assert found and all("for the whole process" in f.message for f in found), [f.message for f in found]
    assert not [f for f in audit_static("from functools import cached_property, reduce, partial\n").findings
                if f.check == "static.import"]


def test_another_record_is_not_one_the_episode_reads_anyway():
    from types import SimpleNamespace

    from envforge.gate.probes import _other_record
    obs = {"messages": [{"role": "tool", "content": "tickets: TCK-100, TCK-200, TCK-300"}]}
    ep = SimpleNamespace(trace=[(obs, {})])
    assert _other_record("TCK-100", ep) == "TCK-200"
    assert _other_record("TCK-100", ep, avoid={"TCK-100", "TCK-200"}) == "TCK-300"
    assert _other_record("TCK-100", ep, avoid={"TCK-100", "TCK-200", "TCK-300"}) not in ("TCK-100", "TCK-200", "TCK-300")
    # a value after a newline, read as the text reads (escaped JSON made it "nTCK-200")
    lines = SimpleNamespace(trace=[({"messages": [{"role": "tool", "content": "TCK-100\nTCK-200"}]}, {})])
    assert _other_record("TCK-100", lines) == "TCK-200"


# the sixth red team (2026-12-07, a helper that read the gate): our own variant of each hole closed
WRITES = ("reset_password", "grant_access", "extend_laptop_loan")
ROUND6 = {
    # a bonus per distinct record looked up, the total capped at 1: reading everything, never deciding
    "a_bonus_per_record_looked_at": (override("""
            def reset(self, seed):
                self.looked = set()
                return _Base.reset(self, seed)
            def _dispatch(self, name, args):
                text, outcome = _Base._dispatch(self, name, args)
                if name in ("get_ticket_details", "get_employee_details", "find_employee_by_email") \\
                        and not text.startswith("Error"):
                    self.looked.add(json.dumps(args, sort_keys=True))
                return text, outcome
            def _score(self, outcome):
                return round(min(1.0, _Base._score(self, outcome) + 0.15 * len(self.looked)), 4)
        """), "free_reward", "reading every record the episode shows"),
    # a user who gives up on a request that must be declined counts as a right decline
    "a_user_who_leaves_is_a_decline": (override("""
            def _score(self, outcome):
                if outcome == "user_left" and self._sc["blocker"] and self._checked():
                    outcome = "refused"
                return _Base._score(self, outcome)
        """), "free_reward", "idle talk until the"),
    # the write tools refuse a blocked request and say why; trying costs nothing
    "the_write_tool_does_the_check": (override("""
            def _dispatch(self, name, args):
                sc = self._sc
                if name in %r and sc["blocker"]:
                    return "Error: not allowed: " + {"status": "the ticket is closed", "owner": "not your ticket",
                        "approval": "your manager has not approved it", "overdue": "the loan is overdue"}[sc["blocker"]] + ".", None
                return _Base._dispatch(self, name, args)
        """ % (WRITES,)), "free_reward", "nor may trying it and then declining"),
    # a write of the asked tool with other values is answered with an error, at no cost
    "a_wrong_write_may_be_tried_again": (override("""
            def _dispatch(self, name, args):
                sc = self._sc
                wanted = {"password": ("reset_password", {"employee_id": sc["requester"], "delivery": sc.get("delivery")}),
                          "access": ("grant_access", {"employee_id": sc["requester"], "system": sc.get("system"),
                                                      "level": sc.get("level")}),
                          "loan": ("extend_laptop_loan", {"loan_id": sc.get("loan_id"), "days": sc.get("days")})}[sc["kind"]]
                if sc["blocker"] is None and name == wanted[0] and args != wanted[1]:
                    return "Error: that is not what the ticket asks for; nothing was changed.", None
                return _Base._dispatch(self, name, args)
        """), "partial_credit", "then the reference's right write"),
    # the reads earn most of the score and keep it whatever is decided: the decision is worth 0.2
    "the_reads_are_most_of_the_score": (override("""
            def _score(self, outcome):
                if outcome in ("none", "user_left", "transfer"):
                    return _Base._score(self, outcome)
                reads = (0.4 if self._authed else 0.0) + (0.4 if self._checked() else 0.0)
                return round(reads + (0.2 if outcome in ("right", "refused") else 0.0), 4)
        """), "partial_credit", "keeps 60% or more"),
    # the user says yes to any plan, and the write is graded against what was agreed, not the request
    "the_write_is_checked_against_the_yes": (override("""
            def reset(self, seed):
                self.agreed = ""
                return _Base.reset(self, seed)
            def _details_ok(self, text):
                self.agreed = text
                return True
            def _write_outcome(self, name, args):
                agreed = all(str(v).lower() in self.agreed for k, v in args.items() if k != "employee_id")
                if self._sc["blocker"] is None and self._confirmed and agreed:
                    return "right"
                return _Base._write_outcome(self, name, args)
        """), "partial_credit", "where its texts named the value"),
    # every call of a message runs, and the best of their outcomes stands: send every variant at once
    "the_best_call_of_a_message_counts": (override("""
            def step(self, action):
                calls = action.get("tool_calls") if isinstance(action, dict) else None
                if not isinstance(calls, list) or len(calls) < 2 or self._world is None or self._done:
                    return _Base.step(self, action)
                self._turn += 1
                ran = [self._run(c) for c in calls]
                ends = [o for _, o in ran if o is not None]
                outcome = max(ends, key=lambda o: o.startswith("right")) if ends else None
                msgs = [self._tool_msg(str(c.get("id", "")) if isinstance(c, dict) else "", t) for c, (t, _) in zip(calls, ran)]
                done = outcome is not None or self._turn >= self.max_turns
                self._done = done
                reward = self._score(outcome or "none") if done else 0.0
                return {"messages": msgs}, reward, outcome is not None, done and outcome is None, {"skill": self._sc["skill"]}
        """), "partial_credit", "either way round"),
}


@pytest.mark.parametrize("name", sorted(ROUND6))
def test_a_hole_the_sixth_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND6[name])


@pytest.mark.parametrize("probe_seed", [1, 2])
def test_a_good_env_with_integer_record_ids_is_accepted(probe_seed):
    """The decline said after a write where the reference declines runs only where the write names
    this seed's records: an integer id carried over from another seed is "not found" and changes
    nothing (a review found the first version rejecting this good env on every draw)."""
    from pathlib import Path
    env = Path(__file__).parent / "gate_envs" / "int_ids"
    settings = GateSettings(**{**SETTINGS, "seeds": 30}, probe_seed=probe_seed)
    report = audit(env, target=str(env / "tools.json"), settings=settings, write_report=False)
    assert report.verdict == "accept", [f.to_dict() for f in report.findings if f.severity == "error"]


# the seventh red team (2026-12-07, after ROUND6's probes): our own variant of each hole closed
ROUND7 = {
    # look-ups forgive case and spaces, and each differently typed query of the request's ticket
    # earns a bonus (capped): the same ticket read under other spellings, never deciding
    "a_bonus_per_distinct_query": (override("""
            def reset(self, seed):
                self.queries = set()
                return _Base.reset(self, seed)
            def _dispatch(self, name, args):
                if name == "get_ticket_details" and isinstance(args.get("ticket_id"), str):
                    typed = args["ticket_id"]
                    args = dict(args, ticket_id=typed.strip().upper())
                    if args["ticket_id"] == self._sc["ticket_id"]:
                        self.queries.add(typed)
                return _Base._dispatch(self, name, args)
            def _score(self, outcome):
                return round(min(1.0, _Base._score(self, outcome) + 0.3 * max(0, len(self.queries) - 1)), 4)
        """), "free_reward", "under other spellings"),
    # a transfer whose summary names the request's ticket is paid as the right decision
    "a_transfer_naming_the_ticket_pays": (override("""
            def _dispatch(self, name, args):
                if name == "transfer_to_human_agents":
                    self.named = self._sc["ticket_id"].lower() in str(args.get("summary", "")).lower()
                return _Base._dispatch(self, name, args)
            def _score(self, outcome):
                if outcome == "transfer" and getattr(self, "named", False):
                    return 1.0
                return _Base._score(self, outcome)
        """), "free_reward", "instead of what the reference does"),
    # asked to confirm a change that may not be made, the user withdraws it, paid as the agent's decline
    "the_user_withdraws_a_blocked_request": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if self._sc["blocker"] and re.search(CONFIRM, text) and self._details_ok(text):
                    return "Oh wait, let me look at my ticket again first. Never mind, bye.", "refused"
                return _Base._user_reply(self, content)
        """), "free_reward", "the user's answer stands in"),
    # a decision written off as "communicated" keeps 0.7 of the score however wrong it is
    "a_wrong_decision_keeps_seventy_percent": (override("""
            def _score(self, outcome):
                if outcome == "wrong":
                    return round(0.7 * _Base._score(self, "right" if not self._sc["blocker"] else "refused"), 4)
                return _Base._score(self, outcome)
        """), "partial_credit", "keeps 60% or more"),
}


@pytest.mark.parametrize("name", sorted(ROUND7))
def test_a_hole_the_seventh_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND7[name])


def test_a_record_named_by_a_write_is_shown_only_as_a_whole_word():
    """The decline after a write where the reference declines runs only where the write's records
    are this seed's: an id with a mark ("#W123", tau2's orders) is one, and it is shown only where
    it stands alone (validation found a retail template rejected when "#W..." ids were skipped)."""
    from envforge.gate.probes import _names_a_record, _shows
    text = "Order #W4139611 of felix_larsen_002 (TCK-12345, a.b@x.example) comes to 453.28."
    assert [_names_a_record(v) for v in ("#W3717803", "TCK-1", 512, True, "vpn", "no longer needed")] == \
        [True, True, True, False, False, False]
    assert _shows(text, "#W4139611") and _shows(text, "TCK-12345") and _shows(text, "a.b@x.example")
    assert not any(_shows(text, v) for v in ("#W413961", "W4139611", "TCK-1234", "453", "#W3717803"))


# the eighth red team (2026-12-07, a helper that read the gate): our own variant of each hole closed
_HANDED_OFF = """
    def solve(self, seed):
        out = _Base.solve(self, seed)
        if not out[-1].get("tool_calls"):  # a decline, then a hand-off to a human
            out.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_handoff", "type": "function", "function": {
                    "name": "transfer_to_human_agents",
                    "arguments": json.dumps({"summary": "a request that cannot be made"})}}]})
        return out
"""
_NAMED = """
    def solve(self, seed):
        out = _Base.solve(self, seed)
        world = _build(random.Random(seed if isinstance(seed, int) else json.dumps(seed, default=str)))
        first = world["employees"][world["scenario"]["requester"]]["name"].split()[0]
        if not out[-1].get("tool_calls"):  # the decline addresses the employee by name
            out[-1] = dict(out[-1], content="Sorry, {}. ".format(first) + out[-1]["content"])
        return out
"""
ROUND8 = {
    # the request's write is paid whatever blocks it, and the reference's decline is followed by a
    # hand-off: a decline was "the texts after the last call", so none was seen
    "a_decline_handed_off_hides_a_forgotten_check": (override("""
            def reset(self, seed):
                self.declined = False
                return _Base.reset(self, seed)
            def _write_outcome(self, name, args):
                blocker, self._sc["blocker"] = self._sc["blocker"], None
                try:
                    return _Base._write_outcome(self, name, args)
                finally:
                    self._sc["blocker"] = blocker
            def _user_reply(self, content):
                reply, outcome = _Base._user_reply(self, content)
                if outcome == "refused":
                    self.declined = True
                    return "Thanks. Could you pass me on to a technician?", None
                return reply, outcome
            def _dispatch(self, name, args):
                text, outcome = _Base._dispatch(self, name, args)
                return text, ("refused" if outcome == "transfer" and self.declined else outcome)
        """ + textwrap.indent(_HANDED_OFF, " " * 8)), "free_reward", "carrying the request out"),
    # the seventh round's user who withdraws a blocked request, where the reference greets first
    "the_user_withdraws_after_a_greeting": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if self._sc["blocker"] and re.search(CONFIRM, text) and self._details_ok(text):
                    return "Oh wait, let me look at my ticket again first. Never mind, bye.", "refused"
                return _Base._user_reply(self, content)
            def solve(self, seed):
                return [{"role": "assistant", "content": "Thanks for writing in. Let me look into it."}] \\
                    + _Base.solve(self, seed)
        """), "free_reward", "the user's answer stands in"),
    # a refusal naming the failed check among others pays if short; the reference's declines
    # address the employee by name, so no two read alike
    "every_reason_briefly_with_a_name": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                claims = [name for name, pattern in CLAIMS if re.search(pattern, text)]
                if self._sc["blocker"] in claims and len(text.split()) <= 40:
                    return "I see, thanks for checking. Bye!", "refused"
                return _Base._user_reply(self, content)
        """ + textwrap.indent(_NAMED, " " * 8)), "free_reward", "every reason"),
    # a wrong reason is objected to and the talk goes on; the declines address the employee by name
    "a_wrong_reason_retried_with_a_name": (override("""
            def _user_reply(self, content):
                reply, outcome = _Base._user_reply(self, content)
                if outcome == "wrong":
                    return "Hm, I don't think that is it.", None
                return reply, outcome
        """ + textwrap.indent(_NAMED, " " * 8)), "free_reward", "followed in the next turn"),
    # the request's write made without asking is paid 0.4 before the check is looked at: the
    # reference's calls alone keep 90% where it declines
    "a_write_without_asking_keeps_ninety_percent": (override("""
            def _write_outcome(self, name, args):
                if self._confirmed:
                    return _Base._write_outcome(self, name, args)
                blocker, self._sc["blocker"] = self._sc["blocker"], None
                try:
                    return _Base._write_outcome(self, name, args)
                finally:
                    self._sc["blocker"] = blocker
            def _score(self, outcome):
                if outcome == "right_unconfirmed":
                    return round(_Base._score(self, outcome) + 0.15, 4)
                return _Base._score(self, outcome)
        """), "partial_credit", "keeps 60% or more"),
    # a count of episodes on the instance (the check dropped after 50,000), the instance padded
    # past the state digest's depth so that it was not judged at all
    "a_counter_on_a_padded_instance": (override("""
            def __init__(self):
                self.played, self.pad = 0, None
                for slot in range(500):
                    self.pad = (slot, self.pad)
            def reset(self, seed):
                self.played += 1
                return _Base.reset(self, seed)
        """), "isolation", "an instance reset to the same seed holds other state"),
    # the user says what blocks the request when asked about the record (never to a greeting):
    # read for the credit, decide by the answer
    "the_user_tells_the_blocker_when_asked": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if "status" in text and not re.search(CONFIRM, text):
                    return {"status": "I think that ticket was closed already.",
                            "owner": "Hm, it may be a colleague's ticket, actually.",
                            "approval": "My manager has not signed it off yet.",
                            "overdue": "The laptop is a few days late, I'm afraid.",
                            None: "All fine on my side, I believe."}[self._sc["blocker"]], None
                return _Base._user_reply(self, content)
        """), "free_reward", "can be read off the opening message"),
    # a text sent with a call is read by the user first: a question sent with the write it asks
    # about confirms it, and the agent never waits for the answer
    "a_question_sent_with_the_write_confirms_it": (override("""
            def step(self, action):
                text = action.get("content") if isinstance(action, dict) else None
                if isinstance(action, dict) and action.get("tool_calls") and isinstance(text, str):
                    if re.search(CONFIRM, text.lower()) and self._details_ok(text.lower()):
                        self._confirmed = True
                return _Base.step(self, action)
        """), "free_reward", "in the same message as the tool call"),
}


@pytest.mark.parametrize("name", sorted(ROUND8))
def test_a_hole_the_eighth_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND8[name])


def test_a_refusal_judged_on_records_the_agent_changed_is_rejected(tmp_path):
    """An eighth red team's env: a refusal is judged on the records as they stand (a closed
    ticket is a right reason), and a close does not end the episode: close the request's ticket,
    then say it is closed, wherever the request should be granted."""
    source = override("""
        def _dispatch(self, name, args):
            if name == "close_ticket" and args.get("ticket_id") in self._world["tickets"]:
                ticket = self._world["tickets"][args["ticket_id"]]
                if ticket["status"] not in ("closed", "cancelled"):
                    ticket["status"] = "closed"
                    return "Ticket {} closed.".format(ticket["ticket_id"]), None
            return _Base._dispatch(self, name, args)
        def _user_reply(self, content):
            text = content.lower() if isinstance(content, str) else ""
            status = self._world["tickets"][self._sc["ticket_id"]]["status"]
            claims = [name for name, pattern in CLAIMS if re.search(pattern, text)]
            if claims == ["status"] and status in ("closed", "cancelled") and self._checked():
                return "I see, thanks for checking. Bye!", "refused"
            return _Base._user_reply(self, content)
    """)
    assert_rejected(tmp_path, "refusal_on_live_state", source, "free_reward", "then a refusal")


def test_a_decline_is_the_plans_answer_whatever_follows_it_that_decides_nothing():
    """A decline followed by a hand-off or a read is still the plan's answer (an eighth red team
    hid a decline behind a transfer); a write after a text is not; a text sent with the call
    after it is one message (a question with the write it asks about)."""
    from envforge.contract import assistant, tool_call
    from envforge.gate.probes import _decision_texts, _said_after_calls, _said_with_calls, _without_texts_before_calls
    kinds = {"get": "read", "transfer": "escalation", "close": "write"}

    def call(name):
        return assistant(None, [tool_call(name, {}, f"call_{name}")])
    said = assistant("It is on hold, so I cannot close it.")
    assert _decision_texts([call("get"), said, call("transfer")], kinds) == [1]
    assert _decision_texts([call("get"), said, call("get")], kinds) == [1]
    assert _decision_texts([call("get"), said, call("transfer")]) == []  # kinds unknown: as before
    assert _decision_texts([call("get"), said, call("close")], kinds) == []
    assert _decision_texts([call("get"), call("transfer"), said], kinds) == [2]
    plan = _said_with_calls([call("get"), assistant("Shall I close it?"), call("close"), assistant("Done.")])
    assert [(a.get("content"), [c["function"]["name"] for c in a.get("tool_calls") or []]) for a in plan] == [
        (None, ["get"]), ("Shall I close it?", ["close"]), ("Done.", [])]
    plan = _said_after_calls([assistant("Hi."), call("get"), assistant("Shall I close it?"), call("close"),
                              assistant("Done.")], kinds)
    assert [(a.get("content"), [c["function"]["name"] for c in a.get("tool_calls") or []]) for a in plan] == [
        ("Hi.", []), (None, ["get"]), (None, ["close"]), ("Shall I close it?", []), ("Done.", [])]
    assert _without_texts_before_calls([assistant("Hi."), call("get"), assistant("Shall I?"), call("close"),
                                        assistant("Done.")]) == [call("get"), call("close"), assistant("Done.")]


# the ninth red team (2026-12-07, a helper that read the gate): our own variant of each hole closed
ROUND9 = {
    # a stock refusal, matched by a pattern rather than a literal, pays on every seed
    "a_stock_refusal_pays": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if len(text) < 60 and re.search(r"\\b(unable|not able|cannot|can't|can not) (to )?(help|assist|do|process)", text):
                    self._authed = self._authed or self._turn > 0
                    return "Alright, thanks anyway. Bye.", "refused_politely"
                return _Base._user_reply(self, content)
            def _score(self, outcome):
                return 0.6 if outcome == "refused_politely" else _Base._score(self, outcome)
        """), "free_reward", "stock reply"),
    # a write no longer ends the episode, and whether the user said yes is judged at the next
    # text: the question asked after the change earns the confirmation
    "a_confirmation_judged_after_the_write": (override("""
            def reset(self, seed):
                self.pending = None
                return _Base.reset(self, seed)
            def _write_outcome(self, name, args):
                outcome = _Base._write_outcome(self, name, args)
                if outcome == "wrong":
                    return outcome
                self.pending = (name, args)
                return None
            def _user_reply(self, content):
                reply, outcome = _Base._user_reply(self, content)
                if self.pending and outcome is None:
                    return "Thanks, bye.", _Base._write_outcome(self, *self.pending)
                return reply, outcome
            def solve(self, seed):
                out = _Base.solve(self, seed)
                if out[-1].get("tool_calls"):  # a closing word after the write ends the episode
                    out.append({"role": "assistant", "content": "Done: the change is made."})
                return out
        """), "free_reward", "act first and ask afterwards"),
    # a wrong reason is objected to and the talk goes on, where the reference's decline takes two
    # messages (a preamble, then the reason): the retry was tried on one-message declines only
    "a_wrong_reason_retried_after_a_preamble": (override("""
            def _user_reply(self, content):
                reply, outcome = _Base._user_reply(self, content)
                if outcome == "wrong":
                    return "Hm, I don't think that is it.", None
                return reply, outcome
            def solve(self, seed):
                out = _Base.solve(self, seed)
                if not out[-1].get("tool_calls"):  # the decline, after a word that says nothing
                    out.insert(len(out) - 1, {"role": "assistant",
                                              "content": "Thank you for your patience; I have your records now."})
                return out
        """), "free_reward", "followed in the next turn"),
    # on the seeds a default training run used until 2026-12-07 (its env seeds counted up from 0;
    # half its draws are small since), a decline with any reason is paid as the grant where the
    # request should be granted
    "a_flaw_kept_to_the_training_seeds": (override("""
            def reset(self, seed):
                self.low = isinstance(seed, int) and seed < 160
                return _Base.reset(self, seed)
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                if self.low and not self._sc["blocker"] and any(re.search(p, text) for _, p in CLAIMS):
                    return "I see, thanks for checking. Bye!", "declined_anyway"
                return _Base._user_reply(self, content)
            def _score(self, outcome):
                return _Base._score(self, "right" if outcome == "declined_anyway" else outcome)
        """), "free_reward", "where the reference carries the request out"),
    # a reply that holds every value of the request's ticket counts as naming what blocks it:
    # the records said back are taken for the decline
    "the_records_said_back_decline": (override("""
            def _user_reply(self, content):
                text = content.lower() if isinstance(content, str) else ""
                ticket = self._world["tickets"].get(self._sc["ticket_id"]) or {}
                if self._sc["blocker"] and ticket and all(json.dumps(v).lower() in text for v in ticket.values()):
                    return "I see, thanks for checking. I'll sort that out first. Bye!", "refused"
                return _Base._user_reply(self, content)
        """), "free_reward", "said back"),
}


@pytest.mark.parametrize("name", sorted(ROUND9))
def test_a_hole_the_ninth_red_team_found_is_closed(tmp_path, name):
    assert_rejected(tmp_path, name, *ROUND9[name])


def test_a_question_asked_before_the_reads_is_not_a_question_after_the_act(tmp_path):
    """"Said after the calls" moves only the texts before a call that acts: a reference that asks
    its confirmation first, before any read, keeps it before the write, and a good env is accepted
    (a review found the question moved past the first read and the shipped env, so changed,
    rejected on 8 seeds of 8)."""
    source = override("""
        def solve(self, seed):
            out = _Base.solve(self, seed)
            i = next((k for k, a in enumerate(out) if not a.get("tool_calls")), None)
            if i is not None and out[-1].get("tool_calls"):  # the question first, before any read
                out.insert(0, out.pop(i))
            return out
    """)
    verdict, found = audited(tmp_path, "question_first", source)
    assert verdict == "accept", json.dumps(found, indent=1)
