"""Containment: env code that attacks the host from inside the sandbox, with the static audit
bypassed (sources go straight into the sandbox), on every layer available here: the process
sandbox's bwrap, unshare and none, and Docker. A layer that does not work here skips and says why.

Each attack is one that got out before (issue 15, issue 18): a host wait with no deadline (the
env makes every fd it has blocking), typing into a terminal (TIOCSTI), signals to the host
through a shared file (F_SETOWN/F_SETSIG/O_ASYNC), a thread bomb, kernel surface (io_uring), CPU
burned between calls or beyond a call's time limit, and on Docker stderr that costs dockerd CPU
outside the container's cap.
"""
from __future__ import annotations

import dataclasses
import os
import pty
import signal
import time
from pathlib import Path

import pytest

from envforge.contract import Limits
from envforge.errors import SandboxCrashed, SandboxTimeout
from sandbox.process import LAYERS
from tests.test_sandbox import GOOD_ENV, MARK, backend_for, env_with, processes_marked, returning

FAST = Limits(call_timeout_s=2.0, memory_mb=512)
SESSION = f"envforge-containment-{os.getpid()}"


def docker_backend():
    from tests.test_docker import REASON, ensure_image
    if REASON is not None:
        pytest.skip(f"no Docker engine: {REASON}")
    ensure_image()
    from sandbox.docker import DockerBackend
    return DockerBackend(labels={"envforge.test": SESSION})


def docker_containers() -> list[dict]:
    from sandbox.docker import client
    return client().api.containers(all=True, filters={"label": f"envforge.test={SESSION}"})


@pytest.fixture(params=[*LAYERS, "docker"])
def attack(request):
    """attack(source, **limits) -> a sandbox on one layer with ``source`` loaded and an
    instance reset; afterwards none of its processes (or containers) may be left."""
    layer, started = request.param, []
    backend = docker_backend() if layer == "docker" else backend_for(layer)

    def start(source: str, **limits):
        sb = backend.start(dataclasses.replace(FAST, **limits), hash_seed=MARK)
        started.append(sb)
        sb.load(source)
        sb.new()
        sb.reset(0, 1)
        return sb

    start.layer = layer
    yield start
    for sb in started:
        sb.kill()
    assert processes_marked() == [], "a sandboxed process outlived its sandbox"
    if layer == "docker":
        assert docker_containers() == [], "a container outlived its sandbox"


def go(sb):
    return sb.step(0, {"role": "assistant", "content": "go"})


# --------------------------------------------------------------------------- host waits

BLOCK_EVERY_FD = """import fcntl, os
for fd in range(256):
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except OSError:
        pass
"""


def test_blocking_every_fd_then_hanging_cannot_hang_the_host(attack):
    """Every fd the env can reach made blocking (what it shares with the host included), then
    a hang: the call still ends on its time limit, and the host's own fds stay non-blocking."""
    sb = attack(env_with(step=BLOCK_EVERY_FD + "while True:\n    pass"), call_timeout_s=1.0)
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not answer within 1 s"):
        go(sb)
    assert time.monotonic() - t < 1.0 + 2.0


def test_blocking_every_fd_does_not_stop_the_next_calls(attack):
    sb = attack(env_with(step=BLOCK_EVERY_FD + returning("{}")))
    go(sb)
    t = time.monotonic()
    assert all(sb.ping(timeout=2.0) for _ in range(200))
    assert time.monotonic() - t < 10.0


# --------------------------------------------------------------------------- terminals

def test_no_typing_into_a_terminal(attack):
    """TIOCSTI (and TIOCLINUX) on every fd the env has and on a terminal of the host's, also with
    the command's upper 32 bits set (the kernel ignores them): refused, nothing typed."""
    master, slave = pty.openpty()
    try:
        os.set_blocking(master, False)
        source = env_with(step=f"""import fcntl, os
typed = []
fds = list(range(64))
try:
    fds.append(os.open({os.ttyname(slave)!r}, os.O_RDONLY | os.O_NOCTTY))
except OSError:
    pass
for fd in fds:
    for cmd in (0x5412, 0x1_0000_5412, 0x541C):
        try:
            fcntl.ioctl(fd, cmd, b"x" if cmd != 0x541C else bytes([1]))
            typed.append((fd, cmd))
        except (OSError, OverflowError, ValueError):
            pass
""" + returning('{"typed": typed}'))
        info = go(attack(source))[4]
        assert info == {"typed": []}
        with pytest.raises(BlockingIOError):
            os.read(master, 100)
    finally:
        os.close(master)
        os.close(slave)


