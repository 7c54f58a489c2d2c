"""Source of the demo's target benchmark env (``target.py``; not imported by envforge).

``envforge.demo.target`` renders it with the example target's tool schemas as the ``TOOLS``
constant and writes it as an ``env.py``; it then runs in a sandbox like every env.
"""
