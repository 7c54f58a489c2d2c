"""The Docker sandbox: ``runner.py`` in a long-lived container, driven through the ``docker`` SDK.

One container per sandbox (per worker), from the image that ``sandbox/Dockerfile`` defines
(``envforge sandbox build``; its tag is a hash of the Dockerfile and runner.py, so a changed
runner is never run from a stale image). Every container gets:

- no network (``network_mode=none``: a loopback interface only);
- a read-only root filesystem and one small tmpfs at /tmp (16 MiB, noexec, nosuid, nodev);
- memory: RLIMIT_DATA of ``Limits.memory_mb``, so that an allocation past it raises MemoryError
  inside the env (an ``EnvCallError``), under a cgroup cap of that plus the tmpfs plus 32 MiB with
  no swap (the OOM killer is the backstop); pids: at most 64 in the cgroup, and RLIMIT_NPROC 0
  (set by the runner as uid 10001: no process or thread at all); CPU: a quota of ``cpus`` cores
  and RLIMIT_CPU of ``Limits.cpu_s`` seconds (the runner lowers its soft limit per call); open files and a 1 MiB file size cap;
- a non-root user (uid 10001), every capability dropped, no-new-privileges, a seccomp profile
  of our own (``seccomp_profile``: io_uring, ptrace, user namespaces, TIOCSTI, F_SETOWN/O_ASYNC,
  ... denied), and the ``runtime`` you name, such as gVisor's ``runsc``; an IPC namespace of its
  own with no /dev/shm;
- a watcher as its first process (``watch`` in runner.py), out of the env's reach: it kills the
  runner when the host hangs up, and drains the runner's stderr inside the container's CPU cap
  (so output cannot make dockerd burn CPU outside it);
- on a local engine, the host's idle-CPU check (``Sandbox._check_idle``) reads the container's
  cgroup CPU counter directly (``find_cpu_file``), out of the env's reach; a remote engine has
  only the runner's own check;
- no log driver (output cannot fill the host's disk); the labels ``envforge.sandbox=1``,
  ``envforge.owner`` (``owner()``: hostname, boot id, pid namespace, pid and start time) and any
  given, so leftovers can be found and removed.

The protocol (``sandbox/base.py``) runs over one persistent stream per container, never a
``docker exec`` per call. On a local engine (channel "socket") the container's command connects
to a unix socket in a folder of its own, bind-mounted read-only at /run/envforge, makes it the
runner's stdin and stdout and becomes the runner; the host accepts that one connection and
deletes the socket and its folder (the container keeps an empty read-only mount). No daemon sits
on the path: a round trip costs what the process sandbox's pipe costs. (The runner connects
itself, ``--connect``, before any env code runs.)
Otherwise (channel "attach", for remote engines) requests go to the container's stdin and
replies come back through dockerd in its 8-byte-header frames, several times slower. Either
way the attach stream carries the watcher's stderr (the runner's, capped), whose last 2 KiB are
kept for error messages. When the host closes its end, or dies, the watcher kills the runner and
the container exits.

Cleanup: ``kill()`` force-removes the container; sandboxes still open when the interpreter exits
(after Ctrl-C, or SIGTERM, which exits the same way where nothing else handles it) are removed
by an ``atexit`` hook; containers of a host that was killed outright (SIGKILL, in any pid
namespace) stop at once (the watcher), and the first ``start()`` of a backend removes the
stopped ones that are ``strays()``, as ``envforge sandbox doctor --clean`` does.

Protects against: network access of any kind; writing anywhere but the tmpfs; reading host
files (none are mounted) or other processes' environments, and signalling them (own pid
namespace); fork and thread bombs; memory and CPU beyond the limits (stderr floods and time
between calls included); hangs (the per-call timeout removes the container); print() corrupting
the protocol; huge replies (a protocol error, the container removed); containers outliving
their host.

Does not protect against: kernel exploits (containers share the host kernel; a ``runtime`` like
gVisor narrows that); side channels; denial of service within the limits (many sandboxes at
once load the machine); reading what the image itself holds (it holds nothing secret); and lies:
a reply is data from untrusted code. Whoever can reach the Docker socket is root on the host:
envforge needs that access, env code never gets it.
"""
from __future__ import annotations

