"""The static stage of the gate: one test per rule and per obfuscation it claims to catch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from envforge import contract
from envforge.gate.static import StaticResult, audit_static

CLEAN = '''"""Capability: precondition verification.

Why it transfers: the target's policy wants the order looked up before it is changed; this env
pays for that read before the write, with the target's own tool.
"""
import json
import random

CAPABILITY = "precondition verification"
SKILLS = {"status_check": 0.6, "owner_check": 0.4}

TOOLS = [{"type": "function", "function": {"name": "get_order_details", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]


class Env:
    tools = TOOLS
    max_turns = 10

    def __init__(self):
        self._rng = None
        self._order = None

    def __repr__(self):
        return f"Env(order={self._order!r})"

    def reset(self, seed: int):
        self._rng = random.Random(seed)
        self._order = "#W%07d" % self._rng.randint(0, 9_999_999)
        skill = self._rng.choice(sorted(SKILLS))
        messages = [{"role": "system", "content": "Check the order before you act."},
                    {"role": "user", "content": "Where is my order " + self._order + "?"}]
        return {"messages": messages}, {"skill": skill}

    def step(self, action):
        calls = action.get("tool_calls") or []
        out = [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": True})}
               for c in calls]
        return {"messages": out}, 1.0 if calls else 0.0, True, False, {}

    def solve(self, seed):
        self.reset(seed)
        args = json.dumps({"order_id": self._order})
        call = {"id": "call_0", "type": "function",
                "function": {"name": "get_order_details", "arguments": args}}
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]
'''


def variant(old: str, new: str, src: str = CLEAN) -> str:
    """The clean env with one piece of text replaced (the piece must be there)."""
    assert old in src, f"test bug: {old!r} is not in the source"
    return src.replace(old, new, 1)


def with_code(code: str, src: str = CLEAN) -> str:
    """``src`` with ``code`` added to the body of reset, after the generator is made."""
    return variant("        self._rng = random.Random(seed)\n",
                   "        self._rng = random.Random(seed)\n        " + code + "\n", src)


def line_of(src: str, snippet: str) -> int:
    return src[:src.index(snippet)].count("\n") + 1


def errors(result: StaticResult) -> list[contract.Finding]:
    return [f for f in result.findings if f.severity == "error"]


def rejects(src: str | bytes, check: str, *substrings: str, at: str | None = None) -> str:
    """Assert that every error is of ``check`` and one says all ``substrings``; return it."""
    found = errors(audit_static(src))
    assert found, "expected a rejection, got no error findings"
    assert {f.check for f in found} == {check}, [f.to_dict() for f in found]
    if at is not None:
        substrings += (f"line {line_of(src, at)}:",)
    matching = [f.message for f in found if all(s in f.message for s in substrings)]
    assert matching, f"no {check} message contains {substrings}: {[f.message for f in found]}"
    return matching[0]


# --------------------------------------------------------------------------- the clean env


def test_clean_env_passes_with_no_findings_and_its_shape_is_learnt():
    result = audit_static(CLEAN)
    assert result.findings == []
    assert result.ok
    shape = dict(result.shape)
    tools = shape.pop("tools")
    assert shape == {"capability": "precondition verification",
                     "skills": {"status_check": 0.6, "owner_check": 0.4},
                     "has_env": True, "max_turns": 10, "docstring": True}
    assert tools == [{"type": "function", "function": {"name": "get_order_details", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]


def test_bytes_source_is_audited_like_text():
    assert audit_static(CLEAN.encode("utf-8")).findings == []
    assert audit_static(b"\xef\xbb\xbf" + CLEAN.encode("utf-8")).findings == []  # a UTF-8 BOM


# --------------------------------------------------------------------------- input


def test_binary_file_with_nul_bytes_is_an_input_finding():
    msg = rejects(b"x = 1\n\x00\x01\x02", "input", "binary", "NUL", "line 2")
    assert "env.py" in msg


def test_non_utf8_bytes_are_an_input_finding_naming_the_byte():
    rejects(CLEAN.encode("utf-8") + b'\nX = "caf\xe9"\n', "input", "not UTF-8", "0xe9")


def test_non_source_object_is_an_input_finding_not_a_crash():
    rejects(12345, "input", "str or bytes", "int")  # type: ignore[arg-type]


def test_empty_file_says_it_is_empty():
    for src in ("", "  \n\n", b""):
        assert [f.message.split(":")[0] for f in errors(audit_static(src, "gen/env.py"))] == [
            "gen/env.py is empty"]
        rejects(src, "contract.shape", "is empty")


def test_syntax_error_gives_its_line_and_column():
    src = variant("    def step(self, action):", "    def step(self, action:")
    rejects(src, "static.syntax", f"line {line_of(src, 'def step')}, column")


def test_oversize_source_is_a_size_finding_and_still_audited():
    src = CLEAN + "\nPAD = " + repr("x" * contract.MAX_SOURCE_BYTES) + "\n"
    rejects(src, "static.size", f"{contract.MAX_SOURCE_BYTES:,}")
    result = audit_static(src + "import os\n")
    assert {f.check for f in errors(result)} == {"static.size", "static.import"}


@pytest.mark.parametrize("src", [
    "(" * 300 + ")" * 300,                     # parser nesting limit
    "a" + ".b" * 40_000,                       # a very deep attribute chain
    "x = -" + "-" * 50_000 + "1",              # deep unary nesting
    "\udcff = 1",                              # a lone surrogate in a str
    bytes(range(1, 256)),                      # random bytes without NUL
])
def test_hostile_inputs_become_findings_never_exceptions(src):
    result = audit_static(src)
    assert errors(result), "a hostile input must be rejected"
    assert all(f.check in contract.CHECKS for f in result.findings)


# --------------------------------------------------------------------------- 1. imports


def test_import_outside_the_allow_list_names_module_and_allow_list():
    src = variant("import json\n", "import json\nimport os\n")
    msg = rejects(src, "static.import", "'os'", "json, math", at="import os")
    assert "random" in msg and "sandbox" in msg


def test_dotted_import_is_judged_by_its_top_level_module():
    rejects(variant("import json\n", "import os.path\n"), "static.import", "'os.path'")
    assert audit_static(variant("import json\n", "import json\nimport collections.abc\n")).ok


def test_from_import_of_a_forbidden_module():
    rejects(variant("import json\n", "from os import path\nimport json\n"), "static.import",
            "'os'", "line 6:")


def test_star_import_is_rejected():
    rejects(variant("import json\n", "from json import *\nimport json\n"), "static.import",
            "star import", "from json import *")


@pytest.mark.parametrize("line", ["from . import helpers", "from .helpers import x"])
def test_relative_import_is_rejected(line):
    rejects(variant("import json\n", line + "\nimport json\n"), "static.import",
            "relative import")


@pytest.mark.parametrize("code, shown", [
    ("import typing\nX = typing.sys.modules", "typing.sys"),
    ("X = random._os", "random._os"),
    ("from typing import sys", "from typing import sys"),
    ("X = getattr(random, '_inst')", "getattr(random, '_inst')"),
])
def test_module_internals_of_allowed_modules_are_rejected(code, shown):
    rejects(variant("CAPABILITY =", code + "\nCAPABILITY ="), "static.import", shown,
            "internals")


# --------------------------------------------------------------------------- 2. builtins


@pytest.mark.parametrize("code, name", [
    ('exec("x = 1")', "exec"),
    ('open("/etc/passwd").read()', "open"),
    ('compile("1", "f", "eval")', "compile"),
    ("f = eval", "eval"),
    ('__import__("os")', "__import__"),
    ("g = globals()", "globals"),
])
def test_forbidden_builtins_are_rejected_in_any_use(code, name):
    src = with_code(code)
    rejects(src, "static.builtin", f"'{name}' is a forbidden builtin", at=code)


def test_getattr_with_a_string_built_name_is_rejected():
    src = with_code('x = getattr(self, "__cla" + "ss__")')
    rejects(src, "static.builtin", "string-built attribute names", at="x = getattr")


@pytest.mark.parametrize("code", [
    "x = getattr(self, name)",
    'x = getattr(self, f"_{name}")',
    'x = getattr(self, "".join(["_", "rng"]))',
    "x = setattr(self, *pair)",
    'x = hasattr(self, name="_rng")',
])
def test_attribute_builtins_need_a_literal_name(code):
    rejects(with_code(code), "static.builtin", "string-built attribute names")


def test_getattr_with_a_plain_literal_name_is_allowed():
    assert audit_static(with_code('x = getattr(self, "_order", None)')).findings == []


def test_getattr_on_builtins_is_rejected_for_both_names():
    result = audit_static(with_code('x = getattr(__builtins__, "open")'))
    found = [f.message for f in errors(result)]
    assert any("looks up the forbidden builtin 'open' by name" in m for m in found), found
    assert any("'__builtins__' is a forbidden builtin" in m for m in found), found
    rejects(with_code('x = getattr(self, "eval")'), "static.builtin", "'eval' by name")


def test_attribute_builtins_may_not_be_aliased():
    rejects(with_code("g = getattr"), "static.builtin", "may only be called directly")


def test_forbidden_builtin_as_an_attribute_is_rejected_but_re_compile_is_not():
    rejects(with_code("x = self.eval"), "static.builtin", "'self.eval'")
    src = variant("import json\n", "import json\nimport re\nPAT = re.compile('x')\n")
    assert audit_static(src).ok


def test_typing_evaluators_are_rejected():
    src = variant("import json\n", "import json\nfrom typing import get_type_hints\n")
    rejects(with_code("h = get_type_hints(Env)", src), "static.builtin",
            "typing.get_type_hints", "evaluates strings")


def test_process_dependent_builtins_are_a_warning_only():
    result = audit_static(with_code("key = hash(self._order)"))
    assert result.ok
    assert [(f.check, f.severity) for f in result.findings] == [("static.builtin", "warning")]
    assert "PYTHONHASHSEED" in result.findings[0].message
    assert audit_static(with_code("id = 3\n        x = id + 1")).findings == []  # a variable


# --------------------------------------------------------------------------- 3. dunders


def test_subclasses_walk_reports_every_dunder_on_its_line():
    src = with_code("x = ().__class__.__bases__[0].__subclasses__()")
    found = [f for f in errors(audit_static(src))]
    assert {f.check for f in found} == {"static.dunder"}
    assert {m for f in found for m in ("__class__", "__bases__", "__subclasses__")
            if m in f.message} == {"__class__", "__bases__", "__subclasses__"}
    assert all(f"line {line_of(src, 'x = ()')}:" in f.message for f in found)


def test_format_string_attribute_walk_is_rejected():
    rejects(with_code('x = "{0.__globals__}".format(self.reset)'), "static.dunder",
            "format-string attribute walks", "__globals__")


def test_format_walk_split_across_strings_is_still_seen():
    rejects(with_code('x = ("{0.__glo" + "bals__}").format(self.reset)'), "static.dunder",
            "{0.__")


def test_dunder_in_an_f_string_is_rejected():
    rejects(with_code('x = f"{self.__class__}"'), "static.dunder", "'.__class__'")


def test_getattr_with_a_literal_dunder_name_is_rejected():
    rejects(with_code('x = getattr(self, "__dict__")'), "static.dunder", "'__dict__'")


def test_frame_internals_without_dunders_are_rejected():
    rejects(with_code("x = (i for i in []).gi_frame.f_globals"), "static.dunder",
            "'.f_globals'", "frame/code internal")


def test_dunder_read_through_a_match_class_pattern_is_rejected():
    src = with_code("match self:\n            case object(__class__=cls):\n                pass")
    rejects(src, "static.dunder", "__class__=", at="case object")


def test_dunder_names_other_than_the_allowed_ones_are_rejected():
    rejects(with_code("x = __file__"), "static.dunder", "'__file__'")
    assert audit_static(CLEAN + '\nif __name__ == "__main__":\n    print(Env())\n').ok


def test_three_argument_type_is_rejected():
    rejects(with_code('K = type("K", (), {})'), "static.dunder", "type() with 3 arguments")
    assert audit_static(with_code("k = type(self).__name__")).ok is False  # a dunder read
    assert audit_static(with_code("k = type(self)")).ok


def test_super_init_and_dunder_method_definitions_are_allowed():
    src = variant("class Env:\n", "class Base:\n    pass\n\n\nclass Env(Base):\n")
    src = variant("        self._rng = None\n",
                  "        super().__init__()\n        self._rng = None\n", src)
    assert audit_static(src).findings == []
    rejects(variant("super().__init__()", "super().__repr__()", src), "static.dunder",
            "'.__repr__'")


# --------------------------------------------------------------------------- 4. entropy


def test_random_module_functions_through_an_alias():
    src = variant("import random\n", "import random\nimport random as r\n")
    rejects(with_code("x = r.random()", src), "static.entropy", "'r.random' (random.random)",
            "random.Random(seed)", at="x = r.random()")


def test_from_random_import_is_rejected_at_the_import_and_at_each_use():
    src = variant("import random\n", "import random\nfrom random import shuffle\n")
    src = with_code("shuffle([1, 2])", src)
    found = [f.message for f in errors(audit_static(src))]
    assert len(found) == 2
    assert f"line {line_of(src, 'from random')}:" in found[0]
    assert "random.shuffle" in found[1] and f"line {line_of(src, 'shuffle([')}:" in found[1]


def test_a_reference_without_a_call_is_enough():
    rejects(with_code("pick = random.choice"), "static.entropy", "random.choice")


def test_wall_clock_through_an_aliased_class():
    src = variant("import random\n", "import random\nfrom datetime import datetime as D\n")
    rejects(with_code("now = D.now()", src), "static.entropy", "datetime.datetime.now",
            "wall clock")


def test_wall_clock_through_an_aliased_module():
    src = variant("import random\n", "import random\nimport datetime as dt\n")
    rejects(with_code("d = dt.date.today()", src), "static.entropy", "datetime.date.today")


@pytest.mark.parametrize("code", ["rng = random.Random()", "rng = random.Random(None)",
                                  "rng = random.Random(x=None)", "rng = random.SystemRandom(3)"])
def test_unseeded_generators_are_rejected(code):
    rejects(with_code(code), "static.entropy", "random.Random(seed)")


def test_seeded_generator_and_its_methods_are_fine():
    assert audit_static(with_code("r2 = random.Random(seed * 7 + 1)\n        r2.shuffle([])")).ok


# --------------------------------------------------------------------------- 5. contract shape


def test_missing_capability():
    src = variant('CAPABILITY = "precondition verification"\n', "")
    rejects(src, "contract.shape", "CAPABILITY is missing")
    assert audit_static(src).shape["capability"] is None


@pytest.mark.parametrize("value", ['""', "   ''", "42", "NAME"])
def test_capability_must_be_a_non_empty_string_literal(value):
    rejects(variant('"precondition verification"\n', value + "\n"), "contract.shape",
            "CAPABILITY must be a non-empty string literal")


def test_missing_env_class():
    result = audit_static(variant("class Env:", "class Environment:"))
    assert result.shape["has_env"] is False
    rejects(variant("class Env:", "class Environment:"), "contract.shape",
            "no module-level class Env")


def test_wrong_step_signature():
    src = variant("def step(self, action):", "def step(self, action, state):")
    rejects(src, "contract.shape", "Env.step(self, action, state)", "step(self, action)",
            at="def step")


@pytest.mark.parametrize("sig", ["def step(self):", "async def step(self, action):",
                                 "def step(self, action, *, strict):"])
def test_other_bad_step_signatures(sig):
    rejects(variant("def step(self, action):", sig), "contract.shape", "does not fit the contract")


def test_extra_parameters_with_defaults_and_annotations_are_fine():
    src = variant("def step(self, action):", "def step(self, action: dict, debug: bool = False):")
    assert audit_static(src).findings == []


def test_methods_and_tools_may_come_from_a_base_class_in_the_file():
    src = variant("class Env:\n    tools = TOOLS\n", "class Base:\n    tools = TOOLS\n\n"
                  "    def solve(self, seed):\n        return []\n\n\nclass Env(Base):\n")
    src = variant("    def solve(self, seed):\n        self.reset(seed)",
                  "    def solve_again(self, seed):\n        self.reset(seed)", src)
    assert audit_static(src).findings == []
    rejects(variant("class Env(Base):", "class Env:", src), "contract.shape", "no method solve")


def test_missing_tools_attribute():
    rejects(variant("    tools = TOOLS\n", ""), "contract.shape", "no tools class attribute")


@pytest.mark.parametrize("value", ["99", "0", "10.0", "True", "'10'"])
def test_max_turns_must_be_an_int_within_the_limit(value):
    src = variant("max_turns = 10", f"max_turns = {value}")
    rejects(src, "contract.shape", f"max_turns = {value}", f"1 to {contract.MAX_TURNS_LIMIT}")
    assert audit_static(src).shape["max_turns"] is None


def test_max_turns_defaults_when_absent():
    result = audit_static(variant("    max_turns = 10\n", ""))
    assert result.findings == [] and result.shape["max_turns"] == contract.DEFAULT_MAX_TURNS


@pytest.mark.parametrize("skills, said", [
    ('{"status_check": "high", "owner_check": 0.4}', "weight 'high'"),
    ('{"status_check": -0.5}', "weight -0.5"),
    ('{"status_check": 0}', "weight 0"),
    ('{1: 0.5}', "key 1"),
    ("{}", "is empty"),
    ('["status_check"]', "not a dict literal"),
])
def test_skills_must_map_names_to_positive_numbers(skills, said):
    src = variant('{"status_check": 0.6, "owner_check": 0.4}', skills)
    rejects(src, "contract.shape", "SKILLS", said)
    assert audit_static(src).shape["skills"] is None


def test_missing_docstring_is_a_warning():
    result = audit_static(CLEAN[CLEAN.index("import json"):])
    assert result.ok and result.shape["docstring"] is False
    assert [(f.check, f.severity) for f in result.findings] == [("contract.shape", "warning")]
    assert "Why it transfers" in result.findings[0].message


# --------------------------------------------------------------------------- all findings


def test_several_flaws_yield_every_finding_in_rule_order():
    src = variant("import json\n", "import json\nimport os\n")
    src = with_code("x = eval('1')\n        y = self.__dict__\n        z = random.random()", src)
    src = variant('CAPABILITY = "precondition verification"\n', "", src)
    src = variant("max_turns = 10", "max_turns = 99", src)
    checks = [f.check for f in errors(audit_static(src))]
    assert checks == ["static.import", "static.builtin", "static.dunder", "static.entropy",
                      "contract.shape", "contract.shape"]


def test_identical_findings_are_reported_once():
    found = errors(audit_static(with_code("a = eval; b = eval")))
    assert len(found) == 1
    assert len(errors(audit_static(with_code("a = eval\n        b = eval")))) == 2  # two lines


# --------------------------------------------------------------------------- the shared fixtures


def _fixtures() -> Path | None:
    here = Path(__file__).resolve().parents[1]
    for root in (here / "shared", here.parent / "shared"):
        if (root / "fixtures" / "envs" / "labels.json").is_file():
            return root / "fixtures" / "envs"
    return None


FIXTURES = _fixtures()
needs_fixtures = pytest.mark.skipif(
    FIXTURES is None, reason="shared/fixtures/envs (labelled example envs) is not in this checkout")


@pytest.mark.shared
@needs_fixtures
def test_clean_labelled_fixtures_have_no_errors():
    labels = json.loads((FIXTURES / "labels.json").read_text())
    clean = [name for name, label in labels.items() if label["verdict"] == "accept"]
    assert clean
    for name in clean:
        result = audit_static((FIXTURES / name / "env.py").read_bytes())
        assert errors(result) == [], name
        assert result.shape["has_env"] and result.shape["capability"] == labels[name]["capability"]


@pytest.mark.shared
@needs_fixtures
def test_flawed_fixtures_are_caught_for_the_right_reason():
    address = errors(audit_static((FIXTURES / "retail_address_change_a" / "env.py").read_bytes()))
    assert [f.check for f in address] == ["static.import"]
    assert "'os'" in address[0].message
    returns = errors(audit_static((FIXTURES / "retail_return_desk_a" / "env.py").read_bytes()))
    assert [f.check for f in returns] == ["static.entropy"]
    assert "random.randint" in returns[0].message
