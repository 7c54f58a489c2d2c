"""The words and settings of capability identification: the three labels, a capability, and
``IdentifyConfig`` (each field carries its default, help and bounds)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from envforge.errors import UsageError
from envforge.trajectories import DEFAULT_SUCCESS_THRESHOLD

PRESENT, LACKING, NA = "PRESENT", "LACKING", "NA"
LABELS = (PRESENT, LACKING, NA)
LABELLERS = ("structural", "llm", "hybrid")
EPS = 1e-9  # float tolerance of the threshold comparisons (0.70 - 0.16 is 0.5399999...)


@dataclass(frozen=True)
class Capability:
    name: str
    description: str


def _f(default, help: str, low=None, high=None):
    """A config field with its help and bounds (``low <= value <= high``) as metadata."""
    return field(default=default, metadata={"help": help, "bounds": (low, high)})


@dataclass
class IdentifyConfig:
    """Settings of ``envforge identify``. Defaults marked *paper* come from TRACE."""
    labeller: str = field(default="structural", metadata={
        "help": "structural (offline rules), llm (a model labels), or hybrid (the rules find "
                "the evidence, a model confirms it)", "choices": LABELLERS})
    delta: float = _f(0.20, "paper: keep when gap >= 0.20", 0.0, 1.0)
    rho: float = _f(0.10, "paper: keep when coverage >= 0.10", 0.0, 1.0)
    runs: int = _f(10, "paper (official code): N = 10 runs", 1)
    min_runs: int | None = _f(None, "K; default 80% of runs rounded up (paper, official code: 8 "
                                    "of 10; 1 of 1)", 1)
    min_group: int = _f(5, "fewer successes or failures than this: retain nothing and warn "
                           "(a contrast needs both sides)", 0)
    success_threshold: float = _f(DEFAULT_SUCCESS_THRESHOLD, "a trajectory succeeds when reward "
                                  ">= this (tau-bench: reward 1 is a pass)")
    seed: int = _f(0, "seed of the runs' resampling and of discovery's batches")
    # the LLM labeller
    model: str | None = _f(None, "the model the endpoint serves")
    batch_size: int = _f(50, "paper: ~50 failures per discovery batch", 1)
    discovery_batches: int = _f(3, "discovery batches per run", 1)
    max_candidates: int = _f(8, "paper: 5-8 candidates; kept after merging", 1)
    concurrency: int = _f(8, "LLM calls in flight at once", 1)
    rate_limit: float | None = _f(None, "LLM requests per second")
    max_repairs: int = _f(2, "re-asks after a reply that fails the schema", 0)
    cache_dir: str | None = _f(None, "None: envforge.llm.default_cache_dir()")
    cache: bool = _f(True, "read and write the LLM cache")
    progress: bool = _f(False, "show progress on stderr")

    def __post_init__(self) -> None:
        if self.labeller not in LABELLERS:
            raise UsageError(f"--labeler must be one of {', '.join(LABELLERS)}, got {self.labeller!r}")
        for f in fields(self):
            low, high = f.metadata.get("bounds", (None, None))
            value = getattr(self, f.name)
            if value is None or (low is None and high is None):
                continue
            if (low is not None and value < low) or (high is not None and value > high):
                where = (f"between {low} and {high}" if low is not None and high is not None
                         else f"at least {low}" if low is not None else f"at most {high}")
                raise UsageError(f"--{f.name.replace('_', '-')} must be {where}, got {value}")
        if self.min_runs is not None and self.min_runs > self.runs:
            raise UsageError(f"--min-runs must lie between 1 and --runs ({self.runs}), got {self.min_runs}")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise UsageError(f"--rate-limit must be positive requests per second, got {self.rate_limit}")

    @property
    def k(self) -> int:
        """Runs a capability must be kept in (K of N)."""
        return self.min_runs if self.min_runs is not None else max(1, math.ceil(round(0.8 * self.runs, 9)))
