"""``envforge demo``: TRACE end to end, offline on CPU, on a small agent made locally.

The top layer beside the CLI: it may import every stage; nothing but the CLI imports it.
``run.py`` runs the stages, ``target.py`` is the binary-reward target benchmark, ``expert.py``
the scripted expert with planted deficits, ``agent.py`` the base agent (tokenizer, model, SFT),
``report.py`` figures, HTML and table.
"""
