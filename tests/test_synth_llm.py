"""The LLM synthesizer end to end, against a real HTTP server speaking the OpenAI chat API on
loopback (tests/openai_server.py) that replays scripted replies: a flawed env and its repair,
replies without code, truncated or refused, 429s, timeouts, an interrupted run resumed from the
cache; the prompt and the code extraction on their own."""
from __future__ import annotations

import json
import time

import pytest

from envforge.llm import LLMClient
from envforge.synth import CapabilitySpec, SynthConfig, synthesize, synthesize_batch
from envforge.synth.synthesizer import sha256
from envforge.synth.llm import contract_text, extract_code, prompt_messages, repair_message
from envforge.synth.templates import synthesize_template
from envforge.targets import load_target
from tests.openai_server import OpenAIServer

CAP = CapabilitySpec("precondition verification",
                     "checks a record's status and owner before changing it")
SLUG = "helpdesk_precondition_verification"


@pytest.fixture(scope="module")
def good() -> str:
    """An env the gate accepts: the template synthesizer's, standing in for a model's answer."""
    return synthesize_template(CAP.name, "precondition_verification", load_target("example"))[0]


@pytest.fixture
def flawed(good) -> str:
    return good.replace("import json\n", "import json\nimport os\n", 1)


def fenced(code: str, before: str = "Here is the environment.") -> str:
    return f"{before}\n\n```python\n{code}```\n\nIt follows the contract."


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def client_for(server, tmp_path, **kw) -> LLMClient:
    kw = {"base_url": server.url, "api_key": "sk-test", "cache_dir": tmp_path / "cache",
          "backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 30, **kw}
    return LLMClient("test-model", **kw)


def config(tmp_path, **kw) -> SynthConfig:
    return SynthConfig(**{"synthesizer": "openai", "model": "test-model", "out_dir": tmp_path / "envs",
                          "seeds": 8, **kw})



def user_text(request: dict) -> str:
    return request["messages"][-1]["content"]


# ============================================================================= repair


def test_a_flawed_env_is_repaired_and_accepted_on_attempt_2(server, tmp_path, good, flawed):
    server.reply(fenced(flawed), fenced(good))
    client = client_for(server, tmp_path)
    r = synthesize(CAP, "example", config(tmp_path, price_per_1k=(0.5, 1.5)), client=client)
    assert r.verdict == "accept" and r.slug == SLUG
    assert [(a.n, a.verdict) for a in r.attempts] == [(1, "reject"), (2, "accept")]
    first = r.attempts[0].findings
    assert [f.check for f in first if f.severity == "error"] == ["static.import"]
    assert "import of 'os' is not allowed" in first[0].message
    # the repair request carried the failing finding and the code it was about
    assert len(server.requests) == 2
    repair = server.requests[1]["messages"]
    assert repair[:2] == server.requests[0]["messages"]
    assert repair[2] == {"role": "assistant", "content": fenced(flawed)}
    text = repair[3]["content"]
    assert text.startswith("The gate rejected this env.py. Its findings (fix every one):\n\n- [static.import] line ")
    assert first[0].message in text
    assert "```python\n" + flawed.rstrip("\n") + "\n```" in text
    assert text.endswith("Reply with the complete corrected env.py in one ```python block.")
    # what landed on disk
    folder = tmp_path / "envs" / SLUG
    assert (folder / "env.py").read_text() == good
    manifest = json.loads((folder / "manifest.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "accept" and manifest["verdict"] == "accept"
    assert manifest["synthesizer"] == "openai" and manifest["model"] == "test-model"
    assert manifest["code_sha256"] == sha256(good) == manifest["attempts"][1]["code_sha256"]
    assert manifest["target"] == "example" and manifest["target_name"] == "helpdesk"
    assert manifest["target_schema_hash"] == load_target("example").schema_hash()
    assert len(manifest["prompt_sha256"]) == 64 and manifest["envforge_version"] == "0.1.0"
    usage = manifest["usage"]
    assert usage["calls"] == 2 and usage["cache_hits"] == 0
    # the test server reports usage as bytes // 4
    assert usage["completion_tokens"] == len(fenced(flawed)) // 4 + len(fenced(good)) // 4
    assert usage["prompt_tokens"] > 5000 and usage["total_tokens"] >= usage["prompt_tokens"]
    assert manifest["cost_usd"] == round(usage["prompt_tokens"] / 1000 * 0.5
                                         + usage["completion_tokens"] / 1000 * 1.5, 6)


def test_no_code_truncated_code_and_a_refusal_are_failed_attempts(server, tmp_path, good):
    truncated = "```python\n" + good[: len(good) // 2]
    server.reply("I would design an environment where the agent checks the ticket status first.",
                 truncated, "I'm sorry, but I can't help with writing that.", fenced(good))
    r = synthesize(CAP, "example", config(tmp_path, attempts=4), client=client_for(server, tmp_path))
    assert r.verdict == "accept"
    assert [a.verdict for a in r.attempts] == ["reject", "reject", "reject", "accept"]
    checks = [[f.check for f in a.findings] for a in r.attempts[:3]]
    assert checks == [["input"], ["static.syntax"], ["input"]]
    messages = [a.findings[0].message for a in r.attempts[:3]]
    assert messages[0].startswith("the reply held no code (77 characters of prose, no ```python block)")
    assert messages[1].startswith("the reply was truncated: its ```python block is never closed")
    assert messages[2].startswith("the reply was a refusal, not code: \"I'm sorry, but I can't help")
    # each repair request says what was wrong with the reply before it
    for request, message in zip(server.requests[1:], messages):
        assert message in user_text(request)


def test_rejected_after_the_last_attempt(server, tmp_path, flawed):
    server.reply(fenced(flawed), "no code here, sorry")
    r = synthesize(CAP, "example", config(tmp_path, attempts=2), client=client_for(server, tmp_path))
    assert r.verdict == "reject" and len(r.attempts) == 2
    folder = tmp_path / "envs" / SLUG
    assert json.loads((folder / "manifest.json").read_text())["verdict"] == "reject"
    assert json.loads((folder / "report.json").read_text())["verdict"] == "reject"
    # a rejected env may be overwritten by the next run without --force
    server.reset_log()
    server.reply("still nothing")
    assert synthesize(CAP, "example", config(tmp_path, attempts=1, temperature=0.9),
                      client=client_for(server, tmp_path)).verdict == "reject"
    assert len(server.requests) == 1


# ============================================================================= the endpoint


def test_429_then_success(server, tmp_path, good):
    server.fail(429, retry_after=0)
    server.reply(fenced(good))
    client = client_for(server, tmp_path)
    r = synthesize(CAP, "example", config(tmp_path), client=client)
    assert r.verdict == "accept" and [a.verdict for a in r.attempts] == ["accept"]
    assert server.statuses == [429, 200] and client.stats.retries == 1


def test_a_timeout_is_retried(server, tmp_path, good):
    calls = []

    def slow_then_fast(body):
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(1.5)
        return fenced(good)

    server.responder = slow_then_fast
    client = client_for(server, tmp_path, timeout_s=0.3, max_retries=1)
    r = synthesize(CAP, "example", config(tmp_path), client=client)
    assert r.verdict == "accept" and client.stats.retries == 1 and len(calls) == 2


def test_a_timeout_that_persists_is_an_error_result(tmp_path):
    with OpenAIServer(latency=1.0) as s:
        client = client_for(s, tmp_path, timeout_s=0.2, max_retries=0)
        r = synthesize(CAP, "example", config(tmp_path), client=client)
        url = s.url
    assert r.verdict == "error" and r.attempts == []
    assert r.error == (f"{url}: timed out on 1 attempts; lower --concurrency, check that the server "
                       "is up, or retry later (answers so far are cached)")


# ============================================================================= resume


def test_an_interrupted_run_resumes_from_the_cache(server, tmp_path, good, flawed):
    server.reply(fenced(flawed))
    server.fail(400, message="the server went away")          # attempt 2 cannot be asked
    r = synthesize(CAP, "example", config(tmp_path), client=client_for(server, tmp_path))
    assert r.verdict == "error" and r.error.endswith("answered HTTP 400: the server went away")
    manifest = json.loads((tmp_path / "envs" / SLUG / "manifest.json").read_text())
    assert manifest["verdict"] == "error" and [a["verdict"] for a in manifest["attempts"]] == ["reject"]
    assert server.ok_count == 1

    server.reset_log()
    server.reply(fenced(good))
    r = synthesize(CAP, "example", config(tmp_path), client=client_for(server, tmp_path))
    assert r.verdict == "accept" and [a.cached for a in r.attempts] == [True, False]
    assert len(server.requests) == 1                           # only the missing attempt was asked
    usage = json.loads((tmp_path / "envs" / SLUG / "manifest.json").read_text())["usage"]
    assert (usage["calls"], usage["cache_hits"]) == (1, 1)

    server.reset_log()                                          # accepted with the same inputs: kept
    r = synthesize(CAP, "example", config(tmp_path), client=client_for(server, tmp_path))
    assert r.verdict == "accept" and r.skipped and server.requests == []
    r = synthesize(CAP, "example", config(tmp_path, force=True), client=client_for(server, tmp_path))
    assert r.verdict == "accept" and not r.skipped and server.requests == []   # all from the cache


def test_a_batch_resumes(server, tmp_path, good):
    specs = [CAP, CapabilitySpec("confirmation before write", "asks before changing anything")]
    server.reply(fenced(good))
    server.fail(400, message="quota exhausted")
    results = synthesize_batch(specs, "example", config(tmp_path, concurrency=1),
                               client=client_for(server, tmp_path))
    assert [r.verdict for r in results] == ["accept", "error"]
    server.reset_log()  # the second is asked for anew: its env names its own capability
    server.reply(fenced(good.replace('CAPABILITY = "precondition verification"',
                                     'CAPABILITY = "confirmation before write"')))
    results = synthesize_batch(specs, "example", config(tmp_path, concurrency=2),
                               client=client_for(server, tmp_path))
    assert [r.verdict for r in results] == ["accept", "accept"] and results[0].skipped
    assert len(server.requests) == 1


# ============================================================================= the CLI


def test_cli_llm_path(server, tmp_path, good):
    from click.testing import CliRunner

    from envforge.cli import main
    server.reply(fenced(good))
    args = ["synth", "--capability", CAP.name, "--description", CAP.description, "--target", "example",
            "--model", "test-model", "--out", str(tmp_path / "envs"), "--seeds", "8", "--json",
            "--cache-dir", str(tmp_path / "cache"), "--price-per-1k", "0.5,1.5"]
    env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-test"}
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out) == {"capability", "slug", "path", "verdict", "attempts"}
    assert (out["capability"], out["slug"], out["verdict"]) == (CAP.name, SLUG, "accept")
    assert out["path"] == str(tmp_path / "envs" / SLUG)
    assert [(a["n"], a["verdict"]) for a in out["attempts"]] == [(1, "accept")]
    manifest = json.loads((tmp_path / "envs" / SLUG / "manifest.json").read_text())
    assert manifest["synthesizer"] == "openai" and manifest["cost_usd"] > 0
    r = CliRunner().invoke(main, args, env=env)                 # accepted: kept, no call
    assert r.exit_code == 0 and json.loads(r.output)["skipped"] is True
    assert len(server.requests) == 1


def test_cli_wrong_key(tmp_path):
    from click.testing import CliRunner

    from envforge.cli import main
    with OpenAIServer(api_key="sk-right") as s:
        url = s.url
        r = CliRunner().invoke(main, ["synth", "-c", CAP.name, "-t", "example", "--llm", "openai",
                                      "--model", "m", "--no-cache", "--out", str(tmp_path), "--json"],
                               env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-wrong"})
    assert r.exit_code == 1
    assert json.loads(r.output)["error"] == (f"{url} rejected the API key (HTTP 401): set "
                                             "OPENAI_API_KEY to a key this endpoint accepts")


# ============================================================================= prompt and extraction


def test_the_prompt_carries_what_the_model_needs():
    target = load_target("example")
    messages = prompt_messages("precondition verification", "reads before writing", target,
                               ["user: cancel it\nassistant: cancelled (never read the ticket)"])
    assert [m["role"] for m in messages] == ["system", "user"]
    text = messages[1]["content"]
    assert text.startswith("# Capability to train: precondition verification\n\nDescription: reads before writing")
    assert "### Example 1\nuser: cancel it\nassistant: cancelled (never read the ticket)" in text
    assert json.dumps(target.tools, indent=1, ensure_ascii=False) in text        # the exact schemas
    assert target.policy.strip()[:200] in text
    assert contract_text() in text
    for rule in ("Partial credit", "No free reward", "One skill per environment",
                 "Copy the\n  schemas below into Env.tools unchanged", "'Why it transfers:'"):
        assert rule in text
    assert "imports only: collections, copy, dataclasses, datetime, decimal, enum, fractions, " \
           "functools, hashlib, itertools, json, math, random, re, statistics, string, textwrap, typing;" in text


@pytest.mark.parametrize("reply, code, check", [
    ("```python\nx = 1\n```\n```python\nimport json\ny = 2\n```", "import json\ny = 2\n", None),  # the largest block
    ("import json\nCAPABILITY = 'x'\n", "import json\nCAPABILITY = 'x'\n", None),              # no fence, parses
    ("```json\n{}\n```\n```python\nclass Env:\n    pass", None, "static.syntax"),              # unterminated fence
    ("import json\ndef f(:\n", None, "static.syntax"),                                          # cut mid-line
    ("```python\nimport json\nx = (1,\n```", None, "static.syntax"),                           # cut, then closed
    ("```python\nx = = 1\ny = 2\n```", "x = = 1\ny = 2\n", None),   # a plain syntax error: the gate reports it
    ("", None, "input"),
    ("As an AI, I cannot write that.", None, "input"),
    ("Here is a plan: first, read the ticket.", None, "input"),
])
def test_code_extraction(reply, code, check):
    got, finding = extract_code(reply)
    assert got == code
    assert (finding.check if finding else None) == check


def test_repair_message_keeps_errors_and_evidence():
    findings = [{"check": "schema.fidelity", "severity": "error", "message": "tool 'x' differs",
                 "expected": {"type": "function"}},
                {"check": "contract.shape", "severity": "warning", "message": "no docstring"}]
    text = repair_message(findings, "CAPABILITY = 'x'\n",
                          {"mean_score": {"reference": 0.5}, "solved": "10/50"})
    assert "- [schema.fidelity] tool 'x' differs\n  the target's schema: {\"type\": \"function\"}" in text
    assert "no docstring" not in text
    assert 'Measured: mean scores {"reference": 0.5}, solved 10/50' in text
    assert "```python\nCAPABILITY = 'x'\n```" in text
