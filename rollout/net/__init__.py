"""The network layer: every way an episode reaches the web, and the rules it goes by.

:mod:`~rollout.net.urls` (which URLs an agent may open), :mod:`~rollout.net.resolver`
(name resolution under the address rule), :mod:`~rollout.net.core` (what the episodes of
one process share to reach the web), :mod:`~rollout.net.egress` (the browsers' forward
proxy), :mod:`~rollout.net.proxies` (upstream proxies), :mod:`~rollout.net.politeness`
(rate limits and robots.txt) and :mod:`~rollout.net.search_client` (the search backends).

What it may import: :mod:`rollout.archive` (recording and replaying what it fetches) and
:mod:`shared`. Never the environment, the agent or anything above them: the network layer
knows nothing of episodes (``tests/test_import_boundaries.py``).
"""

from shared.moved import forward_names

# ``rollout.net`` was the module that :mod:`rollout.net.core` now is: its names are still
# served from here (with a warning), for code written against that path.
__getattr__ = forward_names(
    "rollout.net", "rollout.net.core", frozenset({"Net", "RobotsRefused", "net_for", "policy_for"})
)
