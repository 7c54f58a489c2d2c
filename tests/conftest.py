"""Shared test helpers: where ../shared is, and a skip for tests that need it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# synth's gate audits draw their probes from a secret; the tests audit at few seeds for speed,
# where a rare draw can show a good env no partial credit: fix the secret (subprocesses inherit it)
os.environ.setdefault("ENVFORGE_PROBE_SECRET", "00112233445566778899aabbccddeeff")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURE_ENVS = SHARED / "fixtures" / "envs"
TARGETS = SHARED / "targets"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real targets, "
                                  "trajectories and fixture envs live there; tests that need them skip)")