# --------------------------------------------------------------------------- signals

def test_no_signal_to_the_host_through_a_shared_file(attack):
    """F_SETOWN (the host's pid), F_SETSIG and O_ASYNC (or FIOASYNC) on every fd the env has:
    refused on every layer, and no signal reaches this process while the calls go on (the real
    attack chose SIGKILL; SIGUSR1 here, counted)."""
    hits = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    try:
        source = env_with(step=f"""import fcntl, os
done = []
on = (1).to_bytes(4, "little")
for fd in range(64):
    for pid in ({os.getpid()}, os.getppid(), -os.getpgid(0)):
        for what, call in (
                ("setown", lambda: fcntl.fcntl(fd, fcntl.F_SETOWN, pid)),
                ("setsig", lambda: fcntl.fcntl(fd, 10, {int(signal.SIGUSR1)})),
                ("async", lambda: fcntl.fcntl(fd, 4, fcntl.fcntl(fd, 3) | 0o20000)),
                ("fioasync", lambda: fcntl.ioctl(fd, 0x5452, on))):
            try:
                call()
                done.append((fd, what))
            except OSError:
                pass
""" + returning('{"done": sorted(set(w for _, w in done))}'))
        sb = attack(source)
        info = go(sb)[4]
        for _ in range(50):
            assert sb.ping()
        time.sleep(0.2)
        assert info == {"done": []} and hits == []
    finally:
        signal.signal(signal.SIGUSR1, previous)


# --------------------------------------------------------------------------- processes

def test_no_thread_or_process_bomb(attack):
    """Root is not bound by RLIMIT_NPROC: threads and processes are refused on every layer (the
    process sandbox's seccomp denies clone; Docker: a pids cap and a non-root uid)."""
    source = env_with(step="""import _thread, os, time
started = 0
for _ in range(200):
    try:
        _thread.start_new_thread(time.sleep, (5,))
        started += 1
    except RuntimeError:
        break
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked = True
except OSError:
    forked = False
""" + returning('{"threads": started, "forked": forked}'))
    assert go(attack(source))[4] == {"threads": 0, "forked": False}


# --------------------------------------------------------------------------- kernel surface

def test_kernel_surface_is_denied(attack):
    """io_uring (allowed by Docker's default profile), new user namespaces, ptrace: EPERM."""
    source = env_with(step="""import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
for name, number, args in (("io_uring_setup", 425, (1, ctypes.create_string_buffer(120))),
                           ("unshare", 272, (0x10000000,)), ("ptrace", 101, (16, 1, 0, 0))):
    result = libc.syscall(number, *args)
    seen[name] = "EPERM" if result == -1 and ctypes.get_errno() == errno.EPERM else result
""" + returning("seen"))
    assert go(attack(source))[4] == {"io_uring_setup": "EPERM", "unshare": "EPERM",
                                     "ptrace": "EPERM"}


# --------------------------------------------------------------------------- CPU between calls

ITIMER_BURN = """import signal, time
cpu = time.process_time()
def burn(*_):
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
if not hasattr(signal, "armed"):
    signal.armed = True
    for sig in (signal.SIGALRM, signal.SIGPROF, signal.SIGVTALRM):
        signal.signal(sig, burn)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    except OSError:  # refused by the filters: the signals stay blocked
        pass
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
    signal.setitimer(signal.ITIMER_PROF, 0.01, 0.01)
"""


