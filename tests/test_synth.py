"""`envforge synth` as a user runs it (template path): the files it writes, the command's exit
codes and messages, never overwriting an accepted env, the --from batch, and the orchestration
helpers (envforge/synth/synthesizer.py). The LLM path: tests/test_synth_llm.py; the template
synthesizer itself and the family x target matrix: tests/test_synth_templates.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime

import pytest
from click.testing import CliRunner

from envforge.cli import main
from envforge.errors import UsageError
from envforge.synth import (FAMILIES, CapabilitySpec, SynthConfig, family_list, load_capabilities,
                            resolve_synthesizer, slug_for, synthesize)
from envforge.synth.synthesizer import existing_env, sha256
from envforge.targets import load_target
from envforge.trajectories import Trajectory
from tests.conftest import REPO, SHARED, TARGETS, needs_shared

FAST = ["--seeds", "8"]
SLUG = "helpdesk_precondition_verification"


def run(*args, env=None):
    env = {**os.environ, "COLUMNS": "160", **(env or {})}
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "envforge", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)


def invoke(*args, env=None):
    return CliRunner().invoke(main, list(args), env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None,
                                                     **(env or {})})


@pytest.fixture
def out(tmp_path):
    return tmp_path / "envs"


# ============================================================================= one capability


def test_synth_writes_an_accepted_env_with_manifest_and_report(out):
    p = run("synth", "--capability", "precondition verification", "--target", "example",
            "--out", str(out), *FAST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "synthesizer: template (offline; set OPENAI_BASE_URL and --model for the LLM path)" in p.stderr
    assert SLUG in p.stdout and "accept" in p.stdout and "1 of 1 accepted" in p.stdout
    assert "Traceback" not in p.stderr
    folder = out / SLUG
    assert sorted(x.name for x in folder.iterdir()) == ["env.py", "manifest.json", "report.json"]
    code = (folder / "env.py").read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert json.loads((folder / "report.json").read_text())["verdict"] == "accept"
    assert {k: manifest[k] for k in ("capability", "slug", "family", "target", "target_name",
                                     "synthesizer", "model", "verdict", "envforge_version")} == {
        "capability": "precondition verification", "slug": SLUG, "family": "precondition_verification",
        "target": "example", "target_name": "helpdesk", "synthesizer": "template", "model": None,
        "verdict": "accept", "envforge_version": "0.1.0"}
    assert manifest["target_schema_hash"] == load_target("example").schema_hash()
    assert manifest["code_sha256"] == sha256(code)
    assert manifest["attempts"] == [{"n": 1, "verdict": "accept", "findings": [], "code_sha256": sha256(code)}]
    assert manifest["template"]["write"] == "close_ticket"
    assert datetime.fromisoformat(manifest["created"]).tzinfo is not None
    # the gate finds the target through the manifest
    a = run("audit", str(folder), "--json", *FAST, "--probe-seed", "0", "--no-report")  # 8 seeds: a pinned draw
    assert a.returncode == 0 and json.loads(a.stdout)["results"][0]["target"] == "helpdesk"


def test_an_accepted_env_is_never_overwritten_silently(out):
    args = ["synth", "-c", "precondition verification", "-t", "example", "--out", str(out), *FAST, "--json"]
    assert invoke(*args).exit_code == 0
    before = (out / SLUG / "manifest.json").read_text()
    r = invoke(*args)                               # the same inputs: kept, reported as accepted
    assert r.exit_code == 0 and json.loads(r.output)["skipped"] is True
    assert (out / SLUG / "manifest.json").read_text() == before
    r = invoke("synth", "-c", "verifying preconditions", "-t", "example", "--out", str(out), *FAST, "--json")
    assert r.exit_code == 1                         # another capability, the same slug: refused
    assert json.loads(r.output)["error"] == (
        f"{out / SLUG} already holds an accepted env for 'precondition verification'; pass --force "
        "to overwrite it, or --out to write elsewhere")
    r = invoke("synth", "-c", "verifying preconditions", "-t", "example", "--out", str(out), *FAST,
               "--json", "--force")
    assert r.exit_code == 0 and json.loads(r.output)["verdict"] == "accept"
    assert json.loads((out / SLUG / "manifest.json").read_text())["capability"] == "verifying preconditions"


def shipped_env(out, audited: bool) -> None:
    """envforge's own example env, copied file by file (never what a user's earlier commands
    left in the checkout's folder: ``envforge audit generated_envs/*`` writes a report.json there),
    with the report of ``envforge audit`` run on the copy when ``audited``."""
    (out / SLUG).mkdir(parents=True)
    for name in ("env.py", "manifest.json"):
        shutil.copyfile(REPO / "generated_envs" / SLUG / name, out / SLUG / name)
    if audited:
        # 8 seeds at a pinned draw, so that a failure can be replayed (a drawn one once rejected
        # this env in CI by chance words, closed since by the gate's labelling test)
        assert invoke("audit", str(out / SLUG), *FAST, "--probe-seed", "0").exit_code == 0


@pytest.mark.parametrize("audited, what", [
    (False, "an env.py whose verdict is unknown (no report, or edited since)"),
    (True, "an accepted env")])       # README's order: `envforge audit generated_envs/*`, then synth
def test_a_hand_written_or_edited_env_is_kept(out, audited, what):
    shipped_env(out, audited)
    r = invoke("synth", "-c", "precondition verification", "-t", "example", "--out", str(out), "--json")
    assert r.exit_code == 1
    assert json.loads(r.output)["error"] == (
        f"{out / SLUG} already holds {what} for 'precondition verification'; pass --force to "
        "overwrite it, or --out to write elsewhere")
    assert (out / SLUG / "env.py").read_text() == (REPO / "generated_envs" / SLUG / "env.py").read_text()
    if audited:
        return
    other = out / "helpdesk_confirmation_before_write"
    assert invoke("synth", "-c", "confirmation before write", "-t", "example", "--out", str(out),
                  *FAST).exit_code == 0
    with open(other / "env.py", "a") as f:
        f.write("# edited by hand\n")
    assert existing_env(other)[0] == "unknown"
    assert invoke("synth", "-c", "confirmation before write", "-t", "example", "--out", str(out),
                  *FAST).exit_code == 1


def test_an_adapters_folder_is_not_written_over(out):
    """synth --out adapters, where `envforge train` left an adapter under the env's slug: its
    manifest.json is not synth's and there is no env.py; synth keeps it unless --force."""
    folder = out / SLUG
    folder.mkdir(parents=True)
    adapter = {"capability": "precondition verification", "reward_curve": [0.1, 0.9]}
    (folder / "manifest.json").write_text(json.dumps(adapter))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    assert existing_env(folder)[0] == "foreign"
    r = invoke("synth", "-c", "precondition verification", "-t", "example", "--out", str(out), "--json")
    assert r.exit_code == 1 and "a manifest.json that synth did not write, and no env.py" in json.loads(r.output)["error"]
    assert json.loads((folder / "manifest.json").read_text()) == adapter and not (folder / "env.py").exists()
    (folder / "manifest.json").unlink()  # an empty or manifest-less folder is synth's to fill
    assert existing_env(folder)[0] == "none"


