"""The rollout sidecar: the engine that runs episodes in parallel and the server around it.

:mod:`~rollout.sidecar.engine` (G episodes per task, concurrently, into the buffer),
:mod:`~rollout.sidecar.episode` (one episode as token sequences for GRPO),
:mod:`~rollout.sidecar.inference` (the client for SGLang, vLLM and the embedded server),
:mod:`~rollout.sidecar.buffer` (finished groups, each served once),
:mod:`~rollout.sidecar.server` (the aiohttp server, ``python -m rollout.serve``),
:mod:`~rollout.sidecar.dashboard` (with its page files in ``dashboard_static``),
:mod:`~rollout.sidecar.procs` (child servers on loopback) and
:mod:`~rollout.sidecar.proc_stats` (CPU time per process, from /proc).

What it may import: the environment (:mod:`rollout.env`) and everything it builds on
(the registry, :mod:`rollout.agent`, :mod:`rollout.verifiers`) and :mod:`shared`. Never
a second domain's package (:mod:`rollout.tools` registers itself) nor the commands
(``tests/test_import_boundaries.py``).
"""
