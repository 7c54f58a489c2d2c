"""envforge.llm and the LLM labeller of envforge.identify, against a real HTTP server speaking
the OpenAI chat-completions API on loopback (tests/openai_server.py)."""
from __future__ import annotations

import json
import re
import socket
import time

import pytest

from envforge.contract import tool_call
from envforge.errors import UsageError
from envforge.identify import IdentifyConfig, LACKING, NA, PRESENT, identify, labelling_schema
from envforge.llm import (LLMClient, LLMError, parse_json_reply, request_key, run_concurrently,
                          schema_problem)
from envforge.trajectories import Trajectory
from tests.openai_server import OpenAIServer, Status


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def make_client(server: OpenAIServer, tmp_path, **kw) -> LLMClient:
    kw = {"base_url": server.url, "api_key": "sk-test", "cache_dir": tmp_path / "cache",
          "backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 10, **kw}
    return LLMClient("test-model", **kw)


HELLO = [{"role": "user", "content": "hello"}]

# ============================================================================= the client


def test_chat_and_the_cache(server, tmp_path):
    server.reply("hi there")
    client = make_client(server, tmp_path)
    assert client.chat(HELLO, temperature=0) == "hi there"
    assert server.requests == [{"model": "test-model", "messages": HELLO, "temperature": 0}]
    assert client.chat(HELLO, temperature=0) == "hi there"          # from the cache
    assert len(server.requests) == 1 and client.stats.calls == 1 and client.stats.cache_hits == 1
    key = request_key({"model": "test-model", "messages": HELLO, "temperature": 0})
    entry = json.loads((tmp_path / "cache" / key[:2] / f"{key}.json").read_text())
    assert entry["key"] == key and entry["response"] == {"content": "hi there"}
    assert not list((tmp_path / "cache").rglob(".tmp-*"))
    # another endpoint, same request content: still the cache (keyed by content, not by URL)
    with OpenAIServer() as other:
        assert make_client(other, tmp_path).chat(HELLO, temperature=0) == "hi there"
        assert other.requests == []
    # other parameters are another request
    server.reply("warmer")
    assert client.chat(HELLO, temperature=0.7) == "warmer" and len(server.requests) == 2


def test_no_cache_and_a_broken_cache_entry(server, tmp_path):
    server.reply("a", "b", "c")
    client = make_client(server, tmp_path, cache=False)
    assert [client.chat(HELLO), client.chat(HELLO)] == ["a", "b"]
    assert not (tmp_path / "cache").exists()
    cached = make_client(server, tmp_path)
    key = request_key({"model": "test-model", "messages": HELLO})
    (tmp_path / "cache" / key[:2]).mkdir(parents=True)
    (tmp_path / "cache" / key[:2] / f"{key}.json").write_text('{"key": "trunc')
    assert cached.chat(HELLO) == "c"                      # a broken entry is a miss, then replaced
    assert json.loads((tmp_path / "cache" / key[:2] / f"{key}.json").read_text())["response"]["content"] == "c"


def test_a_failed_cache_write_leaves_nothing(server, tmp_path, monkeypatch):
    server.reply("x")
    client = make_client(server, tmp_path)

    def broken_replace(*a, **k):  # the entry is written to a temporary file; moving it fails
        raise OSError("disk full")
    monkeypatch.setattr("envforge.llm.os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        client.chat(HELLO)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_retries_429_and_5xx_with_backoff(server, tmp_path):
    server.fail(429, times=2, retry_after=0)
    server.fail(500)
    server.fail(503)
    server.reply("finally")
    client = make_client(server, tmp_path)
    assert client.chat(HELLO) == "finally"
    assert server.statuses == [429, 429, 500, 503, 200]
    assert client.stats.retries == 4 and client.stats.calls == 1


def test_gives_up_after_max_retries(server, tmp_path):
    server.fail(429, times=3)
    client = make_client(server, tmp_path, max_retries=2)
    with pytest.raises(LLMError) as e:
        client.chat(HELLO)
    assert str(e.value) == (f"{server.url}: HTTP 429 on 3 attempts; lower --concurrency, check that "
                            "the server is up, or retry later (answers so far are cached)")
    assert server.statuses == [429, 429, 429]


def test_wrong_key_fails_at_once(tmp_path):
    with OpenAIServer(api_key="sk-right") as s:
        client = make_client(s, tmp_path, api_key="sk-wrong")
        with pytest.raises(LLMError) as e:
            client.chat(HELLO)
        assert str(e.value) == (f"{s.url} rejected the API key (HTTP 401): set OPENAI_API_KEY to a "
                                "key this endpoint accepts")
        assert s.requests == []  # refused before any chat was logged, and not retried
        s.reply("ok")
        assert make_client(s, tmp_path, api_key="sk-right").chat(HELLO) == "ok"


def test_wrong_url(server, tmp_path):
    client = make_client(server, tmp_path, base_url=server.url.removesuffix("/v1") + "/api")
    with pytest.raises(LLMError, match=r"answered 404 for model 'test-model': check OPENAI_BASE_URL "
                                       r"\(it usually ends in /v1\) and --model"):
        client.chat(HELLO)


def test_nothing_listening(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = LLMClient("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                       cache_dir=tmp_path, max_retries=1, backoff_s=0.01)
    with pytest.raises(LLMError, match=r"127\.0\.0\.1:\d+/v1: could not connect on 2 attempts"):
        client.chat(HELLO)


def test_timeout(tmp_path):
    with OpenAIServer(latency=1.0) as s:
        client = make_client(s, tmp_path, timeout_s=0.2, max_retries=0)
        with pytest.raises(LLMError, match="timed out on 1 attempts"):
            client.chat(HELLO)


def test_missing_endpoint_or_model(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(UsageError) as e:
        LLMClient("m", cache_dir=tmp_path)
    assert str(e.value) == ("no LLM endpoint configured: set OPENAI_API_KEY to use api.openai.com, or "
                            "OPENAI_BASE_URL (e.g. http://localhost:8000/v1 for vLLM) for an "
                            "OpenAI-compatible server")
    with pytest.raises(UsageError, match="no model given: name the model the endpoint serves with --model"):
        LLMClient("", base_url="http://127.0.0.1:1/v1")
    # a local server needs no key: the environment's base URL is enough
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert LLMClient("m", cache_dir=tmp_path).base_url == "http://127.0.0.1:1/v1"


def test_rate_limit_spaces_requests(server, tmp_path):
    server.responder = lambda body: "ok"
    client = make_client(server, tmp_path, cache=False, rate_limit=20)
    start = time.monotonic()
    for _ in range(5):
        client.chat(HELLO)
    assert time.monotonic() - start >= 0.19  # 5 requests at 20/s: 4 gaps of 50 ms

# ============================================================================= the LLM labeller

CAPS = [{"name": "precondition verification", "description": "reads before writing"},
        {"name": "politeness", "description": "greets the customer"}]
# per task id: the labels a correct labelling reply gives
TRUTH = {
    "s0": {"precondition verification": PRESENT, "politeness": LACKING},
    "s1": {"precondition verification": PRESENT, "politeness": PRESENT},
    "s2": {"precondition verification": NA, "politeness": PRESENT},
    "f0": {"precondition verification": LACKING, "politeness": LACKING},
    "f1": {"precondition verification": LACKING, "politeness": PRESENT},
    "f2": {"precondition verification": PRESENT, "politeness": NA},
}


def trajectories() -> list[Trajectory]:
    out = []
    for tid in TRUTH:
        msgs = [{"role": "user", "content": f"please cancel R-{tid}"},
                {"role": "assistant", "content": None,
                 "tool_calls": [tool_call("cancel_reservation", {"reservation_id": f"R-{tid}"}, "c1")]},
                {"role": "tool", "tool_call_id": "c1", "content": "{}"},
                {"role": "assistant", "content": "Done."}]
        out.append(Trajectory(tid, msgs, 1.0 if tid[0] == "s" else 0.0, tid[0] == "s", None, {}))
    return out


def kind(body: dict) -> str:
    system = body["messages"][0]["content"]
    return "discovery" if system.startswith("You analyse failed") else "labelling"


def task_of(body: dict) -> str:
    return re.search(r"Trajectory \(task (\w+)\)", body["messages"][1]["content"]).group(1)


def evidenced(labels: dict) -> dict:
    """Labels with the evidence the rubric asks for: turn 0 says "please cancel R-..."."""
    return {n: {"label": lab, "turn": None if lab == NA else 0,
                "quote": None if lab == NA else "please cancel"} for n, lab in labels.items()}


def good_reply(body: dict) -> str:
    if kind(body) == "discovery":
        return json.dumps({"capabilities": CAPS})
    return json.dumps({"labels": evidenced(TRUTH[task_of(body)])})


def llm_config(tmp_path, **kw) -> IdentifyConfig:
    return IdentifyConfig(**{"labeller": "llm", "model": "test-model", "runs": 1, "concurrency": 4,
                             "min_group": 3, **kw})


def test_discovery_and_one_labelling_call_per_trajectory(server, tmp_path):
    server.responder = good_reply
    ts = trajectories()
    report = identify(ts, llm_config(tmp_path), client=make_client(server, tmp_path)).to_dict()
    kinds = [kind(b) for b in server.requests]
    assert kinds.count("discovery") == 1 and kinds.count("labelling") == len(ts)
    assert sorted(task_of(b) for b in server.requests if kind(b) == "labelling") == sorted(TRUTH)
    # the discovery batch holds the failures only
    disc = next(b for b in server.requests if kind(b) == "discovery")["messages"][1]["content"]
    assert all(f"(task {t})" in disc for t in ("f0", "f1", "f2")) and "(task s0)" not in disc
    pre = next(c for c in report["capabilities"] if c["name"] == "precondition verification")
    # successes: P, P, NA -> ER+ 0; failures: L, L, P -> ER- 2/3; coverage 2/3
    assert (pre["er_plus"], pre["er_minus"], pre["gap"], pre["coverage"]) == (0.0, 0.6667, 0.6667, 0.6667)
    assert pre["retained"] and pre["examples"] == ["f0", "f1"]
    pol = next(c for c in report["capabilities"] if c["name"] == "politeness")
    assert (pol["er_plus"], pol["er_minus"], pol["gap"]) == (0.3333, 0.5, 0.1667) and not pol["retained"]
    assert report["llm"] == {"model": "test-model", "calls": 7, "cache_hits": 0, "retries": 0,
                             "discovery_requests": 1, "invalid_replies": 0}
    # a re-run costs nothing
    server.reset_log()
    again = identify(ts, llm_config(tmp_path), client=make_client(server, tmp_path)).to_dict()
    assert server.requests == [] and again["llm"]["cache_hits"] == 7 and again["llm"]["calls"] == 0
    assert again["capabilities"] == report["capabilities"]


def test_labelling_asks_for_all_candidates_in_one_schema():
    from envforge.llm import schema_problem
    schema = labelling_schema(["a", "b"])
    assert schema["properties"]["labels"]["required"] == ["a", "b"]
    ok = {"labels": {"a": {"label": "NA"}, "b": {"label": "LACKING", "turn": 3, "quote": "x"}}}
    assert schema_problem(ok, schema) is None
    # PRESENT and LACKING need a turn and a quote
    assert "'turn' is a required property" in schema_problem(
        {"labels": {"a": {"label": "NA"}, "b": {"label": "PRESENT", "quote": "x"}}}, schema)
    assert schema_problem({"labels": {"a": {"label": "maybe"}, "b": {"label": "NA"}}}, schema)


def test_malformed_json_is_asked_again(server, tmp_path):
    def responder(body):
        if kind(body) == "labelling" and task_of(body) == "f0" and len(body["messages"]) == 2:
            return "Sure! Here are the labels: {precondition verification: LACKING"
        if kind(body) == "labelling" and task_of(body) == "s1" and len(body["messages"]) == 2:
            return "```json\n" + good_reply(body) + "\n```"  # fenced JSON is fine as it is
        return good_reply(body)
    server.responder = responder
    report = identify(trajectories(), llm_config(tmp_path), client=make_client(server, tmp_path)).to_dict()
    repairs = [b for b in server.requests if len(b["messages"]) == 4]
    assert len(repairs) == 1 and task_of(repairs[0]) == "f0"
    assert repairs[0]["messages"][2]["content"].startswith("Sure! Here are the labels")
    assert repairs[0]["messages"][3]["content"] == ("That reply cannot be used: the reply is not "
                                                     "valid JSON. Reply again with only the JSON object.")
    assert report["llm"]["invalid_replies"] == 0
    pre = next(c for c in report["capabilities"] if c["name"] == "precondition verification")
    assert pre["examples"] == ["f0", "f1"]


def test_a_missing_label_is_asked_again_then_counted_na(server, tmp_path):
    def responder(body):
        if kind(body) == "labelling" and task_of(body) == "f1":  # no politeness
            return json.dumps({"labels": {"Precondition Verification": {
                "label": "lacking", "turn": 0, "quote": "Please  CANCEL"}}})
        return good_reply(body)
    server.responder = responder
    report = identify(trajectories(), llm_config(tmp_path, max_repairs=1),
                      client=make_client(server, tmp_path)).to_dict()
    f1 = [b for b in server.requests if kind(b) == "labelling" and task_of(b) == "f1"]
    assert len(f1) == 2  # the question, then one re-ask
    assert f1[1]["messages"][3]["content"] == (
        "That reply cannot be used: labels: 'politeness' is a required property. Reply again with "
        "only the JSON object.")
    assert report["llm"]["invalid_replies"] == 1
    pre = next(c for c in report["capabilities"] if c["name"] == "precondition verification")
    pol = next(c for c in report["capabilities"] if c["name"] == "politeness")
    assert pre["examples"] == ["f0", "f1"]     # the label it gave (any case, quote spacing) counts
    assert pol["counts"]["na_failure"] == 2    # f2's NA, and f1's missing one


def test_evidence_must_be_quoted_from_the_turn_it_names(server, tmp_path):
    """A label whose quote is not in the named turn is asked again; still unsupported, NA."""
    def responder(body):
        if kind(body) == "labelling" and task_of(body) == "f0":
            labels = evidenced(TRUTH["f0"])
            labels["precondition verification"] = {"label": LACKING, "turn": 3, "quote": "please cancel"}
            labels["politeness"] = {"label": LACKING, "turn": 99, "quote": "hello"}
            return json.dumps({"labels": labels})
        return good_reply(body)
    server.responder = responder
    result = identify(trajectories(), llm_config(tmp_path, max_repairs=1), client=make_client(server, tmp_path))
    f0 = [b for b in server.requests if kind(b) == "labelling" and task_of(b) == "f0"]
    assert len(f0) == 2
    assert f0[1]["messages"][3]["content"].startswith(
        "That reply cannot be used: evidence not found: precondition verification: the quote "
        "'please cancel' is not in turn 3; politeness: turn 99 is not a message index between 0 and 3")
    assert result.llm["invalid_replies"] == 1
    row = next(r for r in result.label_rows() if r["task_id"] == "f0")
    assert row["labels"] == {"precondition verification": NA, "politeness": NA}
    assert row["evidence"]["politeness"] == {"turn": None, "why": "llm: no label with checked evidence"}
    # the prompt numbers the turns the quotes must come from, and carries the rubric
    prompt = f0[0]["messages"][1]["content"]
    assert "[0] USER: please cancel R-f0" in prompt and "[3] AGENT: Done." in prompt
    assert "rubric: LACKING: the agent changed an entity" in prompt
    assert "The agent's policy" not in prompt                      # none known for these
    good = next(r for r in result.label_rows() if r["task_id"] == "f1")
    assert good["evidence"]["precondition verification"] == {"turn": 0, "why": 'llm: "please cancel"'}


def test_hybrid_shows_the_rules_evidence_and_the_model_confirms_or_corrects(server, tmp_path):
    """No discovery: the structural capabilities, each with the rule's label and evidence; the
    model's checked label wins, and where it gives none the rule's label stands."""
    from envforge.identify import STRUCTURAL_RULES
    names = [r.capability.name for r in STRUCTURAL_RULES]

    def responder(body):
        assert body["messages"][0]["content"].startswith("You check the labels a rule-based labeller")
        text = body["messages"][1]["content"]
        rules = dict(re.findall(r"^- (.+?): (PRESENT|LACKING|NA)\b", text.split("rule-based labels")[1], re.M))
        labels = {n: {"label": lab, "turn": None if lab == NA else 0,
                      "quote": None if lab == NA else "please cancel"} for n, lab in rules.items()}
        if task_of(body) == "f0":  # corrects one label, gives unsupported evidence for another
            labels["precondition verification"] = {"label": PRESENT, "turn": 0, "quote": "please cancel"}
            labels["confirmation before write"] = {"label": PRESENT, "turn": 2, "quote": "not there"}
        return json.dumps({"labels": labels})
    server.responder = responder
    result = identify(trajectories(), llm_config(tmp_path, labeller="hybrid", max_repairs=0),
                      client=make_client(server, tmp_path), policy="Always confirm before writes.")
    assert result.labeller == "hybrid" and [c["name"] for c in result.capabilities] != []
    assert {c["name"] for c in result.capabilities} == set(names)
    kinds = [kind(b) for b in server.requests]
    assert kinds == ["labelling"] * 6                                     # no discovery
    prompt = next(b for b in server.requests if task_of(b) == "f0")["messages"][1]["content"]
    assert prompt.startswith("Capabilities:") and "The agent's policy:\nAlways confirm before writes." in prompt
    # the rule's evidence is shown: the cancel had no read of R-f0 before it
    assert "- precondition verification: LACKING (turn 1): cancel_reservation on R-f0 with no earlier read" in prompt
    row = next(r for r in result.label_rows() if r["task_id"] == "f0")
    assert row["labels"]["precondition verification"] == PRESENT            # corrected
    assert row["evidence"]["precondition verification"]["why"] == 'llm: "please cancel"'
    assert row["labels"]["confirmation before write"] == LACKING            # the rule's label stands
    assert "without an explicit yes" in row["evidence"]["confirmation before write"]["why"]
    other = next(r for r in result.label_rows() if r["task_id"] == "f1")
    assert other["labels"]["precondition verification"] == LACKING
    assert other["evidence"]["precondition verification"]["why"] == 'confirmed: "please cancel"'
    assert result.llm["invalid_replies"] == 1 and result.llm["discovery_requests"] == 0


def test_429s_during_a_run(server, tmp_path):
    server.fail(429, times=3, retry_after=0)
    server.responder = good_reply
    report = identify(trajectories(), llm_config(tmp_path), client=make_client(server, tmp_path)).to_dict()
    assert server.statuses.count(429) == 3 and server.ok_count == 7
    assert report["llm"]["retries"] == 3 and report["llm"]["calls"] == 7


def test_an_interrupted_run_resumes(server, tmp_path):
    def failing(body):
        if kind(body) == "labelling" and task_of(body) == "f2":
            return Status(503, "overloaded")
        return good_reply(body)
    server.responder = failing
    ts = trajectories()
    with pytest.raises(LLMError, match="HTTP 503 on 2 attempts"):
        identify(ts, llm_config(tmp_path), client=make_client(server, tmp_path, max_retries=1))
    first = server.ok_count
    assert 1 <= first < 7
    server.reset_log()
    server.responder = good_reply
    report = identify(ts, llm_config(tmp_path), client=make_client(server, tmp_path)).to_dict()
    assert first + server.ok_count == 7                # nothing answered twice
    assert report["llm"]["cache_hits"] == first
    assert "f2" in [task_of(b) for b in server.requests if kind(b) == "labelling"]


def test_several_runs_merge_their_discoveries(server, tmp_path):
    def responder(body):
        if kind(body) == "discovery":
            extra = {"name": f"idea {body['seed']}", "description": "only in this run"}
            return json.dumps({"capabilities": [{"name": "Verifying preconditions", "description": "x"},
                                                extra]})
        names = re.findall(r"^- (.+?): ", body["messages"][1]["content"], re.M)
        return json.dumps({"labels": {n: NA for n in names}})
    server.responder = responder
    report = identify(trajectories(), llm_config(tmp_path, runs=3, max_candidates=3),
                      client=make_client(server, tmp_path)).to_dict()
    seeds = sorted(b["seed"] for b in server.requests if kind(b) == "discovery")
    assert seeds == [0, 1, 2]                                  # one batch per run, its own seed
    # the common candidate first (proposed by 3 batches), then the first two of the others
    assert [c["name"] for c in report["capabilities"]] == ["Verifying preconditions", "idea 0", "idea 1"]
    assert sum(kind(b) == "labelling" for b in server.requests) == 6  # still one per trajectory


def test_calls_run_concurrently(tmp_path):
    with OpenAIServer(latency=0.2, responder=good_reply) as s:
        start = time.monotonic()
        identify(trajectories(), llm_config(tmp_path, concurrency=6), client=make_client(s, tmp_path))
        took = time.monotonic() - start
    assert took < 1.0  # 7 calls x 0.2 s one at a time would be 1.4 s; 2 rounds of 6 are 0.4 s


# ============================================================================= JSON replies, the pool

def test_parse_json_reply():
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply('```json\n{"a": [1, 2]}\n```') == {"a": [1, 2]}
    assert parse_json_reply('Here you are: {"a": {"b": 2}} Hope it helps.') == {"a": {"b": 2}}
    for bad in ("", "labels: none", "{'a': 1}", '{"a": 1'):
        with pytest.raises(ValueError, match="the reply is not valid JSON"):
            parse_json_reply(bad)


def test_chat_json_gives_up_with_the_remaining_problem(server, tmp_path):
    server.reply('{"n": "one"}', '{"n": "two"}')
    client = make_client(server, tmp_path)
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    obj, problem = client.chat_json(HELLO, schema, repairs=1)
    assert obj == {"n": "two"} and problem == "n: 'two' is not of type 'integer'"
    assert server.requests[1]["messages"][-1]["content"] == (
        "That reply cannot be used: n: 'one' is not of type 'integer'. Reply again with only the "
        "JSON object.")
    assert schema_problem({"n": 1}, schema) is None


def test_run_concurrently_keeps_order_and_stops_at_the_first_error():
    assert run_concurrently(lambda x: x * x, list(range(20)), 4) == [x * x for x in range(20)]
    started = []

    def fn(x):
        started.append(x)
        if x == 0:
            raise LLMError("boom")
        time.sleep(0.01)
        return x
    with pytest.raises(LLMError, match="boom"):
        run_concurrently(fn, list(range(200)), 2)
    assert len(started) < 200  # the calls not yet started were cancelled


# ============================================================================= the command line

def test_cli_llm_labeller_end_to_end(server, tmp_path):
    from click.testing import CliRunner

    from envforge.cli import main
    from envforge.trajectories import write_jsonl
    server.responder = good_reply
    write_jsonl(trajectories(), tmp_path / "t.jsonl")
    args = ["identify", str(tmp_path / "t.jsonl"), "--labeler", "llm", "--model", "test-model",
            "--runs", "1", "--json", "--no-plot", "--out", str(tmp_path / "c.json"),
            "--cache-dir", str(tmp_path / "cache"), "--min-group", "3"]
    env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-test"}
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["llm"]["calls"] == 7 and report["labeller"] == "llm"
    assert json.loads((tmp_path / "c.json").read_text()) == report
    r = CliRunner().invoke(main, args, env=env)                       # cached: no request at all
    assert r.exit_code == 0 and json.loads(r.stdout)["llm"]["cache_hits"] == 7
    assert len(server.requests) == 7


def test_cli_wrong_key(tmp_path):
    from click.testing import CliRunner

    from envforge.cli import main
    from envforge.trajectories import write_jsonl
    write_jsonl(trajectories(), tmp_path / "t.jsonl")
    with OpenAIServer(api_key="sk-right") as s:
        url = s.url
        r = CliRunner().invoke(main, ["identify", str(tmp_path / "t.jsonl"), "--labeler", "llm",
                                      "--model", "m", "--no-cache", "--out", str(tmp_path / "c.json")],
                               env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-wrong"})
    assert r.exit_code == 1
    assert r.output == (f"error: {url} rejected the API key (HTTP 401): set OPENAI_API_KEY to a key "
                        "this endpoint accepts\n")


def test_other_client_errors_are_not_retried(server, tmp_path):
    server.fail(400, message="max_tokens is too large")
    with pytest.raises(LLMError) as e:
        make_client(server, tmp_path).chat(HELLO)
    assert str(e.value) == f"{server.url} answered HTTP 400: max_tokens is too large"
    assert server.statuses == [400]


def test_no_failures_to_discover_from(server, tmp_path):
    from envforge.errors import InputError
    ts = [t for t in trajectories() if t.success]
    with pytest.raises(InputError, match="no failed trajectories: the LLM labeller discovers "
                                         r"capabilities from failures \(check --success-threshold\)"):
        identify(ts, llm_config(tmp_path), client=make_client(server, tmp_path))
    assert server.requests == []


def test_the_test_server_lists_its_model_and_checks_the_key():
    import urllib.error
    import urllib.request
    with OpenAIServer(api_key="sk-k", model="tiny") as s:
        req = urllib.request.Request(f"{s.url}/models", headers={"Authorization": "Bearer sk-k"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["tiny"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{s.url}/models", timeout=5)
        assert e.value.code == 401


def test_the_rubric_covers_every_structural_capability():
    """The LLM labeller is given the same definitions as the rules (docs/identify-rubric.md)."""
    from envforge.identify import STRUCTURAL_RULES
    from envforge.identify.llm import LABELLING_SYSTEM, RUBRIC
    assert set(RUBRIC) == {r.capability.name for r in STRUCTURAL_RULES}
    assert all("LACKING:" in text and "PRESENT:" in text and "NA:" in text for text in RUBRIC.values())
    assert "One root cause, one label" in LABELLING_SYSTEM and "pre-filled history" in LABELLING_SYSTEM