import atexit
import datetime
import errno
import functools
import hashlib
import io
import json
import os
import select
import shutil
import signal
import socket
import stat
import struct
import tarfile
import tempfile
import threading
import time
import weakref
from pathlib import Path

from envforge.contract import Limits
from envforge.errors import (SandboxCrashed, SandboxError, SandboxProtocolError, SandboxTimeout,
                             SandboxUnavailable, UsageError)
from envforge.progress import Progress, reporter
from sandbox.base import (DRAIN_S, Backend, LineBuffer, Sandbox, Transport, check_hash_seed,
                          cpu_per_call, poll_spinning, signal_name, write_all)

HERE = Path(__file__).resolve().parent
CONTEXT = ("Dockerfile", "runner.py", "guards.py")  # the image's files (guards.py where present)
REPOSITORY = "envforge-sandbox"
DEFAULT_SOCKET = "/var/run/docker.sock"
TMPFS_MB = 16
HEADROOM_MB = 32
PIDS = 64
MIB = 1 << 20
STDERR_TAIL = 2048
INSTALL_SDK = "pip install 'docker>=7.1'"
LABEL = "envforge.sandbox"
OWNER = "envforge.owner"
STRAY_AFTER_S = 60.0


@functools.cache
def image_tag() -> str:
    """``envforge-sandbox:<hash of the Dockerfile and runner.py>``: the image this code runs."""
    digest = hashlib.sha256()
    for name in _context():
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return f"{REPOSITORY}:{digest.hexdigest()[:12]}"


