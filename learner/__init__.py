"""The learner: JAX/Flax GRPO over a device mesh.

Its packages, by role: :mod:`learner.model` (the architecture, the parameters, the
forward pass, Hugging Face and Orbax in and out), :mod:`learner.serving` (the embedded
inference server that speaks SGLang's protocol, and the real SGLang and vLLM servers as
children), :mod:`learner.training` (GRPO, batches, the step, the mesh, the loop,
checkpoints, trackers, the dry run) and :mod:`learner.embedded` (the embedded default's
pipeline: its child processes, the warm start, the phases around GRPO). The commands sit
on top: ``python -m learner.train`` (:mod:`learner.train`), ``learner.inspect``, and the
thin ``learner.serve``, ``learner.engines``, ``learner.sft`` and ``learner.base``, each
naming the module that holds its code.

What it may import: :mod:`shared` (the wire schema, the run config, the tokenizer) and
the JAX stack; never :mod:`rollout` or playwright: it reaches the rollout side over
HTTP only (``tests/test_import_boundaries.py``).

Importing it with ``LEARNER_KEEP_FREED_MEMORY=1`` in the environment keeps freed host
memory in the process for XLA:CPU's large per-run buffers (:mod:`learner.training.host_memory`).
The module paths from before the packages by role (``learner.step``, ``learner.engine``,
...) still import, as deprecated aliases of the modules that replaced them
(:mod:`learner.moved`)."""

from learner.moved import MOVED
from learner.training.host_memory import keep_freed_memory
from shared import moved

keep_freed_memory()
moved.install(MOVED)