def test_timers_burn_no_cpu_between_calls(attack):
    """The issue's attack: a SIGALRM itimer whose handler spins kept the runner busy with no
    call in flight. Signals stay blocked (unblocking them is refused): a second idle costs
    (almost) no CPU, and the next call is answered. (Each step reports the runner's CPU clock
    as it starts.)"""
    sb = attack(env_with(step=ITIMER_BURN + returning('{"cpu": cpu}')))
    go(sb)  # arms the timers, unblocks every signal
    before = go(sb)[4]["cpu"]
    time.sleep(1.0)
    idle = go(sb)[4]["cpu"] - before
    assert idle < 0.1, f"{idle:.2f} CPU-s used while idle"
    assert sb.ping()


IDLE_BURN = """import gc, time
def burning(wait):
    def wrapper(*args, **kwargs):
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        return wait(*args, **kwargs)
    return wrapper
for o in gc.get_objects():
    if type(o).__name__ == "Shared" and not hasattr(o, "burning"):
        o.burning = True
        type(o).block = burning(type(o).block)
if not hasattr(time, "burning"):
    time.burning, time.perf_counter = True, burning(time.perf_counter)
"""


def test_cpu_burned_between_calls_ends_the_sandbox(attack):
    """Env code that reaches the runner's own waiting code (patching what it calls) runs while
    no call is in flight: the runner's CPU clock shows it, and the next call ends the sandbox
    with a reason, within a second."""
    sb = attack(env_with(step=IDLE_BURN + returning("{}")), call_timeout_s=5.0)
    go(sb)
    time.sleep(0.5)
    t = time.monotonic()
    with pytest.raises(SandboxCrashed, match="CPU seconds between calls"):
        sb.ping()
    # the runner's burn (0.3 CPU-s) then its exit, within a second; on Docker the report also
    # waits for the engine to see the container stopped and drains its stderr (up to 1 s each)
    assert time.monotonic() - t < 1.0 + 0.3 + (2.0 if attack.layer == "docker" else 0.0)
    assert sb.closed


def test_the_host_sees_cpu_burned_between_calls_whatever_the_runner_says(attack):
    """The runner's own check lives where env code can reach it; the host's does not: env code
    that also turns the runner's check off (its module's limit set to infinity, its waiting
    code patched to burn) is still caught at the next call after an idle spell: from /proc, or
    on Docker from the container's cgroup CPU counter (a local engine; a remote one has none)."""
    sb = attack(env_with(step="import sys\nsys.modules['__main__'].IDLE_CPU_S = float('inf')\n"
                              + IDLE_BURN + returning("{}")), call_timeout_s=5.0)
    if attack.layer == "docker":
        assert sb.transport.cpu_seconds() is not None, "a local engine's cgroup was not found"
    go(sb)
    time.sleep(0.6)
    with pytest.raises(SandboxCrashed, match=r"^ping: the sandbox used \d+\.\d\d CPU seconds "
                                             "between calls"):
        sb.ping()
    assert sb.closed


# --------------------------------------------------------------------------- CPU per call

BURN = """import signal, time
try:
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # refused by the filters
except OSError:
    pass
end = time.process_time() + float(action["content"])
while time.process_time() < end:
    pass
"""


def burn(sb, seconds: float, timeout: float = 60.0):
    return sb.call("step", timeout=timeout, instance=0,
                   action={"role": "assistant", "content": str(seconds)})


def test_a_call_uses_no_more_cpu_than_its_time_limit_allows(attack):
    """The runner lowers its soft RLIMIT_CPU before each call to the CPU it used so far plus
    the call's time limit (1 s here), rounded up, plus 1 s: a call that burns CPU is ended by
    the kernel (SIGXCPU; ignoring it is refused) even when the host's wall-clock timeout is far
    higher, and the error says why. Calls within their limit go on for as long as they come:
    the limit is per call, not over the sandbox's life (five calls of 0.7 s use 3.5 s)."""
    sb = attack(env_with(step=BURN + returning("{}")), call_timeout_s=1.0)
    for _ in range(5):
        burn(sb, 0.7)
    t = time.monotonic()
    with pytest.raises(SandboxCrashed, match="SIGXCPU: the call used more CPU than its time "
                                             "limit allows"):
        burn(sb, float("inf"))
    # at most 1 + 1 + the fraction of a second already used; the machine may be shared
    assert time.monotonic() - t < 30.0
    assert sb.closed


# --------------------------------------------------------------------------- Docker: stderr

