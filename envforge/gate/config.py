"""The gate's settings: thresholds and budgets of the dynamic checks (``dynamic.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from envforge.contract import Limits
from envforge.settings import Settings, setting


@dataclass
class GateSettings(Settings):
    """Thresholds and budgets of the dynamic checks. Defaults follow ENV_CONTRACT.md and the
    issue's budget (at least 50 seeds per property, a full gate in seconds)."""
    seeds: int = setting(50, "Seeds per dynamic property (probes, diversity); at most 512: half are "
                         "small ones, of the 256 training draws from.", low=2, high=512)
    robustness_examples: int = setting(50, "Hypothesis state-machine runs.", low=1)
    replay_random: int = setting(10, "Random episodes replayed for determinism.", low=0)
    solvable_min: float = setting(0.95, "Share of seeds solve() must score 1.0 on.", above=0, high=1)
    diversity_min: float = setting(0.9, "Share of seeds that must give distinct scenarios.",
                                   above=0, high=1)
    free_reward_max: float = setting(0.3, "Highest mean score allowed to do-nothing/random.",
                                     low=0, high=1)
    partial_credit_values: int = setting(3, "Distinct episode scores the probes must reach.", low=1)
    training_hash_seed: int = setting(0, "PYTHONHASHSEED that envforge.make and training use: "
                                      "the first sandbox runs under it, the others under ones drawn "
                                      "per audit.", low=0, high=4294967295)
    hash_processes: int = setting(4, "Fresh sandbox processes, each under its own drawn "
                                  "PYTHONHASHSEED: each replays the first reference episode and the "
                                  "malformed scripts, the other determinism replays are dealt out "
                                  "among them (a set of n strings keeps its order under another hash "
                                  "seed about once in n! draws: for two, one process misses it half "
                                  "the time, four one time in 16).", low=1, high=32)
    probe_seed: int | None = setting(None, "Seed of every probe draw (seeds, free texts, the other "
                                     "hash seeds, hypothesis); None draws one per audit. report.json "
                                     "records it (stats.probe_seed): pass it back to replay an audit.",
                                     low=0, high=2**63 - 1)
    resets: int = setting(2000, "Resets of one instance in the many-resets probe (drift, slowdown, "
                          "memory growth); one runner request.", low=0, high=1_000_000)
    resets_s: float = setting(2.0, "Seconds the many-resets probe may take.", above=0)
    leak_mb: float = setting(16.0, "Memory growth (MiB) over the many-resets probe that counts as "
                             "a leak.", above=0)
    leak_kib_per_reset: float = setting(0.5, "Memory growth a reset (KiB, after a warm-up, when "
                                        "the probe grew by over 1 MiB) that counts as a leak: "
                                        "training resets millions of times.", above=0)
    slow_call_s: float = setting(1.0, "Seconds one reset/step may take before it is a finding "
                                 "(training makes thousands).", above=0)
    long_text_chars: int = setting(6000, "Length of the longest drawn free-text probe.", low=1,
                                   high=1_000_000)
    max_sandbox_failures: int = setting(3, "Sandbox deaths before the stage gives up.", low=1)
    budget_s: float = setting(120.0, "Seconds the dynamic checks of one env may take in all; a "
                              "slow env is a finding, not an endless audit.", low=1, high=86_400)
    limits: Limits = setting(help="Limits of the sandboxed env process.", factory=Limits)
