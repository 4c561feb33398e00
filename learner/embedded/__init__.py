"""The embedded default's pipeline: its child processes, the warm start and the phases.

:mod:`~learner.embedded.children` (the local web, the inference server and the sidecars
as child processes), :mod:`~learner.embedded.sft` (supervised fine-tuning on exported
trajectories, ``python -m learner.sft``), :mod:`~learner.embedded.base` (the shipped base
checkpoint, ``python -m learner.base``) and :mod:`~learner.embedded.pipeline` (the phases
around GRPO: demonstrations, SFT, test evaluations, the summary).

What it may import: :mod:`learner.model`, :mod:`learner.training`, :mod:`learner.errors`
and :mod:`shared`; the commands it starts (the web, the sidecar, the inference server)
only as processes. Never anything of :mod:`rollout`.
"""
