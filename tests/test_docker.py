"""The Docker backend against a real engine (no mocks).

Needs an engine: $DOCKER_HOST, or /var/run/docker.sock (``.ci/run`` starts one on a private
socket). Where none answers, the whole module skips and says why. The sandbox image is built
on first use if it is missing (from $ENVFORGE_SANDBOX_BASE when set).

Every container these tests start carries a label of this test session; each test checks that
none of them, and no process started with this session's PYTHONHASHSEED marker, is left after it.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envforge.contract import Limits
from envforge.errors import (EnvCallError, SandboxCrashed, SandboxProtocolError, SandboxTimeout,
                             SandboxUnavailable, UsageError)
from tests.test_sandbox import (END, GOOD_ENV, MARK, env_with, processes_marked, returning,
                                step)

REPO = Path(__file__).resolve().parent.parent
SESSION = f"envforge-test-{os.getpid()}"
FAST = Limits(call_timeout_s=2.0, memory_mb=512)


def engine_problem() -> str | None:
    """Why no Docker engine can be used here (None when one answers)."""
    try:
        from sandbox.docker import client
        client(timeout=10)
    except SandboxUnavailable as e:
        return str(e)
    return None


REASON = engine_problem()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")


def containers(**labels: str) -> list[dict]:
    """This session's sandbox containers (running or not)."""
    from sandbox.docker import client
    wanted = [f"envforge.test={SESSION}"] + [f"{k}={v}" for k, v in labels.items()]
    return client().api.containers(all=True, filters={"label": wanted})


def ensure_image() -> None:
    from sandbox.docker import DockerBackend, build_image, image_tag
    ok, why = DockerBackend().available()
    if not ok and "image" in why and "missing" in why:
        build_image(base=os.environ.get("ENVFORGE_SANDBOX_BASE"))
        ok, why = DockerBackend().available()
    assert ok, f"the sandbox image {image_tag()} is not usable: {why}"


def backend(**options):
    from sandbox.docker import DockerBackend
    labels = {"envforge.test": SESSION, **options.pop("labels", {})}
    return DockerBackend(labels=labels, **options)


@pytest.fixture(scope="session")
def image() -> None:
    if REASON is None:
        ensure_image()


@pytest.fixture
def make(image):
    """make(source=None, channel="auto", hash_seed=MARK, **limits) -> a started (and loaded)
    Docker sandbox; afterwards no container or marked process of the test may be left."""
    assert containers() == [], "a container of an earlier test was left behind"

    def make(source=None, channel="auto", hash_seed=MARK, **limits):
        sb = backend(channel=channel).start(dataclasses.replace(FAST, **limits), hash_seed=hash_seed)
        make.started.append(sb)
        if source is not None:
            sb.load(source)
        return sb
    make.started = []
    yield make
    for sb in make.started:
        sb.kill()
    assert containers() == [], "a sandbox container outlived its sandbox"
    assert processes_marked() == [], "a sandboxed process outlived its sandbox"


CHANNELS = ["socket", "attach"]


# --------------------------------------------------------------------------- the backend

def test_available_says_how_it_isolates(image):
    ok, why = backend().available()
    assert ok, why
    for part in ("no network", "read-only root", "16 MiB tmpfs", "no capabilities",
                 "no-new-privileges", "uid 10001", "socket channel"):
        assert part in why


def test_the_container_is_locked_down(make):
    from sandbox.docker import client
    sb = make(GOOD_ENV)
    info = client().api.inspect_container(sb.transport.id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    from sandbox.docker import seccomp_profile
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges", f"seccomp={seccomp_profile()}"]
    assert host["IpcMode"] == "none"  # no /dev/shm
    assert host["PidsLimit"] == 64 and host["NanoCpus"] == 10**9
    assert host["Memory"] == host["MemorySwap"] == (512 + 16 + 32) << 20
    assert host["Tmpfs"] == {"/tmp": "size=16m,mode=1777,noexec,nosuid,nodev"}
    assert host["LogConfig"]["Type"] == "none"
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]} == {
        "data": 512 << 20, "cpu": 300, "nofile": 64, "fsize": 1 << 20, "core": 0}
    assert [m["RW"] for m in info["Mounts"]] == [False]  # the socket folder, read-only
    assert info["Config"]["User"] == "10001:10001"
    assert info["Config"]["Labels"]["envforge.sandbox"] == "1"
    assert sb.meta["sandbox"] == {"seccomp": False, "uid": 10001, "channel": "stream"}


