"""`envforge audit` as a user runs it: a real subprocess, exit codes, JSON, clear errors."""
import json
import os
import subprocess
import sys

import pytest

from tests.envfactory import GOOD_DIR, good_source, write_env

FAST = ["--seeds", "8", "--call-timeout", "2"]


def run(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "envforge", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def _no_traceback(p):
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout


def test_audit_good_env_json_exit_0(tmp_path):
    folder = write_env(tmp_path / "good", good_source())
    p = run("audit", str(folder), "--json", *FAST)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    [r] = data["results"]
    assert r["path"] == str(folder) and r["verdict"] == "accept"
    assert all(set(f) >= {"check", "severity", "message"} for f in r["findings"])
    assert json.loads((folder / "report.json").read_text())["verdict"] == "accept"


def test_audit_table_for_people(tmp_path):
    folder = write_env(tmp_path / "bad", good_source().replace("import json\n", "import json\nimport os\n"))
    p = run("audit", str(folder), "--static-only")
    assert p.returncode == 1
    assert "reject" in p.stdout and "static.import" in p.stdout and "'os'" in p.stdout
    _no_traceback(p)


def test_one_rejected_env_makes_exit_1_and_all_are_reported(tmp_path):
    good = write_env(tmp_path / "good", good_source())
    bad = write_env(tmp_path / "bad", "CAPABILITY = 'x'\n")
    p = run("audit", str(good), str(bad), "--json", "--static-only")
    assert p.returncode == 1
    verdicts = {r["path"]: r["verdict"] for r in json.loads(p.stdout)["results"]}
    assert verdicts == {str(good): "accept", str(bad): "reject"}


def test_env_py_file_path_and_explicit_target(tmp_path):
    folder = write_env(tmp_path / "e", good_source(), target=None)
    p = run("audit", str(folder / "env.py"), "--target", "example", "--json", "--static-only")
    assert p.returncode == 0, p.stdout
    assert json.loads(p.stdout)["results"][0]["target"] == "helpdesk"
    assert not (folder / "report.json").exists()  # only env folders get a report.json


@pytest.mark.parametrize("content, check, words", [
    (b"def broken(:\n", "static.syntax", "line 1"),
    (b"", "contract.shape", "empty"),
    (b"\x7fELF\x00\x00\x01binary", "input", "binary"),
    (b"CAPABILITY = '\xff\xfe'\n", "input", "UTF-8"),
])
def test_bad_env_files_get_a_clear_finding(tmp_path, content, check, words):
    folder = write_env(tmp_path / "x", content)
    p = run("audit", str(folder), "--json")
    assert p.returncode == 1
    findings = json.loads(p.stdout)["results"][0]["findings"]
    assert any(f["check"] == check and words in f["message"] for f in findings), findings
    _no_traceback(p)


def test_usage_errors_exit_2(tmp_path):
    p = run("audit", str(tmp_path / "missing"))
    assert p.returncode == 2 and "does not exist" in p.stderr
    _no_traceback(p)
    p = run("audit", str(tmp_path))
    assert p.returncode == 2 and "without env.py" in p.stderr
    p = run("audit", str(GOOD_DIR), "--target", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "no such folder" in p.stderr
    p = run("audit")
    assert p.returncode == 2
    p = run("audit", str(GOOD_DIR), "--seeds", "1")
    assert p.returncode == 2


def test_malformed_target_exits_1(tmp_path):
    (tmp_path / "tools.json").write_text("{not json")
    p = run("audit", str(GOOD_DIR), "--target", str(tmp_path / "tools.json"), "--static-only")
    assert p.returncode == 1 and "not valid JSON" in p.stderr
    _no_traceback(p)


def test_a_missing_target_is_a_usage_error_in_every_command(tmp_path):
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"task_id": "1", "reward": 1.0, "messages": [
        {"role": "user", "content": "hi"}]}) + "\n")
    for args in (["audit", str(GOOD_DIR)], ["identify", str(traj)],
                 ["synth", "--capability", "precondition verification"]):
        p = run(*args, "--target", str(tmp_path / "nowhere"))
        assert p.returncode == 2 and "no such folder or file" in p.stderr, (args, p.stderr)
        _no_traceback(p)
