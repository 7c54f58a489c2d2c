"""Capability identification (TRACE section 3): contrast an agent's successful and failed
trajectories to find the capabilities it lacks.

1. Label every (trajectory, capability) pair PRESENT, LACKING or NA, with evidence (a turn and
   why), by one of three labellers: ``structural`` (offline rules, :mod:`.rules`), ``llm``
   (discovery and labelling by a model, :mod:`.llm`) or ``hybrid`` (the rules' labels and
   evidence, confirmed or corrected by a model). The definitions: docs/identify-rubric.md.
2. Per capability, ER+, ER-, gap and coverage over N bootstrap runs, and keep it when gap >=
   delta and coverage >= rho in at least K of N (:mod:`.stats`). Too few successes or failures
   (``min_group``): nothing is retained and the result says why (``warnings``).
3. :class:`Identification` is the result: ``to_dict()`` is capabilities.json; ``write()`` writes
   it, ``write_labels()`` the per-trajectory labels with their evidence; :mod:`.report` draws
   the table and the plot.
"""
from __future__ import annotations

from envforge.lazy import lazy_api

# The package's API, loaded on first use (so that `import envforge.identify.config`, which the
# command line does at start, does not load the labellers): name -> its module.
API = {
    **dict.fromkeys(("IdentifyConfig", "Capability", "PRESENT", "LACKING", "NA", "LABELS",
                     "LABELLERS"), "config"),
    **dict.fromkeys(("Identification", "identify", "task_text"), "identification"),
    **dict.fromkeys(("STRUCTURAL_RULES", "Verdict", "label_structural", "view"), "rules"),
    **dict.fromkeys(("capability_stats", "is_retained", "run_statistics"), "stats"),
    **dict.fromkeys(("merge_candidates", "labelling_schema"), "llm"),
}
__all__ = list(API)
__getattr__, __dir__ = lazy_api(__name__, API)
