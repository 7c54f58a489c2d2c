"""`envforge demo --quick` end to end (real CLI, real sandboxes, real torch), and its HTML page
opened in a real headless Chromium."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "envforge", "demo", "--quick", "--seed", "0",
                           "--threads", "1", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def test_quick_demo_makes_the_agent_better(demo_run):
    out, proc = demo_run
    r = json.loads((out / "results.json").read_text())
    for key in ("seed", "quick", "planted", "identified", "methods", "routing_accuracy",
                "rollouts_per_method", "stages", "wall_s"):
        assert key in r, key
    assert r["seed"] == 0 and r["quick"] is True
    assert sorted(r["identified"]) == sorted(r["planted"])
    m = r["methods"]
    for name in ("base", "routed", "merged", "grpo_target", "oracle"):
        assert m[name]["n"] >= 200
        assert m[name]["ci"][0] <= m[name]["mean"] <= m[name]["ci"][1]
    assert m["routed"]["mean"] - m["base"]["mean"] >= 0.15, m
    assert set(r["stages"]) >= {"target", "base", "identify", "synth", "calibrate", "train", "evaluate"}
    # progress with an ETA on stderr, the table on stdout
    assert "ETA" in proc.stderr
    assert "routed (TRACE)" in proc.stdout and "routing accuracy" in proc.stdout


def test_quick_demo_is_deterministic_in_its_identify_input(demo_run):
    """The trajectories identify read are on disk in envforge's JSONL, with expected actions."""
    out, _ = demo_run
    from envforge.trajectories import load_trajectories
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert trajs and all(t.expected_actions for t in trajs)
    assert 0.2 < sum(t.success for t in trajs) / len(trajs) < 0.7


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium (apt-get install chromium)")
def test_report_page_in_headless_chromium(demo_run):
    sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
    out, _ = demo_run
    r = json.loads((out / "results.json").read_text())
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto((out / "report.html").resolve().as_uri())
            for ident in ("fig-methods", "fig-curves"):
                loaded = page.evaluate(f"() => {{ const i = document.getElementById('{ident}');"
                                       " return i.complete && i.naturalWidth > 0 ? i.naturalWidth : 0; }")
                assert loaded > 100, ident
            for name, m in r["methods"].items():
                cells = page.locator(f'#methods tr[data-method="{name}"] td').all_inner_texts()
                assert cells[1] == f"{m['mean']:.3f}", (name, cells)
            assert page.inner_text("#identified") == ", ".join(r["identified"])
            assert page.inner_text("#routing") == f"{r['routing_accuracy']:.3f}"
        finally:
            browser.close()
