"""The gate end to end: broken variants of a good env, each rejected with the exact finding."""
import dataclasses
import json

import pytest

from envforge.contract import Limits
from envforge.gate import audit
from envforge.gate.dynamic import GateSettings
from tests.envfactory import GOOD_DIR, good_source, replace, variants, write_env

FAST = GateSettings(seeds=12, robustness_examples=15, replay_random=4,
                    limits=Limits(call_timeout_s=1.0, memory_mb=512))


def _errors(report):
    return [f for f in report.findings if f.severity == "error"]


def test_the_good_env_is_accepted_with_stats():
    report = audit(GOOD_DIR, settings=FAST, write_report=False)
    assert report.verdict == "accept", [f.to_dict() for f in report.findings]
    assert report.target == "helpdesk"
    assert report.stats["solved"] == "12/12"
    assert report.stats["mean_score"]["reference"] == 1.0
    assert report.stats["mean_score"]["do_nothing"] <= 0.3
    assert len(report.stats["score_values"]) >= 3
    assert set(report.stages) == {"static", "schema", "dynamic"}


@pytest.mark.parametrize("variant", variants(), ids=lambda v: v.name)
def test_each_broken_variant_gets_its_finding(tmp_path, variant):
    folder = write_env(tmp_path / variant.name, variant.source)
    # robustness examples are drawn afresh by default, and 15 of them miss the one crashing action
    # about 1 audit in 35 (a local CI of 3204700 met it): a pinned draw, as below
    settings = dataclasses.replace(FAST, probe_seed=0) if variant.check == "robustness" else FAST
    report = audit(folder, settings=settings, write_report=False)
    assert report.verdict == "reject"
    matching = [f for f in _errors(report) if f.check == variant.check and variant.message in f.message]
    assert matching, f"no {variant.check} error mentioning {variant.message!r}; got " + json.dumps(
        [f.to_dict() for f in report.findings], indent=1)[:3000]


def test_every_finding_is_reported_not_only_the_first(tmp_path):
    crash = next(v for v in variants() if v.name == "crash_on_bad_action").source
    source = crash.replace("import json\n", "import json\nimport os\n", 1)
    # a pinned draw: 15 robustness examples drawn afresh missed the crashing action about 1 audit in 35
    report = audit(write_env(tmp_path / "two", source), settings=dataclasses.replace(FAST, probe_seed=0),
                   write_report=False)
    assert {"static.import", "robustness"} <= {f.check for f in _errors(report)}


def test_static_only_runs_no_code(tmp_path):
    hang = next(v for v in variants() if v.name == "hang").source
    report = audit(write_env(tmp_path / "h", hang), static_only=True, settings=FAST, write_report=False)
    assert report.verdict == "accept" and "dynamic" not in report.stages


def test_static_only_checks_the_schema_however_tools_is_written(tmp_path):
    """Env.tools annotated or inherited is still read and compared; one the static stage cannot
    read is said to be unchecked, never silently passed."""
    drifted = replace("Look up an employee by their work email", "Find an employee by their email")
    for spelling in ("    tools: list = TOOLS\n", "    tools = TOOLS\n"):
        src = drifted.replace("    tools = TOOLS\n", spelling, 1)
        report = audit(write_env(tmp_path / str(len(spelling)), src), static_only=True, write_report=False)
        assert report.verdict == "reject"
        assert any(f.check == "schema.fidelity" and f.severity == "error" for f in report.findings)
    computed = good_source().replace("    tools = TOOLS\n", "    tools = list(TOOLS)\n", 1)
    report = audit(write_env(tmp_path / "computed", computed), static_only=True, write_report=False)
    [w] = [f for f in report.findings if f.check == "schema.fidelity"]
    assert w.severity == "warning" and "not a literal" in w.message


def test_a_bom_env_runs_as_python_runs_it(tmp_path):
    folder = write_env(tmp_path / "bom", b"\xef\xbb\xbf" + good_source().encode())
    report = audit(folder, settings=FAST, write_report=False)
    assert report.verdict == "accept", [f.to_dict() for f in report.findings]


