"""The words and settings of capability identification: the three labels, a capability, and
``IdentifyConfig`` (each field carries its default, help and bounds: :mod:`envforge.settings`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from envforge.settings import Settings, setting
from envforge.trajectories import DEFAULT_SUCCESS_THRESHOLD

PRESENT, LACKING, NA = "PRESENT", "LACKING", "NA"
LABELS = (PRESENT, LACKING, NA)
LABELLERS = ("structural", "llm", "hybrid")
EPS = 1e-9  # float tolerance of the threshold comparisons (0.70 - 0.16 is 0.5399999...)


@dataclass(frozen=True)
class Capability:
    name: str
    description: str


@dataclass
class IdentifyConfig(Settings):
    """Settings of ``envforge identify``. Defaults marked *paper* come from TRACE."""
    labeller: str = setting("structural", "structural: offline rules; llm: an OpenAI-compatible "
                            "model discovers and labels; hybrid: the rules' labels and evidence, "
                            "confirmed or corrected by the model.", choices=LABELLERS)
    delta: float = setting(0.20, "Minimum gap ER- - ER+ (paper: 0.20).", low=0, high=1)
    rho: float = setting(0.10, "Minimum coverage (paper: 0.10).", low=0, high=1)
    runs: int = setting(10, "N bootstrap runs (paper, official code: 10).", low=1, high=10_000)
    min_runs: int | None = setting(None, "K: runs a capability must be kept in (default 80% of "
                                   "--runs rounded up: 8 of 10, 1 of 1).", low=1)
    min_group: int = setting(5, "Fewer successes or failures than this: retain nothing and warn "
                             "(a contrast needs both sides).", low=0)
    success_threshold: float = setting(DEFAULT_SUCCESS_THRESHOLD, "A trajectory succeeds when its "
                                       "reward is at least this (tau-bench: reward 1 is a pass).")
    seed: int = setting(0, "Seed of the runs' resampling and of discovery's batches.")
    # the LLM and hybrid labellers
    model: str | None = setting(None, "LLM and hybrid labellers: the model the endpoint serves "
                                "(endpoint and key from OPENAI_BASE_URL / OPENAI_API_KEY).")
    batch_size: int = setting(50, "LLM: failures per discovery batch (paper: ~50).", low=1)
    discovery_batches: int = setting(3, "LLM: discovery batches per run.", low=1)
    max_candidates: int = setting(8, "LLM: candidates kept after merging (paper: 5-8).", low=1)
    concurrency: int = setting(8, "LLM: calls in flight at once.", low=1)
    rate_limit: float | None = setting(None, "LLM: at most this many requests per second.", above=0)
    max_repairs: int = setting(2, "LLM: re-asks after a reply that fails the schema or the "
                               "evidence check.", low=0)
    cache_dir: str | None = setting(None, "LLM: cache folder (default ~/.cache/envforge/llm).")
    cache: bool = setting(True, "LLM: read and write the cache.")

    def check(self) -> None:
        if self.min_runs is not None and self.min_runs > self.runs:
            self.fail("min_runs", f"must be from 1 to runs ({self.runs}), got {self.min_runs}")

    @property
    def k(self) -> int:
        """Runs a capability must be kept in (K of N)."""
        return self.min_runs if self.min_runs is not None else max(1, math.ceil(round(0.8 * self.runs, 9)))
