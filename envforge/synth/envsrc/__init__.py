"""Source pieces of the template synthesizer's env.py files (not imported by envforge).

``common.py`` is the runtime every template env carries (argument validation against the target's
schemas, value drawing from recipes, the tool dispatcher, the scripted user's text analysis, the
episode loop); each ``<family>.py`` defines ``class Env(BaseEnv)`` with that family's scenario,
simulated user, reward and reference solution. ``envforge.synth.templates`` renders the target's
schemas and the plan as constants, then appends these files' text after their docstrings. They
reference constants (``TOOLS``, ``PLAN``, ``SKILLS``, ``POLICY``...) that only the rendered file
defines, and may use only what env.py may: the allow-listed standard-library modules.
"""
