"""The command line as a user runs it: real subprocesses (and click's runner where a process
adds nothing), one exit-code rule across commands, options built from the config fields, clear
errors before any long work."""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envforge.cli import main
from tests.envfactory import GOOD_DIR, good_source, write_env

ROOT = Path(__file__).resolve().parent.parent

FAST = ["--seeds", "8", "--call-timeout", "2"]


def run(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "envforge", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def _no_traceback(p):
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout


def test_audit_good_env_json_exit_0(tmp_path):
    folder = write_env(tmp_path / "good", good_source())
    # a pinned draw, so that a failure can be replayed (a drawn one at 8 seeds once rejected this
    # env in CI by chance words in "the decision in the opening", which its labelling test closed)
    p = run("audit", str(folder), "--json", *FAST, "--probe-seed", "0")
    data = json.loads(p.stdout)
    [r] = data["results"]
    # on failure, say which findings rejected it
    assert p.returncode == 0, (p.stderr, [f for f in r["findings"] if f["severity"] != "info"])
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
    p = run("audit")
    assert p.returncode == 2
    p = run("audit", str(GOOD_DIR), "--seeds", "1")
    assert p.returncode == 2 and p.stderr == "error: --seeds must be from 2 to 512, got 1\n"


def test_audit_of_a_file_that_is_not_python_says_so(tmp_path):
    policy = tmp_path / "policy.md"
    policy.write_text("# Policy\n\nBe nice.\n- and check first\n")
    p = run("audit", str(policy))
    assert p.returncode == 2 and "policy.md is not an env.py (a Python file)" in p.stderr, p.stderr
    _no_traceback(p)


# ----------------------------------------------------------------------------- one exit-code rule

def _trajectories(tmp_path):
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"task_id": "1", "reward": 1.0, "messages": [
        {"role": "user", "content": "hi"}]}) + "\n")
    return traj


def _bad_targets(tmp_path):
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "notools.json").write_text(json.dumps({"hello": "world"}))
    (tmp_path / "empty").mkdir()
    return {"missing": (tmp_path / "nowhere", "no such folder or file"),
            "junk JSON": (tmp_path / "junk.json", "not valid JSON"),
            "not a tool list": (tmp_path / "notools.json", "tool"),
            "empty folder": (tmp_path / "empty", "holds neither")}


def test_a_bad_target_exits_2_in_every_command(tmp_path):
    """Missing, junk JSON, not a tool list, an empty folder: what was asked cannot be done as
    given, so every command exits 2 with one line saying what is wrong (it was 1 for the
    malformed ones and 2 for a missing one)."""
    traj = _trajectories(tmp_path)
    commands = {"audit": ["audit", str(GOOD_DIR), "--static-only"], "identify": ["identify", str(traj),
                "--no-plot", "--out", str(tmp_path / "caps.json")],
                "synth": ["synth", "--capability", "precondition verification",
                          "--out", str(tmp_path / "envs")]}
    for kind, (target, words) in _bad_targets(tmp_path).items():
        for name, args in commands.items():
            r = CliRunner().invoke(main, [*args, "--target", str(target)])
            assert r.exit_code == 2, (kind, name, r.output)
            assert r.output.startswith("error: ") and words in r.output, (kind, name, r.output)
            assert r.output.count("\n") == 1 and _clean(r), (kind, name, r.output)
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir())


