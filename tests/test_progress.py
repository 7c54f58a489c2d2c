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
