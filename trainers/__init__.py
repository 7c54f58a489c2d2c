"""GRPO training (one LoRA adapter per capability), calibration, routing and evaluation.

The heavy dependencies (torch, transformers, peft) are imported only inside this package, which
nothing in ``envforge`` imports at module level; install them with the ``train`` extra.
"""