def test_a_missing_input_path_exits_2_in_every_command(tmp_path):
    nope = str(tmp_path / "nope")
    for args in (["audit", nope], ["identify", nope, "--no-plot"], ["synth", "--from", nope],
                 ["eval", "--tasks", nope, "--model", nope], ["route", "--tasks", nope, "--model",
                                                              nope, "--adapters", nope]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and r.output.startswith("error: ") and "nope" in r.output, (args, r.output)
        assert _clean(r), (args, r.output)


def test_identify_checks_its_outputs_before_any_work(tmp_path, monkeypatch):
    """A folder where a file goes, or a file where a folder must be made: exit 2 with the flag
    named, before the trajectories are labelled (an LLM labeller's run can take long)."""
    import envforge.identify as ident
    traj = _trajectories(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    labelled = []
    monkeypatch.setattr(ident, "identify", lambda *a, **k: labelled.append(1))
    cases = [(["--out", str(tmp_path)], f"--out {tmp_path}: is a folder"),
             (["--out", str(blocker / "caps.json")], f"--out {blocker / 'caps.json'}: cannot make its folder"),
             (["--labels-out", str(blocker / "l.jsonl")], "--labels-out"),
             (["--plot", str(blocker / "p.png")], "--plot")]
    for extra, words in cases:
        args = ["identify", str(traj), "--out", str(tmp_path / "caps.json"), *extra]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and r.output.startswith(f"error: {words}") and _clean(r), (extra, r.output)
    assert labelled == [] and not (tmp_path / "caps.json").exists()
    # the plot's own write failing late is an error (exit 2), not a traceback
    from envforge.errors import InputError
    from envforge.identify.report import plot
    from envforge.trajectories import load_trajectories
    monkeypatch.undo()
    result = ident.identify(load_trajectories(str(traj)), ident.IdentifyConfig())
    with pytest.raises(InputError, match="cannot write the plot"):
        plot(result, blocker / "p.png")


def test_outputs_never_overwrite_inputs_or_each_other(tmp_path):
    """Found by a helper trying the CLI as a user: identify wrote over its own trajectories
    (--out or --labels-out naming them), --out caps.png lost the result to the plot's default
    name, and train replaced a user's files in OUT/<slug>. Each is refused before any work."""
    traj = _trajectories(tmp_path)
    before = traj.read_bytes()
    cases = [(["--out", str(traj), "--no-plot"], "is one of the trajectory files identify reads"),
             (["--labels-out", str(traj), "--no-plot"], "is one of the trajectory files identify reads"),
             (["--out", str(tmp_path / "caps.png")], "is the file --out names too (the plot's default"),
             (["--out", str(tmp_path / "c.json"), "--labels-out", str(tmp_path / "c.json")], "names too"),
             (["--plot", str(tmp_path / "notes.txt")], "matplotlib draws .png")]
    for extra, words in cases:
        r = CliRunner().invoke(main, ["identify", str(traj), *extra])
        assert r.exit_code == 2 and words in r.output and _clean(r), (extra, r.output)
    assert traj.read_bytes() == before and not (tmp_path / "caps.png").exists()
    mine = tmp_path / "out" / GOOD_DIR.name
    mine.mkdir(parents=True)
    (mine / "manifest.json").write_text('{"mine": 1}')
    (mine / "notes.txt").write_text("keep")
    r = CliRunner().invoke(main, ["train", str(GOOD_DIR), "--model", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "holds what train did not write (notes.txt)" in r.output and _clean(r), r.output
    (mine / "notes.txt").unlink()
    r = CliRunner().invoke(main, ["train", str(GOOD_DIR), "--model", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "a manifest.json train did not write" in r.output, r.output
    assert (mine / "manifest.json").read_text() == '{"mine": 1}'


@pytest.mark.parametrize("args, words", [
    (["eval", "x", "-m", "m", "--threads", "-2"], "--threads must be from 1 to 256, got -2"),
    (["calibrate", "x", "-m", "m", "--threads", "0"], "--threads must be from 1 to 256, got 0"),
    (["route", "-m", "m", "-a", "a", "--task", "t", "--threads", "-1"], "--threads must be from 1 to 256"),
    (["eval", str(GOOD_DIR), "-m", "m", "--seeds", "0-99999999999"], "at most 100,000"),
    (["identify", "x.jsonl", "--success-threshold", "nan"], "must be a finite number, got nan"),
    (["identify", "x.jsonl", "--runs", "99999999999"], "--runs must be from 1 to 10000"),
    (["calibrate", "x", "-m", "m", "--groups", "99999999999999"], "--groups must be from 1 to 100000"),
    (["audit", str(GOOD_DIR), "--probe-seed", "-1"], "--probe-seed must be from 0 to 9223372036854775807, got -1"),
    (["eval", str(GOOD_DIR), "--tasks", "t.json", "-m", "m"], "give ENV or --tasks FILE, not both"),
    (["train", str(GOOD_DIR), "-m", __file__], f"--model {__file__}: is a file, not a folder"),
])
def test_numbers_that_would_crash_or_hang_are_usage_errors(args, words):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and words in r.output and _clean(r), r.output


def _clean(r) -> bool:
    """No traceback: the command ended through sys.exit, not an exception."""
    return r.exception is None or isinstance(r.exception, SystemExit)


# ----------------------------------------------------------------------------- settings as flags

@pytest.mark.parametrize("args, message", [
    (["audit", str(GOOD_DIR), "--memory-mb", "10"], "--memory-mb must be at least 64, got 10"),
    (["audit", str(GOOD_DIR), "--call-timeout", "0"], "--call-timeout must be greater than 0, got 0.0"),
    (["synth", "-c", "x", "--attempts", "0"], "--attempts must be from 1 to 50, got 0"),
    (["train", "x", "-m", "m", "--group-size", "1"], "--group-size must be at least 2, got 1"),
    (["train", "x", "-m", "m", "--lr", "0"], "--lr must be greater than 0, got 0.0"),
    (["train", "x", "-m", "m", "--rank", "0"], "--rank must be at least 1, got 0"),
    (["train", "x", "-m", "m", "--groups", "0"], "--groups must be at least 1, got 0"),
    (["train", "x", "-m", "m", "--kl", "-1"], "--kl must be at least 0, got -1.0"),
    (["calibrate", "x", "-m", "m", "--groups", "0"], "--groups must be from 1 to 100000, got 0"),
    (["route", "-m", "m", "-a", "a", "--task", "t", "--examples", "11"], "--examples must be from 0 to 10, got 11"),
    (["eval", "x", "-m", "m", "--temperature", "-1"], "--temperature must be at least 0, got -1.0"),
])
def test_a_setting_out_of_bounds_names_the_flag(args, message):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and r.output == f"error: {message}\n", r.output


def test_defaults_and_help_come_from_the_config_fields():
    from envforge.gate.config import GateSettings
    from envforge.settings import field_of
    from trainers.grpo_config import GRPOConfig
    audit = main.get_command(None, "audit")
    seeds = next(p for p in audit.params if p.name == "seeds")
    assert seeds.default == GateSettings().seeds and seeds.help == field_of(GateSettings, "seeds").metadata["help"]
    train = main.get_command(None, "train")
    defaults = {p.name: p.default for p in train.params}
    assert defaults["num_groups"] == GRPOConfig().num_groups and defaults["learning_rate"] == 1e-5
    assert defaults["lora_alpha"] is None  # the config makes it 2 x rank, not the CLI


# ----------------------------------------------------------------------------- synth

def test_synth_works_offline_in_an_empty_folder_with_the_example_target(tmp_path):
    """The command a new user types first: no --target (the example), files with the umask."""
    p = subprocess.run([sys.executable, "-m", "envforge", "synth", "--capability",
                        "precondition verification", "--seeds", "8"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300, preexec_fn=lambda: os.umask(0o022),
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": "",
                            "OPENAI_API_KEY": ""})
    assert p.returncode == 0, p.stderr
    assert "target: example (envforge's example helpdesk target; --target PATH for yours)" in p.stderr
    folder = tmp_path / "generated_envs" / "helpdesk_precondition_verification"
    for name in ("env.py", "manifest.json"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644, name
    assert "'example'" in run("synth", "--help").stdout


def test_synth_checks_its_output_folder_before_any_work(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("hello")
    r = CliRunner().invoke(main, ["synth", "-c", "precondition verification", "--out", str(readme)])
    assert r.exit_code == 2 and r.output == (f"error: --out {readme}: is a file, not a folder; give "
                                             "a folder (made when missing)\n"), r.output
    assert readme.read_text() == "hello"


def test_synth_trajectories_take_several_paths(tmp_path):
    caps = tmp_path / "caps.json"
    caps.write_text(json.dumps({"capabilities": [{"name": "x", "retained": False}]}))
    good = _trajectories(tmp_path)
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(main, ["synth", "--from", str(caps), "--trajectories", str(good), str(bad)])
    assert r.exit_code == 2 and "b.json" in r.output and "not valid JSON" in r.output, r.output
    bad.write_text(good.read_text())
    r = CliRunner().invoke(main, ["synth", "--from", str(caps), "--trajectories", str(good), str(bad)])
    assert r.exit_code == 2 and "has no retained capability" in r.output, r.output  # both read
    r = CliRunner().invoke(main, ["synth", "-c", "precondition verification", "stray"])
    assert r.exit_code == 2 and "unexpected argument 'stray'" in r.output, r.output


# ----------------------------------------------------------------------------- audit and targets

def test_an_audit_against_another_target_keeps_the_envs_own_report(tmp_path):
    env = tmp_path / "env"
    shutil.copytree(GOOD_DIR, env)
    p = run("audit", str(env), "--static-only", "--json")
    assert p.returncode == 0, p.stdout
    own = json.loads((env / "report.json").read_text())
    assert own["verdict"] == "accept" and own["target"] == "helpdesk" and own["target_schema_hash"]
    other = tmp_path / "tools.json"
    other.write_text(json.dumps([{"type": "function", "function": {
        "name": "ping", "description": "Ping.", "parameters": {"type": "object", "properties": {}}}}]))
    p = run("audit", str(env), "--static-only", "--target", str(other))
    assert p.returncode == 1 and "schema" in p.stdout                       # judged against it...
    assert "not written: this audit judged target tools, and the env was made for example" in p.stdout
    assert json.loads((env / "report.json").read_text()) == own             # ...without overturning
    import envforge
    envforge.make(env, backend="process").close()                           # still usable


# ----------------------------------------------------------------------------- trainers

def test_adapters_and_outputs_are_checked_before_any_model_loads(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("hello")
    for cmd in (["eval", str(GOOD_DIR), "--seeds", "0"], ["calibrate", str(GOOD_DIR)]):
        for adapter, what in ((empty, "holds no adapter_config.json"), (tmp_path / "nope", "does not exist")):
            r = CliRunner().invoke(main, cmd + ["--model", str(model), "--adapter", str(adapter)])
            assert r.exit_code == 2 and f"--adapter {adapter}: {what}" in r.output, (cmd, r.output)
            assert _clean(r)
    r = CliRunner().invoke(main, ["train", str(GOOD_DIR), "--model", str(model), "--out", str(readme)])
    assert r.exit_code == 2 and f"--out {readme / GOOD_DIR.name}: cannot make this folder" in r.output, r.output
    assert readme.read_text() == "hello"
    # adapters written into the env's own folder would overwrite its manifest.json
    envs = tmp_path / "envs"
    shutil.copytree(GOOD_DIR, envs / GOOD_DIR.name)
    before = (envs / GOOD_DIR.name / "manifest.json").read_bytes()
    r = CliRunner().invoke(main, ["train", str(envs / GOOD_DIR.name), "--model", str(model), "--out", str(envs)])
    assert r.exit_code == 2 and f"{envs / GOOD_DIR.name} is an env folder" in r.output and _clean(r), r.output
    assert (envs / GOOD_DIR.name / "manifest.json").read_bytes() == before
    # a missing model is said before training starts (one line, not after "train ... ->")
    r = CliRunner().invoke(main, ["train", str(GOOD_DIR), "--model", str(tmp_path / "nope"), "--out", str(empty)])
    assert r.exit_code == 2 and r.output.startswith(f"error: --model {tmp_path / 'nope'}: no such folder") and _clean(r)


def test_an_interrupted_train_says_where_its_checkpoint_is(tmp_path):
    from envforge.cli import _interrupted
    ck = tmp_path / "checkpoint"
    assert "before the first checkpoint" in _interrupted(ck)
    ck.mkdir()
    (ck / "state.json").write_text(json.dumps({"iteration": 3}))
    assert _interrupted(ck) == (f"interrupted: {ck} holds 3 finished iteration(s); run the same "
                                "command again to resume from there (--no-resume starts afresh)")
