"""Ray benchmark: audits per minute with 1 and 2 nodes, and env steps per second through Ray
sandbox actors against the local warm pool.

    python benchmarks/bench_ray.py [--audits 12] [--seeds 20] [--repeat 3] [--steps 300] [--pool 4 16] [--pin]
                                   [--out benchmarks/results/ray.json]

A real cluster on this machine (tests/ray_cluster.py): a head node with one CPU, then a second
node with one CPU joining it. Audits: ``--audits`` copies of the example env, each a Ray task of
one CPU (``envforge.executor.RayExecutor.audit_all``), timed end to end ``--repeat`` times per
node count (the median counts), with each core's busy share during each run. Env steps: one lease
stepping alone (the per-step cost: a round trip to a sandbox), and all the leases of a pool of
each ``--pool`` size stepping from as many threads, then together in one ``call_all`` per
step (a rollout's lane: ``envforge.gym.step_all``), for ``sandbox.pool.SandboxPool`` and ``RayPool``
(whose calls to one actor travel together, one batch per actor: over the actor's direct
channel, and again as Ray actor calls, "Ray calls"). Then the same lanes of the example env (a
real env: a reset and a step of its plan per episode and round).

``--pin`` also audits on a cluster of its own whose nodes are pinned to one core each (``taskset``:
a node and every process it starts, sandboxes included, run on its core alone), as one-core
machines would; unpinned, "one CPU" is Ray's count, and one node's audit also uses the other core.
There both nodes stay up and 1-node runs (the audits kept on the head) alternate with 2-node
runs, so that the machine's drift over the minutes of the benchmark falls on both alike. Then
the same audits without Ray (one plain process pinned to a core, then two, a core each): what
this machine's two cores give at best, against which the pinned figure is read.

Goals (issue 17): audits/min with 2 nodes >= 1.8x 1 node; env steps/s through Ray actors >= 0.5x
the local pool. Both nodes share this machine's cores with everything else running on it: the
load average is recorded before and after, and the 2-node figure cannot beat the cores that were
free.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envforge.contract import Limits  # noqa: E402
from envforge.executor import RayExecutor, RayPool  # noqa: E402
from envforge.gate.config import GateSettings  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402

GOOD_DIR = REPO / "generated_envs" / "helpdesk_precondition_verification"

#: an env whose episodes never end: every step is the same small round trip
ECHO_ENV = '''"""Capability: echo (a benchmark env).

Why it transfers: it does not; it answers every message.
"""
CAPABILITY = "echo"


class Env:
    tools = []
    max_turns = 100

    def reset(self, seed):
        self.n = 0
        return {"messages": [{"role": "user", "content": "say something " + str(seed)}]}, {}

    def step(self, action):
        self.n += 1
        return {"messages": [{"role": "user", "content": "again " + str(self.n)}]}, 0.0, False, False, {}

    def solve(self, seed):
        return [{"role": "assistant", "content": "ok"}]
'''
ACTION = {"role": "assistant", "content": "ok"}


def _busy() -> list[float]:
    """Each core's busy seconds so far (user, system, nice, interrupts)."""
    import psutil
    return [t.user + t.system + t.nice + t.irq + t.softirq for t in psutil.cpu_times(percpu=True)]


def audits_per_minute(executor: RayExecutor, paths: list[str], seeds: int, repeat: int = 1) -> dict:
    """``repeat`` timed runs of the same audits; audits/min from the median run's time, with
    every run's seconds, the audits each node ran, and each core's busy share during the runs."""
    from collections import Counter
    runs, splits, busy = [], [], []
    for _ in range(repeat):
        b0, t0 = _busy(), time.perf_counter()
        reports = executor.audit_all(paths, settings=GateSettings(seeds=seeds, probe_seed=1),
                                     write_report=False)
        s = time.perf_counter() - t0
        busy.append([round((b - a) / s, 2) for a, b in zip(b0, _busy())])
        assert all(r.accepted for r in reports), [r.verdict for r in reports]
        runs.append(round(s, 2))
        splits.append(sorted(Counter(executor.where[p] for p in paths).values(), reverse=True))
    s = statistics.median(runs)
    return {"audits": len(paths), "seconds": s, "per_min": round(len(paths) / s * 60, 2),
            "runs": runs, "nodes_used": max(len(x) for x in splits), "split": splits[runs.index(min(
                runs, key=lambda r: abs(r - s)))], "splits": splits, "core_busy": busy}