def _cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds used so far by each of ``pids`` still alive."""
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def _docker_side_pids() -> list[int]:
    """dockerd, containerd and the containers' shims: where output of a container costs CPU."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name in ("dockerd", "containerd") or name.startswith("containerd-shim"):
            found.append(int(pid))
    return found


def _container_cpu(container_id: str) -> float:
    from sandbox.docker import client
    stats = client().api.stats(container_id, stream=False)
    return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


def test_a_stderr_flood_is_charged_to_the_container():
    """os.write(2, ...) in a loop for 3 s (print is capped; a raw write was not): the container's
    cgroup is charged at least 80% of the CPU the attack causes; dockerd, containerd, the shims
    and this process the rest. (Measured on a shared machine: other work on it only adds to
    the outside side, against the test.)"""
    backend = docker_backend()
    sb = backend.start(dataclasses.replace(FAST, call_timeout_s=10.0), hash_seed=MARK)
    try:
        sb.load(env_with(step="""import os, time
end = time.monotonic() + 3.0
while time.monotonic() < end:
    try:
        os.write(2, b"x" * 65536)
    except OSError:
        pass
""" + returning("{}")))
        sb.new()
        sb.reset(0, 1)
        outside = _docker_side_pids() + [os.getpid()]  # the container's shim included
        inside0, out0 = _container_cpu(sb.transport.id), _cpu_seconds(outside)
        go(sb)
        out1, inside1 = _cpu_seconds(outside), _container_cpu(sb.transport.id)
        inside = inside1 - inside0
        out = sum(out1[p] - out0[p] for p in out1.keys() & out0.keys())
        assert inside > 0.3, f"the attack barely ran ({inside:.2f} CPU-s; a loaded machine?)"
        assert inside / (inside + out) >= 0.8, f"container {inside:.2f} CPU-s, outside {out:.2f}"
        assert sb.ping()
    finally:
        sb.kill()
    assert docker_containers() == []


# --------------------------------------------------------------------------- doctor

def test_doctor_shows_what_holds_each_layer():
    """`envforge sandbox doctor --json`: for each backend that works, what a probe inside one of
    its sandboxes saw; on every layer here, no capability, no thread or process, TIOCSTI,
    F_SETOWN and io_uring refused; root only on layer none (whose capabilities are dropped)."""
    import json
    from click.testing import CliRunner
    from envforge.cli import main
    result = CliRunner().invoke(main, ["sandbox", "doctor", "--json"])
    rows = {r["backend"]: r for r in json.loads(result.output)["backends"]}
    working = [name for name, r in rows.items() if r["ok"] and name not in (
        "process/seccomp", "process/channel")]
    assert working, rows
    for name in working:
        facts = rows[name]["containment"]["facts"]
        assert facts is not None, rows[name]["containment"]
        for key in ("capabilities", "threads", "processes", "tiocsti", "setown", "io_uring"):
            assert facts[key] is True, (name, key)
        assert facts["uid"] != 0 or name == "process/none", name
        assert "inside" not in rows[name]["detail"]


# --------------------------------------------------------------------------- owners

def test_an_owner_is_gone_only_when_that_is_certain():
    """Container owners are named by hostname, boot id, pid namespace, pid and start time: a pid
    alone is ambiguous across pid namespaces (a host in a pod is pid 1) and over time."""
    import subprocess
    import sys
    from sandbox.docker import owner, owner_gone
    mine = owner()
    host, boot, namespace, pid, started = mine.split("/")
    assert pid == str(os.getpid()) and started.isdigit() and boot != "?"
    assert not owner_gone(mine)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = "/".join((host, boot, namespace, str(child.pid), "1"))
    assert owner_gone(dead)                                               # pid gone
    assert owner_gone("/".join((host, boot, namespace, pid, "1")))        # pid reused
    assert owner_gone("/".join((host, "an-earlier-boot", namespace, pid, started)))
    assert not owner_gone("/".join(("another-host", "x", namespace, str(child.pid), "1")))
    assert not owner_gone("/".join((host, boot, "pid:[1]", str(child.pid), "1")))  # another ns
    assert not owner_gone(f"{host}:{child.pid}") and not owner_gone("")  # old or no label
