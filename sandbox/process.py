"""The local process sandbox: ``runner.py`` in a child process, behind the strongest isolation
this machine offers. Linux only; no daemon.

Isolation layers, strongest first. ``isolation="auto"`` takes the first that works here; each is
probed once per host process by running the interpreter behind it (5 s limit).

- ``bwrap``: bubblewrap, every namespace new (no network; own pids, ipc, uts, user, cgroup), no
  capabilities, uid/gid 65534 in its user namespace (where the kernel allows; else the caller's
  uid), a new session, a read-only root holding only what the interpreter needs (its prefixes,
  /usr, the library dirs, /etc/ld.so.cache, runner.py), its own /dev and a private /tmp. Host
  files such as /root, /home, /etc/shadow and the repository do not exist in there.
- ``unshare``: util-linux unshare, new network, pid, ipc, uts and mount namespaces (no network;
  host processes invisible). Root drops to uid/gid 65534, and where that user cannot run the
  interpreter the layer is refused (never root: it would keep capabilities and see the host's
  /dev and terminals); a non-root user keeps its uid in a user namespace. The host's files stay
  visible: seccomp is what stops writes.
- ``none``: no namespaces; seccomp alone isolates, so this layer needs it.

Every layer adds: a clean environment (PYTHONHASHSEED, PATH, LANG), cwd /, a session of its own
(kill() takes the process group), rlimits (CPU seconds, per call: see runner.py; address space,
1 MiB files, open files, no core dumps), no_new_privs; and, when pyseccomp and libseccomp are
installed, the runner's seccomp filter, loaded before any env code (see runner.py): among others no new process or
thread (root included, whom RLIMIT_NPROC does not bind), no TIOCSTI, no F_SETOWN/F_SETSIG/O_ASYNC
(signals to the host through a shared pipe). Between calls no env code runs (see ``serve`` in
runner.py). The runner also sets RLIMIT_NPROC to 0, which binds non-root users only.

Messages cross over shared memory where the machine allows it (``channel="auto"``: Linux on
x86-64; see ``SharedTransport``): a step is a memory copy and a sequence number each way, with no
system call on its path, and a bell (a byte on a pipe) wakes a side that stopped spinning. The
memfd is sealed at its size, so the runner cannot shrink it under the host's mapping (env code
can find the runner's descriptor: its mapping keeps one), and the host copies a reply out before
it reads it, checking its length: a runner that scribbles on the memory, rings or fills the bells
or writes the pipe only lies, like any other reply, within the call's time limit (the host's
ends of the pipes are its own open files, non-blocking whatever the runner does to its ends).
``channel="pipe"`` keeps every message on the pipes.

Protects against (with seccomp, on every layer): network access; starting processes or programs,
fork bombs included; writing, deleting or renaming host files; signalling or tracing other
processes; mounts and id changes; hangs (the per-call timeout kills the process group); memory
and CPU use beyond the limits; print() corrupting the protocol. bwrap without seccomp still stops
the network, host-file writes and host-file reads, and keeps forks inside its pid namespace.

Does not protect against: kernel exploits (seccomp narrows the surface, no more); CPU-cache and
other side channels; reading files visible in the namespace: without bwrap, every file the
runner's uid may read (as root, all of them, /etc/shadow included), and on ``none`` also other
processes' /proc entries (their environment variables: API keys); without seccomp, on unshare or
none, writing files the runner's uid may write (on bwrap, filling its private /tmp); denial of
service within its limits (a sandbox may burn its CPU seconds and fill its memory cap, and many
at once load the machine); and lies: a reply is data from untrusted code, whatever it says.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import platform
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envforge.contract import Limits
from envforge.errors import (SandboxCrashed, SandboxError, SandboxProtocolError, SandboxTimeout,
                             SandboxUnavailable, UsageError)
from sandbox.base import (DRAIN_S, SPIN_S, Backend, LineBuffer, Sandbox, Transport, calls_in_flight,
                          check_hash_seed, cpu_per_call, poll_spinning, signal_name, warn_once, write_all)
from sandbox.runner import BELL, SHM_CAPACITY, SHM_HEADER, SHM_OVERSIZE, SHM_REGION

RUNNER = str(Path(__file__).resolve().with_name("runner.py"))
LAYERS = ("bwrap", "unshare", "none")
NOBODY = "65534"
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
CAPABILITY_VERSION_3 = 0x20080522
MIB = 1 << 20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROBE_TIMEOUT_S = 5.0
#: how long the runner's interpreter may take to import pyseccomp when asked (once per process)
IMPORT_PROBE_S = 30.0
ENV_BASE = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
HOW_TO = "install bubblewrap (apt-get install bubblewrap) and pyseccomp (pip install pyseccomp)"


class PipeTransport(Transport):
    """The runner's stdin/stdout pipes; its stderr goes to a host temp file (tail kept)."""

    def __init__(self, proc: subprocess.Popen, stderr_file):
        self.proc, self._err = proc, stderr_file
        self._in, self._out = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._poll_out = select.poll()
        self._poll_out.register(self._out, select.POLLIN)
        self._buf = LineBuffer()
        self._eof = self._killed = False
        self._tail = ""

    def send(self, data: bytes, deadline: float) -> None:
        try:
            sent = os.write(self._in, data)  # the usual case: the pipe has room for it all
        except OSError:  # full (BlockingIOError) or gone: write_all waits, or says which
            sent = 0
        if sent < len(data):
            write_all(functools.partial(os.write, self._in), self._in, memoryview(data)[sent:],
                      deadline)

    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        line = self._buf.pop_line(max_bytes) if self._buf.data else None
        deadline = time.monotonic() + timeout
        while line is None:
            if not poll_spinning(self._poll_out, deadline - time.monotonic()):
                raise SandboxTimeout(f"no reply within {timeout:g} s")
            try:
                chunk = os.read(self._out, 1 << 16)
            except OSError as e:
                raise SandboxCrashed(f"reading the runner's output failed: {e}") from None
            if not chunk:
                self._eof = True
                raise SandboxCrashed("the runner exited")
            line = self._buf.add(chunk, max_bytes)
            if line is None and time.monotonic() >= deadline + DRAIN_S:  # a trickle: not for ever
                raise SandboxTimeout(f"no reply within {timeout:g} s")
        return line

    def _status(self) -> int | None:
        """The exit status without reaping (negative: killed by that signal), None if running."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def alive(self) -> bool:
        return not self._killed and self._status() is None

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by the runner and every process under the one started (bwrap
        and unshare put the runner a level or two down), from /proc."""
        total, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                        todo += map(int, f.read().split())
            except (OSError, ValueError, IndexError):  # gone meanwhile, or no children file
                continue
        return total / CLOCK_TICKS

    def stop(self) -> None:
        for send in (os.killpg, os.kill) if self.proc.returncode is None else ():  # not reaped
            try:
                send(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        self.stop()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 2.0  # EOF once every process holding the pipe is gone
        waiter = select.poll()  # its own: a call in another thread may be polling _poll_out
        waiter.register(self._out, select.POLLIN)
        while waiter.poll(max(0.0, deadline - time.monotonic()) * 1000):
            try:
                if not os.read(self._out, 1 << 16):
                    break
            except OSError:
                break
        self._tail = self._stderr_tail()
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            try:
                f.close()
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.kill()
        except Exception:
            pass

    def _stderr_tail(self, limit: int = 1500) -> str:
        if self._killed and self._err.closed:
            return self._tail
        try:
            size = os.fstat(self._err.fileno()).st_size
            data = os.pread(self._err.fileno(), limit, max(0, size - limit))
        except (OSError, ValueError):
            return ""
        return data.decode("utf-8", "replace").strip()

    def describe_exit(self) -> str:
        deadline = time.monotonic() + (0.5 if self._eof else 0.0)
        status = self._status()
        while status is None and time.monotonic() < deadline:
            time.sleep(0.01)
            status = self._status()
        parts = []
        if status is not None and status < 0:
            parts.append(f"killed by {signal_name(-status)}")
        elif status is not None and status > 128:  # a wrapper reporting its child's signal
            parts.append(f"exit status {status} ({signal_name(status - 128)}?)")
        elif status is not None:
            parts.append(f"exit status {status}")
        tail = self._stderr_tail()
        if tail:
            parts.append("stderr: " + tail[-600:])
        return "; ".join(parts)


class SharedTransport(PipeTransport):
    """The runner's pipes plus a shared-memory channel (see SHM_REGION in runner.py): a message
    crosses as a memory copy and a sequence number, no system call on the way; the bells (pipes)
    wake a side that blocked, and the pipes carry oversize messages and the runner's exit."""

    def __init__(self, proc: subprocess.Popen, stderr_file, mem: mmap.mmap, bells: tuple[int, int]):
        super().__init__(proc, stderr_file)
        self._mem, self._words = mem, memoryview(mem).cast("Q")
        self._bell_in, self._bell_out = bells
        self._poll_wait = select.poll()  # the bell and the pipe (_poll_out: the pipe alone)
        for fd in (self._out, self._bell_out):
            self._poll_wait.register(fd, select.POLLIN)
        self._seq = 0

    def send(self, data: bytes, deadline: float) -> None:
        self._seq = seq = self._seq + 1
        size, words = len(data) - 1, self._words  # data is one line: its newline stays out
        if size <= SHM_CAPACITY:
            self._mem[SHM_HEADER:SHM_HEADER + size] = memoryview(data)[:size]
            words[1] = size
        else:
            words[1] = SHM_OVERSIZE
        words[0] = seq
        try:
            os.write(self._bell_in, BELL)
        except BlockingIOError:  # full (filled by the runner, or never emptied): it rings
            pass
        except OSError as e:
            raise SandboxCrashed(f"the sandbox's bell is gone ({e})") from None
        if size > SHM_CAPACITY:
            super().send(data, deadline)

    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        words, at, seq, deadline = self._words, SHM_REGION // 8, self._seq, None
        if words[at] != seq:
            alone = calls_in_flight() == 1
            if alone:  # spin on the memory: holds the GIL, so only with no other call waiting
                end = time.perf_counter() + min(SPIN_S, timeout)
                while words[at] != seq and time.perf_counter() < end:
                    pass  # (releasing the GIL each turn, sched_yield, cost ~1 µs a step)
            if words[at] != seq:  # else spin on the bell, releasing the GIL, where that pays
                deadline = self._block(at, seq, timeout, max_bytes, spin=not alone)
        size = words[at + 1]
        if size == SHM_OVERSIZE:  # the rest of the call's time for the line on the pipe
            left = timeout if deadline is None else deadline - time.monotonic()
            return super().recv_line(max(left, 0.0), max_bytes)
        if size > min(max_bytes, SHM_CAPACITY):
            raise SandboxProtocolError(f"a reply line longer than {min(max_bytes, SHM_CAPACITY)} "
                                       f"bytes in shared memory ({size})")
        start = SHM_REGION + SHM_HEADER
        return self._mem[start:start + size]

    def _block(self, at: int, seq: int, timeout: float, max_bytes: int, spin: bool) -> float:
        """Wait on the runner's bell until reply ``seq`` is in, within ``timeout`` (from now: the
        spin before it is at most SPIN_S); its pipe tells when the runner exits. ``spin``: poll
        without blocking first, as ``poll_spinning`` decides. Returns the deadline."""
        deadline = time.monotonic() + timeout
        while self._words[at] != seq:
            left = deadline - time.monotonic()
            ready = poll_spinning(self._poll_wait, left, None if spin else 0.0) if left > 0 else []
            if not ready:
                raise SandboxTimeout(f"no reply within {timeout:g} s")
            for fd, _ in ready:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:  # the bell, already reset
                    continue
                except OSError as e:
                    raise SandboxCrashed(f"reading the runner's output failed: {e}") from None
                if fd == self._out and not chunk:
                    self._eof = True
                    raise SandboxCrashed("the runner exited")
                if fd == self._out:  # an oversize reply, its number about to show
                    self._buf.data += chunk
                    if len(self._buf.data) > max_bytes:
                        raise SandboxProtocolError(f"a reply line longer than {max_bytes} bytes")
        return deadline

    def __del__(self) -> None:
        """The bells and the memory go with the last reference, never in kill(): a call in
        another thread may still be using them, and a closed fd's number is soon reused."""
        super().__del__()
        try:
            for fd in (self._bell_in, self._bell_out):
                os.close(fd)
            self._words.release()
            self._mem.close()
        except Exception:  # a half-made transport, or closed already
            pass


# --------------------------------------------------------------------------- starting runners

def _rlimits(limits: Limits) -> list[tuple[int, int]]:
    wanted = [(resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * MIB),
              (resource.RLIMIT_FSIZE, MIB), (resource.RLIMIT_NOFILE, limits.max_open_files),
              (resource.RLIMIT_CORE, 0)]
    out = []
    for res, value in wanted:  # never ask for more than the current hard limit
        hard = resource.getrlimit(res)[1]
        out.append((res, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return out


def _preexec(limits: Limits, drop_capabilities: bool = False):
    """The child's last steps before exec: rlimits and no_new_privs (nothing that may lock); with
    ``drop_capabilities`` (layer none), an empty bounding and inheritable set, so that the
    program exec'd keeps no capability even as root."""
    rlimits = _rlimits(limits)
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    header, data = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()

    def preexec() -> None:
        for res, value in rlimits:
            resource.setrlimit(res, (value, value))
        if drop_capabilities and os.geteuid() == 0:
            for cap in range(64):
                prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one
            if libc.capget(header, data) != 0:
                raise OSError(ctypes.get_errno(), "capget failed")
            data[2] = data[5] = 0  # inheritable
            if libc.capset(header, data) != 0:
                raise OSError(ctypes.get_errno(), "capset failed")
        if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        # Die with the thread that started us (a killed envforge leaves no sandbox behind);
        # so a sandbox must be started from a thread that outlives it.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return preexec


def _env(hash_seed: int) -> dict[str, str]:
    return {"PYTHONHASHSEED": str(hash_seed), **ENV_BASE}


def _bwrap_prefix(bwrap: str, uid: bool = True) -> list[str]:
    """bwrap's command line; ``uid``: run as uid/gid 65534 in its user namespace (no root)."""
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/"]
    if uid:
        args[1:1] = ["--unshare-user", "--uid", NOBODY, "--gid", NOBODY]
    for path in ("/usr", "/etc/ld.so.cache", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    for path in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind-try", path, path]
    interpreter = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                   str(Path(os.path.realpath(sys.executable)).parent.parent)}
    for path in sorted(interpreter):
        args += ["--ro-bind", path, path]
    return args + ["--ro-bind", RUNNER, RUNNER, "--remount-ro", "/"]


def _unshare_prefixes(unshare: str) -> list[tuple[list[str], str]]:
    """The unshare command lines to try, best first, each with who the runner runs as."""
    args = [unshare, "--net", "--pid", "--fork", "--kill-child", "--ipc", "--uts", "--mount-proc"]
    if os.geteuid() == 0:  # never root: it would see and type into the host's terminals
        return [(args + ["--setuid", NOBODY, "--setgid", NOBODY], "uid 65534")]
    return [(args + ["--map-current-user"], "your uid, no capabilities"),
            (args + ["--map-root-user"], "root of a user namespace")]


def _try(prefix: list[str]) -> str | None:
    """Run the interpreter behind ``prefix`` once; None when it works, else why not."""
    try:
        done = subprocess.run(prefix + [sys.executable, "-s", "-B", "-c", "pass"], cwd="/",
                              env=_env(0), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=PROBE_TIMEOUT_S,
                              preexec_fn=_preexec(Limits()), start_new_session=True)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None if done.returncode == 0 else (
        done.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit status {done.returncode}")


@functools.cache
def _probe(layer: str) -> tuple[list[str] | None, str]:
    """(command prefix, description) when ``layer`` works here, else (None, why not + fix)."""
    if layer == "none":
        return [], "no namespaces"  # described by ProcessBackend._plan
    program = shutil.which(layer)
    if program is None:
        pkg = "bubblewrap" if layer == "bwrap" else "util-linux"
        return None, f"{layer} is not installed (apt-get install {pkg})"
    if layer == "bwrap":
        for uid, who in ((True, "uid 65534"), (False, "its caller's uid")):
            prefix = _bwrap_prefix(program, uid)
            why = _try(prefix)
            if why is None:
                return prefix, ("bwrap (no network, own namespaces, no capabilities, runs as "
                                f"{who}, read-only view of the interpreter only, private /tmp)")
        return None, f"bwrap does not work here: {why} (user namespaces may be disabled)"
    first_why = None
    for prefix, who in _unshare_prefixes(program):
        why = _try(prefix)
        if why is None:
            return prefix, f"unshare (no network, own pid/ipc/uts/mount namespaces, runs as {who})"
        first_why = first_why or why
    if os.geteuid() == 0:
        return None, (f"unshare as root needs uid 65534 to run this interpreter ({first_why}); "
                      "it never runs env code as root, which would see the host's /dev and "
                      "terminals: install the interpreter where uid 65534 can read it, or use "
                      "bwrap")
    return None, f"unshare does not work here: {first_why}"


def _weakness(layer: str | None, sec_on: bool, sec_what: str) -> str | None:
    """What a sandbox of this plan must be announced with (``ProcessBackend.warning``), else None."""
    if layer == "unshare" and not sec_on:
        return (f"sandboxes run behind unshare WITHOUT seccomp: env code sees the host's files "
                f"and can write those open to everyone (/tmp, /dev/shm); {sec_what}; or install "
                "bubblewrap, whose root is read-only")
    return None


def runner_imports(module: str) -> str | None:
    """None when the runner's interpreter, started as the runner is (``-s``, the sandbox's bare
    environment: no PYTHONPATH, no user site), imports ``module``; else why not. What this
    process imports says nothing: a module on its PYTHONPATH is not on the runner's. Raises
    ``OSError`` or ``subprocess.SubprocessError`` when the interpreter could not be run or did
    not finish in ``IMPORT_PROBE_S``: that is no answer (a busy machine must not read as "no")."""
    done = subprocess.run([sys.executable, "-s", "-B", "-c", f"import {module}"], cwd="/",
                          env=_env(0), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=IMPORT_PROBE_S)
    if done.returncode == 0:
        return None
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


@functools.cache
def seccomp_probe() -> tuple[bool, str]:
    """(True, what) when the runner can install its seccomp filter: pyseccomp and libseccomp
    importable by the runner's interpreter; else (False, why and the fix). Kept for the
    process's life once answered; a probe that could not run raises (not kept), so that
    ``available`` says the sandbox could not be probed rather than start one without seccomp."""
    why = runner_imports("pyseccomp")  # importing it loads libseccomp
    if why is not None:
        return False, (f"no seccomp (the sandbox's interpreter {sys.executable} cannot import "
                       f"pyseccomp: {why}; pip install pyseccomp into that interpreter's own "
                       "site-packages, not a PYTHONPATH or user folder, and apt-get install "
                       "libseccomp2; without it, unshare and none do not stop file writes)")
    return True, "seccomp (no sockets, processes, exec, file writes, signals to others)"


CHANNELS = ("auto", "shm", "pipe")
#: Where the shared-memory channel is used: its protocol relies on x86-64 keeping each side's
#: stores in order (a message before its sequence number); elsewhere the pipes carry everything.
SHM_WORKS = (sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
             and hasattr(os, "memfd_create"))


def shared_memory_works() -> tuple[bool, str]:
    """(True, what) when sandboxes started now get the shared-memory channel; else (False, why)."""
    if not SHM_WORKS:
        return False, "pipes (the shared-memory channel needs Linux on x86-64)"
    try:
        mem, fds, bells = _shared_memory()
    except OSError as e:
        return False, f"pipes (memfd refused here: {e})"
    mem.close()
    for fd in fds + bells:
        os.close(fd)
    return True, "shared memory (a step crosses without a system call)"


def _shared_memory() -> tuple[mmap.mmap, tuple[int, int, int], tuple[int, int]]:
    """A new channel: its mapping here, the runner's fds (memfd, its end of the bell to it, its
    end of the bell from it) and this process's ends of the two bells. The memfd's size is sealed,
    so the runner cannot shrink it under this process's mapping (SIGBUS). The bells are pipes, so
    each side's end is an open file of its own (see SHM_REGION in runner.py)."""
    fds: list[int] = []
    try:
        fds.append(os.memfd_create("envforge-sandbox", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        os.ftruncate(fds[0], 2 * SHM_REGION)
        fcntl.fcntl(fds[0], fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        for _ in range(2):
            fds.extend(os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK))
        memfd, to_r, to_w, from_r, from_w = fds
        return mmap.mmap(memfd, 2 * SHM_REGION), (memfd, to_r, from_w), (to_w, from_r)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class ProcessBackend(Backend):
    """Runner processes on this machine; see the module docstring for what each layer does."""

    name = "process"

    def __init__(self, isolation: str = "auto", seccomp: bool = True, channel: str = "auto"):
        if isolation not in ("auto",) + LAYERS:
            raise UsageError(f"unknown isolation {isolation!r}; choose auto, {', '.join(LAYERS)}")
        if channel not in CHANNELS:
            raise UsageError(f"unknown channel {channel!r}; choose {', '.join(CHANNELS)}")
        if channel == "shm" and not SHM_WORKS:
            raise UsageError("the shared-memory channel needs Linux on x86-64 (memfd); "
                             "use channel='pipe'")
        self.isolation, self.seccomp, self.channel = isolation, seccomp, channel
        self.shared = channel == "shm" or (channel == "auto" and SHM_WORKS)

    def _plan(self) -> tuple[str | None, list[str] | None, str, bool, str]:
        """(layer, prefix, layer description, seccomp on, seccomp description)."""
        reasons = []
        for layer in LAYERS if self.isolation == "auto" else (self.isolation,):
            prefix, what = _probe(layer)
            if prefix is not None:
                break
            reasons.append(what)
        else:
            layer, prefix, what = None, None, "; ".join(reasons)
        if layer == "none" and reasons:
            what = f"no namespaces ({'; '.join(reasons)})"
        elif layer == "none":
            what = "no namespaces (isolation='none')"
        sec_on, sec_what = seccomp_probe() if self.seccomp else (False, "no seccomp (turned off)")
        return layer, prefix, what, sec_on, sec_what

    def isolation_layers(self) -> list[str]:
        """The layers a sandbox started now would have, e.g. ["bwrap", "seccomp", "rlimits",
        "no_new_privs"]; empty when nothing would isolate."""
        ok, _ = self.available()
        if not ok:
            return []
        layer, _, _, sec_on, _ = self._plan()
        return ([layer] if layer != "none" else []) + (["seccomp"] if sec_on else []) + [
            "rlimits", "no_new_privs"]

    def available(self) -> tuple[bool, str]:
        try:
            layer, _, what, sec_on, sec_what = self._plan()
        except Exception as e:  # never raise: a broken probe means "not here"
            return False, f"the process sandbox could not be probed: {e!r}"
        if layer is None:
            return False, f"the {self.isolation} isolation does not work here: {what}"
        if layer == "none" and not sec_on:
            return False, f"nothing would isolate env code here ({what}; {sec_what}); {HOW_TO}"
        return True, f"process sandbox: {what}, {sec_what}, rlimits, no_new_privs"

    def warning(self) -> str | None:
        """unshare leaves the host's files visible: without seccomp, env code can write the
        world-writable ones. (None where no sandbox can start, or its plan cannot be probed:
        ``start`` says why.)"""
        try:
            if not self.available()[0]:
                return None
            layer, _, _, sec_on, sec_what = self._plan()
        except Exception:  # never raises: a probe that cannot finish is start's to report
            return None
        return _weakness(layer, sec_on, sec_what)

    def start(self, limits: Limits, hash_seed: int = 0) -> Sandbox:
        ok, why = self.available()
        if not ok:
            raise SandboxUnavailable(why)
        check_hash_seed(hash_seed)
        layer, prefix, _, sec_on, sec_what = self._plan()
        weak = _weakness(layer, sec_on, sec_what)
        if weak:
            warn_once(weak)
        argv = prefix + [sys.executable, "-s", "-B", RUNNER, "--cpu", cpu_per_call(limits)] + (
            ["--seccomp"] if sec_on else [])
        err = tempfile.TemporaryFile()
        mem, fds, bells = None, (), ()
        if self.shared:
            try:
                mem, fds, bells = _shared_memory()
            except OSError as e:  # memfd refused (a locked-down host): pipes still work
                if self.channel == "shm":
                    err.close()
                    raise SandboxUnavailable(f"cannot set up the shared-memory channel: {e}; "
                                             "use channel='pipe'") from None
        try:
            proc = subprocess.Popen(argv + (["--shm", ",".join(map(str, fds))] if fds else []),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    cwd="/", env=_env(hash_seed), bufsize=0, pass_fds=fds,
                                    start_new_session=True,
                                    preexec_fn=_preexec(limits, drop_capabilities=layer == "none"))
        except (OSError, subprocess.SubprocessError) as e:
            err.close()
            for fd in fds + bells:
                os.close(fd)
            raise SandboxUnavailable(f"cannot start the runner ({layer}): {e}") from None
        for fd in fds:  # the runner's now (this process keeps its own mapping)
            os.close(fd)
        if fds:
            transport = SharedTransport(proc, err, mem, bells)
        else:
            transport = PipeTransport(proc, err)
        sandbox = Sandbox(transport, limits, backend=f"process/{layer}")
        try:
            if not sandbox.ping(timeout=limits.load_timeout_s):
                raise SandboxProtocolError("the runner's first ping was not answered 'pong'")
        except SandboxError as e:
            sandbox.kill()
            raise SandboxUnavailable(f"the runner did not start ({layer}): {e}") from None
        return sandbox
