"""GRPO training: the math, the batches, the step, the mesh, the loop and what it writes.

:mod:`~learner.training.grpo` (the loss and advantages, pure functions),
:mod:`~learner.training.batching` (groups into padded arrays),
:mod:`~learner.training.step` (the train state and the jitted step),
:mod:`~learner.training.sharding` (the mesh and the logical-axis rules),
:mod:`~learner.training.loop` (pull, pack, step, hooks), :mod:`~learner.training.source`
(groups from the sidecars over HTTP), :mod:`~learner.training.checkpoint` (Orbax),
:mod:`~learner.training.trackers`, :mod:`~learner.training.distributed`,
:mod:`~learner.training.host_memory` and :mod:`~learner.training.dryrun` (the per-device
memory of a run).

What it may import: :mod:`learner.model`, :mod:`learner.errors`, :mod:`shared` and the
JAX stack; the loop also the real engines' export of :mod:`learner.serving.engines`
(for weight pushes). Never :mod:`learner.embedded`, nor anything of :mod:`rollout`.
"""
