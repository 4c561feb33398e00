"""Reward verifiers: pure functions of (task, final answer, episode record) -> :class:`Reward`.

Tasks are plain dicts (``id, question, answer, aliases, type, hops, start_url,
evidence, gold_path`` and, for ``multi_doc``, ``key_facts``); :func:`verify`
dispatches on ``type`` (``qa``, ``browse_comp``, ``citation``, ``multi_doc``).
:func:`with_process` adds the optional process reward (:mod:`rollout.verifiers.process`).
The in-tree scorers are registered by type in :data:`rollout.registry.verifiers`.

What it may import: the registry, :mod:`rollout.tracking` (the episode record) and
:mod:`shared`; never the environment, which calls it: verifiers
run without a browser.
"""

from rollout.verifiers.config import (
    AntiCheatConfig,
    CitationConfig,
    FormatConfig,
    JudgeConfig,
    MultiDocConfig,
    ProcessConfig,
    VerifierConfig,
    verifier_config,
)
from rollout.verifiers.judge import Judge, JudgeError, JudgeVerdict, length_bias
from rollout.verifiers.process import with_process
from rollout.verifiers.reward import Reward, verify, verify_async
from rollout.verifiers.scorers import TaskError

__all__ = [
    "AntiCheatConfig",
    "CitationConfig",
    "FormatConfig",
    "Judge",
    "JudgeConfig",
    "JudgeError",
    "JudgeVerdict",
    "MultiDocConfig",
    "ProcessConfig",
    "Reward",
    "TaskError",
    "VerifierConfig",
    "length_bias",
    "verifier_config",
    "verify",
    "verify_async",
    "with_process",
]