def test_a_rejected_env_is_replaced(out):
    cfg = SynthConfig(synthesizer="template", out_dir=out, seeds=8)
    r = synthesize("precondition verification", "example", cfg)
    folder = out / SLUG
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["verdict"] = "reject"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert existing_env(folder)[0] == "rejected"
    r = synthesize("precondition verification", "example", cfg)
    assert r.verdict == "accept" and not r.skipped


@needs_shared
def test_synth_on_a_real_target_names_the_target_path(out):
    r = invoke("synth", "-c", "structured data reasoning", "-t", str(TARGETS / "tau2" / "airline"),
               "--out", str(out), *FAST, "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    assert result["slug"] == "airline_structured_data_reasoning" and result["verdict"] == "accept"
    manifest = json.loads((out / result["slug"] / "manifest.json").read_text())
    assert manifest["target"] == str(TARGETS / "tau2" / "airline") and manifest["target_name"] == "tau2/airline"


# ============================================================================= usage errors


@pytest.mark.parametrize("args, message", [
    (["-c", "precondition verification", "-t", "no/such/target"],
     "error: --target no/such/target: no such folder or file; give a target folder (holding "
     "agent_tools.openai.json or tools.json), a JSON file of tool schemas, or 'example'\n"),
    (["-c", "greets the customer politely", "-t", "example"],
     "error: capability 'greets the customer politely' matches none of the template synthesizer's "
     f"families; name one of: {family_list()} (or use --llm openai, which takes any capability)\n"),
    (["-c", "precondition verification", "-t", "example", "--llm", "openai"],
     "error: --llm openai needs an endpoint (OPENAI_BASE_URL, or OPENAI_API_KEY for api.openai.com) "
     "and a model (--model): set OPENAI_BASE_URL (and OPENAI_API_KEY) and pass --model, or use --llm "
     "template for the offline template synthesizer\n"),
    (["-t", "example"], "error: give either --capability TEXT or --from capabilities.json\n"),
    (["-c", "x", "-t", "example", "--price-per-1k", "cheap"],
     "error: --price-per-1k 'cheap': give USD per 1,000 tokens as IN,OUT (e.g. 0.15,0.6) or one price "
     "for both\n"),
])
def test_usage_errors_exit_2(args, message, tmp_path):
    r = invoke("synth", *args, "--out", str(tmp_path))
    assert r.exit_code == 2 and r.output == message
    assert not any(tmp_path.iterdir())


def test_openai_with_a_model_but_no_endpoint(tmp_path):
    r = invoke("synth", "-c", "x", "-t", "example", "--llm", "openai", "--model", "m", "--out", str(tmp_path))
    assert r.exit_code == 2 and "--llm openai needs an endpoint (OPENAI_BASE_URL" in r.output


def test_resolve_synthesizer(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert resolve_synthesizer(SynthConfig(model="m")) == "template"          # no endpoint
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert resolve_synthesizer(SynthConfig()) == "template"                   # no model
    assert resolve_synthesizer(SynthConfig(model="m")) == "openai"
    assert resolve_synthesizer(SynthConfig(synthesizer="template", model="m")) == "template"
    with pytest.raises(UsageError, match=r"^--llm openai needs a model \(--model\): "):
        resolve_synthesizer(SynthConfig(synthesizer="openai"))
    with pytest.raises(UsageError, match="attempts must be from 1 to 50"):
        SynthConfig(attempts=0)


def test_slugs():
    example = load_target("example")
    from envforge.synth.families import BY_SLUG
    assert slug_for("anything", example, BY_SLUG["policy_adherence"]) == "helpdesk_policy_adherence"
    assert slug_for("Tool-call Argument Precision!", example, None) == "helpdesk_tool_call_argument_precision"


# ============================================================================= --from: a batch


CAPS = {"capabilities": [
    {"name": "precondition verification", "description": "reads before writing", "retained": True,
     "examples": ["t1", "t2"], "example_tasks": ["Reset my password please", "Extend loan LN-1"]},
    {"name": "confirmation before write", "description": "asks first", "retained": True},
    {"name": "escalation judgement", "description": "transfers when it must", "retained": True},
    {"name": "greets the customer politely", "description": "says hello", "retained": True},
    {"name": "smiles", "description": "", "retained": True},
    {"name": "tool-call argument precision", "description": "exact ids", "retained": False},
]}


def test_from_capabilities_json(tmp_path, out):
    path = tmp_path / "capabilities.json"
    path.write_text(json.dumps(CAPS))
    r = invoke("synth", "--from", str(path), "-t", "example", "--out", str(out), *FAST, "--json")
    assert r.exit_code == 1                                  # two capabilities have no family
    results = json.loads(r.output)
    assert [(x["capability"], x["verdict"]) for x in results] == [
        ("precondition verification", "accept"), ("confirmation before write", "accept"),
        ("escalation judgement", "accept"), ("greets the customer politely", "error"),
        ("smiles", "error")]
    # each row says what is wrong in one line; the list of families is not repeated in every row
    assert [x["error"] for x in results[3:]] == [
        f"capability {name!r} matches none of the template synthesizer's {len(FAMILIES)} families "
        f"(envforge synth -c {name!r} lists them); use --llm openai, which takes any capability"
        for name in ("greets the customer politely", "smiles")]
    assert sorted(x.name for x in out.iterdir() if x.is_dir()) == [
        "helpdesk_confirmation_before_write", "helpdesk_escalation_judgement", SLUG]
    # identify's example tasks reach the env's manifest (train copies them; the router shows them)
    assert json.loads((out / SLUG / "manifest.json").read_text())["examples"] == [
        "Reset my password please", "Extend loan LN-1"]
    assert json.loads((out / "helpdesk_confirmation_before_write" / "manifest.json").read_text())[
        "examples"] == []
    # --all takes the capabilities identify did not retain too; the accepted ones are kept
    r = invoke("synth", "--from", str(path), "--all", "-t", "example", "--out", str(out), *FAST)
    assert r.exit_code == 1
    assert "helpdesk_argument_precision" in r.output and "4 of 6 accepted" in r.output
    assert "already accepted; kept (--force to redo)" in r.output


def test_from_a_file_without_retained_capabilities(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"capabilities": [{"name": "x", "retained": False}]}))
    r = invoke("synth", "--from", str(path), "-t", "example", "--out", str(tmp_path))
    assert r.exit_code == 2 and r.output == (f"error: {path} has no retained capability to synthesize "
                                             "(pass --all to take every capability it lists)\n")
    path.write_text("[1, 2]")
    r = invoke("synth", "--from", str(path), "-t", "example", "--out", str(tmp_path))
    assert r.exit_code == 2 and r.output.startswith(f"error: {path}: expected {{\"capabilities\":")


