"""What an episode did, written as it runs: the episode record and the progress tracker.

:mod:`~rollout.tracking.records` (every step an agent took and what it saw) and
:mod:`~rollout.tracking.tracker` (a human-readable log and the full record per episode,
read back by SFT export and the dashboard).

What it may import: :mod:`rollout.action_spec` (how an action is written) and
:mod:`shared`. Never the environment or the verifiers, which build on the record
(``tests/test_import_boundaries.py``).
"""