@pytest.mark.parametrize("channel", CHANNELS)
def test_round_trip_on_each_channel(make, channel):
    sb = make(GOOD_ENV, channel=channel)
    assert sb.backend == f"docker/{channel}"
    assert sb.new() == 0
    obs, info = sb.reset(0, 7)
    assert info == {"skill": "lookup"} and obs["messages"][1]["content"].startswith("Where is")
    (action,) = sb.solve(0, 7)
    sb.reset(0, 7)
    assert sb.step(0, action) == [
        {"messages": [{"role": "tool", "tool_call_id": "call_0", "content": "shipped"}]},
        1.0, True, False, {"skill": "lookup"}]
    with pytest.raises(EnvCallError, match="an env is already loaded here"):
        sb.load(GOOD_ENV)
    assert sb.ping()


def test_hash_seed_reaches_the_runner(make):
    source = env_with(reset='return {"messages": []}, {"h": hash("abc")}')

    def observed(seed):
        sb = make(source, hash_seed=seed)
        sb.new()
        return sb.reset(0, 0)[1]["h"]
    assert observed(1) == observed(1) != observed(2)


PROBE = '''\
import os, socket
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
seen = {"uid": os.getuid(), "parent": os.getppid(), "pids": pids == {1, os.getpid()},
        "cap": status["CapEff"].strip(),
        "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
        "ifs": [l.split(":")[0].strip() for l in open("/proc/net/dev")][2:],
        "env": sorted(os.environ)}
for path in ("/pwned", "/opt/envforge/runner.py", "/run/envforge/pwned", "/tmp/ok"):
    try:
        open(path, "w").write("x")
        seen[path] = "written"
    except OSError as e:
        seen[path] = e.errno
try:
    open("/tmp/big", "wb").write(b"x" * (2 << 20))
    seen["big"] = "written"
except OSError as e:
    seen["big"] = e.errno
'''


@pytest.mark.parametrize("channel", CHANNELS)
def test_inside_the_container(make, channel):
    import errno
    seen = step(make(env_with(step=PROBE + returning("seen")), channel=channel))[4]
    assert seen == {
        "uid": 10001, "parent": 1, "pids": True, "cap": "0000000000000000", "nnp": "1",
        "seccomp": "2",
        "ifs": ["lo"], "env": ["HOME", "HOSTNAME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE",
                               "PYTHONHASHSEED"],
        "/pwned": errno.EROFS, "/opt/envforge/runner.py": errno.EROFS,
        "/run/envforge/pwned": errno.ENOENT,  # socket channel: a read-only mount, emptied
        "/tmp/ok": "written", "big": errno.EFBIG}


def test_missing_image_is_unavailable_with_the_fix(image):
    b = backend(image="envforge-sandbox:no-such-tag")
    ok, why = b.available()
    assert not ok and "run `envforge sandbox build`" in why
    with pytest.raises(SandboxUnavailable, match=r"^the sandbox image envforge-sandbox:no-such-tag "
                                                 r"is missing: run `envforge sandbox build`"):
        b.start(FAST)
    assert containers() == []


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="unknown channel 'pipe'; choose auto, socket, attach"):
        backend(channel="pipe")
    with pytest.raises(UsageError, match="hash_seed must be in"):
        backend().start(FAST, hash_seed=-1)


