"""The agent's side of the environment: its actions, how it writes them, scripted agents.

:mod:`~rollout.agent.actions` (one dataclass per action and one table per mode),
:mod:`~rollout.agent.dialects` and :mod:`~rollout.agent.parser` (model text into a typed
action, never raising) and :mod:`~rollout.agent.policies` (scripted policies that write
model text, the oracles among them).

What it may import: the registry (:mod:`rollout.registry`, :mod:`rollout.action_spec`),
:mod:`rollout.net` (the URL policy the parser checks against), :mod:`rollout.web` (what
the oracles know of the local web) and :mod:`shared`. Never the environment, the
verifiers or the sidecar (``tests/test_import_boundaries.py``).
"""
