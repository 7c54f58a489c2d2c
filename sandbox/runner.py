"""The in-sandbox runner: loads one untrusted ``env.py`` and answers the host's requests.

Started as ``python -s -B runner.py [--seccomp] [--cpu CALL,LOAD] [--shm MEM,BELL_IN,BELL_OUT]
[--connect PATH] [--watch]`` behind an isolation boundary (a process sandbox or a container). Standard library
only; ``pyseccomp`` is used when asked for. It speaks the line protocol of ``sandbox/base.py``:
one JSON request per line on stdin, one JSON reply per line on the original stdout (ops: load,
new, reset, step, solve, ping, stats, the gate's batch "resets" and its "state"); with ``--shm``, the same
messages through shared memory instead (see SHM_REGION). In a container, ``--connect`` first
makes a unix socket to the host fds 0 and 1, and ``--watch`` leaves a watcher behind as the
container's first process (see ``watch``). Before any env code runs it

- keeps the protocol on private copies of fds 0 and 1, points fd 0 at /dev/null and fds 1 and 2
  at the host's stderr file (in a container, the watcher's pipe), and makes
  ``sys.stdout``/``sys.stderr`` a sink that keeps the first 64 KiB: an env's print() can neither
  corrupt nor read the protocol. (Env code that finds the private fds can still write raw lines
  there; the host treats every reply as untrusted data.)
- with ``--seccomp``, installs a seccomp filter (allow by default; EPERM for creating sockets,
  processes, threads or programs, opening files for writing, changing the filesystem, signalling
  other processes, tracing, mounting, changing ids, kernel surface such as io_uring, typing into
  terminals and having the kernel signal someone on I/O: see KERNEL, DENY, ARGUMENT_RULES). If it
  cannot, it exits with status 3.
- sets RLIMIT_NPROC to 0: running as a non-root user it can start no process or thread.
- blocks every signal but SIGXCPU (see ``serve``): no env code runs between calls, and CPU
  used while idle ends the runner (exit status 4).
- with ``--cpu CALL,LOAD``, lowers its soft RLIMIT_CPU before each call so that the call can use
  no more CPU than its time limit allows (see ``Runner.arm``): past it, SIGXCPU ends it.

Every call into env code is wrapped so that any exception (SystemExit, MemoryError,
RecursionError included) becomes an error reply, and every value is checked to survive
``json.dumps``/``json.loads`` unchanged. The runner exits when stdin closes.
"""
import collections
import errno
import gc
import hashlib
import io
import json
import linecache
import math
import mmap
import os
import random
import resource
import select
import signal
import sys
import time
import traceback
import types

#: Kernel surface no env needs, denied (EPERM) on every layer with a filter of ours: the process
#: sandbox's seccomp and the Docker sandbox's profile. Names this libseccomp or kernel lacks are
#: skipped.
KERNEL = (
    "ptrace", "process_vm_writev", "process_vm_readv", "mount", "umount2", "chroot", "pivot_root",
    "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "reboot", "bpf", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "perf_event_open", "pidfd_getfd", "name_to_handle_at",
    "open_by_handle_at", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "swapon", "swapoff", "sethostname", "setdomainname", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "fanotify_init", "personality",
)
#: Denied in the process sandbox as well, where the runner must stay the only process and the
#: host's files may be visible: sockets, processes and threads, programs, file changes, ids.
DENY = KERNEL + (
    "socket", "socketpair", "fork", "vfork", "clone", "execve", "execveat", "creat", "unlink",
    "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "link", "linkat",
    "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown",
    "lchown", "fchownat", "truncate", "ftruncate", "mknod", "mknodat", "utime", "utimes",
    "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
    "lremovexattr", "fremovexattr", "setuid", "setgid", "setreuid", "setregid", "setresuid",
    "setresgid", "setfsuid", "setfsgid", "setgroups", "setsid", "setpgid", "pidfd_open",
    "pidfd_send_signal",
    # anonymous files: their pages are not address space, so RLIMIT_AS does not count them (the
    # shared-memory channel's memfd is the host's, made before the runner starts)
    "memfd_create", "memfd_secret",
)
LOW32 = 0xFFFFFFFF  # ioctl and fcntl commands are 32-bit: the upper half must not dodge a rule
O_ASYNC = 0o20000
#: Denied (EPERM) on every layer when all of a rule's (argument, mask, value) hold, argument &
#: mask == value: what lets a process reach the host through a file it shares with it. TIOCSTI
#: and TIOCLINUX type into a terminal; F_SETOWN, F_SETOWN_EX, F_SETSIG, O_ASYNC, FIOASYNC,
#: FIOSETOWN and SIOCSPGRP make the kernel signal a process of one's choosing on I/O; a new user
#: namespace is new kernel surface; unblocking signals would let env code run between calls, and
#: a handler for SIGXCPU would keep the per-call CPU limit from ending the runner.
ARGUMENT_RULES = (
    ("ioctl", ((1, LOW32, 0x5412),)),   # TIOCSTI
    ("ioctl", ((1, LOW32, 0x541C),)),   # TIOCLINUX
    ("ioctl", ((1, LOW32, 0x5452),)),   # FIOASYNC
    ("ioctl", ((1, LOW32, 0x8901),)),   # FIOSETOWN
    ("ioctl", ((1, LOW32, 0x8902),)),   # SIOCSPGRP
    ("fcntl", ((1, LOW32, 8),)),        # F_SETOWN
    ("fcntl", ((1, LOW32, 10),)),       # F_SETSIG
    ("fcntl", ((1, LOW32, 15),)),       # F_SETOWN_EX
    ("fcntl", ((1, LOW32, 4), (2, O_ASYNC, O_ASYNC))),  # F_SETFL with O_ASYNC
    ("clone", ((0, 0x10000000, 0x10000000),)),  # CLONE_NEWUSER
    ("rt_sigprocmask", ((0, LOW32, 1),)),  # SIG_UNBLOCK: signals stay blocked (see serve)
    ("rt_sigprocmask", ((0, LOW32, 2),)),  # SIG_SETMASK
    ("rt_sigaction", ((0, LOW32, 24),)),   # SIGXCPU: the per-call CPU limit ends the runner
)
WRITE_FLAGS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND)
COMPACT = (",", ":")
ENCODE = json.JSONEncoder(allow_nan=False, separators=COMPACT).encode
TIMES_KEPT = 1000  # "stats" returns at most this many answer times
RESULTS = {"reset": ("observation", "info"),
           "step": ("observation", "reward", "terminated", "truncated", "info")}