def test_two_capabilities_of_one_family_make_one_env(out):
    from envforge.synth import synthesize_batch
    specs = [CapabilitySpec("confirmation before write"), CapabilitySpec("asks for explicit consent")]
    results = synthesize_batch(specs, "example", SynthConfig(synthesizer="template", out_dir=out, seeds=8))
    assert [r.verdict for r in results] == ["accept", "error"]
    assert results[1].error == ("'asks for explicit consent' maps to the same env "
                                "(helpdesk_confirmation_before_write) as 'confirmation before write', "
                                "which is synthesized instead")


def test_load_capabilities_renders_failing_examples(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(CAPS))
    failing = Trajectory("t1", [{"role": "user", "content": "cancel my order"},
                                {"role": "assistant", "content": "done, cancelled"}], 0.0, False)
    passing = Trajectory("t2", [{"role": "user", "content": "hi"}], 1.0, True)
    specs = load_capabilities(path, trajectories=[failing, passing])
    assert [s.name for s in specs] == ["precondition verification", "confirmation before write",
                                       "escalation judgement", "greets the customer politely", "smiles"]
    assert len(specs[0].examples) == 1 and "cancel my order" in specs[0].examples[0]
    assert specs[1].examples == [] and specs[0].description == "reads before writing"
    assert specs[0].tasks == ["Reset my password please", "Extend loan LN-1"] and specs[1].tasks == []
    assert [s.name for s in load_capabilities(path, retained_only=False)][-1] == "tool-call argument precision"
    assert isinstance(specs[0], CapabilitySpec)


