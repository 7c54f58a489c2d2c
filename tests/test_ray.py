"""--executor ray on a real Ray cluster of two nodes on this machine (tests/ray_cluster.py: a head
and a second node joining it, one CPU each, started and stopped here): audits, synthesis and
rollouts spread over both nodes and give the answers a local run gives; a node killed mid-run
(its raylet, SIGKILL) loses nothing. Skips with the reason when ray is not installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from envforge.executor import ExecutorSettings, LocalExecutor, make_executor
from envforge.errors import UsageError
from tests.conftest import REPO
from tests.envfactory import GOOD_DIR

pytestmark = pytest.mark.ray
SEEDS = 8  # the gate's seeds per property: few, for speed


def test_local_is_the_default_and_needs_no_ray():
    assert isinstance(make_executor(), LocalExecutor)
    with pytest.raises(UsageError, match="--ray-address needs --executor ray"):
        make_executor(ExecutorSettings(ray_address="127.0.0.1:6379"))
    r = subprocess.run([sys.executable, "-m", "envforge", "audit", str(GOOD_DIR), "--static-only",
                        "--no-report", "--executor", "slurm"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 2 and "--executor" in r.stderr and "slurm" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install -c constraints.txt "
                              "-e '.[ray]'")
    from tests.ray_cluster import Cluster
    c = Cluster()
    saved = {k: os.environ.get(k) for k in c.env}
    try:
        c.add_worker()
        os.environ.update(c.env)  # the token: this process joins as a client
        _reload_ray_config()
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_ray_config()


def _reload_ray_config():
    """Ray reads RAY_AUTH_MODE and the token once per process (ray imported by an earlier test
    read them): make it read them again, as ray.init does after it enables token auth."""
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ray_executor():
    return make_executor(ExecutorSettings(executor="ray"))  # joins the fixture's cluster


def envs(tmp_path, n: int) -> list[str]:
    out = []
    for i in range(n):
        shutil.copytree(GOOD_DIR, tmp_path / f"env{i}")
        out.append(str(tmp_path / f"env{i}"))
    return out


#: what two audits of one env measure differently even on one machine: times, memory, the
#: number of env calls (hypothesis's state machines vary it), and how many resets the many-resets
#: probe got through in its resets_s (CI's busy machine: 7,849 on one node, 8,231 on the other)
MEASURED = ("resets", "reset_ms", "reset_growth_mb", "reset_growth_kib", "calls", "call_ms")


def same(report: dict) -> dict:
    """A report as JSON without what differs between two runs of one audit anywhere: its path,
    its stages' times and ``MEASURED``; verdict, findings and the scores stay."""
    d = {k: v for k, v in report.items() if k not in ("stages", "path")}
    d["stats"] = {k: v for k, v in d["stats"].items() if k not in MEASURED}
    assert "mean_score" in d["stats"] and "solved" in d["stats"]
    assert isinstance(report["stats"]["resets"], int) and report["stats"]["resets"] > 0
    return d


def gate():
    from envforge.gate.config import GateSettings
    return GateSettings(seeds=SEEDS, probe_seed=1234)


# ----------------------------------------------------------------------------- audits


def test_audits_run_on_both_nodes_and_equal_local_ones(cluster, tmp_path):
    paths = envs(tmp_path, 4)
    local = LocalExecutor().audit_all(paths[:1], settings=gate(), write_report=False)
    executor = ray_executor()
    steps = []
    reports = executor.audit_all(paths, settings=gate(), progress=steps.append)
    assert [same(r.to_dict()) for r in reports] == [same(local[0].to_dict())] * 4
    assert all(r.accepted for r in reports)
    assert set(executor.where) == set(paths)
    assert set(executor.where.values()) == set(cluster.alive())  # work ran on both nodes
    assert sorted(s.done for s in steps) == [1, 2, 3, 4]
    for p, r in zip(paths, reports):  # report.json comes back and is written by the caller
        assert json.loads((tmp_path / p / "report.json").read_text()) == r.to_dict()


