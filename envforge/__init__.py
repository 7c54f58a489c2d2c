"""envforge: capability-targeted training environments for LLM agents (TRACE, arXiv 2604.05336).

``import envforge`` stays light: no torch, trl, peft, transformers, docker or ray at import.
"""
__version__ = "0.1.0"
