"""The labelled fixture envs of ../shared: each gets the verdict its label gives from
`envforge audit --json` (default settings: 50 seeds per property), and a rejected one gets a
finding from the check that covers its category of flaw."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURE_ENVS, TARGETS

#: category of planted flaw -> the checks whose finding names it
CATEGORY_CHECKS = {
    "seed_ignored": {"diversity"},
    "forbidden_import": {"static.import"},
    "schema_drift": {"schema.fidelity", "schema.unknown_tool"},
    "constant_reward": {"partial_credit", "free_reward"},
    "crash_on_bad_call": {"robustness"},
    "clock_entropy": {"static.entropy", "determinism"},
    "forbidden_builtin": {"static.builtin"},
    "dunder_access": {"static.dunder"},
    "unsolvable": {"solvability"},
    "free_reward": {"free_reward"},
    "nondeterminism": {"determinism"},
    "shared_state": {"isolation", "determinism"},
    "hang": {"bounded"},
    "not_json": {"json"},
}


def _labels():
    path = FIXTURE_ENVS / "labels.json"
    return sorted(json.loads(path.read_text()).items()) if path.is_file() else []


@pytest.mark.skipif(not FIXTURE_ENVS.is_dir(), reason=f"{FIXTURE_ENVS} is absent (labelled fixture envs)")
@pytest.mark.parametrize("name, label", _labels(), ids=[n for n, _ in _labels()])
def test_fixture_verdict_and_flaw(name, label):
    p = subprocess.run([sys.executable, "-m", "envforge", "audit", str(FIXTURE_ENVS / name),
                        "--target", str(TARGETS / label["target"]), "--json", "--no-report"],
                       capture_output=True, text=True, timeout=300, env={**os.environ})
    assert p.returncode == (0 if label["verdict"] == "accept" else 1), p.stderr
    [result] = json.loads(p.stdout)["results"]
    errors = [f for f in result["findings"] if f["severity"] == "error"]
    assert result["verdict"] == label["verdict"], json.dumps(errors, indent=1)
    if label["verdict"] == "reject":
        expected = CATEGORY_CHECKS.get(label["category"])
        assert expected, f"no check is mapped to flaw category {label['category']!r}; add it to CATEGORY_CHECKS"
        assert {f["check"] for f in errors} & expected, (
            f"{name} ({label['category']}: {label['note']}) was rejected, but not by {sorted(expected)}: "
            + json.dumps(errors, indent=1))