def test_audit_command_on_ray(cluster, tmp_path):
    [path] = envs(tmp_path, 1)
    r = subprocess.run([sys.executable, "-m", "envforge", "audit", path, "--seeds", str(SEEDS),
                        "--executor", "ray", "--ray-address", cluster.address, "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    [result] = json.loads(r.stdout)["results"]
    assert result["verdict"] == "accept" and result["stats"]["solved"] == f"{SEEDS}/{SEEDS}"
    assert json.loads((tmp_path / "env0" / "report.json").read_text())["verdict"] == "accept"


def test_a_head_that_cannot_be_reached_is_a_clear_error(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed")
    from tests.ray_cluster import free_port
    r = subprocess.run([sys.executable, "-m", "envforge", "audit", str(GOOD_DIR), "--no-report",
                        "--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: cannot join the Ray cluster at 127.0.0.1:") and \
        "Traceback" not in r.stderr, r.stderr


def test_synth_from_on_ray_equals_local(cluster, tmp_path):
    from envforge.synth import CapabilitySpec, SynthConfig, synthesize_batch
    specs = [CapabilitySpec("precondition verification"), CapabilitySpec("confirmation before write")]
    results = {}
    for name, executor in (("local", LocalExecutor()), ("ray", ray_executor())):
        config = SynthConfig(out_dir=str(tmp_path / name), seeds=SEEDS, synthesizer="template")
        results[name] = synthesize_batch(specs, "example", config, executor=executor)
    assert [r.verdict for r in results["ray"]] == ["accept", "accept"]
    for a, b in zip(results["local"], results["ray"]):
        assert (a.slug, a.verdict) == (b.slug, b.verdict)
        ra, rb = (json.loads((tmp_path / n / a.slug / "report.json").read_text())
                  for n in ("local", "ray"))
        assert same(ra) == same(rb)


# ----------------------------------------------------------------------------- rollouts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch", reason="the train extra is not installed")
    from tests.trainers_fixtures import brevity_env, tiny_model_dir
    root = tmp_path_factory.mktemp("tiny")
    return tiny_model_dir(root, "hermes"), brevity_env(root / "brevity")


def test_rollouts_on_ray_actors_equal_local_ones(cluster, tiny):
    from trainers.calibrate import CalibrationConfig, calibrate
    from trainers.evaluate import EvalConfig, evaluate
    from trainers.policy import load_policy
    model, env = tiny
    policy = load_policy(model)
    tasks = [{"env": str(env), "seed": s} for s in range(6)]
    eval_config = EvalConfig(max_new_tokens=6, temperature=1.0, pool_size=4, backend="process")
    cal_config = CalibrationConfig(groups=2, group_size=3, max_new_tokens=6, pool_size=4,
                                   backend="process", env_seed_key=7)  # the same env seeds on both
    executor = ray_executor()
    pools = executor.pools
    here = evaluate(policy, tasks, eval_config).to_dict()
    there = evaluate(policy, tasks, eval_config, executor=executor).to_dict()
    assert there == here and len(here["episodes"]) == 6
    assert len({e["score"] for e in here["episodes"]}) > 1  # sampled: the scores differ by seed
    assert calibrate(policy, env, cal_config, executor=executor).to_dict() == \
        calibrate(policy, env, cal_config).to_dict()
    assert len(pools) == 2 and all(set(p.nodes) == set(cluster.alive()) for p in pools)  # both nodes
    # one actor per node: the steps of a lane's episodes on one node went as one actor call
    assert all(len(p.actors) == 2 and p.actor_calls < p.sandbox_calls for p in pools), pools


@pytest.mark.parametrize("direct", [True, False], ids=["direct channel", "ray calls"])
def test_call_all_sends_one_actor_call_per_node_and_answers_as_the_local_pool(cluster, direct):
    """RayPool.call_all (what a rollout's lane uses): the steps of each actor's sandboxes travel
    as one actor call (over its direct channel, or as a Ray call), and each call gets what the
    local pool's call_all gives it, errors too."""
    from envforge.contract import Limits
    from envforge.errors import EnvCallError
    from envforge.executor import RayPool
    from sandbox.pool import SandboxPool
    from tests.test_pool import BY_ACTION, say
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    ray_executor()  # joins the cluster
    limits = Limits(call_timeout_s=5.0, memory_mb=512)
    actions = [say("a"), say("boom"), say("c"), say("d")]
    answers = []
    for pool in (SandboxPool(BY_ACTION, size=4, backend="process", limits=limits),
                 RayPool(BY_ACTION, size=4, backend="process", limits=limits, direct=direct)):
        try:
            leases = [pool.acquire(timeout=60) for _ in range(4)]
            pool.call_all([(lease, "reset", i) for i, lease in enumerate(leases)])
            calls = [getattr(pool, name, 0) for name in ("actor_calls", "sandbox_calls", "wire_calls")]
            out = pool.call_all(list(zip(leases, ["step"] * 4, actions)))
            if isinstance(pool, RayPool):
                assert len(pool.actors) == 2 and len(pool.nodes) == 2
                assert (pool.actor_calls - calls[0], pool.sandbox_calls - calls[1]) == (2, 4)
                assert pool.wire_calls - calls[2] == (2 if direct else 0)
                assert pool.wired == (2 if direct else 0) and not pool.unwired
            assert isinstance(out[1], EnvCallError) and "boom" in str(out[1])
            answers.append([o if o is not out[1] else "error" for o in out])
        finally:
            pool.close()
    assert answers[0] == answers[1] and answers[0][0][0]["messages"][0]["content"] == "echo a"


def test_a_direct_channel_answers_only_the_holder_of_its_token(cluster):
    """An actor's direct channel listens on its node's address until its caller is connected: a
    peer that does not send the token Ray handed to the pool first is hung up on, a batch it
    sends anyway unanswered, and once the caller is in, no one else gets an answer either (the
    pool's own calls go on as before)."""
    import socket
    import struct
    from envforge.contract import Limits
    from envforge.executor import RayPool
    from tests.test_pool import BY_ACTION, say
    ray_executor()
    pool = RayPool(BY_ACTION, size=1, backend="process", limits=Limits(call_timeout_s=5.0))
    try:
        [lease] = [pool.acquire(timeout=60)]
        lease.reset(3)
        batch = json.dumps([[0, [["step", say("intruder")]]]]).encode()
        with pytest.raises(ConnectionRefusedError):  # the caller is connected: the door is shut
            socket.create_connection(pool.actors[0].address, timeout=10).close()
        import ray
        host, port, _ = ray.get(pool.actors[0].actor.serve.remote())  # a listener of its own
        for token in (b"0" * 64, b"", b"x" * 200):
            with socket.create_connection((host, port), timeout=10) as peer:
                peer.settimeout(15)
                try:
                    peer.sendall(token + struct.pack(">I", len(batch)) + batch)
                    answer = peer.recv(1 << 16)
                except ConnectionResetError:
                    answer = b""
                assert answer == b"", answer[:200]
        calls = pool.wire_calls
        assert lease.step(say("owner"))[0]["messages"][0]["content"] == "echo owner"
        assert pool.wire_calls == calls + 1 and pool.wires == 1
    finally:
        pool.close()


def test_a_pool_whose_direct_channel_cannot_be_opened_steps_through_ray(cluster, monkeypatch, capfd):
    """A network that blocks the actors' ports between the nodes costs speed, not answers."""
    import socket
    from envforge.contract import Limits
    from envforge.executor import RayPool
    from tests.test_pool import BY_ACTION, say
    ray_executor()

    def blocked(*args, **kwargs):
        raise ConnectionRefusedError("connection refused")
    monkeypatch.setattr(socket, "create_connection", blocked)
    pool = RayPool(BY_ACTION, size=2, backend="process", limits=Limits(call_timeout_s=5.0))
    try:
        leases = [pool.acquire(timeout=60) for _ in range(2)]
        pool.call_all([(lease, "reset", i) for i, lease in enumerate(leases)])
        out = pool.call_all([(lease, "step", say(str(i))) for i, lease in enumerate(leases)])
        assert [o[0]["messages"][0]["content"] for o in out] == ["echo 0", "echo 1"]
        assert pool.wired == pool.wire_calls == 0 and pool.unwired and pool.actor_calls >= 2
    finally:
        pool.close()
    assert "no direct channel to a sandbox actor (connection refused)" in capfd.readouterr().err


def test_what_a_nodes_backend_warns_of_is_said_on_the_callers_stderr(cluster, monkeypatch, capfd):
    """An actor's stderr goes to its worker's log (log_to_driver=False): what its sandboxes'
    backend warns of (here the unisolated one's loud notice) comes back with "ready" and is said
    by the caller, once per node."""
    from envforge.contract import Limits
    from envforge.executor import RayPool
    from sandbox import base
    from tests.test_pool import BY_ACTION
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    ray_executor()
    monkeypatch.setattr(base, "_WARNED", set())
    pool = RayPool(BY_ACTION, size=2, backend="unsafe-inprocess", limits=Limits(call_timeout_s=5.0))
    try:
        assert sorted(pool.warnings) == sorted(pool.nodes) and len(pool.nodes) == 2
        assert all("NO isolation" in w and "hosts the sandboxes" in w for w in pool.warnings.values())
    finally:
        pool.close()
    err = capfd.readouterr().err
    for node in pool.nodes:
        assert err.count(f"envforge: warning: on Ray node {node[:12]}: backend 'unsafe-inprocess'") == 1
    pool = RayPool(BY_ACTION, size=2, backend="process", limits=Limits(call_timeout_s=5.0))
    try:  # the process sandbox: what it warns of on this machine (bwrap or seccomp: nothing)
        here = base.get_backend("process").warning()
        assert pool.warnings == ({} if here is None else {node: here for node in pool.nodes})
    finally:
        pool.close()


def test_call_all_of_some_leases_does_not_wait_for_the_others(cluster, monkeypatch):
    """A batch waits up to GATHER_S for the calls of its actor's other leased sandboxes (threads
    stepping one lease each); a call_all holds all its caller's calls, so it goes at once."""
    import envforge.executor
    from envforge.contract import Limits
    from envforge.executor import RayPool
    from tests.test_pool import BY_ACTION, say
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    ray_executor()
    monkeypatch.setattr(envforge.executor, "GATHER_S", 30.0)
    pool = RayPool(BY_ACTION, size=4, backend="process", limits=Limits(call_timeout_s=5.0))
    try:
        leases = [pool.acquire(timeout=60) for _ in range(4)]  # two leased on each actor
        t0 = time.monotonic()
        out = pool.call_all([(leases[0], "reset", 0), (leases[1], "reset", 1)])
        assert time.monotonic() - t0 < 10, "a call_all waited for calls that were not coming"
        assert all(isinstance(o, list) for o in out)
        with pytest.raises(ValueError, match="one call per lease"):
            pool.call_all([(leases[0], "step", say("a")), (leases[0], "step", say("b"))])
    finally:
        pool.close()


def test_a_short_training_run_on_ray_replays_the_local_one(cluster, tiny, tmp_path):
    from trainers.grpo import GRPOConfig, GRPOTrainer
    from trainers.policy import load_policy
    model, env = tiny
    config = GRPOConfig(iterations=2, num_groups=2, group_size=2, max_new_tokens=6, lora_rank=4,
                        backend="process", dynamic_sampling=False, pool_size=4, env_seed_key=7)
    keys = ("reward_mean", "reward_std", "constant_fraction", "episodes", "generated_tokens", "loss")
    runs = {}
    executor = ray_executor()
    pools = executor.pools
    for name, where in (("local", None), ("ray", executor)):
        trainer = GRPOTrainer(load_policy(model), env, config, out=tmp_path / name, executor=where)
        runs[name] = [{k: h[k] for k in keys} for h in trainer.train().history]
    assert runs["ray"] == runs["local"] and len(runs["local"]) == 2
    assert [set(p.nodes) for p in pools] == [set(cluster.alive())]  # its sandboxes on both nodes


def test_calibrate_command_on_ray_equals_local(cluster, tiny):
    model, env = tiny
    args = [sys.executable, "-m", "envforge", "calibrate", str(env), "--model", str(model),
            "--groups", "2", "--group-size", "2", "--max-new-tokens", "6", "--backend", "process",
            "--env-seed-key", "7", "--json"]
    run = {"capture_output": True, "text": True, "cwd": REPO, "timeout": 300,
           "env": {**os.environ, "PYTHONPATH": str(REPO)}}
    here = subprocess.run(args, **run)
    there = subprocess.run(args + ["--executor", "ray", "--ray-address", cluster.address], **run)
    assert here.returncode == there.returncode == 1, there.stderr  # a random model: not calibrated
    assert json.loads(there.stdout) == json.loads(here.stdout)


# ----------------------------------------------------------------------------- faults


def kill_worker_when(cluster, ready, timeout: float = 120) -> threading.Thread:
    """Kill the worker node's raylet as soon as ``ready()`` (polled), from a thread."""
    def run():
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.workers[-1].kill_raylet()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_node_killed_mid_audit_loses_nothing(cluster, tmp_path):
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    paths = envs(tmp_path, 4)
    local = LocalExecutor().audit_all(paths[:1], settings=gate(), write_report=False)
    worker_busy = lambda: any(pid for pid in cluster.workers[-1].pids()  # noqa: E731
                              if _is_task(pid, "audit_task"))
    killer = kill_worker_when(cluster, worker_busy)
    executor = ray_executor()
    reports = executor.audit_all(paths, settings=gate())
    killer.join(5)
    assert len(cluster.alive_after(1)) == 1  # the worker node is gone ...
    # ... before it finished an audit: every audit, the one it was running too, ran on the head
    assert set(executor.where.values()) == set(cluster.alive())
    assert [same(r.to_dict()) for r in reports] == [same(local[0].to_dict())] * 4


class KillingPolicy:
    """The policy, but its ``at``-th generation first kills the worker node and waits until the
    cluster has noticed: the node dies mid-run, between two env steps, every time."""

    def __init__(self, policy, cluster, at: int):
        self._policy, self._cluster, self._at, self._calls = policy, cluster, at, 0

    def generate(self, *args, **kwargs):
        self._calls += 1
        if self._calls == self._at:
            self._cluster.workers[-1].kill_raylet()
            assert len(self._cluster.alive_after(1)) == 1
        return self._policy.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._policy, name)


def test_a_node_killed_mid_rollout_loses_nothing(cluster, tiny):
    from trainers.evaluate import EvalConfig, evaluate
    from trainers.policy import load_policy
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    model, env = tiny
    policy = load_policy(model)
    tasks = [{"env": str(env), "seed": s} for s in range(8)]
    config = EvalConfig(max_new_tokens=6, temperature=1.0, pool_size=4, backend="process")
    here = evaluate(policy, tasks, config).to_dict()
    executor = ray_executor()
    pools = executor.pools
    # the second generation: the first lane has stepped, the second has not
    there = evaluate(KillingPolicy(policy, cluster, at=2), tasks, config, executor=executor).to_dict()
    assert len(pools[0].nodes) == 2 and pools[0].replaced >= 1  # the dead node's sandboxes ...
    assert there == here  # ... were replaced and their episodes replayed: the same scores
    # the steps went over the direct channels, the replacement's too (its old one broke)
    assert pools[0].wire_calls > 0 and pools[0].wires == pools[0].started and not pools[0].unwired


def test_an_episode_whose_replay_answers_otherwise_is_lost_not_continued(cluster):
    """A node dies; its sandboxes' episodes are replayed on a new actor. An env that is not
    deterministic after all (the gate would refuse it; a pool does not run the gate) answers the
    replayed reset otherwise: that episode must fail with SandboxCrashed until its next reset,
    not go on from a state it never had. The other node's episode steps on."""
    from envforge.contract import Limits
    from envforge.errors import SandboxCrashed
    from envforge.executor import RayPool
    from tests.test_pool import say
    from tests.test_sandbox import env_with
    drifting = env_with(step="""
return {"messages": [{"role": "user", "content": "echo"}]}, 0.0, False, False, {}
""", reset="""
import random
return {"messages": [{"role": "user", "content": str(random.SystemRandom().random())}]}, {}
""")
    if len(cluster.alive()) < 2:
        cluster.add_worker()
    ray_executor()
    for _ in range(5):  # a node that joined just now may not take its actor yet: it goes elsewhere
        pool = RayPool(drifting, size=2, backend="process", limits=Limits(call_timeout_s=5.0))
        leases = [pool.acquire(timeout=60) for _ in range(2)]
        head = [lease for lease in leases if lease.sandbox.node == _head_node(cluster)]
        if len(head) == 1:
            break
        pool.close()
        time.sleep(1)
    try:
        assert len(head) == 1, "one sandbox on each node"
        lost = next(lease for lease in leases if lease is not head[0])
        pool.call_all([(lease, "reset", 1) for lease in leases])
        assert all(isinstance(o, list) for o in pool.call_all([(lease, "step", say("a"))
                                                                for lease in leases]))
        cluster.workers[-1].kill_raylet()
        assert len(cluster.alive_after(1)) == 1
        out = dict(zip(map(id, leases), pool.call_all([(lease, "step", say("b")) for lease in leases])))
        assert out[id(head[0])][0]["messages"][0]["content"] == "echo"
        assert isinstance(out[id(lost)], SandboxCrashed) and "replayed" in str(out[id(lost)])
        with pytest.raises(SandboxCrashed, match="replayed"):
            lost.step(say("c"))
        lost.reset(2)  # a new episode on the new actor
        assert lost.step(say("d"))[0]["messages"][0]["content"] == "echo"
        assert pool.replaced >= 1
    finally:
        pool.close()


def _head_node(cluster) -> str:
    import ray
    return next(n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and n["NodeManagerPort"] and n.get("Resources", {}).get(
                    "node:__internal_head__"))


def _is_task(pid: int, name: str) -> bool:
    import psutil
    try:
        return name in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def test_a_dead_head_stops_the_run_with_a_clear_error_and_keeps_what_was_done(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed")
    import signal
    from tests.ray_cluster import Cluster
    c = Cluster()  # a head of its own: this test kills it
    try:
        paths = envs(tmp_path, 3)
        proc = subprocess.Popen([sys.executable, "-m", "envforge", "audit", *paths, "--seeds",
                                 str(SEEDS), "--executor", "ray", "--ray-address", c.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                env={**os.environ, **c.env, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 240
        while not (tmp_path / "env0" / "report.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(c.head.proc.pid, signal.SIGKILL)  # the whole head node, GCS included
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=120)
        assert time.monotonic() - t0 < 30  # Ray alone would wait a minute
    finally:
        c.stop()
    assert proc.returncode == 1, err
    assert f"error: the Ray cluster's head at {c.address} stopped answering" in err
    assert "run the command again to resume" in err
    assert json.loads((tmp_path / "env0" / "report.json").read_text())["verdict"] == "accept"


def test_a_pinned_cluster_keeps_each_node_on_a_core_of_its_own():
    """bench_ray --pin: "one CPU each" as one core each. Every process of a pinned node (ray
    start, its raylet and workers) may run on its own core alone."""
    pytest.importorskip("ray", reason="ray is not installed")
    pytest.importorskip("psutil", reason="psutil is not installed")
    import psutil
    from tests.ray_cluster import Cluster
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 cores to pin two nodes apart")
    c = Cluster(pin=True)
    try:
        c.add_worker()
        for node, cpu in ((c.head, cpus[0]), (c.workers[0], cpus[1])):
            assert node.pids("raylet"), node.tail()
            seen = set()
            for pid in node.pids():
                try:
                    seen.add(tuple(psutil.Process(pid).cpu_affinity()))
                except psutil.NoSuchProcess:  # an idle worker the raylet let go meanwhile
                    pass
            assert seen == {(cpu,)}, seen
        if len(cpus) == 2:  # a third node has no core of its own: said before it starts
            with pytest.raises(RuntimeError, match="cannot pin node 3 to a core of its own"):
                c.add_worker()
            assert len(c.workers) == 1
    finally:
        c.stop()
