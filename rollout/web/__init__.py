"""The local mini web: the sites built from the bundled data, their search index and
the HTTP server for both (``python -m rollout.web``).

What it may import: :mod:`shared` only. Nothing of the agent's side (the environment,
the tasks, the registry): it is the web agents browse, run as a process of its own.
"""
