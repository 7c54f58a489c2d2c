"""envforge: capability-targeted training environments for LLM agents (TRACE, arXiv 2604.05336).

``import envforge`` stays light: no torch, trl, peft, transformers, docker or ray at import.
"""
__version__ = "0.1.0"


def __getattr__(name: str):
    """``envforge.make``, ``envforge.make_pool`` and ``envforge.step_all`` (envforge/gym.py),
    imported on first use so that ``import envforge`` does not load gymnasium (PEP 562)."""
    if name in ("make", "make_pool", "step_all"):
        from envforge import gym
        return getattr(gym, name)
    raise AttributeError(f"module 'envforge' has no attribute {name!r}")
