"""Shared test helpers: where ../shared is, and a skip for tests that need it."""
from __future__ import annotations

import os
import signal
from pathlib import Path

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