def grown(cluster):
    """1, then 2: the cluster's node count, a second node joined before the 2."""
    for nodes in (1, 2):
        if nodes == 2:
            cluster.add_worker()
            time.sleep(2)
        yield nodes


def head_only(executor: RayExecutor) -> RayExecutor:
    """``executor``'s audits kept on the head node (the other nodes left idle): one node's
    figure with the second node up, so that 1-node and 2-node runs can alternate."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from envforge.executor import TASK_RETRIES, audit_task
    head = next(n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}))
    executor._task = ray.remote(audit_task).options(
        num_cpus=1, max_retries=TASK_RETRIES,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
    return executor


def pinned_audits(env: dict, paths: list[str], seeds: int, repeat: int) -> dict:
    """Audits/min with 1 node and with 2, on a cluster of its own whose two nodes are pinned to
    one core each (``Cluster(pin=True)``): each node has one core, as a one-core machine would.
    Both nodes are up throughout and the runs alternate (1 then 2 nodes, then 2 then 1, ...; a
    1-node run's audits kept on the head), so that this machine's drift from minute to minute
    falls on both counts alike. ``env``: the token this process already joined a cluster with
    (ray reads it once)."""
    import ray
    from tests.ray_cluster import Cluster
    cluster = Cluster(pin=True, env=env)
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        cluster.add_worker()
        time.sleep(2)
        one, two = head_only(RayExecutor()), RayExecutor()
        runs: dict = {"1 node(s)": [], "2 node(s)": []}
        for r in range(repeat):
            for nodes in ((1, 2) if r % 2 == 0 else (2, 1)):
                runs[f"{nodes} node(s)"].append(audits_per_minute(one if nodes == 1 else two, paths, seeds))
        return {k: merged(v) for k, v in runs.items()}
    finally:
        ray.shutdown()
        cluster.stop()


#: one process's share of the audits, pinned to one core (no Ray): ``bench_ray.py`` runs it
#: as ``python -c CHILD core seeds path...`` and reads the seconds it prints
CHILD = """import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
from envforge.gate import audit
from envforge.gate.config import GateSettings
t = time.perf_counter()
for path in sys.argv[3:]:
    assert audit(path, settings=GateSettings(seeds=int(sys.argv[2]), probe_seed=1), write_report=False).accepted
print(time.perf_counter() - t)
"""


def plain_audits(paths: list[str], seeds: int, repeat: int) -> dict:
    """The same audits without Ray, as the machine's own ceiling: all in one process pinned to
    the first core, then half in each of two processes pinned to a core each, alternating as
    ``pinned_audits`` does. Returns the seconds of each run of each, and the median ratio."""
    import subprocess
    cores = sorted(os.sched_getaffinity(0))[:2]

    def run(groups: list) -> float:
        t = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(core), str(seeds), *group],
                                  cwd=REPO, stdout=subprocess.PIPE, text=True) for core, group in groups]
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode:
                raise RuntimeError(f"a plain audit process failed ({proc.returncode}): {out}")
        return round(time.perf_counter() - t, 2)

    half = len(paths) // 2
    one, two = [], []
    for r in range(repeat):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            if n == 1:
                one.append(run([(cores[0], paths)]))
            else:
                two.append(run([(cores[0], paths[:half]), (cores[1], paths[half:])]))
    return {"1 process": one, "2 processes": two,
            "speedup": round(statistics.median(one) / statistics.median(two), 2)}


def merged(runs: list[dict]) -> dict:
    """One node count's single runs (``audits_per_minute`` with ``repeat=1``) as one entry."""
    seconds = [r["runs"][0] for r in runs]
    s = statistics.median(seconds)
    middle = runs[seconds.index(min(seconds, key=lambda x: abs(x - s)))]
    return {"audits": runs[0]["audits"], "seconds": s, "per_min": round(runs[0]["audits"] / s * 60, 2),
            "runs": seconds, "nodes_used": max(r["nodes_used"] for r in runs), "split": middle["split"],
            "splits": [r["split"] for r in runs], "core_busy": [r["core_busy"][0] for r in runs]}


def steps_per_second(pool, steps: int, threads: int) -> dict:
    """One lease stepping alone (latency), then ``threads`` leases at once (throughput)."""
    def run(n: int, out: list) -> None:
        with pool.acquire(timeout=120) as lease:
            lease.reset(0)
            t0 = time.perf_counter()
            for _ in range(n):
                lease.step(ACTION)
            out.append(time.perf_counter() - t0)
    alone: list = []
    run(steps, alone)
    spent: list = []
    t0 = time.perf_counter()
    workers = [threading.Thread(target=run, args=(steps, spent)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    leases = [pool.acquire(timeout=120) for _ in range(threads)]
    try:  # a rollout's lane: every lease's step in one call_all (no thread per lease)
        pool.call_all([(lease, "reset", 0) for lease in leases])
        t1 = time.perf_counter()
        for _ in range(steps):
            out = pool.call_all([(lease, "step", ACTION) for lease in leases])
        lane = time.perf_counter() - t1
        assert not any(isinstance(o, Exception) for o in out), out
    finally:
        for lease in leases:
            lease.release()
    return {"step_ms": round(alone[0] / steps * 1000, 3),
            "steps_per_s": round(threads * steps / wall, 1), "threads": threads,
            "lane_steps_per_s": round(threads * steps / lane, 1)}


def example_lane(pool, rounds: int, size: int) -> float:
    """Env calls per second of a lane of ``size`` episodes of the example env (a real helpdesk
    env): each round resets every episode, then steps each with its plan's first action, each
    a call_all."""
    leases = [pool.acquire(timeout=120) for _ in range(size)]
    try:
        plans = [lease.solve(i) for i, lease in enumerate(leases)]
        t0 = time.perf_counter()
        for _ in range(rounds):
            pool.call_all([(lease, "reset", i) for i, lease in enumerate(leases)])
            out = pool.call_all([(lease, "step", plans[i][0]) for i, lease in enumerate(leases)])
        s = time.perf_counter() - t0
        assert not any(isinstance(o, Exception) for o in out), out
    finally:
        for lease in leases:
            lease.release()
    return round(2 * rounds * size / s, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--audits", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="timed audit runs per node count (the "
                    "median counts: one run's noise here is as large as the goal's margin)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pool", type=int, nargs="+", default=[4, 16], help="pool sizes")
    ap.add_argument("--backend", default="process")
    ap.add_argument("--pin", action="store_true", help="also audit on a cluster whose nodes are "
                    "pinned to one core each (needs 2 cores)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ray.json"))
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        ap.error("--pin needs 2 cores: one for each node")

    from tests.ray_cluster import Cluster, cluster_env
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    paths = []
    for i in range(args.audits):
        shutil.copytree(GOOD_DIR, work / f"env{i}")
        paths.append(str(work / f"env{i}"))
    limits = Limits()
    example = (GOOD_DIR / "env.py").read_text()
    results: dict = {"audits": {}, "steps": {}}
    shared = cluster_env()  # one token for both clusters: ray reads it once
    cluster = Cluster(env=shared)
    try:
        for size in args.pool:
            local = SandboxPool(ECHO_ENV, size=size, backend=args.backend, limits=limits)
            local.wait_warm(120)
            results["steps"][f"local pool, {size}"] = steps_per_second(local, args.steps, size)
            local.close()
            local = SandboxPool(example, size=size, backend=args.backend, limits=limits)
            local.wait_warm(120)
            results["steps"][f"local pool, {size}"]["example_calls_per_s"] = example_lane(
                local, args.steps // 3, size)
            local.close()

        os.environ.update(cluster.env)  # the cluster's token, read when ray is imported
        import ray
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        executor = RayExecutor()
        for nodes in grown(cluster):
            results["audits"][f"{nodes} node(s)"] = audits_per_minute(executor, paths, args.seeds,
                                                                       args.repeat)
            for size, direct in ((size, direct) for size in args.pool for direct in (True, False)):
                key = f"Ray actors{'' if direct else ' (Ray calls)'}, {nodes} node(s), {size}"
                pool = RayPool(ECHO_ENV, size=size, backend=args.backend, limits=limits, direct=direct)
                results["steps"][key] = {**steps_per_second(pool, args.steps, size),
                                         "nodes_used": len(pool.nodes), "direct_channels": pool.wired}
                pool.close()
                pool = RayPool(example, size=size, backend=args.backend, limits=limits, direct=direct)
                results["steps"][key]["example_calls_per_s"] = example_lane(pool, args.steps // 3, size)
                pool.close()
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
        cluster.stop()
        if args.pin:  # a cluster of its own, after the other one has stopped
            results["audits_pinned"] = pinned_audits(shared, paths, args.seeds, args.repeat)
            results["audits_plain"] = plain_audits(paths, args.seeds, args.repeat)
    finally:
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()

    a1, a2 = results["audits"]["1 node(s)"], results["audits"]["2 node(s)"]
    results["audit_speedup_2_vs_1"] = round(a2["per_min"] / a1["per_min"], 2)
    if args.pin:
        p1, p2 = results["audits_pinned"]["1 node(s)"], results["audits_pinned"]["2 node(s)"]
        results["audit_speedup_2_vs_1_pinned"] = round(p2["per_min"] / p1["per_min"], 2)
    def versus(key: str) -> dict:
        return {k: round(v[key] / results["steps"][f"local pool, {k.rpartition(', ')[2]}"][key], 2)
                for k, v in results["steps"].items()}
    results["ray_vs_local_steps"] = versus("steps_per_s")
    results["ray_vs_local_lane_steps"] = versus("lane_steps_per_s")
    results["ray_vs_local_example_calls"] = versus("example_calls_per_s")
    results["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_before": [round(x, 2) for x in load0],
                          "load_after": [round(x, 2) for x in load1],
                          "note": "one machine: both Ray nodes share its cores with other work"}
    results["settings"] = vars(args)

    for key, how in (("", ""), ("_pinned", ", nodes pinned to one core each")):
        if "audits" + key not in results:
            continue
        print(f"| audits ({args.audits} x example env, {args.seeds} seeds{how}) | seconds (median) "
              "| audits/min | every run's seconds | audits per node | cores busy |")
        print("|---|---|---|---|---|---|")
        for k, v in results["audits" + key].items():
            print(f"| {k} | {v['seconds']} | {v['per_min']} | {', '.join(map(str, v['runs']))} | "
                  f"{'/'.join(map(str, v['split']))} | "
                  f"{', '.join('/'.join(f'{c:.0%}' for c in b) for b in v['core_busy'])} |")
        print(f"\n2 nodes vs 1{how}: {results['audit_speedup_2_vs_1' + key]}x (goal >= 1.8x)\n")
    if "audits_plain" in results:
        plain = results["audits_plain"]
        print(f"the same audits without Ray, one process pinned to a core, then two (a core each), "
              f"alternating: {', '.join(map(str, plain['1 process']))} s against "
              f"{', '.join(map(str, plain['2 processes']))} s: {plain['speedup']}x (this machine's "
              "ceiling for the pinned figure)\n")
    print(f"| env steps ({args.steps} per lease), pool size | ms per step, one lease | steps/s, "
          "a thread per lease | vs local pool | steps/s, a lane in one call_all | vs local pool |")
    print("|---|---|---|---|---|---|")
    for k, v in results["steps"].items():
        print(f"| {k} | {v['step_ms']} | {v['steps_per_s']:,} | {results['ray_vs_local_steps'][k]}x "
              f"| {v['lane_steps_per_s']:,} | {results['ray_vs_local_lane_steps'][k]}x |")
    print(f"\n| example env, a lane's resets then steps ({args.steps // 3} rounds), pool size | "
          "calls/s | vs local pool |")
    print("|---|---|---|")
    for k, v in results["steps"].items():
        print(f"| {k} | {v['example_calls_per_s']:,} | {results['ray_vs_local_example_calls'][k]}x |")
    print(f"\nload average {load0[0]:.2f} before, {load1[0]:.2f} after ({os.cpu_count()} cores, shared)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
