"""Synthesis (TRACE section 2): write a training environment per capability, have the gate audit
it, and (LLM path) send the findings back for repair until the gate accepts it.

Two synthesizers:

- ``openai``: any OpenAI-compatible chat endpoint (:class:`envforge.llm.LLMClient`: retries with
  backoff, a content-hash disk cache, clear errors). The prompt (``llm.py``) carries the
  capability, failing example trajectories, the target's exact tool schemas and policy, the env
  contract and the reward-design rules; code is extracted from each reply, audited, and a
  rejected attempt's findings go back as a repair request, at most ``attempts`` times (default 5,
  the paper's regeneration budget).
- ``template`` (the embedded default, offline): ``templates.py`` writes an env for the nearest of
  the capability families (``families/``, one module each) on any target whose tools it can
  classify.

``auto`` picks ``openai`` when an endpoint (``OPENAI_BASE_URL`` or ``OPENAI_API_KEY``) and a model
are configured, else ``template``.

Output per capability, in ``out_dir/<slug>/``: ``env.py``, ``report.json`` (the gate's report of
the last audited attempt) and ``manifest.json`` (capability, target and schema hash, synthesizer,
model, prompt hash, every attempt with its findings, code sha256, token usage and cost, envforge
version, time), rewritten atomically after every attempt so that an interrupted batch resumes:
replies come back from the LLM cache, and capabilities already accepted with the same inputs are
skipped. An accepted env is never overwritten unless ``force`` is set.
"""
from __future__ import annotations

from envforge.lazy import lazy_api

# The package's API, loaded on first use (so that `import envforge.synth.config`, which the
# command line does at start, does not load the synthesizers): name -> its module.
API = {
    "SynthConfig": "config", "SYNTHESIZERS": "config",
    "FAMILIES": "families", "Family": "families", "match_family": "families",
    "family_list": "families",
    **dict.fromkeys(("CapabilitySpec", "Attempt", "SynthResult", "synthesize", "synthesize_batch",
                     "load_capabilities", "resolve_synthesizer", "slug_for", "target_label"),
                    "synthesizer"),
}
__all__ = list(API)
__getattr__, __dir__ = lazy_api(__name__, API)
