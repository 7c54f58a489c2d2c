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


@pytest.mark.parametrize("pattern", [r"(-+)+$", r"(a*)*b", r"^(\s*\w+)*$", r"(x{2,9})+"])
def test_nested_quantifiers_in_a_regex_literal_are_a_bounded_finding(pattern):
    src = variant("import random\n", "import random\nimport re\n")
    rejects(with_code(f"m = re.match({pattern!r}, 'x')", src), "bounded", "backtracks exponentially")


@pytest.mark.parametrize("pattern", [r"(\d+,)*\d+", r"^(\w+)\s", r"(?:ab)+", r"\(a+\)+", r"[a-z]+-\d+"])
def test_plain_regexes_are_fine(pattern):
    src = variant("import random\n", "import random\nimport re\n")
    assert audit_static(with_code(f"m = re.match({pattern!r}, 'x')", src)).ok