def test_load_capabilities_takes_the_examples_identify_wrote(tmp_path):
    """identify renders the failures that lacked the capability (by file and task id); a
    re-lookup by task id would take the first failure of id "0" in any file."""
    from envforge.identify import IdentifyConfig, identify

    def run(source, text, reward, confirmed):
        msgs = [{"role": "user", "content": text}]
        if confirmed:
            msgs += [{"role": "assistant", "content": "Shall I cancel R1?"},
                     {"role": "user", "content": "Yes, go ahead."}]
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                  "function": {"name": "cancel_reservation", "arguments": '{"reservation_id": "R1"}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "{}"}]
        return Trajectory("0", msgs, reward, reward >= 1.0, None, {"source": source})
    ts = [run("a.json", "a: failed for another reason", 0.0, True),
          run("b.json", "b: cancelled unasked", 0.0, False), run("c.json", "c: passed", 1.0, True)]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(identify(ts, IdentifyConfig(runs=1)).to_dict()))
    spec = next(s for s in load_capabilities(path, retained_only=False, trajectories=ts)
                if s.name == "confirmation before write")
    assert len(spec.examples) == 1 and spec.examples[0].startswith("USER: b: cancelled unasked")


def test_load_capabilities_fallback_uses_the_threshold_identify_used(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"settings": {"success_threshold": 0.5}, **CAPS}))
    half = Trajectory("t1", [{"role": "user", "content": "half right"}], 0.5, False)
    wrong = Trajectory("t2", [{"role": "user", "content": "all wrong"}], 0.0, False)
    spec = load_capabilities(path, trajectories=[half, wrong])[0]
    assert len(spec.examples) == 1 and "all wrong" in spec.examples[0]


