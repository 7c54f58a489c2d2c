"""Where untrusted env code runs.

``runner.py`` is the small standard-library-only program that loads ``env.py`` inside a sandbox
and answers reset/step/solve over a line-based JSON protocol. The backends start that runner
behind an isolation boundary; ``get_backend(name)`` picks one, importing it lazily.
"""
from __future__ import annotations
