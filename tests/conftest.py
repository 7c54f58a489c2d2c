"""Shared test helpers: where ../shared is, and a skip for tests that need it."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURE_ENVS = SHARED / "fixtures" / "envs"
TARGETS = SHARED / "targets"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real targets, "
                                  "trajectories and fixture envs live there; tests that need them skip)")
