"""A real Ray cluster of two nodes on this machine, for the tests: ``ray start --head`` on free
ports plus a second node (``ray start --address``) joining it, one CPU each, each with its own
temp folder. Every node runs ``ray start --block`` in a process group of its own, so stopping a
node kills exactly the processes it started (never a machine-wide ``ray stop``)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))

def cluster_env() -> dict:
    """What the nodes and every client of the test cluster share: token authentication with a
    token made for this run (Ray binds to the machine's address, not only loopback), and a lost
    node noticed in about a second rather than half a minute."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(16).hex(),
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "300",
            "RAY_health_check_timeout_ms": "300", "RAY_health_check_failure_threshold": "3"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports(taken: list[int]) -> tuple[list[str], list[int]]:
    """A node's own ports and a range of 41 for its workers, none of them in ``taken`` (the
    ports its command line names, the head's GCS port among them, and every port of the nodes
    started before it): its arguments, and every port they hold."""
    flags = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--runtime-env-agent-port")
    ports: list[int] = []
    for _ in flags:
        port = free_port()
        while port in taken or port in ports:
            port = free_port()
        ports.append(port)
    low = free_port()
    while any(low <= p <= low + 40 for p in ports + taken):  # Ray refuses a port in the workers' range
        low = free_port()
    args = [x for flag, port in zip(flags, ports) for x in (flag, str(port))]
    return args + ["--min-worker-port", str(low), "--max-worker-port", str(low + 40)], \
        ports + list(range(low, low + 41))


def _named_ports(args: list[str]) -> list[int]:
    """The ports a node's arguments name: the value after each ``--...port`` flag, and the port
    of ``--address HOST:PORT``."""
    return [int(value.rpartition(":")[2]) for flag, value in zip(args, args[1:])
            if flag.endswith("-port") or flag == "--address"]


class Node:
    def __init__(self, args: list[str], label: str, shared: dict, cpu: int | None = None,
                 taken: list[int] = ()):
        self.dir = Path(tempfile.mkdtemp(prefix=f"ef-ray-{label}-", dir="/tmp"))  # short: sockets
        env = {**os.environ, **shared,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.log = open(self.dir / "node.log", "wb")
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []  # the node and all it starts
        self.ports = _named_ports(args)
        own, ports = _ports(self.ports + list(taken))
        self.ports += ports
        self.proc = subprocess.Popen([*pin, RAY, "start", "--block", "--num-cpus", "1",
                                      "--node-ip-address", "127.0.0.1", "--temp-dir", str(self.dir),
                                      "--disable-usage-stats", *own, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=REPO)
        self.cpu = cpu

    def pids(self, name: str | None = None) -> list[int]:
        """This node's processes (its process group, and the workers its raylet started in
        groups of their own), or those called ``name``."""
        import psutil
        found = []
        for p in psutil.process_iter(["name"]):
            try:
                if os.getpgid(p.pid) == self.proc.pid:
                    found += [p, *p.children(recursive=True)]
            except (ProcessLookupError, psutil.Error):
                pass
        out = []
        for p in found:
            try:
                if name is None or p.name() == name:
                    out.append(p.pid)
            except psutil.Error:
                pass
        return sorted(set(out))

    def kill_raylet(self) -> None:
        """The node dies: its raylet is killed (its workers and ``ray start`` follow it)."""
        for pid in self.pids("raylet"):
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def tail(self) -> str:
        try:
            return (self.dir / "node.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


class Cluster:
    """A head node and worker nodes (``add_worker``); ``address`` is the head's, ``env`` what a
    client needs in its environment to join (the token; ``env``: another cluster's, so that one
    client process can join both in turn). ``pin``: node i runs on core i alone
    (its raylet, workers and the sandboxes they start), so that "one CPU each" is one core each,
    as on separate one-core machines; unpinned, every node's processes use any core."""

    def __init__(self, pin: bool = False, env: dict | None = None):
        self.pin = pin
        self.env = env or cluster_env()
        self.workers: list[Node] = []
        # a head start on a busy machine can miss Ray's own 30 s deadline ("Failed to get node
        # info: RPC error: Deadline Exceeded"); one lost start would error every test of the
        # module, so a failed head is stopped and started once more, on fresh ports
        for attempt in (1, 2):
            self.port = free_port()
            self.address = f"127.0.0.1:{self.port}"
            self.head = Node(["--head", "--port", str(self.port), "--include-dashboard", "false",
                              "--dashboard-port", str(free_port()),
                              "--ray-client-server-port", str(free_port())], "head", self.env,
                             self._cpu(0))
            try:
                self._wait(1)
                break
            except RuntimeError as e:
                self.head.stop()
                if attempt == 2:
                    raise
                print(f"ray_cluster: the head did not start ({e}); starting it again", file=sys.stderr)

    def add_worker(self) -> Node:
        taken = [p for n in [self.head, *self.workers] for p in n.ports]
        node = Node(["--address", self.address], "worker", self.env, self._cpu(1 + len(self.workers)), taken)
        self.workers.append(node)
        self._wait(1 + sum(w.proc.poll() is None for w in self.workers))
        return node

    def _cpu(self, i: int) -> int | None:
        """The core node ``i`` is pinned to (None: unpinned); needs a core per node."""
        if not self.pin:
            return None
        cpus = sorted(os.sched_getaffinity(0))
        if shutil.which("taskset") is None:
            raise RuntimeError("cannot pin a node to a core: no taskset (apt-get install util-linux)")
        if i >= len(cpus):
            raise RuntimeError(f"cannot pin node {i + 1} to a core of its own: this process may use "
                               f"{len(cpus)} cores")
        return cpus[i]

    def alive(self) -> list[str]:
        import ray
        return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))

    def alive_after(self, nodes: int, seconds: float = 15) -> list[str]:
        """The live nodes, once there are ``nodes`` of them (a dead node is noticed in about a
        second) or ``seconds`` have passed."""
        deadline = time.monotonic() + seconds
        alive = self.alive()
        while len(alive) != nodes and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self.alive()
        return alive

    def _wait(self, nodes: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.head.proc.poll() is not None:
                raise RuntimeError(f"ray start --head exited: {self.head.tail()}")
            r = subprocess.run([RAY, "status", "--address", self.address], capture_output=True,
                               text=True, timeout=60, env={**os.environ, **self.env})
            if r.returncode == 0 and r.stdout.count("node_") >= nodes:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not reach {nodes} nodes in {timeout:g} s: "
                           f"{self.head.tail()} {' '.join(w.tail() for w in self.workers)}")

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            node.stop()