def test_report_json_is_written_beside_the_env(tmp_path):
    folder = write_env(tmp_path / "env", good_source().replace("import json\n", "import json\nimport os\n"))
    report = audit(folder, static_only=True)
    data = json.loads((folder / "report.json").read_text())
    assert data["verdict"] == "reject" == report.verdict
    assert data["findings"][0]["check"] == "static.import"


def test_target_from_manifest_missing_is_a_warning_not_a_crash(tmp_path):
    folder = write_env(tmp_path / "env", good_source(), target="no/such/target")
    report = audit(folder, static_only=True, write_report=False)
    [w] = [f for f in report.findings if f.check == "schema.fidelity"]
    assert w.severity == "warning" and "no/such/target" in w.message


def test_no_target_at_all_warns(tmp_path):
    folder = write_env(tmp_path / "env", good_source(), target=None)
    report = audit(folder, static_only=True, write_report=False)
    assert report.verdict == "accept"
    assert any(f.check == "schema.fidelity" and f.severity == "warning" and "--target" in f.message
               for f in report.findings)


def test_a_slow_env_exhausts_the_budget_and_the_audit_ends(tmp_path):
    from tests.envfactory import override
    slow = override("""
        def step(self, action):
            n = 0
            for i in range(300000):
                n += i
            return _Base.step(self, action)
    """)
    settings = GateSettings(seeds=12, robustness_examples=15, budget_s=1.5, limits=FAST.limits)
    report = audit(write_env(tmp_path / "slow", slow), settings=settings, write_report=False)
    [f] = [f for f in _errors(report) if f.check == "bounded"]
    assert "1.5 s budget" in f.message and "ms a call" in f.message
    assert report.stages["dynamic"] < 1.5 + 3 * FAST.limits.call_timeout_s


def test_audits_in_parallel_threads():
    """Hypothesis parses sources (inspect.getsource) and CPython 3.11's parser is not safe across
    threads: the gate serializes that, so concurrent audits (synth --from) all complete. Each
    audit has a probe seed of its own, fixed: what is under test is the threads, not the draw (a
    good env's rate of false rejections over draws is measured by `benchmarks/bench_redteam.py
    --draws`)."""
    import threading
    results, errors = [], []

    def one(probe_seed):
        try:
            results.append(audit(GOOD_DIR, settings=GateSettings(seeds=6, robustness_examples=8, replay_random=2,
                                                                  probe_seed=probe_seed), write_report=False))
        except BaseException as e:  # noqa: BLE001 - any exception is the failure under test
            errors.append(repr(e))

    for round_ in range(3):
        threads = [threading.Thread(target=one, args=(3 * round_ + i,)) for i in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert errors == []
    assert [r.verdict for r in results] == ["accept"] * 9


def test_perturb_changes_one_argument_and_keeps_the_other_calls():
    from envforge.contract import assistant, tool_call
    from envforge.gate.dynamic import perturb
    two = assistant(None, [tool_call("get", {"id": "A1"}, "c0"), tool_call("list", {"page": 1}, "c1")])
    seed = next(s for s in range(30) if s % 3 == 1)  # the mode that changes an argument
    [out] = perturb([two], seed)
    assert [c["function"]["name"] for c in out["tool_calls"]] == ["get", "list"]
    assert out["tool_calls"][1] == two["tool_calls"][1]
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) != {"id": "A1"}


def test_probes_are_drawn_per_audit_from_a_large_range():
    """Nothing an env could recognise is fixed: seeds, texts and the second hash seed come from
    the probe seed; the same probe seed gives the same draws."""
    from envforge.gate.dynamic import Draws

    settings = GateSettings()
    a, b, again = Draws(1, settings), Draws(2, settings), Draws(1, settings)
    assert (a.seeds, a.texts, a.hash_seed) == (again.seeds, again.texts, again.hash_seed)
    assert len(set(a.seeds) & set(b.seeds)) < 5 and a.texts != b.texts and a.hash_seed != b.hash_seed
    assert len(set(a.seeds)) == settings.seeds
    assert sum(s >= 50 for s in a.seeds) >= settings.seeds * 0.7 and max(a.seeds) > 10**6
    assert max(len(t) for t in a.texts) >= settings.long_text_chars - 1
    assert len({len(t) for t in a.texts}) > 3
    assert a.hash_seed != settings.training_hash_seed == 0


