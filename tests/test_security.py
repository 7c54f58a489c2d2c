"""Escapes, tried from inside each backend, with the static audit deliberately bypassed.

Hostile sources go straight into a sandbox (``process``: the best layer here; ``docker``: a real
engine, skipped with the reason where none answers). For each escape class the test asserts
that it failed, what the host saw (no connection, no file, no secret, a live test process, no
process left behind), and how it was reported: the typed error the gate turns into a finding.
The last test runs the gate's dynamic stage on a hostile env and checks the findings.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import pytest

from envforge.contract import Limits
from envforge.errors import EnvCallError, SandboxCrashed, SandboxProtocolError, SandboxTimeout
from tests.test_sandbox import END, MARK, env_with, processes_marked, returning, step

REPO = Path(__file__).resolve().parent.parent
FAST = Limits(call_timeout_s=1.0, memory_mb=512)
SECRET = f"hunter2-{os.getpid()}"


def _docker():
    from tests import test_docker
    if test_docker.REASON is not None:
        pytest.skip(f"no Docker engine: {test_docker.REASON}")
    test_docker.ensure_image()
    return test_docker.backend()


def _process():
    from sandbox.process import ProcessBackend
    backend = ProcessBackend()
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    return backend


@pytest.fixture(params=["process", "docker"])
def hostile(request, monkeypatch):
    """hostile(source, **limits) -> a loaded sandbox; afterwards none of its processes (or
    containers) may be left, and the test process must be alive (it is: it checks)."""
    monkeypatch.setenv("ENVFORGE_TEST_SECRET", SECRET)  # in the host's environment only
    backend = _process() if request.param == "process" else _docker()
    started = []

    def start(source: str, **limits):
        sb = backend.start(dataclasses.replace(FAST, **limits), hash_seed=MARK)
        started.append(sb)
        sb.load(source)
        return sb

    start.backend = request.param
    start.layer = backend.isolation_layers()[0] if request.param == "process" else "docker"
    yield start
    for sb in started:
        sb.kill()
    assert processes_marked() == [], "a sandboxed process outlived its sandbox"
    if request.param == "docker":
        from tests.test_docker import containers
        assert containers() == [], "a container outlived its sandbox"


def host_addresses() -> list[str]:
    addrs = {"127.0.0.1"}
    try:
        addrs.update(a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    return sorted(addrs)


def test_network_connect(hostile):
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        attempts = [(a, port) for a in host_addresses()] + [("1.1.1.1", 53)]
        attack = (f"import socket\nerrors = []\nfor addr in {attempts!r}:\n    try:\n"
                  "        socket.create_connection(addr, timeout=0.5).sendall(b'hi')\n"
                  "        errors.append(None)\n    except OSError as e:\n"
                  "        errors.append(type(e).__name__)\n" + returning('{"errors": errors}'))
        errors = step(hostile(env_with(step=attack), call_timeout_s=5.0))[4]["errors"]
        assert None not in errors and len(errors) == len(attempts)
        with pytest.raises(socket.timeout):
            listener.accept()


def test_write_outside_the_tmpfs(hostile, tmp_path):
    pid = os.getpid()
    targets = [tmp_path / "pwned", REPO / f".pwned-{pid}", Path(f"/tmp/pwned-{pid}"),
               Path(f"/root/.pwned-{pid}"), Path("/etc") / f"pwned-{pid}"]
    attack = "results = []\n" + "".join(
        f"try:\n    open({str(p)!r}, 'w').write('x')\n    results.append('written')\n"
        f"except OSError as e:\n    results.append(type(e).__name__)\n" for p in targets)
    results = step(hostile(env_with(step=attack + returning('{"r": results}'))))[4]["r"]
    appeared = [p for p in targets if p.exists()]
    for p in appeared:
        p.unlink()
    assert appeared == []
    # Reported to the env code as errors; only its own /tmp may take writes (a private tmpfs).
    assert [r for p, r in zip(targets, results) if p.parent != Path("/tmp")] == [
        "PermissionError" if hostile.layer != "docker" else "OSError"] * 4 or \
        "written" not in [r for p, r in zip(targets, results) if p.parent != Path("/tmp")]


def test_reading_host_files_that_matter(hostile):
    if hostile.layer not in ("docker", "bwrap"):
        pytest.skip(f"on the {hostile.layer} layer the runner may read what its uid may read "
                    "(documented in sandbox/process.py)")
    pid = os.getpid()
    planted = [REPO / f".secret-{pid}", Path(f"/root/.secret-{pid}"), Path(f"/tmp/.secret-{pid}")]
    for p in planted:
        p.write_text(SECRET)
    paths = [str(p) for p in planted] + ["/etc/shadow", f"/proc/{pid}/environ",
                                         "/tmp/envforge-docker/docker.sock", "/var/run/docker.sock"]
    attack = ("import os\nseen = []\nfor p in " + repr(paths) + ":\n    try:\n"
              "        with open(p, 'rb') as f:\n            seen.append(f.read(1 << 16).decode('latin-1'))\n"
              "    except OSError:\n        seen.append(None)\n"
              "for d in os.listdir('/proc'):\n    if d.isdigit():\n        try:\n"
              "            seen.append(open('/proc/' + d + '/environ', 'rb').read().decode('latin-1'))\n"
              "        except OSError:\n            pass\n"
              "seen.append(repr(dict(os.environ)))\n" + returning('{"seen": seen}'))
    try:
        seen = step(hostile(env_with(step=attack)))[4]["seen"]
    finally:
        for p in planted:
            p.unlink()
    assert not [s for s in seen if s and SECRET in s], "a host secret was readable"
    shadow = seen[len(planted)]
    assert shadow is None or "root:" not in shadow or hostile.layer == "docker"  # the image's own
    assert seen[len(planted) + 1] is None  # the host process is not visible


def test_fork_bomb(hostile):
    sb = hostile(env_with(step="import os\nwhile True:\n    os.fork()\n" + END))
    with pytest.raises(EnvCallError) as e:
        step(sb)
    assert e.value.type in ("BlockingIOError", "PermissionError")
    assert sb.ping()


def test_memory_bomb(hostile):
    sb = hostile(env_with(step="blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))"),
                 call_timeout_s=10.0)
    with pytest.raises(EnvCallError) as e:
        step(sb)
    assert e.value.type == "MemoryError"
    assert sb.ping()  # the memory came back


def test_cpu_spin(hostile):
    import time
    sb = hostile(env_with(step="while True:\n    pass"), call_timeout_s=0.5)
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not answer within 0.5 s; "
                                             "the sandbox was killed$"):
        step(sb)
    assert time.monotonic() - t < 2.0
    with pytest.raises(SandboxCrashed, match="closed or killed earlier"):
        sb.ping()


def test_signals_to_the_host_process(hostile):
    attack = (f"import os, signal\nerrors = []\nfor pid in ({os.getpid()}, {os.getppid()}, -1):\n"
              "    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):\n        try:\n"
              "            os.kill(pid, sig)\n            errors.append(None)\n"
              "        except OSError as e:\n            errors.append(type(e).__name__)\n"
              + returning('{"errors": errors}'))
    sb = hostile(env_with(step=attack))
    errors = step(sb)[4]["errors"]
    assert set(errors[:3]) <= {"ProcessLookupError", "PermissionError"}, errors  # this process
    assert sb.ping()  # this test process, its parent and the sandbox are alive


@pytest.mark.parametrize("how", ["reply", "raw-fds", "stderr"])
def test_huge_outputs_on_the_protocol_stream(hostile, how):
    if how == "reply":
        body = returning('{"b": "x" * 50_000_000}')
    elif how == "raw-fds":  # the runner's private protocol fds, found by trying them all
        body = ("import os\nfor fd in range(3, 12):\n    try:\n"
                "        os.write(fd, b'x' * (8 << 20))\n    except OSError:\n        pass\n" + END)
    else:
        body = ("import os\nfor _ in range(100):\n    try:\n        os.write(2, b'y' * (1 << 20))\n"
                "    except OSError:\n        break\n" + END)
    sb = hostile(env_with(step=body), call_timeout_s=10.0)
    if how == "stderr":  # not the protocol: the host keeps a short tail, the protocol holds
        assert step(sb)[1:4] == [0.0, True, False]
        assert sb.ping()
        return
    with pytest.raises(SandboxProtocolError, match="a reply line longer than 4194304 bytes"):
        step(sb)
    assert not sb.transport.alive()


@pytest.mark.parametrize("backend_name", ["process", "docker"])
def test_the_gate_reports_escapes_as_findings(backend_name):
    from envforge.gate.dynamic import GateSettings, run_dynamic
    from tests.envfactory import override
    backend = _process() if backend_name == "process" else _docker()
    hostile = override("""
        def step(self, action):
            import os, socket
            if isinstance(action, dict) and not action.get("tool_calls"):
                while True:  # talk: spin
                    pass
            socket.create_connection(("1.1.1.1", 53), timeout=0.5)
            return _Base.step(self, action)
    """)
    settings = GateSettings(seeds=3, robustness_examples=3, replay_random=1,
                            limits=Limits(call_timeout_s=0.5, memory_mb=512))
    findings, _ = run_dynamic(hostile, backend, settings)
    bounded = [f.message for f in findings if f.check == "bounded"]
    assert bounded and "did not answer within 0.5 s" in bounded[0], findings
    robust = [f.message for f in findings if f.check == "robustness"]
    assert robust and any(t in robust[0] for t in ("PermissionError", "OSError")), robust
    assert processes_marked() == []


def test_a_value_nested_too_deep_is_refused_before_it_reaches_the_caller(hostile):
    """JSON nested hundreds deep (json.dumps takes it) would crash the trainer's deepcopy of the
    messages: the runner refuses it as not JSON enough, and the sandbox lives on."""
    sb = hostile(env_with(step="v = []\nfor _ in range(900):\n    v = [v]\n" + returning('{"deep": v}')))
    with pytest.raises(EnvCallError, match=r"step's info is not JSON: nesting deeper than 60 levels") as e:
        step(sb)
    assert e.value.kind == "json" and sb.ping()
    sb = hostile(env_with(step="v = []\nfor _ in range(50):\n    v = [v]\n" + returning('{"deep": v}')))
    assert step(sb)[4]["deep"]  # 50 levels pass


class Scripted:
    """A transport whose reply to each request is ``answer(request id)``: what a runner that env
    code took over could write on the protocol channel."""

    def __init__(self, answer):
        self.answer, self.killed, self.rid = answer, False, None

    def send(self, data, deadline):
        import json
        self.rid = json.loads(data)["id"]

    def recv_line(self, timeout, max_bytes):
        line = self.answer(self.rid)
        if line is None:
            raise SandboxCrashed("the runner exited")
        return line.encode()

    def kill(self):
        self.killed = True

    stop = kill

    def alive(self):
        return not self.killed

    def describe_exit(self):
        return "exit status 1; stderr: \x1b]0;PWNED\x07"

    def cpu_seconds(self):
        return None


def test_a_forged_reply_nested_too_deep_is_a_protocol_error():
    from sandbox.base import MAX_DEPTH, Sandbox

    def nested(n):
        return "[" * n + "]" * n
    sb = Sandbox(Scripted(lambda rid: '{"id": %d, "ok": true, "value": %s}' % (rid, nested(MAX_DEPTH - 1))),
                 FAST)
    assert sb.ping() is not None and not sb.transport.killed  # MAX_DEPTH deep, the reply's own level counted
    sb = Sandbox(Scripted(lambda rid: '{"id": %d, "ok": true, "value": %s}' % (rid, nested(MAX_DEPTH))),
                 FAST)
    with pytest.raises(SandboxProtocolError, match=f"nested deeper than {MAX_DEPTH} levels"):
        sb.ping()
    assert sb.transport.killed and sb.closed


def test_control_characters_from_a_sandbox_are_printed_as_escapes():
    """An env's error text, traceback and stderr reach the user's terminal through error messages
    and findings: escape sequences in them (window title, screen clear, clipboard) are shown, not
    obeyed."""
    from envforge.contract import Finding
    from sandbox.base import Sandbox
    sb = Sandbox(Scripted(lambda rid: '{"id": %d, "ok": false, "error": {"kind": "env", "type": '
                                      '"Value\\u001bError", "message": "boom \\u001b[2J\\u0007", '
                                      '"traceback": "line 1\\n\\u009b31m"}}' % rid), FAST)
    with pytest.raises(EnvCallError) as e:
        sb.ping()
    assert str(e.value) == "Value\\x1bError: boom \\x1b[2J\\x07"
    assert e.value.traceback == "line 1\n\\x9b31m"  # newlines kept
    finding = Finding("robustness", "error", f"reset raised {e.value}", actual="\x1b[31m")
    assert "\x1b" not in finding.message and finding.actual == "\\x1b[31m"
    sb = Sandbox(Scripted(lambda rid: None), FAST)  # no reply: the runner is gone
    with pytest.raises(SandboxCrashed) as e:
        sb.ping()
    assert "\x1b" not in str(e.value) and "\\x1b]0;PWNED\\x07" in str(e.value)


def test_anonymous_memory_files_are_denied(hostile):
    """memfd pages are not address space: the process sandbox's memory rlimit would not count
    them (a container's memory cgroup does: Docker allows them)."""
    if hostile.backend == "docker":
        pytest.skip("Docker: the container's memory cgroup counts memfd pages")
    from sandbox.process import ProcessBackend
    if "seccomp" not in ProcessBackend().isolation_layers():
        pytest.skip("no seccomp here (pip install pyseccomp)")
    sb = hostile(env_with(step="import os\ntry:\n    os.memfd_create('x')\n    made = 'made'\n"
                               "except OSError as e:\n    made = e.errno\n" + returning('{"made": made}')))
    import errno
    assert step(sb)[4]["made"] == errno.EPERM
