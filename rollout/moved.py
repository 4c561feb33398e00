"""The rollout side's module paths from before its packages by role, kept as aliases.

Its modules once sat side by side in ``rollout/`` (``rollout.parser``, ``rollout.engine``,
``rollout.browser_pool``, ...); they now live in :mod:`rollout.agent`, :mod:`rollout.net`,
:mod:`rollout.env`, :mod:`rollout.tracking`, :mod:`rollout.archive` and
:mod:`rollout.sidecar`. A script written against the old paths still imports: each old
name is the very module that replaced it, with a ``DeprecationWarning`` naming the new
path (:mod:`shared.moved`). ``rollout.net`` and ``rollout.archive`` were modules and are
now packages: their old names come from :mod:`rollout.net.core` and
:mod:`rollout.archive.store` through the packages' ``__getattr__``. ``import rollout``
installs :data:`MOVED`.
"""

from __future__ import annotations

# old module path -> the module that holds its code now
MOVED: dict[str, str] = {
    "rollout.actions": "rollout.agent.actions",
    "rollout.archive_browser": "rollout.archive.browser",
    "rollout.archive_format": "rollout.archive.format",
    "rollout.archive_index": "rollout.archive.index",
    "rollout.archive_origin": "rollout.archive.origin",
    "rollout.browser_pool": "rollout.env.pool",
    "rollout.buffer": "rollout.sidecar.buffer",
    "rollout.dashboard": "rollout.sidecar.dashboard",
    "rollout.dialects": "rollout.agent.dialects",
    "rollout.egress": "rollout.net.egress",
    "rollout.engine": "rollout.sidecar.engine",
    "rollout.episode": "rollout.sidecar.episode",
    "rollout.inference": "rollout.sidecar.inference",
    "rollout.parser": "rollout.agent.parser",
    "rollout.policies": "rollout.agent.policies",
    "rollout.politeness": "rollout.net.politeness",
    "rollout.proc_stats": "rollout.sidecar.proc_stats",
    "rollout.procs": "rollout.sidecar.procs",
    "rollout.proxies": "rollout.net.proxies",
    "rollout.records": "rollout.tracking.records",
    "rollout.resolver": "rollout.net.resolver",
    "rollout.search_client": "rollout.net.search_client",
    "rollout.tracker": "rollout.tracking.tracker",
    "rollout.urls": "rollout.net.urls",
}
