"""The learner: JAX/Flax GRPO over a device mesh (see README).

Importing it with ``LEARNER_KEEP_FREED_MEMORY=1`` in the environment keeps freed host
memory in the process for XLA:CPU's large per-run buffers (:mod:`learner.host_memory`)."""

from learner.host_memory import keep_freed_memory

keep_freed_memory()