def _context() -> list[str]:
    return [name for name in CONTEXT if (HERE / name).is_file()]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _started(pid: int | str) -> str:
    """When process ``pid`` started, in clock ticks since boot ("?" when it is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if ")" in stat else "?"


def owner(pid: int | None = None) -> str:
    """Who owns a container, unique on this machine across pid namespaces and over time:
    ``<hostname>/<boot id>/<pid namespace>/<pid>/<start time>``."""
    pid = os.getpid() if pid is None else pid
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return "/".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), namespace,
                     str(pid), _started(pid)))


def owner_gone(label: str) -> bool:
    """Whether the owner named by an ``owner()`` label is certainly gone: a process of this
    machine's boot, in this pid namespace, no longer running (or its pid reused); or an owner on
    this machine (same hostname) in an earlier boot. An owner elsewhere, or in another pid
    namespace, cannot be told from here: never gone (its containers stop by themselves when it
    dies; see ``watch`` in runner.py)."""
    parts = label.split("/")
    if len(parts) != 5:
        return False
    host, boot, namespace, pid, started = parts
    mine = owner().split("/")
    if host != mine[0] or boot != mine[1]:
        return host == mine[0] and boot != mine[1] and "?" not in (boot, mine[1])
    return namespace == mine[2] and pid.isdigit() and (
        not _pid_alive(int(pid)) or _started(pid) != started)


def _sdk():
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable(f"the docker SDK is not installed: {INSTALL_SDK}") from None
    return docker


def _engine_problem(e: BaseException) -> str:
    """Why the engine did not answer, and the fix."""
    where = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    text, cause = str(e), e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, PermissionError) or "Permission denied" in text:
        return (f"permission denied on the Docker socket ({where}): add your user to the docker "
                "group (usermod -aG docker $USER, then log in again), run as root, or set "
                "DOCKER_HOST to an engine you may use")
    return (f"the Docker engine at {where} does not answer ({text[:160]}): start it "
            "(systemctl start docker, or dockerd &) or point DOCKER_HOST at a running engine")


def client(timeout: float = 30.0):
    """A docker client for $DOCKER_HOST (or the default socket) that answered a ping.

    Raises SandboxUnavailable naming the fix: no SDK, no engine, no permission, no answer.
    """
    docker = _sdk()
    if not os.environ.get("DOCKER_HOST") and not os.path.exists(DEFAULT_SOCKET):
        raise SandboxUnavailable(
            f"no Docker engine here (DOCKER_HOST is unset and {DEFAULT_SOCKET} does not exist): "
            "install one (apt-get install docker.io) and start it (systemctl start docker), or "
            "set DOCKER_HOST to a running engine")
    try:
        c = docker.from_env(timeout=timeout)
        c.ping()
    except Exception as e:  # DockerException, requests' ConnectionError, PermissionError
        raise SandboxUnavailable(_engine_problem(e)) from None
    return c


def build_image(base: str | None = None, tag: str | None = None,
                progress: Progress | None = None) -> str:
    """Build the sandbox image from sandbox/Dockerfile; returns its tag (by default
    ``image_tag()``, then also tagged ``latest``).

    ``base`` overrides the Dockerfile's ``ARG BASE`` (default python:3.12-slim, which needs a
    registry). The build context is only the Dockerfile and runner.py; RUN steps get no network.
    ``progress`` gets a ``Step`` (``envforge.progress``) per line of the build's log.
    """
    docker = _sdk()
    c = client(timeout=600)
    default, tag = tag is None, tag or image_tag()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name in _context():
            tar.add(HERE / name, arcname=name)
    context.seek(0)
    say = reporter(progress)
    try:
        image, logs = c.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                                     forcerm=True, network_mode="none",
                                     buildargs={"BASE": base} if base else None)
    except docker.errors.BuildError as e:
        log = "".join(str(x.get("stream") or x.get("error") or "") for x in e.build_log)
        raise SandboxUnavailable(f"building {tag} failed: {e.msg}. {_base_hint(base)}\n"
                                 f"{log[-1500:]}") from None
    except docker.errors.APIError as e:
        raise SandboxUnavailable(f"building {tag} failed: {e.explanation or e}. "
                                 f"{_base_hint(base)}") from None
    for entry in logs:
        if entry.get("stream", "").strip():
            say(entry["stream"].rstrip())
    if default:
        image.tag(REPOSITORY, "latest")
    return tag


def _base_hint(base: str | None) -> str:
    if base:
        return f"Is {base} an image on this engine, with python3 >= 3.11 on its PATH?"
    return ("The default base python:3.12-slim comes from a registry; without one, build a base "
            "image offline and pass --base (see sandbox/Dockerfile).")


# --------------------------------------------------------------------------- the transport

SOCKET_PATH = "/run/envforge/runner.sock"


def seccomp_profile() -> str:
    """The containers' seccomp profile (JSON, as ``--security-opt seccomp=``): allow by default,
    EPERM for the kernel surface and the argument rules that the process sandbox denies too
    (``KERNEL`` and ``ARGUMENT_RULES`` in runner.py: io_uring, ptrace, bpf, user namespaces,
    TIOCSTI, F_SETOWN/F_SETSIG/O_ASYNC, ...). Processes, sockets and files are left to the
    container's own limits (pids cap, no network, read-only root)."""
    from sandbox.runner import ARGUMENT_RULES, KERNEL
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules = [{"names": list(KERNEL), **deny}]
    rules += [{"names": [name], **deny,
               "args": [{"index": i, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}
                        for i, mask, value in conditions]} for name, conditions in ARGUMENT_RULES]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules})


_LIVE: "weakref.WeakSet[ContainerTransport]" = weakref.WeakSet()


@atexit.register
def _remove_live() -> None:
    for transport in list(_LIVE):
        transport.kill()