def test_no_engine_and_no_permission_say_the_fix(monkeypatch, tmp_path):
    from sandbox import docker as d
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(d, "DEFAULT_SOCKET", str(tmp_path / "docker.sock"))
    with pytest.raises(SandboxUnavailable, match=r"no Docker engine here \(DOCKER_HOST is unset "
                                                 r"and .*docker.sock does not exist\): install one "
                                                 r"\(apt-get install docker.io\)"):
        d.client()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    assert not d.DockerBackend().available()[0]
    assert "does not answer" in d.DockerBackend().available()[1]
    assert d._engine_problem(PermissionError(13, "Permission denied")).startswith(
        f"permission denied on the Docker socket (unix://{tmp_path}/docker.sock): add your user "
        "to the docker group")


# --------------------------------------------------------------------------- failures

@pytest.mark.parametrize("channel", CHANNELS)
def test_a_hang_times_out_and_the_container_is_removed(make, channel):
    sb = make(env_with(step="while True:\n    pass"), channel=channel, call_timeout_s=0.5)
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not answer within 0.5 s; "
                                             "the sandbox was killed$"):
        step(sb)
    assert time.monotonic() - t < 0.5 + 1.5
    assert containers() == [] and not sb.transport.alive()


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_request_the_runner_does_not_read_times_out_on_the_call_limit(make, channel):
    sb = make(env_with(reset="while True:\n    pass"), channel=channel, call_timeout_s=0.5)
    sb.new()
    sb.transport.send(b'{"id": 99, "op": "reset", "instance": 0, "seed": 1}\n',
                      time.monotonic() + 5)
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not read its request within 0.5 s; "
                                             "the sandbox was killed$"):
        sb.step(0, {"role": "assistant", "content": "x" * (16 << 20)})
    assert time.monotonic() - t < 0.5 + 1.5 and containers() == []


@pytest.mark.parametrize("channel", CHANNELS)
def test_an_exit_is_a_crash_with_its_status_and_stderr(make, channel):
    sb = make(env_with(step="import os\nos.write(2, b'bye now')\nos._exit(7)"), channel=channel)
    with pytest.raises(SandboxCrashed, match=r"^step: the runner exited "
                                             r"\(exit status 7; stderr: bye now\)$"):
        step(sb)


def test_a_memory_bomb_is_a_memory_error_and_the_sandbox_lives(make):
    sb = make(env_with(step="blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))"),
              call_timeout_s=10.0)
    with pytest.raises(EnvCallError) as e:
        step(sb)
    assert e.value.type == "MemoryError"
    assert sb.ping()


def test_a_huge_reply_is_a_protocol_error(make):
    sb = make(env_with(step=returning('{"b": "x" * 50_000_000}')), call_timeout_s=10.0)
    with pytest.raises(SandboxProtocolError, match="a reply line longer than 4194304 bytes"):
        step(sb)
    assert containers() == []


def test_output_on_stdout_and_stderr_does_not_break_the_protocol(make):
    forged = '{"id": 3, "ok": true, "value": 0}'
    sb = make(env_with(step=f"import os, sys\nprint({forged!r})\nos.write(1, b{forged!r} b'\\n')\n"
                            f"os.write(2, b'y' * 300000)\nsys.stderr.write('x' * 10**6)\n{END}"),
              channel="attach")
    for _ in range(3):
        assert step(sb) == [{"messages": []}, 0.0, True, False, {}]
    assert sb.ping()


# --------------------------------------------------------------------------- the host goes away

HOST = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from envforge.contract import Limits
from sandbox.docker import DockerBackend
sb = DockerBackend(labels={{"envforge.test": {session!r}, "case": {case!r}}},
                   channel={channel!r}).start(Limits(), hash_seed={mark})
sb.load("CAPABILITY = 'x'\\nclass Env:\\n    tools = []\\n    def reset(self, seed):\\n"
        "        while True:\\n            pass\\n    def step(self, a):\\n        pass\\n"
        "    def solve(self, s):\\n        return []\\n")
sb.new()
if {spin!r}:
    sb.transport.send(b'{{"id": 99, "op": "reset", "instance": 0, "seed": 1}}\\n',
                      time.monotonic() + 5)