def test_import_synth_is_light():
    code = ("import sys, envforge.synth, envforge.synth.templates, envforge.synth.llm; "
            "print(' '.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())
    # synth uses the gate (a lower layer) at module level; neither loads a heavy package then
    heavy = ("openai", "hypothesis", "jsonschema", "rich", "matplotlib", "torch", "transformers",
             "peft", "trl", "docker", "ray", "envforge.cli", "envforge.identify", "trainers",
             "sandbox.docker", "sandbox.process")
    assert not [m for m in mods if m.startswith(heavy)]


@needs_shared
def test_identify_then_synth_from_works_offline(tmp_path, out):
    """README's chain on the real trajectories: the structural labeller's capabilities (all of
    them, with --all) each get a template env that the gate accepts on tau2 retail."""
    caps = tmp_path / "capabilities.json"
    files = sorted(str(p) for p in (SHARED / "trajectories").glob("*.json"))
    r = invoke("identify", *files, "-o", str(caps), "--no-plot", "--json")
    assert r.exit_code == 0, r.output
    found = json.loads(caps.read_text())["capabilities"]
    assert found[0]["name"] == "action completion" and found[0]["retained"]
    r = invoke("synth", "--from", str(caps), "--all", "-t", str(TARGETS / "tau2" / "retail"),
               "--out", str(out), "--seeds", "20", "--json")   # 8 seeds: partial credit can miss
    results = json.loads(r.output)
    assert [(x["capability"], x["verdict"]) for x in results] == [(c["name"], "accept") for c in found]
    assert r.exit_code == 0


def test_the_gate_probes_of_synth_come_from_a_secret_of_the_output_folder(tmp_path, monkeypatch):
    """The same code gets the same audit on a re-run (the LLM cache answers its repair request),
    yet env code cannot predict the draws: a quine can hash its own source, not this secret."""
    from envforge.synth.synthesizer import probe_secret
    monkeypatch.delenv("ENVFORGE_PROBE_SECRET")
    a = probe_secret(tmp_path / "a")
    assert len(a) == 16 and probe_secret(tmp_path / "a") == a
    assert probe_secret(tmp_path / "b") != a
    (tmp_path / "a" / ".envforge-probe-secret").write_text("not hex\n")
    assert len(probe_secret(tmp_path / "a")) == 16  # a damaged secret is made anew
    monkeypatch.setenv("ENVFORGE_PROBE_SECRET", "zz")
    with pytest.raises(UsageError, match="ENVFORGE_PROBE_SECRET must be hex"):
        probe_secret(tmp_path / "a")
    monkeypatch.setenv("ENVFORGE_PROBE_SECRET", "0a0b")
    assert probe_secret(tmp_path / "a") == probe_secret(tmp_path / "c") == bytes.fromhex("0a0b")
