"""`envforge demo --quick` end to end (real CLI, real sandboxes, real torch), and its HTML page
opened in a real headless Chromium."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def demo_run(quick_demo):
    """The run, started in the background when this module was collected (tests/conftest.py):
    these tests run last, and the rest of the suite runs beside it."""
    out, proc = quick_demo
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def test_quick_demo_writes_every_result(demo_run):
    out, proc = demo_run
    r = json.loads((out / "results.json").read_text())
    for key in ("seed", "quick", "planted", "identified", "methods", "routing_accuracy",
                "rollouts_per_method", "stages", "wall_s"):
        assert key in r, key
    assert r["seed"] == 0 and r["quick"] is True
    assert sorted(r["planted"]) == ["confirmation before write", "precondition verification"]
    for name in ("base", "routed", "merged", "grpo_target", "oracle"):
        m = r["methods"][name]
        assert m["n"] >= 200
        assert m["ci"][0] <= m["mean"] <= m["ci"][1]
    # GRPO on the target spends the adapters' rollouts, give or take its last iteration (4 x 4,
    # re-collected at most 3 times)
    budget = r["rollouts_per_method"]
    assert budget["routed"] > 0 and budget["routed"] <= budget["grpo_target"] < budget["routed"] + 64
    assert set(r["stages"]) >= {"target", "base", "identify", "synth", "calibrate", "train", "evaluate"}
    # no task GRPO on the target trained on is one it is evaluated on (its env seeds are drawn)
    from envforge.demo.run import trained_seeds
    evaluated = r["evaluation_seeds"]["seeds"]
    assert len(set(evaluated)) == len(evaluated) == r["methods"]["base"]["n"]
    assert set(evaluated).isdisjoint(trained_seeds(out / "grpo_target"))
    assert (out / "figures" / "methods.png").stat().st_size > 1000
    # progress with an ETA on stderr, the table on stdout
    assert "ETA" in proc.stderr
    # a user reads stderr: no library warnings in it (torch, peft, transformers)
    assert "Warning:" not in proc.stderr, [l for l in proc.stderr.splitlines() if "Warning:" in l]
    assert "routed (TRACE)" in proc.stdout and "routing accuracy" in proc.stdout


def test_quick_demo_makes_the_agent_better(demo_run):
    """The issue's CI ordering on the fixed seed and threads (deterministic on a given machine, the
    numbers themselves depend on its CPU: seed 0 gave base 0.435, routed 0.910 on one, 0.460 and
    0.830 on another; its base agent is the full run's, docs/demo-log.md)."""
    out, _ = demo_run
    r = json.loads((out / "results.json").read_text())
    assert sorted(r["identified"]) == sorted(r["planted"])
    m = r["methods"]
    assert m["routed"]["mean"] - m["base"]["mean"] >= 0.15, m


def test_identify_reads_the_base_agents_runs(demo_run):
    """The trajectories identify read are on disk in envforge's JSONL, with expected actions, and
    capabilities.json is identify's verdict on them."""
    out, _ = demo_run
    from envforge.trajectories import load_trajectories
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 120 and all(t.expected_actions for t in trajs)
    caps = json.loads((out / "capabilities.json").read_text())
    r = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in caps["capabilities"] if c["retained"]] == r["identified"]
    assert caps["trajectories"]["total"] == 120


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
            assert page.inner_text("#identified") == (", ".join(r["identified"]) or "none")
            ra = r["routing_accuracy"]
            assert page.inner_text("#routing") == ("-" if ra is None else f"{ra:.3f}")
            assert page.inner_text("#wall") == f"{r['wall_s']:.0f}"
        finally:
            browser.close()