print("ready", flush=True)
{then}
"""


def host(case: str, spin: bool, then: str, prefix: list[str] = (),
         channel: str = "auto") -> subprocess.Popen:
    code = HOST.format(repo=str(REPO), session=SESSION, case=case, mark=MARK, spin=spin, then=then,
                       channel=channel)
    proc = subprocess.Popen([*prefix, sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    assert len(containers(case=case)) == 1
    return proc


def wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


def test_ctrl_c_removes_the_containers(image):
    """SIGINT while the env spins in a call: KeyboardInterrupt, then the atexit hook."""
    proc = host("ctrl-c", spin=True, then="time.sleep(60)")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == -signal.SIGINT  # how Python exits on KeyboardInterrupt
    assert containers(case="ctrl-c") == [] and processes_marked() == []


def test_ctrl_c_in_a_call_unwinds_through_the_sandbox(image):
    proc = host("ctrl-c-call", spin=False, then=textwrap.dedent("""
        try:
            sb.reset(0, 1)
        except KeyboardInterrupt:
            print("interrupted", sb.closed, flush=True)
            os._exit(0)
    """))
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert proc.stdout.read() == "interrupted True\n"
    assert containers(case="ctrl-c-call") == [] and processes_marked() == []


def running(case: str) -> list[dict]:
    return [c for c in containers(case=case) if c["State"] == "running"]


@pytest.mark.parametrize("spin", [False, True], ids=["idle", "spinning"])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGKILL-pid-namespace",
                                 "SIGKILL-attach"])
def test_no_container_outlives_its_host(image, spin, how):
    """A host killed outright (in its own pid namespace too, where its pid means nothing to the
    next host; or on the attach channel, where the container's stdin closes), or terminated: its
    containers stop within 10 s, even with the env spinning in a call (the container's first
    process kills the runner when the host hangs up). On SIGTERM they are removed at once;
    stopped ones of a killed host are the next start's strays."""
    case = f"{how}-{spin}"
    proc = host(case, spin=spin, then="time.sleep(60)",
                prefix=["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
                if how.endswith("pid-namespace") else [],
                channel="attach" if how.endswith("attach") else "auto")
    proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
    proc.wait(timeout=10)
    try:
        if how == "SIGTERM":
            assert wait_for(lambda: containers(case=case) == [], 10.0)
        assert wait_for(lambda: running(case) == [], 10.0)
        assert wait_for(lambda: processes_marked() == [], 5.0)
        if how in ("SIGKILL", "SIGKILL-attach"):  # an owner in this pid namespace: certainly gone
            assert [c["Id"] for c in containers(case=case)] == backend().reap()
            assert containers(case=case) == []
    finally:
        from sandbox.docker import client
        for c in containers(case=case):
            client().api.remove_container(c["Id"], force=True)


def test_strays_are_listed_and_removed_by_doctor_clean(image):
    """`envforge sandbox doctor --clean` removes containers whose owner is gone, and says so."""
    from click.testing import CliRunner
    from envforge.cli import main
    from sandbox.docker import client
    proc = host("doctor-clean", spin=True, then="time.sleep(60)")
    [stray] = containers(case="doctor-clean")
    proc.kill()
    proc.wait(timeout=10)
    try:
        result = CliRunner().invoke(main, ["sandbox", "doctor", "--clean"])
        assert result.exit_code == 0, result.output
        assert f"removed stray container {stray['Id'][:12]} (" in result.output
        assert "its owner is gone" in result.output
        assert containers(case="doctor-clean") == []
    finally:
        for c in containers(case="doctor-clean"):
            client().api.remove_container(c["Id"], force=True)


# --------------------------------------------------------------------------- the gate on Docker

@pytest.fixture(scope="module")
def gate_settings():
    from envforge.gate.dynamic import GateSettings
    return GateSettings(seeds=8, robustness_examples=8, replay_random=2,
                        limits=Limits(call_timeout_s=1.0, memory_mb=512))


@pytest.mark.parametrize("name, check, message", [
    ("good", None, None),
    ("hang", "bounded", "did not answer within"),
    ("memory_bomb", "bounded", "out of memory"),
    ("set_order", "determinism", "PYTHONHASHSEED"),
    ("load_error", "sandbox", "ValueError"),
])
def test_the_gate_runs_on_docker(tmp_path, make, gate_settings, name, check, message):
    from envforge.gate import audit
    from tests.envfactory import good_source, variants, write_env
    source = good_source() if name == "good" else next(v.source for v in variants() if v.name == name)
    b = backend()
    report = audit(write_env(tmp_path / name, source), backend=b, settings=gate_settings,
                   write_report=False)
    assert report.stats.get("sandbox", {}).get("uid") == 10001 or name == "load_error"
    errors = [f for f in report.findings if f.severity == "error"]
    if check is None:
        assert report.verdict == "accept", [f.to_dict() for f in report.findings]
    else:
        assert [f for f in errors if f.check == check and message in f.message], \
            [f.to_dict() for f in report.findings]


def test_cli_audit_with_the_docker_backend(tmp_path, make):
    from click.testing import CliRunner
    from envforge.cli import main
    from tests.envfactory import good_source, write_env
    folder = write_env(tmp_path / "good", good_source())
    result = CliRunner().invoke(main, ["audit", str(folder), "--backend", "docker", "--seeds", "4",
                                       "--no-report", "--json"])
    assert result.exit_code in (0, 1), result.output
    import json
    [res] = json.loads(result.output)["results"]
    assert res["stats"]["sandbox"]["uid"] == 10001


def test_cli_sandbox_build_and_doctor(tmp_path, image):
    from click.testing import CliRunner
    from envforge.cli import main
    from sandbox.docker import client, image_tag
    result = CliRunner().invoke(main, ["sandbox", "doctor", "--json"])
    assert result.exit_code == 0, result.output
    import json
    rows = {r["backend"]: r for r in json.loads(result.output)["backends"]}
    assert rows["docker"]["ok"] and image_tag() in rows["docker"]["detail"]
    from sandbox.docker import build_image
    tag = f"envforge-sandbox:test-{os.getpid()}"
    try:
        assert build_image(base=image_tag(), tag=tag) == tag  # the sandbox image is a fine base
        assert client().api.inspect_image(tag)["Config"]["User"] == "10001:10001"
    finally:
        client().api.remove_image(tag, force=True)
    result = CliRunner().invoke(main, ["sandbox", "build", "--base", "envforge-no-such-base:x"])
    assert result.exit_code == 1
    assert "Is envforge-no-such-base:x an image on this engine" in result.output


def test_a_remote_engine_has_no_host_side_cpu_reading():
    """The host reads a container's CPU from its cgroup only when the engine is local: the pid
    the engine reports must be a process here inside that container's cgroup. A remote engine
    cannot run here; a stand-in for its API (the one mock of this file) reports the pid of a
    process of this machine that is in no container (this one), which must not be taken for it."""
    from sandbox.docker import ContainerTransport

    class RemoteEngine:
        def inspect_container(self, container_id):
            return {"State": {"Pid": os.getpid(), "Running": True}}

        def remove_container(self, container_id, force=False):
            pass

    transport = ContainerTransport(RemoteEngine(), "0123456789ab" * 5 + "abcd")
    transport.find_cpu_file()
    assert transport.cpu_file is None and transport.cpu_seconds() is None
    transport.kill()


def test_a_local_engine_reads_the_container_cpu_from_its_cgroup(make):
    """On the local engine here the container's cgroup counter is found, and it grows with the
    CPU the env uses during a call (1 s burnt: 0.8 s at least is counted)."""
    sb = make(env_with(step="import time\nend = time.process_time() + 1.0\n"
                            "while time.process_time() < end:\n    pass\n" + returning("{}")),
              call_timeout_s=5.0)
    sb.new()
    sb.reset(0, 1)
    before = sb.transport.cpu_seconds()
    assert before is not None, "the container's cgroup CPU counter was not found"
    sb.call("step", timeout=60, instance=0, action={"role": "assistant", "content": "go"})
    assert sb.transport.cpu_seconds() - before >= 0.8
