"""Shared test helpers: where ../shared is, and a skip for tests that need it."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

# synth's gate audits draw their probes from a secret; the tests audit at few seeds for speed,
# where a rare draw can show a good env no partial credit: fix the secret (subprocesses inherit it)
os.environ.setdefault("ENVFORGE_PROBE_SECRET", "00112233445566778899aabbccddeeff")

# a test run started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and
# so would every process the tests start, which Python then never interrupts: the Ctrl-C tests
# (train, the Docker sandbox) waited in vain. A handler here is reset to the default in children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURE_ENVS = SHARED / "fixtures" / "envs"
TARGETS = SHARED / "targets"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real targets, "
                                  "trajectories and fixture envs live there; tests that need them skip)")


# ---- `envforge demo --quick` in the background (tests/test_demo.py)
#
# The demo is one run of about ten minutes, and the rest of the suite keeps about one core of a
# small machine busy on the mean. So when test_demo.py is collected, its run starts as soon as
# collection ends, on one core of its own (the last this process may use; the demo sizes its
# jobs and threads by the cores it may run on, so it trains its base agent on one thread: two
# threads that wait on each other beside other work ran ten times slower) and at a lower CPU
# priority (nice 10: the other tests, some of them timed, keep their share); its tests run last,
# waiting for it. The numbers are the demo's on one core, not those of a run on two (its base
# agent, made on one thread, is another: docs/demo-log.md); the test asserts the ordering.

DEMO_NICE = 10
DEMO_TIMEOUT_S = 2400
_demo: dict = {}


def _demo_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "envforge", "demo", "--quick", "--seed", "0", "--threads", "1",
            "--out", str(out)]


def _start_demo() -> None:
    work = Path(tempfile.mkdtemp(prefix="envforge-test-demo-"))
    out, log_out, log_err = work / "out", open(work / "stdout", "w"), open(work / "stderr", "w")
    nice = ["nice", "-n", str(DEMO_NICE)] if shutil.which("nice") else []
    proc = subprocess.Popen(nice + _demo_command(out), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=log_out, stderr=log_err, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log_out.close(), log_err.close()
    if hasattr(os, "sched_setaffinity"):  # before it has started anything (its imports take longer)
        try:
            os.sched_setaffinity(proc.pid, {max(os.sched_getaffinity(0))})
        except OSError:
            pass
    _demo.update(proc=proc, work=work, out=out, started=time.monotonic())


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(session, config, items):
    demo = [i for i in items if "demo_run" in getattr(i, "fixturenames", ())]
    if not demo or config.option.collectonly:
        return
    items[:] = [i for i in items if i not in demo] + demo
    _start_demo()


def pytest_sessionfinish(session, exitstatus):
    proc = _demo.get("proc")
    if proc is None:
        return
    if proc.poll() is None:  # the session ended first (-x, Ctrl-C): stop the run and its jobs
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if exitstatus == 0:
        shutil.rmtree(_demo["work"], ignore_errors=True)
    else:
        print(f"\nthe background demo's output is kept in {_demo['work']}")


@pytest.fixture(scope="session")
def quick_demo():
    """The background `envforge demo --quick` run, once it has ended: (its --out folder, an
    object with returncode, stdout and stderr). Started by the collection hook above."""
    if "proc" not in _demo:  # collected another way (a plugin reordering items): start it now
        _start_demo()
    proc, work = _demo["proc"], _demo["work"]
    try:
        proc.wait(timeout=max(1.0, DEMO_TIMEOUT_S - (time.monotonic() - _demo["started"])))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"envforge demo --quick did not end within {DEMO_TIMEOUT_S} s (output in {work})")
    result = SimpleNamespace(returncode=proc.returncode, stdout=(work / "stdout").read_text(),
                             stderr=(work / "stderr").read_text())
    return _demo["out"], result
