"""One progress protocol: every long stage gives a callable ``Step``s (envforge.progress), from
the threads that do the work; the command line only shows them."""
from __future__ import annotations

import threading

from envforge.gate import audit
from envforge.gate.config import GateSettings
from envforge.progress import Step, reporter
from envforge.synth import CapabilitySpec, SynthConfig, synthesize_batch
from tests.envfactory import GOOD_DIR


class Recorder:
    def __init__(self):
        self.steps, self.lock = [], threading.Lock()

    def __call__(self, step):
        assert isinstance(step, Step)
        with self.lock:
            self.steps.append(step)


def test_audit_reports_its_stages_as_steps_of_its_path():
    rec = Recorder()
    audit(GOOD_DIR, settings=GateSettings(seeds=4, robustness_examples=3, replay_random=1),
          write_report=False, progress=rec)
    assert {s.item for s in rec.steps} == {str(GOOD_DIR)}
    texts = [s.text for s in rec.steps]
    assert texts[0] == "static audit" and len(texts) > 2
    assert str(rec.steps[0]) == f"{GOOD_DIR}: static audit"


def test_a_synth_batch_counts_finished_capabilities(tmp_path):
    rec = Recorder()
    specs = [CapabilitySpec("precondition verification"), CapabilitySpec("confirmation before write")]
    results = synthesize_batch(specs, "example", SynthConfig(synthesizer="template", out_dir=tmp_path,
                                                             seeds=4, concurrency=2), progress=rec)
    assert [r.capability for r in results] == [spec.name for spec in specs]  # (verdicts: test_synth)
    done = [s for s in rec.steps if s.done is not None]
    assert sorted(s.done for s in done) == [1, 2] and {s.total for s in done} == {2}
    assert {s.item for s in done} == {spec.name for spec in specs}
    working = [s for s in rec.steps if s.done is None]
    assert {s.item for s in working} == {spec.name for spec in specs}
    assert any(s.text.startswith("gate: ") for s in working)  # the gate's steps, inside synth's


def test_reporter_without_a_callable_does_nothing():
    reporter(None, "x")("anything")
    rec = Recorder()
    reporter(rec, "x")("hello")
    assert rec.steps == [Step("hello", "x")]


def test_identify_reports_its_phases_and_counts_its_llm_calls(tmp_path):
    from envforge.identify import STRUCTURAL_RULES, identify
    from tests.openai_server import OpenAIServer
    from tests.test_llm import good_reply, llm_config, make_client, trajectories
    rec = Recorder()
    with OpenAIServer() as server:
        server.responder = good_reply
        identify(trajectories(), llm_config(tmp_path), client=make_client(server, tmp_path),
                 progress=rec)
    phases = [s.text for s in rec.steps if s.done is None]
    assert phases == ["discovering capabilities with test-model",
                      "labelling 6 trajectories with test-model",
                      "statistics of 2 capabilities over 1 bootstrap run(s)"]
    counted = [(s.text, s.done, s.total) for s in rec.steps if s.done is not None]
    assert counted == [("discovery batches", 1, 1)] + [
        ("trajectories labelled", k, 6) for k in range(1, 7)]
    rec.steps.clear()
    identify(trajectories(), progress=rec)  # the structural rules: no LLM calls to count
    assert [s.text for s in rec.steps] == ["labelling 6 trajectories by the rules",
                                          f"statistics of {len(STRUCTURAL_RULES)} capabilities "
                                          "over 10 bootstrap run(s)"]


def _display(capsys, monkeypatch, steps, every_s=0.0):
    """What the command line's Display prints off a terminal for STEPS, one per clock tick
    (time.monotonic made a counter: one second a step)."""
    from envforge import cli
    clock = iter(range(1000))
    monkeypatch.setattr(cli.time, "monotonic", lambda: float(next(clock)))
    with cli.Display("testing") as display:
        display.EVERY_S = every_s
        for step in steps:
            display(step)
    return capsys.readouterr().err.splitlines()


def test_the_display_prints_counted_steps_with_an_eta(capsys, monkeypatch):
    steps = [Step("checking"), *(Step("labelled", None, k, 4) for k in range(1, 5))]
    # the display starts at 0 s; a step a second; the first item took 2 s (0 -> 2)
    assert _display(capsys, monkeypatch, steps) == [
        "[1/4] labelled  ETA 6s", "[2/4] labelled  ETA 3s", "[3/4] labelled  ETA 1s",
        "[4/4] labelled  ETA 0s"]


def test_a_resumed_count_has_its_eta_from_its_next_item_on(capsys, monkeypatch):
    steps = [Step("resumed at iteration 5", None, 5, 10), Step("reward 1", None, 6, 10, "stats"),
             Step("reward 2", None, 7, 10, "stats")]
    assert _display(capsys, monkeypatch, steps) == [
        "[5/10] resumed at iteration 5", "[6/10] reward 1  ETA 4s", "[7/10] reward 2  ETA 3s"]


def test_off_a_terminal_counts_are_thinned_but_records_and_the_last_stay(capsys, monkeypatch):
    steps = [Step("busy", "a"), *(Step("done", "a", k, 5) for k in range(1, 6)),
             Step("next phase", None, 1, 2), Step("iteration", None, 2, 2, record="stats")]
    lines = _display(capsys, monkeypatch, steps, every_s=3.0)
    assert [line.split("  ETA")[0] for line in lines] == [
        "[1/5] a: done", "[4/5] a: done", "[5/5] a: done", "[2/2] iteration"]


def test_a_quiet_display_prints_nothing(capsys):
    from envforge.cli import Display
    with Display("testing", quiet=True) as display:
        display(Step("anything", None, 1, 1, "stats"))
    assert capsys.readouterr().err == ""