def _exit_on_sigterm() -> None:
    """SIGTERM, where nothing else handles it, is handled like Ctrl-C (a KeyboardInterrupt):
    through the calls' cleanup and the atexit hook that removes the containers (its default
    would skip both)."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


class ContainerTransport(Transport):
    """The protocol stream of one container, and its stderr.

    Channel "socket": a unix socket the runner connected to through a read-only bind mount; the
    attach stream carries only stdout/stderr. Channel "attach": the attach stream carries it all
    (requests on stdin; replies and stderr multiplexed in Docker's 8-byte-header frames).
    """

    def __init__(self, api, container_id: str):
        self.api, self.id = api, container_id
        self._attach_io = self._attach = self._data = None
        self._frames, self._out, self._err = bytearray(), LineBuffer(), bytearray()
        self._eof = self._killed = self._attach_eof = False
        self.sock_dir: str | None = None
        self.cpu_file: str | None = None  # the container's cgroup CPU counter (find_cpu_file)
        _LIVE.add(self)

    def find_cpu_file(self) -> None:
        """On a local engine, the file where the kernel counts the CPU time of the container's
        cgroup (cgroup v2 ``cpu.stat``, v1 ``cpuacct.usage``), found through /proc of its first
        process, to be read from the host, outside the env's reach. None when the engine is
        remote (its pid is no process here that lives in this container's cgroup)."""
        try:
            pid = self.api.inspect_container(self.id)["State"]["Pid"]
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except Exception:
            return
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if self.id not in path:  # a process of this machine, not of this container
                continue
            path = path.lstrip("/")
            if controllers == "":  # cgroup v2 (or v1's unified tree)
                found = [f"/sys/fs/cgroup/{path}/cpu.stat", f"/sys/fs/cgroup/unified/{path}/cpu.stat"]
            elif "cpuacct" in controllers.split(","):
                found = [f"/sys/fs/cgroup/{controllers}/{path}/cpuacct.usage"]
            else:
                continue
            for file in found:
                self.cpu_file = file
                if self.cpu_seconds() is not None:
                    return
        self.cpu_file = None

    def cpu_seconds(self) -> float | None:
        """CPU seconds the container's cgroup has used so far (None without ``cpu_file``)."""
        if self.cpu_file is None:
            return None
        try:
            with open(self.cpu_file, "rb") as f:
                text = f.read()
        except OSError:
            return None
        if text.startswith(b"usage_usec"):  # cgroup v2's cpu.stat: microseconds
            return int(text.split(None, 2)[1]) / 1e6
        return int(text) / 1e9 if text.strip().isdigit() else None  # v1's cpuacct.usage: ns

    def attach(self, stdin: bool) -> None:
        """Open the attach stream (before the container starts: no output is missed)."""
        self._attach_io = self.api.attach_socket(self.id, params={
            "stdin": int(stdin), "stdout": 1, "stderr": 1, "stream": 1})
        self._attach = getattr(self._attach_io, "_sock", self._attach_io)
        self._attach.setblocking(False)
        if stdin:
            self._data = self._attach
        self._watch()

    def connected(self, data: socket.socket) -> None:
        data.setblocking(False)
        self._data = data
        self._watch()

    def _watch(self) -> None:
        """The poller recv_line waits on: the protocol stream, and stderr while it is open."""
        self._socks = {s.fileno(): s for s in (self._data, self._attach)
                       if s is not None and not (s is self._attach and self._attach_eof)}
        self._poller = select.poll()
        for fd in self._socks:
            self._poller.register(fd, select.POLLIN)

    def send(self, data: bytes, deadline: float) -> None:
        write_all(self._data.send, self._data.fileno(), data, deadline)

    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        deadline = time.monotonic() + timeout
        while (line := self._out.pop_line(max_bytes)) is None:
            ready = poll_spinning(self._poller, deadline - time.monotonic())
            if not ready:
                raise SandboxTimeout(f"no reply within {timeout:g} s")
            for fd, _ in ready:
                sock = self._socks[fd]
                try:
                    chunk = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError as e:
                    raise SandboxCrashed(f"reading the runner's stream failed: {e}") from None
                if sock is self._attach:
                    if not chunk and sock is self._data:
                        self._eof = True
                        raise SandboxCrashed("the runner exited")
                    if not chunk:  # the runner exits; its socket will tell
                        self._attach_eof = True
                        self._watch()
                    self._demux(chunk)
                elif not chunk:
                    self._eof = True
                    raise SandboxCrashed("the runner exited")
                else:
                    line = self._out.add(chunk, max_bytes)
                    if line is not None:
                        return line
            if time.monotonic() >= deadline + DRAIN_S:  # a trickle: not for ever
                line = self._out.pop_line(max_bytes)  # (a line demuxed just now is in)
                if line is None:
                    raise SandboxTimeout(f"no reply within {timeout:g} s")
                return line
        return line

    def _demux(self, chunk: bytes) -> None:
        """Split Docker's frames (1 byte stream, 3 zero, 4 bytes big-endian size, payload)."""
        self._frames += chunk
        while len(self._frames) >= 8:
            stream, size = struct.unpack_from(">BxxxL", self._frames)
            if len(self._frames) < 8 + size:
                break
            payload = self._frames[8:8 + size]
            del self._frames[:8 + size]
            if stream == 1 and self._data is self._attach:
                self._out += payload
            else:
                self._err = (self._err + payload)[-STDERR_TAIL:]

    def _state(self) -> dict | None:
        try:
            return self.api.inspect_container(self.id)["State"]
        except Exception:
            return None

    def alive(self) -> bool:
        if self._killed or self._eof:
            return False
        state = self._state()
        return bool(state and state.get("Running"))

    def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        _LIVE.discard(self)
        for sock in {self._data, self._attach} - {None}:
            for close in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
                try:
                    close()
                except OSError:
                    pass
        try:
            self._attach_io and self._attach_io.close()
        except Exception:
            pass
        try:
            self.api.remove_container(self.id, force=True)
        except Exception:  # gone already, or its removal is under way; reap() is the backstop
            pass
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.kill()
        except Exception:
            pass

    def _drain_stderr(self, seconds: float) -> None:
        """Read what is left of the attach stream (on the socket channel the runner's stderr
        may arrive after its socket closed)."""
        deadline = time.monotonic() + seconds
        while self._attach is not None and not self._attach_eof and not self._killed:
            if not _ready([self._attach], select.POLLIN, deadline - time.monotonic()):
                return
            try:
                chunk = self._attach.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                return
            self._attach_eof = not chunk
            self._demux(chunk)

    def describe_exit(self) -> str:
        if self._eof and self._data is not self._attach:
            self._drain_stderr(1.0)
        state, deadline = self._state(), time.monotonic() + (1.0 if self._eof else 0.0)
        while state and state.get("Running") and time.monotonic() < deadline:
            time.sleep(0.02)
            state = self._state()
        parts = []
        if state and not state.get("Running"):
            code = state.get("ExitCode")
            signalled = f" ({signal_name(code - 128)}?)" if isinstance(code, int) and code > 128 else ""
            parts.append(f"exit status {code}{signalled}")
            if state.get("OOMKilled"):
                parts.append("killed by the out-of-memory killer: the container's memory cap "
                             "was reached")
        tail = self._err.decode("utf-8", "replace").strip()
        if tail:
            parts.append("stderr: " + tail[-600:])
        return "; ".join(parts)


def _ready(socks: list, event: int, seconds: float) -> list:
    if seconds <= 0:
        return []
    poller = select.poll()
    for sock in socks:
        poller.register(sock, event)
    fds = {fd for fd, _ in poller.poll(seconds * 1000)}
    return [sock for sock in socks if sock.fileno() in fds]


# --------------------------------------------------------------------------- the backend

CHANNELS = ("auto", "socket", "attach")


def _sock_dir() -> str:
    """A fresh folder for one runner socket, inside this user's private (0700) folder
    ``$TMPDIR/envforge-sockets-<uid>``, so that no other local user can reach the socket."""
    parent = os.path.join(tempfile.gettempdir(), f"envforge-sockets-{os.geteuid()}")
    try:
        os.mkdir(parent, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxUnavailable(f"{parent} is not a private folder of this user (0700); remove "
                                 "it, or use DockerBackend(channel='attach')")
    path = tempfile.mkdtemp(dir=parent)
    os.chmod(path, 0o711)  # the container's uid may pass through to the socket, not list
    return path


class DockerBackend(Backend):
    """Runner containers on a Docker engine; see the module docstring for what they do.

    ``channel``: how requests and replies travel. "socket": a unix socket in a per-container
    folder bind-mounted read-only at /run/envforge (the runner connects before any env code
    runs; the host accepts one connection, then deletes the socket file), no daemon on the
    path: a round trip costs what a pipe costs. "attach": the container's attach stream, through
    dockerd (several times slower; works with remote engines). "auto": socket when the engine
    runs on this machine, else attach.
    """

    name = "docker"

    def __init__(self, image: str | None = None, cpus: float = 1.0, pids: int = PIDS,
                 tmpfs_mb: int = TMPFS_MB, labels: dict[str, str] | None = None,
                 runtime: str | None = None, channel: str = "auto"):
        if cpus <= 0 or pids < 8 or tmpfs_mb < 1:
            raise UsageError("DockerBackend needs cpus > 0, pids >= 8 and tmpfs_mb >= 1")
        if channel not in CHANNELS:
            raise UsageError(f"unknown channel {channel!r}; choose {', '.join(CHANNELS)}")
        self.image, self.cpus, self.pids, self.tmpfs_mb = image or image_tag(), cpus, pids, tmpfs_mb
        self.labels = {LABEL: "1", **(labels or {})}
        self.runtime, self.channel = runtime, channel
        self._client = None
        self._reaped = False

    def client(self):
        if self._client is None:
            self._client = client()
        return self._client

    def resolved_channel(self) -> str:
        """"socket" or "attach": what ``channel`` means with this engine."""
        if self.channel != "auto":
            return self.channel
        host = os.environ.get("DOCKER_HOST", "unix://")
        try:
            local = host.startswith("unix://") and self.client().info().get("Name") == socket.gethostname()
        except Exception:
            local = False
        self.channel = "socket" if local else "attach"
        return self.channel

    def available(self) -> tuple[bool, str]:
        try:
            api = self.client().api
            version = api.version().get("Version", "?")
        except SandboxUnavailable as e:
            return False, str(e)
        except Exception as e:
            return False, _engine_problem(e)
        docker = _sdk()
        try:
            api.inspect_image(self.image)
        except docker.errors.ImageNotFound:
            return False, (f"the sandbox image {self.image} is missing on the Docker engine "
                           f"{version}: run `envforge sandbox build` (offline: --base IMAGE, "
                           "see sandbox/Dockerfile)")
        except Exception as e:
            return False, _engine_problem(e)
        return True, (f"docker sandbox: engine {version}, image {self.image}, "
                      f"{self.resolved_channel()} channel, no network, read-only root, "
                      f"{self.tmpfs_mb} MiB tmpfs, {self.cpus:g} CPU, {self.pids} pids, no "
                      "capabilities, no-new-privileges, uid 10001")

    def strays(self) -> list[dict]:
        """Sandbox containers on this engine that nobody will remove: their owner is certainly
        gone (see ``owner_gone``), or they stopped over STRAY_AFTER_S ago (an owner removes its
        stopped sandboxes at once). [{"id", "owner", "state", "why"}]"""
        api, found = self.client().api, []
        for c in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
            label = (c.get("Labels") or {}).get(OWNER, "")
            why = "its owner is gone" if owner_gone(label) else None
            if why is None and c.get("State") != "running":
                stopped = _stopped_for(api, c["Id"])
                if stopped is not None and stopped > STRAY_AFTER_S:
                    why = f"stopped {stopped:.0f} s ago"
            if why:
                found.append({"id": c["Id"], "owner": label, "state": c.get("State", "?"),
                              "why": why})
        return found

    def clean(self) -> list[dict]:
        """Remove the ``strays()``; returns them, each with "removed" (False when that failed)."""
        api, found = self.client().api, self.strays()
        for stray in found:
            try:
                api.remove_container(stray["id"], force=True)
                stray["removed"] = True
            except Exception:  # removed meanwhile, or the engine refused
                stray["removed"] = False
        return found

    def reap(self) -> list[str]:
        """Remove the ``strays()``; returns the ids removed."""
        return [stray["id"] for stray in self.clean() if stray["removed"]]

    def host_config(self, limits: Limits, sock_dir: str | None) -> dict:
        docker = _sdk()
        ulimit = docker.types.Ulimit
        memory = f"{limits.memory_mb + self.tmpfs_mb + HEADROOM_MB}m"
        return self.client().api.create_host_config(
            network_mode="none", read_only=True, cap_drop=["ALL"],
            security_opt=["no-new-privileges", f"seccomp={seccomp_profile()}"],
            runtime=self.runtime, ipc_mode="none",  # own IPC namespace, no /dev/shm
            tmpfs={"/tmp": f"size={self.tmpfs_mb}m,mode=1777,noexec,nosuid,nodev"},
            binds={sock_dir: {"bind": "/run/envforge", "mode": "ro"}} if sock_dir else None,
            mem_limit=memory, memswap_limit=memory, pids_limit=self.pids,
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[ulimit(name="data", soft=limits.memory_mb * MIB, hard=limits.memory_mb * MIB),
                     ulimit(name="cpu", soft=limits.cpu_s, hard=limits.cpu_s),
                     ulimit(name="nofile", soft=limits.max_open_files, hard=limits.max_open_files),
                     ulimit(name="fsize", soft=MIB, hard=MIB), ulimit(name="core", soft=0, hard=0)],
            log_config=docker.types.LogConfig(type="none"))

    def start(self, limits: Limits, hash_seed: int = 0) -> Sandbox:
        check_hash_seed(hash_seed)
        docker = _sdk()
        api = self.client().api
        if not self._reaped:
            self._reaped = True
            _exit_on_sigterm()
            self.reap()
        via_socket = self.resolved_channel() == "socket"
        sock_dir = _sock_dir() if via_socket else None
        listener = None
        try:
            if via_socket:
                listener = socket.socket(socket.AF_UNIX)
                listener.bind(os.path.join(sock_dir, "runner.sock"))
                os.chmod(os.path.join(sock_dir, "runner.sock"), 0o666)
                listener.listen(1)
            created = api.create_container(
                self.image, stdin_open=not via_socket, tty=False, user="10001:10001",
                command=(["--connect", SOCKET_PATH] if via_socket else [])
                + ["--watch", "--cpu", cpu_per_call(limits)],
                environment={"PYTHONHASHSEED": str(hash_seed), "LANG": "C.UTF-8",
                             "PATH": "/usr/local/bin:/usr/bin:/bin"},
                labels={**self.labels, OWNER: owner()},
                host_config=self.host_config(limits, sock_dir))
        except docker.errors.ImageNotFound:
            _cleanup(listener, sock_dir)
            raise SandboxUnavailable(f"the sandbox image {self.image} is missing: run `envforge "
                                     "sandbox build` (offline: --base IMAGE, see "
                                     "sandbox/Dockerfile)") from None
        except BaseException as e:
            _cleanup(listener, sock_dir)
            if isinstance(e, Exception):
                raise SandboxUnavailable(f"cannot create a sandbox container: {e}") from None
            raise
        transport = ContainerTransport(api, created["Id"])
        transport.sock_dir = sock_dir
        sandbox = Sandbox(transport, limits, backend=f"docker/{self.channel}")
        try:
            transport.attach(stdin=not via_socket)
            api.start(created["Id"])
            if via_socket:
                listener.settimeout(limits.load_timeout_s)
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    raise SandboxUnavailable(
                        f"the runner did not connect within {limits.load_timeout_s:g} s "
                        f"({transport.describe_exit() or 'no output'}); if the engine cannot see "
                        f"this machine's {sock_dir}, use DockerBackend(channel='attach')") from None
                transport.connected(conn)
                _cleanup(listener, sock_dir)  # the container keeps its (now empty) mount
            if not sandbox.ping(timeout=limits.load_timeout_s):
                raise SandboxProtocolError("the runner's first ping was not answered 'pong'")
            transport.find_cpu_file()
        except BaseException as e:  # Ctrl-C included: nothing of this container may stay
            _cleanup(listener, None)
            sandbox.kill()
            if isinstance(e, SandboxUnavailable) or not isinstance(e, Exception):
                raise
            what = ("the runner did not start in its container" if isinstance(e, SandboxError)
                    else "cannot start a sandbox container")
            raise SandboxUnavailable(f"{what}: {e}") from None
        return sandbox


def _cleanup(listener: socket.socket | None, sock_dir: str | None) -> None:
    if listener is not None:
        listener.close()
    if sock_dir:
        shutil.rmtree(sock_dir, ignore_errors=True)


def _stopped_for(api, container_id: str) -> float | None:
    """Seconds since the container stopped (None when unknown or still running)."""
    try:
        finished = api.inspect_container(container_id)["State"]["FinishedAt"][:19]
        when = datetime.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=datetime.timezone.utc)
    except Exception:
        return None
    if when.year < 2000:  # never started: Docker's zero time
        return None
    return (datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as e:
        return e.errno == errno.EPERM
    return True
