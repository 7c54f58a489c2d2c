"""LLM calls and wall time of ``identify --labeler llm`` over 680 trajectories (the paper's
tau2-bench set size: 165 successes, 515 failures) against the loopback OpenAI server of
tests/openai_server.py answering after a fixed latency.

Expected: one labelling call per trajectory (TRACE would make 680 x candidates), zero calls on a
cached re-run, and wall time close to calls x latency / concurrency.

Also the structural labeller's own speed: the real runs of ../shared/trajectories (when present)
repeated to 680 trajectories, labelled by the rules (8 capabilities each), milliseconds per
trajectory.

    .venv/bin/python benchmarks/bench_identify.py [--latency 0.5] [--concurrency 16 32]

Prints a Markdown table and writes benchmarks/results/bench_identify.json.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envforge.contract import tool_call  # noqa: E402
from envforge.identify import IdentifyConfig, identify  # noqa: E402
from envforge.llm import LLMClient  # noqa: E402
from envforge.trajectories import Trajectory  # noqa: E402
from tests.openai_server import OpenAIServer  # noqa: E402

CANDIDATES = [
    ("precondition verification", "reads the entity before changing it"),
    ("tool-call argument precision", "passes the exact ids the task requires"),
    ("structured data reasoning", "computes amounts correctly"),
    ("confirmation before write", "obtains an explicit yes before writing"),
    ("policy adherence / refusal", "refuses what the policy forbids"),
    ("error recovery", "recovers from tool errors"),
    ("greets the customer politely", "says hello"),
]


def trajectories(n: int, successes: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ok = i < successes
        rid = f"R{i:04d}"
        msgs = [{"role": "user", "content": f"Please cancel reservation {rid}, user u{i}."}]
        if rng.random() < 0.7:
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                tool_call("get_reservation_details", {"reservation_id": rid}, f"c{i}a")]},
                {"role": "tool", "tool_call_id": f"c{i}a", "content": json.dumps({"id": rid})}]
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            tool_call("cancel_reservation", {"reservation_id": rid}, f"c{i}b")]},
            {"role": "tool", "tool_call_id": f"c{i}b", "content": "{}"},
            {"role": "assistant", "content": "Cancelled."}]
        out.append(Trajectory(f"task{i}", msgs, 1.0 if ok else 0.0, ok, [], {}))
    return out


def responder(body: dict) -> str:
    if body["messages"][0]["content"].startswith("You analyse failed"):
        return json.dumps({"capabilities": [{"name": n, "description": d} for n, d in CANDIDATES]})
    text = body["messages"][1]["content"]
    rng = random.Random(text)  # deterministic per trajectory
    fail = "(task task" in text and int(text.split("(task task")[1].split(")")[0]) >= 165
    labels = {}
    for n, _ in CANDIDATES:
        p_lacking = 0.7 if fail and n == "precondition verification" else 0.2
        lab = "LACKING" if rng.random() < p_lacking else rng.choice(["PRESENT", "NA"])
        # the rubric's evidence: a turn and a quote from it (turn 0 is the user's request)
        labels[n] = {"label": lab, "turn": None if lab == "NA" else 0,
                     "quote": None if lab == "NA" else "Please cancel reservation"}
    return json.dumps({"labels": labels})


def serve(latency: float, urls, stop, logs) -> None:
    """The loopback server, in its own process so that its CPU time does not compete with the
    client's for one interpreter lock; sends back the kind of each request when stopped."""
    with OpenAIServer(latency=latency, responder=responder) as server:
        urls.put(server.url)
        while True:
            cmd = stop.get()
            logs.put([b["messages"][0]["content"].startswith("You analyse") for b in server.requests])
            server.reset_log()
            if cmd == "stop":
                return


def one(ts, latency: float, concurrency: int, runs: int, cache: Path) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    urls, stop, logs = ctx.Queue(), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=serve, args=(latency, urls, stop, logs), daemon=True)
    proc.start()
    url = urls.get(timeout=60)
    rows = []
    try:
        for attempt in ("cold", "cached re-run"):
            client = LLMClient("bench-model", base_url=url, api_key="sk-bench", cache_dir=cache)
            cfg = IdentifyConfig(labeller="llm", model="bench-model", runs=runs, concurrency=concurrency)
            start = time.monotonic()
            report = identify(ts, cfg, client=client).to_dict()
            wall = time.monotonic() - start
            stop.put("log" if attempt == "cold" else "stop")
            kinds = logs.get(timeout=60)
            disc, lab = sum(kinds), len(kinds) - sum(kinds)
            # discovery then labelling, each in rounds of `concurrency` calls
            ideal = (math.ceil(disc / concurrency) + math.ceil(lab / concurrency)) * latency
            rows.append({"run": attempt, "trajectories": len(ts), "latency_s": latency,
                         "concurrency": concurrency, "discovery_calls": disc,
                         "labelling_calls": lab, "cache_hits": report["llm"]["cache_hits"],
                         "expected_wall_s": round(ideal, 2), "wall_s": round(wall, 2),
                         "wall_over_expected": round(wall / ideal, 2) if ideal else None,
                         "kept": [c["name"] for c in report["capabilities"] if c["retained"]]})
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
    return rows


def structural_speed(n: int) -> dict | None:
    """The rules over the real runs in ../shared/trajectories, repeated to ``n`` trajectories."""
    from envforge.identify import label_structural
    from envforge.trajectories import load_trajectories
    shared = ROOT.parent / "shared" / "trajectories"
    if not shared.is_dir():
        return None
    real = load_trajectories(shared)
    ts = (real * (n // len(real) + 1))[:n]
    start = time.perf_counter()
    label_structural(ts)
    wall = time.perf_counter() - start
    return {"trajectories": n, "distinct": len(real), "wall_s": round(wall, 3),
            "ms_per_trajectory": round(1000 * wall / n, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=680)
    ap.add_argument("--successes", type=int, default=165)
    ap.add_argument("--latency", type=float, default=0.5,
                    help="seconds the server waits per reply (real endpoints take seconds; at 0.05 s the "
                         "client's own CPU, ~3-6 ms a call on 2 cores, dominates)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--runs", type=int, default=10, help="identify runs (discovery rounds)")
    args = ap.parse_args()
    structural = structural_speed(args.trajectories)
    if structural:
        print(f"structural labeller: {structural['trajectories']} trajectories in "
              f"{structural['wall_s']} s ({structural['ms_per_trajectory']} ms each)")
    ts = trajectories(args.trajectories, args.successes)
    rows = []
    for c in args.concurrency:
        with tempfile.TemporaryDirectory() as cache:
            rows += one(ts, args.latency, c, args.runs, Path(cache))
    cols = ["run", "trajectories", "latency_s", "concurrency", "discovery_calls", "labelling_calls",
            "cache_hits", "expected_wall_s", "wall_s", "wall_over_expected"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print(f"kept (same in every run): {rows[0]['kept']}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_identify.json").write_text(json.dumps({"llm": rows, "structural": structural},
                                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