def install_seccomp() -> list:
    """Load the filter into this process; returns the names skipped as unknown here."""
    import pyseccomp as sc
    filt, skipped = sc.SyscallFilter(sc.ALLOW), []

    def deny(name, *args, err=errno.EPERM):
        if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
            skipped.append(name)
        else:
            filt.add_rule(sc.ERRNO(err), name, *args)

    for name in DENY:  # clone included: threads too, so root cannot thread-bomb the machine
        deny(name)
    for name in ("clone3", "openat2"):  # flags live behind a pointer: ENOSYS, libc falls back
        deny(name, err=errno.ENOSYS)
    for name, conditions in ARGUMENT_RULES:
        if name != "clone":  # denied outright above
            deny(name, *(sc.Arg(i, sc.MASKED_EQ, mask, value) for i, mask, value in conditions))
    for name in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        deny(name, sc.Arg(0, sc.NE, os.getpid()))
    for name, flags_arg in (("open", 1), ("openat", 2)):
        for flag in WRITE_FLAGS:
            deny(name, sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
    filt.load()
    return sorted(set(skipped))


class Sink(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` for env code: the first 64 KiB go to fd 2, the rest nowhere."""
    budget = 64 << 10

    def writable(self):
        return True

    def write(self, s):
        data = str(s).encode("utf-8", "replace")
        if Sink.budget > 0:
            try:
                os.write(2, data[:Sink.budget])
            except OSError:
                pass
            Sink.budget -= len(data)
        return len(s)


class Failure(Exception):
    def __init__(self, kind, message, type_="", tb=""):
        super().__init__(message)
        self.error = {"kind": kind, "type": type_, "message": message, "traceback": tb}


def safe_str(exc):
    try:
        return str(exc)[:2000]
    except BaseException:
        return "<the exception's str() failed>"


#: how deep a returned value may nest lists and dicts (the host refuses a reply deeper than
#: sandbox.base.MAX_DEPTH, this plus the reply's own levels): what the trainer does with an
#: observation (copies, renders) recurses on it
MAX_DEPTH = 60


def json_problem(value, path, depth=0):
    """Where ``value`` stops being JSON, e.g. "tuple at info['pos']" (None when nowhere)."""
    if depth > MAX_DEPTH:
        return f"nesting deeper than {MAX_DEPTH} levels at {path}"
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} at {path}"
    if isinstance(value, list):
        return next(filter(None, (json_problem(v, f"{path}[{i}]", depth + 1)
                                  for i, v in enumerate(value))), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a {type(k).__name__} key at {path}"
            found = json_problem(v, f"{path}[{k!r}]", depth + 1)
            if found:
                return found
        return None
    return f"{type(value).__name__} at {path}"


STATE_NODES = 1_000_000  # values one "state" digest looks at, at most
STATE_DEPTH = 400  # and how deep (a value past either makes the name's digest "too large")
PLAIN = (bool, int, float, complex, str, bytes)


def _hash_types() -> tuple:
    out = set()
    for name in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "sha3_256", "sha3_512", "blake2b",
                 "blake2s", "shake_128", "shake_256"):
        try:
            out.add(type(getattr(hashlib, name)()))
        except (AttributeError, ValueError):  # not built, or refused (FIPS)
            pass
    return tuple(out)


#: hashlib's objects: no pickled state and a constant repr, so the digest reads their hexdigest()
_HASHES = _hash_types()


class TooLarge(Exception):
    pass


def slot_names(t: type) -> list:
    """The slots a class and its bases declare (their values are state like attributes)."""
    return [s for c in t.__mro__ for s in c.__dict__.get("__slots__", ())
            if isinstance(s, str) and s not in ("__dict__", "__weakref__")]


def digest(value):
    """A hex digest of what ``value`` holds, followed through containers (read through the
    built-in types' own methods, never a subclass's), objects' attributes and slots, functions'
    defaults, closures and attributes, what generators' frames hold (locals and stack), bound
    methods' objects, and the standard library's objects' pickled state (an iterator's position,
    a counter; a hashlib object's digest so far). Within one
    process, equal state gives an equal digest. Raises TooLarge past STATE_NODES values or
    STATE_DEPTH levels."""
    h, seen, count = hashlib.blake2b(digest_size=12), {}, [0]

    def put(*parts):
        for p in parts:
            h.update(p.encode("utf-8", "backslashreplace") + b"\x00")

    def walk(x, depth):
        count[0] += 1
        if count[0] > STATE_NODES or depth > STATE_DEPTH:
            raise TooLarge
        t = type(x)
        if x is None or t in PLAIN:
            put(t.__name__, repr(x))
            return
        if id(x) in seen:
            put("@", str(seen[id(x)]))
            return
        seen[id(x)] = len(seen)
        put(t.__module__, t.__qualname__)
        base = next((b for b in PLAIN if isinstance(x, b)), None)
        if base is not None:  # a subclass of int, str, ...: its value by the base's own repr
            put(base.__repr__(x))
        if isinstance(x, (list, tuple, collections.deque)):
            kind = next(k for k in (list, tuple, collections.deque) if isinstance(x, k))
            items = list(kind.__iter__(x))
            put(str(len(items)))
            for v in items:
                walk(v, depth + 1)
        elif isinstance(x, dict):
            items = list(dict.items(x))
            put(str(len(items)))
            for k, v in items:
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(x, types.MappingProxyType):
            walk(dict(x), depth + 1)
        elif isinstance(x, (set, frozenset)):  # in an order of their own digests: not insertion's
            kind = set if isinstance(x, set) else frozenset
            put(*sorted(digest(v) for v in list(kind.__iter__(x))))
        elif isinstance(x, types.ModuleType):
            put(x.__name__)
            return
        elif isinstance(x, (types.FunctionType, types.MethodType, staticmethod, classmethod, property)):
            f = getattr(x, "__func__", x)
            if isinstance(x, types.MethodType):
                walk(x.__self__, depth + 1)
            if isinstance(x, property):
                for g in (x.fget, x.fset, x.fdel):
                    walk(g, depth + 1)
            elif isinstance(f, types.FunctionType):
                put(f.__qualname__)
                walk(f.__defaults__, depth + 1)
                walk(f.__kwdefaults__, depth + 1)
                for cell in f.__closure__ or ():
                    try:
                        walk(cell.cell_contents, depth + 1)
                    except ValueError:  # an empty cell
                        put("empty")
                walk(f.__dict__, depth + 1)
            return
        elif isinstance(x, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            # what its frame holds: its locals and its stack (a for loop's iterator, what a
            # ``yield from`` delegates to), as the garbage collector sees them; never truth-tested
            walk([o for o in gc.get_referents(x) if not isinstance(o, types.CodeType)], depth + 1)
            return
        elif isinstance(x, random.Random):
            walk(x.getstate(), depth + 1)
        elif isinstance(x, type):
            if x.__module__ == "env":
                walk(dict(x.__dict__), depth + 1)
            return
        try:
            d = object.__getattribute__(x, "__dict__")
        except AttributeError:
            d = None
        d = d if isinstance(d, dict) else None
        slots = slot_names(t)
        if d is not None:
            walk(d, depth + 1)
        for s in slots:
            walk(getattr(x, s, None), depth + 1)
        if d is None and not slots and base is None and t.__module__ != "env" and not isinstance(
                x, (list, tuple, collections.deque, dict, set, frozenset, random.Random)):
            try:  # the standard library's own objects: their pickled state, else their repr
                walk(x.__reduce_ex__(4), depth + 1)
            except TooLarge:
                raise
            except Exception:
                put(repr(x))
                if isinstance(x, _HASHES):  # what a hashlib object has been fed
                    try:
                        put(x.hexdigest())
                    except TypeError:  # a SHAKE's needs a length
                        put(x.hexdigest(32))

    walk(value, 0)
    return h.hexdigest()


def round_trip(value):
    """The JSON text of ``value`` when it survives json.dumps/json.loads unchanged, else None."""
    try:
        text = ENCODE(value)
        return text if json.loads(text) == value else None
    except (TypeError, ValueError, RecursionError, OverflowError):
        return None


PROF_CLOCK_S = 1e8  # (see Runner.arm) an ITIMER_PROF this far off reads the kernel's CPU clock
ITIMER_PROF, getitimer = signal.ITIMER_PROF, signal.getitimer


class Runner:
    def __init__(self, sandbox_info, cpu=None):
        self.sandbox_info, self.module, self.env_cls = sandbox_info, None, None
        self.imported = []  # (module the env imported, its names at load)
        self.instances, self.filename = [], "env.py"
        self.times = []  # seconds each answer took since the last "stats" (None: answering one)
        # per-call CPU limits (see arm): (seconds for a call, for load), the soft RLIMIT_CPU
        self.cpu = cpu
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_CPU)
        self.most = math.inf if self.hard == resource.RLIM_INFINITY else self.hard  # (that is -1)
        if cpu:
            signal.setitimer(ITIMER_PROF, PROF_CLOCK_S)

    def arm(self, op, req):
        """Lower the soft RLIMIT_CPU so that this call can use no more CPU than the work asked of
        it allows: what the runner used so far plus its op's time limit (``--cpu CALL,LOAD``;
        "resets" adds its max_s) plus one to two seconds (the limit is whole seconds); the
        kernel ends the runner with SIGXCPU past it, whatever the host's wall-clock timeout.
        What it used so far is read from the kernel's own clock for RLIMIT_CPU (whole ticks: on
        a busy machine it runs ahead of time.process_time), through an ITIMER_PROF armed far off
        (PROF_CLOCK_S; its SIGPROF stays blocked): one getitimer per call, about 1.2 µs in all
        here. The limit changes (a setrlimit) about once per CPU-second used, not per call. The
        hard limit (``Limits.cpu_s``, over the sandbox's life) stays the backstop. Env code can
        reach all of this in its own process (raise the soft limit, block SIGXCPU, re-arm
        ITIMER_PROF); what binds it then is the host's timeout, the idle checks and the hard
        limit."""
        if op == "step" or op == "reset":  # the usual case first
            budget = self.cpu[0]
        else:
            budget = self.cpu[1] if op == "load" else self.cpu[0]
            max_s = req.get("max_s") if op == "resets" else None
            if type(max_s) in (int, float) and max_s > 0:
                budget += min(max_s, 1e6)
        # > used + budget + 1; the timer was rounded up to a tick (hence reads up to 10 ms low)
        soft = int(PROF_CLOCK_S + 0.01 - getitimer(ITIMER_PROF)[0] + budget) + 2
        if soft > self.most:
            soft = self.most
        if soft != self.soft:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, self.hard))
            self.soft = soft

    def call(self, fn, *args):
        """Run env code; any exception becomes an "env" failure with the env's own frames."""
        try:
            return fn(*args)
        except BaseException as e:
            raise Failure("env", safe_str(e), type(e).__name__, self.env_traceback(e)) from None

    def env_traceback(self, exc):
        try:
            frames = [f for f in traceback.extract_tb(exc.__traceback__)
                      if f.filename == self.filename]
            lines = ["Traceback (most recent call last):\n"] if frames else []
            if len(frames) > 20:
                lines += traceback.format_list(frames[:5]) + [f"  ... {len(frames) - 15} frames\n"]
                frames = frames[-10:]
            lines += traceback.format_list(frames) + traceback.format_exception_only(exc)
            return "".join(lines)[-4000:]
        except BaseException:
            return ""

    def json_text(self, op, value, name, names=None):
        """The JSON text of ``value``, or a "json" failure naming where it is not JSON. With
        ``names``, ``value`` is a list of that many results, checked in one encode and one decode
        (a step's five results cost little more than one), and a failure names the bad one."""
        text = round_trip(value)
        if text is not None and (text.count("[") + text.count("{") <= MAX_DEPTH  # cannot be too deep
                                 or json_problem(value, name, -1 if names else 0) is None):
            return text
        pairs = list(zip(value, names)) if names else [(value, name)]
        for v, n in pairs:
            problem = json_problem(v, n)
            if problem:
                break
        else:  # every part is made of JSON types, yet something changes: name the first that does
            n = next((n for v, n in pairs if round_trip(v) is None), pairs[0][1])
            problem = "it changes through json.dumps/json.loads"
        raise Failure("json", f"{op}'s {n} is not JSON: {problem}")

    def instance(self, req):
        i = req.get("instance")
        if type(i) is not int or not 0 <= i < len(self.instances):
            raise Failure("protocol", f"no instance {i!r}; {len(self.instances)} made so far "
                                      "(op new makes one)")
        return self.instances[i]

    def handle(self, req):
        """The JSON text of the reply's value for one request."""
        op = req.get("op")
        if self.cpu:
            self.arm(op, req)
        if op == "ping":
            return '"pong"'
        if op == "stats":
            times, self.times = self.times[-TIMES_KEPT:], None
            return ENCODE(times)
        if op == "load":
            return self.load(req)
        if op not in ("new", "reset", "step", "solve", "resets", "state"):
            raise Failure("protocol", f"unknown op {op!r}; known: load, new, reset, step, "
                                      "solve, resets, state, ping, stats")
        if self.module is None:
            raise Failure("protocol", f"{op} before load: load an env first")
        if op == "state":
            return self.call(self.state, req)
        if op == "new":
            self.instances.append(self.call(self.env_cls))
            return str(len(self.instances) - 1)
        if op == "resets":
            return self.resets(self.instance(req), req.get("seeds"), req.get("max_s"))
        env, arg = self.instance(req), "action" if op == "step" else "seed"
        if arg not in req:
            raise Failure("protocol", f"{op} needs the field {arg!r}")
        value = self.call(getattr, env, op)
        value = self.call(value, req[arg])
        if op == "solve":
            if not isinstance(value, list):
                raise Failure("contract", f"solve must return a list of assistant messages; "
                                          f"it returned {type(value).__name__}")
            return self.json_text(op, value, "result")
        names = RESULTS[op]
        if not isinstance(value, (tuple, list)) or len(value) != len(names):
            got = (f"a {len(value)}-{type(value).__name__}" if isinstance(value, (tuple, list))
                   else type(value).__name__)
            raise Failure("contract", f"{op} must return a {len(names)}-tuple "
                                      f"({', '.join(names)}); it returned {got}")
        return self.json_text(op, list(value), "result", names)

    def state(self, req=None):
        """The gate's look at what outlives an episode: a digest per module-level name of the env
        (a class's attributes each under "Class.name", an attribute added to a module it imported
        under "module.name"), and with an "instance", that instance's attributes (the gate
        resets it to one seed first). Equal digests in one process mean equal state; a
        name whose digest changes between two looks holds state the env's instances share (a
        counter, a cache, a flag), which the contract forbids, or that an instance keeps across
        its resets (a count of the episodes it has played): the instance's attributes and slots
        each under "self.name", so that one too large to digest leaves the others judged."""
        out = {}

        def look(name, value):
            try:
                out[name] = digest(value)
            except TooLarge:
                out[name] = "too large"

        for name, value in list(self.module.__dict__.items()):
            if name == "__builtins__" or isinstance(value, types.ModuleType):
                continue
            if isinstance(value, type) and value.__module__ == "env":
                for attr, v in list(value.__dict__.items()):
                    if attr not in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                        look(f"{name}.{attr}", v)
            else:
                look(name, value)
        for mod, keys in self.imported:
            for attr in sorted(set(mod.__dict__) - keys):
                look(f"{mod.__name__}.{attr}", mod.__dict__[attr])
        i = (req or {}).get("instance")
        if type(i) is int and 0 <= i < len(self.instances):
            inst = self.instances[i]
            try:
                d = object.__getattribute__(inst, "__dict__")
            except AttributeError:
                d = None
            d = d if type(d) is dict else {}
            slots = slot_names(type(inst))
            # each attribute and slot on its own ("self.name"): one too large to digest (a
            # database) leaves the others judged, and nothing is walked twice
            for attr, v in list(dict.items(d)):
                if type(attr) is str:
                    look("self." + attr, v)
            for s in slots:
                look("self." + s, getattr(inst, s, None))
            if not d and not slots:
                look("self", inst)
        return ENCODE(out)

    def resets(self, env, seeds, max_s):
        """The gate's many-resets probe, in one request: reset ``env`` to each of ``seeds`` in
        turn for at most ``max_s`` seconds. Value: {"resets": [[hash of the result's sorted JSON
        text, seconds], ...], "rss_kib": peak RSS after every tenth reset}; equal results give
        equal hashes within this process, so the host sees drift, slowdown and growth."""
        if (not isinstance(seeds, list) or not all(type(x) is int for x in seeds)
                or type(max_s) not in (int, float)):
            raise Failure("protocol", "resets needs a list of int 'seeds' and a number 'max_s'")
        out, rss, end = [], [], time.perf_counter() + max_s
        reset = self.call(getattr, env, "reset")
        for i, seed in enumerate(seeds):
            start = time.perf_counter()
            value = self.call(reset, seed)
            took = time.perf_counter() - start
            try:
                text = json.dumps(value, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError, RecursionError) as e:
                raise Failure("json", f"reset's result is not JSON: {safe_str(e)}") from None
            out.append([hash(text), took])
            if i % 10 == 9:
                rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
            if start > end:
                break
        return ENCODE({"resets": out, "rss_kib": rss})

    def answer(self, line):
        """(the reply line without its newline, None) for one request line; when the reply is an
        error, the error dict instead of None. Keeps the time it took for op "stats"."""
        start = time.perf_counter()
        try:
            return self.reply(line)
        finally:
            if self.times is None:  # that was "stats": count afresh from the next request
                self.times = []
            else:
                self.times.append(time.perf_counter() - start)
                if len(self.times) > 2 * TIMES_KEPT:
                    del self.times[:TIMES_KEPT]

    def reply(self, line):
        rid = None
        try:
            req = json.loads(line.decode())  # str: skips json's encoding sniffing
            if not isinstance(req, dict):
                raise Failure("protocol", "a request must be a JSON object")
            rid = req.get("id")
            return '{"id":%s,"ok":true,"value":%s}' % (ENCODE(rid), self.handle(req)), None
        except BaseException as e:
            if isinstance(e, Failure):
                error = e.error
            elif isinstance(e, ValueError) and rid is None:
                error = Failure("protocol", f"a request that is not JSON: {safe_str(e)}").error
            else:  # env code reached the runner's own code (a hostile __len__, __iter__, ...)
                error = Failure("env", safe_str(e), type(e).__name__, self.env_traceback(e)).error
            return json.dumps({"id": rid if isinstance(rid, (int, str)) else None, "ok": False,
                               "error": error}, separators=COMPACT), error

    def load(self, req):
        if self.module is not None:
            raise Failure("protocol", "an env is already loaded here; start a new sandbox "
                                      "for another")
        source, filename = req.get("source"), req.get("filename", "env.py")
        if not isinstance(source, str) or not isinstance(filename, str):
            raise Failure("protocol", "load needs a string 'source' (and optional 'filename')")
        self.filename = filename
        module = types.ModuleType("env")
        module.__file__ = filename
        sys.modules["env"] = module  # dataclasses and pickling look classes up here
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        self.call(lambda: exec(compile(source, filename, "exec"), module.__dict__))
        env_cls = module.__dict__.get("Env")
        if not isinstance(env_cls, type):
            raise Failure("contract", f"{filename} defines no class Env")
        missing = ["CAPABILITY"] if "CAPABILITY" not in module.__dict__ else []
        missing += self.call(lambda: [f"Env.{n}" for n in ("tools", "reset", "step", "solve")
                                      if not hasattr(env_cls, n)])
        if missing:
            raise Failure("contract", f"{filename} lacks {', '.join(missing)} "
                                      "(see ENV_CONTRACT.md)")
        meta = self.call(lambda: {"capability": module.__dict__["CAPABILITY"],
                                  "skills": module.__dict__.get("SKILLS"), "tools": env_cls.tools,
                                  "max_turns": getattr(env_cls, "max_turns", 10)})
        parts = [f'"{k}":{self.json_text("load", v, k)}' for k, v in meta.items()]
        parts.append('"sandbox":' + json.dumps(self.sandbox_info, separators=COMPACT))
        self.module, self.env_cls = module, env_cls
        self.imported = [(m, set(m.__dict__)) for m in module.__dict__.values() if isinstance(m, types.ModuleType)]
        return "{" + ",".join(parts) + "}"


SPIN_S = 200e-6
#: The shared-memory channel (``--shm MEM,BELL_IN,BELL_OUT``, the process sandbox on x86-64): a
#: memfd of two regions, requests then replies. Each region starts with two 8-byte words, the
#: message's sequence number and its length, then the message (up to SHM_CAPACITY bytes). A
#: sender writes the message, then its length, then the sequence number (x86-64 keeps stores in
#: order), then rings its "bell", a byte on a pipe of its own; a receiver spins on the sequence
#: number, and blocks on the bell (and its pipe, for end-of-file) when spinning does not pay. A
#: message longer than the region goes as a line on the pipe instead, its length word set to
#: SHM_OVERSIZE. Each bell is a pipe, not an eventfd: its two ends are separate open files, so
#: nothing the runner does to its end (clearing O_NONBLOCK, filling it) can make the host's
#: non-blocking end block; a full bell rings anyway.
SHM_REGION = 1 << 20
SHM_HEADER = 64
SHM_CAPACITY = SHM_REGION - SHM_HEADER
SHM_OVERSIZE = (1 << 64) - 1
BELL = b"\x01"


def write_line(fd, data):
    """Write all of ``data`` to the blocking ``fd``."""
    sent = os.write(fd, data)
    while sent < len(data):  # a line longer than the pipe's buffer
        sent += os.write(fd, data[sent:])


class Stream:
    """The protocol over the pipes (or socket) alone: one line per message."""

    def __init__(self, fd_in, fd_out):
        self.fd_in, self.fd_out = fd_in, fd_out

    def requests(self):
        """The request lines arriving on ``fd_in``. While requests come in a tight loop (the last
        one came within SPIN_S), the runner waits for the next by spinning on a zero-timeout poll
        before it blocks: on a virtual machine a blocked process takes tens of microseconds to
        wake, more than a whole step of a typical env. When requests come slowly (a policy
        generating, or a busy machine) it blocks at once and burns no CPU."""
        fd, buf, spin, poller = self.fd_in, b"", True, select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            nl = buf.find(b"\n")
            if nl >= 0:
                yield buf[:nl + 1]
                buf = buf[nl + 1:]
                continue
            start = time.perf_counter()  # fd stays blocking: it may share its flags with the output
            while spin and not poller.poll(0) and time.perf_counter() - start < SPIN_S:
                pass
            chunk = os.read(fd, 1 << 16)
            spin = time.perf_counter() - start < SPIN_S
            if not chunk:
                return
            if not buf and chunk.find(b"\n") == len(chunk) - 1:  # the usual case: one whole request
                yield chunk
                continue
            buf += chunk

    def reply(self, text):
        write_line(self.fd_out, (text + "\n").encode())


class Shared(Stream):
    """The protocol over shared memory (see SHM_REGION); the pipes carry oversize messages and
    tell when the host is gone. Waits the way ``Stream`` does: spinning while requests come
    fast, else blocking."""

    def __init__(self, fd_in, fd_out, spec):
        super().__init__(fd_in, fd_out)
        mem, self.bell_in, self.bell_out = (int(x) for x in spec.split(","))
        self.mem = mmap.mmap(mem, 2 * SHM_REGION)
        os.close(mem)
        self.words = memoryview(self.mem).cast("Q")
        self.seq, self.pending = 0, bytearray()
        self.poller = select.poll()
        for fd in (self.bell_in, fd_in):
            self.poller.register(fd, select.POLLIN)

    def requests(self):
        words, mem, spin, perf_counter = self.words, self.mem, True, time.perf_counter
        while True:
            self.seq = seq = self.seq + 1
            start = perf_counter()
            while spin and words[0] != seq and perf_counter() - start < SPIN_S:
                pass
            if words[0] != seq and not self.block(seq):
                return
            spin = perf_counter() - start < SPIN_S
            size = words[1]
            if size == SHM_OVERSIZE:
                line = self.read_line()
                if line is None:
                    return
                yield line
            else:
                yield mem[SHM_HEADER:SHM_HEADER + min(size, SHM_CAPACITY)]

    def block(self, seq):
        """Wait on the bell until request ``seq`` is in; False when the host closed the pipe."""
        while self.words[0] != seq:
            for fd, _ in self.poller.poll():
                if fd == self.bell_in:
                    try:
                        os.read(fd, 1 << 16)  # empty the bell; the sequence number is what counts
                    except BlockingIOError:
                        pass
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return False
                self.pending += chunk  # an oversize request, its number about to show
        return True

    def read_line(self):
        while (nl := self.pending.find(b"\n")) < 0:
            chunk = os.read(self.fd_in, 1 << 16)
            if not chunk:
                return None
            self.pending += chunk
        line = bytes(self.pending[:nl])
        del self.pending[:nl + 1]
        return line

    def reply(self, text):
        data, words, at = text.encode(), self.words, SHM_REGION // 8
        if len(data) <= SHM_CAPACITY:
            start = SHM_REGION + SHM_HEADER
            self.mem[start:start + len(data)] = data
            words[at + 1] = len(data)
            words[at] = self.seq
        else:
            words[at + 1] = SHM_OVERSIZE
            words[at] = self.seq
        try:
            os.write(self.bell_out, BELL)
        except BlockingIOError:  # full: it rings anyway
            pass
        if len(data) > SHM_CAPACITY:
            write_line(self.fd_out, data + b"\n")


#: CPU seconds the runner may use between two calls. Waiting costs it microseconds (at most
#: SPIN_S of spinning per request); more means env code ran while no call was in flight.
IDLE_CPU_S = 0.05
IDLE_EXIT = 4
STDERR_FORWARDED = 16 << 10  # (Docker) the runner's stderr that reaches dockerd as it comes
STDERR_KEPT = 2048           # and the tail of the rest, sent when the runner is gone
PR_SET_DUMPABLE = 4


def serve(channel, runner):
    """Answer requests until the host hangs up. No env code runs between calls: every signal but
    SIGXCPU (the per-call CPU limit's, see ``Runner.arm``; the filters deny handling it) is
    blocked before any env code runs, for good (the filters deny unblocking them: an env's timers
    and handlers never run), and trace, profile and gc hooks are dropped after each call. What
    is left shows on the runner's CPU clock, read after each reply and as the next request
    arrives: over IDLE_CPU_S in between ends the sandbox, said on stderr, exit status IDLE_EXIT.
    (Signals are not re-blocked per call: signal.pthread_sigmask costs hundreds of µs here.)"""
    # locals, bound before any env code runs: env code can rebind the module's names, not these
    answer, reply, cpu, limit = runner.answer, channel.reply, time.process_time, IDLE_CPU_S
    write, exit_, clear_hooks = os.write, os._exit, gc.callbacks.clear
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - {signal.SIGXCPU})
    idle_since = cpu()
    for line in channel.requests():
        idle = cpu() - idle_since
        if idle > limit:
            write(2, f"runner: env code used {idle:.2f} CPU seconds between calls; "
                     "the sandbox stops\n".encode())
            exit_(IDLE_EXIT)
        text = answer(line)[0]
        sys.settrace(None)
        sys.setprofile(None)
        clear_hooks()
        reply(text)
        idle_since = cpu()


def connect(path):
    """(Docker) Make a connection to the host's socket the protocol's fds 0 and 1."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    os.dup2(s.fileno(), 0)
    os.dup2(s.fileno(), 1)
    s.close()


def watch():
    """(Docker) Fork: the runner goes on in the child; this process stays the container's first
    process, out of the env's reach (pid 1 takes no signal it has no handler for, and it is not
    dumpable: no ptrace, no /proc/1/mem for the same uid). It

    - kills the runner when the host hangs up (its end of fd 0 closes: a host killed outright
      included), which env code, busy or ignoring end-of-file, cannot prevent;
    - drains the runner's stderr from a pipe, inside the container's CPU cap: the first
      STDERR_FORWARDED bytes go on to dockerd, then only the last STDERR_KEPT, once the runner
      is gone (unbounded output would cost dockerd CPU outside the cap);
    - exits with the runner's status (128 + the signal when it was killed)."""
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        os.dup2(err_w, 2)
        os.close(err_w)
        return
    import ctypes
    os.close(err_w)
    os.close(1)
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.set_blocking(err_r, False)
    child = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(0, select.POLLRDHUP)
    poller.register(child, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    forwarded, tail = 0, bytearray()

    def drain():
        nonlocal forwarded, tail
        while True:
            try:
                chunk = os.read(err_r, 1 << 16)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            if forwarded < STDERR_FORWARDED:
                part = chunk[:STDERR_FORWARDED - forwarded]
                write_line(2, part)
                forwarded += len(part)
                chunk = chunk[len(part):]
            tail = (tail + chunk)[-STDERR_KEPT:]

    while True:
        for fd, _ in poller.poll():
            if fd == err_r and not drain():
                poller.unregister(err_r)
            elif fd == child:
                _, status = os.waitpid(pid, 0)
                drain()
                if tail:
                    write_line(2, b"\n[...]\n" + bytes(tail))
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
            elif fd == 0:
                os.kill(pid, signal.SIGKILL)
                poller.unregister(0)


def main(argv):
    if "--connect" in argv:
        connect(argv[argv.index("--connect") + 1])
    if "--watch" in argv:
        watch()
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    sys.stdin, sys.stdout, sys.stderr = None, Sink(), Sink()
    info = {"seccomp": False, "uid": os.getuid()}
    shm = argv[argv.index("--shm") + 1] if "--shm" in argv else None
    channel = Shared(proto_in, proto_out, shm) if shm else Stream(proto_in, proto_out)
    info["channel"] = "shared memory" if shm else "stream"
    if "--seccomp" in argv:
        try:
            info["seccomp_skipped"] = install_seccomp()
            info["seccomp"] = True
        except Exception as e:
            os.write(2, f"runner: cannot install the seccomp filter: {e!r}\n".encode())
            os._exit(3)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    cpu = tuple(map(float, argv[argv.index("--cpu") + 1].split(","))) if "--cpu" in argv else None
    serve(channel, Runner(info, cpu))
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
