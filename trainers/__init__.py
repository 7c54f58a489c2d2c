"""GRPO training (one LoRA adapter per capability), calibration, routing and evaluation.

The heavy dependencies (torch, transformers, peft) are imported only inside this package, which
nothing in ``envforge`` imports at module level; install them with the ``train`` extra.
"""

import warnings

# peft (0.x) reads transformers' deprecated ``is_gradient_checkpointing`` whenever it wraps a
# model: a FutureWarning between two libraries, about nothing the user did
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