def test_the_seeds_cover_what_training_runs_short_and_long():
    """Half the seeds small, and none of the ranges training draws from left dark: a flaw kept
    to [256, 1000) was on no seed of any audit while the middling quarter was uniform in [1000,
    10^6)."""
    from envforge.contract import SMALL_SEEDS
    from envforge.gate.dynamic import Draws

    settings = GateSettings()  # 50 seeds
    draws = [Draws(p, settings).seeds for p in range(20)]
    assert all(sum(s < SMALL_SEEDS for s in d) >= settings.seeds // 2 for d in draws)
    assert sum(any(256 <= s < 1000 for s in d) for d in draws) >= 15
    assert sum(any(1000 <= s < 10**4 for s in d) for d in draws) >= 15
    assert sum(any(10**5 <= s < 10**6 for s in d) for d in draws) >= 15
    assert all(any(s >= 10**6 for s in d) for d in draws)


def test_partial_credit_the_draw_missed_is_probed_again(tmp_path, monkeypatch):
    """With few seeds every perturbation of one round can score 0 or 1 by chance, and the good
    env (which pays 0.2, 0.7, 0.8 too) was rejected for 'partial_credit' (CI saw it at --seeds 8).
    Find a probe seed with that luck at one round, then the gate's extra rounds must accept it."""
    import envforge.gate.dynamic as dynamic
    folder = write_env(tmp_path / "good", good_source())

    def partial_credit(k: int) -> bool:  # (the checks this test is not about kept short)
        r = audit(folder, settings=GateSettings(seeds=4, probe_seed=k, hash_processes=1, robustness_examples=5,
                                                resets=100), write_report=False)
        return any(f.check == "partial_credit" and "take only the values" in f.message for f in r.findings)
    monkeypatch.setattr(dynamic, "PARTIAL_CREDIT_ROUNDS", 0)
    unlucky = next((k for k in range(120) if partial_credit(k)), None)
    assert unlucky is not None, "no probe seed in 0..119 drew only 0/1 scores: the draws changed, widen the range"
    monkeypatch.undo()
    assert dynamic.PARTIAL_CREDIT_ROUNDS > 0 and not partial_credit(unlucky)


def _order_under(hash_seed: int) -> str:
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", "print(list({'alpha', 'beta'}))"], capture_output=True,
                          text=True, env={"PYTHONHASHSEED": str(hash_seed)}, check=True).stdout


def test_set_order_is_caught_by_one_of_several_hash_seeds(tmp_path):
    """A set of two strings keeps its order under another PYTHONHASHSEED half the time, so one
    second process misses it half the time (and once in 720 for six: a CI run met that). With a
    probe seed whose first drawn hash seed keeps the order and a later one does not (found here,
    on this Python's hashing), one process accepts and the default several reject."""
    from envforge.gate.dynamic import Draws
    from sandbox.base import get_backend
    from tests.envfactory import override
    if get_backend("auto").name != "process":
        pytest.skip("the orders are computed with this interpreter: the process sandbox runs it")
    settings = dataclasses.replace(FAST, training_hash_seed=0)
    first = _order_under(0)
    for probe_seed in range(40):
        seeds = Draws(probe_seed, settings).hash_seeds
        orders = [_order_under(s) for s in seeds]
        if orders[0] == first and any(o != first for o in orders[1:]):
            break
    else:
        pytest.skip("no probe seed below 40 has the order kept by the first hash seed only")
    folder = write_env(tmp_path / "two", override("""
        def reset(self, seed):
            obs, info = _Base.reset(self, seed)
            info["tags"] = list({"alpha", "beta"})
            return obs, info
    """))
    one = audit(folder, settings=dataclasses.replace(settings, probe_seed=probe_seed, hash_processes=1),
                write_report=False)
    assert one.verdict == "accept", [f.to_dict() for f in one.findings]
    several = audit(folder, settings=dataclasses.replace(settings, probe_seed=probe_seed), write_report=False)
    assert several.verdict == "reject"
    assert any(f.check == "determinism" and "PYTHONHASHSEED" in f.message for f in _errors(several))
    used = several.stats["hash_seeds"]  # the processes started, up to the one that differed
    assert used == [0, *seeds[:len(used) - 1]] and _order_under(used[-1]) != first
